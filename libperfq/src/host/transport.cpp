#include "host/transport.h"

#include <fcntl.h>
#include <sys/file.h>
#include <sys/ioctl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <optional>
#include <sstream>
#include <thread>

#include "core/mapping.h"
#include "device/timer.h"
#include "host/fault_guard.h"
#include "perfq/perfq_ioctl.h"

namespace perfq {
namespace {

class ShmTransport final : public DeviceTransport {
 public:
  // A region file truncated under the mapping (by its device, or anyone
  // who may write it) raises SIGBUS on the next access: the fault guard
  // turns that into gone(), as for a revoked /dev/perfqN mapping.
  ShmTransport(std::string spec, Region region)
      : spec_(std::move(spec)),
        region_(std::move(region)),
        timer_(region_),
        guard_(region_.base(), region_.mapped_size(), &gone_) {}

  const std::string& spec() const override { return spec_; }
  const Region& region() const override { return region_; }
  bool gone() const override { return gone_.load(std::memory_order_acquire); }

  void announce_round(std::chrono::microseconds after_last) override {
    if (!gone()) timer_.announce_window(after_last);
  }

  Result<std::vector<perfq_clock_sample>> clock_samples(uint32_t round, size_t n,
                                                        std::chrono::microseconds timeout,
                                                        EnoughReads enough) override {
    if (n == 0 || n > PERFQ_SYNC_MAX_SAMPLES)
      return Status(Errc::kInvalidArgument,
                    "clock samples: n must be 1.." + std::to_string(PERFQ_SYNC_MAX_SAMPLES));
    if (gone())
      return Status(Errc::kUnavailable, spec_ + ": device gone (its region was cut short)");
    std::vector<perfq_clock_sample> out;
    out.reserve(n);
    // A server that was asleep until the window opened: sleep a moment
    // ourselves rather than spin: the woken server then gets a CPU of its
    // own instead of sharing ours (where every read would wait for us to be
    // preempted).  One that was awake for the round (announce_round()) has
    // a CPU already.  The first read still gets the poll period on top of
    // the timeout, for a device that polls instead of being woken.
    if (!timer_.open_window(round)) std::this_thread::sleep_for(std::chrono::microseconds(500));
    const size_t at_least = std::min(n, kMinRoundSamples);
    size_t tight = 0;
    for (size_t i = 0; i < n; ++i) {
      auto s = timer_.read(i == 0 ? timeout + std::chrono::milliseconds(20) : timeout);
      if (!s) {
        if (out.size() >= at_least) break;  // the round keeps what it has
        timer_.close_window();
        return Status(s.status().code(), spec_ + ": " + s.status().message() + " (" +
                                             std::to_string(out.size()) + " of " +
                                             std::to_string(n) + " samples read)");
      }
      out.push_back(*s);
      if (enough.reads > 0 && s->after >= s->before && s->after - s->before <= enough.delay_ns &&
          ++tight >= enough.reads && out.size() >= at_least)
        break;
    }
    timer_.close_window();
    if (gone())
      return Status(Errc::kUnavailable, spec_ + ": device gone (its region was cut short)");
    return out;
  }

 private:
  std::string spec_;
  Region region_;
  TimerReader timer_;
  std::atomic<bool> gone_{false};
  FaultGuardRange guard_;  // declared after region_: unregistered before it is unmapped
};

// The sections the host writes; the driver maps the others read-only.
bool host_writable(int id) {
  return id == PERFQ_SECTION_DEV_CTRL || id == PERFQ_SECTION_HOST_CTRL ||
         id == PERFQ_SECTION_TIMER || id == PERFQ_SECTION_SYNC || id == PERFQ_SECTION_APP;
}

// /dev/perfqN: the region is one reserved address range with each section
// mapped from the driver at its own offset, so Region sees the usual layout.
class DevTransport final : public DeviceTransport {
 public:
  static Result<std::unique_ptr<DeviceTransport>> open(const std::string& spec);

  const std::string& spec() const override { return spec_; }
  const Region& region() const override { return *region_; }
  bool gone() const override { return gone_.load(std::memory_order_acquire); }

  Result<std::vector<perfq_clock_sample>> clock_samples(uint32_t round, size_t n,
                                                        std::chrono::microseconds timeout,
                                                        EnoughReads) override {
    if (n == 0 || n > PERFQ_SYNC_MAX_SAMPLES)
      return Status(Errc::kInvalidArgument,
                    "clock samples: n must be 1.." + std::to_string(PERFQ_SYNC_MAX_SAMPLES));
    if (gone()) return Status(Errc::kUnavailable, spec_ + ": device gone");
    perfq_ioc_clock_samples req;
    std::memset(&req, 0, sizeof(req));
    req.size = sizeof(req);
    req.n = static_cast<uint32_t>(n);
    req.round = round;
    // The kernel spins with interrupts off for each read: its bound is tight.
    const auto ns = std::chrono::duration_cast<std::chrono::nanoseconds>(timeout).count();
    req.timeout_ns = std::clamp<uint64_t>(static_cast<uint64_t>(std::max<int64_t>(ns, 1)), 1,
                                          PERFQ_IOC_TIMEOUT_MAX_NS);
    if (::ioctl(fd_.get(), PERFQ_IOC_CLOCK_SAMPLES, &req) != 0) {
      const int err = errno;
      // The driver hands back the samples it read before a read timed out.
      if (err == ETIMEDOUT && req.count <= n && req.count >= std::min(n, kMinRoundSamples))
        return std::vector<perfq_clock_sample>(req.samples, req.samples + req.count);
      if (err == ENODEV) {
        gone_.store(true, std::memory_order_release);
        return Status(Errc::kUnavailable, spec_ + ": device gone");
      }
      if (err == ETIMEDOUT)
        return Status(Errc::kTimeout, spec_ + ": timer register read timed out after " +
                                          std::to_string(req.timeout_ns / 1000) + " us (" +
                                          std::to_string(req.count) + " of " + std::to_string(n) +
                                          " samples): is the device running?");
      return Status::from_errno(spec_ + ": PERFQ_IOC_CLOCK_SAMPLES", err);
    }
    if (req.count != n)
      return Status(Errc::kCorrupt, spec_ + ": the driver returned " + std::to_string(req.count) +
                                        " of " + std::to_string(n) + " samples");
    return std::vector<perfq_clock_sample>(req.samples, req.samples + n);
  }

 private:
  DevTransport(std::string spec, UniqueFd fd, Mapping range)
      : spec_(std::move(spec)), fd_(std::move(fd)), range_(std::move(range)) {}

  std::string spec_;
  UniqueFd fd_;
  Mapping range_;  // the whole reserved range; the sections are mapped inside it
  std::atomic<bool> gone_{false};
  FaultGuardRange guard_;         // unregistered before range_ is unmapped
  std::optional<Region> region_;  // non-owning: range_ owns the memory
};

Result<std::unique_ptr<DeviceTransport>> DevTransport::open(const std::string& spec) {
  UniqueFd fd(::open(spec.c_str(), O_RDWR | O_CLOEXEC));
  if (!fd.valid()) {
    if (errno == ENOENT)
      return Status(Errc::kNotFound, "open " + spec + ": no such device (is perfq.ko loaded?)");
    return Status::from_errno("open " + spec);
  }
  perfq_ioc_info info;
  std::memset(&info, 0, sizeof(info));
  info.size = sizeof(info);
  if (::ioctl(fd.get(), PERFQ_IOC_INFO, &info) != 0)
    return Status::from_errno(spec + ": PERFQ_IOC_INFO");
  if (info.version != PERFQ_IOC_VERSION)
    return Status(Errc::kCorrupt, spec + ": driver interface version " +
                                      std::to_string(info.version) + ", this build speaks " +
                                      std::to_string(PERFQ_IOC_VERSION));
  const uint64_t len = info.region_size;
  if (len < sizeof(perfq_region_header) || len % PERFQ_PAGE_SIZE != 0 || len > (1ULL << 40))
    return Status(Errc::kCorrupt,
                  spec + ": the driver reports a region of " + std::to_string(len) + " bytes");
  // Reserve the whole range, then map each section over it at its offset.
  void* base = ::mmap(nullptr, len, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  if (base == MAP_FAILED)
    return Status::from_errno(spec + ": reserve " + std::to_string(len) + " bytes");
  Mapping range(base, len);
  auto* b = static_cast<uint8_t*>(base);
  for (int id = 0; id < PERFQ_SECTION_COUNT; ++id) {
    const perfq_section& s = info.sections[id];
    if (s.size == 0) continue;
    if (s.offset > len || s.size > len - s.offset || s.offset % PERFQ_PAGE_SIZE != 0)
      return Status(Errc::kCorrupt,
                    spec + ": section " + section_name(id) + " lies outside the region");
    const int prot = host_writable(id) ? PROT_READ | PROT_WRITE : PROT_READ;
    if (::mmap(b + s.offset, s.size, prot, MAP_SHARED | MAP_FIXED, fd.get(),
               static_cast<off_t>(s.offset)) == MAP_FAILED)
      return Status::from_errno(spec + ": mmap section " + section_name(id));
  }
  std::unique_ptr<DevTransport> t(new DevTransport(spec, std::move(fd), std::move(range)));
  t->guard_ = FaultGuardRange(base, len, &t->gone_);
  // libperfq validates the header itself too: it trusts the driver no more
  // than the device.
  auto r = Region::attach(base, len);
  if (!r) return Status(r.status().code(), spec + ": " + r.status().message());
  t->region_.emplace(std::move(r.value()));
  return std::unique_ptr<DeviceTransport>(std::move(t));
}

// The first line of a /proc file, without its newline ("" if unreadable).
std::string proc_line(const std::string& path) {
  std::ifstream f(path);
  std::string line;
  std::getline(f, line);
  return line;
}

}  // namespace

std::string transport_path(const std::string& spec) {
  return spec.rfind("shm:", 0) == 0 ? spec.substr(4) : spec;
}

std::string flock_holder(const std::string& path) {
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0) return "";
  // /proc/locks: "1: FLOCK  ADVISORY  WRITE 1234 00:1a:5678 0 EOF", the
  // device in hex major:minor, the inode in decimal.
  std::ifstream locks("/proc/locks");
  std::string line;
  while (std::getline(locks, line)) {
    std::istringstream in(line);
    std::string id, type, advisory, mode, dev;
    long pid = 0;
    in >> id >> type;
    if (type == "->") in >> type;  // a waiter
    in >> advisory >> mode >> pid >> dev;
    if (type != "FLOCK" || !in) continue;
    unsigned maj = 0, min = 0;
    unsigned long long ino = 0;
    if (std::sscanf(dev.c_str(), "%x:%x:%llu", &maj, &min, &ino) != 3) continue;
    if (ino != st.st_ino || maj != major(st.st_dev) || min != minor(st.st_dev)) continue;
    if (pid <= 0) return "";
    if (pid == ::getpid()) return "this process (pid " + std::to_string(pid) + ")";
    std::string comm = proc_line("/proc/" + std::to_string(pid) + "/comm");
    return (comm.empty() ? std::string("a process") : comm) + " (pid " + std::to_string(pid) + ")";
  }
  return "";
}

Status DeviceTransport::claim() {
  if (claim_.valid()) return Status::ok();
  const std::string path = transport_path(spec());
  UniqueFd fd(::open(path.c_str(), O_RDONLY | O_CLOEXEC));
  if (!fd.valid()) return Status::from_errno(spec() + ": open to claim it");
  if (::flock(fd.get(), LOCK_EX | LOCK_NB) != 0) {
    const int err = errno;
    if (err != EWOULDBLOCK) return Status::from_errno(spec() + ": flock", err);
    const std::string who = flock_holder(path);
    return Status(Errc::kUnavailable,
                  spec() + ": the device is being recorded by " +
                      (who.empty() ? std::string("another consumer") : who) +
                      "; a device has one consumer at a time (stop that recording first)");
  }
  claim_ = std::move(fd);
  return Status::ok();
}

Result<std::unique_ptr<DeviceTransport>> open_transport(const std::string& spec) {
  if (spec.rfind("shm:", 0) == 0) {
    const std::string path = transport_path(spec);
    if (path.empty())
      return Status(Errc::kInvalidArgument, "device spec 'shm:' needs a path: shm:/dev/shm/NAME");
    auto r = Region::open(path);
    if (!r) return r.status();
    return std::unique_ptr<DeviceTransport>(new ShmTransport(spec, std::move(r.value())));
  }
  if (spec.rfind("/dev/perfq", 0) == 0) return DevTransport::open(spec);
  return Status(Errc::kInvalidArgument,
                "device spec '" + spec + "' is not shm:PATH or /dev/perfqN");
}

}  // namespace perfq
