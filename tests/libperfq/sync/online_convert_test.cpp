// Tests of sync/online_convert.h: the one online conversion policy, with
// a simulated device clock (offset, drift, a step) and rounds fed to the
// sync module as the daemon's sync thread feeds them.  Every converted
// time is checked against the truth and against its own claim.
#include <array>
#include <bit>
#include <catch2/catch.hpp>
#include <cmath>
#include <limits>
#include <random>

#include "sync/online_convert.h"

namespace perfq {
namespace {

constexpr uint64_t kH0 = 1'000'000'000'000ull;  // host time of the first round
constexpr int64_t kRoundNs = 100'000'000;       // rounds every 100 ms

// A device clock D(H) = H + offset + drift * (H - kH0), stepping by `step`
// at host time step_at.
struct Clock {
  int64_t offset = 3'000'000'000;
  long double drift = 40e-6L;
  uint64_t step_at = UINT64_MAX;
  int64_t step = 0;
  // A rate that wanders: wander_ns x sin(2 pi x / wander_period_ns) on top
  // (a host clock that NTP slews, an oscillator that warms up).
  double wander_ns = 0;
  double wander_period_ns = 4e9;
  uint64_t d(uint64_t h) const {
    const long double x = static_cast<long double>(h - kH0);
    const double w = wander_ns * std::sin(2 * M_PI * static_cast<double>(x) / wander_period_ns);
    return static_cast<uint64_t>(static_cast<int64_t>(h) + offset +
                                 static_cast<int64_t>(std::llround(drift * x + w)) +
                                 (h >= step_at ? step : 0));
  }
};

// The sync thread's side: rounds into a ClockSync and a RoundGate, and the
// model the converter gets after each.
struct Rounds {
  const Clock& clock;
  ClockSync sync{ClockRates{}};
  RoundGate gate;
  std::shared_ptr<const ConversionModel> model;
  uint32_t no = 0;
  std::mt19937_64 rng{7};

  explicit Rounds(const Clock& c) : clock(c) {}

  // One round at host time h (bracket +-60 ns).
  ClockSync::Verdict round(uint64_t h) {
    SyncObservation o;
    o.round = ++no;
    o.host_ns = h + std::uniform_int_distribution<int>(-20, 20)(rng);
    o.device_time = clock.d(h);
    o.uncertainty_ns = 60;
    const auto v = gate.feed(sync, o);
    model = ConversionModel::after_round(model, sync, gate, v, o, 60);
    return v;
  }
};

perfq_record device_record(uint16_t stream, uint64_t index, uint64_t d, uint64_t true_h,
                           unsigned domain = PERFQ_CLOCK_DEVICE) {
  perfq_record r{};
  r.index = index;
  r.event = 1;
  r.stream = stream;
  r.flags = static_cast<uint16_t>(PERFQ_FLAGS(PERFQ_KIND_INSTANT, domain));
  r.time = d;
  r.arg = true_h;  // the truth, as devsim --truth stores it
  return r;
}

// Two streams, 20 k records/s each, stamped from host time `from` to `to`
// (true times 25 us apart), read together at `read` and fed to `conv`.
struct TwoStreams {
  const Clock& clock;
  uint64_t index[2] = {0, 0};
  void poll(OnlineConverter& conv, const ConversionModel* m, uint64_t from, uint64_t to,
            int64_t read, std::vector<TraceRecord>& out) {
    std::vector<perfq_record> batch;
    for (uint64_t t = from; t < to; t += 50'000)
      for (uint16_t st = 0; st < 2; ++st) {
        const uint64_t th = t + st * 25'000;
        batch.push_back(device_record(st, index[st]++, clock.d(th), th));
      }
    conv.feed(batch, m, read, read, out);
  }
  uint64_t records() const { return index[0] + index[1]; }
};

OnlineConverter::Options options(uint16_t source, int64_t max_wait_ns = 2'000'000'000,
                                 int64_t stale_model_ns = 1'000'000'000) {
  OnlineConverter::Options o;
  o.source = source;
  o.max_wait_ns = max_wait_ns;
  o.stale_model_ns = stale_model_ns;
  return o;
}

// A mode B device's line as it publishes it (perfq_sync_line_pub): the
// model `m`, off by `off_ns` and its rate by `rate_err` (a device whose
// model is not the host's).
perfq_sync_line_pub published(uint64_t id, const ClockModel& m, int64_t off_ns = 0,
                              double rate_err = 0) {
  perfq_sync_line_pub l{};
  l.id = id;
  l.device_ref = m.device_ref;
  l.host_ref_ns = m.host_ref + static_cast<uint64_t>(off_ns);
  l.host_frac = std::bit_cast<uint64_t>(m.host_frac);
  l.ns_per_tick = std::bit_cast<uint64_t>(static_cast<double>(m.ns_per_tick) * (1 + rate_err));
  return l;
}

// What the device computes with that line (the SDK's conversion).
uint64_t device_converts(const perfq_sync_line_pub& p, uint64_t d) {
  perfq_sync_line l{};
  l.device_ref = p.device_ref;
  l.host_ref = p.host_ref_ns;
  l.host_frac = std::bit_cast<double>(p.host_frac);
  l.ns_per_tick = std::bit_cast<double>(p.ns_per_tick);
  l.valid = true;
  return perfq_sync_line_to_host(&l, d);
}

struct Check {
  uint64_t n = 0, beyond = 0, loose = 0, unbounded = 0;
  double worst = 0;
  void add(const TraceRecord& t, double loose_ns = 2'000) {
    ++n;
    const double e = std::fabs(static_cast<double>(t.time_ns - static_cast<int64_t>(t.rec.arg)));
    if (t.claim_ns == kClaimUnbounded) {
      ++unbounded;
      return;
    }
    if (e > t.claim_ns + 1.0) ++beyond;
    if (t.claim_ns > loose_ns) ++loose;
    worst = std::max(worst, e);
  }
};

TEST_CASE(
    "online convert: a device time waits for a round after it, then converts within its claim",
    "[sync][convert]") {
  Clock clock;
  Rounds rounds(clock);
  OnlineConverter conv(options(3));
  std::vector<TraceRecord> out;
  Check check;
  uint64_t index = 0;
  for (int k = 0; k < 40; ++k) {
    const uint64_t h = kH0 + static_cast<uint64_t>(k) * kRoundNs;
    rounds.round(h);
    REQUIRE(conv.release(rounds.model, static_cast<int64_t>(h), out));
    // Records between this round and the next, read at once.
    std::vector<perfq_record> batch;
    for (int i = 1; i < 100; ++i) {
      const uint64_t t = h + static_cast<uint64_t>(i) * 1'000'000;
      batch.push_back(device_record(0, index++, clock.d(t), t));
    }
    const size_t before = out.size();
    CHECK(conv.feed(batch, rounds.model.get(), static_cast<int64_t>(h),
                    static_cast<int64_t>(h + kRoundNs), out) == 0);
    // None of them is covered yet: nothing converts past the newest round.
    CHECK(out.size() == before);
    if (k >= 4) CHECK(conv.waiting() == batch.size());  // earlier: waiting for 5 rounds
  }
  for (const auto& t : out) {
    CHECK(t.source == 3);
    CHECK(t.conv == TraceConversion::kModel);
    check.add(t);
  }
  INFO("records " << check.n << ", worst error " << check.worst << " ns");
  CHECK(check.n == 39 * 99);
  CHECK(check.beyond == 0);
  CHECK(check.unbounded == 0);
  CHECK(check.worst < 200);
}

// Clocks whose relation is not a line: the rate wanders by a few ppm over
// seconds (what a QEMU guest's clock, read against the machine's
// NTP-disciplined one, did: residuals of 1-3 us against models that claimed
// +-300 ns, and jobs out of order beyond their claims).  A fit that averages
// the misfit as noise claims what the line does not keep; every time must
// lie within its claim, and the claims stay as tight as the wander allows.
TEST_CASE("online convert: a clock whose rate wanders converts within its claims",
          "[sync][convert]") {
  Clock clock;
  clock.wander_ns = GENERATE(500.0, 1500.0, 4000.0);
  clock.wander_period_ns = GENERATE(2e9, 6e9);
  Rounds rounds(clock);
  OnlineConverter conv(options(1));
  std::vector<TraceRecord> out;
  uint64_t index = 0;
  for (int k = 0; k < 300; ++k) {  // 30 s
    const uint64_t h = kH0 + static_cast<uint64_t>(k) * kRoundNs;
    rounds.round(h);
    REQUIRE(conv.release(rounds.model, static_cast<int64_t>(h), out));
    std::vector<perfq_record> batch;
    for (int i = 1; i < 20; ++i) {
      const uint64_t t = h + static_cast<uint64_t>(i) * 5'000'000;
      batch.push_back(device_record(0, index++, clock.d(t), t));
    }
    conv.feed(batch, rounds.model.get(), static_cast<int64_t>(h),
              static_cast<int64_t>(h + kRoundNs), out);
  }
  Check check;
  for (const auto& t : out)
    if (t.time_ns >= static_cast<int64_t>(kH0 + 2'000'000'000)) check.add(t);  // past the start
  INFO("wander " << clock.wander_ns << " ns over " << clock.wander_period_ns / 1e9
                 << " s: " << check.n << " records, worst error " << check.worst << " ns, "
                 << check.beyond << " beyond their claim");
  CHECK(check.n > 4500);
  CHECK(check.beyond == 0);
}

// A forward step between two rounds: nothing in a device time says on
// which side of the step it was stamped.  Records read promptly are placed
// by their read time; records read late (a drain seconds behind) carry the
// step in their claim.  Before, records extrapolated past the last round
// converted the step's size late while claiming ~100 ns.
TEST_CASE("online convert: around a forward step every time lies within its claim",
          "[sync][convert]") {
  const int64_t step = GENERATE(int64_t{5'000'000}, int64_t{300'000}, int64_t{40'000'000});
  const bool late_reads = GENERATE(false, true);
  INFO("step " << step << " ns, " << (late_reads ? "read 60 ms late" : "read at once"));
  Clock clock;
  clock.step_at = kH0 + 20 * kRoundNs + 37'000'000;  // between rounds 20 and 21
  clock.step = step;
  Rounds rounds(clock);
  OnlineConverter conv(options(1));
  std::vector<TraceRecord> out;
  TwoStreams streams{clock};
  for (int k = 0; k < 40; ++k) {
    const uint64_t h = kH0 + static_cast<uint64_t>(k) * kRoundNs;
    rounds.round(h);
    REQUIRE(conv.release(rounds.model, static_cast<int64_t>(h), out));
    // Read in 10 ms polls.
    for (int poll = 0; poll < 10; ++poll) {
      const uint64_t p0 = h + static_cast<uint64_t>(poll) * 10'000'000;
      const int64_t read = static_cast<int64_t>(p0 + 10'000'000) + (late_reads ? 60'000'000 : 0);
      streams.poll(conv, rounds.model.get(), p0, p0 + 10'000'000, read, out);
    }
  }
  // The round the daemon waits for at the end (wait_for_cover()).
  rounds.round(kH0 + 40 * kRoundNs);
  REQUIRE(conv.release(rounds.model, static_cast<int64_t>(kH0 + 40 * kRoundNs), out));
  REQUIRE(conv.finish(rounds.model.get(), out) == 0);
  Check check;
  for (const auto& t : out) check.add(t);
  INFO("records " << check.n << ", beyond their claim " << check.beyond << ", claims over 2 us "
                  << check.loose << ", unbounded " << check.unbounded << ", worst error "
                  << check.worst << " ns");
  CHECK(check.n == streams.records());
  CHECK(check.beyond == 0);
  CHECK(check.unbounded == 0);
  // Honest and useful: only the records of the step's gap (two rounds, 8 000
  // records) may carry it.
  CHECK(check.loose <= 8'000);
  if (!late_reads && step > 1'000'000) CHECK(check.loose < 2'000);
}

// Mode B: the device converts past its newest round and cannot see a step
// before a round after it does.  The host keeps each such time until one
// of its own rounds after it is in; a step between loses the bound.
TEST_CASE("online convert: mode B's times keep their bound only where no step came between",
          "[sync][convert]") {
  Clock clock;
  clock.step_at = kH0 + 20 * kRoundNs + 37'000'000;
  clock.step = 5'000'000;
  Rounds rounds(clock);
  OnlineConverter conv(options(1));
  std::vector<TraceRecord> out;
  uint64_t index = 0;
  for (int k = 0; k < 40; ++k) {
    const uint64_t h = kH0 + static_cast<uint64_t>(k) * kRoundNs;
    rounds.round(h);
    REQUIRE(conv.release(rounds.model, static_cast<int64_t>(h), out));
    if (k < 6) continue;  // the device's model needs its first rounds
    // The device converts with the model of the rounds it has seen: the
    // host's, which does not know of a step it has not seen either; it
    // publishes each line it converts with.
    const auto line = published(static_cast<uint64_t>(k), rounds.model->current);
    conv.add_device_line(line);
    std::vector<perfq_record> batch;
    for (uint64_t t = h + 1'000'000; t < h + kRoundNs; t += 1'000'000)
      batch.push_back(device_record(0, index++, device_converts(line, clock.d(t)), t,
                                    PERFQ_CLOCK_HOST_BY_DEVICE));
    const size_t before = out.size();
    conv.feed(batch, rounds.model.get(), static_cast<int64_t>(h + kRoundNs),
              static_cast<int64_t>(h + kRoundNs), out, LineIds{line.id, line.id});
    CHECK(out.size() == before);  // each waits for a round after it
  }
  REQUIRE(conv.finish(rounds.model.get(), out) == 0);
  Check check;
  uint64_t forced = 0;
  for (const auto& t : out) {
    CHECK((t.conv == TraceConversion::kDevice || t.conv == TraceConversion::kForced));
    if (t.conv == TraceConversion::kForced) {
      ++forced;
      CHECK(t.claim_ns == kClaimUnbounded);  // no round after it confirmed it
      continue;
    }
    check.add(t, 100'000);
  }
  CHECK(forced == 99);  // the last poll's: no round after them came
  INFO("records " << check.n << ", beyond " << check.beyond << ", unbounded " << check.unbounded
                  << ", worst " << check.worst);
  CHECK(check.n + forced == index);
  CHECK(check.beyond == 0);
  // The records read from the last round before the step to the round that
  // confirmed it (three rounds of 99 here: the step's round, the one that
  // contradicted the model and the one that started the segment) have no
  // bound; the rest keep the device's.
  CHECK(check.unbounded >= 60);
  CHECK(check.unbounded <= 5 * 99);
}

// Mode B's device fits its own model (the rounds it took; when late, the
// newest only): its line may be off the host's.  What it converted carries
// the host's own claim at the device time behind it plus the distance,
// for every line it may have used; none without its lines.
TEST_CASE("online convert: mode B's bound holds whatever line the device converted with",
          "[sync][convert]") {
  Clock clock;
  Rounds rounds(clock);
  OnlineConverter conv(options(1));
  std::vector<TraceRecord> out;
  uint64_t index = 0, id = 0, unknown = 0;
  std::vector<uint64_t> exact;  // indices converted with the host's own line
  for (int k = 0; k < 60; ++k) {
    const uint64_t h = kH0 + static_cast<uint64_t>(k) * kRoundNs;
    rounds.round(h);
    REQUIRE(conv.release(rounds.model, static_cast<int64_t>(h), out));
    if (k < 6) continue;
    // Lines off the host's by 0, +3 us, -2 us with 2 ppm, by turns; every
    // fifth read may have used this line or the one before (a late drain).
    const int kind = k % 5;
    const int64_t off = kind == 1 ? 3'000 : kind == 2 ? -2'000 : 0;
    const double rate = kind == 2 ? 2e-6 : 0;
    const auto prev = published(id, rounds.model->current, 1'500);
    auto line = published(++id, rounds.model->current, off, rate);
    if (kind == 3) {
      // Not a line a 1 GHz clock could have: what it converted is unbounded.
      line.ns_per_tick = std::bit_cast<uint64_t>(std::numeric_limits<double>::quiet_NaN());
    }
    conv.add_device_line(line);
    LineIds ids{line.id, line.id};
    if (kind == 4) {
      conv.add_device_line(prev);  // republished: the host saw it before
      ids.lo = prev.id;
    }
    if (k % 7 == 0) ids = {};  // a device that publishes no lines
    std::vector<perfq_record> batch;
    for (uint64_t t = h + 1'000'000; t < h + kRoundNs; t += 1'000'000) {
      const auto& used = kind == 4 && t % 2 ? prev : line;
      const uint64_t d = clock.d(t);
      const uint64_t conv_t =
          kind == 3 ? rounds.model->current.to_host(d) : device_converts(used, d);
      if (kind == 0 && ids.hi) exact.push_back(index);
      if (kind == 3 || !ids.hi) ++unknown;
      batch.push_back(device_record(0, index++, conv_t, t, PERFQ_CLOCK_HOST_BY_DEVICE));
    }
    conv.feed(batch, rounds.model.get(), static_cast<int64_t>(h + kRoundNs),
              static_cast<int64_t>(h + kRoundNs), out, ids);
  }
  REQUIRE(conv.finish(rounds.model.get(), out) == 0);
  Check check, tight;
  uint64_t forced = 0, loose_off = 0;
  for (const auto& t : out) {
    if (t.conv == TraceConversion::kForced) {
      ++forced;
      CHECK(t.claim_ns == kClaimUnbounded);
      continue;
    }
    REQUIRE(t.conv == TraceConversion::kDevice);
    check.add(t, 100'000);
    if (std::binary_search(exact.begin(), exact.end(), t.rec.index)) tight.add(t, 1'000);
    const double e = std::fabs(static_cast<double>(t.time_ns - static_cast<int64_t>(t.rec.arg)));
    if (t.claim_ns != kClaimUnbounded && e > 1'500) ++loose_off;
  }
  INFO("records " << check.n << ", beyond " << check.beyond << ", unbounded " << check.unbounded
                  << ", worst " << check.worst << "; with the host's own line: " << tight.n
                  << ", claims over 1 us " << tight.loose);
  CHECK(forced == 99);  // the last read's: no round after them came
  CHECK(check.n + forced == index);
  CHECK(check.beyond == 0);
  // Unbounded: exactly what was read without its lines, or with a line
  // that is not one (the last read's are among the forced).
  CHECK(check.unbounded + forced >= unknown);
  CHECK(check.unbounded <= unknown);
  // Bounded where the device's line was off: claims as wide as the error.
  CHECK(loose_off > 1'000);
  // With the host's own line, the host's own claim (plus a tick or two).
  CHECK(tight.n > 500);
  CHECK(tight.loose == 0);
  CHECK(tight.beyond == 0);
}

// A record waits at most max_wait_ns; then it converts with the model
// there is, marked forced: past the newest round, without a bound (a step
// there would be unseen).
TEST_CASE(
    "online convert: a record that waited too long converts forced, without a bound past the "
    "newest round",
    "[sync][convert]") {
  Clock clock;
  Rounds rounds(clock);
  OnlineConverter conv(options(1, 500'000'000, 10'000'000'000));
  std::vector<TraceRecord> out;
  for (int k = 0; k < 8; ++k) rounds.round(kH0 + static_cast<uint64_t>(k) * kRoundNs);
  const uint64_t h = kH0 + 7 * kRoundNs;
  // Rounds stop (the device stops answering): these are never covered.
  std::vector<perfq_record> batch;
  for (int i = 1; i <= 50; ++i) {
    const uint64_t t = h + static_cast<uint64_t>(i) * 1'000'000;
    batch.push_back(device_record(0, static_cast<uint64_t>(i), clock.d(t), t));
  }
  conv.feed(batch, rounds.model.get(), static_cast<int64_t>(h),
            static_cast<int64_t>(h + 60'000'000), out);
  CHECK(out.empty());
  REQUIRE(conv.release(rounds.model, static_cast<int64_t>(h + 100'000'000), out));
  CHECK(out.empty());  // waited 100 ms of 500
  REQUIRE(conv.release(rounds.model, static_cast<int64_t>(h + 600'000'000), out));
  REQUIRE(out.size() == 50);
  CHECK(conv.waiting() == 0);
  for (const auto& t : out) {
    CHECK(t.conv == TraceConversion::kForced);
    CHECK(t.claim_ns == kClaimUnbounded);
    // Still the model's best guess: 8 rounds of a steady clock.
    CHECK(std::fabs(static_cast<double>(t.time_ns - static_cast<int64_t>(t.rec.arg))) < 1000);
  }
  // Without a model at all, device times cannot be converted: they are left.
  OnlineConverter none(options(1));
  std::vector<TraceRecord> out2;
  none.feed(batch, nullptr, 0, 0, out2);
  CHECK(out2.empty());
  CHECK(none.finish(nullptr, out2) == batch.size());
}

// A busy machine preempts the first rounds' host reads alike: their
// brackets are honest (each round's error within its uncertainty) but
// their errors all lean one way, so the model's rate leans with them, and
// its 3 sigma (which takes the errors for independent) does not cover it
// seconds from its newest rounds.  The accuracy suite's failure (mode B,
// loaded): 16 rounds of 260-530 us over two seconds, all late by half
// their width, then tight rounds every 10 ms; the records of the first
// 200 ms, forced once the tight rounds came, were converted 287 us off
// while claiming 201 us.  Every time must lie within its claim.
TEST_CASE("online convert: rounds that are loose the same way do not make a claim false",
          "[sync][convert]") {
  // {host ms, uncertainty us, error us} of the failing run's loose rounds.
  static constexpr double kFailing[][3] = {
      {64, 303, 269},   {126, 498, 451},  {214, 289, 228},  {337, 284, 177},
      {399, 281, 225},  {547, 261, 224},  {604, 327, 230},  {680, 493, 436},
      {780, 283, 241},  {894, 533, 469},  {1020, 347, 294}, {1178, 533, 470},
      {1359, 510, 438}, {1535, 370, 302}, {1712, 376, 344}, {1918, 472, 385}};
  // 0: the failing run's rounds; before, 0 and 17 had 62 and 65 times
  // beyond their claims.
  const int variant = GENERATE(range(0, 60));
  std::mt19937_64 rng(static_cast<uint64_t>(variant));
  std::vector<std::array<double, 3>> loose;
  if (variant == 0) {
    for (const auto& r : kFailing) loose.push_back({r[0], r[1], r[2]});
  } else {
    // Elsewhere: 1.6-2.4 s of rounds (records wait 2 s: the first ones are
    // forced as the tight rounds come) every 60-200 ms, 100-600 us wide,
    // late (or early) by 40-95 % of it.
    const double span_ms = std::uniform_real_distribution<double>(1600, 2400)(rng);
    const double sign = variant % 2 ? 1 : -1;
    for (double t = 60; t < span_ms; t += std::uniform_real_distribution<double>(60, 200)(rng)) {
      const double u = std::uniform_real_distribution<double>(100, 600)(rng);
      loose.push_back({t, u, sign * u * std::uniform_real_distribution<double>(0.4, 0.95)(rng)});
    }
  }
  Clock clock;
  clock.drift = 80e-6L;
  ClockSync sync{ClockRates{}};
  RoundGate gate;
  std::shared_ptr<const ConversionModel> model;
  uint32_t no = 0;
  auto round = [&](uint64_t h, double unc_ns, double err_ns) {
    SyncObservation o;
    o.round = ++no;
    o.device_time = clock.d(h);
    o.host_ns = static_cast<uint64_t>(static_cast<int64_t>(h) + std::llround(err_ns));
    o.uncertainty_ns = unc_ns;
    o.host_delay_ns = 2 * unc_ns;
    const auto v = gate.feed(sync, o);
    model = ConversionModel::after_round(model, sync, gate, v, o, 60);
  };
  OnlineConverter conv(options(1));
  std::vector<TraceRecord> out;
  uint64_t index = 0;
  uint64_t next_record = kH0;  // records every ms, each read a ms after it
  auto until = [&](uint64_t h) {
    std::vector<perfq_record> batch;
    for (; next_record + 1'000'000 <= h; next_record += 1'000'000)
      batch.push_back(device_record(0, index++, clock.d(next_record), next_record));
    conv.feed(batch, model.get(), static_cast<int64_t>(h), static_cast<int64_t>(h), out);
    REQUIRE(conv.release(model, static_cast<int64_t>(h), out));
  };
  for (const auto& r : loose) {
    const uint64_t h = kH0 + static_cast<uint64_t>(r[0] * 1e6);
    until(h);
    round(h, r[1] * 1e3, r[2] * 1e3);
  }
  // Then tight rounds every 10 ms for 4 s (the load went).
  const uint64_t tight_from = kH0 + static_cast<uint64_t>(loose.back()[0] * 1e6) + 200'000'000;
  for (uint64_t h = tight_from; h < tight_from + 4'000'000'000ull; h += 10'000'000) {
    until(h);
    round(h, 320, std::uniform_real_distribution<double>(-10, 10)(rng));
  }
  REQUIRE(conv.finish(model.get(), out) == 0);
  Check check;
  uint64_t forced = 0;
  for (const auto& t : out) {
    check.add(t);
    forced += t.conv == TraceConversion::kForced;
  }
  INFO("variant " << variant << ": " << loose.size() << " loose rounds; " << check.n << " records, "
                  << forced << " forced, worst error " << check.worst << " ns, " << check.beyond
                  << " beyond their claim, " << check.unbounded << " unbounded");
  CHECK(check.n == index);
  CHECK(check.beyond == 0);
}

// The soak's failure (scenario c, -5000 ppm, a -50 ms step): the device
// clock goes back, and the rounds after it are not taken for longer than
// a model may stay unchanged, so what waits is forced before the model
// has a segment for the times after the step.  They converted with the
// segment from before the step, 50 ms off, claiming a few hundred ns.
// Now the times after the step, and every time past the newest round,
// have no bound; what a round covered keeps its claim.
TEST_CASE("online convert: times after a backward step no round has seen have no bound when forced",
          "[sync][convert]") {
  Clock clock;
  clock.step_at = kH0 + 20 * kRoundNs + 37'000'000;
  clock.step = -50'000'000;
  Rounds rounds(clock);
  OnlineConverter conv(options(1, 2'000'000'000, 900'000'000));
  std::vector<TraceRecord> out;
  TwoStreams streams{clock};
  const auto poll = [&](uint64_t from, uint64_t to) {
    streams.poll(conv, rounds.model.get(), from, to, static_cast<int64_t>(to), out);
  };
  for (int k = 0; k <= 20; ++k) {
    const uint64_t h = kH0 + static_cast<uint64_t>(k) * kRoundNs;
    rounds.round(h);
    REQUIRE(conv.release(rounds.model, static_cast<int64_t>(h), out));
    for (int p = 0; p < 10; ++p) poll(h + p * 10'000'000ull, h + (p + 1) * 10'000'000ull);
  }
  // Round 21 (after the step) contradicts the model; then no round is
  // taken (a busy machine, a device that stops answering).
  const uint64_t h21 = kH0 + 21 * kRoundNs;
  CHECK(rounds.round(h21) != ClockSync::Verdict::kAccepted);
  REQUIRE(conv.release(rounds.model, static_cast<int64_t>(h21), out));
  for (int p = 0; p < 30; ++p) poll(h21 + p * 10'000'000ull, h21 + (p + 1) * 10'000'000ull);
  const size_t before = out.size();
  REQUIRE(conv.release(rounds.model, static_cast<int64_t>(h21 + 2'000'000'000), out));
  CHECK(out.size() > before);  // the wait is over
  REQUIRE(conv.finish(rounds.model.get(), out) == 0);
  Check check;
  uint64_t after_step = 0, forced = 0;
  for (const auto& t : out) {
    check.add(t);
    if (t.conv == TraceConversion::kForced) ++forced;
    if (t.rec.arg >= clock.step_at) {
      ++after_step;
      CHECK(t.claim_ns == kClaimUnbounded);
    }
  }
  INFO("records " << check.n << ", beyond their claim " << check.beyond << ", unbounded "
                  << check.unbounded << ", forced " << forced << ", worst error (claimed) "
                  << check.worst << " ns");
  CHECK(check.n == streams.records());
  CHECK(after_step > 10'000);
  CHECK(check.beyond == 0);
  // What rounds 0-20 covered (after the first 5) keeps its claim.
  CHECK(check.n - check.unbounded >= 15 * 4'000);
  CHECK(check.worst < 1'000);
}

// A clock thousands of ppm off its nominal rate, with tight rounds: the
// first round's model takes its rate from the prior (nominal, +-1000 ppm),
// the next rounds start a rate segment, and every time converts within
// its claim, tight again once the rate is measured.  (The soak's failure
// at -5000 ppm came from loose, jittery rounds, which this clean clock
// does not give: "sync: a young model's claim holds where the prior's rate
// is wrong" covers that case.)
TEST_CASE("online convert: a clock far off its nominal rate, from the first round on",
          "[sync][convert]") {
  const double drift = GENERATE(-5000e-6, 5000e-6, -100000e-6, 20000e-6);
  INFO("drift " << drift * 1e6 << " ppm");
  Clock clock;
  clock.drift = static_cast<long double>(drift);
  Rounds rounds(clock);
  OnlineConverter conv(options(1));
  std::vector<TraceRecord> out;
  TwoStreams streams{clock};
  for (int k = 0; k < 30; ++k) {
    const uint64_t h = kH0 + static_cast<uint64_t>(k) * kRoundNs;
    rounds.round(h);
    REQUIRE(conv.release(rounds.model, static_cast<int64_t>(h), out));
    for (int p = 0; p < 10; ++p) {
      const uint64_t p0 = h + static_cast<uint64_t>(p) * 10'000'000;
      streams.poll(conv, rounds.model.get(), p0, p0 + 10'000'000,
                   static_cast<int64_t>(p0 + 10'000'000), out);
    }
  }
  rounds.round(kH0 + 30 * kRoundNs);
  REQUIRE(conv.release(rounds.model, static_cast<int64_t>(kH0 + 30 * kRoundNs), out));
  REQUIRE(conv.finish(rounds.model.get(), out) == 0);
  Check check;
  uint64_t late_loose = 0;
  for (const auto& t : out) {
    check.add(t);
    if (t.rec.arg > kH0 + 1'000'000'000 && (t.claim_ns == kClaimUnbounded || t.claim_ns > 2'000))
      ++late_loose;
  }
  INFO("records " << check.n << ", beyond their claim " << check.beyond << ", claims over 2 us "
                  << check.loose << ", unbounded " << check.unbounded << ", worst error (claimed) "
                  << check.worst << " ns");
  CHECK(check.n == streams.records());
  CHECK(check.beyond == 0);
  // Once the rate is measured, the claims are tight again.
  CHECK(late_loose == 0);
}

}  // namespace
}  // namespace perfq
