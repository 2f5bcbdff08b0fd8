#!/usr/bin/env python3
"""perfq's soak (make soak): one perfq-daemon for a long time under load.

For --minutes (default 60) one daemon records, in recordings of
--restart-every seconds (default 300) started and stopped back to back, a
software device (perfq-devsim) at --rate records/s (default 1 000 000),
while an instrumented application (perfq-demo-app) connects, runs a few
jobs and exits every second, and status is polled every 100 ms on the
control socket.  Each recording is checked against the accounting of the
programs that fed it, then deleted (a recording at 1 M records/s is GBs):

  - device: per stream, the trace's records equal what devsim delivered and
    the trace's losses equal what devsim dropped (nothing unaccounted);
  - applications: the trace's host records equal what the demo apps said
    they recorded (apps run only inside a recording).

The daemon's RSS and open file descriptors are sampled every second; each
recording's peak RSS and its fewest descriptors (a status poll's socket
comes and goes) are compared like for like: those of the recordings of the last 10 minutes must be within 5 % of
those of the first 10 minutes (the first recording is the warm-up; a short
run compares its last recording with its second).  The last line is the
summary: "soak: PASS ..." or "soak: FAIL ...".  Exit 0 on PASS.

usage: scripts/soak.py [--build build] [--minutes 60] [--rate 1000000]
                       [--restart-every 300] [--work DIR] [--keep]
"""
import argparse
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time

ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                             formatter_class=argparse.RawDescriptionHelpFormatter)
ap.add_argument("--build", default="build")
ap.add_argument("--minutes", type=float, default=60.0)
ap.add_argument("--rate", type=float, default=1_000_000.0)
ap.add_argument("--restart-every", type=float, default=300.0, help="seconds per recording")
ap.add_argument("--work", help="folder for the traces and logs (default: a new one under /var/tmp)")
ap.add_argument("--keep", action="store_true", help="keep the work folder")
args = ap.parse_args()
if args.minutes <= 0 or args.rate <= 0 or args.restart_every < 5:
    ap.error("--minutes and --rate must be positive, --restart-every at least 5 s")

BIN = os.path.join(args.build, "bin")
for prog in ("perfq-daemon", "perfqctl", "perfq-devsim", "perfq-demo-app"):
    if not os.access(os.path.join(BIN, prog), os.X_OK):
        sys.exit(f"soak: {BIN}/{prog} is not built (make build)")
work = args.work or tempfile.mkdtemp(prefix="perfq-soak-", dir="/var/tmp")
os.makedirs(work, exist_ok=True)
sock = os.path.join(work, "perfqd.sock")
region = f"/dev/shm/perfq-soak-{os.getpid()}"
procs = []
failures = []


def log(msg):
    print(f"soak: {msg}", flush=True)


def start(argv, name):
    p = subprocess.Popen(argv, stdout=open(os.path.join(work, name), "w"),
                         stderr=subprocess.STDOUT if not name.endswith(".json") else
                         open(os.path.join(work, name + ".err"), "w"))
    procs.append(p)
    return p


def ctl(*a, check=True):
    r = subprocess.run([os.path.join(BIN, "perfqctl"), "--socket", sock, *a],
                       capture_output=True, text=True, timeout=600)
    if check and r.returncode != 0:
        raise RuntimeError(f"perfqctl {' '.join(a)}: exit {r.returncode}: {r.stderr.strip()}")
    return r


def request(obj, timeout=5.0):
    """One control request on the socket; the reply's JSON."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
        s.settimeout(timeout)
        s.connect(sock)
        s.sendall((json.dumps(obj) + "\n").encode())
        buf = b""
        while not buf.endswith(b"\n"):
            chunk = s.recv(65536)
            if not chunk:
                break
            buf += chunk
    return json.loads(buf)


def cleanup():
    for p in procs:
        if p.poll() is None:
            p.send_signal(signal.SIGINT)
    for p in procs:
        try:
            p.wait(timeout=10)
        except subprocess.TimeoutExpired:
            p.kill()
    for f in (region,):
        if os.path.exists(f):
            os.unlink(f)
    if not args.keep and not failures:
        shutil.rmtree(work, ignore_errors=True)


def region_ready():
    """The region's magic, which a device writes last, is there."""
    try:
        with open(region, "rb") as f:
            return f.read(8) == b"PERFQRGN"
    except OSError:
        return False


def wait_for(what, pred, timeout):
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        v = pred()
        if v:
            return v
        time.sleep(0.1)
    raise RuntimeError(f"timed out ({timeout:.0f} s) waiting for {what}")


daemon = start([os.path.join(BIN, "perfq-daemon"), "--config", "/dev/null", "--socket", sock,
                "--log-target", "stderr", "--log-level", "warn"], "daemon.log")
wait_for("the daemon's socket", lambda: os.path.exists(sock), 20)
stop_all = threading.Event()

# Status every 100 ms, as a dashboard would; its failures are counted.
polls = {"ok": 0, "failed": 0}


def poller():
    while not stop_all.is_set():
        try:
            if request({"cmd": "status"}).get("ok"):
                polls["ok"] += 1
            else:
                polls["failed"] += 1
        except (OSError, ValueError):
            polls["failed"] += 1
        stop_all.wait(0.1)


# The daemon's RSS (KiB) and open descriptors, every second.
samples = []  # (t, rss_kib, fds)


def sampler():
    t0 = time.monotonic()
    while not stop_all.is_set():
        try:
            with open(f"/proc/{daemon.pid}/status") as f:
                rss = next(int(l.split()[1]) for l in f if l.startswith("VmRSS:"))
            fds = len(os.listdir(f"/proc/{daemon.pid}/fd"))
            samples.append((time.monotonic() - t0, rss, fds))
        except (OSError, StopIteration):
            pass
        stop_all.wait(1.0)


threading.Thread(target=poller, daemon=True).start()
threading.Thread(target=sampler, daemon=True).start()

end = time.monotonic() + args.minutes * 60
n = 0
per_recording = []  # (peak RSS KiB, fds at its end)
total_records = 0
total_lost = 0
total_unaccounted = 0
checked = 0
try:
    while time.monotonic() < end:
        n += 1
        seg = min(args.restart_every, max(5.0, end - time.monotonic()))
        first_sample = len(samples)
        trace = os.path.join(work, f"soak-{n}.trace")
        # A fresh device per recording: its accounting covers exactly it.
        if os.path.exists(region):
            os.unlink(region)
        dev = start([os.path.join(BIN, "perfq-devsim"), "--region", region, "--create",
                     "--workers", "2", "--job-workers", "1", "--rate", str(args.rate),
                     "--queue-records", "65536", "--duration", str(seg), "--wait-host"],
                    f"devsim-{n}.json")
        wait_for("the device region", region_ready, 20)
        ctl("start", "-o", trace, "--device", f"shm:{region}")
        # Applications only while the device surely runs (it counts its
        # --duration from the recording's first sync round): each one's
        # records are all in this recording.
        apps_until = time.monotonic() + seg - 3
        apps = {"runs": 0, "recorded": 0, "failed": 0}
        while dev.poll() is None and time.monotonic() < apps_until:
            # An application that connects, records, and exits: every second.
            t = time.monotonic()
            r = subprocess.run([os.path.join(BIN, "perfq-demo-app"), "--device", f"shm:{region}",
                                "--socket", sock, "--jobs", "20", "--threads", "1",
                                "--job-us", "50", "--timeout", "5"],
                               capture_output=True, text=True, timeout=60)
            if r.returncode == 0:
                d = json.loads(r.stdout)
                apps["runs"] += 1
                apps["recorded"] += d["host_events"]["recorded"]
                if not d["host_events"]["connected"]:
                    apps["failed"] += 1
            else:
                apps["failed"] += 1
                failures.append(f"recording {n}: perfq-demo-app exit {r.returncode}: "
                                f"{r.stderr.strip()[:300]}")
            time.sleep(max(0.0, 1.0 - (time.monotonic() - t)))
        dev.wait()
        devjs = json.loads(open(os.path.join(work, f"devsim-{n}.json")).read().strip().splitlines()[-1])

        def finished():
            st = request({"cmd": "status"})
            devs = st.get("recording", {}).get("devices", [])
            return devs and all(d.get("state") == "finished" for d in devs)
        wait_for("the daemon to drain the device", finished, 120)
        ctl("stop")
        rep = json.loads(subprocess.run([os.path.join(BIN, "perfqctl"), "report", "--json", trace],
                                        capture_output=True, text=True, check=True).stdout)
        # Device: per stream, records and losses as devsim counted them.
        by_stream = {s["stream"]: s for s in rep["records"]["streams"] if s["kind"] == "device"}
        lost_by_stream = {s["stream"]: s for s in rep["lost"]["streams"] if s["kind"] == "device"}
        unaccounted = 0
        for s in devjs["streams"]:
            got = by_stream.get(s["stream"], {}).get("records", 0)
            lost = lost_by_stream.get(s["stream"], {}).get("lost", 0)
            if got != s["delivered"] or lost != s["dropped"]:
                unaccounted += abs(s["emitted"] - got - lost)
                failures.append(f"recording {n}, device stream {s['stream']}: devsim delivered "
                                f"{s['delivered']} dropped {s['dropped']}; the trace has {got} "
                                f"records, {lost} lost")
        total_unaccounted += unaccounted
        if rep["records"]["device"] + rep["lost"]["device"] != devjs["emitted"]:
            total_unaccounted += abs(devjs["emitted"] - rep["records"]["device"]
                                     - rep["lost"]["device"]) if not unaccounted else 0
            failures.append(f"recording {n}: devsim emitted {devjs['emitted']}, the trace has "
                            f"{rep['records']['device']} records + {rep['lost']['device']} lost")
        if rep["records"]["host"] != apps["recorded"] or apps["failed"]:
            total_unaccounted += abs(rep["records"]["host"] - apps["recorded"])
            failures.append(f"recording {n}: the apps recorded {apps['recorded']} "
                            f"({apps['failed']} runs failed or unconnected), the trace has "
                            f"{rep['records']['host']} host records")
        checked += 1
        total_records += rep["records"]["total"]
        total_lost += rep["lost"]["device"] + rep["lost"]["host"]
        mine = samples[first_sample:] or samples[-1:]
        per_recording.append((max(x[1] for x in mine), min(x[2] for x in mine)))
        log(f"recording {n}: {seg:.0f} s, {rep['records']['device']} device records "
            f"({rep['lost']['device']} lost), {rep['records']['host']} host records from "
            f"{apps['runs']} apps; unaccounted {unaccounted}; daemon peak RSS "
            f"{per_recording[-1][0] / 1024:.1f} MiB, at least {per_recording[-1][1]} fds")
        os.unlink(trace)
except Exception as e:  # noqa: BLE001 - every failure ends in the summary line
    failures.append(f"{type(e).__name__}: {e}")
finally:
    stop_all.set()
    if daemon.poll() is not None:
        failures.append(f"perfq-daemon exited ({daemon.returncode}) during the soak")
    cleanup()

# Flat: the recordings of the last 10 minutes against those of the first
# 10 (after the warm-up recording): each recording's peak RSS and fewest fds.
after = per_recording[1:]
if len(after) >= 2:
    k = max(1, min(len(after) // 2, round(600 / args.restart_every)))
    first, last = after[:k], after[-k:]
    rss0, rss1 = max(r[0] for r in first), max(r[0] for r in last)
    fd0, fd1 = max(r[1] for r in first), max(r[1] for r in last)
    verdict = (f"peak RSS {rss0 / 1024:.1f} -> {rss1 / 1024:.1f} MiB "
               f"({(rss1 / rss0 - 1) * 100:+.1f} %), fds {fd0} -> {fd1} "
               f"(recordings 2..{1 + k} against the last {k})")
    if rss1 > rss0 * 1.05:
        failures.append(f"the daemon's RSS grew: {verdict}")
    elif fd1 > fd0 * 1.05:
        failures.append(f"the daemon's descriptors grew: {verdict}")
else:
    verdict = "too few recordings to judge RSS and descriptors (3 at least)"
if polls["failed"]:
    failures.append(f"{polls['failed']} of {polls['ok'] + polls['failed']} status polls failed")
for f in failures:
    log(f"FAIL: {f}")
log(f"{'PASS' if not failures else 'FAIL'} {args.minutes:g} min at {args.rate:g} records/s: "
    f"{n} recordings, {total_records} records, {total_lost} counted lost, "
    f"{total_unaccounted} unaccounted in the {checked} checked; {polls['ok']} status polls; "
    f"{verdict}"
    + ("" if not failures else f"; logs in {work}"))
sys.exit(0 if not failures else 1)
