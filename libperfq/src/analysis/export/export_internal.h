// What the export formats (csv.cpp, chrome_json.cpp, perfetto.cpp,
// ctf.cpp) share: the output file, the event names, and how export_trace()
// (export.cpp) calls each.  Internal to analysis/export/.
#pragma once
#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <functional>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include <fmt/format.h>

#include "analysis/job_roles.h"
#include "perfq/trace.h"

namespace perfq::export_detail {

// A buffered output file whose every failure becomes a Status.  "-" is
// standard output (a copy of the descriptor: closing it leaves fd 1 open,
// and a failed write, a closed pipe included, is still an error).
class OutFile {
 public:
  ~OutFile() {
    if (f_) std::fclose(f_);
  }
  Status open(const std::string& path) {
    if (path == "-") {
      path_ = "standard output";
      const int fd = ::fcntl(STDOUT_FILENO, F_DUPFD_CLOEXEC, 0);
      if (fd < 0) return Status::from_errno(path_ + ": dup");
      f_ = ::fdopen(fd, "wb");
      if (!f_) {
        const int err = errno;
        ::close(fd);
        return Status::from_errno(path_ + ": fdopen", err);
      }
    } else {
      path_ = path;
      f_ = std::fopen(path.c_str(), "wb");
    }
    if (!f_) return Status::from_errno(path + ": open for writing");
    buf_.resize(1 << 20);
    std::setvbuf(f_, buf_.data(), _IOFBF, buf_.size());
    return Status::ok();
  }
  Status write(const void* p, size_t n) {
    if (n && std::fwrite(p, 1, n, f_) != n) return Status::from_errno(path_ + ": write");
    return Status::ok();
  }
  Status write(std::string_view s) { return write(s.data(), s.size()); }
  Status close() {
    if (!f_) return Status::ok();
    bool bad = std::fflush(f_) != 0 || std::ferror(f_);
    int err = errno;
    bool close_bad = std::fclose(f_) != 0;
    if (!bad && close_bad) err = errno;
    f_ = nullptr;
    if (bad || close_bad) return Status::from_errno(path_ + ": write", err);
    return Status::ok();
  }

 private:
  std::string path_;
  FILE* f_ = nullptr;
  std::vector<char> buf_;
};

// Names and job roles of events, looked up once per (source, event).
class Names {
 public:
  struct Info {
    std::string name;
    JobRole role = kNoRole;
    // The names of the arg's upper and lower 32 bits (EventInfo::args), or
    // none: the arg is one number, named arg_name.
    std::string arg_hi, arg_lo;
    std::string arg_name = "arg";
    bool two_args() const { return !arg_hi.empty(); }
  };
  void set_metadata(const TraceMetadata& m) {
    meta_ = m;
    cache_.clear();
    thread_of_tid_.clear();
    for (const auto& s : m.sources)
      for (const auto& t : s.threads)
        thread_of_tid_[(uint64_t{s.host} << 32) | t.tid] = {s.id, t.stream};
  }
  // The host application thread (source, stream) with kernel thread id tid
  // on the host of kernel source `kernel` (a merged trace has several).
  const std::pair<uint16_t, uint16_t>* thread_of_tid(uint16_t kernel, uint32_t tid) const {
    const TraceSource* k = meta_.find_source(kernel);
    auto it = thread_of_tid_.find((uint64_t{k ? k->host : 0u} << 32) | tid);
    return it == thread_of_tid_.end() ? nullptr : &it->second;
  }
  // A host's pids and tids in a viewer's one namespace: those of the k-th
  // host of a merged trace moved up by k x 2^22 (Linux's largest pid_max),
  // so that two hosts' processes never merge into one.
  uint32_t host_id(uint16_t source, uint32_t id) const {
    const TraceSource* s = meta_.find_source(source);
    return s && s->host ? id + (uint32_t{s->host} << 22) : id;
  }
  const TraceThread* thread(uint16_t source, uint16_t stream) const {
    const TraceSource* s = meta_.find_source(source);
    if (!s) return nullptr;
    for (const auto& t : s->threads)
      if (t.stream == stream) return &t;
    return nullptr;
  }
  bool is_kernel(uint16_t id) const {
    const TraceSource* s = meta_.find_source(id);
    return s && s->kind == TraceSourceKind::kKernel;
  }
  const TraceMetadata& metadata() const { return meta_; }
  const Info& event(uint16_t source, uint32_t ev) {
    auto [it, fresh] = cache_.try_emplace((uint64_t{source} << 32) | ev);
    if (fresh) {
      const TraceSource* s = meta_.find_source(source);
      const EventInfo* e = s ? s->find_event(ev) : nullptr;
      it->second.name = e ? e->name : fmt::format("event_{}", ev);
      it->second.role = job_role(it->second.name);
      if (e && e->args.size() == 2 && !e->args[0].empty() && !e->args[1].empty()) {
        it->second.arg_hi = e->args[0];
        it->second.arg_lo = e->args[1];
      } else if (e && e->args.size() == 1 && !e->args[0].empty()) {
        it->second.arg_name = e->args[0];
      }
    }
    return it->second;
  }
  std::string source_name(uint16_t id) const {
    const TraceSource* s = meta_.find_source(id);
    return s ? meta_.source_label(*s) : fmt::format("source_{}", id);
  }
  bool is_device(uint16_t id) const {
    const TraceSource* s = meta_.find_source(id);
    return s && s->kind == TraceSourceKind::kDevice;
  }
  uint32_t pid(uint16_t id) const {
    const TraceSource* s = meta_.find_source(id);
    if (s && s->kind == TraceSourceKind::kHost && s->pid) return host_id(id, s->pid);
    return 1000000u + id;  // synthetic, out of the usual pid range
  }

 private:
  TraceMetadata meta_;
  std::unordered_map<uint64_t, Info> cache_;
  std::unordered_map<uint64_t, std::pair<uint16_t, uint16_t>> thread_of_tid_;  // host << 32 | tid
};

// export_trace()'s pass of the reader over a visitor (a torn tail is no
// error: the export covers what came before it).
using ReadTrace = std::function<Status(TraceVisitor&)>;

// Each format opens `out` in `file` (CTF: the directory `out` and its
// stream file), writes what `read` visits, and leaves `file` to be closed.
Status export_csv(OutFile& file, const std::string& out, const ReadTrace& read);
Status export_chrome_json(OutFile& file, const std::string& out, const ReadTrace& read);
// compress: packets in zlib-compressed batches (TracePacket.compressed_packets).
Status export_perfetto(OutFile& file, const std::string& out, const ReadTrace& read, bool compress);
Status export_ctf(OutFile& file, const std::string& out, const ReadTrace& read);

}  // namespace perfq::export_detail
