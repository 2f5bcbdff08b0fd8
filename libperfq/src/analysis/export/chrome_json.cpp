// Chrome Trace Event Format export (JSON; chrome://tracing, Perfetto UI).
#include "analysis/export/export_internal.h"

#include <set>

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

class ChromeExport : public TraceVisitor {
 public:
  explicit ChromeExport(OutFile& out) : out_(out) {}
  Status start() { return out_.write("{\"displayTimeUnit\":\"ns\",\"traceEvents\":[\n"); }
  Status finish() { return out_.write("\n]}\n"); }

  Status on_metadata(const TraceMetadata& m) override {
    names_.set_metadata(m);
    buf_.clear();
    for (const auto& s : m.sources) {
      if (!named_.insert(s.id).second) continue;
      emit(
          fmt::format("{{\"name\":\"process_name\",\"cat\":\"__metadata\",\"ph\":\"M\",\"ts\":0,"
                      "\"pid\":{},\"tid\":0,\"args\":{{\"name\":\"{}\"}}}}",
                      names_.pid(s.id),
                      json_escape(std::string(trace_source_kind_name(s.kind)) + " " + s.name)));
    }
    return out_.write(buf_);
  }

  Status on_records(std::span<const TraceRecord> recs) override {
    buf_.clear();
    for (const auto& r : recs) record(r);
    return out_.write(buf_);
  }

 private:
  void emit(const std::string& ev) {
    if (!first_) buf_ += ",\n";
    first_ = false;
    buf_ += ev;
  }

  void record(const TraceRecord& r) {
    const uint32_t pid = names_.pid(r.source);
    const uint32_t tid = r.rec.stream;
    if (threads_.insert((uint32_t{r.source} << 16) | tid).second) {
      emit(
          fmt::format("{{\"name\":\"thread_name\",\"cat\":\"__metadata\",\"ph\":\"M\",\"ts\":0,"
                      "\"pid\":{},\"tid\":{},\"args\":{{\"name\":\"{} {}\"}}}}",
                      pid, tid, names_.is_device(r.source) ? "queue" : "thread", tid));
    }
    const auto& ev = names_.event(r.source, r.rec.event);
    const std::string name = json_escape(ev.name);
    const std::string ts = us(r.time_ns);
    const std::string common =
        fmt::format("\"cat\":\"perfq\",\"ts\":{},\"pid\":{},\"tid\":{}", ts, pid, tid);
    const std::string args = fmt::format("\"args\":{{\"index\":{},\"arg\":{},\"raw_time\":{}}}",
                                         r.rec.index, r.rec.arg, r.rec.time);
    switch (r.kind()) {
      case PERFQ_KIND_BEGIN:
        emit(fmt::format("{{\"name\":\"{}\",\"ph\":\"B\",{},{}}}", name, common, args));
        break;
      case PERFQ_KIND_END:
        emit(fmt::format("{{\"name\":\"{}\",\"ph\":\"E\",{},{}}}", name, common, args));
        break;
      case PERFQ_KIND_COUNTER:
        emit(fmt::format("{{\"name\":\"{}\",\"ph\":\"C\",{},\"args\":{{\"value\":{}}}}}", name,
                         common, r.rec.arg));
        break;
      case PERFQ_KIND_LOST:
        emit(
            fmt::format("{{\"name\":\"lost\",\"ph\":\"i\",\"s\":\"t\",{},\"args\":{{\"count\":{},"
                        "\"index\":{}}}}}",
                        common, r.rec.arg, r.rec.index));
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
    if (ev.role != kNoRole) {
      static constexpr const char* kPh[] = {"s", "t", "t", "f"};
      // Ids as strings: JSON numbers above 2^53 lose bits in JavaScript viewers.
      emit(fmt::format("{{\"name\":\"job\",\"ph\":\"{}\",\"id\":\"{:#x}\",{}{}}}", kPh[ev.role],
                       r.rec.arg, common, ev.role == kSubmit ? "" : ",\"bp\":\"e\""));
    }
  }

  OutFile& out_;
  Names names_;
  std::string buf_;
  bool first_ = true;
  std::set<uint16_t> named_;
  std::set<uint32_t> threads_;
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
