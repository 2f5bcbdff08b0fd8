#!/usr/bin/env python3
"""perfq-daemon --metrics scraped by Debian's real Prometheus server.

Starts perfq-devsim (with queues small enough to lose records), perfq-daemon
with --metrics on loopback, and `prometheus` with a 1 s scrape of it;
records a devsim + perfq-demo-app run; then asks Prometheus' HTTP API:
  - perfq_trace_records_total equals the records of the trace (perfqctl report),
  - perfq_device_records_total equals the device records of the trace,
  - the device's losses (the report's) equal perfq_records_lost_total{reason="device"},
  - perfq_recording went from 1 to 0, perfq_build_info names the version,
and checks that the endpoint changes nothing: only GET /metrics answers.

usage: prometheus_test.py BIN_DIR      (exit 77: prometheus is not installed)
"""
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.parse
import urllib.request

BIN = sys.argv[1] if len(sys.argv) > 1 else "build/bin"
PROMETHEUS = shutil.which("prometheus") or "/usr/bin/prometheus"
if not os.access(PROMETHEUS, os.X_OK):
    print("prometheus_test: Debian's `prometheus` is not installed (make deps)", file=sys.stderr)
    sys.exit(77)

work = tempfile.mkdtemp(prefix="perfq-prom-")
procs = []


def fail(msg):
    print(f"prometheus_test: FAIL: {msg}", file=sys.stderr)
    for name in ("daemon.log", "prometheus.log", "devsim.log"):
        p = os.path.join(work, name)
        if os.path.exists(p):
            print(f"--- {name} (tail)", file=sys.stderr)
            print("".join(open(p).readlines()[-20:]), file=sys.stderr)
    sys.exit(1)


def start(args, log):
    p = subprocess.Popen(args, stdout=open(os.path.join(work, log), "w"),
                         stderr=subprocess.STDOUT)
    procs.append(p)
    return p


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_for(what, pred, timeout=20.0):
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        v = pred()
        if v:
            return v
        time.sleep(0.1)
    fail(f"timed out waiting for {what}")


def http(url, method="GET", data=None):
    req = urllib.request.Request(url, method=method, data=data)
    try:
        with urllib.request.urlopen(req, timeout=5) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode(errors="replace")
    except (urllib.error.URLError, ConnectionError):
        return None, ""


def main():
    region = f"/dev/shm/perfq-prom-{os.getpid()}"
    sock = os.path.join(work, "perfqd.sock")
    trace = os.path.join(work, "run.trace")
    ctl = [os.path.join(BIN, "perfqctl"), "--socket", sock]

    # Device queues of 64 records against 400k events/s in bursts: the
    # device loses records and says so.
    devsim = start([os.path.join(BIN, "perfq-devsim"), "--region", region, "--create",
                    "--workers", "2", "--rate", "400000", "--queue-records", "64",
                    "--job-workers", "2", "--wait-host"], "devsim.log")
    daemon = start([os.path.join(BIN, "perfq-daemon"), "--config", "/dev/null", "--socket", sock,
                    "--device", f"shm:{region}", "--metrics", "127.0.0.1:0",
                    "--log-target", "stderr"], "daemon.log")

    def metrics_port():
        for line in open(os.path.join(work, "daemon.log")):
            if "Prometheus metrics at" in line:
                return int(line.rsplit("(port ", 1)[1].split(")")[0])
        return None
    mport = wait_for("the daemon's metrics port", metrics_port)
    murl = f"http://127.0.0.1:{mport}"

    # Read-only: GET /metrics answers, nothing else does.
    code, body = http(murl + "/metrics")
    if code != 200 or "perfq_build_info" not in body:
        fail(f"GET /metrics: {code}")
    for method in ("POST", "PUT", "DELETE"):
        code, _ = http(murl + "/metrics", method, b"x" if method != "DELETE" else None)
        if code is not None and 200 <= code < 300:
            fail(f"{method} /metrics succeeded ({code}): the endpoint must change nothing")
    code, _ = http(murl + "/")
    if code is not None and 200 <= code < 300:
        fail(f"GET / answered {code}: only /metrics is served")

    pport = free_port()
    cfg = os.path.join(work, "prometheus.yml")
    with open(cfg, "w") as f:
        f.write("global:\n  scrape_interval: 1s\n  scrape_timeout: 1s\n"
                "scrape_configs:\n  - job_name: perfq\n    static_configs:\n"
                f"      - targets: ['127.0.0.1:{mport}']\n")
    start([PROMETHEUS, f"--config.file={cfg}", f"--storage.tsdb.path={work}/tsdb",
           f"--web.listen-address=127.0.0.1:{pport}"], "prometheus.log")
    purl = f"http://127.0.0.1:{pport}"

    def query(expr):
        code, body = http(purl + "/api/v1/query?" + urllib.parse.urlencode({"query": expr}))
        if code != 200:
            return None
        return json.loads(body)["data"]["result"]

    def one(expr):
        r = query(expr)
        return float(r[0]["value"][1]) if r else None

    wait_for("Prometheus to scrape the daemon", lambda: one('up{job="perfq"}') == 1.0, 60)

    subprocess.run(ctl + ["start", "-o", trace], check=True, stdout=subprocess.DEVNULL)
    wait_for("perfq_recording 1 in Prometheus", lambda: one("perfq_recording") == 1.0)

    # The cost of a scrape: CPU time of the exposer's threads (civetweb's;
    # status() runs on them) over many scrapes during the recording.
    def exposer_cpu_s():
        total = 0
        for tid in os.listdir(f"/proc/{daemon.pid}/task"):
            try:
                stat = open(f"/proc/{daemon.pid}/task/{tid}/stat").read()
            except FileNotFoundError:
                continue
            comm = stat[stat.index("(") + 1:stat.rindex(")")]
            if comm.startswith("pq-") or tid == str(daemon.pid):
                continue
            fields = stat[stat.rindex(")") + 2:].split()
            total += int(fields[11]) + int(fields[12])  # utime + stime
        return total / os.sysconf("SC_CLK_TCK")
    scrapes = 300
    cpu0 = exposer_cpu_s()
    for _ in range(scrapes):
        if http(murl + "/metrics")[0] != 200:
            fail("GET /metrics failed during the recording")
    per_scrape = (exposer_cpu_s() - cpu0) / scrapes
    print(f"scrape cost: {per_scrape * 1e3:.3f} ms CPU per scrape over {scrapes} scrapes "
          f"({per_scrape * 100:.3f} % of a core at one scrape a second)")
    # The cost is the plain build's figure: a sanitizer tree (PERFQ_SANITIZED
    # set by ctest there) runs the same code several times slower.
    if per_scrape > 0.002 and not os.environ.get("PERFQ_SANITIZED"):
        fail(f"a scrape costs {per_scrape * 1e3:.2f} ms CPU: over 0.2 % of a core at 1/s")
    subprocess.run([os.path.join(BIN, "perfq-demo-app"), "--device", f"shm:{region}",
                    "--socket", sock, "--jobs", "2000", "--threads", "2", "--job-us", "100",
                    "--inflight", "2"], check=True, stdout=subprocess.DEVNULL)
    # The device stops first: the daemon then reads all it published.
    devsim.send_signal(signal.SIGTERM)
    devsim.wait(timeout=30)
    subprocess.run(ctl + ["stop"], check=True, stdout=subprocess.DEVNULL)
    stopped_at = time.time()

    rep = json.loads(subprocess.run([os.path.join(BIN, "perfqctl"), "report", trace, "--json"],
                                    check=True, capture_output=True, text=True).stdout)
    want_total = rep["records"]["total"]
    want_device = rep["records"]["device"]
    # Prometheus' latest sample is from a scrape after the stop returned.
    wait_for("a scrape after the stop", lambda: (one("timestamp(perfq_recording)") or 0) > stopped_at)
    if one("perfq_recording") != 0.0:
        fail("perfq_recording is not 0 after the stop")
    got_total = one("perfq_trace_records_total")
    got_device = one("sum(perfq_device_records_total)")
    lost = one('sum(perfq_records_lost_total{reason="device"})')
    info = query("perfq_build_info")
    print(f"trace: {want_total} records ({want_device} device); Prometheus: "
          f"perfq_trace_records_total {got_total}, perfq_device_records_total {got_device}, "
          f"device records lost {lost} (report: {rep['lost']['device']})")
    if got_total != want_total:
        code, body = http(purl + "/api/v1/targets")
        print(f"Prometheus' targets: {body}", file=sys.stderr)
        print(http(murl + "/metrics")[1], file=sys.stderr)
        fail(f"perfq_trace_records_total {got_total} != the trace's {want_total} records")
    if got_device != want_device:
        fail(f"perfq_device_records_total {got_device} != the trace's {want_device} device records")
    if not rep["lost"]["device"]:
        fail("the device was meant to lose records (queues of 64) but the report shows none")
    if lost != rep["lost"]["device"]:
        fail(f"perfq_records_lost_total{{reason=\"device\"}} {lost} != the report's "
             f"{rep['lost']['device']} device records lost")
    if not info or not info[0]["metric"].get("version"):
        fail("perfq_build_info has no version label")
    daemon.send_signal(signal.SIGTERM)
    daemon.wait(timeout=30)
    print("prometheus_test: ok")


try:
    main()
finally:
    for p in procs:
        if p.poll() is None:
            p.terminate()
            try:
                p.wait(timeout=10)
            except subprocess.TimeoutExpired:
                p.kill()
    for f in os.listdir("/dev/shm"):
        if f == f"perfq-prom-{os.getpid()}":
            os.unlink(os.path.join("/dev/shm", f))
    shutil.rmtree(work, ignore_errors=True)
