// Internal: byte layouts of the trace file (see docs/trace-format.md).
// Little-endian hosts only, like the ABI.
#pragma once

#include <cstdint>
#include <cstring>
#include <iterator>
#include <utility>

#include "perfq/trace.h"

namespace perfq::trace_codec {

inline constexpr size_t kRecordSize = 48;
inline constexpr size_t kSyncSampleSize = 56;
inline constexpr size_t kClockModelSize = 64;
inline constexpr size_t kLossSize = 32;
inline constexpr size_t kEndSize = 16;
inline constexpr size_t kWatermarkSize = 8;

template <class T>
inline void put(uint8_t* p, T v) {
  std::memcpy(p, &v, sizeof v);
}
template <class T>
inline T get(const uint8_t* p) {
  T v;
  std::memcpy(&v, p, sizeof v);
  return v;
}

inline void encode(uint8_t* p, const TraceRecord& r) {
  put<uint64_t>(p + 0, r.rec.index);
  put<uint32_t>(p + 8, r.rec.event);
  put<uint16_t>(p + 12, r.rec.stream);
  put<uint16_t>(p + 14, r.rec.flags);
  put<uint64_t>(p + 16, r.rec.time);
  put<uint64_t>(p + 24, r.rec.arg);
  put<int64_t>(p + 32, r.time_ns);
  put<uint16_t>(p + 40, r.source);
  put<uint8_t>(p + 42, static_cast<uint8_t>(r.conv));
  put<uint8_t>(p + 43, 0);
  put<uint32_t>(p + 44, r.claim_ns);
}
inline void decode(const uint8_t* p, TraceRecord& r) {
  r.rec.index = get<uint64_t>(p + 0);
  r.rec.event = get<uint32_t>(p + 8);
  r.rec.stream = get<uint16_t>(p + 12);
  r.rec.flags = get<uint16_t>(p + 14);
  r.rec.time = get<uint64_t>(p + 16);
  r.rec.arg = get<uint64_t>(p + 24);
  r.time_ns = get<int64_t>(p + 32);
  r.source = get<uint16_t>(p + 40);
  r.conv = static_cast<TraceConversion>(get<uint8_t>(p + 42));
  r.claim_ns = get<uint32_t>(p + 44);
}

// Records in columns (kChunkFlagColumns): a records chunk's n 48-byte
// records as the same bytes in another order, one plane per field (n
// values each, in the record's field order); index, time, arg and time_ns
// stored as the difference from the previous record's (the first record's
// from 0), modulo 2^64.  zstd finds the runs of equal fields and small
// differences that rows interleave: docs/trace-format.md.
struct RecordColumn {
  uint8_t off, size;
  bool delta;
};
inline constexpr RecordColumn kRecordColumns[] = {
    {0, 8, true},  {8, 4, false},  {12, 2, false}, {14, 2, false}, {16, 8, true}, {24, 8, true},
    {32, 8, true}, {40, 2, false}, {42, 1, false}, {43, 1, false}, {44, 4, false}};
static_assert([] {
  size_t at = 0;
  for (const RecordColumn& c : kRecordColumns) {
    if (c.off != at) return false;
    at += c.size;
  }
  return at == kRecordSize;
}());

// Column K of the record in row, as stored at dst (prev: the previous
// record's value of it).  The sizes and offsets are constants here, so the
// copies are single loads and stores.
template <size_t K>
inline void put_column(uint8_t* dst, const uint8_t* row, uint64_t& prev) {
  constexpr RecordColumn c = kRecordColumns[K];
  uint64_t v = 0;
  std::memcpy(&v, row + c.off, c.size);
  const uint64_t w = c.delta ? v - prev : v;
  prev = v;
  std::memcpy(dst, &w, c.size);
}

template <size_t K>
inline void get_column(uint8_t* rows, const uint8_t* planes, size_t n) {
  constexpr RecordColumn c = kRecordColumns[K];
  const uint8_t* plane = planes + n * c.off;  // the planes before it hold n * off bytes
  uint64_t prev = 0;
  for (size_t i = 0; i < n; ++i) {
    uint64_t v = 0;
    std::memcpy(&v, plane + i * c.size, c.size);
    if (c.delta) v = prev += v;
    std::memcpy(rows + i * kRecordSize + c.off, &v, c.size);
  }
}

template <size_t... K>
inline void encode_columns(uint8_t* out, const TraceRecord* r, size_t n,
                           std::index_sequence<K...>) {
  uint8_t row[kRecordSize];
  uint64_t prev[sizeof...(K)] = {};
  for (size_t i = 0; i < n; ++i) {
    encode(row, r[i]);
    (put_column<K>(out + n * kRecordColumns[K].off + i * kRecordColumns[K].size, row, prev[K]),
     ...);
  }
}

template <size_t... K>
inline void decode_columns(uint8_t* rows, const uint8_t* planes, size_t n,
                           std::index_sequence<K...>) {
  (get_column<K>(rows, planes, n), ...);
}

// n records into kRecordSize * n bytes of columns at out.
inline void encode_columns(uint8_t* out, const TraceRecord* r, size_t n) {
  encode_columns(out, r, n, std::make_index_sequence<std::size(kRecordColumns)>());
}

// kRecordSize * n bytes of columns back into n 48-byte rows at rows.
inline void decode_columns(uint8_t* rows, const uint8_t* planes, size_t n) {
  decode_columns(rows, planes, n, std::make_index_sequence<std::size(kRecordColumns)>());
}

inline void encode(uint8_t* p, const TraceSyncSample& s) {
  put<uint16_t>(p + 0, s.source);
  put<uint16_t>(p + 2, s.absent);
  put<uint32_t>(p + 4, s.round);
  put<uint64_t>(p + 8, s.host.before);
  put<uint64_t>(p + 16, s.host.value);
  put<uint64_t>(p + 24, s.host.after);
  put<uint64_t>(p + 32, s.device.before);
  put<uint64_t>(p + 40, s.device.value);
  put<uint64_t>(p + 48, s.device.after);
}
inline void decode(const uint8_t* p, TraceSyncSample& s) {
  s = TraceSyncSample{};
  s.source = get<uint16_t>(p + 0);
  s.absent = get<uint16_t>(p + 2);
  s.round = get<uint32_t>(p + 4);
  s.host.before = get<uint64_t>(p + 8);
  s.host.value = get<uint64_t>(p + 16);
  s.host.after = get<uint64_t>(p + 24);
  s.device.before = get<uint64_t>(p + 32);
  s.device.value = get<uint64_t>(p + 40);
  s.device.after = get<uint64_t>(p + 48);
}

inline void encode(uint8_t* p, const TraceClockModel& c) {
  put<uint16_t>(p + 0, c.source);
  put<uint16_t>(p + 2, 0);
  put<uint32_t>(p + 4, c.model.segment);
  put<uint32_t>(p + 8, c.model.flags);
  put<uint32_t>(p + 12, 0);
  put<int64_t>(p + 16, c.installed_ns);
  put<uint64_t>(p + 24, c.model.device_ref);
  put<int64_t>(p + 32, c.model.host_ref_ns);
  put<int64_t>(p + 40, c.model.rate_ppb);
  put<uint64_t>(p + 48, c.model.uncertainty_ns);
  put<uint64_t>(p + 56, c.model.valid_from_device);
}
inline void decode(const uint8_t* p, TraceClockModel& c) {
  c = TraceClockModel{};
  c.source = get<uint16_t>(p + 0);
  c.model.segment = get<uint32_t>(p + 4);
  c.model.flags = get<uint32_t>(p + 8);
  c.installed_ns = get<int64_t>(p + 16);
  c.model.device_ref = get<uint64_t>(p + 24);
  c.model.host_ref_ns = get<int64_t>(p + 32);
  c.model.rate_ppb = get<int64_t>(p + 40);
  c.model.uncertainty_ns = get<uint64_t>(p + 48);
  c.model.valid_from_device = get<uint64_t>(p + 56);
}

inline void encode(uint8_t* p, const TraceLoss& l) {
  put<uint16_t>(p + 0, l.source);
  put<uint16_t>(p + 2, l.stream);
  put<uint32_t>(p + 4, static_cast<uint32_t>(l.reason));
  put<uint64_t>(p + 8, l.count);
  put<int64_t>(p + 16, l.time_ns);
  put<uint64_t>(p + 24, l.last_index);
}
inline void decode(const uint8_t* p, TraceLoss& l) {
  l.source = get<uint16_t>(p + 0);
  l.stream = get<uint16_t>(p + 2);
  l.reason = static_cast<TraceLossReason>(get<uint32_t>(p + 4));
  l.count = get<uint64_t>(p + 8);
  l.time_ns = get<int64_t>(p + 16);
  l.last_index = get<uint64_t>(p + 24);
}

}  // namespace perfq::trace_codec
