#!/usr/bin/env python3
"""The device SDK on another instruction set, end to end.

perfq-device-example (built on perfq_device.h alone, for riscv64, aarch64 or
the host) runs under qemu-user as the device of a recording by the x86-64
perfq-daemon, through a region under /dev/shm, while perfq-demo-app runs
jobs on its job queue.  Checked, against the device's own accounting and
against the truth (--truth: each tick carries the true host time):

  - every record is accounted for exactly, per stream: emitted = records in
    the trace + the counts of its LOST records, and = delivered + dropped;
  - every job completes once, with its start/end pair, and no causality
    violation (a device event before the host event that caused it);
  - every tick whose time carries a bound is within it of the truth (plus
    the truth's own half-bracket); in mode B the device converted some.

Prints one JSON line of figures (the closing note's) and exits 1 on failure.
usage: device_example_test.py --bin BUILD/bin --example PATH [--qemu CMD]
                              [--mode a|b] [--seconds S]
"""
import argparse
import csv
import json
import os
import shlex
import signal
import subprocess
import sys
import tempfile
import time

failures = []


def check(ok, what):
    print(("ok   " if ok else "FAIL ") + what, flush=True)
    if not ok:
        failures.append(what)


def wait_for(pred, timeout, what):
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if pred():
            return
        time.sleep(0.05)
    raise SystemExit(f"device_example_test: timed out waiting for {what}")


def run(cmd, **kw):
    return subprocess.run(cmd, check=True, capture_output=True, text=True, timeout=120, **kw)


def pct(v, p):
    return v[min(len(v) - 1, int(p * len(v)))] if v else None


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--bin", required=True)
    ap.add_argument("--example", required=True)
    ap.add_argument("--qemu", default="")
    ap.add_argument("--mode", choices=["a", "b"], default="a")
    ap.add_argument("--seconds", type=float, default=4)
    ap.add_argument("--rate", type=int, default=2000)
    a = ap.parse_args()

    tmp = tempfile.mkdtemp(prefix="perfq-devex-")
    region = f"/dev/shm/perfq-devex-{os.getpid()}"
    sock, trace = os.path.join(tmp, "sock"), os.path.join(tmp, "t.trace")
    ctl = [os.path.join(a.bin, "perfqctl"), "--socket", sock]
    procs = []
    try:
        ex_err = open(os.path.join(tmp, "example.log"), "w+")
        ex = subprocess.Popen(shlex.split(a.qemu) + [a.example, "--region", region, "--create",
                                                     "--workers", "2", "--rate", str(a.rate),
                                                     "--jobs", "--truth"],
                              stdout=subprocess.PIPE, stderr=ex_err, text=True)
        procs.append(ex)
        wait_for(lambda: "running on" in open(ex_err.name).read(), 60, "the device to run")
        daemon = subprocess.Popen([os.path.join(a.bin, "perfq-daemon"), "--socket", sock,
                                   "--config", "/dev/null", "--device", "shm:" + region],
                                  stderr=open(os.path.join(tmp, "daemon.log"), "w"))
        procs.append(daemon)
        wait_for(lambda: os.path.exists(sock), 30, "the daemon's socket")
        run(ctl + ["start", "-o", trace, "--sync-mode", a.mode])
        app = run([os.path.join(a.bin, "perfq-demo-app"), "--device", "shm:" + region,
                   "--socket", sock, "--jobs", "400", "--threads", "2", "--job-us", "100"])
        jobs = json.loads(app.stdout.strip().splitlines()[-1])
        time.sleep(a.seconds)
        ex.send_signal(signal.SIGINT)
        out, _ = ex.communicate(timeout=60)
        run(ctl + ["stop"])
        daemon.terminate()
        daemon.wait(timeout=30)
        dev = json.loads(out.strip().splitlines()[-1])
        report = json.loads(run(ctl + ["report", "--json", trace]).stdout)
        csv_path = os.path.join(tmp, "t.csv")
        run(ctl + ["export", trace, "--format", "csv", "-o", csv_path])
        rows = list(csv.DictReader(open(csv_path)))
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
        if os.path.exists(region):
            os.unlink(region)

    check(ex.returncode == 0, f"the device exits cleanly (rc {ex.returncode})")
    check(dev["emitted"] == dev["delivered"] + dev["dropped"],
          f"device: emitted {dev['emitted']} = delivered {dev['delivered']} + dropped {dev['dropped']}")
    # Per stream, from the trace: records + LOST counts = emitted.
    got, lost = {}, {}
    for r in rows:
        if r["source"] != "perfq-device-example":
            continue
        s = int(r["stream"])
        if r["kind"] == "lost":
            lost[s] = lost.get(s, 0) + int(r["arg"])
        else:
            got[s] = got.get(s, 0) + 1
    for st in dev["streams"]:
        s = st["stream"]
        check(got.get(s, 0) + lost.get(s, 0) == st["emitted"],
              f"stream {s} ({st['name']}): {got.get(s, 0)} in the trace + {lost.get(s, 0)} "
              f"reported lost = {st['emitted']} emitted")
        check(got.get(s, 0) == st["delivered"],
              f"stream {s}: {got.get(s, 0)} in the trace = {st['delivered']} delivered")
    check(dev["emitted"] > a.rate * a.seconds, f"{dev['emitted']} records emitted")
    check(jobs["completed"] == 400 and dev["jobs_completed"] == 400,
          f"jobs: app completed {jobs['completed']}, device ran {dev['jobs_completed']} (400)")
    check(report["jobs"]["count"] == 400 and report["jobs"]["incomplete"] == 0,
          f"report: {report['jobs']['count']} jobs complete, "
          f"{report['jobs']['incomplete']} incomplete")
    check(report["causality_violations"] == 0,
          f"causality violations: {report['causality_violations']} (beyond the sync bounds; "
          f"{report['causality_within_bounds']} out of order within them)")

    half = dev["truth_bracket_ns"] / 2
    errs, beyond, unbounded, by_device, worst = [], 0, 0, 0, []
    for r in rows:
        if r["name"] != "tick" or r["arg"] == "0":
            continue
        if r["claim_ns"] == "":
            unbounded += 1
            continue
        e = abs(int(r["time_ns"]) - int(r["arg"]))
        errs.append(e)
        by_device += r["converted_by"] == "device"
        if e > int(r["claim_ns"]) + half:
            beyond += 1
            worst.append((e, r["claim_ns"], r["stream"], r["index"]))
    errs.sort()
    check(len(errs) >= 100, f"{len(errs)} ticks with a bound checked against the truth "
                            f"({unbounded} without one)")
    check(beyond == 0, f"{beyond} ticks beyond their claim + {half:.0f} ns "
                       f"(worst: {sorted(worst)[-3:]})")
    if a.mode == "b":
        check(by_device > 0, f"mode B: {by_device} ticks converted on the device")
    sync = report["sync"]
    print(json.dumps({
        "mode": a.mode, "emitted": dev["emitted"], "delivered": dev["delivered"],
        "dropped": dev["dropped"], "timer_hz": dev["timer_hz"], "jobs": dev["jobs_completed"],
        "causality_violations": report["causality_violations"],
        "causality_within_bounds": report["causality_within_bounds"], "checked": len(errs),
        "unbounded": unbounded, "by_device": by_device, "err_p50_ns": pct(errs, 0.5),
        "err_p99_ns": pct(errs, 0.99), "err_max_ns": errs[-1] if errs else None,
        "claim_p50_ns": sync["claims"].get("p50_ns"), "bound_ns": sync.get("uncertainty_ns")}))
    if failures:
        print(f"device_example_test: {len(failures)} check(s) failed; files in {tmp}")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
