// The online fit: ClockSync (the robust fit and step detection as rounds
// come), RoundGate and mode B's DeviceClockSync.
#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include <fmt/format.h>

#include "sync/robust_fit.h"
#include "sync/sync.h"
#include "sync/sync_buffer.h"

namespace perfq {

using namespace sync_fit;

// ---- ClockSync ----------------------------------------------------------------------------
// The tracker itself is the device SDK's perfq_sync_online (the one a device
// in mode B runs); the history of models is kept here, through its hooks.

ClockSync::ClockSync(const ClockRates& rates, const SyncConfig& cfg)
    : rates_(rates), cfg_(cfg), c_(std::make_unique<perfq_sync_online>()) {
  if (cfg_.window < 2) cfg_.window = 2;
  if (cfg_.window > PERFQ_SYNC_WINDOW_MAX) cfg_.window = PERFQ_SYNC_WINDOW_MAX;
  const perfq_sync_rates r = to_c(rates_);
  const perfq_sync_config c = to_c(cfg_);
  perfq_sync_online_init(c_.get(), &r, &c, nullptr);
  bind();
}

ClockSync::ClockSync(const ClockSync& o)
    : rates_(o.rates_),
      cfg_(o.cfg_),
      c_(std::make_unique<perfq_sync_online>(*o.c_)),
      current_(o.current_),
      knots_total_(o.knots_total_),
      history_(o.history_) {
  bind();
}

ClockSync& ClockSync::operator=(const ClockSync& o) {
  if (this != &o) *this = ClockSync(o);
  return *this;
}

ClockSync::ClockSync(ClockSync&& o) noexcept
    : rates_(o.rates_),
      cfg_(o.cfg_),
      c_(std::move(o.c_)),
      current_(o.current_),
      knots_total_(o.knots_total_),
      history_(std::move(o.history_)) {
  bind();
}

ClockSync& ClockSync::operator=(ClockSync&& o) noexcept {
  rates_ = o.rates_;
  cfg_ = o.cfg_;
  c_ = std::move(o.c_);
  current_ = o.current_;
  knots_total_ = o.knots_total_;
  history_ = std::move(o.history_);
  bind();
  return *this;
}

void ClockSync::bind() noexcept {
  c_->hist = perfq_sync_history{on_open, on_close, on_drop, on_knot, on_observed, this};
}

void ClockSync::on_open(void* ctx, uint32_t id, uint64_t valid_from) {
  PiecewiseModel::Segment s;
  s.id = id;
  s.valid_from = valid_from;
  static_cast<ClockSync*>(ctx)->history_.mutable_segments().push_back(std::move(s));
}

void ClockSync::on_close(void* ctx, uint64_t valid_until) {
  static_cast<ClockSync*>(ctx)->history_.mutable_segments().back().valid_until = valid_until;
}

void ClockSync::on_drop(void* ctx) {
  auto* self = static_cast<ClockSync*>(ctx);
  auto& segs = self->history_.mutable_segments();
  self->knots_total_ -= std::min(self->knots_total_, segs.back().knots.size());
  segs.pop_back();
}

void ClockSync::on_observed(void* ctx, uint64_t host_ns) {
  auto& seg = static_cast<ClockSync*>(ctx)->history_.mutable_segments().back();
  if (seg.first_host == 0) seg.first_host = host_ns;
  seg.last_host = std::max(seg.last_host, host_ns);
}

void ClockSync::on_knot(void* ctx, const perfq_sync_line* m) {
  if (!m->valid) return;  // no clock (perfq_sync_knot_from()): nothing converts with it
  auto* self = static_cast<ClockSync*>(ctx);
  auto& segs = self->history_.mutable_segments();
  segs.back().knots.push_back(from_c(*m));
  if (++self->knots_total_ <= self->cfg_.max_history) return;
  // Drop the oldest eighth of the history.
  size_t drop = std::max<size_t>(1, self->cfg_.max_history / 8);
  while (drop > 0 && !segs.empty()) {
    auto& k = segs.front().knots;
    const size_t n = std::min(drop, k.size());
    k.erase(k.begin(), k.begin() + static_cast<std::ptrdiff_t>(n));
    self->knots_total_ -= n;
    drop -= n;
    if (k.empty() && segs.size() > 1)
      segs.erase(segs.begin());
    else if (k.empty())
      break;
  }
}

ClockSync::Verdict ClockSync::after(perfq_sync_verdict v) {
  current_ = from_c(c_->current);
  return from_c(v);
}

const char* verdict_name(ClockSync::Verdict v) {
  switch (v) {
    case ClockSync::Verdict::kAccepted:
      return "accepted";
    case ClockSync::Verdict::kRejected:
      return "rejected";
    case ClockSync::Verdict::kOutlier:
      return "outlier";
    case ClockSync::Verdict::kStepPending:
      return "step pending";
    case ClockSync::Verdict::kNewSegment:
      return "new segment";
    case ClockSync::Verdict::kInvalid:
      return "invalid";
  }
  return "?";
}

ClockSync::Verdict ClockSync::add(const SyncObservation& obs) {
  const perfq_sync_obs o = to_c(obs);
  return after(perfq_sync_online_add(c_.get(), &o));
}

ClockSync::Verdict ClockSync::witness(const SyncObservation& obs) {
  const perfq_sync_obs o = to_c(obs);
  return after(perfq_sync_online_witness(c_.get(), &o));
}

// ---- RoundGate ---------------------------------------------------------------------------

RoundGate::RoundGate(const GateConfig& cfg) {
  const perfq_sync_gate_config g = to_c(cfg);
  perfq_sync_gate_init(&g_, &g);
}

ClockSync::Verdict RoundGate::feed(ClockSync& sync, const SyncObservation& obs) {
  const perfq_sync_obs o = to_c(obs);
  return sync.after(perfq_sync_gate_feed(&g_, sync.c_.get(), &o));
}

// ---- Mode B ------------------------------------------------------------------------------

DeviceClockSync::DeviceClockSync(const ClockRates& rates, const SyncConfig& cfg,
                                 const SelectionConfig& sel, const GateConfig& gate)
    : sync_(rates, cfg), sel_(sel), gate_(gate) {}

Result<ClockSync::Verdict> DeviceClockSync::update(
    std::span<const perfq_clock_sample> host_samples,
    std::span<const perfq_clock_sample> device_samples, uint32_t round) {
  auto o = make_observation(host_samples, device_samples, sync_.rates(),
                            selection_for(sel_, sync_.current(), sync_.rates()), round);
  if (!o) return o.status();
  return add(o.value());
}

Result<ClockSync::Verdict> DeviceClockSync::update_from_page(
    const perfq_sync_page* page, std::span<const perfq_clock_sample> device_samples,
    uint32_t round) {
  auto b = read_sample_batch(&page->mailbox);
  if (!b) return b.status();
  if (b->round != round)
    return Status(
        Errc::kUnavailable,
        fmt::format("mailbox holds round {}, device samples are of round {}", b->round, round));
  return update(b->samples, device_samples, round);
}

ClockSync::Verdict DeviceClockSync::add(const SyncObservation& obs) {
  return gate_.feed(sync_, obs);
}

uint64_t DeviceClockSync::to_host(uint64_t device_time) const {
  return sync_.has_model() ? sync_.current().to_host(device_time) : device_time;
}

bool DeviceClockSync::convert_record(perfq_record* r) const {
  // The SDK's rule, the one a device in mode B applies (perfq_device.h).
  return perfq_sync_convert_record(sync_.c_.get(), &gate_.g_, r);
}

}  // namespace perfq
