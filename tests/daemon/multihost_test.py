#!/usr/bin/env python3
"""Two hosts that share no monotonic clock, on one timeline (perfqctl merge).

Each "host" is a time namespace (unshare --time: CLOCK_MONOTONIC and
CLOCK_BOOTTIME offset by hours of its own) and a UTS namespace (a host name
of its own), with its own perfq-daemon, devsim and an instrumented program.
The two programs exchange messages over a Unix socket, each send and receive
recorded with the message's id (tests/tools/perfq_pingpong.c).  Then:
  - the two traces' times are hours apart, as their clocks are;
  - after `perfqctl merge`, every message is received after it was sent, and
    both hosts' one-way delays are within what the merge claims (its bound
    for the host, above a true delay that is at least 0);
  - `perfqctl report --json` of the merged trace lists both hosts, and each
    host's device and program.
Needs root (unshare --time).  Usage: multihost_test.py BIN_DIR
"""
import csv
import io
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time

BIN = os.path.abspath(sys.argv[1])
MESSAGES = 200
SKIP = 77  # ctest SKIP_RETURN_CODE


def fail(msg):
    print(f"FAIL {msg}")
    sys.exit(1)


def run(args, **kw):
    return subprocess.run(args, capture_output=True, text=True, timeout=300, **kw)


def host_script(work, name, role, peer_socket):
    """The shell script one host runs inside its namespaces."""
    sock = f"{work}/{name}.sock"
    region = f"/dev/shm/perfq-multihost-{os.getpid()}-{name}"
    trace = f"{work}/{name}.trace"
    return f"""set -e
hostname {name}
rm -f {region}
{BIN}/perfq-devsim --region {region} --create --workers 1 --rate 2000 --job-workers 0 \\
  > {work}/{name}.devsim.json 2> {work}/{name}.devsim.log &
dev=$!
for i in $(seq 100); do [ -e {region} ] && break; sleep 0.05; done
{BIN}/perfq-daemon --socket {sock} --config /dev/null --device shm:{region} \\
  2> {work}/{name}.daemon.log &
daemon=$!
trap 'kill $daemon $dev 2>/dev/null; rm -f {region}' EXIT
for i in $(seq 100); do [ -S {sock} ] && break; sleep 0.05; done
{BIN}/perfqctl --socket {sock} start -o {trace} > /dev/null
{BIN}/perfq_pingpong {sock} {role} {peer_socket} {MESSAGES} > {work}/{name}.app.json
sleep 0.5
{BIN}/perfqctl --socket {sock} stop > {work}/{name}.stop.txt
"""


def main():
    if os.geteuid() != 0:
        print("SKIP multihost: unshare --time needs root")
        return SKIP
    if shutil.which("unshare") is None:
        print("SKIP multihost: no unshare")
        return SKIP
    work = tempfile.mkdtemp(prefix="perfq-multihost-")
    try:
        peer = f"{work}/pingpong.sock"
        hosts = {"hostA": ("serve", 3600, 7200), "hostB": ("ping", 9 * 3600, 11 * 3600)}
        procs = {}
        for name, (role, mono_h, boot_h) in hosts.items():
            with open(f"{work}/{name}.sh", "w") as f:
                f.write(host_script(work, name, role, peer))
            procs[name] = subprocess.Popen(
                ["unshare", "--uts", "--time", "--fork", "--monotonic", str(mono_h),
                 "--boottime", str(boot_h), "sh", f"{work}/{name}.sh"],
                stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
            if name == "hostA":
                time.sleep(1.0)  # the server listens first (the client retries anyway)
        for name, p in procs.items():
            out, _ = p.communicate(timeout=300)
            if p.returncode != 0:
                logs = ""
                for suffix in ("daemon.log", "devsim.log", "app.json"):
                    path = f"{work}/{name}.{suffix}"
                    if os.path.exists(path):
                        logs += f"\n--- {name}.{suffix}\n" + open(path).read()[-2000:]
                fail(f"{name} exited {p.returncode}: {out}{logs}")
        a, b = f"{work}/hostA.trace", f"{work}/hostB.trace"

        def first_ns(path):
            r = run([f"{BIN}/perfqctl", "report", "--json", path])
            if r.returncode != 0:
                fail(f"report {path}: {r.stderr}")
            return json.loads(r.stdout)["first_ns"]
        apart = abs(first_ns(b) - first_ns(a)) / 3600e9
        print(f"ok   the two hosts' monotonic clocks are {apart:.2f} h apart (8 h set)")
        if not 7.9 < apart < 8.1:
            fail(f"the namespaces' clocks should be 8 h apart, not {apart:.2f} h")

        merged = f"{work}/cluster.trace"
        r = run([f"{BIN}/perfqctl", "merge", a, b, "-o", merged])
        print(r.stdout + r.stderr)
        if r.returncode != 0:
            fail(f"perfqctl merge exited {r.returncode}")
        rep = json.loads(run([f"{BIN}/perfqctl", "report", "--json", merged]).stdout)
        hosts_json = rep.get("hosts", [])
        names = [h["name"] for h in hosts_json]
        if names != ["hostA", "hostB"]:
            fail(f"report --json hosts: {names}")
        bound = hosts_json[1]["uncertainty_ns"]
        if bound < 0:
            fail(f"one kernel, one CLOCK_REALTIME: the merge must claim a bound ({hosts_json[1]})")
        print(f"ok   report lists both hosts; hostB aligned within +-{bound} ns: "
              f"{hosts_json[1]['alignment']}")
        kinds = {(s["host"], s["kind"]) for s in rep["sources"] if s["kind"] in ("device", "host")}
        if kinds != {(0, "device"), (0, "host"), (1, "device"), (1, "host")}:
            fail(f"each host's device and program among the sources: {rep['sources']}")

        text = run([f"{BIN}/perfqctl", "export", merged, "--format", "csv", "-o", "-"]).stdout
        host_of = {s["id"]: s["host"] for s in rep["sources"]}
        sends, recvs = {}, {}
        for row in csv.DictReader(io.StringIO(text)):
            if row["name"] not in ("msg_send", "msg_recv"):
                continue
            h = host_of[int(row["source_id"])]
            d = sends if row["name"] == "msg_send" else recvs
            d[int(row["arg"])] = (int(row["time_ns"]), h)
        if len(sends) != 2 * MESSAGES or len(recvs) != 2 * MESSAGES:
            fail(f"{len(sends)} sends and {len(recvs)} receives in the merged trace, "
                 f"{2 * MESSAGES} each expected")
        delays = {(0, 1): [], (1, 0): []}
        for mid, (ts, hs) in sends.items():
            tr, hr = recvs[mid]
            if hs == hr:
                fail(f"message {mid:#x} sent and received on one host")
            delays[(hs, hr)].append(tr - ts)
        for (hs, hr), ds in delays.items():
            ds.sort()
            lo, med, hi = ds[0], ds[len(ds) // 2], ds[-1]
            print(f"ok   {names[hs]} -> {names[hr]}: one-way delay min {lo} ns, median {med} ns, "
                  f"max {hi} ns ({len(ds)} messages)")
            # Received after sent, as far as the merge can know it.
            if lo < -bound:
                fail(f"a message {names[hs]} -> {names[hr]} arrives {-lo} ns before it left, "
                     f"beyond the claimed +-{bound} ns")
        # The two directions' delays are alike; an alignment error shows as
        # twice itself between their medians.
        skew = abs(delays[(0, 1)][MESSAGES // 2] - delays[(1, 0)][MESSAGES // 2]) / 2
        print(f"ok   half the difference of the two directions' median delays: {skew:.0f} ns")
        # Every export takes the merged trace; viewers see each host's
        # processes apart (Chrome JSON: a process per source, HOST:NAME).
        for fmt in ("perfetto", "ctf"):
            out = f"{work}/cluster.{fmt}"
            r = run([f"{BIN}/perfqctl", "export", merged, "--format", fmt, "-o", out])
            if r.returncode != 0:
                fail(f"export --format {fmt} of the merged trace: {r.stderr}")
        r = run([f"{BIN}/perfqctl", "export", merged, "--format", "chrome-json", "-o", "-"])
        procs = {}
        for ev in json.loads(r.stdout)["traceEvents"]:
            if ev.get("ph") == "M" and ev.get("name") == "process_name":
                procs[ev["args"]["name"]] = ev["pid"]
        apps = sorted(n.split(" (source")[0] for n in procs if "pingpong" in n)
        if apps != ["host hostA:pingpong-serve", "host hostB:pingpong-ping"] or \
                len(set(procs.values())) != len(procs):
            fail(f"chrome-json processes: {procs}")
        print(f"ok   exports: perfetto, ctf, chrome-json (processes {sorted(procs)})")
        print("PASS multihost")
        return 0
    finally:
        if os.environ.get("PERFQ_KEEP") is None:
            shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
