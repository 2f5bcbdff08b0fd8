// perfqctl record against perfq-devsim, then perfqctl report on the trace:
// all real processes, a real region, a real trace file.
#include <algorithm>
#include <catch2/catch.hpp>
#include <cmath>
#include <nlohmann/json.hpp>
#include <thread>

#include "test_util.h"

namespace perfq {
namespace {

TEST_CASE("perfqctl record: every device record lands in the trace, synchronized",
          "[perfqctl][record][process]") {
  TempShm shm("record");
  const std::string trace = shm.path() + ".trace";
  // --wait-host: the workers start with the recording's first sync round,
  // so every record they emit is the recording's (a recording holds only
  // what happened after its start).
  Child dev({kBin + "/perfq-devsim", "--region", shm.path(), "--create", "--workers", "2", "--rate",
             "10000", "--duration", "3", "--clock-offset-ns", "-987654321", "--clock-drift-ppm",
             "-40", "--timer-hz", "25000000", "--wait-host"});
  REQUIRE(dev.started());
  // The recorder waits for the device and stops when it stops.
  Child rec({kBin + "/perfqctl", "record", "--device", "shm:" + shm.path(), "-o", trace});
  REQUIRE(rec.started());
  REQUIRE(dev.wait(std::chrono::seconds(60)));
  REQUIRE(rec.wait(std::chrono::seconds(60)));
  INFO("record stderr: " << rec.err());
  REQUIRE(rec.exit_code() == 0);
  REQUIRE(dev.exit_code() == 0);
  auto devjs = nlohmann::json::parse(dev.out());
  CHECK(rec.out().find("wrote " + trace) != std::string::npos);

  Child rep({kBin + "/perfqctl", "report", trace, "--json"});
  REQUIRE(rep.wait(std::chrono::seconds(60)));
  INFO("report stderr: " << rep.err());
  REQUIRE(rep.exit_code() == 0);
  auto js = nlohmann::json::parse(rep.out());
  CHECK(js["records"]["device"] == devjs["emitted"]);
  CHECK(js["lost"]["device"] == 0);
  CHECK(js["causality_violations"] == 0);
  // The model found the device clock's offset and drift, with devsim's
  // signs (one convention: the device clock runs 40 ppm slow), to within 2
  // ppm, or within what its own uncertainty allows over the recording where
  // that is wider: on a saturated machine (sanitizers beside other tests)
  // the rounds are contended, and the model must say so.
  const double span_ns = js["duration_ns"].get<double>();
  REQUIRE(span_ns > 1e9);
  auto drift_tolerance = [&](const nlohmann::json& sync) {
    return std::max(2.0, 3 * sync["uncertainty_ns"].get<double>() / span_ns * 1e6);
  };
  // devsim's D - H = offset + drift x H: at the recording's times, within
  // the drift over the recording (40 ppm of a few seconds) and a margin.
  const double truth_ahead_ns = -987654321.0 - 40e-6 * js["first_ns"].get<double>();
  INFO("online sync: " << js["sync"].dump());
  CHECK(std::abs(js["sync"]["device_fast_ppm"].get<double>() + 40.0) < drift_tolerance(js["sync"]));
  CHECK(std::abs(js["sync"]["device_ahead_ns"].get<double>() - truth_ahead_ns) < 1e6);
  CHECK(js["sync"]["standing"].get<std::string>().find("behind the host, running ") !=
        std::string::npos);
  CHECK(js["sync"]["standing"].get<std::string>().find("ppm slow") != std::string::npos);
  CHECK(js["sync"]["uncertainty_ns"].get<double>() < 100'000);

  // The offline whole-recording model agrees (the timer runs at 25 MHz, the
  // device clock at 1 GHz: resync must use both nominal rates), in sign too.
  Child rs({kBin + "/perfqctl", "report", trace, "--json", "--resync"});
  REQUIRE(rs.wait(std::chrono::seconds(60)));
  INFO("report --resync stderr: " << rs.err());
  REQUIRE(rs.exit_code() == 0);
  auto rj = nlohmann::json::parse(rs.out());
  CHECK(rj["records"]["device"] == devjs["emitted"]);
  INFO("offline sync: " << rj["sync"].dump());
  CHECK(rj["sync"]["resynced"] == true);
  CHECK(std::abs(rj["sync"]["device_fast_ppm"].get<double>() + 40.0) < drift_tolerance(rj["sync"]));
  CHECK(std::abs(rj["sync"]["device_ahead_ns"].get<double>() -
                 js["sync"]["device_ahead_ns"].get<double>()) < 100'000);
  ::unlink(trace.c_str());
}

TEST_CASE("perfqctl record: a missing device is a clear error", "[perfqctl][record][process]") {
  Child rec({kBin + "/perfqctl", "record", "--device", "shm:/dev/shm/perfq-test-no-such-region",
             "-o", "/tmp/perfq-test-never-written.trace"});
  REQUIRE(rec.wait(std::chrono::seconds(30)));
  CHECK(rec.exit_code() == 1);
  CHECK(rec.err().find("perfq-test-no-such-region") != std::string::npos);
}

}  // namespace
}  // namespace perfq
