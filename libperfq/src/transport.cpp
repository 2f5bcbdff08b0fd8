#include "perfq/transport.h"

#include "perfq/timer.h"

#include <thread>

namespace perfq {
namespace {

class ShmTransport final : public DeviceTransport {
 public:
  ShmTransport(std::string spec, Region region)
      : spec_(std::move(spec)), region_(std::move(region)), timer_(region_) {}

  const std::string& spec() const override { return spec_; }
  const Region& region() const override { return region_; }

  Result<std::vector<perfq_clock_sample>> clock_samples(uint32_t round, size_t n,
                                                        std::chrono::microseconds timeout) override {
    if (n == 0 || n > PERFQ_SYNC_MAX_SAMPLES)
      return Status(Errc::kInvalidArgument, "clock samples: n must be 1.." +
                                                std::to_string(PERFQ_SYNC_MAX_SAMPLES));
    std::vector<perfq_clock_sample> out;
    out.reserve(n);
    timer_.open_window(round);
    // The device's server is asleep until the window opens.  Sleep a moment
    // ourselves rather than spin: the woken server then gets a CPU of its
    // own instead of sharing ours (where every read would wait for us to be
    // preempted).  The first read still gets the poll period on top of the
    // timeout, for a device that polls instead of being woken.
    std::this_thread::sleep_for(std::chrono::microseconds(500));
    for (size_t i = 0; i < n; ++i) {
      auto s = timer_.read(i == 0 ? timeout + std::chrono::milliseconds(20) : timeout);
      if (!s) {
        timer_.close_window();
        return Status(s.status().code(), spec_ + ": " + s.status().message());
      }
      out.push_back(*s);
    }
    timer_.close_window();
    return out;
  }

 private:
  std::string spec_;
  Region region_;
  TimerReader timer_;
};

}  // namespace

Result<std::unique_ptr<DeviceTransport>> open_transport(const std::string& spec) {
  if (spec.rfind("shm:", 0) == 0) {
    const std::string path = spec.substr(4);
    if (path.empty())
      return Status(Errc::kInvalidArgument, "device spec 'shm:' needs a path: shm:/dev/shm/NAME");
    auto r = Region::open(path);
    if (!r) return r.status();
    return std::unique_ptr<DeviceTransport>(new ShmTransport(spec, std::move(r.value())));
  }
  if (spec.rfind("/dev/perfq", 0) == 0)
    return Status(Errc::kUnavailable,
                  "device spec '" + spec + "': the /dev/perfqN transport needs the perfq driver, "
                  "which this build does not include yet; use shm:PATH");
  return Status(Errc::kInvalidArgument,
                "device spec '" + spec + "' is not shm:PATH or /dev/perfqN");
}

}  // namespace perfq
