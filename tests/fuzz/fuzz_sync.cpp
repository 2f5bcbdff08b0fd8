// libFuzzer: a device's sync samples, as hostile as a device may make them
// (the host never trusts values read from the device).  The input is:
//   16 bytes  the region's declared device_clock_hz and timer_hz (u64 each)
//   then rounds: 2 bytes (host samples, device samples, each mod 65), then
//   that many perfq_clock_samples (32 bytes each) of each side.
// The samples go where a device's go: through the host's selection
// (make_observation), the online gate and tracker (RoundGate, ClockSync:
// mode A's model), mode B's device-side tracker (DeviceClockSync), the
// offline re-fit of the whole recording (fit_offline_rounds), and the
// SYNC page's seqlocked batch and model as a device would publish them
// (read_sample_batch, read_clock_model).  Every model that comes out must
// claim a bound that is a number (never NaN, never negative), and its ABI
// form must read back.
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "sync/sync.h"
#include "sync/sync_buffer.h"

namespace {

void check_model(const perfq::ClockModel& m, uint64_t d) {
  if (!m.valid) return;
  const double claim = m.claim_at(d);
  if (std::isnan(claim) || claim < 0) std::abort();
  (void)m.to_host(d);
  (void)m.vouches(d, 1000);
  if (!perfq::ClockModel::from_abi(m.to_abi()).is_ok()) std::abort();
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 16) return 0;
  perfq::ClockRates rates;
  std::memcpy(&rates.device_hz, data, 8);
  std::memcpy(&rates.timer_hz, data + 8, 8);
  if (!rates.validate().is_ok()) rates = perfq::ClockRates{};  // what the region check enforces
  size_t pos = 16;

  perfq::ClockSync host(rates);
  perfq::RoundGate gate;
  perfq::DeviceClockSync device(rates);
  std::vector<perfq::SyncRound> rounds;
  // The SYNC page: the device's last batch and the host's mailbox, as the
  // bytes of the input left them.
  static perfq_sync_page page;
  std::memset(&page, 0, sizeof page);
  std::memcpy(&page, data, std::min(size, sizeof page));
  (void)perfq::read_sample_batch(&page.device_samples, 4);
  (void)perfq::read_clock_model(&page, 4);

  uint32_t round = 0;
  uint64_t last_d = 0;
  while (pos + 2 <= size && rounds.size() < 64) {
    const size_t nh = data[pos] % (PERFQ_SYNC_MAX_SAMPLES + 1);
    const size_t nd = data[pos + 1] % (PERFQ_SYNC_MAX_SAMPLES + 1);
    pos += 2;
    const size_t need = (nh + nd) * sizeof(perfq_clock_sample);
    if (size - pos < need) break;
    perfq::SyncRound r;
    r.round = ++round;
    r.host.resize(nh);
    r.device.resize(nd);
    if (nh) std::memcpy(r.host.data(), data + pos, nh * sizeof(perfq_clock_sample));
    pos += nh * sizeof(perfq_clock_sample);
    if (nd) std::memcpy(r.device.data(), data + pos, nd * sizeof(perfq_clock_sample));
    pos += nd * sizeof(perfq_clock_sample);

    auto obs = perfq::make_observation(r.host, r.device, rates, {}, r.round);
    if (obs.is_ok()) {
      if (std::isnan(obs->uncertainty_ns) || obs->uncertainty_ns < 0) std::abort();
      (void)gate.feed(host, *obs);
      last_d = obs->device_time;
      if (host.has_model()) {
        check_model(host.current(), last_d);
        (void)host.to_host(last_d);
      }
    }
    (void)device.update(r.host, r.device, r.round);
    if (!r.device.empty()) {
      perfq_record rec{};
      rec.flags = PERFQ_FLAGS(PERFQ_KIND_INSTANT, PERFQ_CLOCK_DEVICE);
      rec.time = r.device[0].value;
      (void)device.convert_record(&rec);
    }
    // The device publishes its batch in the page; the host reads it back.
    perfq::write_sample_batch(&page.device_samples, r.round, r.device);
    auto back = perfq::read_sample_batch(&page.device_samples);
    if (!back.is_ok() || back->samples.size() != r.device.size()) std::abort();
    rounds.push_back(std::move(r));
  }
  if (!rounds.empty()) {
    const perfq::OfflineFit fit = perfq::fit_offline_rounds(rounds, rates);
    if (!fit.model.empty()) (void)fit.model.to_host(last_d);
  }
  return 0;
}
