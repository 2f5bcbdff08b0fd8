// Chrome Trace Event Format export (JSON; chrome://tracing, Perfetto UI).
#include "analysis/export/export_internal.h"

#include <algorithm>
#include <map>
#include <set>
#include <vector>

namespace perfq::export_detail {

namespace {

std::string json_escape(std::string_view s) {
  std::string o;
  o.reserve(s.size() + 2);
  for (unsigned char c : s) {
    switch (c) {
      case '"':
        o += "\\\"";
        break;
      case '\\':
        o += "\\\\";
        break;
      case '\n':
        o += "\\n";
        break;
      case '\r':
        o += "\\r";
        break;
      case '\t':
        o += "\\t";
        break;
      default:
        if (c < 0x20 || c >= 0x7f) {
          o += fmt::format("\\u{:04x}", c < 0x20 ? c : '?');
        } else {
          o += static_cast<char>(c);
        }
    }
  }
  return o;
}

std::string us(int64_t ns) {
  // Exact decimal microseconds with ns precision.
  const char* sign = ns < 0 ? "-" : "";
  uint64_t a = ns < 0 ? uint64_t(0) - static_cast<uint64_t>(ns) : static_cast<uint64_t>(ns);
  return fmt::format("{}{}.{:03}", sign, a / 1000, a % 1000);
}

// Every slice is one complete event (X) or a B/E pair of one name on one
// thread, well nested: an END takes the name of the BEGIN it closes, one
// with nothing open is an instant, and slices still open at the end close
// at the last time seen (speedscope and chrome://tracing both insist).
// 64-bit values are strings (a JavaScript number keeps 53 bits).  Host
// threads carry their kernel tid and name where the trace has them; a
// process appears once it has a record.
class ChromeExport : public TraceVisitor {
 public:
  explicit ChromeExport(OutFile& out) : out_(out) {}
  Status start() { return out_.write("{\"displayTimeUnit\":\"ns\",\"traceEvents\":[\n"); }
  Status finish() {
    buf_.clear();
    for (auto& [key, t] : threads_) {
      while (!t.open.empty()) {
        // Still open at the end of the trace: closed at its last time.
        emit(fmt::format(
            "{{\"name\":\"{}\",\"ph\":\"E\",\"cat\":\"perfq\",\"ts\":{},\"pid\":{},\"tid\":{},{}}}",
            t.open.back().first, us(last_ns_), t.pid, t.tid, t.open.back().second));
        t.open.pop_back();
      }
    }
    buf_ += "\n]}\n";
    return out_.write(buf_);
  }

  Status on_metadata(const TraceMetadata& m) override {
    names_.set_metadata(m);
    return Status::ok();
  }

  Status on_records(std::span<const TraceRecord> recs) override {
    buf_.clear();
    for (const auto& r : recs) record(r);
    return out_.write(buf_);
  }

 private:
  struct Thread {
    uint32_t pid = 0;
    uint32_t tid = 0;
    // The open B events' name and args, innermost last: their E repeats both
    // (speedscope matches an E to its B by the two).
    std::vector<std::pair<std::string, std::string>> open;
  };

  void emit(const std::string& ev) {
    if (!first_) buf_ += ",\n";
    first_ = false;
    buf_ += ev;
  }

  // A process's name, at its first record: the kind, name and source id.
  void process(uint16_t source, uint32_t pid) {
    if (!named_.insert(source).second) return;
    const TraceSource* s = names_.metadata().find_source(source);
    std::string name =
        s ? std::string(trace_source_kind_name(s->kind)) + " " + names_.source_name(source)
          : names_.source_name(source);
    if (s && s->kind == TraceSourceKind::kDevice && !s->pci_address.empty())
      name += " " + s->pci_address;
    name += fmt::format(" (source {})", source);
    emit(fmt::format(
        "{{\"name\":\"process_name\",\"cat\":\"__metadata\",\"ph\":\"M\",\"ts\":0,\"pid\":{},"
        "\"tid\":0,\"args\":{{\"name\":\"{}\"}}}}",
        pid, json_escape(name)));
  }

  // The thread of a (source, stream): a host thread by its kernel tid and
  // name where known; a device stream or a CPU by its number.
  Thread& thread(uint16_t source, uint16_t stream) {
    auto [it, fresh] = threads_.try_emplace((uint32_t{source} << 16) | stream);
    Thread& t = it->second;
    if (!fresh) return t;
    t.pid = names_.pid(source);
    process(source, t.pid);
    const TraceThread* th = names_.thread(source, stream);
    std::string name;
    if (names_.is_device(source)) {
      t.tid = stream + 1u;  // tid 0 is taken for the process by some viewers
      name = fmt::format("stream {}", stream);
    } else if (names_.is_kernel(source)) {
      t.tid = stream + 1u;
      name = fmt::format("cpu {}", stream);
    } else if (th && th->tid) {
      t.tid = names_.host_id(source, th->tid);
      name = th->name.empty() ? fmt::format("thread {}", th->tid) : th->name;
    } else {
      t.tid = t.pid * 100000u % 0x7fffffffu + stream;  // unknown: distinct per process
      name = th && !th->name.empty() ? th->name : fmt::format("thread {}", stream);
    }
    emit(fmt::format(
        "{{\"name\":\"thread_name\",\"cat\":\"__metadata\",\"ph\":\"M\",\"ts\":0,\"pid\":{},"
        "\"tid\":{},\"args\":{{\"name\":\"{}\"}}}}",
        t.pid, t.tid, json_escape(name)));
    return t;
  }

  void record(const TraceRecord& r) {
    uint16_t source = r.source, stream = r.rec.stream;
    if (names_.is_kernel(source)) {
      // A kernel event of an application thread goes on that thread.
      if (const auto* th = names_.thread_of_tid(r.source, static_cast<uint32_t>(r.rec.arg))) {
        source = th->first;
        stream = th->second;
      }
    }
    Thread& t = thread(source, stream);
    last_ns_ = std::max(last_ns_, r.time_ns);
    const auto& ev = names_.event(r.source, r.rec.event);
    std::string name = json_escape(ev.name);
    const std::string common = fmt::format("\"cat\":\"perfq\",\"ts\":{},\"pid\":{},\"tid\":{}",
                                           us(r.time_ns), t.pid, t.tid);
    // An arg of two 32-bit numbers shows them under their names.
    const std::string arg =
        ev.two_args() ? fmt::format("\"{}\":{},\"{}\":{}", json_escape(ev.arg_hi), r.rec.arg >> 32,
                                    json_escape(ev.arg_lo), r.rec.arg & 0xffffffffu)
                      : fmt::format("\"{}\":\"{}\"", json_escape(ev.arg_name), r.rec.arg);
    const std::string args = fmt::format(
        "\"args\":{{\"source\":{},\"stream\":{},\"index\":\"{}\",{},\"raw_time\":\"{}\"}}",
        r.source, r.rec.stream, r.rec.index, arg, r.rec.time);
    // A job's flow binds to the slice around it (bp "e"): at an END, before
    // the slice closes.
    std::string flow;
    if (ev.role != kNoRole) {
      static constexpr const char* kPh[] = {"s", "t", "t", "f"};
      // Ids as strings: JSON numbers above 2^53 lose bits in JavaScript viewers.
      flow = fmt::format("{{\"name\":\"job\",\"ph\":\"{}\",\"id\":\"{:#x}\",{}{}}}", kPh[ev.role],
                         r.rec.arg, common, ev.role == kSubmit ? "" : ",\"bp\":\"e\"");
    }
    if (r.kind() == PERFQ_KIND_END && !flow.empty()) {
      emit(flow);
      flow.clear();
    }
    switch (r.kind()) {
      case PERFQ_KIND_BEGIN:
        emit(fmt::format("{{\"name\":\"{}\",\"ph\":\"B\",{},{}}}", name, common, args));
        t.open.emplace_back(name, args);
        break;
      case PERFQ_KIND_END:
        if (t.open.empty()) {
          emit(fmt::format(
              "{{\"name\":\"{} (end of nothing open)\",\"ph\":\"i\",\"s\":\"t\",{},{}}}", name,
              common, args));
        } else {
          emit(fmt::format("{{\"name\":\"{}\",\"ph\":\"E\",{},{}}}", t.open.back().first, common,
                           t.open.back().second));
          t.open.pop_back();
        }
        break;
      case PERFQ_KIND_COUNTER:
        emit(fmt::format("{{\"name\":\"{}\",\"ph\":\"C\",{},\"args\":{{\"value\":{}}}}}", name,
                         common, r.rec.arg));
        break;
      case PERFQ_KIND_LOST:
        emit(fmt::format("{{\"name\":\"lost\",\"ph\":\"i\",\"s\":\"t\",{},{}}}", common, args));
        break;
      default:
        if (ev.role == kSubmit || ev.role == kComplete) {
          // A zero-length complete event: a slice the job flow can bind to.
          emit(fmt::format("{{\"name\":\"{}\",\"ph\":\"X\",\"dur\":0,{},{}}}", name, common, args));
        } else {
          emit(fmt::format("{{\"name\":\"{}\",\"ph\":\"i\",\"s\":\"t\",{},{}}}", name, common,
                           args));
        }
        break;
    }
    if (!flow.empty()) emit(flow);
  }

  OutFile& out_;
  Names names_;
  std::string buf_;
  bool first_ = true;
  int64_t last_ns_ = 0;
  std::set<uint16_t> named_;
  std::map<uint32_t, Thread> threads_;
};

}  // namespace

Status export_chrome_json(OutFile& file, const std::string& out, const ReadTrace& read) {
  Status s;
  if (s = file.open(out); !s.is_ok()) return s;
  ChromeExport v(file);
  if (s = v.start(); !s.is_ok()) return s;
  if (s = read(v); !s.is_ok()) return s;
  return v.finish();
}

}  // namespace perfq::export_detail
