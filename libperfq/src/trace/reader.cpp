// TraceReader: validate the file header, then each chunk before using it.
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zstd.h>

#include <algorithm>
#include <cerrno>
#include <functional>
#include <span>
#include <string_view>
#include <unordered_map>
#include <vector>

#include <fmt/format.h>

#include "perfq/trace.h"
#include "trace/codec.h"
#include "trace/crc32c.h"

namespace perfq {

using namespace trace_codec;

struct TraceReader::Impl {
  std::string path;
  int fd = -1;
  uint32_t version = 0;
  uint64_t file_size = 0;
  TraceReadSummary summary;
  uint64_t error_offset = 0;
  std::vector<uint8_t> stored;
  std::vector<uint8_t> raw;
  std::vector<uint8_t> rows;  // a records chunk in columns, as rows
  std::vector<TraceRecord> records;
  std::vector<TraceSyncSample> samples;
  std::vector<TraceClockModel> models;
  std::vector<TraceLoss> losses;
  TraceMetadata metadata;
  ZSTD_DCtx* dctx = nullptr;

  ~Impl() {
    if (fd >= 0) ::close(fd);
    if (dctx) ZSTD_freeDCtx(dctx);
  }

  // Reads up to n bytes at offset; returns bytes read or -1 (errno set).
  ssize_t read_at(uint64_t off, uint8_t* p, size_t n) {
    size_t got = 0;
    while (got < n) {
      ssize_t r = ::pread(fd, p + got, n - got, static_cast<off_t>(off + got));
      if (r < 0) {
        if (errno == EINTR) continue;
        return -1;
      }
      if (r == 0) break;
      got += static_cast<size_t>(r);
    }
    return static_cast<ssize_t>(got);
  }

  std::string where(uint64_t off, uint64_t chunk_no, uint16_t type) const {
    return fmt::format("{}: byte offset {}: chunk {} ({})", path, off, chunk_no,
                       chunk_type_name(type));
  }
  Status corrupt(uint64_t off, uint64_t chunk_no, uint16_t type, const std::string& why) {
    error_offset = off;
    return Status(Errc::kCorrupt, where(off, chunk_no, type) + ": " + why);
  }
  void problem(uint64_t off, uint64_t chunk_no, uint16_t type, const std::string& why) {
    summary.problems.push_back({off, where(off, chunk_no, type) + ": " + why});
  }

  // The file's structure, checked across chunks as they are read.
  struct End {
    uint64_t off = 0, chunk_no = 0;
  };
  std::optional<End> end_seen;  // the last END chunk, while nothing followed it
  bool end_followed = false;    // said once
  // Records chunks by their checksum and first record: a repeat is a copy.
  std::unordered_map<uint64_t, uint64_t> records_chunks;  // key -> offset

  // A version 2 file's records, held until a watermark: one run per
  // records chunk (each in time order), oldest first.
  struct HeldRun {
    std::vector<TraceRecord> recs;
    size_t pos = 0;  // recs[pos..] are held
  };
  std::vector<HeldRun> held;
  std::vector<std::vector<TraceRecord>> held_spare;  // drained runs' buffers
  size_t held_count = 0;
  int64_t last_out = INT64_MIN;     // time of the newest record given out
  std::vector<TraceRecord> merged;  // a batch being given out

  Status read(TraceVisitor& v);
  // Hands records to v, counting those older than one given out before.
  void give(std::span<const TraceRecord> recs, TraceVisitor& v, Status& s);
  // Gives out, merged in time order, the held records older than `limit`
  // (`all`: every one), at most `max` of them; v's answer in s.
  void release(TraceVisitor& v, int64_t limit, bool all, size_t max, Status& s);
  // Everything held (at the file's end, its END chunk or a corrupt chunk).
  Status release_all(TraceVisitor& v) {
    Status s;
    release(v, INT64_MAX, true, SIZE_MAX, s);
    return s;
  }

  // A chunk whose header and checksum were checked, its payload
  // decompressed (into stored or raw).
  struct Chunk {
    uint16_t type = 0;
    uint32_t stored_len = 0;
    uint32_t raw_len = 0;
    uint32_t count = 0;
    uint32_t crc = 0;
    const uint8_t* payload = nullptr;
  };
  // Checks chunk c at off against the chunks before it (problems); false:
  // do not deliver it.
  bool structure(uint64_t off, uint64_t chunk_no, const Chunk& c);
  // The chunk at off whose n header bytes (n > 0) are h.
  Status load_chunk(uint64_t off, uint64_t chunk_no, const uint8_t* h, size_t n, Chunk& c);
  // Decodes c's items and hands them to v (v's answer in s); an error is
  // the chunk's corruption.
  Status deliver(uint64_t off, uint64_t chunk_no, const Chunk& c, TraceVisitor& v, Status& s);
};

TraceReader::TraceReader(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
TraceReader::TraceReader(TraceReader&&) noexcept = default;
TraceReader& TraceReader::operator=(TraceReader&&) noexcept = default;
TraceReader::~TraceReader() = default;

Result<TraceReader> TraceReader::open(const std::string& path) {
  auto impl = std::make_unique<Impl>();
  impl->path = path;
  impl->fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (impl->fd < 0) return Status::from_errno(path + ": open");
  uint8_t h[kTraceFileHeaderSize];
  ssize_t n = impl->read_at(0, h, sizeof h);
  if (n < 0) return Status::from_errno(path + ": read file header");
  if (static_cast<size_t>(n) < sizeof h) {
    return Status(
        Errc::kCorrupt,
        fmt::format("{}: byte offset 0: file header torn ({} of {} bytes)", path, n, sizeof h));
  }
  if (std::memcmp(h, kTraceMagic, 8) != 0) {
    return Status(Errc::kCorrupt,
                  fmt::format("{}: byte offset 0: not a perfq trace (bad magic)", path));
  }
  uint32_t crc = get<uint32_t>(h + 28);
  if (crc != crc32c(h, 28)) {
    return Status(Errc::kCorrupt,
                  fmt::format("{}: byte offset 0: file header checksum mismatch (stored {:#010x}, "
                              "computed {:#010x})",
                              path, crc, crc32c(h, 28)));
  }
  impl->version = get<uint32_t>(h + 8);
  if (impl->version != kTraceVersionOrdered && impl->version != kTraceVersion) {
    return Status(Errc::kCorrupt,
                  fmt::format("{}: byte offset 8: trace version {} is not {} or {} (a newer perfq "
                              "wrote it?)",
                              path, impl->version, kTraceVersionOrdered, kTraceVersion));
  }
  if (get<uint32_t>(h + 12) != kTraceFileHeaderSize) {
    return Status(Errc::kCorrupt, fmt::format("{}: byte offset 12: header size {} is not {}", path,
                                              get<uint32_t>(h + 12), kTraceFileHeaderSize));
  }
  return TraceReader(std::move(impl));
}

uint32_t TraceReader::version() const { return impl_->version; }
const std::string& TraceReader::path() const { return impl_->path; }
const TraceReadSummary& TraceReader::summary() const { return impl_->summary; }
uint64_t TraceReader::error_offset() const { return impl_->error_offset; }
Status TraceReader::read(TraceVisitor& visitor) { return impl_->read(visitor); }

Status TraceReader::Impl::read(TraceVisitor& v) {
  summary = {};
  error_offset = 0;
  metadata = {};
  end_seen.reset();
  end_followed = false;
  records_chunks.clear();
  held.clear();
  held_count = 0;
  last_out = INT64_MIN;
  // What ends the reading short of a visitor's refusal gives out what is
  // held first: everything before the failure has been delivered.
  auto ending = [&](Status result) {
    Status s = release_all(v);
    return result.is_ok() ? s : result;
  };
  uint64_t off = kTraceFileHeaderSize;
  uint64_t chunk_no = 0;
  for (;; ++chunk_no) {
    uint8_t h[kTraceChunkHeaderSize];
    ssize_t n = read_at(off, h, sizeof h);
    if (n < 0)
      return ending(Status::from_errno(fmt::format("{}: read at byte offset {}", path, off)));
    if (n == 0) {  // ends at a chunk boundary
      summary.clean_end = summary.clean_end && end_seen.has_value();
      return ending(Status::ok());
    }
    Chunk c;
    if (Status e = load_chunk(off, chunk_no, h, static_cast<size_t>(n), c); !e.is_ok()) {
      summary.clean_end = false;  // whatever an END said, the file goes on
      return ending(e);
    }
    const uint64_t next = off + kTraceChunkHeaderSize + c.stored_len;
    Status s;
    if (structure(off, chunk_no, c)) {
      if (Status e = deliver(off, chunk_no, c, v, s); !e.is_ok()) return ending(e);
    }
    summary.chunks = chunk_no + 1;
    summary.bytes = next;
    if (!s.is_ok()) return s;
    off = next;
  }
}

Status TraceReader::Impl::load_chunk(uint64_t off, uint64_t chunk_no, const uint8_t* h, size_t n,
                                     Chunk& c) {
  c.type = get<uint16_t>(h + 4);
  const uint16_t type = c.type;
  if (n < kTraceChunkHeaderSize) {
    return corrupt(off, chunk_no, 0,
                   fmt::format("torn chunk header ({} of {} bytes)", n, kTraceChunkHeaderSize));
  }
  if (get<uint32_t>(h + 0) != kTraceChunkMagic) {
    return corrupt(off, chunk_no, 0, fmt::format("bad chunk magic {:#010x}", get<uint32_t>(h)));
  }
  uint16_t flags = get<uint16_t>(h + 6);
  const uint32_t stored_len = c.stored_len = get<uint32_t>(h + 8);
  const uint32_t raw_len = c.raw_len = get<uint32_t>(h + 12);
  c.count = get<uint32_t>(h + 16);
  const uint32_t crc = c.crc = get<uint32_t>(h + 20);
  // Check the header's own fields before trusting any length in it.
  if (stored_len > kTraceMaxChunkBytes || raw_len > kTraceMaxChunkBytes) {
    return corrupt(off, chunk_no, type,
                   fmt::format("length {} / {} exceeds the {} byte limit", stored_len, raw_len,
                               kTraceMaxChunkBytes));
  }
  stored.resize(stored_len);
  ssize_t got = read_at(off + kTraceChunkHeaderSize, stored.data(), stored_len);
  if (got < 0) {
    return Status::from_errno(
        fmt::format("{}: read at byte offset {}", path, off + kTraceChunkHeaderSize));
  }
  if (static_cast<uint32_t>(got) < stored_len) {
    return corrupt(off, chunk_no, type,
                   fmt::format("torn chunk: payload has {} of {} bytes", got, stored_len));
  }
  uint32_t computed = crc32c_extend(crc32c(h, 20), stored.data(), stored_len);
  if (computed != crc) {
    return corrupt(
        off, chunk_no, type,
        fmt::format("checksum mismatch (stored {:#010x}, computed {:#010x})", crc, computed));
  }
  if (flags & ~(kChunkFlagZstd | kChunkFlagColumns)) {
    return corrupt(off, chunk_no, type, fmt::format("unknown flags {:#06x}", flags));
  }
  if ((flags & kChunkFlagColumns) &&
      (type != static_cast<uint16_t>(ChunkType::kRecords) || raw_len % kRecordSize != 0)) {
    return corrupt(off, chunk_no, type,
                   fmt::format("flag {:#06x} (records in columns) on a {} chunk of {} bytes: "
                               "only a records chunk of whole {}-byte records has it",
                               kChunkFlagColumns, chunk_type_name(type), raw_len, kRecordSize));
  }
  c.payload = stored.data();
  if (flags & kChunkFlagZstd) {
    if (!dctx) dctx = ZSTD_createDCtx();
    raw.resize(raw_len);
    size_t z = ZSTD_decompressDCtx(dctx, raw.data(), raw_len, stored.data(), stored_len);
    if (ZSTD_isError(z)) {
      return corrupt(off, chunk_no, type, std::string("zstd: ") + ZSTD_getErrorName(z));
    }
    if (z != raw_len) {
      return corrupt(
          off, chunk_no, type,
          fmt::format("zstd payload decompressed to {} bytes, header says {}", z, raw_len));
    }
    c.payload = raw.data();
  } else if (raw_len != stored_len) {
    return corrupt(off, chunk_no, type,
                   fmt::format("uncompressed chunk with stored length {} != raw length {}",
                               stored_len, raw_len));
  }
  if (flags & kChunkFlagColumns) {  // back to rows
    rows.resize(raw_len);
    decode_columns(rows.data(), c.payload, raw_len / kRecordSize);
    c.payload = rows.data();
  }
  return Status::ok();
}

bool TraceReader::Impl::structure(uint64_t off, uint64_t chunk_no, const Chunk& c) {
  const auto type = static_cast<ChunkType>(c.type);
  if (chunk_no == 0 && type != ChunkType::kMetadata) {
    problem(off, chunk_no, c.type,
            "the first chunk is not metadata: the trace's sources, events and clocks are unknown "
            "(device records would read as host records)");
  }
  if (end_seen && !end_followed) {
    end_followed = true;
    problem(end_seen->off, end_seen->chunk_no, static_cast<uint16_t>(ChunkType::kEnd),
            fmt::format("an end chunk in the middle of the file: chunk {} at byte offset {} and "
                        "more follow it (read on)",
                        chunk_no, off));
  }
  end_seen.reset();
  summary.clean_end = false;
  if (type == ChunkType::kRecords && c.count > 0) {
    // A copy of an earlier records chunk has its checksum and its records;
    // two chunks of one writer never share a record (each has its own
    // stream index).
    const size_t n = std::min<size_t>(c.raw_len, 2 * kRecordSize);
    const uint64_t key = std::hash<std::string_view>{}(
                             std::string_view(reinterpret_cast<const char*>(c.payload), n)) ^
                         (uint64_t{c.crc} * 0x9E3779B97F4A7C15ull);
    const auto [it, fresh] = records_chunks.emplace(key, off);
    if (!fresh) {
      problem(off, chunk_no, c.type,
              fmt::format("repeats the records chunk at byte offset {} ({} records): skipped",
                          it->second, c.count));
      return false;
    }
  }
  return true;
}

Status TraceReader::Impl::deliver(uint64_t off, uint64_t chunk_no, const Chunk& ch, TraceVisitor& v,
                                  Status& s) {
  const uint16_t type = ch.type;
  const uint8_t* payload = ch.payload;
  const uint32_t count = ch.count;
  const uint32_t raw_len = ch.raw_len;
  auto check_count = [&](size_t item) -> Status {
    if (static_cast<uint64_t>(count) * item != raw_len) {
      return corrupt(
          off, chunk_no, type,
          fmt::format("{} items of {} bytes do not fill {} bytes", count, item, raw_len));
    }
    return Status::ok();
  };
  switch (static_cast<ChunkType>(type)) {
    case ChunkType::kMetadata: {
      auto m =
          trace_metadata_from_json(std::string(reinterpret_cast<const char*>(payload), raw_len));
      if (!m.is_ok()) return corrupt(off, chunk_no, type, m.status().message());
      metadata.merge(m.value());
      s = v.on_metadata(metadata);
      break;
    }
    case ChunkType::kRecords: {
      if (Status c = check_count(kRecordSize); !c.is_ok()) return c;
      summary.records += count;
      if (version < kTraceVersion) {  // in time order as written: passed on
        records.resize(count);
        for (uint32_t i = 0; i < count; ++i) decode(payload + size_t{i} * kRecordSize, records[i]);
        give(records, v, s);
        break;
      }
      std::vector<TraceRecord> run;
      if (!held_spare.empty()) {
        run = std::move(held_spare.back());
        held_spare.pop_back();
      }
      run.resize(count);
      for (uint32_t i = 0; i < count; ++i) decode(payload + size_t{i} * kRecordSize, run[i]);
      // Each chunk is in time order (a writer's promise; kept if broken).
      auto earlier = [](const TraceRecord& a, const TraceRecord& b) {
        return a.time_ns < b.time_ns;
      };
      if (!std::is_sorted(run.begin(), run.end(), earlier))
        std::stable_sort(run.begin(), run.end(), earlier);
      held.push_back({std::move(run), 0});
      held_count += count;
      // Past the hold's limit, the oldest half goes out (a record in a
      // later chunk older than those then comes out of order).
      if (held_count > kTraceMaxHeldRecords)
        release(v, INT64_MAX, true, held_count - kTraceMaxHeldRecords / 2, s);
      break;
    }
    case ChunkType::kWatermark: {
      if (count != 1 || raw_len != kWatermarkSize) {
        return corrupt(off, chunk_no, type, fmt::format("watermark chunk of {} bytes", raw_len));
      }
      release(v, get<int64_t>(payload), false, SIZE_MAX, s);
      break;
    }
    case ChunkType::kSyncSamples: {
      if (Status c = check_count(kSyncSampleSize); !c.is_ok()) return c;
      samples.resize(count);
      for (uint32_t i = 0; i < count; ++i)
        decode(payload + size_t{i} * kSyncSampleSize, samples[i]);
      s = v.on_sync_samples(samples);
      break;
    }
    case ChunkType::kClockModels: {
      if (Status c = check_count(kClockModelSize); !c.is_ok()) return c;
      models.resize(count);
      for (uint32_t i = 0; i < count; ++i) decode(payload + size_t{i} * kClockModelSize, models[i]);
      s = v.on_clock_models(models);
      break;
    }
    case ChunkType::kLoss: {
      if (Status c = check_count(kLossSize); !c.is_ok()) return c;
      losses.resize(count);
      for (uint32_t i = 0; i < count; ++i) decode(payload + size_t{i} * kLossSize, losses[i]);
      s = v.on_losses(losses);
      break;
    }
    case ChunkType::kEnd: {
      if (count != 1 || raw_len != kEndSize) {
        return corrupt(off, chunk_no, type, fmt::format("end chunk of {} bytes", raw_len));
      }
      TraceEnd e{get<uint64_t>(payload), get<uint64_t>(payload + 8)};
      if (s = release_all(v); !s.is_ok()) break;
      if (e.records != summary.records || e.chunks != chunk_no) {
        problem(off, chunk_no, type,
                fmt::format("the end chunk counts {} records in {} chunks; the file holds {} "
                            "records in {} chunks before it",
                            e.records, e.chunks, summary.records, chunk_no));
      } else {
        summary.clean_end = true;
      }
      end_seen = End{off, chunk_no};
      s = v.on_end(e);
      break;
    }
    default:
      ++summary.unknown_chunks;  // a newer writer's chunk: checksummed, skipped
      break;
  }
  return Status::ok();
}

void TraceReader::Impl::give(std::span<const TraceRecord> recs, TraceVisitor& v, Status& s) {
  for (const TraceRecord& r : recs) {
    if (r.time_ns < last_out)
      ++summary.out_of_order;
    else
      last_out = r.time_ns;
  }
  s = v.on_records(recs);
}

void TraceReader::Impl::release(TraceVisitor& v, int64_t limit, bool all, size_t max, Status& s) {
  constexpr size_t kBatch = 16384;
  auto below = [&](const TraceRecord& r) { return all || r.time_ns < limit; };
  // A min-heap of the runs whose head is below the limit, by (time, run):
  // on equal times the earlier chunk's record goes first.
  using Head = std::pair<int64_t, size_t>;
  std::vector<Head> heap;
  for (size_t i = 0; i < held.size(); ++i) {
    const HeldRun& r = held[i];
    if (r.pos < r.recs.size() && below(r.recs[r.pos])) heap.emplace_back(r.recs[r.pos].time_ns, i);
  }
  std::make_heap(heap.begin(), heap.end(), std::greater<>());
  merged.clear();
  size_t taken = 0;
  while (!heap.empty() && taken < max && s.is_ok()) {
    std::pop_heap(heap.begin(), heap.end(), std::greater<>());
    const size_t i = heap.back().second;
    heap.pop_back();
    HeldRun& r = held[i];
    // The run's records up to the next run's head, in one stretch.
    size_t end = r.pos + 1;
    while (end < r.recs.size() && below(r.recs[end]) && taken + (end - r.pos) < max &&
           (heap.empty() || Head(r.recs[end].time_ns, i) < heap.front()))
      ++end;
    merged.insert(merged.end(), r.recs.begin() + static_cast<ptrdiff_t>(r.pos),
                  r.recs.begin() + static_cast<ptrdiff_t>(end));
    taken += end - r.pos;
    r.pos = end;
    if (r.pos < r.recs.size() && below(r.recs[r.pos])) {
      heap.emplace_back(r.recs[r.pos].time_ns, i);
      std::push_heap(heap.begin(), heap.end(), std::greater<>());
    }
    if (merged.size() >= kBatch) {
      give(merged, v, s);
      merged.clear();
    }
  }
  if (!merged.empty() && s.is_ok()) give(merged, v, s);
  merged.clear();
  held_count -= taken;
  // Drop drained runs, keeping a few buffers.
  auto keep = held.begin();
  for (auto it = held.begin(); it != held.end(); ++it) {
    if (it->pos < it->recs.size()) {
      if (keep != it) *keep = std::move(*it);
      ++keep;
    } else if (held_spare.size() < 4) {
      it->recs.clear();
      held_spare.push_back(std::move(it->recs));
    }
  }
  held.erase(keep, held.end());
}

}  // namespace perfq
