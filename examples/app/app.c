/*
 * perfq-example: an application instrumented with perfq(3).
 *
 *   perfq-example [N]
 *
 * N times (default 1000): a "copy" range in category "io", with two
 * numbers, the bytes and the queue (perfq_event2()), a "done" instant and
 * a "queue" counter.  With perfq-daemon recording, the records land in its trace;
 * without a daemon they are counted as dropped.  PERFQ_CATEGORIES=-io
 * leaves the copies out.  Prints one line: "events E recorded R errors X",
 * E every record the library counted, R those written; exits 1 if a perfq
 * call was refused.
 *
 * Build against the installed perfq: `make` (pkg-config) or CMake
 * (find_package(perfq)), see the Makefile and CMakeLists.txt beside it.
 */
#include <perfq/perfq.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static uint32_t copy_ev, done_ev, queue_ev;
static struct perfq_category* io;

/* The range ends when the function returns. */
static void copy_block(char* dst, const char* src, uint32_t bytes, uint32_t queue) {
  PERFQ_SCOPE_IN(io, copy_ev, PERFQ_ARG2(bytes, queue));
  memcpy(dst, src, bytes);
}

int main(int argc, char** argv) {
  const unsigned long n = argc > 1 ? strtoul(argv[1], NULL, 10) : 1000;
  static char src[4096], dst[4096];

  perfq_init("perfq-example", NULL); /* optional: names the application */
  copy_ev = perfq_event2("copy", PERFQ_KIND_BEGIN, "bytes", "queue");
  done_ev = perfq_event("done", PERFQ_KIND_INSTANT);
  queue_ev = perfq_event("queue", PERFQ_KIND_COUNTER);
  io = perfq_category("io");
  if (!copy_ev || !done_ev || !queue_ev) perror("perfq: an event");
  perfq_wait_connected(200); /* a daemon, if there is one */

  for (unsigned long i = 0; i < n; i++) {
    const uint32_t queue = (uint32_t)(i % 4);
    copy_block(dst, src, (uint32_t)(sizeof(src) >> queue), queue);
    perfq_instant(done_ev, i);
    perfq_counter(queue_ev, queue);
  }

  struct perfq_stats st;
  perfq_get_stats(&st);
  perfq_shutdown();
  printf("events %llu recorded %llu errors %llu\n",
         (unsigned long long)(st.recorded + st.dropped + st.not_recording + st.lost),
         (unsigned long long)st.recorded, (unsigned long long)st.errors);
  return st.errors ? 1 : 0;
}
