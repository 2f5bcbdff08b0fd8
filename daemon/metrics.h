// perfq-daemon's Prometheus endpoint (--metrics ADDR:PORT): prometheus-cpp's
// pull exposer serves http://ADDR:PORT/metrics in the Prometheus text
// format.  Each scrape translates Daemon::status() (what `perfqctl status`
// prints; the one place that computes the figures) into metric families, so
// the record path is untouched and a scrape costs one status().
//
// Threading: the exposer's own threads call Collect(); the Daemon outlives
// the MetricsServer.  Read-only: only GET /metrics is served.
#pragma once

#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "perfq/status.h"

namespace prometheus {
class Exposer;
struct MetricFamily;
}  // namespace prometheus

namespace perfqd {

class Daemon;

// The metric families of one status() reply (exposed for the tests).
std::vector<prometheus::MetricFamily> metrics_from_status(const nlohmann::json& status);

class MetricsServer {
 public:
  // Listens on `address` (ADDR:PORT; port 0 picks one); fails with the
  // reason when it cannot.
  static perfq::Result<std::unique_ptr<MetricsServer>> listen(const std::string& address,
                                                              const Daemon& daemon);
  ~MetricsServer();
  // The port listened on (the one picked when asked for 0).
  int port() const;

 private:
  MetricsServer() = default;
  struct Source;
  std::shared_ptr<Source> source_;
  std::unique_ptr<prometheus::Exposer> exposer_;
};

}  // namespace perfqd
