// The online converter of device times (sync/online_convert.h).
#include "sync/online_convert.h"

#include <algorithm>
#include <array>
#include <bit>
#include <cmath>
#include <iterator>
#include <limits>

#include "sync/robust_fit.h"

namespace perfq {

namespace {

bool device_domain(const perfq_record& r) {
  return PERFQ_FLAGS_DOMAIN(r.flags) == PERFQ_CLOCK_DEVICE;
}

// Mode B's lines kept (ids), and the most a read may have been converted
// with (a device publishes one a round: a read spans more only when the
// drain stalled for rounds).
constexpr size_t kMaxLines = 64;
constexpr uint64_t kMaxLineCandidates = PERFQ_SYNC_LINES;

// The lines of `ids` a record may have been converted with, [*lo, *hi]:
// false when they are not known (none published, or more than a read
// could have used).
bool candidate_lines(const LineIds& ids, uint64_t* lo, uint64_t* hi) {
  *lo = std::max<uint64_t>(ids.lo, 1);
  *hi = ids.hi;
  return *hi != 0 && *hi >= *lo && *hi - *lo < kMaxLineCandidates;
}

// The device time a line put at host time t (the line's inverse, within a
// tick: the device rounded its product to a nanosecond).
uint64_t device_time_at(const perfq_sync_line& l, uint64_t t) {
  const long double dx =
      (static_cast<long double>(time_diff(t, l.host_ref)) - l.host_frac) / l.ns_per_tick;
  const long double lim = 9.0e18L;
  const auto ticks = static_cast<int64_t>(std::llround(std::clamp(dx, -lim, lim)));
  return l.device_ref + static_cast<uint64_t>(ticks);
}

}  // namespace

std::shared_ptr<const ConversionModel> ConversionModel::after_round(
    std::shared_ptr<const ConversionModel> prev, const ClockSync& sync, const RoundGate& gate,
    ClockSync::Verdict v, const SyncObservation& obs, double horizon_s) {
  if (!sync.has_model()) return prev;
  if (taken_into_model(v)) {
    const auto horizon =
        static_cast<uint64_t>(horizon_s * static_cast<double>(sync.rates().device_hz));
    const uint64_t d = obs.device_time;
    return std::make_shared<const ConversionModel>(ConversionModel{
        sync.current(), sync.history().recent(d > horizon ? d - horizon : 0), d,
        static_cast<int64_t>(obs.host_ns), gate.taken(), gate.tight_ns(), sync.contradicted()});
  }
  if (sync.contradicted() && prev && !prev->contradicted) {
    auto c = std::make_shared<ConversionModel>(*prev);
    c->contradicted = true;
    return c;
  }
  return prev;
}

OnlineConverter::OnlineConverter(Options o)
    : o_(std::move(o)),
      back_step_ticks_(
          static_cast<int64_t>(o_.back_step_ns * static_cast<double>(o_.device_clock_hz) / 1e9) +
          1) {}

OnlineConverter::Read OnlineConverter::read_state(const ConversionModel* m, int64_t read_ns,
                                                  LineIds lines) {
  return {read_ns, m ? m->current.segment : 0, m && m->contradicted, lines};
}

void OnlineConverter::add_device_line(const perfq_sync_line_pub& l) {
  DeviceLine& k = lines_[l.id];
  k.line = {};
  k.line.device_ref = l.device_ref;
  k.line.host_ref = l.host_ref_ns;
  k.line.host_frac = std::bit_cast<double>(l.host_frac);
  k.line.ns_per_tick = std::bit_cast<double>(l.ns_per_tick);
  k.line.valid = true;
  // Untrusted: a rate a clock of the declared frequency could have.
  const double nominal = 1e9 / static_cast<double>(o_.device_clock_hz);
  k.usable = std::isfinite(k.line.host_frac) && k.line.host_frac >= 0 && k.line.host_frac <= 1 &&
             std::isfinite(k.line.ns_per_tick) && k.line.ns_per_tick >= 0.5 * nominal &&
             k.line.ns_per_tick <= 2 * nominal;
  while (lines_.size() > kMaxLines) lines_.erase(lines_.begin());
}

void OnlineConverter::emit(const TraceRecord& tr, StreamClock& sc, std::vector<TraceRecord>& out) {
  if (device_domain(tr.rec) && PERFQ_FLAGS_KIND(tr.rec.flags) != PERFQ_KIND_LOST)
    sc.last_host = std::max(sc.last_host, tr.time_ns);
  out.push_back(tr);
}

uint64_t OnlineConverter::feed(std::span<const perfq_record> batch, const ConversionModel* m,
                               int64_t now, int64_t read_ns, std::vector<TraceRecord>& out,
                               LineIds lines) {
  by_current_ = {};  // its model may be another at the same address
  const Read rs = read_state(m, read_ns, lines);
  bool read_kept = false;  // rs is in reads_ (a record of this read waits)
  uint64_t dropped = 0;
  StreamClock* sc = nullptr;
  for (const auto& r : batch) {
    // Batches come stream by stream: look the stream up once per run.
    if (!sc || sc->id != r.stream) {
      sc = &streams_[r.stream];
      sc->id = r.stream;
    }
    TraceRecord tr;
    const uint32_t epoch = epoch_of(r, *sc, m);
    // In stream order: behind a waiting record of its stream, a record waits.
    if (sc->waiting.empty() && convert(r, *sc, epoch, m, false, rs, &tr)) {
      emit(tr, *sc, out);
    } else if (waiting_ < o_.max_waiting) {
      if (waiting_ == 0) held_since_ = now;
      if (!read_kept) {
        reads_.push_back(rs);
        read_kept = true;
      }
      sc->waiting.push_back({r, static_cast<uint32_t>(reads_base_ + reads_.size() - 1), epoch});
      ++waiting_;
    } else {
      ++dropped;
    }
  }
  return dropped;
}

bool OnlineConverter::release(const std::shared_ptr<const ConversionModel>& m, int64_t now,
                              std::vector<TraceRecord>& out, size_t max_out) {
  by_current_ = {};  // its model may be another at the same address
  if (!m || waiting_ == 0) return true;
  // The oldest waiting record (each stream's are in arrival order).
  int64_t oldest = INT64_MAX;
  for (const auto& [id, sc] : streams_)
    if (!sc.waiting.empty()) oldest = std::min(oldest, read_of(sc.waiting.front()).read_ns);
  const bool stale = now - held_since_ > o_.stale_model_ns;
  const bool waited_long = now - oldest > o_.max_wait_ns;
  if (m == held_model_ && !stale && !waited_long) return true;
  // Per stream, what the model converts is a prefix of what waits (covered
  // by a round, in time order): a model every 10 ms while a million records
  // wait does not go through all of them.
  size_t n = 0;
  for (auto& [id, sc] : streams_) {
    while (!sc.waiting.empty()) {
      if (n >= max_out) {
        prune_reads();
        return false;
      }
      TraceRecord tr;
      const Held& f = sc.waiting.front();
      const Read& rs = read_of(f);
      if (!convert(f.rec, sc, f.epoch, m.get(), stale || now - rs.read_ns > o_.max_wait_ns, rs,
                   &tr))
        break;
      emit(tr, sc, out);
      ++n;
      sc.waiting.pop_front();
      --waiting_;
    }
  }
  held_model_ = m;
  held_since_ = now;
  prune_reads();
  return true;
}

void OnlineConverter::prune_reads() {
  // Each stream waits in read order: the oldest read referred to is at
  // some stream's front.
  uint32_t keep_from = static_cast<uint32_t>(reads_.size());
  for (const auto& [id, sc] : streams_)
    if (!sc.waiting.empty())
      keep_from = std::min(keep_from, static_cast<uint32_t>(sc.waiting.front().read -
                                                            static_cast<uint32_t>(reads_base_)));
  reads_.erase(reads_.begin(), reads_.begin() + keep_from);
  reads_base_ += keep_from;
}

size_t OnlineConverter::finish(const ConversionModel* m, std::vector<TraceRecord>& out) {
  by_current_ = {};  // its model may be another at the same address
  size_t left = 0;
  for (auto& [id, sc] : streams_) {
    std::deque<Held> keep;
    for (const auto& h : sc.waiting) {
      TraceRecord tr;
      // What a round after it covers converts as it would have; the rest
      // with the model there is (kForced, with its claim); mode B's times
      // without a model as the device gave them, unbounded.
      if (convert(h.rec, sc, h.epoch, m, false, read_of(h), &tr) ||
          convert(h.rec, sc, h.epoch, m, true, read_of(h), &tr)) {
        emit(tr, sc, out);
      } else {
        keep.push_back(h);
      }
    }
    sc.waiting.swap(keep);
    left += sc.waiting.size();
  }
  waiting_ = left;
  prune_reads();
  return left;
}

bool OnlineConverter::covers_waiting(const ConversionModel& m) const {
  if (m.rounds < kMinModelRounds) return false;
  // Each stream's newest device time and newest host time (mode B) are the
  // last of their kind in its queue (epochs: the last is the newest).
  for (const auto& [id, sc] : streams_) {
    bool device = false, host = false;
    for (auto it = sc.waiting.rbegin(); it != sc.waiting.rend() && !(device && host); ++it) {
      if (device_domain(it->rec) && !device) {
        device = true;
        if (time_diff(m.covered_device, it->rec.time) < 0) return false;
      } else if (!device_domain(it->rec) && !host) {
        host = true;
        if (static_cast<int64_t>(it->rec.time) > m.covered_host) return false;
        // And the device times behind it, as the lines it may have been
        // converted with put them (device_claim() waits for those too).
        uint64_t lo = 0, hi = 0;
        if (!candidate_lines(read_of(*it).lines, &lo, &hi)) continue;
        for (uint64_t id = lo; id <= hi; ++id) {
          const auto l = lines_.find(id);
          if (l != lines_.end() && l->second.usable &&
              time_diff(m.covered_device, device_time_at(l->second.line, it->rec.time)) < 0)
            return false;
        }
      }
    }
  }
  return true;
}

int64_t OnlineConverter::waiting_bound(const ConversionModel* m, int64_t grace_ns) const {
  int64_t bound = INT64_MAX;
  // A waiting device time will land near where the model puts it (less
  // the device latency, for what the model does not know); mode B's host
  // times where the device put them.  Each stream's oldest is its first.
  for (const auto& [id, sc] : streams_) {
    if (sc.waiting.empty()) continue;
    const perfq_record& r = sc.waiting.front().rec;
    if (!device_domain(r)) {
      bound = std::min(bound, static_cast<int64_t>(r.time) - grace_ns);
    } else if (!m) {
      return INT64_MIN;
    } else {
      bound = std::min(bound, static_cast<int64_t>(m->history.to_host(r.time)) - grace_ns);
    }
  }
  return bound;
}

// The stream's epoch for r (see convert()): a device-clock record more
// than back_step_ns earlier than its stream's newest opens the next
// epoch.  LOST records carry the time of their newest drop, which may
// precede records still queued: they neither open nor move an epoch.
uint32_t OnlineConverter::epoch_of(const perfq_record& r, StreamClock& sc,
                                   const ConversionModel* m) {
  if (!device_domain(r) || PERFQ_FLAGS_KIND(r.flags) == PERFQ_KIND_LOST) return sc.epoch;
  if (sc.seen && time_diff(r.time, sc.last) < -back_step_ticks_) {
    const int64_t jump = time_diff(sc.last, r.time);
    ++sc.epoch;
    sc.last = r.time;
    if (epoch_floor_.size() <= sc.epoch) {
      // Segments from the next one on are this epoch's.
      epoch_floor_.push_back(m && !m->history.empty() ? m->history.segments().back().id + 1 : 0);
      if (o_.on_back_step) o_.on_back_step(r.stream, jump);
    }
  } else if (!sc.seen || time_diff(r.time, sc.last) > 0) {
    sc.last = r.time;
  }
  sc.seen = true;
  return sc.epoch;
}

namespace {

int64_t host_time(const ClockModel& k, uint64_t d) { return static_cast<int64_t>(k.to_host(d)); }

}  // namespace

OnlineConverter::ByCurrent& OnlineConverter::by_current(const ConversionModel& m) const {
  ByCurrent& c = by_current_;
  if (c.m != &m) {
    c = {};
    c.m = &m;
    c.current = sync_fit::to_c(m.current);
    c.rate_k = 3 * m.current.rate_sigma_ppb * 1e-9;
  }
  return c;
}

// What the current model may claim at r.time, a time behind its newest
// round, given the model of then: the current model's claim takes its
// rounds' errors for independent, and rounds that were loose the same way
// (a busy machine preempts the reads alike, each late by half its bracket)
// lean its rate with them, seconds from its newest rounds, beyond its 3
// sigma (the accuracy suite, mode B on a loaded machine: 287 us off under a
// claim of 201 us).  The model that was current at the time (the knot at or
// before it, or the segment's first) vouches for its own reference by the
// rounds up to it, within its uncertainty there, whatever its rate: the
// current model is off there by at most their distance plus that, and from
// there to the time (a round's interval) by its rate's 3 sigma over the
// way.  The larger of this and the current model's own claim is true if
// either is.
double OnlineConverter::claim_by_then(const perfq_record& r, const ConversionModel& m) const {
  ByCurrent& c = by_current(m);
  if (r.time < c.then_from || r.time > c.then_until) {
    c.then = m.history.knot_for(r.time, m.current.segment, &c.then_from, &c.then_until);
    if (c.then == nullptr) {  // no history: no knot for any time
      c.then_from = 0;
      c.then_until = UINT64_MAX;
    }
    const ClockModel& then = c.then ? *c.then : ClockModel{};
    c.then_bounds = then.valid && stored_claim(then.uncertainty_ns) != kClaimUnbounded;
    if (c.then_bounds) {
      const double apart = std::fabs(static_cast<double>(host_time(m.current, then.device_ref) -
                                                         host_time(then, then.device_ref)));
      c.then_base = apart + then.uncertainty_ns;
      c.then_line = sync_fit::to_c(then);
    }
  }
  if (!c.then_bounds) return 0;
  return c.then_base + c.rate_k * perfq_sync_line_distance_ns(&c.then_line, r.time);
}

// convert() with one segment, or none of the record's epoch yet: the
// device clock went back and no round has seen where to (`unseen_step`;
// forced: the newest, with no bound, for the model is known not to hold
// there).
bool OnlineConverter::convert_by_current(const perfq_record& r, const ConversionModel& m,
                                         bool force, bool unseen_step, TraceRecord* out) const {
  if (unseen_step && !force) return false;
  // Beyond the newest round (most records, when they are first seen: no
  // claim to compute), or covered by a model looser than this device's
  // good rounds make it (fitted while the first rounds were loose): wait
  // for a round that covers or tightens it.
  const bool beyond = time_diff(m.covered_device, r.time) < 0;
  if (!force && beyond) return false;
  const perfq_sync_line& current = by_current(m).current;
  double claim = perfq_sync_line_claim(&current, r.time);  // m.current.claim_at()
  if (!force && claim > m.tight_ns) return false;
  out->time_ns = static_cast<int64_t>(perfq_sync_line_to_host(&current, r.time));
  if (!beyond) claim = std::max(claim, claim_by_then(r, m));
  // Forced past the newest round, no round saw the time: a step there
  // would be unseen, so there is no bound to claim.
  out->claim_ns = unseen_step || beyond ? kClaimUnbounded : stored_claim(claim);
  out->conv = force ? TraceConversion::kForced : TraceConversion::kModel;
  return true;
}

namespace {

// The segments that may hold a device time, with the host time each puts
// it at (convert(), "Around a step").
struct SegmentCand {
  int64_t t;
  double claim;
  int cls;     // 2: in order and not after the read, 1: not after the read, 0: neither
  size_t seg;  // index in segs
};
struct SegmentCands {
  std::array<SegmentCand, 8> cand{};
  size_t n = 0;
  int best_cls = -1;
};

// The candidates among the newest segments of epoch [lo, hi] for time
// r.time of a stream whose previous record converted to `last_host` and
// that was read at `read_ns` (INT64_MAX: unknown).
SegmentCands segment_candidates(const perfq_record& r, const ConversionModel& m, uint32_t lo,
                                uint32_t hi, int64_t last_host, int64_t read_ns) {
  const PiecewiseModel& h = m.history;
  const auto& segs = h.segments();
  // A stream's times run forward: not before its previous record (less a
  // microsecond of model noise).
  const int64_t not_before = last_host != INT64_MIN ? last_host - 1000 : INT64_MIN;
  SegmentCands c;
  const size_t first = segs.size() > c.cand.size() ? segs.size() - c.cand.size() : 0;
  for (size_t i = first; i < segs.size(); ++i) {
    const auto& sg = segs[i];
    if (sg.knots.empty() || sg.id < lo || sg.id > hi) continue;
    const ClockModel k = h.model_at(r.time, sg.id);
    const int64_t t = host_time(k, r.time);
    // An older model's rate may be its prior's (a segment of one round):
    // the current model's says how far off it is.
    const double claim = k.claim_at(r.time, m.current);
    const double tol = claim + 1000;
    const uint64_t from = i > 0 ? segs[i - 1].last_host : 0;
    const uint64_t until = i + 1 < segs.size() ? segs[i + 1].first_host : 0;
    if (from && static_cast<double>(t) < static_cast<double>(from) - tol) continue;
    if (until && static_cast<double>(t) > static_cast<double>(until) + tol) continue;
    const bool unread = read_ns == INT64_MAX || t <= read_ns + 20'000;
    const int cls = unread ? (t >= not_before ? 2 : 1) : 0;
    c.cand[c.n++] = {t, claim, cls, i};
    c.best_cls = std::max(c.best_cls, cls);
  }
  return c;
}

}  // namespace

// Converts r into out.  A device time is converted once a sync round
// after it is in the model (`force`: with whatever model there is), so
// the fit brackets it: interpolation, never extrapolation past the newest
// round, where a forward clock step the rounds have not seen yet would
// pass unnoticed (the host cannot tell a step from the time a record
// took to reach it).  The fit of the time's own segment is used.
//
// `epoch`: how many times the record's stream saw the device clock go
// back (epoch_of()).  A backward step makes device times repeat; a
// record of epoch e converts only with the segments that began after
// the step that opened e and before the next one, so a time after the
// step waits for the model to confirm the step (its new segment) instead
// of passing as covered by the old segment, seconds early.
//
// Around a step, a device time between the last round before it and the
// first after it may belong to either segment.  A segment is a candidate
// where it puts the time between the previous segment's last round and
// the next one's first; of the candidates, those that put it neither
// before its stream's previous record nor after it was read
// (`rs.read_ns`) are preferred; of those, the newest converts it, and
// the claim covers every one of them (a record the stream and its read
// time cannot place carries the step in its claim, not a false bound).
//
// `sc`: the record's stream (streams_[r.stream]).
bool OnlineConverter::convert(const perfq_record& r, const StreamClock& sc, uint32_t epoch,
                              const ConversionModel* m, bool force, const Read& rs,
                              TraceRecord* out) const {
  out->source = o_.source;
  out->rec = r;
  if (!device_domain(r)) return confirm_device_time(r, sc, epoch, m, force, rs, out);
  if (!m) return false;
  if (!force && m->rounds < kMinModelRounds) return false;
  const PiecewiseModel& h = m->history;
  const auto& segs = h.segments();
  const uint32_t lo = epoch < epoch_floor_.size() ? epoch_floor_[epoch] : 0;
  const uint32_t hi = epoch + 1 < epoch_floor_.size() && epoch_floor_[epoch + 1] > 0
                          ? epoch_floor_[epoch + 1] - 1
                          : UINT32_MAX;
  if (segs.size() <= 1 || m->current.segment < lo)
    return convert_by_current(r, *m, force, m->current.segment < lo, out);
  const SegmentCands c = segment_candidates(r, *m, lo, hi, sc.last_host, rs.read_ns);
  if (c.n == 0) {
    // No segment places it (a history cut short, say): the newest, forced.
    if (!force) return false;
    out->time_ns = host_time(h.model_at(r.time), r.time);
    out->claim_ns = kClaimUnbounded;
    out->conv = TraceConversion::kForced;
    return true;
  }
  const SegmentCand* chosen = nullptr;
  for (size_t i = c.n; i-- > 0;)
    if (c.cand[i].cls == c.best_cls) {
      chosen = &c.cand[i];
      break;
    }
  // The newest of the best is the current segment's: only once a round
  // after the time is in (interpolation), and the model tight there.
  const bool beyond = time_diff(m->covered_device, r.time) < 0;
  const bool current = chosen->seg + 1 == segs.size() && segs.back().id == m->current.segment;
  if (current && !force && (beyond || chosen->claim > m->tight_ns)) return false;
  double claim = chosen->claim;
  for (size_t i = 0; i < c.n; ++i)
    if (c.cand[i].cls == c.best_cls)
      claim = std::max(claim,
                       c.cand[i].claim + std::fabs(static_cast<double>(c.cand[i].t - chosen->t)));
  out->time_ns = chosen->t;
  // Forced past the newest round: no bound (above).
  out->claim_ns = current && beyond ? kClaimUnbounded : stored_claim(claim);
  out->conv = force ? TraceConversion::kForced : TraceConversion::kModel;
  return true;
}

// A time mode B's device converted (PERFQ_CLOCK_HOST_BY_DEVICE): the
// device converts with a model of its own, fitted to the rounds it took
// (when late it takes the newest and skips the ones before), vouched for by
// its own gate; nothing says it is the host's, nor that its claims hold.
// So the host bounds each such time itself, once one of its own rounds
// after it is in: the device time behind it is the inverse of the line that
// converted it (the device publishes its lines, perfq_sync_page::lines; a
// read may have been converted with any of the lines `rs.lines` names), the
// host converts that device time as its own (convert(): its segment, its
// claim), and the time carries that claim plus the distance from there, for
// the worst of the lines.  Where the lines are not known (a device that
// publishes none, one that went back, a line not read in time), or the
// model's segment changed since the read or a round contradicted it, the
// time is kept without a bound (unsynchronized).  One forced before such a
// round came has no bound either.
bool OnlineConverter::confirm_device_time(const perfq_record& r, const StreamClock& sc,
                                          uint32_t epoch, const ConversionModel* m, bool force,
                                          const Read& rs, TraceRecord* out) const {
  out->time_ns = static_cast<int64_t>(r.time);
  const bool covered = m && time_diff(r.time, static_cast<uint64_t>(m->covered_host)) <= 0;
  if (!force && !covered) return false;
  // Forced (no round after it came: the device stopped, or rounds stopped
  // being taken): unconfirmed, as the daemon's own forced conversions past
  // the newest round are, so without a bound.
  out->conv = covered ? TraceConversion::kDevice : TraceConversion::kForced;
  out->claim_ns = kClaimUnbounded;
  if (!covered || rs.contradicted || rs.segment != m->current.segment) return true;
  double claim = 0;
  if (!device_claim(r, sc, epoch, *m, force, rs, &claim)) return false;
  out->claim_ns = stored_claim(claim);
  return true;
}

bool OnlineConverter::device_claim(const perfq_record& r, const StreamClock& sc, uint32_t epoch,
                                   const ConversionModel& m, bool force, const Read& rs,
                                   double* claim) const {
  *claim = std::numeric_limits<double>::infinity();
  uint64_t lo = 0, hi = 0;
  if (!candidate_lines(rs.lines, &lo, &hi)) return true;
  double worst = 0;
  for (uint64_t id = lo; id <= hi; ++id) {
    const auto it = lines_.find(id);
    if (it == lines_.end() || !it->second.usable) return true;
    const perfq_sync_line& l = it->second.line;
    perfq_record d = r;
    d.time = device_time_at(l, r.time);
    d.flags = static_cast<uint16_t>((r.flags & ~PERFQ_FLAGS_DOMAIN_MASK) |
                                    (PERFQ_CLOCK_DEVICE << PERFQ_FLAGS_DOMAIN_SHIFT));
    // The host's own conversion of it, once a round after it is in.
    if (time_diff(m.covered_device, d.time) < 0) return force;
    TraceRecord own;
    if (!convert(d, sc, epoch, &m, true, rs, &own) || own.claim_ns == kClaimUnbounded) return true;
    // The inverse is within a tick (the device rounded to a nanosecond).
    const double slack = 2 * l.ns_per_tick + 2;
    worst = std::max(worst,
                     static_cast<double>(own.claim_ns) +
                         std::fabs(static_cast<double>(own.time_ns) - static_cast<double>(r.time)) +
                         slack);
  }
  *claim = worst;
  return true;
}

}  // namespace perfq
