// perfq.hpp compiled with -DPERFQ_DISABLE and linked without libperfq
// (check-disable.sh): it links, runs and records nothing.
#include <perfq/perfq.hpp>

#include <cstdio>

#ifndef PERFQ_DISABLE
#error "build with -DPERFQ_DISABLE"
#endif

int main() {
  static const perfq::Event work{"work"};
  static const perfq::Event tick{"tick", perfq::EventKind::kInstant};
  static const perfq::Event depth{"depth", perfq::EventKind::kCounter};
  static const perfq::Category cat{"cat"};
  static const perfq::Event two{"two", perfq::EventKind::kInstant, "bytes", "queue"};
  if (!work || work.error() != 0 || !two || cat) return 1;
  for (uint64_t i = 0; i < 10; ++i) {
    perfq::Scope s{work, i};
    perfq::Scope t{cat, work, i};
    perfq::span_begin(work, i);
    perfq::span_end(work, i);
    perfq::instant(tick, i);
    perfq::instant(two, perfq::arg2(static_cast<uint32_t>(i), 7));
    perfq::counter(depth, i);
  }
  perfq_stats st{};
  perfq_get_stats(&st);
  if (st.recorded != 0) return 2;
  std::printf("disabled ok\n");
  return 0;
}
