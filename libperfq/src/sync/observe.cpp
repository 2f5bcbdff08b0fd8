// make_observation(): one sync round -> one (D, H) observation, by the
// device SDK's perfq_sync_observe() (the one implementation: a device in
// mode B runs it too).
#include <fmt/format.h>

#include <vector>

#include "sync/robust_fit.h"
#include "sync/sync.h"

namespace perfq {

Status ClockRates::validate() const {
  if (device_hz == 0 || device_hz > PERFQ_CLOCK_HZ_MAX)
    return Status(Errc::kInvalidArgument, fmt::format("clock rates: device_hz {} outside 1..{}",
                                                      device_hz, PERFQ_CLOCK_HZ_MAX));
  if (timer_hz == 0 || timer_hz > PERFQ_CLOCK_HZ_MAX)
    return Status(Errc::kInvalidArgument, fmt::format("clock rates: timer_hz {} outside 1..{}",
                                                      timer_hz, PERFQ_CLOCK_HZ_MAX));
  return Status::ok();
}

Result<SyncObservation> make_observation(std::span<const perfq_clock_sample> host,
                                         std::span<const perfq_clock_sample> device,
                                         const ClockRates& rates, const SelectionConfig& sel,
                                         uint32_t round) {
  if (Status s = rates.validate(); !s) return s;
  thread_local std::vector<perfq_sync_cand> scratch;
  scratch.resize(host.size() + device.size());
  const perfq_sync_rates r = sync_fit::to_c(rates);
  const perfq_sync_selection cs = sync_fit::to_c(sel);
  perfq_sync_obs o{};
  double gap_ns = 0;
  switch (perfq_sync_observe(host.data(), static_cast<uint32_t>(host.size()), device.data(),
                             static_cast<uint32_t>(device.size()), &r, &cs, round, scratch.data(),
                             &o, &gap_ns)) {
    case PERFQ_SYNC_OBS_OK:
      return sync_fit::from_c(o);
    case PERFQ_SYNC_OBS_NO_HOST:
      return Status(
          Errc::kInvalidArgument,
          fmt::format("sync round {}: no usable host sample among {}", round, host.size()));
    case PERFQ_SYNC_OBS_NO_DEVICE:
      return Status(
          Errc::kInvalidArgument,
          fmt::format("sync round {}: no usable device sample among {}", round, device.size()));
    case PERFQ_SYNC_OBS_PAIRING:
      return Status(Errc::kInvalidArgument,
                    fmt::format("sync round {}: device timer reads are {:.0f} ns away from the "
                                "host's: not the same round",
                                round, gap_ns));
    default:
      return Status(Errc::kInvalidArgument,
                    fmt::format("sync round {}: invalid clock rates", round));
  }
}

}  // namespace perfq
