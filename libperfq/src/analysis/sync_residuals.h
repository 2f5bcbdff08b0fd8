// How each sync round of a device lands against the clock model in force
// when it was taken: the report's timeline (analyzer.cpp) and the Perfetto
// export's counter tracks (export/perfetto.cpp) both show it, from here.
// Internal to analysis/.
#pragma once

#include <cstdint>
#include <deque>
#include <map>
#include <optional>
#include <span>
#include <utility>
#include <vector>

#include "perfq/trace.h"
#include "sync/sync.h"

namespace perfq::analysis {

// A device's nominal rates as its trace source declares them (an old trace
// without a timer rate: the clock's; without either: 1 GHz).
inline ClockRates rates_of(const TraceSource* src) {
  ClockRates r;
  if (src && src->clock_hz) r.device_hz = src->clock_hz;
  r.timer_hz = src && src->timer_hz ? src->timer_hz : r.device_hz;
  return r;
}

struct RoundResidual {
  uint16_t source = 0;
  uint32_t round = 0;
  int64_t time_ns = 0;  // host time of the round's first host sample
  bool failed = false;  // the samples gave no observation (make_observation())
  // Observed host time minus the model's, ns: where the round gave an
  // observation and a model was in force.
  std::optional<double> residual_ns;
};

// Feed it the trace's clock models and sync samples in file order.
class SyncResiduals {
 public:
  void on_model(const TraceClockModel& m) {
    auto cm = ClockModel::from_abi(m.model);
    if (!cm || !cm->valid) return;
    auto& recent = recent_[m.source];
    recent.emplace_back(m.installed_ns, *cm);
    if (recent.size() > kRecentModels) recent.pop_front();
  }

  // The rounds among `samples` (one chunk; rounds without a host sample
  // have no host time and are left out), each made into an observation as
  // the sync code makes it, with the selection of the model in force: the
  // newest installed before the round (not the one the round itself gave).
  std::vector<RoundResidual> rounds(std::span<const TraceSyncSample> samples,
                                    const TraceMetadata& meta) const {
    std::map<uint16_t, std::vector<TraceSyncSample>> by_source;
    for (const auto& x : samples) by_source[x.source].push_back(x);
    std::vector<RoundResidual> out;
    for (const auto& [src, list] : by_source) {
      const ClockRates rates = rates_of(meta.find_source(src));
      const auto it = recent_.find(src);
      for (const SyncRound& round : sync_rounds_of(list)) {
        if (round.host.empty()) continue;
        RoundResidual rr;
        rr.source = src;
        rr.round = round.round;
        rr.time_ns = static_cast<int64_t>(round.host.front().before);
        const ClockModel* model = nullptr;
        if (it != recent_.end())
          for (const auto& [installed, m] : it->second)
            if (installed <= rr.time_ns) model = &m;
        const SelectionConfig sel =
            model ? selection_for(SelectionConfig{}, *model, rates) : SelectionConfig{};
        auto obs = make_observation(round.host, round.device, rates, sel, round.round);
        rr.failed = !obs.is_ok();
        if (obs.is_ok() && model)
          rr.residual_ns =
              static_cast<double>(time_diff(obs->host_ns, model->to_host(obs->device_time)));
        out.push_back(rr);
      }
    }
    return out;
  }

 private:
  static constexpr size_t kRecentModels = 8;
  std::map<uint16_t, std::deque<std::pair<int64_t, ClockModel>>> recent_;
};

}  // namespace perfq::analysis
