/*
 * perfq_pingpong: two instrumented programs that exchange messages, for the
 * multi-host test (tests/tools/multihost_test.sh): each send and each
 * receive is recorded with the message's id as arg, so that a merged trace
 * shows every message leave before it arrives.
 *
 *   perfq_pingpong PERFQ_SOCKET serve PATH N    answer N pings on the Unix
 *                                               socket PATH, then exit
 *   perfq_pingpong PERFQ_SOCKET ping PATH N     send N pings (1 ms apart) to
 *                                               PATH, each waiting for its pong
 * Events: msg_send and msg_recv (instants); a ping's id is i + 1, its pong's
 * i + 1 + (1 << 32).  Exit 0 once all went through, 3 with no daemon, 4 when
 * the peer could not be reached.
 */
#define _POSIX_C_SOURCE 200809L
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

#include "perfq/perfq.h"

static void pause_ms(long ms) {
  struct timespec ts = {ms / 1000, (ms % 1000) * 1000000L};
  nanosleep(&ts, NULL);
}

static int full_io(int fd, uint64_t* v, int out) {
  size_t done = 0;
  while (done < sizeof *v) {
    ssize_t n = out ? write(fd, (char*)v + done, sizeof *v - done)
                    : read(fd, (char*)v + done, sizeof *v - done);
    if (n <= 0) return -1;
    done += (size_t)n;
  }
  return 0;
}

int main(int argc, char** argv) {
  if (argc != 5) {
    fprintf(stderr, "usage: perfq_pingpong PERFQ_SOCKET serve|ping PATH N\n");
    return 2;
  }
  const int serve = strcmp(argv[2], "serve") == 0;
  const long n = atol(argv[4]);
  if (perfq_init(serve ? "pingpong-serve" : "pingpong-ping", argv[1]) != 0 ||
      !perfq_wait_connected(10000))
    return 3;
  const uint32_t sent = perfq_event("msg_send", PERFQ_KIND_INSTANT);
  const uint32_t received = perfq_event("msg_recv", PERFQ_KIND_INSTANT);
  perfq_thread_init(serve ? "server" : "client");
  struct sockaddr_un a;
  memset(&a, 0, sizeof a);
  a.sun_family = AF_UNIX;
  strncpy(a.sun_path, argv[3], sizeof a.sun_path - 1);
  int fd = socket(AF_UNIX, SOCK_STREAM, 0);
  if (fd < 0) return 4;
  if (serve) {
    unlink(argv[3]);
    if (bind(fd, (struct sockaddr*)&a, sizeof a) != 0 || listen(fd, 1) != 0) return 4;
    int c = accept(fd, NULL, NULL);
    if (c < 0) return 4;
    for (long i = 0; i < n; ++i) {
      uint64_t id;
      if (full_io(c, &id, 0) != 0) return 4;
      perfq_instant(received, id);
      id += (uint64_t)1 << 32;
      perfq_instant(sent, id);
      if (full_io(c, &id, 1) != 0) return 4;
    }
    close(c);
  } else {
    int tries = 0;
    while (connect(fd, (struct sockaddr*)&a, sizeof a) != 0) {
      if (++tries > 1000) return 4;
      pause_ms(10);
    }
    for (long i = 0; i < n; ++i) {
      uint64_t id = (uint64_t)i + 1;
      perfq_instant(sent, id);
      if (full_io(fd, &id, 1) != 0 || full_io(fd, &id, 0) != 0) return 4;
      perfq_instant(received, id);
      pause_ms(1);
    }
  }
  close(fd);
  struct perfq_stats st;
  perfq_get_stats(&st);
  printf("{\"recorded\":%llu,\"dropped\":%llu}\n", (unsigned long long)st.recorded,
         (unsigned long long)st.dropped);
  perfq_shutdown();
  return 0;
}
