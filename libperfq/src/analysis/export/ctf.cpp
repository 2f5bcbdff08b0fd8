// CTF 1.8 export: a directory of TSDL metadata and one binary stream; to
// standard output ("-"), that directory as a tar archive.
#include "analysis/export/export_internal.h"

#include <sys/stat.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <map>

namespace perfq::export_detail {

namespace {

constexpr uint32_t kCtfMagic = 0xC1FC1FC1;
constexpr size_t kCtfPacketHeader = 8 + 32;  // packet header + context
constexpr size_t kCtfEventSize = 12 + 41;    // event header + payload
constexpr size_t kCtfPacketBytes = 64 * 1024;

std::string tsdl_escape(std::string_view s) {
  std::string o;
  for (unsigned char c : s) {
    if (c == '"' || c == '\\') {
      o += '\\';
      o += static_cast<char>(c);
    } else if (c < 0x20 || c >= 0x7f) {
      o += '_';
    } else {
      o += static_cast<char>(c);
    }
  }
  return o;
}

class CtfExport : public TraceVisitor {
 public:
  CtfExport(OutFile& stream, std::string dir) : out_(stream), dir_(std::move(dir)) {}

  Status on_metadata(const TraceMetadata& m) override {
    names_.set_metadata(m);
    return Status::ok();
  }

  Status on_records(std::span<const TraceRecord> recs) override {
    for (const auto& r : recs) {
      uint64_t key = (uint64_t{r.source} << 32) | r.rec.event;
      auto [it, fresh] = classes_.try_emplace(key, static_cast<uint32_t>(classes_.size()));
      if (fresh) order_.push_back(key);
      if (packet_.empty()) begin_packet();
      uint64_t ts = r.time_ns < 0 ? 0 : static_cast<uint64_t>(r.time_ns);
      ts = std::max(ts, last_ts_);  // CTF clocks never go back within a stream
      last_ts_ = ts;
      if (packet_.size() == kCtfPacketHeader) packet_begin_ts_ = ts;
      packet_end_ts_ = ts;
      put32(it->second);
      put64(ts);
      put16(r.source);
      put16(r.rec.stream);
      put32(r.rec.event);
      put64(r.rec.index);
      packet_.push_back(static_cast<char>(r.kind()));
      put64(r.rec.time);
      put64(r.rec.arg);
      put64(static_cast<uint64_t>(r.time_ns));
      if (packet_.size() + kCtfEventSize > kCtfPacketBytes) {
        if (Status s = end_packet(); !s.is_ok()) return s;
      }
    }
    return Status::ok();
  }

  Status finish() {
    if (!packet_.empty()) {
      if (Status s = end_packet(); !s.is_ok()) return s;
    }
    OutFile meta;
    if (Status s = meta.open(dir_ + "/metadata"); !s.is_ok()) return s;
    if (Status s = meta.write(metadata_text()); !s.is_ok()) return s;
    return meta.close();
  }

 private:
  void put16(uint16_t v) { packet_.append(reinterpret_cast<const char*>(&v), 2); }
  void put32(uint32_t v) { packet_.append(reinterpret_cast<const char*>(&v), 4); }
  void put64(uint64_t v) { packet_.append(reinterpret_cast<const char*>(&v), 8); }

  void begin_packet() { packet_.assign(kCtfPacketHeader, '\0'); }

  Status end_packet() {
    const uint64_t bits = packet_.size() * 8;
    char* p = packet_.data();
    auto set64 = [p](size_t off, uint64_t v) { std::memcpy(p + off, &v, 8); };
    const uint32_t magic = kCtfMagic, sid = 0;
    std::memcpy(p, &magic, 4);
    std::memcpy(p + 4, &sid, 4);
    set64(8, packet_begin_ts_);
    set64(16, packet_end_ts_);
    set64(24, bits);  // content_size
    set64(32, bits);  // packet_size: no padding
    Status s = out_.write(packet_);
    packet_.clear();
    return s;
  }

  std::string metadata_text() {
    const TraceMetadata& m = names_.metadata();
    std::string t;
    t += "/* CTF 1.8 */\n\n";
    t += "typealias integer { size = 8; align = 8; signed = false; } := uint8_t;\n";
    t += "typealias integer { size = 16; align = 8; signed = false; } := uint16_t;\n";
    t += "typealias integer { size = 32; align = 8; signed = false; } := uint32_t;\n";
    t += "typealias integer { size = 64; align = 8; signed = false; } := uint64_t;\n";
    t += "typealias integer { size = 64; align = 8; signed = true; } := int64_t;\n\n";
    t += "trace {\n\tmajor = 1;\n\tminor = 8;\n\tbyte_order = le;\n"
         "\tpacket.header := struct {\n\t\tuint32_t magic;\n\t\tuint32_t stream_id;\n\t};\n};\n\n";
    t += fmt::format(
        "env {{\n\thostname = \"{}\";\n\tdomain = \"perfq\";\n\ttracer_name = "
        "\"perfq\";\n\tperfq_version = \"{}\";\n}};\n\n",
        tsdl_escape(m.host_name), tsdl_escape(m.perfq_version));
    t += "clock {\n\tname = monotonic;\n\tdescription = \"host CLOCK_MONOTONIC (device times "
         "converted by the sync model)\";\n\tfreq = 1000000000;\n\tprecision = 1;\n"
         "\toffset_s = 0;\n\toffset = 0;\n\tabsolute = false;\n};\n\n";
    t += "typealias integer { size = 64; align = 8; signed = false; map = clock.monotonic.value; "
         "} := uint64_clock_monotonic_t;\n\n";
    t += "stream {\n\tid = 0;\n\tpacket.context := struct {\n"
         "\t\tuint64_clock_monotonic_t timestamp_begin;\n"
         "\t\tuint64_clock_monotonic_t timestamp_end;\n\t\tuint64_t content_size;\n"
         "\t\tuint64_t packet_size;\n\t};\n\tevent.header := struct {\n\t\tuint32_t id;\n"
         "\t\tuint64_clock_monotonic_t timestamp;\n\t};\n};\n\n";
    for (uint64_t key : order_) {
      auto source = static_cast<uint16_t>(key >> 32);
      auto ev = static_cast<uint32_t>(key & 0xffffffff);
      t += fmt::format(
          "event {{\n\tname = \"{}\";\n\tid = {};\n\tstream_id = 0;\n\tfields := struct {{\n"
          "\t\tuint16_t source_id;\n\t\tuint16_t perfq_stream;\n\t\tuint32_t "
          "event_id;\n\t\tuint64_t index;\n"
          "\t\tuint8_t kind;\n\t\tuint64_t raw_time;\n\t\tuint64_t arg;\n\t\tint64_t time_ns;\n"
          "\t}};\n}};\n\n",
          tsdl_escape(names_.event(source, ev).name), classes_.at(key));
    }
    return t;
  }

  OutFile& out_;
  std::string dir_;
  Names names_;
  std::string packet_;
  uint64_t packet_begin_ts_ = 0;
  uint64_t packet_end_ts_ = 0;
  uint64_t last_ts_ = 0;
  std::map<uint64_t, uint32_t> classes_;  // (source, event) -> CTF event id
  std::vector<uint64_t> order_;
};

// One ustar header (POSIX.1-1988) for a regular file or a directory; a size
// past 8 GiB in GNU's base-256 form, which GNU tar and bsdtar read.
std::string tar_header(const std::string& name, uint64_t size, bool dir) {
  std::string h(512, '\0');
  auto put = [&h](size_t off, size_t len, const std::string& v) {
    std::memcpy(&h[off], v.data(), std::min(len, v.size()));
  };
  auto octal = [](uint64_t v, size_t digits) { return fmt::format("{:0{}o}", v, digits); };
  put(0, 100, name);
  put(100, 8, octal(dir ? 0755 : 0644, 7));
  put(108, 8, octal(0, 7));
  put(116, 8, octal(0, 7));
  if (size < (uint64_t{1} << 33)) {
    put(124, 12, octal(size, 11));
  } else {
    h[124] = static_cast<char>(0x80);
    for (int i = 0; i < 8; ++i) h[135 - i] = static_cast<char>((size >> (8 * i)) & 0xff);
  }
  put(136, 12, octal(static_cast<uint64_t>(std::time(nullptr)), 11));
  h[156] = dir ? '5' : '0';
  put(257, 6, std::string("ustar\0", 6));
  put(263, 2, "00");
  std::memset(&h[148], ' ', 8);
  unsigned sum = 0;
  for (unsigned char c : h) sum += c;
  put(148, 8, octal(sum, 6));
  h[154] = '\0';
  return h;
}

// The CTF directory `dir` as a tar archive of ctf/metadata and ctf/stream_0
// into `file` (standard output).
Status write_tar(OutFile& file, const std::string& dir) {
  if (Status s = file.open("-"); !s.is_ok()) return s;
  if (Status s = file.write(tar_header("ctf/", 0, true)); !s.is_ok()) return s;
  std::vector<char> buf(1 << 20);
  for (const char* name : {"metadata", "stream_0"}) {
    const std::string path = dir + "/" + name;
    std::error_code ec;
    const uint64_t size = std::filesystem::file_size(path, ec);
    if (ec) return Status(Errc::kIo, path + ": " + ec.message());
    if (Status s = file.write(tar_header(std::string("ctf/") + name, size, false)); !s.is_ok())
      return s;
    std::ifstream in(path, std::ios::binary);
    uint64_t left = size;
    while (left > 0) {
      const size_t n = static_cast<size_t>(std::min<uint64_t>(left, buf.size()));
      if (!in.read(buf.data(), static_cast<std::streamsize>(n)))
        return Status(Errc::kIo, path + ": read back for the archive failed");
      if (Status s = file.write(buf.data(), n); !s.is_ok()) return s;
      left -= n;
    }
    if (Status s = file.write(std::string((512 - size % 512) % 512, '\0')); !s.is_ok()) return s;
  }
  return file.write(std::string(1024, '\0'));  // the end: two empty blocks
}

}  // namespace

Status export_ctf(OutFile& file, const std::string& out, const ReadTrace& read) {
  if (out == "-") {
    // A directory cannot stream: write it beside the other temporary
    // files, then send it as one tar archive (`| tar -x` gives ctf/).
    const char* tmp = std::getenv("TMPDIR");
    std::string dir = std::string(tmp && *tmp ? tmp : "/tmp") + "/perfq-ctf-XXXXXX";
    if (!::mkdtemp(dir.data())) return Status::from_errno(dir + ": create directory");
    OutFile stream;
    Status s = export_ctf(stream, dir, read);
    if (s.is_ok()) s = stream.close();
    if (s.is_ok()) s = write_tar(file, dir);
    std::error_code ec;
    std::filesystem::remove_all(dir, ec);
    return s;
  }
  if (::mkdir(out.c_str(), 0755) != 0 && errno != EEXIST) {
    return Status::from_errno(out + ": create directory");
  }
  struct stat st;
  if (::stat(out.c_str(), &st) != 0 || !S_ISDIR(st.st_mode)) {
    return Status(Errc::kInvalidArgument, out + ": not a directory");
  }
  Status s;
  if (s = file.open(out + "/stream_0"); !s.is_ok()) return s;
  CtfExport v(file, out);
  if (s = read(v); !s.is_ok()) return s;
  return v.finish();
}

}  // namespace perfq::export_detail
