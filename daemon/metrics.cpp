#include "metrics.h"

#include <prometheus/collectable.h>
#include <prometheus/exposer.h>
#include <prometheus/metric_family.h>

#include <spdlog/spdlog.h>
#include <nlohmann/json.hpp>

#include "daemon.h"

namespace perfqd {

using nlohmann::json;
using prometheus::ClientMetric;
using prometheus::MetricFamily;
using prometheus::MetricType;

namespace {

// The families of one scrape, by name, in the order first seen.
class Families {
 public:
  MetricFamily& family(const std::string& name, MetricType type, const std::string& help) {
    for (auto& f : out_)
      if (f.name == name) return f;
    out_.push_back(MetricFamily{name, help, type, {}});
    return out_.back();
  }
  void add(const std::string& name, MetricType type, const std::string& help,
           std::vector<ClientMetric::Label> labels, double value) {
    ClientMetric m;
    m.label = std::move(labels);
    if (type == MetricType::Counter)
      m.counter.value = value;
    else
      m.gauge.value = value;
    family(name, type, help).metric.push_back(std::move(m));
  }
  void counter(const std::string& name, const std::string& help,
               std::vector<ClientMetric::Label> labels, double value) {
    add(name, MetricType::Counter, help, std::move(labels), value);
  }
  void gauge(const std::string& name, const std::string& help,
             std::vector<ClientMetric::Label> labels, double value) {
    add(name, MetricType::Gauge, help, std::move(labels), value);
  }
  std::vector<MetricFamily> take() { return std::move(out_); }

 private:
  std::vector<MetricFamily> out_;
};

double num(const json& j, const char* key) {
  auto it = j.find(key);
  return it != j.end() && it->is_number() ? it->get<double>() : 0.0;
}

}  // namespace

std::vector<MetricFamily> metrics_from_status(const json& st) {
  Families f;
  const json& d = st.at("daemon");
  f.gauge("perfq_build_info", "perfq-daemon's version (the value is always 1)",
          {{"version", d.value("version", std::string())}}, 1);
  f.gauge("perfq_daemon_uptime_seconds", "Time since perfq-daemon started", {}, num(d, "uptime_s"));
  f.gauge("perfq_connected_applications", "Instrumented applications connected to the daemon", {},
          num(d, "apps"));

  // Counters: the daemon's totals since it started (stopped recordings plus
  // the running one), so they never go down between recordings.
  const json& t = st.at("totals");
  f.counter("perfq_recordings_total", "Recordings started", {}, num(t, "recordings"));
  f.counter("perfq_trace_records_total", "Records written to trace files", {}, num(t, "records"));
  f.counter("perfq_trace_bytes_total", "Bytes written to trace files", {}, num(t, "bytes"));
  const json devices = t.value("devices", json::object());
  for (const auto& [dev, c] : devices.items()) {
    f.counter("perfq_device_records_total", "Records drained from the device's shared queue",
              {{"device", dev}}, num(c, "records"));
    f.counter("perfq_device_bytes_total", "Bytes of records drained from the device",
              {{"device", dev}}, num(c, "bytes"));
    f.counter("perfq_records_lost_total",
              "Records lost, by reason: device (the device's queues or ring overflowed, or no "
              "clock model could convert them), app_ring (an application's ring was full)",
              {{"device", dev}, {"app", ""}, {"reason", "device"}}, num(c, "lost"));
    f.counter("perfq_device_records_invalid_total",
              "Records from the device that failed validation (bad kind, stream or index)",
              {{"device", dev}}, num(c, "invalid"));
    f.counter("perfq_sync_rounds_total", "Clock synchronization rounds", {{"device", dev}},
              num(c, "sync_rounds"));
    f.counter("perfq_sync_failed_rounds_total", "Clock synchronization rounds that failed",
              {{"device", dev}}, num(c, "sync_failed_rounds"));
  }
  const json apps = t.value("apps", json::object());
  for (const auto& [app, c] : apps.items()) {
    f.counter("perfq_app_records_total", "Records of instrumented applications", {{"app", app}},
              num(c, "records"));
    f.counter("perfq_app_bytes_total", "Bytes of records of instrumented applications",
              {{"app", app}}, num(c, "bytes"));
    f.counter("perfq_records_lost_total", "",
              {{"device", ""}, {"app", app}, {"reason", "app_ring"}}, num(c, "lost"));
  }

  // Gauges of the running recording.
  const json& rec = st.at("recording");
  f.gauge("perfq_recording", "1 while a recording runs, else 0", {}, rec.is_null() ? 0 : 1);
  if (!rec.is_null()) {
    f.gauge("perfq_writer_backlog_records",
            "Records in the merge, not yet written (waiting for the watermark)", {},
            num(rec.at("merge"), "pending"));
    f.gauge("perfq_recording_elapsed_seconds", "Time since the recording started", {},
            num(rec, "elapsed_s"));
    for (const auto& dv : rec.value("devices", json::array())) {
      const std::string dev = dv.value("device", std::string());
      f.gauge("perfq_device_state", "The device drain's state (the label whose value is 1)",
              {{"device", dev}, {"state", dv.value("state", std::string())}}, 1);
      f.gauge("perfq_device_ring_fill_records", "Records waiting in the device's shared queue",
              {{"device", dev}}, num(dv, "ring_fill"));
      f.gauge("perfq_device_ring_capacity_records", "Capacity of the device's shared queue",
              {{"device", dev}}, num(dv, "ring_capacity"));
      const json sync = dv.value("sync", json::object());
      f.gauge("perfq_sync_synchronized", "1 when a clock model converts the device's times",
              {{"device", dev}}, sync.value("synchronized", false) ? 1 : 0);
      if (sync.value("synchronized", false)) {
        f.gauge("perfq_sync_offset_seconds",
                "Device time minus host time (how far the device clock is ahead)",
                {{"device", dev}}, num(sync, "device_ahead_ns") / 1e9);
        f.gauge("perfq_sync_drift_ratio",
                "How much faster the device clock runs than the host's (1e-6 = 1 ppm)",
                {{"device", dev}}, num(sync, "device_fast_ppm") / 1e6);
        f.gauge("perfq_sync_uncertainty_seconds",
                "The bound the clock model claims for converted device times", {{"device", dev}},
                num(sync, "uncertainty_ns") / 1e9);
      }
    }
  }
  return f.take();
}

struct MetricsServer::Source : prometheus::Collectable {
  explicit Source(const Daemon& d) : daemon(d) {}
  // Runs on the exposer's thread: nothing may escape it.  A status that
  // cannot be translated is logged and served as no metrics (Prometheus'
  // `up` stays 1, the series go stale), never a daemon that dies.
  std::vector<MetricFamily> Collect() const override {
    try {
      return metrics_from_status(daemon.status());
    } catch (const std::exception& e) {
      spdlog::error("metrics: cannot translate the status: {}", e.what());
      return {};
    }
  }
  const Daemon& daemon;
};

perfq::Result<std::unique_ptr<MetricsServer>> MetricsServer::listen(const std::string& address,
                                                                    const Daemon& daemon) {
  std::unique_ptr<MetricsServer> s(new MetricsServer());
  s->source_ = std::make_shared<Source>(daemon);
  try {
    // One worker thread: scrapes are rare, and status() is cheap.
    s->exposer_ = std::make_unique<prometheus::Exposer>(address, 1);
  } catch (const std::exception& e) {
    return perfq::Status(perfq::Errc::kIo,
                         "--metrics " + address + ": cannot listen: " + std::string(e.what()));
  }
  s->exposer_->RegisterCollectable(s->source_);
  return s;
}

MetricsServer::~MetricsServer() = default;

int MetricsServer::port() const {
  const auto ports = exposer_->GetListeningPorts();
  return ports.empty() ? 0 : ports.front();
}

}  // namespace perfqd
