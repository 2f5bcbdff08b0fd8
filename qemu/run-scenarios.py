#!/usr/bin/env python3
"""Run the perfq QEMU scenarios: the driver in a real Debian kernel, the
device (perfq-devsim) outside the guest on the region file behind an
ivshmem-plain device.

  qemu/run-scenarios.py [--build DIR] [--results FILE] [--kernel KVER]... [SCENARIO...]
  qemu/run-scenarios.py --shell          boot the guest interactively
  qemu/run-scenarios.py --build DIR systemd [--debs FILE...]
                                         Debian 12 with systemd as PID 1 from
                                         a disk image, the .debs installed

Each scenario boots its own guest (TCG; PERFQ_QEMU_ACCEL=kvm to try KVM)
under `timeout`, waits for markers on the serial console, does what the
guest asks of the host (stop the device, unplug it over QMP), and checks
what came back.  Every scenario runs once per guest kernel: the newest
installed kernel (with headers) of each supported series, Debian 12's 6.1
and 6.12, or those named with --kernel (the systemd scenario's rootfs is
built for that kernel).  The results file gets one
"PASS name@KVER" / "FAIL name@KVER" line per run; the last line printed is
"qemu: N passed, M failed".
"""
import argparse
import base64
import json
import os
import queue
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SCENARIOS = ["load", "badinput", "e2e", "unplug", "unplug-sync"]
# The guest kernels: the newest installed kernel of each series.
KERNEL_SERIES = ["6.1", "6.12"]
# Scenarios that boot a Debian disk image (qemu/build-rootfs.sh) with systemd
# as PID 1 instead of the busybox initramfs (qemu/build-guest.sh); run only
# when named.
IMAGE_SCENARIOS = ["systemd"]
DEFAULT_TIMEOUT = {"systemd": 600}  # seconds per guest boot; others: 90
REGION_SIZE = 4 << 20  # a power of two: it becomes the ivshmem BAR
MAGIC = 0x4E47525146524550
EXIT_PASS = (16 << 1) | 1  # isa-debug-exit: (value << 1) | 1


def log(msg):
    print(f"qemu: {msg}", flush=True)


def unmount_under(path):
    """Unmount whatever is mounted at or below path (a chroot's /proc, /sys,
    /dev binds left by an interrupted run), deepest first."""
    path = os.path.realpath(path)
    with open("/proc/mounts") as f:
        points = [line.split()[1].replace("\\040", " ") for line in f]
    for p in sorted((p for p in points if p == path or p.startswith(path + "/")), reverse=True):
        if subprocess.run(["umount", p], stderr=subprocess.DEVNULL).returncode != 0:
            subprocess.run(["umount", "-l", p], stderr=subprocess.DEVNULL)


class Qmp:
    """The few QMP calls the scenarios need."""

    def __init__(self, path, timeout=10.0):
        deadline = time.monotonic() + timeout
        while True:
            try:
                self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
                self.sock.connect(path)
                break
            except OSError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.05)
        self.sock.settimeout(timeout)
        self.buf = b""
        self.events = []
        self._read()  # greeting
        self.execute("qmp_capabilities")

    def _read(self):
        while b"\n" not in self.buf:
            chunk = self.sock.recv(65536)
            if not chunk:
                raise EOFError("QMP closed")
            self.buf += chunk
        line, self.buf = self.buf.split(b"\n", 1)
        return json.loads(line)

    def execute(self, cmd, **args):
        msg = {"execute": cmd}
        if args:
            msg["arguments"] = args
        self.sock.sendall(json.dumps(msg).encode() + b"\n")
        while True:
            r = self._read()
            if "event" in r:
                self.events.append(r)
                continue
            if "error" in r:
                raise RuntimeError(f"QMP {cmd}: {r['error']}")
            return r.get("return")

    def wait_event(self, name, pred, timeout):
        deadline = time.monotonic() + timeout
        while True:
            for e in self.events:
                if e["event"] == name and pred(e.get("data", {})):
                    return e
            self.events.clear()
            left = deadline - time.monotonic()
            if left <= 0:
                return None
            self.sock.settimeout(left)
            try:
                r = self._read()
            except (socket.timeout, TimeoutError):
                return None
            if "event" in r:
                self.events.append(r)


def newest_kernel(series=""):
    """driver/Makefile's choice: the newest installed kernel (of a series)
    with a bootable image and headers; "" when there is none."""
    r = subprocess.run(["make", "-s", "-C", os.path.join(ROOT, "driver"), "kver",
                        f"KSERIES={series}"], capture_output=True, text=True)
    return r.stdout.strip()


def default_kernels():
    """The newest installed kernel of each supported series."""
    picked = []
    for series in KERNEL_SERIES:
        kver = newest_kernel(series)
        if kver:
            picked.append(kver)
        else:
            log(f"no {series} kernel with headers installed: its runs are skipped "
                f"(scripts/deps.sh installs it)")
    return picked or [k for k in [newest_kernel()] if k]


class Run:
    def __init__(self, args, name, kver=None):
        self.args = args
        self.name = name
        self.kver = kver
        self.bindir = os.path.join(args.build, "bin")
        self.qdir = os.path.join(args.build, "qemu")
        self.gdir = os.path.join(self.qdir, f"guest-{kver}") if kver else self.qdir
        self.dir = os.path.join(self.qdir, "run", f"{name}@{kver}" if kver else name)
        unmount_under(self.dir)
        shutil.rmtree(self.dir, ignore_errors=True)
        os.makedirs(self.dir)
        self.shm = f"/dev/shm/perfq-qemu-{os.getpid()}-{name}"
        self.checks = []  # (ok, text)
        self.devsim = None
        self.devsim_json = None
        self.qmp = None
        self.lines = queue.Queue()

    def check(self, ok, text):
        self.checks.append((bool(ok), text))
        log(f"  {'ok' if ok else 'FAIL'}: [host] {text}")
        return ok

    # ---- the device, outside the guest

    def make_region(self, path, good=True):
        with open(path, "wb") as f:
            f.truncate(REGION_SIZE)
            if not good:
                f.write(b"NOTPERFQ")

    def start_devsim(self, path, wait_host=False):
        # wait_host: the synthetic workers start with the first sync round
        # (the recording's), so that devsim's counts are the recording's: a
        # recording leaves out what the device published before its start.
        cmd = [os.path.join(self.bindir, "perfq-devsim"), "--region", path, "--create",
               "--region-size", str(REGION_SIZE), "--device-name", "perfq-qemu",
               "--rate", "500", "--workers", "2", "--job-workers", "2"]
        if wait_host:
            cmd.append("--wait-host")
        self.devsim_out = open(os.path.join(self.dir, "devsim.json"), "w+")
        self.devsim_err = open(os.path.join(self.dir, "devsim.log"), "w")
        self.devsim = subprocess.Popen(cmd, stdout=self.devsim_out, stderr=self.devsim_err)
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            with open(path, "rb") as f:
                if int.from_bytes(f.read(8), "little") == MAGIC:
                    return
            if self.devsim.poll() is not None:
                break
            time.sleep(0.02)
        raise RuntimeError("perfq-devsim did not initialise the region")

    def stop_devsim(self):
        if not self.devsim or self.devsim_json is not None:
            return
        self.devsim.send_signal(signal.SIGINT)
        try:
            self.devsim.wait(timeout=15)
        except subprocess.TimeoutExpired:
            self.devsim.kill()
            self.devsim.wait()
        self.devsim_out.seek(0)
        text = self.devsim_out.read().strip().splitlines()
        try:
            self.devsim_json = json.loads(text[-1]) if text else {}
        except json.JSONDecodeError:
            self.devsim_json = {}
        log(f"  devsim: {json.dumps(self.devsim_json)[:400]}")

    # ---- the guest

    def qemu_cmd(self, regions, append, interactive=False, kernel=None, initrd=None,
                 memory="512M", disk=None):
        """The QEMU command line: by default the busybox initramfs guest of
        build-guest.sh; kernel/initrd/memory/disk (a raw image, virtio-blk)
        for the disk image scenarios."""
        if kernel is None:
            with open(os.path.join(self.gdir, "kernel")) as f:
                kernel = f.read().strip()
        if initrd is None:
            initrd = os.path.join(self.gdir, "initramfs.cpio")
        accel = os.environ.get("PERFQ_QEMU_ACCEL", "tcg")
        cmd = ["qemu-system-x86_64", "-machine", f"q35,accel={accel}", "-m", memory,
               "-smp", os.environ.get("PERFQ_QEMU_SMP", "2"), "-no-reboot",
               # No default NIC (its option ROM), VGA or drives: the firmware
               # has nothing to initialise but what we add.
               "-nodefaults", "-vga", "none",
               "-kernel", kernel, "-initrd", initrd,
               "-append", f"console=ttyS0 quiet loglevel=4 panic=-1 {append}",
               "-device", "isa-debug-exit,iobase=0xf4,iosize=0x04",
               "-qmp", f"unix:{self.dir}/qmp.sock,server=on,wait=off"]
        cmd += ["-cpu", "max" if accel == "tcg" else "host"]
        if os.environ.get("PERFQ_QEMU_BIOS"):
            cmd += ["-bios", os.environ["PERFQ_QEMU_BIOS"]]
        if interactive:
            cmd += ["-display", "none", "-serial", "mon:stdio"]
        else:
            cmd += ["-display", "none", "-monitor", "none", "-serial", "stdio",
                    "-serial", f"file:{self.dir}/ttyS1.txt"]
        for i, path in enumerate(regions):
            cmd += ["-device", f"pcie-root-port,id=rp{i},chassis={i + 1},slot={i + 1}",
                    "-object", f"memory-backend-file,id=mb{i},size={REGION_SIZE},"
                               f"mem-path={path},share=on",
                    "-device", f"ivshmem-plain,id=ivs{i},memdev=mb{i},bus=rp{i}"]
        if disk:
            cmd += ["-drive", f"file={disk},format=raw,if=virtio,cache=unsafe"]
        return cmd

    def boot(self, regions, timeout, append="", **qemu):
        self.timeout = timeout
        cmd = ["timeout", "--kill-after=5", str(timeout)] + \
            self.qemu_cmd(regions, f"{append} perfqtest={self.name}".strip(), **qemu)
        with open(os.path.join(self.dir, "qemu-cmd.txt"), "w") as f:
            f.write(" ".join(cmd) + "\n")
        self.t0 = time.monotonic()
        self.proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                     stderr=subprocess.STDOUT)
        self.console = open(os.path.join(self.dir, "console.log"), "wb")

        def reader():
            for raw in self.proc.stdout:
                self.console.write(raw)
                self.console.flush()
                self.lines.put(raw.decode(errors="replace").rstrip("\r\n"))
            self.lines.put(None)

        threading.Thread(target=reader, daemon=True).start()

    def serve(self, deadline):
        """Follow the console until the guest reports; answer its requests."""
        result = None
        while True:
            try:
                line = self.lines.get(timeout=max(0.1, deadline - time.monotonic()))
            except queue.Empty:
                line = ""
            if line is None:
                break
            if time.monotonic() > deadline:
                self.check(False, f"the guest did not finish within {self.timeout} s")
                break
            if not line:
                continue
            if line.startswith(("ok:", "FAIL:", "measure:", "PERFQ-", "demo-app:",
                                "fuzz:", "clock:", "info:", "dmesg: ", "hold:", "daemon:",
                                "record:", "status:", "note:", "devices:")) or "perfq" in line.lower():
                log(f"  guest| {line}")
            if line.startswith("PERFQ-BOOTED"):
                log(f"  guest booted to init in {time.monotonic() - self.t0:.1f} s")
            elif line.startswith("PERFQ-HOST stop-devsim"):
                self.stop_devsim()
            elif line.startswith("PERFQ-HOST unplug"):
                self.unplug()
            elif line.startswith("PERFQ-RESULT"):
                result = line
        try:
            rc = self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            rc = self.proc.wait()
        self.elapsed = time.monotonic() - self.t0
        return result, rc

    def saw(self, text):
        with open(os.path.join(self.dir, "console.log"), "rb") as f:
            return text.encode() in f.read()

    def unplug(self):
        try:
            if not self.qmp:
                self.qmp = Qmp(os.path.join(self.dir, "qmp.sock"))
            t = time.monotonic()
            self.qmp.execute("device_del", id="ivs0")
            ev = self.qmp.wait_event("DEVICE_DELETED", lambda d: d.get("device") == "ivs0", 30)
            self.check(ev is not None,
                       f"QMP device_del ivs0: DEVICE_DELETED after {time.monotonic() - t:.2f} s")
        except Exception as e:  # noqa: BLE001 - reported as a failed check
            self.check(False, f"QMP device_del: {e}")

    def files(self):
        """Files the guest sent over ttyS1 (base64 between markers)."""
        out = {}
        path = os.path.join(self.dir, "ttyS1.txt")
        if not os.path.exists(path):
            return out
        name, chunks = None, []
        with open(path, errors="replace") as f:
            for line in f:
                line = line.strip()
                if line.startswith("PERFQ-FILE-BEGIN "):
                    name, chunks = line.split(" ", 1)[1], []
                elif line.startswith("PERFQ-FILE-END ") and name:
                    data = base64.b64decode("".join(chunks))
                    dest = os.path.join(self.dir, name)
                    with open(dest, "wb") as g:
                        g.write(data)
                    out[name] = dest
                    name = None
                elif name:
                    chunks.append(line)
        return out

    def cleanup(self):
        if self.devsim and self.devsim.poll() is None:
            self.devsim.kill()
            self.devsim.wait()
        if self.qmp:
            self.qmp.sock.close()
        for suffix in ("", "-bad"):
            try:
                os.unlink(self.shm + suffix)
            except FileNotFoundError:
                pass

    # ---- checks on what came back

    def check_trace(self, path, expect_jobs):
        rep = subprocess.run([os.path.join(self.bindir, "perfqctl"), "report", "--json", path],
                             capture_output=True, text=True, timeout=60)
        if not self.check(rep.returncode == 0, f"perfqctl report --json reads the trace "
                                               f"({rep.stderr.strip()[:200]})"):
            return None
        r = json.loads(rep.stdout)
        with open(os.path.join(self.dir, "report.json"), "w") as f:
            f.write(rep.stdout)
        self.check(r.get("complete") and r.get("clean_end"), "the trace is complete with a clean end")
        return r

    def check_e2e(self, r, demo):
        d = self.devsim_json or {}
        delivered = d.get("delivered")
        self.check(delivered is not None and d.get("dropped", 1) == 0,
                   f"devsim accounted its records: emitted {d.get('emitted')} delivered "
                   f"{delivered} dropped {d.get('dropped')}")
        dev = r["records"]["device"]
        self.check(dev == delivered, f"every device record arrived: trace has {dev}, "
                                     f"devsim delivered {delivered}")
        streams = {s["stream"]: s["records"] for s in r["records"]["streams"]
                   if s["kind"] == "device"}
        for s in d.get("streams", []):
            got = streams.get(s["stream"], 0)
            self.check(got == s["delivered"], f"stream {s['name']}: {got} of {s['delivered']} "
                                              f"records (indices contiguous: lost "
                                              f"{s['lost_reported']})")
        self.check(r["lost"]["device"] == 0, f"no device loss reported ({r['lost']['device']})")
        jobs = r.get("jobs", {})
        self.check(r.get("causality_violations", 1) == 0,
                   f"causality holds for every job: {jobs.get('count')} correlated jobs, "
                   f"{r.get('causality_violations')} violations{violations_text(r)}")
        if demo and demo.get("completed") and demo.get("host_events", {}).get("connected"):
            self.check(jobs.get("count", 0) == demo["completed"],
                       f"every demo-app job is correlated host<->device: {jobs.get('count')} of "
                       f"{demo['completed']}")
        # Kernel events (BPF in the guest kernel): the app's threads were
        # switched out and in, and the uprobe fired once per submit call.
        counts = {}
        for e in r.get("events", []):
            if e.get("source_name") == "kernel":
                counts[e["name"]] = counts.get(e["name"], 0) + e["count"]
        self.check(counts.get("sched_switch_out", 0) > 0 and counts.get("sched_switch_in", 0) > 0
                   and counts.get("syscall_enter", 0) > 0,
                   f"kernel events of the demo app: {counts}")
        if demo and "submit_calls" in demo:
            self.check(counts.get("uprobe:perfq_demo_submit") == demo["submit_calls"]
                       and counts.get("uretprobe:perfq_demo_submit") == demo["submit_calls"],
                       f"the uprobe fired once per perfq_demo_submit call: "
                       f"{counts.get('uprobe:perfq_demo_submit')} entries, "
                       f"{counts.get('uretprobe:perfq_demo_submit')} returns, "
                       f"{demo['submit_calls']} calls")
            off = r.get("off_cpu", {})
            # The guest's kernel delivers every switch: no record of a thread
            # falls while it was switched out.
            self.check(off.get("records_while_off") == 0,
                       f"the app's records line up with its threads' switches "
                       f"({off.get('records_while_off')} records while switched out, "
                       f"{off.get('inferred_switch_ins')} switch-ins inferred)")
            self.check(off.get("jobs") == demo.get("completed"),
                       f"the report knows the submitting thread of every job: off_cpu "
                       f"{json.dumps(off)[:300]}")
        sync = r.get("sync", {})
        self.check(sync.get("samples", 0) > 0 and "uncertainty_ns" in sync,
                   f"sync: {sync.get('samples')} samples, {sync.get('models')} models, "
                   f"{sync.get('standing')}, uncertainty {sync.get('uncertainty_ns')} ns")


    def load_json(self, files, name):
        """A JSON file the guest sent (a check that it came and parses): one
        document (perfqctl report --json), or JSON on its last line (the
        programs that print it last)."""
        if not self.check(name in files, f"{name} came back over ttyS1"):
            return None
        with open(files[name]) as f:
            text = f.read().strip()
        for doc in (text, (text.splitlines() or [""])[-1]):
            try:
                return json.loads(doc)
            except json.JSONDecodeError as e:
                err = e
        self.check(False, f"{name} is JSON ({err})")
        return None

    def check_pci(self, files, report):
        """perfqctl devices in the guest, and the trace's metadata, know the
        ivshmem device (1af4:1110) at 0000:01:00.0, bound to perfq."""
        address = "0000:01:00.0"

        def is_ivshmem(p, where):
            ok = (p.get("address") == address and p.get("vendor_id") == "1af4"
                  and p.get("device_id") == "1110" and p.get("driver") == "perfq"
                  and p.get("vendor_name") == "Red Hat, Inc."
                  and p.get("device_name") == "Inter-VM shared memory")
            self.check(ok, f"{where}: {p.get('address')} {p.get('vendor_id')}:"
                           f"{p.get('device_id')} {p.get('vendor_name')} "
                           f"{p.get('device_name')}, driver {p.get('driver')}")
            # ivshmem is a conventional PCI device (behind a PCIe root port):
            # no PCIe capability, so no link figures at all (null, not 0).
            self.check("pcie" in p and p["pcie"] is None,
                       f"{where}: no PCIe capability, pcie is null ({json.dumps(p.get('pcie'))})")
            self.check(p.get("config_readable") is True and "error" not in p,
                       f"{where}: its config space was read ({p.get('error', 'no error')})")

        dev = self.load_json(files, "devices.json")
        if dev:
            bound = dev.get("pci_devices", [])
            self.check(dev.get("ok") and len(bound) == 1,
                       f"devices: exactly one PCI device bound to perfq ({len(bound)})")
            if bound:
                is_ivshmem(bound[0], "devices: the PCI device bound to perfq")
            perfq0 = [d for d in dev.get("devices", []) if d.get("device") == "/dev/perfq0"]
            if self.check(perfq0 and "pci" in perfq0[0],
                          f"devices: /dev/perfq0 carries its PCI facts "
                          f"({perfq0[0].get('pci_error') if perfq0 else 'not listed'})"):
                is_ivshmem(perfq0[0]["pci"], "devices: /dev/perfq0")
        alls = self.load_json(files, "devices-all.json")
        if alls:
            devs = {p["address"]: p for p in alls.get("pci_devices", [])}
            self.check(alls.get("ok") and address in devs and len(devs) > 1,
                       f"devices --all: {len(devs)} PCI devices, ivshmem among them")
            ports = [p for p in devs.values() if (p.get("pcie") or {}).get("port_type") == "root port"]
            self.check(ports and ports[0]["pcie"].get("link_max"),
                       f"devices --all: the root port has a PCIe link "
                       f"({json.dumps(ports[0]['pcie']) if ports else 'none found'})")
        srcs = [s for s in report.get("sources", []) if s.get("kind") == "device"]
        if self.check(srcs and "pci" in srcs[0], "the trace's metadata has the device's PCI facts"):
            is_ivshmem(srcs[0]["pci"], "trace metadata")
            self.check(srcs[0].get("pci_address") == address,
                       f"trace metadata: pci_address {srcs[0].get('pci_address')}")


class Chroot:
    """/proc, /sys, /dev and /dev/pts mounted in a root filesystem for the
    `with` block, always unmounted after it (also on an exception, Ctrl-C or
    SIGTERM)."""

    def __init__(self, root):
        self.root = root
        self.mounts = []

    def __enter__(self):
        self.old_term = signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
        try:
            for args, point in ((["-t", "proc", "proc"], "proc"), (["-t", "sysfs", "sysfs"], "sys"),
                                (["--bind", "/dev"], "dev"), (["--bind", "/dev/pts"], "dev/pts")):
                target = os.path.join(self.root, point)
                os.makedirs(target, exist_ok=True)
                subprocess.run(["mount", *args, target], check=True)
                self.mounts.append(target)
        except BaseException:
            self.__exit__(None, None, None)
            raise
        return self

    def run(self, argv, log_path):
        env = {"PATH": "/usr/sbin:/usr/bin:/sbin:/bin", "LC_ALL": "C",
               "DEBIAN_FRONTEND": "noninteractive"}
        with open(log_path, "ab") as f:
            return subprocess.run(["chroot", self.root, *argv], env=env, stdin=subprocess.DEVNULL,
                                  stdout=f, stderr=subprocess.STDOUT).returncode

    def __exit__(self, *exc):
        for target in reversed(self.mounts):
            if subprocess.run(["umount", target], stderr=subprocess.DEVNULL).returncode != 0:
                subprocess.run(["umount", "-l", target])
        self.mounts = []
        unmount_under(self.root)
        signal.signal(signal.SIGTERM, self.old_term)
        return False


def rm_tree(path):
    """rm -rf that never crosses into a mount (a chroot's /dev bind)."""
    unmount_under(path)
    subprocess.run(["rm", "-rf", "--one-file-system", path], check=False)


def prepare_image(run, args):
    """The disk of the systemd scenario: a copy of the cached Debian rootfs
    (qemu/build-rootfs.sh), the --debs installed with dpkg -i in a chroot,
    the guest test script and its unit, then an ext4 image (mkfs.ext4 -d).
    Returns (kernel, initrd, image)."""
    t = time.monotonic()
    cmd = [os.path.join(ROOT, "qemu", "build-rootfs.sh")]
    if args.rootfs_cache:
        cmd += ["--cache", args.rootfs_cache]
    env = dict(os.environ)
    if run.kver:
        env["PERFQ_ROOTFS_KVER"] = run.kver  # the rootfs of this guest kernel
    r = subprocess.run(cmd, stdout=subprocess.PIPE, text=True, env=env)
    lines = r.stdout.strip().splitlines()
    if not run.check(r.returncode == 0 and lines, "the cached Debian rootfs (qemu/build-rootfs.sh)"):
        return None
    src = lines[-1]
    root = os.path.join(run.dir, "rootfs")
    rm_tree(root)
    subprocess.run(["cp", "-a", "--reflink=auto", src, root], check=True)
    with open(os.path.join(root, ".perfq-kver")) as f:
        kver = f.read().strip()
    log(f"  rootfs {src} copied in {time.monotonic() - t:.1f} s (kernel {kver})")

    if args.debs:
        t = time.monotonic()
        debdir = os.path.join(root, "tmp", "perfq-debs")
        os.makedirs(debdir, exist_ok=True)
        names = []
        for deb in args.debs:
            names.append("/tmp/perfq-debs/" + os.path.basename(deb))
            shutil.copy(deb, debdir)
        # Nothing starts services inside the chroot (invoke-rc.d); systemctl
        # itself knows it is in a chroot.
        policy = os.path.join(root, "usr", "sbin", "policy-rc.d")
        with open(policy, "w") as f:
            f.write("#!/bin/sh\nexit 101\n")
        os.chmod(policy, 0o755)
        dpkg_log = os.path.join(run.dir, "dpkg.log")
        with Chroot(root) as ch:
            rc = ch.run(["dpkg", "-i", *names], dpkg_log)
        os.unlink(policy)
        shutil.rmtree(debdir)
        with open(dpkg_log, errors="replace") as f:
            tail = f.read().strip().splitlines()[-15:]
        for line in tail if rc else []:
            log(f"  dpkg| {line}")
        if not run.check(rc == 0, f"dpkg -i {' '.join(map(os.path.basename, args.debs))} in the "
                                  f"rootfs ({time.monotonic() - t:.1f} s; log {dpkg_log})"):
            return None

    # The test script and its unit, started once multi-user.target is up;
    # no getty on the serial console (the test's output goes there).
    gdir = os.path.join(ROOT, "qemu", "guest", "systemd")
    os.makedirs(os.path.join(root, "usr/local/lib/perfq-test"), exist_ok=True)
    shutil.copy(os.path.join(gdir, "perfq-systemd-test.sh"),
                os.path.join(root, "usr/local/lib/perfq-test/perfq-systemd-test.sh"))
    os.chmod(os.path.join(root, "usr/local/lib/perfq-test/perfq-systemd-test.sh"), 0o755)
    units = os.path.join(root, "etc/systemd/system")
    shutil.copy(os.path.join(gdir, "perfq-systemd-test.service"), units)
    os.makedirs(os.path.join(units, "multi-user.target.wants"), exist_ok=True)
    os.symlink("/etc/systemd/system/perfq-systemd-test.service",
               os.path.join(units, "multi-user.target.wants", "perfq-systemd-test.service"))
    os.symlink("/dev/null", os.path.join(units, "serial-getty@ttyS0.service"))
    with open(os.path.join(root, "etc/fstab"), "w") as f:
        f.write("/dev/vda / ext4 rw,errors=remount-ro 0 0\n")
    with open(os.path.join(root, "etc/machine-id"), "w") as f:
        f.write("")  # a fresh one each boot (systemd-machine-id-setup)

    kernel = os.path.join(run.dir, f"vmlinuz-{kver}")
    initrd = os.path.join(run.dir, f"initrd.img-{kver}")
    shutil.copy(os.path.join(root, "boot", f"vmlinuz-{kver}"), kernel)
    shutil.copy(os.path.join(root, "boot", f"initrd.img-{kver}"), initrd)

    t = time.monotonic()
    used = int(subprocess.run(["du", "-sxb", root], capture_output=True, text=True,
                              check=True).stdout.split()[0])
    size_mb = used * 13 // 10 // (1 << 20) + 512
    image = os.path.join(run.dir, "disk.img")
    with open(image, "wb") as f:
        f.truncate(size_mb << 20)
    r = subprocess.run(["mkfs.ext4", "-q", "-F", "-L", "perfq-root", "-d", root, image],
                       capture_output=True, text=True)
    rm_tree(root)
    if not run.check(r.returncode == 0, f"mkfs.ext4 -d: a {size_mb} MiB image of "
                                        f"{used >> 20} MiB in {time.monotonic() - t:.1f} s "
                                        f"{r.stderr.strip()[:200]}"):
        return None
    return kernel, initrd, image


def violations_text(report):
    """The first jobs out of order beyond their claims, as the report lists
    them (times, claims, how each was converted): what a failure needs."""
    listed = report.get("causality_violation_list") or []
    return "".join(f"\n      {json.dumps(v)}" for v in listed[:3])


def run_systemd(run, args, timeout):
    """Debian 12 booted from a disk image, systemd as PID 1, the --debs
    installed; the same ivshmem region and perfq-devsim as e2e."""
    if not run.check(os.geteuid() == 0, "running as root (chroot, mounts)"):
        return
    if not run.check(all(os.path.isfile(d) for d in args.debs),
                     f"the --debs exist: {' '.join(args.debs) or 'none given'}"):
        return
    t = time.monotonic()
    prepared = prepare_image(run, args)
    if not prepared:
        return
    kernel, initrd, image = prepared
    log(f"  image ready in {time.monotonic() - t:.1f} s")
    run.make_region(run.shm)
    run.start_devsim(run.shm)
    run.boot([run.shm], timeout, append="root=/dev/vda rw", kernel=kernel, initrd=initrd,
             memory="1G", disk=image)
    result, rc = run.serve(time.monotonic() + timeout + 5)
    run.check(result is not None and result.split()[2:3] == ["PASS"],
              f"guest reports: {result or 'nothing'}")
    run.check(rc == EXIT_PASS, f"QEMU exit status {rc} (isa-debug-exit pass is {EXIT_PASS})")
    run.stop_devsim()
    files = run.files()
    log(f"  files from the guest: {', '.join(sorted(files)) or 'none'} (in {run.dir})")
    if not args.debs:
        return
    # The trace the installed packages recorded, read in the guest by
    # `perfqctl report --json` (as the perfq group member who recorded it).
    r, demo = run.load_json(files, "report.json"), run.load_json(files, "demo.json")
    if not r or not demo:
        return
    run.check(r.get("complete") and r.get("clean_end"), "the trace is complete with a clean end")
    recs = r.get("records", {})
    run.check(recs.get("device", 0) > 0 and recs.get("host", 0) > 0,
              f"device and application records: {recs.get('device')} device, "
              f"{recs.get('host')} host")
    jobs = r.get("jobs", {})
    run.check(demo.get("completed", 0) > 0 and jobs.get("count") == demo.get("completed"),
              f"every demo-app job is correlated host<->device: {jobs.get('count')} of "
              f"{demo.get('completed')}")
    run.check(r.get("causality_violations", 1) == 0,
              f"causality holds for every job ({r.get('causality_violations')} violations)"
              f"{violations_text(r)}")
    lost = r.get("lost", {})
    # The counts only: "index_gaps_counted" is a flag (and a bool is an int).
    counts = {k: v for k, v in lost.items()
              if isinstance(v, (int, float)) and not isinstance(v, bool)}
    run.check(counts and all(v == 0 for v in counts.values())
              and not lost.get("streams"),
              f"nothing lost: {json.dumps(lost)[:200]}")


def run_scenario(args, name, kver=None):
    run = Run(args, name, kver)
    log(f"--- scenario {name}" + (f" on {kver}" if kver else ""))
    timeout = args.timeout or DEFAULT_TIMEOUT.get(name, 90)
    try:
        if name == "systemd":
            run_systemd(run, args, timeout)
            return finish_scenario(run, f"{name}@{kver}" if kver else name)
        regions = []
        if name in ("load", "badinput", "e2e", "unplug", "unplug-sync"):
            run.make_region(run.shm)
            run.start_devsim(run.shm, wait_host=name == "e2e")
            regions.append(run.shm)
        if name == "badinput":
            run.make_region(run.shm + "-bad", good=False)
            regions.append(run.shm + "-bad")
        run.boot(regions, timeout)
        result, rc = run.serve(time.monotonic() + timeout + 5)
        run.check(result is not None and result.split()[2:3] == ["PASS"],
                  f"guest reports: {result or 'nothing'}")
        run.check(rc == EXIT_PASS, f"QEMU exit status {rc} (isa-debug-exit pass is {EXIT_PASS})")
        run.stop_devsim()
        no_daemon = name == "unplug" and run.saw("no perfq-daemon in this build")
        if no_daemon:
            log("  note: no perfq-daemon in this build: the unplug's trace part is not checked")
        if name in ("e2e", "unplug") and not no_daemon:
            files = run.files()
            demo = None
            if "demo.json" in files:
                with open(files["demo.json"]) as f:
                    try:
                        demo = json.loads(f.read().strip().splitlines()[-1])
                    except (json.JSONDecodeError, IndexError):
                        demo = None
            if run.check("t.trace" in files, "the trace came back over ttyS1"):
                log(f"  trace: {os.path.getsize(files['t.trace'])} bytes in {run.dir}")
                rep = run.check_trace(files["t.trace"], name == "e2e")
                if rep and name == "e2e":
                    run.check_e2e(rep, demo)
                    run.check_pci(files, rep)
                elif rep:
                    run.check(rep["records"]["device"] > 0,
                              f"the trace holds the records from before the unplug "
                              f"({rep['records']['device']} device, "
                              f"{rep['records']['host']} host)")
    except Exception as e:  # noqa: BLE001 - a broken scenario is a failed one
        run.check(False, f"runner error: {e!r}")
    finally:
        run.cleanup()
    return finish_scenario(run, f"{name}@{kver}" if kver else name)


def finish_scenario(run, name):
    run.cleanup()
    ok = all(c[0] for c in run.checks) and bool(run.checks)
    elapsed = getattr(run, "elapsed", 0.0)
    log(f"{'PASS' if ok else 'FAIL'} {name} ({elapsed:.1f} s in the guest; logs in {run.dir})")
    return ok


# The guest kernel patches its own text (static keys: when the daemon
# attaches or detaches its BPF programs) with a temporary int3 that its
# int3 handler expects to see only while the patch is under way.  Under
# multi-threaded TCG another vCPU may still run the stale int3 after the
# patch is done (QEMU sees the cross-modifying write late), and the kernel
# oopses with "Oops: int3" in its own code.  That is the emulator's doing,
# not the scenario's (seen once in many runs: systemd@6.12, __schedule):
# such a run is run once more, and says so.  An int3 in perfq's module
# is not excused.
def emulator_int3(run_dir):
    try:
        with open(os.path.join(run_dir, "console.log"), "rb") as f:
            text = f.read().decode("utf-8", "replace")
    except OSError:
        return None
    at = text.find("Oops: int3")
    if at < 0:
        return None
    rip = next((l for l in text[at:].splitlines() if "RIP: 0010:" in l), "")
    return rip.strip() if rip and "[perfq]" not in rip else None


def run_scenario_once_more(args, name, kver):
    ok = run_scenario(args, name, kver)
    run_dir = os.path.join(args.build, "qemu", "run", f"{name}@{kver}" if kver else name)
    rip = None if ok else emulator_int3(run_dir)
    if rip is None:
        return ok
    kept = run_dir + ".int3-console.log"
    shutil.copyfile(os.path.join(run_dir, "console.log"), kept)
    log(f"  note: the guest kernel trapped on an int3 of its own text patching ({rip}): "
        f"TCG's cross-modifying code, not the scenario; running it once more (console in {kept})")
    return run_scenario(args, name, kver)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--build", default=os.path.join(ROOT, "build"), help="build folder (bin/ inside)")
    ap.add_argument("--results", help="write PASS/FAIL lines here")
    ap.add_argument("--timeout", type=int, help="seconds per guest boot (default 90; systemd 600)")
    ap.add_argument("--shell", action="store_true", help="boot the guest interactively")
    ap.add_argument("--no-build", action="store_true", help="reuse the built guest")
    ap.add_argument("--debs", nargs="+", action="extend", default=[], metavar="FILE",
                    help="systemd scenario: .deb files to dpkg -i into the guest\n"
                         "(name the scenarios before --debs, or end the list with --)")
    ap.add_argument("--rootfs-cache", help="systemd scenario: build-rootfs.sh --cache DIR")
    ap.add_argument("--kernel", action="append", default=[], metavar="KVER",
                    help="guest kernel (an installed version with headers; repeat for more);\n"
                         "default: the newest of each series " + ", ".join(KERNEL_SERIES))
    ap.add_argument("scenarios", nargs="*", default=SCENARIOS)
    args = ap.parse_args()
    args.build = os.path.abspath(args.build)
    # `--debs a.deb systemd`: a scenario name swallowed by --debs is a scenario.
    named = [d for d in args.debs if d in SCENARIOS + IMAGE_SCENARIOS and not os.path.exists(d)]
    if named:
        args.scenarios = ([] if args.scenarios == SCENARIOS else args.scenarios) + named
    args.debs = [os.path.abspath(d) for d in args.debs if d not in named]
    # The busybox guest (perfq.ko, initramfs) only for the scenarios that boot it.
    need_guest = args.shell or any(s not in IMAGE_SCENARIOS for s in args.scenarios)

    kernels = args.kernel or default_kernels()
    if not args.no_build and need_guest:
        for kver in kernels:
            r = subprocess.run([os.path.join(ROOT, "qemu", "build-guest.sh"), args.build, kver])
            if r.returncode != 0:
                log(f"building the guest for {kver} failed")
                if args.results:
                    with open(args.results, "w") as f:
                        f.writelines(f"FAIL {s}\n" for s in args.scenarios)
                print(f"qemu: 0 passed, {len(args.scenarios)} failed")
                return 1

    if args.shell:
        run = Run(args, "shell", kernels[-1])
        run.make_region(run.shm)
        run.start_devsim(run.shm)
        try:
            subprocess.call(run.qemu_cmd([run.shm], "perfqtest=shell", interactive=True))
        finally:
            run.cleanup()
        return 0

    t0 = time.monotonic()
    results = []
    for s in args.scenarios:
        results += [(f"{s}@{k}", run_scenario_once_more(args, s, k)) for k in kernels]
    passed = sum(1 for _, ok in results if ok)
    if args.results:
        os.makedirs(os.path.dirname(os.path.abspath(args.results)), exist_ok=True)
        with open(args.results, "w") as f:
            f.writelines(f"{'PASS' if ok else 'FAIL'} {s}\n" for s, ok in results)
    log(f"scenarios took {time.monotonic() - t0:.1f} s")
    print(f"qemu: {passed} passed, {len(results) - passed} failed", flush=True)
    return 0 if passed == len(results) else 1


if __name__ == "__main__":
    sys.exit(main())
