#include "host/drain.h"

#include <fmt/format.h>

#include "device/device.h"

namespace perfq {

std::string validate_record(const perfq_record& r, RecordOrigin origin) {
  const unsigned kind = PERFQ_FLAGS_KIND(r.flags);
  const unsigned domain = PERFQ_FLAGS_DOMAIN(r.flags);
  if (kind == PERFQ_KIND_INVALID || kind > PERFQ_KIND_MAX)
    return fmt::format("kind {} is not valid", kind);
  if (domain > PERFQ_CLOCK_MAX) return fmt::format("clock domain {} is not valid", domain);
  if (r.flags & PERFQ_FLAGS_RESERVED_MASK)
    return fmt::format("reserved flag bits {:#x} are set", r.flags & PERFQ_FLAGS_RESERVED_MASK);
  if (origin == RecordOrigin::kDevice) {
    if (domain != PERFQ_CLOCK_DEVICE && domain != PERFQ_CLOCK_HOST_BY_DEVICE)
      return fmt::format(
          "clock domain {} ({}) is not one a device stamps: the host converts device "
          "clock times (1) and mode B's host times (3) only",
          domain, domain == PERFQ_CLOCK_DEVICE_TIMER ? "timer register R" : "host");
  } else {
    if (kind == PERFQ_KIND_LOST) return "kind LOST is the daemon's, not an application's";
    if (domain != PERFQ_CLOCK_HOST)
      return fmt::format("clock domain {} is not host time (0)", domain);
  }
  return {};
}

DeviceDrain::DeviceDrain(const Region& region)
    : region_(region), consumer_(region.host_consumer()) {}

uint64_t DeviceDrain::lines_newest() {
  // Pairs with the device's release (perfq_dev_line_publish()): the slot
  // first.  Untrusted: a count that goes back ends the bounds.
  const uint64_t n = load_acquire(&region_.sync()->lines_newest);
  if (n < lines_seen_) lines_broken_ = true;
  lines_seen_ = std::max(lines_seen_, n);
  return n;
}

void DeviceDrain::new_lines(std::vector<perfq_sync_line_pub>& out) {
  const uint64_t newest = lines_seen_;
  if (lines_broken_ || newest <= lines_read_) return;
  // The slots hold the last PERFQ_SYNC_LINES: older ones are gone.
  uint64_t id =
      std::max(lines_read_ + 1, newest >= PERFQ_SYNC_LINES ? newest - PERFQ_SYNC_LINES + 1 : 1);
  for (; id <= newest; ++id) {
    perfq_sync_line_pub l;
    if (perfq_dev_line_read(region_.sync(), id, &l, 16) == PERFQ_DEV_OK && l.id == id)
      out.push_back(l);
  }
  lines_read_ = newest;
}

Result<size_t> DeviceDrain::poll(std::vector<perfq_record>& out, size_t max) {
  const uint64_t before = lines_newest();
  const uint64_t loads = consumer_.tail_loads();
  const uint64_t head = consumer_.head();
  auto span = consumer_.peek(max);
  if (consumer_.fault())
    return Status(Errc::kCorrupt,
                  "device '" + region_.device_name() + "' ring: " + consumer_.fault().describe());
  if (consumer_.tail_loads() != loads) {
    // The tail was read after `before` and before `after`: the records
    // below it (and above the tail read before) were converted with a line
    // from the one seen before that tail read to `after`; those beyond it,
    // with `before` or later.
    const uint64_t t = consumer_.published();
    const uint64_t after = lines_newest();
    if (t > head && (line_spans_.empty() || t > line_spans_.back().tail))
      line_spans_.push_back({t, line_lo_, after});
    line_lo_ = before;
  }
  const size_t n = span.size();
  if (n == 0) return size_t{0};
  // This read's records: from the span of the first to that of the last
  // (beyond the spans: a tail read elsewhere, finished()'s, whose lines
  // lie between line_lo_ and now).
  LineIds ids{line_lo_, 0};
  bool first = true;
  for (const LineSpan& sp : line_spans_) {
    if (sp.tail <= head) continue;
    if (first) ids.lo = sp.lo;
    first = false;
    ids.hi = sp.hi;
    if (sp.tail >= head + n) break;
  }
  if (line_spans_.empty() || line_spans_.back().tail < head + n) ids.hi = lines_newest();
  while (!line_spans_.empty() && line_spans_.front().tail <= head + n) line_spans_.pop_front();
  last_lines_ = lines_broken_ ? LineIds{} : ids;
  const size_t base = out.size();
  out.resize(base + n);
  span.copy_to(out.data() + base, n);  // private copy first, then validate
  consumer_.release(n);
  size_t w = base;
  for (size_t i = base; i < base + n; ++i) {
    const perfq_record& r = out[i];
    if (std::string why = validate_record(r); !why.empty()) {
      if (invalid_++ == 0)
        first_invalid_ = fmt::format("record at ring position {} (stream {}, index {}): {}",
                                     consumer_.head() - n + (i - base), r.stream, r.index, why);
      continue;
    }
    out[w++] = r;
  }
  out.resize(w);
  return n;
}

Result<uint64_t> DeviceDrain::skip_backlog() {
  // Once, up to the tail seen now: records published meanwhile are the
  // recording's (and were converted with the line seen before it, or later).
  const uint64_t before = lines_newest();
  auto span = consumer_.peek(SIZE_MAX);
  if (consumer_.fault())
    return Status(Errc::kCorrupt,
                  "device '" + region_.device_name() + "' ring: " + consumer_.fault().describe());
  const uint64_t skipped = span.size();
  consumer_.release(span.size());
  line_spans_.clear();
  line_lo_ = before;
  return skipped;
}

void DeviceDrain::account(const perfq_record& r) {
  StreamAccount& a = streams_[r.stream];
  if (PERFQ_FLAGS_KIND(r.flags) == PERFQ_KIND_LOST) {
    a.lost_reported += r.arg;
    return;
  }
  if (!a.seen) {
    a.seen = true;
    a.next_index = r.index;
  }
  if (r.index > a.next_index)
    a.gap_records += r.index - a.next_index;
  else if (r.index < a.next_index)
    ++a.out_of_order;
  if (r.index >= a.next_index) a.next_index = r.index + 1;
  ++a.received;
}

bool DeviceDrain::finished() {
  if (device_state(region_) != PERFQ_DEVICE_STOPPED) return false;
  // STOPPED is stored after the final tail: whatever we see now is final.
  return consumer_.peek(1).empty() && !consumer_.fault();
}

}  // namespace perfq
