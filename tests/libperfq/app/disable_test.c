/*
 * Every call and macro of perfq.h, compiled with -DPERFQ_DISABLE and linked
 * without libperfq (check-disable.sh): it links, runs and records nothing.
 * Prints "disabled ok" and exits 0 when the no-ops return what perfq.h says.
 */
#include <perfq/perfq.h>
#include <stdio.h>

#ifndef PERFQ_DISABLE
#error "build with -DPERFQ_DISABLE"
#endif

static int scoped(uint32_t event, struct perfq_category* cat, uint64_t i) {
  PERFQ_SCOPE(event, i);
  PERFQ_SCOPE_IN(cat, event, i);
  return (int)(i & 1);
}

int main(void) {
  if (perfq_init("disabled", NULL) != 0) return 1;
  const uint32_t ev = perfq_event("ev", PERFQ_KIND_BEGIN);
  if (ev == 0) return 2; /* error checks stay quiet */
  const uint32_t two = perfq_event2("two", PERFQ_KIND_INSTANT, "bytes", "queue");
  if (two == 0) return 2;
  const uint32_t bytes = perfq_event_arg("bytes", PERFQ_KIND_INSTANT, PERFQ_ARG_BYTES);
  if (bytes == 0) return 2;
  struct perfq_category* cat = perfq_category("cat");
  if (perfq_category_enable("cat", 1) != 0 || perfq_category_enabled(cat)) return 3;
  if (perfq_thread_init("main") == 0 || perfq_wait_connected(1) || perfq_connected()) return 4;
  int odd = 0;
  for (uint64_t i = 0; i < 10; i++) {
    perfq_begin(ev, i);
    perfq_end(ev, i);
    perfq_instant(two, PERFQ_ARG2(i, 7));
    perfq_instant(bytes, i);
    perfq_counter(ev, i);
    perfq_record_event(ev, PERFQ_KIND_INSTANT, i);
    odd += scoped(ev, cat, i);
  }
  struct perfq_stats st;
  st.recorded = 99;
  perfq_get_stats(&st);
  perfq_read_stats(&st, sizeof(st));
  if (st.recorded != 0 || st.errors != 0 || odd != 5) return 5;
  perfq_shutdown();
  printf("disabled ok\n");
  return 0;
}
