// perfq-daemon end to end: real processes (perfq-devsim, perfq-daemon,
// perfqctl, instrumented applications) over a real region, a real socket
// and a real trace file, which the test reads back with TraceReader.
#include <fcntl.h>
#include <grp.h>
#include <poll.h>
#include <pwd.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <catch2/catch.hpp>
#include <climits>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iomanip>
#include <map>
#include <nlohmann/json.hpp>
#include <regex>
#include <set>
#include <sstream>
#include <thread>

#include "core/region.h"
#include "core/ring.h"
#include "device/device_clock.h"
#include "device/timer.h"
#include "drain_thread.h"
#include "kernel_events.h"
#include "perfq/pci.h"
#include "perfq/trace.h"
#include "perfq_kevent.h"
#include "test_util.h"

namespace perfq {
namespace {

using nlohmann::json;

constexpr double kSlow = kSanitized ? 3 : 1;  // durations and timeouts where programs are slower

bool wait_for(const std::function<bool()>& cond, std::chrono::milliseconds timeout) {
  const auto until = std::chrono::steady_clock::now() + timeout;
  while (std::chrono::steady_clock::now() < until) {
    if (cond()) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  return cond();
}

// A perfq-daemon on a socket of its own, stopped (SIGTERM) at the end.
struct Daemon {
  std::string socket;
  std::unique_ptr<Child> proc;
  Daemon(const TempDir& dir, std::vector<std::string> extra = {}) {
    socket = dir.file("perfqd.sock");
    std::vector<std::string> argv = {
        kBin + "/perfq-daemon", "--socket", socket, "--config", "/dev/null",
        "--log-level",          "debug"};
    if (kSlow > 1) {
      // Sanitizer builds run several times slower: give late records time
      // (unless the test sets it).
      for (const char* o : {"--device-latency-ms", "--host-latency-ms"}) {
        if (std::find(extra.begin(), extra.end(), o) != extra.end()) continue;
        argv.push_back(o);
        argv.push_back("500");
      }
    }
    argv.insert(argv.end(), extra.begin(), extra.end());
    proc = std::make_unique<Child>(argv);
    REQUIRE(proc->started());
    REQUIRE(wait_for([&] { return access(socket.c_str(), F_OK) == 0 || !proc->running(); },
                     std::chrono::seconds(10)));
    INFO("daemon stderr: " << proc->err());
    REQUIRE(proc->running());
  }
  ~Daemon() {
    if (proc && proc->running()) {
      proc->signal(SIGTERM);
      proc->wait(std::chrono::seconds(20));
    }
  }
};

// perfqctl with the daemon's socket; returns the child after it exited.
std::unique_ptr<Child> ctl_at(const std::string& socket, std::vector<std::string> args,
                              std::vector<std::string> prefix = {}) {
  std::vector<std::string> argv = prefix;
  argv.push_back(kBin + "/perfqctl");
  argv.push_back("--socket");
  argv.push_back(socket);
  argv.insert(argv.end(), args.begin(), args.end());
  auto c = std::make_unique<Child>(argv);
  REQUIRE(c->started());
  REQUIRE(c->wait(std::chrono::seconds(static_cast<int>(120 * kSlow))));
  return c;
}
std::unique_ptr<Child> ctl(const Daemon& d, std::vector<std::string> args,
                           std::vector<std::string> prefix = {}) {
  return ctl_at(d.socket, std::move(args), std::move(prefix));
}

// A raw control connection: one JSON line each way.
class Conn {
 public:
  explicit Conn(const std::string& path) {
    fd_ = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    sockaddr_un a{};
    a.sun_family = AF_UNIX;
    std::strncpy(a.sun_path, path.c_str(), sizeof(a.sun_path) - 1);
    ok_ = ::connect(fd_, reinterpret_cast<sockaddr*>(&a), sizeof(a)) == 0;
  }
  ~Conn() { ::close(fd_); }
  bool ok() const { return ok_; }
  bool send_raw(const std::string& s) {
    size_t off = 0;
    while (off < s.size()) {
      ssize_t n = ::send(fd_, s.data() + off, s.size() - off, MSG_NOSIGNAL);
      if (n <= 0) return false;
      off += static_cast<size_t>(n);
    }
    return true;
  }
  // The next line, or "" at EOF / after 30 s.
  std::string line() {
    timeval tv{30, 0};
    setsockopt(fd_, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
    while (buf_.find('\n') == std::string::npos) {
      char c[4096];
      ssize_t n = ::recv(fd_, c, sizeof(c), 0);
      if (n <= 0) return "";
      buf_.append(c, static_cast<size_t>(n));
    }
    auto nl = buf_.find('\n');
    std::string l = buf_.substr(0, nl);
    buf_.erase(0, nl + 1);
    return l;
  }
  json request(const json& j) {
    if (!send_raw(j.dump() + "\n")) return nullptr;
    std::string l = line();
    return l.empty() ? json(nullptr) : json::parse(l, nullptr, false);
  }

 private:
  int fd_ = -1;
  bool ok_ = false;
  std::string buf_;
};

// Everything a trace holds, for checks.
struct TraceContent : TraceVisitor {
  TraceMetadata meta;
  std::vector<TraceRecord> records;
  uint64_t sync_samples = 0, models = 0;
  std::vector<TraceClockModel> model_list;
  std::vector<TraceLoss> losses;
  Status on_metadata(const TraceMetadata& m) override {
    meta = m;
    return Status::ok();
  }
  Status on_records(std::span<const TraceRecord> r) override {
    records.insert(records.end(), r.begin(), r.end());
    return Status::ok();
  }
  Status on_sync_samples(std::span<const TraceSyncSample> s) override {
    sync_samples += s.size();
    return Status::ok();
  }
  Status on_clock_models(std::span<const TraceClockModel> m) override {
    models += m.size();
    model_list.insert(model_list.end(), m.begin(), m.end());
    return Status::ok();
  }
  Status on_losses(std::span<const TraceLoss> l) override {
    losses.insert(losses.end(), l.begin(), l.end());
    return Status::ok();
  }
  std::string event_name(const TraceRecord& r) const {
    const TraceSource* s = meta.find_source(r.source);
    if (!s) return "";
    const EventInfo* e = s->find_event(r.rec.event);
    return e ? e->name : "";
  }
};

TraceContent read_trace(const std::string& path, bool* clean) {
  TraceContent c;
  auto r = TraceReader::open(path);
  REQUIRE(r);
  Status s = r->read(c);
  INFO(s.message());
  REQUIRE(s);
  *clean = r->summary().clean_end;
  return c;
}

// The nice value of the thread of `pid` named `name` (/proc/PID/task/*/stat:
// the name in parentheses, then field 19); INT_MIN when there is none.
int thread_nice(pid_t pid, const std::string& name) {
  const std::string dir = "/proc/" + std::to_string(pid) + "/task";
  std::error_code ec;
  for (const auto& e : std::filesystem::directory_iterator(dir, ec)) {
    std::ifstream f(e.path() / "stat");
    std::string stat((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
    const size_t open = stat.find('('), close = stat.rfind(')');
    if (open == std::string::npos || close == std::string::npos) continue;
    if (stat.substr(open + 1, close - open - 1) != name) continue;
    std::istringstream rest(stat.substr(close + 2));
    std::string field;
    // Fields 3.. follow the name; nice is field 19.
    for (int i = 3; i < 19 && rest >> field; ++i) {
    }
    int nice = INT_MIN;
    rest >> nice;
    return nice;
  }
  return INT_MIN;
}

TEST_CASE("daemon: devsim, daemon and a multi-threaded demo app make one ordered, causal trace",
          "[daemon][process]") {
  TempDir dir("daemon-e2e");
  TempShm shm("daemon-e2e");
  const std::string trace = dir.file("e2e.trace");
  Child dev({kBin + "/perfq-devsim", "--region", shm.path(), "--create", "--workers", "2", "--rate",
             "5000", "--job-workers", "2", "--duration", std::to_string(4 * kSlow),
             "--clock-offset-ns", "-7000000000", "--clock-drift-ppm", "30", "--wait-host",
             "--job-bytes", "4096"});
  REQUIRE(dev.started());
  REQUIRE(
      wait_for([&] { return access(shm.path().c_str(), F_OK) == 0; }, std::chrono::seconds(10)));
  Daemon d(dir);
  auto st = ctl(d, {"start", "-o", trace, "--device", "shm:" + shm.path()});
  INFO("start: " << st->out() << st->err());
  REQUIRE(st->exit_code() == 0);

  Child app({kBin + "/perfq-demo-app", "--device", "shm:" + shm.path(), "--socket", d.socket,
             "--jobs", "600", "--threads", "3", "--job-us", "50", "--inflight", "2", "--copy-bytes",
             "65536"});
  REQUIRE(app.wait(std::chrono::seconds(static_cast<int>(60 * kSlow))));
  INFO("demo-app: " << app.out() << app.err());
  REQUIRE(app.exit_code() == 0);
  const json appjs = json::parse(app.out());

  // status while recording: the device and the app's streams are there.
  auto status = ctl(d, {"status", "--json"});
  REQUIRE(status->exit_code() == 0);
  const json sj = json::parse(status->out());
  REQUIRE(sj["recording"].is_object());
  CHECK(sj["recording"]["devices"].size() == 1);
  // The threads that time sync rounds run above the load (root may raise
  // them): the daemon's sync thread and devsim's timer server.
  if (geteuid() == 0) {
    CHECK(thread_nice(d.proc->pid(), "pq-sync") == kSyncNice);
    CHECK(thread_nice(dev.pid(), "pq-timer") == kSyncNice);
  }

  REQUIRE(dev.wait(std::chrono::seconds(static_cast<int>(60 * kSlow))));
  REQUIRE(dev.exit_code() == 0);
  const json devjs = json::parse(dev.out());
  auto stop = ctl(d, {"stop", "--json"});
  INFO("stop: " << stop->out() << stop->err() << "\ndaemon: " << d.proc->err());
  REQUIRE(stop->exit_code() == 0);
  const json summary = json::parse(stop->out());
  CHECK(summary["complete"] == true);

  bool clean = false;
  TraceContent t = read_trace(trace, &clean);
  CHECK(clean);
  CHECK(t.sync_samples > 0);
  CHECK(t.models > 0);
  uint64_t device = 0, host = 0;
  std::map<uint64_t, std::array<int64_t, 4>> jobs;  // corr id -> submit, start, end, complete
  int64_t prev = INT64_MIN;
  uint64_t out_of_order = 0;
  std::string disorder;
  for (const auto& r : t.records) {
    if (r.time_ns < prev) {
      ++out_of_order;
      disorder += "source " + std::to_string(r.source) + " stream " + std::to_string(r.rec.stream) +
                  " index " + std::to_string(r.rec.index) + " at " + std::to_string(r.time_ns) +
                  " after " + std::to_string(prev) + "; ";
    }
    prev = r.time_ns;
    const TraceSource* s = t.meta.find_source(r.source);
    REQUIRE(s);
    (s->kind == TraceSourceKind::kDevice ? device : host)++;
    const std::string name = t.event_name(r);
    const int role = name == "job_submit"     ? 0
                     : name == "job_start"    ? 1
                     : name == "job_end"      ? 2
                     : name == "job_complete" ? 3
                                              : -1;
    if (role >= 0) {
      auto [it, fresh] = jobs.try_emplace(r.rec.arg, std::array<int64_t, 4>{-1, -1, -1, -1});
      it->second[static_cast<size_t>(role)] = r.time_ns;
    }
  }
  INFO("out of order: " << disorder << " merge: " << summary["merge"].dump());
  CHECK(out_of_order == 0);
  CHECK(device == devjs["emitted"].get<uint64_t>());
  CHECK(devjs["dropped"] == 0);
  CHECK(host == appjs["host_events"]["recorded"].get<uint64_t>());
  CHECK(appjs["host_events"]["lost"] == 0);
  CHECK(jobs.size() == appjs["completed"].get<size_t>());
  // Causality.  A job's end->complete gap can be under 200 ns (the host
  // polls its completion ring), close to the sync error of a loaded 2-core
  // machine; so an inversion must stay within the stated uncertainty of
  // the models that converted the jobs (3x in the much slower sanitizer
  // builds), and be rare.  The jobs run in the first moments of the
  // recording, while the first sync rounds (slow ones, on a loaded
  // machine) make the model: the largest claim of the models installed
  // from the first job until a second after the last.
  int64_t first_job = INT64_MAX, last_job = INT64_MIN;
  for (const auto& [id, j] : jobs)
    for (int64_t t : j)
      if (t >= 0) {
        first_job = std::min(first_job, t);
        last_job = std::max(last_job, t);
      }
  double unc = summary["devices"][0]["sync"]["uncertainty_ns"].get<double>();
  for (const auto& m : t.model_list)
    if (m.installed_ns >= first_job - 1'000'000'000 && m.installed_ns <= last_job + 1'000'000'000)
      unc = std::max(unc, static_cast<double>(m.model.uncertainty_ns));
  const double tolerance = kSlow > 1 ? 3 * unc : unc;
  uint64_t incomplete = 0, violations = 0, beyond = 0;
  for (const auto& [id, j] : jobs) {
    if (j[0] < 0 || j[1] < 0 || j[2] < 0 || j[3] < 0) {
      ++incomplete;
      continue;
    }
    bool violated = false;
    for (size_t k = 0; k < 3; ++k) {
      if (j[k] <= j[k + 1]) continue;
      violated = true;
      if (static_cast<double>(j[k] - j[k + 1]) > tolerance) ++beyond;
    }
    violations += violated;
  }
  CHECK(incomplete == 0);
  CHECK(beyond == 0);
  // Rare, too, where the models are tight (under 1 us).  A model that
  // claims more, as the first ones may while devsim, the daemon and the app
  // all start on 2 cores (168 us in one run), or those of the sanitizer
  // builds, claims more than the smallest gaps: inversions within the claim
  // are then expected, and the claim is the check.
  INFO("violations within the models' uncertainty: " << violations << " of " << jobs.size()
                                                     << " jobs (tolerance " << tolerance << " ns)");
  if (kSlow == 1 && tolerance <= 1000) CHECK(violations * 100 <= jobs.size());

  // The report agrees.
  Child rep({kBin + "/perfqctl", "report", trace, "--json"});
  REQUIRE(rep.wait(std::chrono::seconds(60)));
  REQUIRE(rep.exit_code() == 0);
  const json rj = json::parse(rep.out());
  // Out of order beyond the claims: none (the claims hold); within them:
  // the rest.
  CHECK(rj["causality_violations"] == 0);
  CHECK(rj["causality_violations"].get<uint64_t>() +
            rj["causality_within_bounds"].get<uint64_t>() ==
        violations);

  // What the byte-count events moved, against what the programs say they
  // did: the app's copies (its h2d_copy ranges, arg declared at
  // registration) and the device's dma_read of each job (declared in its
  // region's dictionary).
  std::map<std::string, json> moved;
  for (const auto& e : rj["events"])
    if (e.contains("throughput")) moved[e["name"].get<std::string>()] = e["throughput"];
  REQUIRE(moved.size() == 2);
  const json& copy = moved["h2d_copy"];
  const json& dma = moved["dma_read"];
  CHECK(copy["calls"] == appjs["submit_calls"]);
  CHECK(copy["bytes"].get<double>() == appjs["copied_bytes"].get<double>());
  CHECK(copy["min_bytes"] == 65536);
  CHECK(copy["max_bytes"] == 65536);
  CHECK(copy["ranges"] == copy["calls"]);
  CHECK(copy["in_range_bytes_per_s"].get<double>() > 0);
  CHECK(copy["bytes_per_s"].get<double>() ==
        Approx(copy["bytes"].get<double>() / (rj["duration_ns"].get<double>() / 1e9)));
  CHECK(dma["calls"] == devjs["jobs_completed"]);
  CHECK(dma["bytes"].get<double>() == 4096.0 * devjs["jobs_completed"].get<double>());
  CHECK(dma["link"].is_null());  // a region in /dev/shm: no PCIe link
}

TEST_CASE("daemon: records a device dropped are counted once, as the device counted them",
          "[daemon][process]") {
  // A ring of 64 records at a rate the 1 ms drain cannot keep up with: the
  // device drops records, which both leaves gaps in its indices and is
  // reported by LOST records.  The daemon must count each dropped record
  // once, per stream and in all.
  TempDir dir("daemon-drops");
  TempShm shm("daemon-drops");
  const std::string trace = dir.file("drops.trace");
  Child dev({kBin + "/perfq-devsim", "--region", shm.path(), "--create", "--ring-records", "64",
             "--queue-records", "256", "--workers", "2", "--job-workers", "0", "--rate", "400000",
             "--duration", std::to_string(2 * kSlow), "--wait-host"});
  REQUIRE(dev.started());
  REQUIRE(
      wait_for([&] { return access(shm.path().c_str(), F_OK) == 0; }, std::chrono::seconds(10)));
  Daemon d(dir);
  auto st = ctl(d, {"start", "-o", trace, "--device", "shm:" + shm.path()});
  INFO("start: " << st->out() << st->err());
  REQUIRE(st->exit_code() == 0);
  REQUIRE(dev.wait(std::chrono::seconds(static_cast<int>(60 * kSlow))));
  REQUIRE(dev.exit_code() == 0);
  const json devjs = json::parse(dev.out());
  // The device has stopped: the drain finishes once it has read everything.
  REQUIRE(wait_for(
      [&] {
        auto s = ctl(d, {"status", "--json"});
        if (s->exit_code() != 0) return false;
        const json j = json::parse(s->out());
        return j["recording"]["devices"].size() == 1 &&
               j["recording"]["devices"][0]["state"] == "finished";
      },
      std::chrono::seconds(static_cast<int>(30 * kSlow))));
  auto stop = ctl(d, {"stop", "--json"});
  INFO("stop: " << stop->out() << stop->err() << "\ndaemon: " << d.proc->err());
  REQUIRE(stop->exit_code() == 0);
  const json summary = json::parse(stop->out());
  INFO("devsim: " << devjs.dump() << "\nsummary: " << summary.dump());
  REQUIRE(summary["devices"].size() == 1);
  const json& dj = summary["devices"][0];
  const uint64_t dropped = devjs["dropped"];
  CHECK(dropped > 0);
  CHECK(dj["lost"].get<uint64_t>() == dropped);
  std::map<uint16_t, uint64_t> per_stream;
  for (const auto& s : devjs["streams"]) per_stream[s["stream"].get<uint16_t>()] = s["dropped"];
  for (const auto& s : dj["streams"]) {
    INFO("stream " << s["stream"]);
    CHECK(s["lost"].get<uint64_t>() == per_stream[s["stream"].get<uint16_t>()]);
  }
  CHECK(dj["records"].get<uint64_t>() + dropped >= devjs["emitted"].get<uint64_t>());
  // So does the report of the trace.
  Child rep({kBin + "/perfqctl", "report", "--json", trace});
  REQUIRE(rep.wait(std::chrono::seconds(static_cast<int>(60 * kSlow))));
  INFO("report: " << rep.err());
  REQUIRE(rep.exit_code() == 0);
  const json rj = json::parse(rep.out());
  CHECK(rj["lost"]["device"].get<uint64_t>() == dropped);
}

// perfqctl start --duration on a terminal: its live line shows what the
// device loses as it happens, not only in the summary at the end.
TEST_CASE("daemon: start --duration shows the device's losses as they happen",
          "[daemon][process]") {
  REQUIRE(access("/usr/bin/script", X_OK) == 0);  // script(1) gives perfqctl a terminal
  TempDir dir("daemon-live-loss");
  TempShm shm("daemon-live-loss");
  // A ring of 64 records the drain cannot keep empty at this rate: losses.
  Child dev({kBin + "/perfq-devsim", "--region", shm.path(), "--create", "--ring-records", "64",
             "--queue-records", "256", "--workers", "2", "--job-workers", "0", "--rate", "400000",
             "--duration", std::to_string(6 * kSlow), "--wait-host"});
  REQUIRE(dev.started());
  REQUIRE(
      wait_for([&] { return access(shm.path().c_str(), F_OK) == 0; }, std::chrono::seconds(10)));
  Daemon d(dir);
  // Long enough that a busy machine's first sync round (which starts the
  // device's workers) leaves seconds of losses to show.
  const std::string cmd = kBin + "/perfqctl --socket " + d.socket + " start -o " +
                          dir.file("live.trace") + " --device shm:" + shm.path() +
                          " --duration 4 --json";
  // script(1): perfqctl's stderr is a terminal, whose output script copies.
  Child term({"/usr/bin/script", "-q", "-e", "-c", cmd, "/dev/null"});
  REQUIRE(term.started());
  REQUIRE(term.wait(std::chrono::seconds(static_cast<int>(60 * kSlow))));
  INFO("on the terminal: " << term.out() << term.err());
  CHECK(term.exit_code() == 0);
  const std::string shown = term.out();
  const std::regex live(R"(recording \S+: [0-9.]+ / 4\.0 s, (\d+) records, (\d+) lost by devices)");
  uint64_t most = 0;
  for (auto it = std::sregex_iterator(shown.begin(), shown.end(), live);
       it != std::sregex_iterator(); ++it)
    most = std::max<uint64_t>(most, std::stoull((*it)[2].str()));
  CHECK(most > 0);
}

// A writer that cannot write (its output is a pipe nobody reads for a
// while): the merge holds at most its cap of records for it, the drain
// leaves the rest in the device's ring, whose overflow the device counts,
// and once the writer goes on, the trace holds every record the device did
// not drop, and the daemon counts those as lost.
TEST_CASE(
    "daemon: a writer that cannot write holds the daemon's memory to its cap, and the "
    "device counts the rest",
    "[daemon][process]") {
  constexpr uint64_t kCap = perfqd::DeviceDrainThread::kMaxMergePending;
  TempDir dir("daemon-backlog");
  TempShm shm("daemon-backlog");
  const std::string fifo = dir.file("backlog.fifo");
  const std::string copy = dir.file("backlog.trace");
  REQUIRE(mkfifo(fifo.c_str(), 0600) == 0);
  // Our end first, so that the daemon's open for writing does not wait.
  const int rd = ::open(fifo.c_str(), O_RDONLY | O_NONBLOCK | O_CLOEXEC);
  REQUIRE(rd >= 0);
  // Under sanitizers, a rate the slowed writer can still outrun once the
  // reader goes on (at 400 k/s a TSan run's writer never caught up in 180 s);
  // the cap still fills in about 20 s.
  const int rate = kSlow > 1 ? 200'000 : 1'500'000;
  Child dev({kBin + "/perfq-devsim", "--region", shm.path(), "--create", "--workers", "2",
             "--job-workers", "0", "--rate", std::to_string(rate), "--ring-records",
             std::to_string(1 << 18), "--wait-host"});
  REQUIRE(dev.started());
  // The region exists before it is initialized: wait for the device to run.
  REQUIRE(wait_for([&] { return dev.err().find("running on") != std::string::npos; },
                   std::chrono::seconds(static_cast<int>(10 * kSlow))));
  Daemon d(dir);
  // The fifo exists: only --force has the daemon open it.
  auto st = ctl(d, {"start", "-o", fifo, "--force", "--device", "shm:" + shm.path()});
  INFO("start: " << st->out() << st->err() << "\ndaemon: " << d.proc->err());
  REQUIRE(st->exit_code() == 0);
  auto status = [&] {
    auto s = ctl(d, {"status", "--json"});
    REQUIRE(s->exit_code() == 0);
    return json::parse(s->out());
  };
  // Nobody reads: the writer blocks in write(2) once the pipe is full, and
  // the merge fills up to its cap.
  uint64_t most = 0;
  auto backlogged = [&] {
    const json j = status();
    most = std::max<uint64_t>(most, j["recording"]["merge"]["pending"].get<uint64_t>());
    return j["recording"]["devices"][0]["writer_waits"].get<uint64_t>() > 0;
  };
  REQUIRE(wait_for(backlogged, std::chrono::seconds(static_cast<int>(60 * kSlow))));
  // And stays there while the device goes on (2 s: millions of records).
  const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(2);
  while (std::chrono::steady_clock::now() < until) {
    (void)backlogged();
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  // A poll's batch past the cap, and the release of what waited for the
  // first clock model (at most kMaxUnconverted, once).
  INFO("most records pending: " << most);
  CHECK(most >= kCap);
  CHECK(most <= kCap + perfqd::DeviceDrainThread::kMaxUnconverted + (1u << 16));

  // The reader goes on: everything written so far and from now on.
  std::atomic<bool> quit{false};
  std::thread reader([&] {
    const int out = ::open(copy.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
    if (out < 0) return;
    std::vector<char> buf(1 << 20);
    for (;;) {
      const ssize_t n = ::read(rd, buf.data(), buf.size());
      if (n == 0) break;  // the daemon closed its end: the trace is complete
      if (n < 0) {
        if ((errno == EAGAIN || errno == EINTR) && !quit) {
          pollfd p{rd, POLLIN, 0};
          ::poll(&p, 1, 100);
          continue;
        }
        break;
      }
      if (::write(out, buf.data(), static_cast<size_t>(n)) != n) break;
    }
    ::close(out);
  });
  // However the test ends (a failed REQUIRE: the daemon may still hold
  // its end open), the reader stops and our end is closed.
  struct Join {
    std::thread& t;
    std::atomic<bool>& quit;
    int fd;
    ~Join() {
      quit = true;
      if (t.joinable()) t.join();
      ::close(fd);
    }
  } join_reader{reader, quit, rd};
  // The writer catches up and the drain reads again (no more waits for the
  // writer over 200 ms) before the device stops: a device stopping while
  // nobody makes room in its ring could not report the records it drops at
  // its end (it would count them, the daemon not).
  auto writer_waits = [](const json& j) {
    return j["recording"]["devices"][0]["writer_waits"].get<uint64_t>();
  };
  CHECK(wait_for(
      [&] {
        const json a = status();
        if (a["recording"]["merge"]["pending"].get<uint64_t>() >= kCap / 4) return false;
        std::this_thread::sleep_for(std::chrono::milliseconds(200));
        return writer_waits(status()) == writer_waits(a);
      },
      std::chrono::seconds(static_cast<int>(60 * kSlow))));
  dev.signal(SIGTERM);
  REQUIRE(dev.wait(std::chrono::seconds(static_cast<int>(60 * kSlow))));
  REQUIRE(dev.exit_code() == 0);
  const json devjs = json::parse(dev.out());
  auto stop = ctl(d, {"stop", "--json"});
  INFO("stop: " << stop->out() << stop->err() << "\ndaemon: " << d.proc->err());
  REQUIRE(stop->exit_code() == 0);
  reader.join();  // at the end of the pipe: the daemon closed the trace
  const json summary = json::parse(stop->out());
  CHECK(summary["complete"] == true);
  INFO("devsim: " << devjs.dump() << "\nsummary: " << summary.dump());
  const uint64_t emitted = devjs["emitted"], dropped = devjs["dropped"];
  CHECK(dropped > 0);  // the ring overflowed while the drain waited
  REQUIRE(summary["devices"].size() == 1);
  CHECK(summary["devices"][0]["lost"].get<uint64_t>() == dropped);

  // Every record the device did not drop is in the trace.
  struct Count : TraceVisitor {
    uint64_t records = 0;
    Status on_records(std::span<const TraceRecord> r) override {
      for (const auto& x : r)
        if ((x.rec.flags & PERFQ_FLAGS_KIND_MASK) != PERFQ_KIND_LOST) ++records;
      return Status::ok();
    }
  } count;
  auto r = TraceReader::open(copy);
  REQUIRE(r);
  Status s = r->read(count);
  INFO(s.message());
  REQUIRE(s);
  CHECK(r->summary().clean_end);
  CHECK(count.records == emitted - dropped);
}

// Applications publish their ring's tail once per chunk (perfq_abi.h,
// "Chunks"); what a quiet thread wrote past it reaches the recording within
// a pass or two of the collector anyway, while the thread lives, not only
// when it ends or at the stop.
TEST_CASE("daemon: a quiet thread's partly filled chunk reaches the recording while it lives",
          "[daemon][process]") {
  const int n = GENERATE(5, 64 * 3 + 7);
  INFO(n << " records");
  TempDir dir("daemon-quiet");
  const std::string trace = dir.file("quiet.trace");
  Daemon d(dir);
  REQUIRE(ctl(d, {"start", "-o", trace})->exit_code() == 0);
  Child app({kBin + "/perfq_test_app", d.socket, "quiet", "1", std::to_string(n)});
  REQUIRE(app.started());
  REQUIRE(wait_for([&] { return app.out().find("recorded") != std::string::npos; },
                   std::chrono::seconds(static_cast<int>(30 * kSlow))));
  const auto printed = std::chrono::steady_clock::now();
  const json ajs = json::parse(app.out());
  REQUIRE(ajs["recorded"].get<int>() == n);
  uint64_t seen = 0;
  const bool all = wait_for(
      [&] {
        auto st = ctl(d, {"status", "--json"});
        if (st->exit_code() != 0) return false;
        seen = 0;
        const json j = json::parse(st->out());
        for (const auto& h : j["app_streams"])
          if (h["pid"].get<int>() == ajs["pid"].get<int>()) seen += h["records"].get<uint64_t>();
        return seen == static_cast<uint64_t>(n);
      },
      std::chrono::seconds(static_cast<int>(10 * kSlow)));
  const double after_ms =
      std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - printed).count();
  INFO("the daemon had " << seen << " of them " << after_ms
                         << " ms after the app printed its count");
  CHECK(all);
  CHECK(app.running());  // taken while the thread lived, not at its end
  app.signal(SIGKILL);
  REQUIRE(app.wait(std::chrono::seconds(10)));
  auto stop = ctl(d, {"stop", "--json"});
  REQUIRE(stop->exit_code() == 0);
  bool clean = false;
  TraceContent t = read_trace(trace, &clean);
  CHECK(clean);
  std::vector<uint64_t> args;
  for (const auto& r : t.records)
    if (t.event_name(r) == "tick") args.push_back(r.rec.arg);
  std::sort(args.begin(), args.end());
  REQUIRE(args.size() == static_cast<size_t>(n));
  for (size_t i = 0; i < args.size(); ++i) CHECK(args[i] == i);
}

TEST_CASE("daemon: applications that start early, exit mid-recording or are killed",
          "[daemon][process]") {
  TempDir dir("daemon-apps");
  const std::string trace = dir.file("apps.trace");
  const std::string sock = dir.file("perfqd.sock");
  const std::string app = kBin + "/perfq_test_app";
  constexpr int kThreads = 3, kN = 20000;
  // Before the daemon exists: it runs, dropping, and connects later.
  Child early({app, sock, "early", std::to_string(kThreads), std::to_string(kN)});
  REQUIRE(wait_for([&] { return early.out().find("waiting") != std::string::npos; },
                   std::chrono::seconds(10)));
  Daemon d(dir);
  auto st = ctl(d, {"start", "-o", trace});
  INFO("start: " << st->out() << st->err());
  REQUIRE(st->exit_code() == 0);

  Child killed({app, sock, "kill", std::to_string(kThreads), std::to_string(kN)});
  Child midexit({app, sock, "midexit", std::to_string(kThreads), std::to_string(kN)});
  Child normal({app, sock, "record", std::to_string(kThreads), std::to_string(kN)});
  REQUIRE(wait_for([&] { return killed.out().find("recorded") != std::string::npos; },
                   std::chrono::seconds(static_cast<int>(30 * kSlow))));
  const json kjs = json::parse(killed.out());
  killed.signal(SIGKILL);
  REQUIRE(killed.wait(std::chrono::seconds(10)));
  REQUIRE(midexit.wait(std::chrono::seconds(static_cast<int>(30 * kSlow))));
  CHECK(midexit.exit_code() == 0);
  REQUIRE(normal.wait(std::chrono::seconds(static_cast<int>(30 * kSlow))));
  CHECK(normal.exit_code() == 0);
  REQUIRE(early.wait(std::chrono::seconds(static_cast<int>(30 * kSlow))));
  CHECK(early.exit_code() == 0);
  auto last_line = [](const std::string& s) {
    const auto end = s.find_last_not_of('\n');
    const auto nl = s.rfind('\n', end);
    return s.substr(nl == std::string::npos ? 0 : nl + 1);
  };
  const json njs = json::parse(last_line(normal.out()));
  const json ejs = json::parse(last_line(early.out()));

  auto stop = ctl(d, {"stop", "--json"});
  INFO("stop: " << stop->out() << stop->err() << "\ndaemon: " << d.proc->err());
  REQUIRE(stop->exit_code() == 0);

  bool clean = false;
  TraceContent t = read_trace(trace, &clean);
  CHECK(clean);
  std::map<uint32_t, uint64_t> ticks_by_pid, all_by_pid;
  std::map<std::pair<uint16_t, uint16_t>, uint64_t> next_index;
  uint64_t gaps = 0;
  for (const auto& r : t.records) {
    const TraceSource* s = t.meta.find_source(r.source);
    REQUIRE(s);
    if (t.event_name(r) == "tick") ++ticks_by_pid[s->pid];
    ++all_by_pid[s->pid];
    auto& n = next_index[{r.source, r.rec.stream}];
    if (r.rec.index != n) ++gaps;
    n = r.rec.index + 1;
  }
  CHECK(gaps == 0);
  // The killed one's records up to its death are all there.
  CHECK(kjs["recorded"] == kThreads * kN);
  CHECK(ticks_by_pid[static_cast<uint32_t>(killed.pid())] == kThreads * kN);
  CHECK(ticks_by_pid[static_cast<uint32_t>(normal.pid())] == njs["recorded"].get<uint64_t>());
  CHECK(njs["recorded"] == kThreads * kN);
  // The one that exited with its threads still recording: at least N.
  CHECK(ticks_by_pid[static_cast<uint32_t>(midexit.pid())] >= static_cast<uint64_t>(kN));
  // The early one: everything it recorded once connected is there (its N
  // ticks per thread, and any "early" event that raced the connection).
  CHECK(all_by_pid[static_cast<uint32_t>(early.pid())] == ejs["recorded"].get<uint64_t>());
  // (All N per thread unless it connected before the recording started.)
  if (ejs["not_recording"] == 0)
    CHECK(ticks_by_pid[static_cast<uint32_t>(early.pid())] == kThreads * kN);
  CHECK(ejs["connections"].get<uint64_t>() >= 1);
}

// An application that ended before a recording started is not one of its
// sources: the daemon's collector kept every application it had ever seen
// and listed them all in each new trace (and its memory grew with them: the
// soak's peak RSS rose 1 MiB per recording of 117 applications).
TEST_CASE("daemon: an application that ended before a recording is not among its sources",
          "[daemon][process]") {
  TempDir dir("daemon-gone-app");
  const std::string trace = dir.file("gone.trace");
  const std::string app = kBin + "/perfq_test_app";
  Daemon d(dir);
  Child gone({app, d.socket, "record", "1", "100"});
  REQUIRE(gone.wait(std::chrono::seconds(static_cast<int>(30 * kSlow))));
  REQUIRE(gone.exit_code() == 0);
  const auto gone_pid = static_cast<uint32_t>(gone.pid());
  // Its streams leave the daemon's status once its ring is emptied.
  auto listed = [&] {
    const json j = json::parse(ctl(d, {"status", "--json"})->out(), nullptr, false);
    if (!j.is_object()) return true;
    for (const auto& s : j["app_streams"])
      if (s.value("pid", 0u) == gone_pid) return true;
    return false;
  };
  REQUIRE(wait_for([&] { return !listed(); }, std::chrono::seconds(static_cast<int>(10 * kSlow))));
  auto st = ctl(d, {"start", "-o", trace});
  INFO("start: " << st->out() << st->err());
  REQUIRE(st->exit_code() == 0);
  Child live({app, d.socket, "record", "1", "100"});
  REQUIRE(live.wait(std::chrono::seconds(static_cast<int>(30 * kSlow))));
  REQUIRE(ctl(d, {"stop"})->exit_code() == 0);
  bool clean = false;
  const TraceContent t = read_trace(trace, &clean);
  CHECK(clean);
  bool has_live = false, has_gone = false;
  for (const auto& s : t.meta.sources) {
    has_live |= s.pid == static_cast<uint32_t>(live.pid());
    has_gone |= s.pid == gone_pid;
  }
  CHECK(has_live);
  CHECK_FALSE(has_gone);
}

// The id of a user and group made for the test (root only).
struct TestUser {
  uid_t uid = 0;
  gid_t gid = 0;
  gid_t trusted_gid = 0;  // a group the daemon is told to trust
  std::string name = "perfq-test-user", gname = "perfq-test-grp";
  bool ok = false;
  TestUser() {
    if (geteuid() != 0) return;
    sh("getent group " + gname + " >/dev/null || groupadd " + gname + " 2>/dev/null");
    sh("id " + name + " >/dev/null 2>&1 || useradd -M -N -s /usr/sbin/nologin " + name +
       " 2>/dev/null");
    passwd* pw = getpwnam(name.c_str());
    struct group* gr = getgrnam(gname.c_str());
    if (!pw || !gr) return;
    uid = pw->pw_uid;
    gid = pw->pw_gid;
    trusted_gid = gr->gr_gid;
    ok = true;
  }
  std::vector<std::string> as_user(bool in_group) const {
    return {"/usr/bin/setpriv", "--reuid=" + std::to_string(uid), "--regid=" + std::to_string(gid),
            in_group ? "--groups=" + std::to_string(trusted_gid) : "--clear-groups"};
  }
};

TEST_CASE("daemon: the control socket obeys only root and its group, and survives bad requests",
          "[daemon][process][socket]") {
  TestUser user;
  if (!user.ok) {
    WARN("needs root with useradd/groupadd: skipped");
    return;
  }
  TempDir dir("daemon-socket");
  ::chmod(dir.file("").c_str(), 0777);  // the test user reaches the socket and writes the trace
  TempShm shm("daemon-socket");
  Child dev({kBin + "/perfq-devsim", "--region", shm.path(), "--create", "--workers", "1", "--rate",
             "2000", "--job-workers", "0"});
  REQUIRE(
      wait_for([&] { return access(shm.path().c_str(), F_OK) == 0; }, std::chrono::seconds(10)));
  Daemon d(dir, {"--group", user.gname, "--device", "shm:" + shm.path()});
  const std::string trace = dir.file("sock.trace");

  SECTION("an unprivileged user can read status but not start or stop") {
    auto start = ctl(d, {"start", "-o", dir.file("nobody.trace")}, user.as_user(false));
    CHECK(start->exit_code() == 1);
    CHECK(start->err().find("permission denied") != std::string::npos);
    CHECK(access(dir.file("nobody.trace").c_str(), F_OK) != 0);
    auto status = ctl(d, {"status"}, user.as_user(false));
    CHECK(status->exit_code() == 0);
    // root starts; the user still cannot stop it.
    REQUIRE(ctl(d, {"start", "-o", trace})->exit_code() == 0);
    auto stop = ctl(d, {"stop"}, user.as_user(false));
    CHECK(stop->exit_code() == 1);
    CHECK(stop->err().find("permission denied") != std::string::npos);
    CHECK(ctl(d, {"stop"})->exit_code() == 0);
  }
  SECTION("a member of the daemon's group may start and stop; the trace is theirs") {
    auto start = ctl(d, {"start", "-o", trace}, user.as_user(true));
    INFO(start->err());
    REQUIRE(start->exit_code() == 0);
    auto stop = ctl(d, {"stop"}, user.as_user(true));
    INFO(stop->err());
    REQUIRE(stop->exit_code() == 0);
    struct stat st {};
    REQUIRE(::stat(trace.c_str(), &st) == 0);
    CHECK(st.st_uid == user.uid);
  }
  SECTION("malformed and huge requests get errors; a recording goes on; two clients at once") {
    REQUIRE(ctl(d, {"start", "-o", trace})->exit_code() == 0);
    Conn a(d.socket), b(d.socket);
    REQUIRE(a.ok());
    REQUIRE(b.ok());
    json r = a.request(json{{"cmd", "status"}});
    REQUIRE(r.is_object());
    const uint64_t before = r["recording"]["devices"][0]["records"].get<uint64_t>();
    REQUIRE(a.send_raw("this is not json\n"));
    r = json::parse(a.line(), nullptr, false);
    CHECK(r["ok"] == false);
    CHECK(r["error"].get<std::string>().find("malformed") != std::string::npos);
    REQUIRE(a.send_raw("[1,2,3]\n{\"nocmd\":1}\n{\"cmd\":\"frobnicate\"}\n"));
    for (int i = 0; i < 3; ++i) {
      r = json::parse(a.line(), nullptr, false);
      CHECK(r["ok"] == false);
    }
    // b is served while a is connected.
    r = b.request(json{{"cmd", "status"}});
    CHECK(r["ok"] == true);
    // A request far over the limit: an error, then the connection closes.
    Conn huge(d.socket);
    huge.send_raw(std::string(1 << 20, 'x'));
    const std::string l = huge.line();
    CHECK(l.find("longer than") != std::string::npos);
    // The recording is untouched and still moving.
    REQUIRE(wait_for(
        [&] {
          json s = b.request(json{{"cmd", "status"}});
          return s["recording"].is_object() &&
                 s["recording"]["devices"][0]["records"].get<uint64_t>() > before;
        },
        std::chrono::seconds(10)));
    auto stop = ctl(d, {"stop", "--json"});
    REQUIRE(stop->exit_code() == 0);
    CHECK(json::parse(stop->out())["complete"] == true);
  }
}

// ---- the control socket under abuse -------------------------------------------------------

// A hostile peer: a forked child that, as `uid`, keeps kConns connections to
// the daemon's socket open (reopening those the daemon closes, up to
// kReopen a round, a round every 100 ms).  A third of them send a request
// one byte a round and never its newline, a third send complete requests
// and never read the replies, a third stay silent.  Its counts are in
// shared memory; it runs until the destructor kills it.
class Hostile {
 public:
  static constexpr int kConns = 1000;
  static constexpr int kReopen = 250;
  struct Counts {
    std::atomic<uint64_t> opened{0}, closed_by_daemon{0}, open{0}, rounds{0};
    std::atomic<int> setuid_failed{0};
  };

  Hostile(const std::string& socket, uid_t uid, gid_t gid) {
    void* m =
        mmap(nullptr, sizeof(Counts), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    REQUIRE(m != MAP_FAILED);
    counts_ = new (m) Counts;
    sockaddr_un addr{};
    addr.sun_family = AF_UNIX;
    std::strncpy(addr.sun_path, socket.c_str(), sizeof(addr.sun_path) - 1);
    pid_ = ::fork();
    REQUIRE(pid_ >= 0);
    if (pid_ == 0) run(addr, uid, gid, *counts_);  // never returns
  }
  ~Hostile() {
    if (pid_ > 0) {
      ::kill(pid_, SIGKILL);
      ::waitpid(pid_, nullptr, 0);
    }
    munmap(counts_, sizeof(Counts));
  }
  const Counts& counts() const { return *counts_; }

 private:
  // The child: system calls only (no allocation after the fork).
  [[noreturn]] static void run(const sockaddr_un& addr, uid_t uid, gid_t gid, Counts& c) {
    if (::setgroups(0, nullptr) != 0 || ::setgid(gid) != 0 || ::setuid(uid) != 0) {
      c.setuid_failed = 1;
      _exit(1);
    }
    static int fds[kConns];
    static pollfd pfds[kConns];
    for (int& fd : fds) fd = -1;
    static const char kRequest[] = "{\"cmd\":\"status\"}\n";
    while (true) {
      int reopened = 0;
      for (int& fd : fds) {
        if (fd >= 0 || reopened >= kReopen) continue;
        fd = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
        if (::connect(fd, reinterpret_cast<const sockaddr*>(&addr), sizeof(addr)) != 0) {
          ::close(fd);  // the backlog is full: next round
          fd = -1;
          continue;
        }
        ++reopened;
        ++c.opened;
      }
      for (int i = 0; i < kConns; ++i) pfds[i] = {fds[i], POLLRDHUP, 0};
      ::poll(pfds, kConns, 0);
      uint64_t open = 0;
      for (int i = 0; i < kConns; ++i) {
        if (fds[i] < 0) continue;
        if (pfds[i].revents & (POLLRDHUP | POLLHUP | POLLERR)) {
          ::close(fds[i]);
          fds[i] = -1;
          ++c.closed_by_daemon;
          continue;
        }
        ++open;
        if (i % 3 == 0) ::send(fds[i], "{", 1, MSG_DONTWAIT | MSG_NOSIGNAL);
        if (i % 3 == 1) ::send(fds[i], kRequest, sizeof(kRequest) - 1, MSG_DONTWAIT | MSG_NOSIGNAL);
      }
      c.open = open;
      ++c.rounds;
      ::usleep(100'000);
    }
  }

  pid_t pid_ = -1;
  Counts* counts_ = nullptr;
};

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

std::string figures(const std::vector<double>& v) {
  std::ostringstream s;
  for (double x : v) s << (s.tellp() ? " " : "") << std::fixed << std::setprecision(1) << x;
  return s.str();
}

TEST_CASE("daemon: 1000 hostile connections keep neither root's stop nor another user out",
          "[daemon][process][socket][abuse]") {
  if (geteuid() != 0) {
    WARN("needs root to act as a second, unprivileged user (uid 65534): skipped");
    return;
  }
  TempDir dir("daemon-abuse");
  ::chmod(dir.file("").c_str(), 0755);  // uid 65534 reaches the socket
  Daemon d(dir);
  Hostile hostile(d.socket, 65534, 65534);
  // Every hostile connection has been opened, and the churn goes on.
  REQUIRE(hostile.counts().setuid_failed == 0);
  REQUIRE(wait_for([&] { return hostile.counts().opened >= Hostile::kConns; },
                   std::chrono::seconds(30)));
  const uint64_t rounds = hostile.counts().rounds;
  REQUIRE(
      wait_for([&] { return hostile.counts().rounds >= rounds + 3; }, std::chrono::seconds(10)));

  // Root starts and stops a recording, again and again, through
  // perfqctl (the whole command) and a raw connection (the request alone).
  using Clock = std::chrono::steady_clock;
  auto ms_since = [](Clock::time_point t0) {
    return std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
  };
  std::vector<double> ctl_ms, raw_ms;
  for (int i = 0; i < 7; ++i) {
    const std::string trace = dir.file("abuse" + std::to_string(i));
    auto start = ctl(d, {"start", "-o", trace + "a.trace"});
    INFO("start: " << start->err());
    REQUIRE(start->exit_code() == 0);
    auto t0 = Clock::now();
    auto stop = ctl(d, {"stop"});
    ctl_ms.push_back(ms_since(t0));
    INFO("stop: " << stop->err());
    REQUIRE(stop->exit_code() == 0);

    REQUIRE(ctl(d, {"start", "-o", trace + "b.trace"})->exit_code() == 0);
    t0 = Clock::now();
    Conn c(d.socket);
    REQUIRE(c.ok());
    const json r = c.request(json{{"cmd", "stop"}});
    raw_ms.push_back(ms_since(t0));
    INFO("raw stop: " << r.dump());
    REQUIRE(r.value("ok", false));
  }
  // The daemon held the hostile uid to its share and refused the rest.
  Conn c(d.socket);
  const json s = c.request(json{{"cmd", "status"}});
  REQUIRE(s.is_object());
  const json control = s["daemon"]["control"];
  INFO(control.dump());
  CHECK(control["unprivileged"].get<int>() <= 16);
  CHECK(control["most_of_one_uid"].get<int>() <= 16);
  CHECK(control["refused"].get<uint64_t>() > 0);
  WARN("with " << Hostile::kConns << " hostile connections (uid 65534: " << hostile.counts().opened
               << " opened, " << hostile.counts().closed_by_daemon << " closed by the daemon, "
               << hostile.counts().open << " open now; daemon: " << control.dump()
               << "): root's `perfqctl stop` took " << figures(ctl_ms) << " ms (median "
               << median(ctl_ms) << "), a raw stop request " << figures(raw_ms) << " ms (median "
               << median(raw_ms) << ")");
  // The figure users meet is the plain build's.  A sanitizer tree's
  // perfqctl is itself instrumented: its start-up alone takes tens of ms
  // (ASan: `perfqctl --version` alone takes 80-150 ms here), so there the
  // daemon's own answer (the raw request) carries the 100 ms bound.
  CHECK(median(ctl_ms) < (kSanitized ? 500 : 100));
  CHECK(median(raw_ms) < 100);

  // Another unprivileged user is not locked out by the first one.
  TestUser user;
  if (user.ok) {
    auto status = ctl(d, {"status"}, user.as_user(false));
    INFO(status->err());
    CHECK(status->exit_code() == 0);
  }
}

TEST_CASE("daemon: a request must be whole within 2 s and a client must read its replies",
          "[daemon][process][socket][abuse]") {
  TempDir dir("daemon-deadline");
  Daemon d(dir);
  using Clock = std::chrono::steady_clock;

  SECTION("a request sent a byte at a time without its newline is cut off") {
    Conn c(d.socket);
    REQUIRE(c.ok());
    const auto t0 = Clock::now();
    REQUIRE(c.send_raw("{\"cmd\":"));
    // Still trickling: bytes every 300 ms do not extend the deadline.
    std::atomic<bool> done{false};
    std::thread trickle([&] {
      for (int i = 0; i < 30 && !done; ++i) {
        std::this_thread::sleep_for(std::chrono::milliseconds(300));
        c.send_raw(" ");
      }
    });
    const std::string l = c.line();
    const double s = std::chrono::duration<double>(Clock::now() - t0).count();
    const std::string eof = c.line();
    done = true;
    trickle.join();
    INFO(l << " after " << s << " s");
    CHECK(l.find("not finished") != std::string::npos);
    CHECK(s >= 1.9);
    CHECK(s < 6);
    CHECK(eof.empty());  // and the connection is closed
  }
  SECTION("a client that sends requests and never reads the replies is closed") {
    Conn c(d.socket);
    REQUIRE(c.ok());
    std::string many;
    for (int i = 0; i < 5000; ++i) many += "{\"cmd\":\"status\"}\n";
    REQUIRE(c.send_raw(many));
    CHECK(wait_for(
        [&] { return d.proc->err().find("does not read its replies") != std::string::npos; },
        std::chrono::seconds(15)));
    // What it does read ends well before 5000 replies.
    int replies = 0;
    while (!c.line().empty()) ++replies;
    CHECK(replies < 5000);
  }
  SECTION("an empty line gets an error, not silence") {
    Conn c(d.socket);
    REQUIRE(c.ok());
    REQUIRE(c.send_raw("\n"));
    const json r = json::parse(c.line(), nullptr, false);
    CHECK(r.value("ok", true) == false);
    CHECK(r.value("error", "").find("empty request") != std::string::npos);
  }
}

TEST_CASE("daemon: a request field of the wrong type is named with the type it must have",
          "[daemon][process][socket]") {
  TempDir dir("daemon-types");
  Daemon d(dir);
  Conn c(d.socket);
  REQUIRE(c.ok());
  const std::string out = dir.file("t.trace");
  auto error_of = [&](const json& req) {
    const json r = c.request(req);
    if (!r.is_object() || r.value("ok", true)) return "(not an error: " + r.dump() + ")";
    return r.value("error", std::string("(no error text)"));
  };
  struct Case {
    json req;
    std::vector<std::string> says;
  };
  const std::vector<Case> cases = {
      {{{"cmd", "start"}, {"output", out}, {"duration_s", "10"}}, {"duration_s", "number"}},
      {{{"cmd", "start"}, {"output", out}, {"devices", json::array({1, 2})}},
       {"devices", "string"}},
      {{{"cmd", "start"}, {"output", out}, {"devices", "shm:/x"}}, {"devices", "array"}},
      {{{"cmd", "start"}, {"output", out}, {"sync_interval_ms", -5}},
       {"sync_interval_ms", "unsigned integer"}},
      {{{"cmd", "start"}, {"output", out}, {"sync_mode", 1}}, {"sync_mode", "string"}},
      {{{"cmd", "devices"}, {"all", "yes"}}, {"all", "boolean"}},
      // An embedded NUL would cut the path short: refused, not truncated.
      {{{"cmd", "start"}, {"output", out + std::string(1, '\0') + "x"}}, {"output", "NUL"}},
  };
  for (const auto& k : cases) {
    const std::string e = error_of(k.req);
    INFO(k.req.dump() << " -> " << e);
    for (const auto& w : k.says) CHECK(e.find(w) != std::string::npos);
    CHECK(e.find("json.exception") == std::string::npos);
  }
  CHECK(access(out.c_str(), F_OK) != 0);
  const json s = c.request(json{{"cmd", "status"}});
  CHECK(s["recording"].is_null());
}

// A tmpfs of `size` mounted on a folder of `dir` (root only), unmounted at
// the end; ok() is false where mounting is not permitted.
class SmallDisk {
 public:
  SmallDisk(const TempDir& dir, const std::string& size) : path_(dir.file("small")) {
    std::filesystem::create_directory(path_);
    ok_ = geteuid() == 0 &&
          sh("mount -t tmpfs -o size=" + size + " perfq-test-full " + path_ + " 2>/dev/null") == 0;
  }
  ~SmallDisk() {
    if (ok_) sh("umount " + path_);
  }
  bool ok() const { return ok_; }
  std::string file(const std::string& name) const { return path_ + "/" + name; }
  // Fills what is left with a file of zeros.
  void fill(const std::string& name) const {
    sh("dd if=/dev/zero of=" + file(name) + " bs=4k 2>/dev/null");
  }

 private:
  std::string path_;
  bool ok_ = false;
};

TEST_CASE("daemon: a full disk: status says why and a refused start leaves no file behind",
          "[daemon][process][disk]") {
  TempDir dir("daemon-full");
  SmallDisk disk(dir, "1m");
  if (!disk.ok()) {
    WARN("needs root and permission to mount a tmpfs (mount -t tmpfs): skipped");
    return;
  }
  TempShm shm("daemon-full");
  Child dev({kBin + "/perfq-devsim", "--region", shm.path(), "--create", "--workers", "2", "--rate",
             "50000", "--job-workers", "0"});
  REQUIRE(
      wait_for([&] { return access(shm.path().c_str(), F_OK) == 0; }, std::chrono::seconds(10)));
  Daemon d(dir, {"--device", "shm:" + shm.path(), "--compress", "false"});

  SECTION("the disk fills during a recording: the text status shows the writer's error") {
    sh("dd if=/dev/zero of=" + disk.file("filler") + " bs=1k count=896 2>/dev/null");
    REQUIRE(ctl(d, {"start", "-o", disk.file("full.trace")})->exit_code() == 0);
    std::string text;
    CHECK(wait_for(
        [&] {
          text = ctl(d, {"status"})->out();
          return text.find("No space left on device") != std::string::npos;
        },
        std::chrono::seconds(30)));
    INFO(text);
    CHECK(text.find("error:") != std::string::npos);
  }
  SECTION("a start on a full disk is refused and leaves no empty file") {
    disk.fill("filler");
    auto start = ctl(d, {"start", "-o", disk.file("none.trace")});
    INFO(start->err());
    CHECK(start->exit_code() == 1);
    CHECK(start->err().find("No space left on device") != std::string::npos);
    CHECK(access(disk.file("none.trace").c_str(), F_OK) != 0);
    // A file that was there before (empty: truncating it frees no room) is
    // the user's: not removed.
    { std::ofstream theirs(disk.file("theirs.trace")); }
    CHECK(ctl(d, {"start", "-o", disk.file("theirs.trace")})->exit_code() == 1);
    CHECK(access(disk.file("theirs.trace").c_str(), F_OK) == 0);
  }
}

TEST_CASE("daemon: SIGTERM during a recording leaves a complete, readable trace",
          "[daemon][process]") {
  TempDir dir("daemon-term");
  TempShm shm("daemon-term");
  const std::string trace = dir.file("term.trace");
  Child dev({kBin + "/perfq-devsim", "--region", shm.path(), "--create", "--workers", "2", "--rate",
             "20000"});
  REQUIRE(
      wait_for([&] { return access(shm.path().c_str(), F_OK) == 0; }, std::chrono::seconds(10)));
  Daemon d(dir);
  REQUIRE(ctl(d, {"start", "-o", trace, "--device", "shm:" + shm.path()})->exit_code() == 0);
  uint64_t over_capacity = 0;  // a ring never holds more than it can
  REQUIRE(wait_for(
      [&] {
        auto s = ctl(d, {"status", "--json"});
        const json j = json::parse(s->out(), nullptr, false);
        if (!j.is_object() || !j["recording"].is_object()) return false;
        for (const auto& dev : j["recording"]["devices"])
          if (dev["ring_fill"].get<uint64_t>() > dev["ring_capacity"].get<uint64_t>())
            ++over_capacity;
        return j["recording"]["records"].get<uint64_t>() > 1000;
      },
      std::chrono::seconds(static_cast<int>(30 * kSlow))));
  CHECK(over_capacity == 0);
  d.proc->signal(SIGTERM);
  REQUIRE(d.proc->wait(std::chrono::seconds(static_cast<int>(30 * kSlow))));
  INFO("daemon: " << d.proc->err());
  CHECK(d.proc->exit_code() == 0);
  bool clean = false;
  TraceContent t = read_trace(trace, &clean);
  CHECK(clean);
  CHECK(t.records.size() > 1000);
  // The socket is gone with the daemon.
  CHECK(access(d.socket.c_str(), F_OK) != 0);
}

// What a kill -9 loses (docs/trace-format.md, "What a crash loses"): what
// reached the writer since its last take (every 50 ms) and what waited in
// the drain for the sync round after it (every 100 ms here), whatever the
// merge's watermark: the file's newest record is that close to the kill,
// every stream's records in the file are complete up to their newest, and
// the file reads in time order.
TEST_CASE("daemon: kill -9 loses only the writer's last take and what waited for its sync round",
          "[daemon][process][crash]") {
  TempDir dir("daemon-kill");
  TempShm shm("daemon-kill");
  // 2 000 records/s: a whole chunk (16384 records) would take 8 s to fill.
  constexpr double kRate = 2000;  // records/s: devsim's 2 workers at 1 000 each
  Child dev({kBin + "/perfq-devsim", "--region", shm.path(), "--create", "--workers", "2", "--rate",
             "1000", "--job-workers", "0"});
  REQUIRE(
      wait_for([&] { return access(shm.path().c_str(), F_OK) == 0; }, std::chrono::seconds(10)));
  // The merge's watermark held back for 2 s (--device-latency-ms): before
  // version 2 files, a kill lost that much; now it must not matter.
  Daemon d(dir, {"--device", "shm:" + shm.path(), "--sync-interval-ms", "100",
                 "--device-latency-ms", "2000", "--max-delay-ms", "5000"});
  const std::string trace = dir.file("killed.trace");
  REQUIRE(ctl(d, {"start", "-o", trace})->exit_code() == 0);
  json rec;
  REQUIRE(wait_for(
      [&] {
        const json j = json::parse(ctl(d, {"status", "--json"})->out(), nullptr, false);
        if (!j.is_object() || !j["recording"].is_object()) return false;
        rec = j["recording"];
        return rec["devices"][0]["records"].get<uint64_t>() >= 4000;
      },
      std::chrono::seconds(static_cast<int>(30 * kSlow))));
  const uint64_t released = rec["merge"]["released"].get<uint64_t>();
  std::this_thread::sleep_for(std::chrono::milliseconds(static_cast<int>(250 * kSlow)));
  // What the drain holds for a sync round after it, as close to the kill
  // as the status allows: a round the model rejects (a loose one, on a busy
  // machine) converts nothing, and what waits is what a kill loses.
  const int64_t asked_ns = static_cast<int64_t>(monotonic_ns());
  const json last = json::parse(ctl(d, {"status", "--json"})->out(), nullptr, false);
  REQUIRE(last.is_object());
  REQUIRE(last["recording"].is_object());
  const json& last_dev = last["recording"]["devices"][0];
  const uint64_t waiting = last_dev["waiting_for_clock"].get<uint64_t>();
  const int64_t kill_ns = static_cast<int64_t>(monotonic_ns());
  d.proc->signal(SIGKILL);
  // The stretch of device time the waiting records cover, and what came
  // while the status was asked.
  const double waited_ms =
      static_cast<double>(waiting) / kRate * 1e3 + static_cast<double>(kill_ns - asked_ns) / 1e6;
  REQUIRE(d.proc->wait(std::chrono::seconds(10)));
  bool clean = true;
  const TraceContent t = read_trace(trace, &clean);
  CHECK_FALSE(clean);  // no END chunk: the daemon never closed it
  REQUIRE(!t.records.empty());
  CHECK(t.records.size() >= released);  // what the writer took 250 ms before
  int64_t last_ns = INT64_MIN;
  uint64_t disorder = 0;
  std::map<uint16_t, std::pair<uint64_t, uint64_t>> span;  // stream: first, last index
  std::map<uint16_t, uint64_t> count;
  for (size_t i = 0; i < t.records.size(); ++i) {
    const auto& r = t.records[i];
    last_ns = std::max(last_ns, r.time_ns);
    if (i > 0 && r.time_ns < t.records[i - 1].time_ns) ++disorder;
    auto [it, fresh] = span.try_emplace(r.rec.stream, r.rec.index, r.rec.index);
    it->second.first = std::min(it->second.first, r.rec.index);
    it->second.second = std::max(it->second.second, r.rec.index);
    ++count[r.rec.stream];
  }
  const double lost_ms = static_cast<double>(kill_ns - last_ns) / 1e6;
  WARN("kill -9 at 2 000 records/s: "
       << t.records.size() << " records in the file, " << released
       << " taken by the writer 250 ms before; "
       << "the newest record in the file is " << lost_ms << " ms older than the kill; " << waiting
       << " records (" << waited_ms << " ms) waited for a sync round then (the merge: "
       << last["recording"]["merge"].dump() << ", the sync: " << last_dev["sync"].dump() << ")");
  // What waited for its round, then the writer's take (50 ms) and the
  // drain's poll; the rest is scheduling on a loaded machine.
  CHECK(lost_ms < waited_ms + 150 * kSlow);
  // Against the device's own count: what the killed daemon took from its
  // ring (the head it published), less what came from before the start,
  // is in the file but for that last stretch.
  {
    auto region = Region::open(shm.path());
    REQUIRE(region.is_ok());
    const uint64_t taken = load_acquire(&region->host_ctrl()->head);
    const uint64_t before = rec["devices"][0]["before_start"].get<uint64_t>();
    REQUIRE(taken >= before + t.records.size());
    const uint64_t lost = taken - before - t.records.size();
    WARN("the device's ring: " << taken << " records taken by the killed daemon, " << before
                               << " from before the start, " << lost << " not in the file");
    CHECK(static_cast<double>(lost) < kRate * (waited_ms + 150 * kSlow) / 1e3);
  }
  CHECK(disorder == 0);
  CHECK(span.size() == 2);
  for (const auto& [stream, s] : span) {
    INFO("stream " << stream);
    CHECK(count[stream] == s.second - s.first + 1);  // nothing missing up to the newest
  }

  // The next daemon takes over: the dead one's socket file is still there
  // (nothing removed it) and so is its claim on the region (a flock the
  // kernel released with the process).
  REQUIRE(access(d.socket.c_str(), F_OK) == 0);
  Daemon next(dir, {"--device", "shm:" + shm.path()});
  REQUIRE(wait_for([&] { return ctl(next, {"status"})->exit_code() == 0; },
                   std::chrono::seconds(static_cast<int>(10 * kSlow))));
  const std::string again = dir.file("after.trace");
  auto st = ctl(next, {"start", "-o", again});
  INFO("start after kill -9: " << st->out() << st->err() << "\ndaemon: " << next.proc->err());
  REQUIRE(st->exit_code() == 0);
  REQUIRE(wait_for(
      [&] {
        const json j = json::parse(ctl(next, {"status", "--json"})->out(), nullptr, false);
        return j.is_object() && j["recording"].is_object() &&
               j["recording"]["devices"][0]["records"].get<uint64_t>() >= 2000;
      },
      std::chrono::seconds(static_cast<int>(30 * kSlow))));
  REQUIRE(ctl(next, {"stop"})->exit_code() == 0);
  bool clean_after = false;
  const TraceContent t2 = read_trace(again, &clean_after);
  CHECK(clean_after);
  CHECK(t2.records.size() >= 2000);
  // Each stream's records follow on from the killed recording's: the
  // device lost nothing while no daemon read it (its ring held 8 s).
  std::map<uint16_t, uint64_t> first_after, last_before;
  for (const auto& r : t.records)
    last_before[r.rec.stream] = std::max(last_before[r.rec.stream], r.rec.index);
  for (const auto& r : t2.records)
    if (!first_after.count(r.rec.stream) || r.rec.index < first_after[r.rec.stream])
      first_after[r.rec.stream] = r.rec.index;
  CHECK(first_after.size() == 2);
  for (const auto& [stream, first] : first_after) {
    INFO("stream " << stream);
    CHECK(first > last_before[stream]);
  }
  dev.signal(SIGTERM);
  REQUIRE(dev.wait(std::chrono::seconds(10)));
  const json devjs = json::parse(dev.out(), nullptr, false);
  INFO("devsim: " << dev.out());
  REQUIRE(devjs.is_object());
  CHECK(devjs["dropped"].get<uint64_t>() == 0);
}

// A device that goes away mid-recording: one whose region is cut short
// under the daemon's mapping (SIGBUS on the next access, for a shm region as
// for a revoked /dev/perfqN one), one whose device is killed and whose region
// is unlinked (its collector's heartbeat stands still).  The recording goes
// on for the third, whose records are all in the trace, as devsim counted
// them; the trace says when and why the other two ended.
TEST_CASE("daemon: a device that disappears mid-recording: the others go on, the trace says when",
          "[daemon][process][crash]") {
  TempDir dir("daemon-vanish");
  TempShm keep("vanish-keep"), cut("vanish-cut"), killed("vanish-killed");
  auto devsim = [](const TempShm& shm, std::vector<std::string> extra) {
    std::vector<std::string> argv = {kBin + "/perfq-devsim",
                                     "--region",
                                     shm.path(),
                                     "--create",
                                     "--workers",
                                     "2",
                                     "--rate",
                                     "20000",
                                     "--job-workers",
                                     "0"};
    argv.insert(argv.end(), extra.begin(), extra.end());
    return std::make_unique<Child>(argv);
  };
  // The one that stays: 3 s of records once the host is there, then its
  // final count.
  auto dk = devsim(keep, {"--wait-host", "--duration", std::to_string(3 * kSlow)});
  auto dc = devsim(cut, {});
  auto dx = devsim(killed, {});
  for (const TempShm* s : {&keep, &cut, &killed})
    REQUIRE(
        wait_for([&] { return access(s->path().c_str(), F_OK) == 0; }, std::chrono::seconds(10)));
  constexpr int64_t kDeviceTimeoutMs = 500;
  Daemon d(dir, {"--device-timeout-ms", std::to_string(kDeviceTimeoutMs)});
  const std::string trace = dir.file("vanish.trace");
  auto st = ctl(d, {"start", "-o", trace, "--device", "shm:" + keep.path(), "--device",
                    "shm:" + cut.path(), "--device", "shm:" + killed.path()});
  INFO("start: " << st->out() << st->err());
  REQUIRE(st->exit_code() == 0);
  auto device_json = [&](const std::string& path) {
    const json j = json::parse(ctl(d, {"status", "--json"})->out(), nullptr, false);
    if (!j.is_object() || !j["recording"].is_object()) return json();
    for (const auto& dev : j["recording"]["devices"])
      if (dev["device"] == "shm:" + path) return dev;
    return json();
  };
  // Both with records and a clock model (without one, a device's records
  // cannot be converted, and the trace says that instead).
  auto going = [&](const std::string& path) {
    const json dev = device_json(path);
    return dev.is_object() && dev["records"].get<uint64_t>() >= 2000 &&
           dev["sync"]["synchronized"] == true;
  };
  REQUIRE(wait_for([&] { return going(cut.path()) && going(killed.path()); },
                   std::chrono::seconds(static_cast<int>(20 * kSlow))));
  // Cut short: the region file truncated under the mapping.
  const int64_t cut_ns = static_cast<int64_t>(monotonic_ns());
  REQUIRE(::truncate(cut.path().c_str(), 0) == 0);
  // Killed: no last words, and its region unlinked.
  const int64_t kill_ns = static_cast<int64_t>(monotonic_ns());
  dx->signal(SIGKILL);
  REQUIRE(dx->wait(std::chrono::seconds(10)));
  ::unlink(killed.path().c_str());
  json cut_dev;
  const bool cut_gone = wait_for(
      [&] {
        cut_dev = device_json(cut.path());
        return cut_dev["state"] == "gone";
      },
      std::chrono::seconds(static_cast<int>(10 * kSlow)));
  INFO("the cut device in status: " << cut_dev.dump());
  REQUIRE(cut_gone);
  REQUIRE(wait_for([&] { return device_json(killed.path())["state"] == "silent"; },
                   std::chrono::seconds(static_cast<int>(10 * kSlow))));
  // (The daemon calls it silent --device-timeout-ms after the heartbeat's
  // last move it saw, which the trace gives: seen before now less that.)
  const int64_t silent_seen_ns = static_cast<int64_t>(monotonic_ns());
  CHECK(device_json(killed.path())["error"].get<std::string>().find("heartbeat") !=
        std::string::npos);
  // The daemon lives on, and so does the recording of the third.
  REQUIRE(dk->wait(std::chrono::seconds(static_cast<int>(60 * kSlow))));
  REQUIRE(dk->exit_code() == 0);
  const json keepjs = json::parse(dk->out());
  REQUIRE(wait_for([&] { return device_json(keep.path())["state"] == "finished"; },
                   std::chrono::seconds(static_cast<int>(30 * kSlow))));
  REQUIRE(d.proc->running());
  auto stop = ctl(d, {"stop", "--json"});
  INFO("stop: " << stop->out() << stop->err() << "\ndaemon: " << d.proc->err());
  REQUIRE(stop->exit_code() == 0);
  bool clean = false;
  const TraceContent t = read_trace(trace, &clean);
  CHECK(clean);
  std::map<std::string, const TraceSource*> by_path;
  for (const auto& s : t.meta.sources) {
    if (s.kind != TraceSourceKind::kDevice) continue;
    for (const TempShm* shm : {&keep, &cut, &killed})
      if (s.ended && s.ended->reason.find(shm->path()) != std::string::npos)
        by_path[shm->path()] = &s;
  }
  // When and why, in the trace itself.
  REQUIRE(by_path.count(cut.path()) == 1);
  REQUIRE(by_path.count(killed.path()) == 1);
  const TraceSourceEnd& gone = *by_path[cut.path()]->ended;
  CHECK(gone.state == "gone");
  CHECK(gone.time_ns >= cut_ns);
  CHECK(gone.time_ns < cut_ns + static_cast<int64_t>(5e9 * kSlow));
  const TraceSourceEnd& silent = *by_path[killed.path()]->ended;
  CHECK(silent.state == "silent");
  // When the heartbeat was last seen moving (the drain reads it on every
  // poll): not after the daemon called it silent a timeout later, and
  // about the kill.  A drain starved of CPU sees the last move late (three
  // such tests at once under TSan on two CPUs: up to 3.7 s after the kill),
  // so "about" is within a second only where nothing slows the drain down.
  CHECK(silent.time_ns + kDeviceTimeoutMs * 1'000'000 <= silent_seen_ns);
  CHECK(silent.time_ns > kill_ns - static_cast<int64_t>(1e9 * kSlow));
  if (kSlow == 1) CHECK(silent.time_ns <= kill_ns + 1'000'000'000);
  // Every record the kept device emitted is in the trace, and none of the
  // others' after their end.
  std::map<uint16_t, uint64_t> records_by_source;
  std::map<uint16_t, int64_t> newest;
  for (const auto& r : t.records) {
    // (A device's LOST records count what it dropped, which devsim's
    // "dropped" holds: not records it emitted.)
    if (r.rec.event == PERFQ_EVENT_LOST) continue;
    ++records_by_source[r.source];
    newest[r.source] = std::max(newest[r.source], r.time_ns);
  }
  uint16_t keep_source = 0;
  for (const auto& s : t.meta.sources)
    if (s.kind == TraceSourceKind::kDevice && !s.ended) keep_source = s.id;
  REQUIRE(keep_source != 0);
  INFO("kept devsim: " << keepjs.dump());
  // (Records stamped before the start are not the recording's: counted apart.)
  uint64_t before_start = 0;
  const json stopped = json::parse(stop->out());  // (a range-for's temporary dies first)
  for (const auto& dev : stopped["devices"])
    if (dev["device"] == "shm:" + keep.path()) before_start = dev["before_start"].get<uint64_t>();
  CHECK(records_by_source[keep_source] + keepjs["dropped"].get<uint64_t>() + before_start ==
        keepjs["emitted"].get<uint64_t>());
  CHECK(records_by_source[by_path[cut.path()]->id] > 0);
  CHECK(records_by_source[by_path[killed.path()]->id] > 0);
  // Nothing of the killed device is newer than its heartbeat's last move
  // (its collector publishes, then beats), within the clocks' claims.
  CHECK(newest[by_path[killed.path()]->id] <= silent.time_ns + 1'000'000);
  CHECK(newest[by_path[killed.path()]->id] <= kill_ns + 1'000'000);
  // And the report says so, for people and in JSON.
  Child rep({kBin + "/perfqctl", "report", trace});
  REQUIRE(rep.wait(std::chrono::seconds(static_cast<int>(60 * kSlow))));
  CHECK(rep.exit_code() == 0);
  CHECK(rep.out().find("(gone): shm:" + cut.path()) != std::string::npos);
  CHECK(rep.out().find("(silent): shm:" + killed.path()) != std::string::npos);
  Child repj({kBin + "/perfqctl", "report", "--json", trace});
  REQUIRE(repj.wait(std::chrono::seconds(static_cast<int>(60 * kSlow))));
  const json rj = json::parse(repj.out());
  int ended = 0;
  for (const auto& s : rj["sources"])
    if (s.contains("ended")) ++ended;
  CHECK(ended == 2);
}

TEST_CASE("daemon: clear errors for a second start, a stop with nothing running, a bad device",
          "[daemon][process]") {
  TempDir dir("daemon-errors");
  Daemon d(dir);
  auto stop = ctl(d, {"stop"});
  CHECK(stop->exit_code() == 1);
  CHECK(stop->err().find("no recording") != std::string::npos);
  auto bad = ctl(d, {"start", "-o", dir.file("x.trace"), "--device", "shm:/dev/shm/perfq-no-such"});
  CHECK(bad->exit_code() == 1);
  CHECK(bad->err().find("perfq-no-such") != std::string::npos);
  REQUIRE(ctl(d, {"start", "-o", dir.file("a.trace"), "--device", "shm:/dev/shm/perfq-no-such2"})
              ->exit_code() == 1);
  // Host-only recording (no devices): fine; a second start is refused.
  REQUIRE(ctl(d, {"start", "-o", dir.file("a.trace")})->exit_code() == 0);
  auto again = ctl(d, {"start", "-o", dir.file("b.trace")});
  CHECK(again->exit_code() == 1);
  CHECK(again->err().find("already running") != std::string::npos);
  CHECK(ctl(d, {"stop"})->exit_code() == 0);
  auto nodaemon = ctl(d, {"status"});  // still there
  CHECK(nodaemon->exit_code() == 0);
  Child none({kBin + "/perfqctl", "--socket", dir.file("nobody-here.sock"), "status"});
  REQUIRE(none.wait(std::chrono::seconds(10)));
  CHECK(none.exit_code() == 1);
  CHECK(none.err().find("is it running") != std::string::npos);
}

std::string file_text(const std::string& path) {
  std::ifstream f(path);
  return std::string((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
}

// The trace files named perfq-YYYYMMDD-HHMMSS.trace in dir.
std::vector<std::string> timestamped_traces(const std::string& dir) {
  std::vector<std::string> found;
  for (const auto& e : std::filesystem::directory_iterator(dir))
    if (std::regex_match(e.path().filename().string(), std::regex(R"(perfq-\d{8}-\d{6}\.trace)")))
      found.push_back(e.path().string());
  return found;
}

// perfqctl start and record never replace a file unless told to (the daemon
// decides as it creates the file), and without -o they name the trace by
// the time, in the current directory.
TEST_CASE(
    "daemon: start and record keep an existing trace unless --force and name a new one by the time",
    "[daemon][process]") {
  TempDir dir("daemon-force");
  Daemon d(dir);
  const std::string kept = dir.file("kept.trace");
  std::ofstream(kept) << "an earlier trace";

  auto refused = ctl(d, {"start", "-o", kept});
  INFO("start over an existing file: " << refused->out() << refused->err());
  CHECK(refused->exit_code() == 1);
  CHECK(refused->err().find(kept + " exists") != std::string::npos);
  CHECK(refused->err().find("--force overwrites it") != std::string::npos);
  CHECK(file_text(kept) == "an earlier trace");
  // A relative -o names the same file, from perfqctl's directory.
  auto relative = ctl(d, {"start", "-o", "kept.trace"}, {"/usr/bin/env", "-C", dir.file("")});
  CHECK(relative->exit_code() == 1);
  CHECK(file_text(kept) == "an earlier trace");
  // The request's force must be a boolean.
  Conn c(d.socket);
  REQUIRE(c.ok());
  const json bad = c.request({{"cmd", "start"}, {"output", kept}, {"force", "yes"}});
  CHECK(bad["ok"] == false);
  CHECK(bad["error"].get<std::string>().find("force") != std::string::npos);

  auto forced = ctl(d, {"start", "-o", kept, "--force"});
  INFO("start --force: " << forced->err());
  REQUIRE(forced->exit_code() == 0);
  REQUIRE(ctl(d, {"stop"})->exit_code() == 0);
  bool clean = false;
  read_trace(kept, &clean);
  CHECK(clean);

  // No -o: perfq-YYYYMMDD-HHMMSS.trace in the current directory, said so.
  TempDir here("daemon-force-here");
  auto named = ctl(d, {"start"}, {"/usr/bin/env", "-C", here.file("")});
  INFO("start without -o: " << named->out() << named->err());
  REQUIRE(named->exit_code() == 0);
  std::smatch m;
  const std::string said = named->err();
  REQUIRE(std::regex_search(said, m, std::regex(R"(no -o given: the trace is (\S+))")));
  CHECK(named->out().find("recording to " + m[1].str()) != std::string::npos);
  REQUIRE(ctl(d, {"stop"})->exit_code() == 0);
  const auto traces = timestamped_traces(here.file(""));
  REQUIRE(traces.size() == 1);
  CHECK(std::filesystem::equivalent(traces[0], m[1].str()));
  read_trace(traces[0], &clean);
  CHECK(clean);

  // perfqctl record, the same way (its device must run).
  TempShm shm("daemon-force");
  Child dev({kBin + "/perfq-devsim", "--region", shm.path(), "--create", "--workers", "1", "--rate",
             "2000", "--job-workers", "0"});
  REQUIRE(dev.started());
  REQUIRE(wait_for([&] { return dev.err().find("running on") != std::string::npos; },
                   std::chrono::seconds(static_cast<int>(10 * kSlow))));
  const std::string spec = "shm:" + shm.path();
  const std::string rec_kept = dir.file("rec-kept.trace");
  std::ofstream(rec_kept) << "an earlier recording";
  Child rec({kBin + "/perfqctl", "record", "--device", spec, "-o", rec_kept});
  REQUIRE(rec.wait(std::chrono::seconds(static_cast<int>(30 * kSlow))));
  INFO("record over an existing file: " << rec.err());
  CHECK(rec.exit_code() == 1);
  CHECK(rec.err().find(rec_kept + " exists") != std::string::npos);
  CHECK(rec.err().find("--force overwrites it") != std::string::npos);
  CHECK(file_text(rec_kept) == "an earlier recording");
  Child rec_forced({kBin + "/perfqctl", "record", "--device", spec, "-o", rec_kept, "--force",
                    "--duration", "0.5"});
  REQUIRE(rec_forced.wait(std::chrono::seconds(static_cast<int>(30 * kSlow))));
  INFO("record --force: " << rec_forced.err());
  CHECK(rec_forced.exit_code() == 0);
  read_trace(rec_kept, &clean);
  CHECK(clean);
  TempDir rec_here("daemon-force-rec");
  Child rec_named({"/usr/bin/env", "-C", rec_here.file(""), kBin + "/perfqctl", "record",
                   "--device", spec, "--duration", "0.5"});
  REQUIRE(rec_named.wait(std::chrono::seconds(static_cast<int>(30 * kSlow))));
  INFO("record without -o: " << rec_named.out() << rec_named.err());
  CHECK(rec_named.exit_code() == 0);
  CHECK(rec_named.err().find("no -o given: the trace is " + rec_here.file("perfq-")) !=
        std::string::npos);
  const auto rec_traces = timestamped_traces(rec_here.file(""));
  REQUIRE(rec_traces.size() == 1);
  read_trace(rec_traces[0], &clean);
  CHECK(clean);
}

// What a user meets on the command line: an unknown command named with its
// nearest match, a duration's range in words, the version, the two device
// forms in help and errors alike.
TEST_CASE("perfqctl: usage errors say what is wrong and what would be right", "[daemon][process]") {
  auto run = [](std::vector<std::string> args) {
    args.insert(args.begin(), kBin + "/perfqctl");
    auto c = std::make_unique<Child>(args);
    REQUIRE(c->started());
    REQUIRE(c->wait(std::chrono::seconds(static_cast<int>(30 * kSlow))));
    return c;
  };
  auto typo = run({"reprot", "x"});
  INFO("reprot: " << typo->err());
  CHECK(typo->exit_code() == 2);
  CHECK(typo->err().find("unknown command 'reprot'; did you mean 'report'?") != std::string::npos);
  auto far = run({"--socket", "/nowhere", "frobnicate"});
  CHECK(far->exit_code() == 2);
  CHECK(far->err().find("unknown command 'frobnicate' (commands: start, stop") !=
        std::string::npos);
  CHECK(far->err().find("did you mean") == std::string::npos);
  auto none = run({});
  CHECK(none->exit_code() == 2);
  CHECK(none->err().find("a command is required (commands: start, stop") != std::string::npos);
  auto missing = run({"record"});  // a command's own required option is still named
  CHECK(missing->exit_code() == 2);
  CHECK(missing->err().find("--device is required") != std::string::npos);

  for (const std::string cmd : {"start", "record"}) {
    auto neg = run({cmd, "--device", "shm:/nowhere", "--duration", "-3"});
    INFO(cmd << " --duration -3: " << neg->err());
    CHECK(neg->exit_code() == 2);
    CHECK(neg->err().find("'-3' is not a duration: give seconds from 0 to 10000000") !=
          std::string::npos);
    CHECK(neg->err().size() < 200);  // no range ending in a 300-digit number
  }

  TempDir dir("perfqctl-usage");
  Daemon d(dir);
  auto version = run({"--version"});
  CHECK(version->exit_code() == 0);
  std::smatch m;
  const std::string said = version->out();
  REQUIRE(std::regex_match(said, m, std::regex(R"(perfqctl (\d+\.\d+\.\d+)\n)")));
  Child daemon_version({kBin + "/perfq-daemon", "--version"});
  REQUIRE(daemon_version.wait(std::chrono::seconds(10)));
  CHECK(daemon_version.exit_code() == 0);
  CHECK(daemon_version.out() == "perfq-daemon " + m[1].str() + "\n");
  const json status = json::parse(ctl(d, {"status", "--json"})->out());
  CHECK(status["daemon"]["version"] == m[1].str());

  // record: its help and its errors name the same two device forms.
  auto help = run({"record", "--help"});
  CHECK(help->out().find("shm:PATH") != std::string::npos);
  CHECK(help->out().find("/dev/perfqN") != std::string::npos);
  auto bad = run({"record", "--device", dir.file("not-a-spec")});
  CHECK(bad->exit_code() == 1);
  CHECK(bad->err().find("is not shm:PATH or /dev/perfqN") != std::string::npos);
}

// export -o - writes to standard output what -o FILE writes to the file,
// for every format (ctf's directory as a tar), and leaves no file named '-'.
TEST_CASE("perfqctl: export -o - writes the export to standard output", "[daemon][process]") {
  TempDir dir("perfqctl-export-stdout");
  TempShm shm("perfqctl-export-stdout");
  // A trace with records: a device's, for half a second.
  Child dev({kBin + "/perfq-devsim", "--region", shm.path(), "--create", "--workers", "1", "--rate",
             "2000", "--job-workers", "0", "--duration", "0.5", "--wait-host"});
  REQUIRE(dev.started());
  REQUIRE(
      wait_for([&] { return access(shm.path().c_str(), F_OK) == 0; }, std::chrono::seconds(10)));
  Daemon d(dir);
  const std::string trace = dir.file("t.trace");
  REQUIRE(ctl(d, {"start", "-o", trace, "--device", "shm:" + shm.path()})->exit_code() == 0);
  REQUIRE(dev.wait(std::chrono::seconds(static_cast<int>(30 * kSlow))));
  REQUIRE(ctl(d, {"stop"})->exit_code() == 0);
  for (const std::string format : {"perfetto", "chrome-json", "csv"}) {
    INFO("format " << format);
    const std::string file = dir.file("out." + format);
    Child to_file({kBin + "/perfqctl", "export", "-f", format, "-o", file, trace});
    REQUIRE(to_file.wait(std::chrono::seconds(static_cast<int>(30 * kSlow))));
    REQUIRE(to_file.exit_code() == 0);
    Child to_stdout({"/usr/bin/env", "-C", dir.file(""), kBin + "/perfqctl", "export", "-f", format,
                     "-o", "-", trace});
    REQUIRE(to_stdout.wait(std::chrono::seconds(static_cast<int>(30 * kSlow))));
    INFO(to_stdout.err());
    CHECK(to_stdout.exit_code() == 0);
    CHECK(!to_stdout.out().empty());
    CHECK(to_stdout.out() == file_text(file));
    CHECK(access(dir.file("-").c_str(), F_OK) != 0);
  }
  // ctf, a directory: as a tar archive of it, which unpacks to the same files.
  Child ctf_dir({kBin + "/perfqctl", "export", "-f", "ctf", "-o", dir.file("ctf-dir"), trace});
  REQUIRE(ctf_dir.wait(std::chrono::seconds(static_cast<int>(30 * kSlow))));
  REQUIRE(ctf_dir.exit_code() == 0);
  Child ctf({"/usr/bin/env", "-C", dir.file(""), kBin + "/perfqctl", "export", "-f", "ctf", "-o",
             "-", trace});
  REQUIRE(ctf.wait(std::chrono::seconds(static_cast<int>(30 * kSlow))));
  INFO(ctf.err());
  CHECK(ctf.exit_code() == 0);
  CHECK(access(dir.file("-").c_str(), F_OK) != 0);
  std::ofstream(dir.file("ctf.tar"), std::ios::binary) << ctf.out();
  REQUIRE(std::filesystem::create_directory(dir.file("unpacked")));
  REQUIRE(sh("tar -x -C " + dir.file("unpacked") + " -f " + dir.file("ctf.tar")) == 0);
  for (const std::string f : {"metadata", "stream_0"}) {
    INFO(f);
    CHECK(!file_text(dir.file("ctf-dir/" + f)).empty());
    CHECK(file_text(dir.file("unpacked/ctf/" + f)) == file_text(dir.file("ctf-dir/" + f)));
  }
}

// Every JSON document, from the daemon or perfqctl, says its schema version:
// one integer, the same everywhere.
TEST_CASE("daemon: JSON replies and --json outputs carry one schema_version", "[daemon][process]") {
  TempDir dir("daemon-schema");
  Daemon d(dir);
  std::set<int> versions;
  auto version_of = [&](const std::string& what, const std::string& text) {
    INFO(what << ": " << text);
    const json j = json::parse(text, nullptr, false);
    REQUIRE(j.is_object());
    REQUIRE(j.contains("schema_version"));
    REQUIRE(j["schema_version"].is_number_integer());
    versions.insert(j["schema_version"].get<int>());
  };
  const std::string t1 = dir.file("a.trace"), t2 = dir.file("b.trace");
  version_of("start --json", ctl(d, {"start", "-o", t1, "--json"})->out());
  version_of("status --json", ctl(d, {"status", "--json"})->out());
  version_of("devices --json", ctl(d, {"devices", "--json"})->out());
  version_of("stop --json", ctl(d, {"stop", "--json"})->out());
  version_of("start --duration --json",
             ctl(d, {"start", "-o", t2, "--duration", "0.2", "--json"})->out());
  // The lspci -xxx dump of the PCI tests (tests/fixtures), beside this file's folder.
  const std::string dump =
      (std::filesystem::path(__FILE__).parent_path().parent_path() / "fixtures/pci-dump.txt")
          .string();
  version_of("devices --pci-dump --json", ctl(d, {"devices", "--pci-dump", dump, "--json"})->out());
  for (const auto& args : std::vector<std::vector<std::string>>{{"report", "--json", t1},
                                                                {"report", "--json", t1, t2}}) {
    std::vector<std::string> argv = {kBin + "/perfqctl"};
    argv.insert(argv.end(), args.begin(), args.end());
    Child rep(argv);
    REQUIRE(rep.wait(std::chrono::seconds(static_cast<int>(60 * kSlow))));
    version_of("report", rep.out());
  }
  // Refusals too, and requests that reach the daemon in its own words.
  Conn c(d.socket);
  REQUIRE(c.ok());
  version_of("an unknown command", c.request({{"cmd", "frobnicate"}}).dump());
  version_of("ping", c.request({{"cmd", "ping"}}).dump());
  // The control socket's own refusals, which never reach a command.
  for (const std::string bad : {"not json\n", "{\"no\":\"cmd\"}\n", "\n"}) {
    REQUIRE(c.send_raw(bad));
    version_of("the refusal of " + bad, c.line());
  }
  CHECK(versions.size() == 1);
  CHECK(*versions.begin() >= 1);
}

TEST_CASE("daemon: devices --all lists this machine's PCI bus, devices only perfq's",
          "[daemon][process][pci]") {
  TempDir dir("daemon-pci");
  // A configured shm: device: not a PCI device, so no PCI facts.
  Daemon d(dir, {"--device", "shm:/dev/shm/perfq-pci-test-none"});
  std::set<std::string> on_bus;
  if (access("/sys/bus/pci/devices", R_OK) == 0)
    for (const auto& e : std::filesystem::directory_iterator("/sys/bus/pci/devices"))
      on_bus.insert(e.path().filename().string());

  auto all = ctl(d, {"devices", "--all", "--json"});
  INFO("devices --all: " << all->out() << all->err());
  REQUIRE(all->exit_code() == 0);
  const json j = json::parse(all->out());
  CHECK(j["ok"] == true);
  CHECK(j["all"] == true);
  REQUIRE(j["devices"].size() == 1);
  CHECK(j["devices"][0]["device"] == "shm:/dev/shm/perfq-pci-test-none");
  CHECK_FALSE(j["devices"][0].contains("pci"));
  CHECK(j["devices"][0]["state"] == "unavailable");  // existing fields stay
  REQUIRE(j["pci_devices"].is_array());
  std::set<std::string> listed;
  for (const auto& p : j["pci_devices"]) {
    INFO(p.dump());
    REQUIRE(p["address"].is_string());
    const std::string a = p["address"];
    listed.insert(a);
    CHECK(std::regex_match(a, std::regex("[0-9a-f]{4,}:[0-9a-f]{2}:[0-9a-f]{2}\\.[0-7]")));
    CHECK(std::regex_match(p["vendor_id"].get<std::string>(), std::regex("[0-9a-f]{4}")));
    CHECK(std::regex_match(p["device_id"].get<std::string>(), std::regex("[0-9a-f]{4}")));
    CHECK((p["driver"].is_null() || p["driver"].is_string()));
    CHECK((p["numa_node"].is_null() || p["numa_node"].is_number_integer()));
    CHECK((p["iommu_group"].is_null() || p["iommu_group"].is_number_integer()));
    CHECK(p["config_readable"].is_boolean());
    CHECK((p["pcie"].is_null() || p["pcie"].is_object()));
    if (p["pcie"].is_object())
      for (const char* l : {"link_max", "link_current"})
        if (!p["pcie"][l].is_null()) {
          CHECK(p["pcie"][l]["width"].get<int>() > 0);
          CHECK(p["pcie"][l]["ceiling_bytes_per_s"].get<double>() > 0);
        }
    CHECK(pci_device_from_json(p).is_ok());
  }
  CHECK(listed == on_bus);

  // Without --all: only the devices bound to perfq (none here, unless one is).
  auto bound = ctl(d, {"devices", "--json"});
  REQUIRE(bound->exit_code() == 0);
  const json b = json::parse(bound->out());
  CHECK(b["all"] == false);
  for (const auto& p : b["pci_devices"]) CHECK(p["driver"] == "perfq");
  // The raw request, as documented.
  Conn c(d.socket);
  REQUIRE(c.ok());
  REQUIRE(c.send_raw("{\"cmd\":\"devices\",\"all\":true}\n"));
  const json raw = json::parse(c.line());
  CHECK(raw["pci_devices"].size() == j["pci_devices"].size());
  REQUIRE(c.send_raw("{\"cmd\":\"devices\",\"all\":\"yes\"}\n"));
  CHECK(json::parse(c.line())["ok"] == false);

  // The table, for people.
  auto text = ctl(d, {"devices", "--all"});
  INFO(text->out() << text->err());
  CHECK(text->exit_code() == 0);
  CHECK(text->out().find("shm:/dev/shm/perfq-pci-test-none  unavailable") != std::string::npos);
  if (!on_bus.empty()) {
    CHECK(text->out().find("ADDRESS") != std::string::npos);
    for (const auto& a : on_bus) CHECK(text->out().find(a) != std::string::npos);
  }
}

TEST_CASE("daemon: a recording with a duration ends by itself, and perfqctl start waits for it",
          "[daemon][process]") {
  TempDir dir("daemon-duration");
  Daemon d(dir);
  const std::string trace = dir.file("dur.trace");
  const auto t0 = std::chrono::steady_clock::now();
  auto st = ctl(d, {"start", "-o", trace, "--duration", "1", "--json"});
  const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  INFO("start: " << st->out() << st->err());
  REQUIRE(st->exit_code() == 0);
  CHECK(secs >= 1.0);
  const json j = json::parse(st->out());
  CHECK(j["complete"] == true);
  CHECK(j["stop_reason"] == "its duration elapsed");
  bool clean = false;
  read_trace(trace, &clean);
  CHECK(clean);
  // Without waiting: the daemon stops it, and `stop` then returns its summary once.
  REQUIRE(ctl(d, {"start", "-o", dir.file("dur2.trace"), "--duration", "0.3", "--no-wait"})
              ->exit_code() == 0);
  REQUIRE(wait_for(
      [&] {
        const json s = json::parse(ctl(d, {"status", "--json"})->out(), nullptr, false);
        return s.is_object() && s["recording"].is_null();
      },
      std::chrono::seconds(static_cast<int>(20 * kSlow))));
  auto stop = ctl(d, {"stop", "--json"});
  CHECK(stop->exit_code() == 0);
  CHECK(json::parse(stop->out())["output"] == dir.file("dur2.trace"));
  CHECK(ctl(d, {"stop"})->exit_code() == 1);  // nothing left to stop
}

// devsim's clock: D = H + offset + drift x H.  Every output of one
// recording (status text and JSON, the stop summary, report text and JSON,
// with and without --resync) must state it with devsim's signs; a second
// recording on the same running device must hold only its own interval.
TEST_CASE(
    "daemon: every figure states the device clock as devsim set it, and a later recording "
    "holds only its own time and losses",
    "[daemon][process][sync]") {
  TempDir dir("daemon-truth");
  TempShm shm("daemon-truth");
  const double offset_ns = 2'570'000'000, ppm = 40;
  Child dev({kBin + "/perfq-devsim", "--region", shm.path(), "--create", "--workers", "2", "--rate",
             "10000", "--job-workers", "0", "--clock-offset-ns", "2570000000", "--clock-drift-ppm",
             "40", "--duration", std::to_string(60 * kSlow)});
  REQUIRE(dev.started());
  REQUIRE(wait_for([&] { return dev.err().find("running on") != std::string::npos; },
                   std::chrono::seconds(static_cast<int>(10 * kSlow))));
  Daemon d(dir);
  auto host_now = [] { return static_cast<double>(monotonic_ns()); };
  // The model's statement against the truth at about the host time `h`
  // (the model's reference lies within the recording: the drift over a
  // few seconds, 40 ppm of them, is far inside the margin).
  // The words a user reads ("device clock 2.570 s ahead of the host,
  // running 40.001 ppm fast"), numbers included, against the truth.
  auto check_words = [&](const std::string& text, const std::string& where, double h) {
    INFO(where << ": " << text);
    static const std::regex re(
        "device clock ([0-9.]+) (s|ms|us|ns) (ahead of|behind) the host, running ([0-9.]+) ppm "
        "(fast|slow)");
    std::smatch m;
    REQUIRE(std::regex_search(text, m, re));
    const double unit = m[2] == "s" ? 1e9 : m[2] == "ms" ? 1e6 : m[2] == "us" ? 1e3 : 1;
    const double ahead = std::stod(m[1]) * unit * (m[3] == "behind" ? -1 : 1);
    const double fast = std::stod(m[4]) * (m[5] == "slow" ? -1 : 1);
    // The text rounds to 3 decimals of its unit.
    CHECK(std::fabs(ahead - (offset_ns + ppm * 1e-6 * h)) < 1e6 + 0.0005 * unit);
    CHECK(std::fabs(fast - ppm) < 2);
  };
  auto check_standing = [&](const json& sy, const std::string& where, double h) {
    INFO(where << ": " << sy.dump());
    REQUIRE(sy.value("synchronized", false));
    CHECK(std::fabs(sy["device_fast_ppm"].get<double>() - ppm) < 2);
    CHECK(std::fabs(sy["device_ahead_ns"].get<double>() - (offset_ns + ppm * 1e-6 * h)) < 1e6);
    const std::string text = sy["standing"];
    CHECK(text.rfind("device clock ", 0) == 0);
    check_words(text, where + " standing", h);
  };

  const std::string t1 = dir.file("first.trace");
  REQUIRE(ctl(d, {"start", "-o", t1, "--device", "shm:" + shm.path()})->exit_code() == 0);
  REQUIRE(wait_for(
      [&] {
        const json j = json::parse(ctl(d, {"status", "--json"})->out(), nullptr, false);
        return j.is_object() && j["recording"].is_object() &&
               j["recording"]["devices"][0]["sync"].value("rounds", 0) >= 20;
      },
      std::chrono::seconds(static_cast<int>(30 * kSlow))));
  {
    const json j = json::parse(ctl(d, {"status", "--json"})->out());
    check_standing(j["recording"]["devices"][0]["sync"], "status --json", host_now());
    auto text = ctl(d, {"status"});
    check_words(text->out(), "status", host_now());
  }
  auto stop1 = ctl(d, {"stop", "--json"});
  REQUIRE(stop1->exit_code() == 0);
  check_standing(json::parse(stop1->out())["devices"][0]["sync"], "stop summary", host_now());
  for (const bool resync : {false, true}) {
    std::vector<std::string> argv = {kBin + "/perfqctl", "report", "--json", t1};
    if (resync) argv.push_back("--resync");
    Child rep(argv);
    REQUIRE(rep.wait(std::chrono::seconds(static_cast<int>(60 * kSlow))));
    INFO(rep.err());
    REQUIRE(rep.exit_code() == 0);
    const json rj = json::parse(rep.out());
    check_standing(rj["sync"], resync ? "report --resync" : "report", host_now());
    CHECK(rj["sync"]["resynced"] == resync);
    std::vector<std::string> text_argv = {kBin + "/perfqctl", "report", t1};
    if (resync) text_argv.push_back("--resync");
    Child txt(text_argv);
    REQUIRE(txt.wait(std::chrono::seconds(static_cast<int>(60 * kSlow))));
    check_words(txt.out(), resync ? "report --resync (text)" : "report (text)", host_now());
  }

  // Half a second later the device's ring holds records of no recording
  // (far less than it holds: nothing is dropped meanwhile).  The second
  // recording starts past them: no loss it did not have, no time before
  // its start, its own duration and rates.
  std::this_thread::sleep_for(std::chrono::milliseconds(500));
  const std::string t2 = dir.file("second.trace");
  REQUIRE(ctl(d, {"start", "-o", t2, "--device", "shm:" + shm.path()})->exit_code() == 0);
  std::this_thread::sleep_for(std::chrono::milliseconds(static_cast<int>(1500 * kSlow)));
  auto stop2 = ctl(d, {"stop", "--json"});
  REQUIRE(stop2->exit_code() == 0);
  const json s2 = json::parse(stop2->out());
  INFO("second stop: " << s2.dump());
  CHECK(s2["devices"][0]["lost"] == 0);
  CHECK(s2["devices"][0]["before_start"].get<uint64_t>() > 0);
  for (const auto& st : s2["devices"][0]["streams"]) CHECK(st["lost"] == 0);
  Child rep({kBin + "/perfqctl", "report", "--json", t2});
  REQUIRE(rep.wait(std::chrono::seconds(static_cast<int>(60 * kSlow))));
  REQUIRE(rep.exit_code() == 0);
  const json rj = json::parse(rep.out());
  INFO("second report: " << rep.out().substr(0, 3000));
  CHECK(rj["lost"]["device"] == 0);
  CHECK(rj["duration_of"] == "recording");
  const auto start_ns = rj["recording_start_ns"].get<int64_t>();
  const auto stop_ns = rj["recording_stop_ns"].get<int64_t>();
  CHECK(rj["duration_ns"].get<int64_t>() == stop_ns - start_ns);
  CHECK(std::fabs(rj["duration_ns"].get<double>() - s2["duration_s"].get<double>() * 1e9) < 1e6);
  CHECK(rj["first_ns"].get<int64_t>() >= start_ns);
  // The drain's last poll after the stop may take what the device published
  // up to then: its latency, not seconds.
  CHECK(rj["last_ns"].get<int64_t>() <= stop_ns + 500'000'000);
  // Rates over the recording: devsim's 10 k/s, whatever the ring held.
  bool ticks = false;
  for (const auto& e : rj["events"]) {
    if (e["name"] != "tick") continue;
    ticks = true;
    CHECK(e["rate_per_s"].get<double>() > 0.8 * 10000);
    CHECK(e["rate_per_s"].get<double>() < 1.2 * 10000);
  }
  CHECK(ticks);
}

// A device clock that steps during a recording, either way: every device
// time must lie within the claim the trace keeps with it (devsim --truth
// stores the true host time in each tick's arg), and nearly every one must
// be tight.  Before, the repeated device times after a backward step passed
// as covered by the old segment (2 734 records 1 s off at -1 s), and after
// a forward step records extrapolated across it were the step's size off
// with a claim of ~100 ns (22 or 159 records at +5 ms, 2 runs of 5).
// The "tick" records of devsim --truth (arg: the true host time) against
// their converted times and claims.
struct TruthCheck {
  uint64_t ticks = 0, beyond = 0, loose = 0, unclaimed = 0, forced = 0;
  double worst = 0, worst_claim = 0;  // the farthest beyond its claim
  int64_t worst_truth = 0;
};
// `perfqctl stop`, then the trace, which must have ended cleanly.
TraceContent stop_and_read(const Daemon& d, const std::string& trace) {
  auto stop = ctl(d, {"stop", "--json"});
  INFO("stop: " << stop->out() << "\ndaemon: " << d.proc->err());
  REQUIRE(stop->exit_code() == 0);
  bool clean = false;
  TraceContent t = read_trace(trace, &clean);
  REQUIRE(clean);
  return t;
}
TruthCheck check_ticks_against_truth(const TraceContent& t) {
  // Room for the truth itself (devsim reads the host clock beside the
  // device's, not at the same instant).
  constexpr double kTruthSlackNs = 200;
  TruthCheck c;
  for (const auto& r : t.records) {
    if (r.source == 0 || t.event_name(r) != "tick") continue;
    ++c.ticks;
    if (r.conv == TraceConversion::kNone) ++c.unclaimed;
    const double e = std::fabs(static_cast<double>(r.time_ns - static_cast<int64_t>(r.rec.arg)));
    const double claim = r.claim_ns == kClaimUnbounded ? INFINITY : r.claim_ns;
    if (e > claim + kTruthSlackNs) {
      ++c.beyond;
      if (e > c.worst) {
        c.worst = e;
        c.worst_claim = claim;
        c.worst_truth = static_cast<int64_t>(r.rec.arg);
      }
    }
    // Forced: waited 2 s for rounds a loaded machine kept loose, then
    // converted with the model there was, claiming what it claims there
    // (or nothing): honest still.
    if (r.conv == TraceConversion::kForced)
      ++c.forced;
    else if (claim > 20'000)
      ++c.loose;
  }
  return c;
}

TEST_CASE("daemon: device times around a clock step lie within their claims",
          "[daemon][process][sync]") {
  // In a sanitizer tree (12 s a step there) one step each way: the claims'
  // accuracy is the plain tree's to check, their machinery both trees'.
  const std::vector<std::string> steps =
      kSanitized ? std::vector<std::string>{"-1000000000", "5000000"}
                 : std::vector<std::string>{"-50000000", "-1000000000", "5000000", "300000000"};
  const std::string step = GENERATE_REF(from_range(steps));
  INFO("step " << step << " ns");
  TempDir dir("daemon-step");
  TempShm shm("daemon-step");
  const std::string trace = dir.file("step.trace");
  Child dev({kBin + "/perfq-devsim",
             "--region",
             shm.path(),
             "--create",
             "--truth",
             "--workers",
             "2",
             "--rate",
             "20000",
             "--job-workers",
             "0",
             "--clock-offset-ns",
             "-123456789",
             "--clock-drift-ppm",
             "35",
             "--clock-step-at",
             "2",
             "--clock-step-ns",
             step,
             "--duration",
             std::to_string(4 * kSlow),
             "--wait-host"});
  REQUIRE(dev.started());
  REQUIRE(wait_for([&] { return dev.err().find("running on") != std::string::npos; },
                   std::chrono::seconds(static_cast<int>(10 * kSlow))));
  Daemon d(dir);
  REQUIRE(ctl(d, {"start", "-o", trace, "--device", "shm:" + shm.path()})->exit_code() == 0);
  REQUIRE(dev.wait(std::chrono::seconds(static_cast<int>(60 * kSlow))));
  const TraceContent t = stop_and_read(d, trace);
  const TruthCheck c = check_ticks_against_truth(t);
  INFO("ticks " << c.ticks << ", beyond their claim " << c.beyond << " (worst " << c.worst
                << " ns off claiming " << c.worst_claim << " ns, at true time " << c.worst_truth
                << "), claims over 20 us " << c.loose << " (and " << c.forced << " forced), models "
                << t.model_list.size());
  CHECK(c.ticks > 40000);
  CHECK(c.unclaimed == 0);
  CHECK(c.beyond == 0);
  // Honest and useful: only the records around the step may be loose, the
  // step's size in their claims (those the model converted).  How many are
  // loose follows how tight the host's rounds were, which in a sanitizer
  // tree depends on what else the machine runs (2.1 % loose with make
  // test's fuzzers beside it at nice 19): there the claims must be true, and
  // the plain tree, alone, checks that they are tight.
  if (!kSanitized) CHECK(c.loose < c.ticks / 50);
}

// An idle device costs few rounds: while it records nothing the interval
// lengthens (up to 8 x the configured one); once it records, its records
// get rounds at the configured interval again, and their times are as true
// as their claims say.
TEST_CASE("daemon: sync rounds slow down while a device records nothing, and speed up for records",
          "[daemon][process][sync]") {
  TempDir dir("daemon-idle-sync");
  TempShm shm("daemon-idle-sync");
  const std::string trace = dir.file("idle.trace");
  const double idle_s = 6 * kSlow;
  Child dev({kBin + "/perfq-devsim",
             "--region",
             shm.path(),
             "--create",
             "--truth",
             "--workers",
             "1",
             "--rate",
             "5000",
             "--job-workers",
             "0",
             "--clock-offset-ns",
             "987654321",
             "--clock-drift-ppm",
             "-20",
             "--wait-host",
             "--start-after",
             std::to_string(idle_s),
             "--duration",
             std::to_string(3 * kSlow)});
  REQUIRE(dev.started());
  REQUIRE(wait_for([&] { return dev.err().find("running on") != std::string::npos; },
                   std::chrono::seconds(static_cast<int>(10 * kSlow))));
  Daemon d(dir);
  REQUIRE(
      ctl(d, {"start", "-o", trace, "--device", "shm:" + shm.path(), "--sync-interval-ms", "50"})
          ->exit_code() == 0);
  const auto device_status = [&] {
    auto s = ctl(d, {"status", "--json"});
    if (s->exit_code() != 0) return json();
    const json j = json::parse(s->out());
    return j["recording"]["devices"].empty() ? json() : j["recording"]["devices"][0];
  };
  uint64_t idle_interval = 0, idle_rounds = 0;
  const auto t0 = std::chrono::steady_clock::now();
  REQUIRE(wait_for(
      [&] {
        const json dj = device_status();
        if (dj.is_null() || dj["records"].get<uint64_t>() != 0) return false;
        idle_interval = dj["sync"]["interval_ms"].get<uint64_t>();
        idle_rounds = dj["sync"]["rounds"].get<uint64_t>();
        return idle_interval > 50;
      },
      std::chrono::seconds(static_cast<int>(idle_s - 1))));
  INFO(
      "idle: every " << idle_interval << " ms after " << idle_rounds << " rounds in "
                     << std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count()
                     << " s");
  CHECK(idle_interval <= 400);
  // The device records: its records wait for rounds, which come every 50 ms
  // again (from the round after the first records) for as long as it does.
  uint64_t busy_interval = 0;
  CHECK(wait_for(
      [&] {
        const json dj = device_status();
        if (dj.is_null() || dj["records"].get<uint64_t>() < 1000) return false;
        busy_interval = dj["sync"]["interval_ms"].get<uint64_t>();
        return busy_interval == 50;
      },
      std::chrono::seconds(static_cast<int>(idle_s + 2 * kSlow))));
  std::vector<std::pair<uint64_t, uint64_t>> samples;  // records, interval_ms
  while (dev.running()) {
    const json dj = device_status();
    if (!dj.is_null())
      samples.emplace_back(dj["records"].get<uint64_t>(),
                           dj["sync"]["interval_ms"].get<uint64_t>());
  }
  // A sample after which records still came was taken while they came.
  size_t flowing = 0, longer = 0;
  for (size_t i = 0; i + 1 < samples.size(); ++i)
    if (samples[i + 1].first > samples[i].first) {
      ++flowing;
      if (samples[i].second != 50) ++longer;
    }
  INFO("while recording: every " << busy_interval << " ms; " << longer << " of " << flowing
                                 << " looks while records came found a longer interval");
  CHECK(flowing >= 5);
  CHECK(longer == 0);
  REQUIRE(dev.wait(std::chrono::seconds(static_cast<int>(60 * kSlow))));
  const TraceContent t = stop_and_read(d, trace);
  const TruthCheck c = check_ticks_against_truth(t);
  INFO("ticks " << c.ticks << ", beyond their claims " << c.beyond << " (worst " << c.worst
                << " ns), unconverted " << c.unclaimed << ", forced " << c.forced);
  CHECK(c.ticks > 5000);
  CHECK(c.beyond == 0);
  CHECK(c.unclaimed == 0);
}

// One region, one consumer: a second daemon, a start naming the device
// twice, or perfqctl record beside a recording are refused, naming the
// holder; the claim dies with its holder, however it dies.
TEST_CASE("daemon: a device has one consumer at a time, and the refusal names the holder",
          "[daemon][process]") {
  TempDir dir("daemon-claim");
  TempShm shm("daemon-claim");
  Child dev({kBin + "/perfq-devsim", "--region", shm.path(), "--create", "--workers", "1", "--rate",
             "2000", "--job-workers", "0"});
  REQUIRE(dev.started());
  REQUIRE(wait_for([&] { return dev.err().find("running on") != std::string::npos; },
                   std::chrono::seconds(static_cast<int>(10 * kSlow))));
  const std::string spec = "shm:" + shm.path();
  TempDir dir_b("daemon-claim-b");
  Daemon a(dir), b(dir_b);

  // The same device twice in one request, also spelt another way.
  auto twice = ctl(b, {"start", "-o", dir_b.file("twice.trace"), "--device", spec, "--device",
                       "shm:" + std::filesystem::path(shm.path()).parent_path().string() + "/./" +
                           std::filesystem::path(shm.path()).filename().string()});
  CHECK(twice->exit_code() == 1);
  CHECK(twice->err().find("lists this device twice") != std::string::npos);

  REQUIRE(ctl(a, {"start", "-o", dir.file("a.trace"), "--device", spec})->exit_code() == 0);
  const std::string holder = "perfq-daemon (pid " + std::to_string(a.proc->pid()) + ")";
  auto second = ctl(b, {"start", "-o", dir_b.file("b.trace"), "--device", spec});
  INFO("second daemon: " << second->err());
  CHECK(second->exit_code() == 1);
  CHECK(second->err().find("being recorded by " + holder) != std::string::npos);
  CHECK(access(dir_b.file("b.trace").c_str(), F_OK) != 0);  // nothing written
  Child rec({kBin + "/perfqctl", "record", "--device", spec, "-o", dir_b.file("rec.trace")});
  REQUIRE(rec.wait(std::chrono::seconds(static_cast<int>(30 * kSlow))));
  INFO("record: " << rec.err());
  CHECK(rec.exit_code() == 1);
  CHECK(rec.err().find("being recorded by " + holder) != std::string::npos);

  // The holder killed outright: its claim goes with it.
  a.proc->signal(SIGKILL);
  REQUIRE(a.proc->wait(std::chrono::seconds(10)));
  auto after = ctl(b, {"start", "-o", dir_b.file("after.trace"), "--device", spec});
  INFO("after the kill: " << after->err());
  CHECK(after->exit_code() == 0);
  CHECK(ctl(b, {"stop"})->exit_code() == 0);
}

TEST_CASE("daemon: SIGHUP reloads the config file", "[daemon][process]") {
  TempDir dir("daemon-hup");
  const std::string conf = dir.file("perfq-daemon.conf");
  {
    std::ofstream f(conf);
    f << "device = [\"shm:/dev/shm/perfq-hup-a\"]\nsync-interval-ms = 100\n";
  }
  const std::string socket = dir.file("perfqd.sock");
  Child proc({kBin + "/perfq-daemon", "--socket", socket, "--config", conf});
  REQUIRE(wait_for([&] { return access(socket.c_str(), F_OK) == 0; }, std::chrono::seconds(10)));
  auto devices = [&] {
    Conn c(socket);
    const json s = c.request(json{{"cmd", "status"}});
    return s.is_object() ? s["daemon"]["devices"] : json();
  };
  CHECK(devices() == json::array({"shm:/dev/shm/perfq-hup-a"}));
  {
    std::ofstream f(conf);
    f << "device = [\"shm:/dev/shm/perfq-hup-b\", \"shm:/dev/shm/perfq-hup-c\"]\n";
  }
  proc.signal(SIGHUP);
  CHECK(wait_for([&] { return devices().size() == 2; }, std::chrono::seconds(10)));
  // The log names the file read, not the default one.
  CHECK(wait_for(
      [&] {
        return proc.err().find("reloaded the configuration from " + conf) != std::string::npos;
      },
      std::chrono::seconds(10)));
  // A broken file is refused; the daemon keeps its settings and runs on.
  {
    std::ofstream f(conf);
    f << "sync-interval-ms = not-a-number\n";
  }
  proc.signal(SIGHUP);
  CHECK(wait_for([&] { return proc.err().find("reload refused") != std::string::npos; },
                 std::chrono::seconds(10)));
  CHECK(proc.running());
  CHECK(devices().size() == 2);
  proc.signal(SIGTERM);
  REQUIRE(proc.wait(std::chrono::seconds(20)));
  CHECK(proc.exit_code() == 0);
}

// ---- host kernel events (BPF) --------------------------------------------------------------

// The app's threads (tid -> stream) from the trace's metadata.
std::map<uint32_t, uint16_t> app_threads(const TraceContent& t, uint16_t* app_source) {
  std::map<uint32_t, uint16_t> out;
  for (const auto& s : t.meta.sources) {
    if (s.kind != TraceSourceKind::kHost || s.name != "perfq-demo-app") continue;
    *app_source = s.id;
    for (const auto& th : s.threads) out[th.tid] = th.stream;
  }
  return out;
}

TEST_CASE(
    "daemon: kernel events line up with a traced app's own records, and a uprobe counts "
    "every call",
    "[daemon][process][bpf]") {
  if (geteuid() != 0) {
    WARN("not root: BPF kernel events cannot be loaded here; test skipped");
    return;
  }
  if (!perfqd::kernel_events_built()) {
    WARN(
        "perfq-daemon was built without kernel events (no clang, bpftool, libbpf or kernel "
        "BTF at build time): test skipped");
    return;
  }
  TempDir dir("daemon-kev");
  TempShm shm("daemon-kev");
  const std::string trace = dir.file("kev.trace");
  Child dev({kBin + "/perfq-devsim", "--region", shm.path(), "--create", "--workers", "1", "--rate",
             "1000", "--job-workers", "2"});
  REQUIRE(dev.started());
  REQUIRE(
      wait_for([&] { return access(shm.path().c_str(), F_OK) == 0; }, std::chrono::seconds(10)));
  Daemon d(dir);
  const std::string demo = kBin + "/perfq-demo-app";
  auto st = ctl(d, {"start", "-o", trace, "--device", "shm:" + shm.path(), "--kernel-events",
                    "sched,syscalls", "--uprobe", demo + ":perfq_demo_submit"});
  INFO("start: " << st->out() << st->err() << "\ndaemon: " << d.proc->err());
  REQUIRE(st->exit_code() == 0);
  // This build has kernel events and the daemon runs as root: no warning.
  REQUIRE(st->err().find("warning") == std::string::npos);

  Child app({demo, "--device", "shm:" + shm.path(), "--socket", d.socket, "--jobs", "3000",
             "--threads", "2", "--job-us", "100", "--inflight", "2"});
  REQUIRE(app.wait(std::chrono::seconds(static_cast<int>(60 * kSlow))));
  INFO("demo-app: " << app.out() << app.err());
  REQUIRE(app.exit_code() == 0);
  const json appjs = json::parse(app.out());
  auto status = ctl(d, {"status", "--json"});
  const json sj = json::parse(status->out());
  INFO("status: " << sj["recording"]["kernel"].dump());
  CHECK(sj["recording"]["kernel"]["state"] == "recording");
  CHECK(sj["recording"]["kernel"]["records"].get<uint64_t>() > 0);
  auto stop = ctl(d, {"stop", "--json"});
  INFO("stop: " << stop->out() << stop->err() << "\ndaemon: " << d.proc->err());
  REQUIRE(stop->exit_code() == 0);
  dev.signal(SIGTERM);
  REQUIRE(dev.wait(std::chrono::seconds(30)));

  bool clean = false;
  TraceContent t = read_trace(trace, &clean);
  CHECK(clean);
  const TraceSource* ks = t.meta.find_source(PERFQ_KERNEL_SOURCE);
  REQUIRE(ks);
  CHECK(ks->kind == TraceSourceKind::kKernel);
  uint16_t app_source = 0;
  const auto threads = app_threads(t, &app_source);
  REQUIRE(threads.size() == 2);
  std::map<uint16_t, uint32_t> tid_of;  // stream -> tid
  for (const auto& [tid, stream] : threads) tid_of[stream] = tid;

  // Per app thread: its kernel events and its own records, in time order.
  struct Ev {
    int64_t t;
    int what;  // 0 own record, 1 switched out, 2 switched in, 3 its syscall or uprobe
  };
  std::map<uint32_t, std::vector<Ev>> per_tid;
  uint64_t kernel_dropped = 0, sched = 0, syscalls = 0, entries = 0, returns = 0;
  std::multiset<uint32_t> uprobe_corr, submit_corr;
  for (const auto& l : t.losses)
    if (l.source == PERFQ_KERNEL_SOURCE) kernel_dropped += l.count;
  for (const auto& r : t.records) {
    const std::string name = t.event_name(r);
    if (r.source == app_source) {
      per_tid[tid_of.at(r.rec.stream)].push_back({r.time_ns, 0});
      if (name == "job_submit") submit_corr.insert(static_cast<uint32_t>(r.rec.arg));
      continue;
    }
    if (r.source != PERFQ_KERNEL_SOURCE) continue;
    const auto tid = static_cast<uint32_t>(r.rec.arg);
    const auto value = static_cast<uint32_t>(r.rec.arg >> 32);
    if (!threads.count(tid)) continue;
    if (name == "sched_switch_out" || name == "sched_switch_in") {
      ++sched;
      per_tid[tid].push_back({r.time_ns, name == "sched_switch_out" ? 1 : 2});
      continue;
    }
    if (name == "syscall_enter" || name == "syscall_exit") {
      ++syscalls;
    } else if (name == "uprobe:perfq_demo_submit") {
      ++entries;
      uprobe_corr.insert(value);
    } else if (name == "uretprobe:perfq_demo_submit") {
      ++returns;
    } else {
      continue;
    }
    per_tid[tid].push_back({r.time_ns, 3});
  }
  REQUIRE(kernel_dropped == 0);
  // The threads sleep between jobs: they are switched out and in.
  CHECK(sched > 0);
  CHECK(syscalls > 0);
  // No record of a thread while it was switched out.  A thread's syscall or
  // uprobe event (or a second switch-out) also proves it was running: one
  // seen while it was "out" means the kernel never delivered its switch-in
  // (seen, rarely, on this machine's kernel); those are counted, and must
  // stay rare.  The thread's own records between that switch-out and the
  // proof are then as much evidence of the lost switch-in: they count as
  // records while out only when a delivered switch-in (or nothing) ends
  // the interval.
  uint64_t while_out = 0, checked = 0, outs = 0, lost_ins = 0;
  std::string example;
  for (auto& [tid, evs] : per_tid) {
    std::stable_sort(evs.begin(), evs.end(), [](const Ev& a, const Ev& b) { return a.t < b.t; });
    bool out = false;
    int64_t out_at = 0;
    uint64_t in_interval = 0;  // own records since the switch-out
    std::string interval_example;
    auto end_interval = [&](bool switch_in_lost) {
      if (switch_in_lost) {
        ++lost_ins;
      } else {
        while_out += in_interval;
        if (example.size() < 400) example += interval_example;
      }
      in_interval = 0;
      interval_example.clear();
    };
    for (const Ev& e : evs) {
      switch (e.what) {
        case 1:
          if (out) end_interval(true);
          out = true;
          out_at = e.t;
          ++outs;
          break;
        case 2:
          if (out) end_interval(false);
          out = false;
          break;
        case 3:
          if (out) end_interval(true);
          out = false;
          break;
        default:
          ++checked;
          if (!out) break;
          ++in_interval;
          if (interval_example.size() < 400)
            interval_example += "tid " + std::to_string(tid) + " at " + std::to_string(e.t) + ", " +
                                std::to_string(e.t - out_at) + " ns after it was switched out; ";
      }
    }
    if (out) end_interval(false);
  }
  INFO("records while switched out: " << while_out << " of " << checked << " (" << example << ")");
  WARN("kernel events: " << sched << " switches of the app's threads, " << lost_ins
                         << " switch-ins never delivered");
  CHECK(lost_ins * 200 <= outs);
  CHECK(checked == appjs["host_events"]["recorded"].get<uint64_t>());
  CHECK(while_out == 0);
  // Exactly one entry and one return per call, and the entry saw the job.
  CHECK(entries == appjs["submit_calls"].get<uint64_t>());
  CHECK(returns == entries);
  CHECK(uprobe_corr == submit_corr);

  // The report tells, per job, how long the submitting thread was off-CPU.
  Child rep({kBin + "/perfqctl", "report", trace, "--json"});
  REQUIRE(rep.wait(std::chrono::seconds(60)));
  INFO("report: " << rep.err());
  REQUIRE(rep.exit_code() == 0);
  const json rj = json::parse(rep.out());
  REQUIRE(rj.contains("off_cpu"));
  CHECK(rj["off_cpu"]["jobs"].get<uint64_t>() == appjs["completed"].get<uint64_t>());
  CHECK(rj["off_cpu"]["jobs_off_cpu"].get<uint64_t>() > 0);
}

TEST_CASE("daemon: kernel event requests that cannot be right are refused with the reason",
          "[daemon][process][bpf]") {
  TempDir dir("daemon-kev-bad");
  Daemon d(dir);
  const std::string trace = dir.file("bad.trace");
  auto refused = [&](std::vector<std::string> args, const std::string& why) {
    std::vector<std::string> a = {"start", "-o", trace};
    a.insert(a.end(), args.begin(), args.end());
    auto c = ctl(d, a);
    INFO("perfqctl " << args.front() << ": " << c->out() << c->err());
    CHECK(c->exit_code() != 0);
    CHECK(c->err().find(why) != std::string::npos);
    CHECK(access(trace.c_str(), F_OK) != 0);
  };
  refused({"--kernel-events", "sched,bogus"}, "unknown kernel event class 'bogus'");
  refused({"--pid", "1"}, "give one of them too");
  refused({"--uprobe", dir.file("nowhere") + ":f"}, "is not a file");
  refused({"--uprobe", kBin + "/perfq-demo-app"}, "expected PATH:SYMBOL");
  if (geteuid() == 0 && perfqd::kernel_events_built())
    refused({"--uprobe", kBin + "/perfq-demo-app:no_such_function_here"},
            "no function 'no_such_function_here'");
  // The daemon is still there, and a good start works.
  auto st = ctl(d, {"start", "-o", trace});
  CHECK(st->exit_code() == 0);
  CHECK(ctl(d, {"stop"})->exit_code() == 0);
}

TEST_CASE("daemon: an unprivileged daemon reports what kernel events need and records the rest",
          "[daemon][process][bpf]") {
  TestUser u;
  if (!u.ok) {
    WARN("cannot create a test user (not root?): test skipped");
    return;
  }
  TempDir dir("daemon-kev-unpriv");
  REQUIRE(::chmod(dir.file("").c_str(), 0777) == 0);
  const std::string socket = dir.file("perfqd.sock"), trace = dir.file("unpriv.trace");
  std::vector<std::string> argv = u.as_user(false);
  for (const std::string& a : {kBin + "/perfq-daemon", std::string("--socket"), socket,
                               std::string("--config"), std::string("/dev/null")})
    argv.push_back(a);
  Child proc(argv);
  REQUIRE(wait_for([&] { return access(socket.c_str(), F_OK) == 0 || !proc.running(); },
                   std::chrono::seconds(10)));
  INFO("daemon: " << proc.err());
  REQUIRE(proc.running());
  auto st = ctl_at(socket, {"start", "-o", trace, "--kernel-events", "sched"});
  INFO("start: " << st->out() << st->err());
  REQUIRE(st->exit_code() == 0);
  CHECK(st->err().find("CAP_BPF") != std::string::npos);
  constexpr int kThreads = 2, kN = 5000;
  Child app(
      {kBin + "/perfq_test_app", socket, "record", std::to_string(kThreads), std::to_string(kN)});
  REQUIRE(app.wait(std::chrono::seconds(static_cast<int>(60 * kSlow))));
  REQUIRE(app.exit_code() == 0);
  auto status = ctl_at(socket, {"status", "--json"});
  const json sj = json::parse(status->out());
  CHECK(sj["recording"]["kernel"]["state"] == "unavailable");
  CHECK(sj["recording"]["kernel"]["error"].get<std::string>().find("CAP_BPF") != std::string::npos);
  auto stop = ctl_at(socket, {"stop", "--json"});
  REQUIRE(stop->exit_code() == 0);
  bool clean = false;
  TraceContent t = read_trace(trace, &clean);
  CHECK(clean);
  CHECK(t.records.size() == static_cast<size_t>(kThreads) * kN);
  CHECK(t.meta.find_source(PERFQ_KERNEL_SOURCE) == nullptr);
  CHECK(t.meta.options.count("kernel_events_error") == 1);
  // Said once.
  size_t said = 0;
  for (size_t pos = 0; (pos = proc.err().find("kernel events:", pos)) != std::string::npos; ++pos)
    ++said;
  CHECK(said == 1);
  proc.signal(SIGTERM);
  REQUIRE(proc.wait(std::chrono::seconds(20)));
}

}  // namespace
}  // namespace perfq
