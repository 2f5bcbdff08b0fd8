// The host's device drain: reads batches from a region's record ring,
// validates every record, and keeps per-stream accounting (records
// received, losses reported by LOST records, index gaps).
//
// The device is untrusted: a record with an invalid kind, clock domain or
// reserved flag bits is counted and dropped (the first one is described),
// and a corrupt tail stops the drain with an error naming the values.
// Threading: one thread drives a DeviceDrain.
#pragma once

#include <cstdint>
#include <deque>
#include <map>
#include <string>
#include <vector>

#include "core/region.h"
#include "core/ring.h"
#include "perfq/perfq_abi.h"
#include "perfq/status.h"
#include "sync/online_convert.h"

namespace perfq {

// One stream's accounting over the records a recording took.  Gaps count
// from the stream's first record taken: what came before it (an earlier
// recording's, or the ring's backlog at the start) is not this recording's
// loss.
struct StreamAccount {
  uint64_t received = 0;       // valid records other than LOST
  uint64_t lost_reported = 0;  // sum of the LOST records' counts
  uint64_t gap_records = 0;    // indices skipped between received records
  uint64_t out_of_order = 0;   // records whose index went backwards
  uint64_t next_index = 0;     // expected index of the next record
  bool seen = false;           // a record other than LOST was taken
};

// Who wrote a record, which says what it may hold.
enum class RecordOrigin : uint8_t {
  // A device region: any kind, times in the device clock D or (mode B)
  // host time the device computed.  Not R: the host converts only D (a
  // device that stamps records with its timer register declares that
  // register as its clock, device_clock_hz = timer_hz).
  kDevice,
  // A host application's ring: BEGIN, END, INSTANT or COUNTER, in host time
  // (the daemon writes LOST records, never an application).
  kHostApp,
};

// Check one record from an untrusted source; empty string when valid, else
// what is wrong with it.  The one validator of records from outside.
std::string validate_record(const perfq_record& r, RecordOrigin origin = RecordOrigin::kDevice);

class DeviceDrain {
 public:
  explicit DeviceDrain(const Region& region);

  // Move up to max records out of the ring; valid ones are appended to out.
  // Returns how many were consumed (valid or not); an error when the ring's
  // tail is corrupt (the drain stops there).  Accounting is the caller's
  // (account()), for the records it keeps.
  Result<size_t> poll(std::vector<perfq_record>& out, size_t max = 4096);

  // Discards what the ring holds now unread (published before a recording
  // started) and returns how many records that was.
  Result<uint64_t> skip_backlog();

  // Counts a record the caller took into its recording (per stream:
  // received, reported losses, index gaps from the first record taken).
  void account(const perfq_record& r);

  // The device has stopped and everything it published has been read.
  bool finished();

  // Mode B: the lines (perfq_sync_page::lines) the records the last poll()
  // returned may have been converted with, and the lines published since
  // the last call (read, not checked: OnlineConverter::add_device_line()).
  // The device publishes a line before it converts with it, so records
  // beyond the tail the host read after seeing line n were converted with
  // n or later, and those it read before seeing line m with m or earlier.
  LineIds last_lines() const { return last_lines_; }
  void new_lines(std::vector<perfq_sync_line_pub>& out);

  const std::map<uint16_t, StreamAccount>& streams() const { return streams_; }
  uint64_t invalid() const { return invalid_; }
  const std::string& first_invalid() const { return first_invalid_; }
  uint64_t consumed() const { return consumer_.head(); }

 private:
  const Region& region_;
  SpscConsumer<perfq_record> consumer_;
  std::map<uint16_t, StreamAccount> streams_;
  uint64_t invalid_ = 0;
  std::string first_invalid_;
  // Mode B's lines: per tail read, the records below `tail` (and above the
  // tail read before) were converted with a line in [lo, hi].
  struct LineSpan {
    uint64_t tail, lo, hi;
  };
  uint64_t lines_newest();
  std::deque<LineSpan> line_spans_;
  uint64_t line_lo_ = 0;       // lo beyond the last span's tail
  uint64_t lines_seen_ = 0;    // the highest lines_newest read
  uint64_t lines_read_ = 0;    // the newest line new_lines() copied
  bool lines_broken_ = false;  // lines_newest went back: bounds no more
  LineIds last_lines_;
};

}  // namespace perfq
