// TraceMetadata of a trace and its JSON form (the payload of metadata chunks).
#include <sys/timex.h>
#include <sys/utsname.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <climits>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <nlohmann/json.hpp>

#include "perfq/trace.h"
#include "sync/sync.h"

#ifndef PERFQ_VERSION_STRING
#define PERFQ_VERSION_STRING "0.1.0"
#endif

namespace perfq {

using nlohmann::json;

const EventInfo* TraceSource::find_event(uint32_t ev) const {
  for (const auto& e : events) {
    if (e.event == ev) return &e;
  }
  return nullptr;
}

const TraceSource* TraceMetadata::find_source(uint16_t sid) const {
  for (const auto& s : sources) {
    if (s.id == sid) return &s;
  }
  return nullptr;
}

json trace_host_to_json(const TraceHost& h) {
  return {{"name", h.name},
          {"machine_id", h.machine_id},
          {"boot_id", h.boot_id},
          {"kernel", h.kernel},
          {"file", h.file},
          {"offset_ns", h.offset_ns},
          {"uncertainty_ns", h.uncertainty_ns},
          {"alignment", h.alignment}};
}

json trace_source_end_to_json(const TraceSourceEnd& e) {
  return {{"state", e.state}, {"time_ns", e.time_ns}, {"reason", e.reason}};
}

std::string TraceMetadata::source_label(const TraceSource& s) const {
  if (hosts.size() > 1 && s.host < hosts.size()) return hosts[s.host].name + ":" + s.name;
  return s.name;
}

void TraceMetadata::describe_this_host() {
  char host[256] = {};
  if (gethostname(host, sizeof host - 1) == 0) host_name = host;
  auto first_line = [](const char* path) {
    std::ifstream f(path);
    std::string l;
    std::getline(f, l);
    return l;
  };
  machine_id = first_line("/etc/machine-id");
  boot_id = first_line("/proc/sys/kernel/random/boot_id");
  struct utsname u;
  if (uname(&u) == 0) kernel = std::string(u.sysname) + " " + u.release + " " + u.machine;
  std::ifstream cpuinfo("/proc/cpuinfo");
  std::string line;
  while (std::getline(cpuinfo, line)) {
    if (line.rfind("model name", 0) == 0) {
      auto colon = line.find(':');
      if (colon != std::string::npos) cpu = line.substr(line.find_first_not_of(' ', colon + 1));
      break;
    }
  }
  perfq_version = PERFQ_VERSION_STRING;
  clock_domains = {
      {PERFQ_CLOCK_HOST, "host", "host CLOCK_MONOTONIC, ns"},
      {PERFQ_CLOCK_DEVICE, "device", "device system clock D"},
      {PERFQ_CLOCK_DEVICE_TIMER, "device_timer", "device timer register R"},
      {PERFQ_CLOCK_HOST_BY_DEVICE, "host_by_device", "host time computed on the device (mode B)"},
  };
}

std::optional<int64_t> TraceMetadata::option_int(const std::string& key) const {
  auto it = options.find(key);
  if (it == options.end()) return std::nullopt;
  char* end = nullptr;
  errno = 0;
  const long long v = std::strtoll(it->second.c_str(), &end, 10);
  if (errno || end == it->second.c_str() || *end) return std::nullopt;
  return v;
}

void TraceMetadata::merge(const TraceMetadata& later) {
  if (!later.host_name.empty()) host_name = later.host_name;
  if (!later.machine_id.empty()) machine_id = later.machine_id;
  if (!later.boot_id.empty()) boot_id = later.boot_id;
  for (const auto& c : later.host_clocks)
    if (std::find(host_clocks.begin(), host_clocks.end(), c) == host_clocks.end())
      host_clocks.push_back(c);
  if (!later.hosts.empty()) hosts = later.hosts;
  if (!later.kernel.empty()) kernel = later.kernel;
  if (!later.cpu.empty()) cpu = later.cpu;
  if (!later.perfq_version.empty()) perfq_version = later.perfq_version;
  for (const auto& [k, v] : later.options) options[k] = v;
  for (const auto& s : later.sources) {
    bool replaced = false;
    for (auto& mine : sources) {
      if (mine.id == s.id) {
        mine = s;
        replaced = true;
      }
    }
    if (!replaced) sources.push_back(s);
  }
  for (const auto& d : later.clock_domains) {
    bool replaced = false;
    for (auto& mine : clock_domains) {
      if (mine.id == d.id) {
        mine = d;
        replaced = true;
      }
    }
    if (!replaced) clock_domains.push_back(d);
  }
}

std::string trace_metadata_to_json(const TraceMetadata& m) {
  json j;
  j["host_name"] = m.host_name;
  // Added with multi-host merging; absent in older traces.
  if (!m.machine_id.empty()) j["machine_id"] = m.machine_id;
  if (!m.boot_id.empty()) j["boot_id"] = m.boot_id;
  j["kernel"] = m.kernel;
  j["cpu"] = m.cpu;
  j["perfq_version"] = m.perfq_version;
  j["options"] = m.options;
  json sources = json::array();
  for (const auto& s : m.sources) {
    json js;
    js["id"] = s.id;
    js["kind"] = trace_source_kind_name(s.kind);
    js["name"] = s.name;
    js["pid"] = s.pid;
    js["pci_address"] = s.pci_address;
    js["link"] = s.link;
    js["clock_hz"] = s.clock_hz;
    js["timer_hz"] = s.timer_hz;
    // Added after version 1's first release: readers that do not know it
    // ignore it, and its absence means "no PCI facts".
    if (s.pci) js["pci"] = pci_device_to_json(*s.pci);
    json events = json::array();
    for (const auto& e : s.events) {
      json je = {{"event", e.event}, {"kind", e.kind}, {"name", e.name}};
      // Added after version 1's first release (perfq_event2()): absent
      // when the arg is one number, ignored by readers that do not know it.
      if (!e.args.empty()) je["args"] = e.args;
      events.push_back(std::move(je));
    }
    js["events"] = std::move(events);
    // Added with kernel events; absent in older traces.
    if (!s.threads.empty()) {
      json threads = json::array();
      for (const auto& t : s.threads)
        threads.push_back({{"stream", t.stream}, {"tid", t.tid}, {"name", t.name}});
      js["threads"] = std::move(threads);
    }
    // Added with device timeouts; absent when the source lasted the recording.
    if (s.host != 0) js["host"] = s.host;
    if (s.ended) js["ended"] = trace_source_end_to_json(*s.ended);
    sources.push_back(std::move(js));
  }
  j["sources"] = std::move(sources);
  json domains = json::array();
  for (const auto& d : m.clock_domains) {
    domains.push_back({{"id", d.id}, {"name", d.name}, {"description", d.description}});
  }
  j["clock_domains"] = std::move(domains);
  if (!m.host_clocks.empty()) {
    json clocks = json::array();
    for (const auto& c : m.host_clocks)
      clocks.push_back({{"monotonic_ns", c.monotonic_ns},
                        {"realtime_ns", c.realtime_ns},
                        {"bracket_ns", c.bracket_ns},
                        {"synchronized", c.synchronized},
                        {"esterror_ns", c.esterror_ns},
                        {"maxerror_ns", c.maxerror_ns},
                        {"status", c.status},
                        {"tai_offset_s", c.tai_offset_s}});
    j["host_clocks"] = std::move(clocks);
  }
  if (!m.hosts.empty()) {
    json hosts = json::array();
    for (const auto& h : m.hosts) hosts.push_back(trace_host_to_json(h));
    j["hosts"] = std::move(hosts);
  }
  // Replace invalid UTF-8 rather than throw: names come from devices.
  return j.dump(-1, ' ', false, json::error_handler_t::replace);
}

Result<TraceMetadata> trace_metadata_from_json(const std::string& text) {
  json j = json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded() || !j.is_object()) {
    return Status(Errc::kCorrupt, "metadata is not a JSON object");
  }
  try {
    TraceMetadata m;
    m.host_name = j.value("host_name", "");
    m.machine_id = j.value("machine_id", "");
    m.boot_id = j.value("boot_id", "");
    m.kernel = j.value("kernel", "");
    m.cpu = j.value("cpu", "");
    m.perfq_version = j.value("perfq_version", "");
    if (j.contains("options"))
      m.options = j.at("options").get<std::map<std::string, std::string>>();
    if (j.contains("sources")) {
      for (const auto& js : j.at("sources")) {
        TraceSource s;
        s.id = js.at("id").get<uint16_t>();
        const std::string kind = js.value("kind", "host");
        s.kind = kind == "device"   ? TraceSourceKind::kDevice
                 : kind == "kernel" ? TraceSourceKind::kKernel
                                    : TraceSourceKind::kHost;
        s.name = js.value("name", "");
        s.pid = js.value("pid", 0u);
        s.pci_address = js.value("pci_address", "");
        s.link = js.value("link", "");
        s.clock_hz = js.value("clock_hz", uint64_t{0});
        s.timer_hz = js.value("timer_hz", uint64_t{0});
        if (js.contains("pci") && !js["pci"].is_null()) {
          auto pci = pci_device_from_json(js["pci"]);
          if (!pci)
            return Status(Errc::kCorrupt, "metadata: source " + std::to_string(s.id) + ": " +
                                              pci.status().message());
          s.pci = std::move(pci.value());
        }
        if (js.contains("events")) {
          for (const auto& je : js.at("events")) {
            s.events.push_back({je.at("event").get<uint32_t>(), je.at("kind").get<uint16_t>(),
                                je.at("name").get<std::string>(),
                                je.value("args", std::vector<std::string>{})});
          }
        }
        if (js.contains("threads")) {
          for (const auto& jt : js.at("threads"))
            s.threads.push_back({jt.at("stream").get<uint16_t>(), jt.at("tid").get<uint32_t>(),
                                 jt.value("name", "")});
        }
        s.host = js.value("host", uint16_t{0});
        if (js.contains("ended") && !js["ended"].is_null()) {
          const json& je = js.at("ended");
          s.ended = TraceSourceEnd{je.at("state").get<std::string>(),
                                   je.at("time_ns").get<int64_t>(), je.value("reason", "")};
        }
        m.sources.push_back(std::move(s));
      }
    }
    if (j.contains("host_clocks")) {
      for (const auto& jc : j.at("host_clocks"))
        m.host_clocks.push_back(
            {jc.at("monotonic_ns").get<int64_t>(), jc.at("realtime_ns").get<int64_t>(),
             jc.value("bracket_ns", int64_t{0}), jc.value("synchronized", false),
             jc.value("esterror_ns", int64_t{-1}), jc.value("maxerror_ns", int64_t{-1}),
             jc.value("status", 0), jc.value("tai_offset_s", 0)});
    }
    if (j.contains("hosts")) {
      for (const auto& jh : j.at("hosts"))
        m.hosts.push_back({jh.value("name", ""), jh.value("machine_id", ""),
                           jh.value("boot_id", ""), jh.value("kernel", ""), jh.value("file", ""),
                           jh.value("offset_ns", int64_t{0}),
                           jh.value("uncertainty_ns", int64_t{-1}), jh.value("alignment", "")});
    }
    if (j.contains("clock_domains")) {
      for (const auto& jd : j.at("clock_domains")) {
        m.clock_domains.push_back(
            {jd.at("id").get<uint16_t>(), jd.value("name", ""), jd.value("description", "")});
      }
    }
    return m;
  } catch (const json::exception& e) {
    return Status(Errc::kCorrupt, std::string("metadata: ") + e.what());
  }
}

const char* trace_source_kind_name(TraceSourceKind k) {
  switch (k) {
    case TraceSourceKind::kHost:
      return "host";
    case TraceSourceKind::kDevice:
      return "device";
    case TraceSourceKind::kKernel:
      return "kernel";
  }
  return "host";
}

const char* record_kind_name(uint16_t kind) {
  switch (kind) {
    case PERFQ_KIND_BEGIN:
      return "begin";
    case PERFQ_KIND_END:
      return "end";
    case PERFQ_KIND_INSTANT:
      return "instant";
    case PERFQ_KIND_COUNTER:
      return "counter";
    case PERFQ_KIND_LOST:
      return "lost";
    default:
      return "invalid";
  }
}

const char* chunk_type_name(uint16_t type) {
  switch (static_cast<ChunkType>(type)) {
    case ChunkType::kMetadata:
      return "metadata";
    case ChunkType::kRecords:
      return "records";
    case ChunkType::kSyncSamples:
      return "sync samples";
    case ChunkType::kClockModels:
      return "clock models";
    case ChunkType::kLoss:
      return "loss";
    case ChunkType::kEnd:
      return "end";
    case ChunkType::kWatermark:
      return "watermark";
  }
  return "unknown";
}

bool operator==(const TraceRecord& a, const TraceRecord& b) {
  return a.source == b.source && a.time_ns == b.time_ns && a.rec.index == b.rec.index &&
         a.rec.event == b.rec.event && a.rec.stream == b.rec.stream && a.rec.flags == b.rec.flags &&
         a.rec.time == b.rec.time && a.rec.arg == b.rec.arg && a.claim_ns == b.claim_ns &&
         a.conv == b.conv;
}

const char* trace_conversion_name(TraceConversion c) {
  switch (c) {
    case TraceConversion::kNone:
      return "none";
    case TraceConversion::kModel:
      return "daemon";
    case TraceConversion::kDevice:
      return "device";
    case TraceConversion::kForced:
      return "forced";
  }
  return "unknown";
}

uint32_t stored_claim(double claim_ns) {
  if (!(claim_ns >= 0) || claim_ns >= static_cast<double>(kClaimUnbounded)) return kClaimUnbounded;
  // Rounded up without libm's ceil() (a call for every converted record):
  // exact below 2^32.
  const auto whole = static_cast<uint32_t>(claim_ns);
  return static_cast<double>(whole) < claim_ns ? whole + 1 : whole;
}

bool operator==(const TraceSyncSample& a, const TraceSyncSample& b) {
  return a.source == b.source && a.round == b.round && a.host.before == b.host.before &&
         a.host.value == b.host.value && a.host.after == b.host.after &&
         a.device.before == b.device.before && a.device.value == b.device.value &&
         a.device.after == b.device.after && a.absent == b.absent;
}

std::vector<TraceSyncSample> trace_samples_of(uint16_t source, const SyncRound& r) {
  std::vector<TraceSyncSample> out;
  const size_t n = std::max(r.host.size(), r.device.size());
  out.reserve(n);
  for (size_t i = 0; i < n; ++i) {
    TraceSyncSample s;
    s.source = source;
    s.round = r.round;
    if (i < r.host.size())
      s.host = r.host[i];
    else
      s.absent |= TraceSyncSample::kNoHost;
    if (i < r.device.size())
      s.device = r.device[i];
    else
      s.absent |= TraceSyncSample::kNoDevice;
    out.push_back(s);
  }
  return out;
}

std::vector<SyncRound> sync_rounds_of(std::span<const TraceSyncSample> samples) {
  std::vector<SyncRound> rounds;
  for (const auto& x : samples) {
    if (rounds.empty() || rounds.back().round != x.round)
      rounds.push_back(SyncRound{x.round, {}, {}});
    if (x.has_host()) rounds.back().host.push_back(x.host);
    if (x.has_device()) rounds.back().device.push_back(x.device);
  }
  return rounds;
}

bool operator==(const TraceClockModel& a, const TraceClockModel& b) {
  return a.source == b.source && a.installed_ns == b.installed_ns &&
         a.model.device_ref == b.model.device_ref && a.model.host_ref_ns == b.model.host_ref_ns &&
         a.model.rate_ppb == b.model.rate_ppb && a.model.uncertainty_ns == b.model.uncertainty_ns &&
         a.model.valid_from_device == b.model.valid_from_device &&
         a.model.segment == b.model.segment && a.model.flags == b.model.flags;
}

TraceHostClock read_host_clock() {
  auto read = [](clockid_t id) {
    timespec ts{};
    clock_gettime(id, &ts);
    return int64_t{ts.tv_sec} * 1'000'000'000 + ts.tv_nsec;
  };
  TraceHostClock c;
  int64_t best = INT64_MAX;
  for (int i = 0; i < 8; ++i) {
    const int64_t m1 = read(CLOCK_MONOTONIC);
    const int64_t r = read(CLOCK_REALTIME);
    const int64_t m2 = read(CLOCK_MONOTONIC);
    if (m2 - m1 < best) {
      best = m2 - m1;
      c.monotonic_ns = m1 + (m2 - m1) / 2;
      c.realtime_ns = r;
      c.bracket_ns = m2 - m1;
    }
  }
  // Read only (modes 0): esterror and maxerror are in microseconds.
  timex tx{};
  const int state = adjtimex(&tx);
  if (state >= 0) {
    c.status = tx.status;
    c.synchronized = state != TIME_ERROR && (tx.status & STA_UNSYNC) == 0;
    c.esterror_ns = int64_t{tx.esterror} * 1000;
    c.maxerror_ns = int64_t{tx.maxerror} * 1000;
    c.tai_offset_s = tx.tai;
  }
  return c;
}

}  // namespace perfq
