// TraceWriter: header, then one chunk per write(2) call sequence.
#include <fcntl.h>
#include <unistd.h>
#include <zstd.h>

#include <cerrno>
#include <cstring>
#include <optional>
#include <vector>

#include <fmt/format.h>

#include "perfq/trace.h"
#include "trace/codec.h"
#include "trace/crc32c.h"

namespace perfq {

using namespace trace_codec;

struct TraceWriter::Impl {
  std::string path;
  int fd = -1;
  TraceWriterOptions options;
  Status failed;  // first write error; sticky
  std::vector<TraceRecord> pending;
  std::vector<uint8_t> raw;  // payload being built
  std::vector<uint8_t> out;  // header + stored payload
  uint64_t records = 0;
  uint64_t bytes = 0;
  uint64_t chunks = 0;
  std::optional<int64_t> watermark;  // the last one written
  bool closed = false;

  ZSTD_CCtx* cctx = nullptr;  // one for every chunk (its tables are reused)

  ~Impl() {
    if (fd >= 0) ::close(fd);
    ZSTD_freeCCtx(cctx);
  }

  Status write_all(const uint8_t* p, size_t n) {
    const uint64_t at = bytes;
    while (n > 0) {
      ssize_t w = ::write(fd, p, n);
      if (w < 0) {
        if (errno == EINTR) continue;
        failed = Status::from_errno(fmt::format("{}: write at byte offset {}", path, at));
        return failed;
      }
      if (w == 0) {
        failed =
            Status(Errc::kIo, fmt::format("{}: write at byte offset {} wrote nothing", path, at));
        return failed;
      }
      p += w;
      n -= static_cast<size_t>(w);
      bytes += static_cast<uint64_t>(w);
    }
    return Status::ok();
  }

  // Writes `raw` as one chunk of `type` holding `count` items.
  Status write_chunk(ChunkType type, uint32_t count, bool try_compress, uint16_t flags = 0) {
    if (!failed.is_ok()) return failed;
    if (raw.size() > kTraceMaxChunkBytes) {
      return Status(Errc::kInvalidArgument,
                    fmt::format("{}: {} chunk of {} bytes exceeds the {} byte limit", path,
                                chunk_type_name(static_cast<uint16_t>(type)), raw.size(),
                                kTraceMaxChunkBytes));
    }
    // out only grows: resizing it for every chunk would clear it first.
    auto room = [&](size_t n) {
      if (out.size() < kTraceChunkHeaderSize + n) out.resize(kTraceChunkHeaderSize + n);
    };
    size_t stored = raw.size();
    if (try_compress && !raw.empty() && !cctx) cctx = ZSTD_createCCtx();
    if (try_compress && !raw.empty() && cctx) {  // (without memory for it: stored as it is)
      const size_t bound = ZSTD_compressBound(raw.size());
      room(bound);
      const size_t z = ZSTD_compressCCtx(cctx, out.data() + kTraceChunkHeaderSize, bound,
                                         raw.data(), raw.size(), options.zstd_level);
      if (!ZSTD_isError(z) && z < raw.size()) {
        flags |= kChunkFlagZstd;
        stored = z;
      }
    }
    if (!(flags & kChunkFlagZstd)) {
      room(raw.size());
      if (!raw.empty()) std::memcpy(out.data() + kTraceChunkHeaderSize, raw.data(), raw.size());
    }
    uint8_t* h = out.data();
    put<uint32_t>(h + 0, kTraceChunkMagic);
    put<uint16_t>(h + 4, static_cast<uint16_t>(type));
    put<uint16_t>(h + 6, flags);
    put<uint32_t>(h + 8, static_cast<uint32_t>(stored));
    put<uint32_t>(h + 12, static_cast<uint32_t>(raw.size()));
    put<uint32_t>(h + 16, count);
    uint32_t crc = crc32c(h, 20);
    crc = crc32c_extend(crc, h + kTraceChunkHeaderSize, stored);
    put<uint32_t>(h + 20, crc);
    Status s = write_all(out.data(), kTraceChunkHeaderSize + stored);
    if (!s.is_ok()) return s;
    ++chunks;
    return Status::ok();
  }

  Status flush_records() {
    if (pending.empty()) return failed;
    raw.resize(pending.size() * kRecordSize);
    if (options.columns) {
      encode_columns(raw.data(), pending.data(), pending.size());
    } else {
      for (size_t i = 0; i < pending.size(); ++i) encode(raw.data() + i * kRecordSize, pending[i]);
    }
    Status s = write_chunk(ChunkType::kRecords, static_cast<uint32_t>(pending.size()),
                           options.compress, options.columns ? kChunkFlagColumns : 0);
    if (s.is_ok()) records += pending.size();
    pending.clear();
    return s;
  }

  Status write_metadata(const TraceMetadata& m) {
    std::string text = trace_metadata_to_json(m);
    raw.assign(text.begin(), text.end());
    return write_chunk(ChunkType::kMetadata, 1, false);
  }
};

TraceWriter::TraceWriter(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
TraceWriter::TraceWriter(TraceWriter&&) noexcept = default;
TraceWriter& TraceWriter::operator=(TraceWriter&&) noexcept = default;
TraceWriter::~TraceWriter() {
  if (impl_ && impl_->fd >= 0) (void)close();
}

Result<TraceWriter> TraceWriter::open(const std::string& path, const TraceMetadata& metadata,
                                      TraceWriterOptions options) {
  if (options.records_per_chunk == 0 ||
      options.records_per_chunk * kRecordSize > kTraceMaxChunkBytes) {
    return Status(Errc::kInvalidArgument,
                  fmt::format("{}: records_per_chunk {} out of range 1..{}", path,
                              options.records_per_chunk, kTraceMaxChunkBytes / kRecordSize));
  }
  auto impl = std::make_unique<Impl>();
  impl->path = path;
  impl->options = options;
  // Created here, or an existing file truncated (options.replace)?  A file
  // created here and left without its header (a full disk) is removed;
  // another is not ours.
  bool created = true;
  impl->fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
  if (impl->fd < 0 && errno == EEXIST && options.replace) {
    created = false;
    impl->fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  }
  if (impl->fd < 0) return Status::from_errno(path + ": open for writing");
  auto fail = [&](Status s) {
    if (created) ::unlink(path.c_str());
    return s;
  };
  impl->pending.reserve(options.records_per_chunk);

  uint8_t header[kTraceFileHeaderSize] = {};
  std::memcpy(header, kTraceMagic, 8);
  put<uint32_t>(header + 8, options.watermarks ? kTraceVersion : kTraceVersionOrdered);
  put<uint32_t>(header + 12, static_cast<uint32_t>(kTraceFileHeaderSize));
  put<uint64_t>(header + 16, 0);  // flags, none defined
  put<uint32_t>(header + 24, 0);
  put<uint32_t>(header + 28, crc32c(header, 28));
  Status s = impl->write_all(header, sizeof header);
  if (!s.is_ok()) return fail(s);
  s = impl->write_metadata(metadata);
  if (!s.is_ok()) return fail(s);
  return TraceWriter(std::move(impl));
}

Status TraceWriter::append_metadata(const TraceMetadata& more) {
  if (!impl_->failed.is_ok()) return impl_->failed;
  // Records of the new sources come after their metadata.
  Status s = impl_->flush_records();
  if (!s.is_ok()) return s;
  return impl_->write_metadata(more);
}

Status TraceWriter::append_records(std::span<const TraceRecord> records) {
  Impl& d = *impl_;
  if (!d.failed.is_ok()) return d.failed;
  if (d.fd < 0) return Status(Errc::kInvalidArgument, d.path + ": writer is closed");
  while (!records.empty()) {
    size_t room = d.options.records_per_chunk - d.pending.size();
    size_t n = std::min(room, records.size());
    d.pending.insert(d.pending.end(), records.begin(), records.begin() + static_cast<ptrdiff_t>(n));
    records = records.subspan(n);
    if (d.pending.size() >= d.options.records_per_chunk) {
      Status s = d.flush_records();
      if (!s.is_ok()) return s;
    }
  }
  return Status::ok();
}

Status TraceWriter::append_sync_samples(std::span<const TraceSyncSample> samples) {
  Impl& d = *impl_;
  while (!samples.empty()) {
    size_t n = std::min(samples.size(), size_t{kTraceMaxChunkBytes / kSyncSampleSize});
    d.raw.resize(n * kSyncSampleSize);
    for (size_t i = 0; i < n; ++i) encode(d.raw.data() + i * kSyncSampleSize, samples[i]);
    Status s = d.write_chunk(ChunkType::kSyncSamples, static_cast<uint32_t>(n), false);
    if (!s.is_ok()) return s;
    samples = samples.subspan(n);
  }
  return d.failed;
}

Status TraceWriter::append_clock_model(const TraceClockModel& model) {
  Impl& d = *impl_;
  d.raw.resize(kClockModelSize);
  encode(d.raw.data(), model);
  return d.write_chunk(ChunkType::kClockModels, 1, false);
}

Status TraceWriter::append_loss(const TraceLoss& loss) {
  Impl& d = *impl_;
  d.raw.resize(kLossSize);
  encode(d.raw.data(), loss);
  return d.write_chunk(ChunkType::kLoss, 1, false);
}

Status TraceWriter::append_watermark(int64_t host_ns) {
  Impl& d = *impl_;
  if (!d.options.watermarks)
    return Status(Errc::kInvalidArgument,
                  d.path + ": a watermark in a trace opened without watermarks (version 1)");
  // What was appended so far is one stretch in time order, whatever follows.
  if (Status s = d.flush_records(); !s.is_ok()) return s;
  if (d.watermark && host_ns <= *d.watermark) return d.failed;
  d.raw.resize(kWatermarkSize);
  put<int64_t>(d.raw.data(), host_ns);
  Status s = d.write_chunk(ChunkType::kWatermark, 1, false);
  if (s.is_ok()) d.watermark = host_ns;
  return s;
}

Status TraceWriter::flush() {
  Impl& d = *impl_;
  Status s = d.flush_records();
  if (!s.is_ok()) return s;
  if (d.options.sync_on_flush && ::fdatasync(d.fd) != 0) {
    d.failed = Status::from_errno(d.path + ": fdatasync");
    return d.failed;
  }
  return Status::ok();
}

Status TraceWriter::close() {
  Impl& d = *impl_;
  if (d.closed) return Status::ok();
  if (d.fd < 0) return d.failed;
  Status s = d.flush_records();
  if (s.is_ok()) {
    d.raw.resize(kEndSize);
    put<uint64_t>(d.raw.data(), d.records);
    put<uint64_t>(d.raw.data() + 8, d.chunks);
    s = d.write_chunk(ChunkType::kEnd, 1, false);
  }
  // A pipe, socket or character device has nothing to sync (EINVAL): the
  // trace is complete once written.  A file's fsync error is real.
  if (s.is_ok() && ::fsync(d.fd) != 0 && errno != EINVAL)
    s = Status::from_errno(d.path + ": fsync");
  if (::close(d.fd) != 0 && s.is_ok()) s = Status::from_errno(d.path + ": close");
  d.fd = -1;
  if (!s.is_ok() && d.failed.is_ok()) d.failed = s;
  if (s.is_ok()) {
    d.closed = true;
    d.failed = Status(Errc::kInvalidArgument, d.path + ": writer is closed");
  }
  return s;
}

uint64_t TraceWriter::records_written() const { return impl_->records; }
uint64_t TraceWriter::bytes_written() const { return impl_->bytes; }
uint64_t TraceWriter::chunks_written() const { return impl_->chunks; }

}  // namespace perfq
