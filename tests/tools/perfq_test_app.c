/*
 * perfq_test_app: an instrumented application for the host API tests,
 * written in C11 against perfq.h (it proves the C API compiles as C and
 * links).
 *
 *   perfq_test_app SOCKET MODE THREADS N
 *
 * Every thread records instants of event "tick" with arg = thread << 32 | i.
 * MODE:
 *   record    wait for the daemon (10 s), N events per thread, print stats, exit 0
 *   kill      as record, then print stats and wait forever (to be killed)
 *   midexit   wait for the daemon, threads record without end; exit(0) from
 *             main once N events were recorded in all
 *   early     threads record "early" events until connected (dropped), print
 *             "waiting" once some were dropped; once connected, N "tick" events
 *             per thread; print stats
 *   nodaemon  N events per thread without waiting for anything; print stats
 *   fork      wait for the daemon, N events on the main thread, fork; the child
 *             waits for the daemon and records N events, prints its stats and
 *             exits; then the parent records N more and prints its stats
 * Stats: one JSON line {"pid":..,"recorded":..,"dropped":..,"not_recording":..,
 * "lost":..,"attempted":..,"elapsed_ms":..}.  Exit 3: no daemon in time.
 */
#define _POSIX_C_SOURCE 200809L
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "perfq/perfq.h"

static const char* g_mode;
static unsigned long long g_n;
static uint32_t g_tick, g_early;
static volatile int g_stop;

static double now_ms(void) {
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec / 1e6;
}

static void print_stats(unsigned long long attempted, double elapsed_ms) {
	struct perfq_stats s;
	perfq_get_stats(&s);
	printf("{\"pid\":%d,\"recorded\":%llu,\"dropped\":%llu,\"not_recording\":%llu,\"lost\":%llu,"
	       "\"attempted\":%llu,\"connections\":%llu,\"elapsed_ms\":%.3f}\n",
	       (int)getpid(), (unsigned long long)s.recorded, (unsigned long long)s.dropped,
	       (unsigned long long)s.not_recording, (unsigned long long)s.lost, attempted,
	       (unsigned long long)s.connections, elapsed_ms);
	fflush(stdout);
}

static void* worker(void* p) {
	const uint64_t t = (uint64_t)(uintptr_t)p;
	char name[16];
	snprintf(name, sizeof(name), "worker-%u", (unsigned)t);
	if (strcmp(g_mode, "early") == 0) {
		while (!perfq_connected()) perfq_instant(g_early, t);
		/* The ring comes on the first event after the connection (or here). */
		perfq_thread_init(name);
	} else if (strcmp(g_mode, "nodaemon") != 0) {
		if (perfq_thread_init(name) != 0) {
			fprintf(stderr, "perfq_test_app: thread %u has no ring\n", (unsigned)t);
			exit(4);
		}
	}
	if (strcmp(g_mode, "midexit") == 0) {
		for (uint64_t i = 0; !g_stop; ++i) perfq_instant(g_tick, t << 32 | (i & 0xffffffffu));
		return NULL;
	}
	for (uint64_t i = 0; i < g_n; ++i) perfq_instant(g_tick, t << 32 | i);
	return NULL;
}

int main(int argc, char** argv) {
	if (argc != 5) {
		fprintf(stderr, "usage: perfq_test_app SOCKET MODE THREADS N\n");
		return 2;
	}
	g_mode = argv[2];
	const unsigned threads = (unsigned)strtoul(argv[3], NULL, 10);
	g_n = strtoull(argv[4], NULL, 10);
	if (threads == 0 || threads > 64) return 2;
	const double start = now_ms();
	if (perfq_init("perfq-test-app", argv[1]) != 0) return 2;
	g_tick = perfq_event("tick", PERFQ_KIND_INSTANT);
	g_early = perfq_event("early", PERFQ_KIND_INSTANT);
	if (!g_tick || !g_early) return 2;
	const int wait = strcmp(g_mode, "record") == 0 || strcmp(g_mode, "kill") == 0 ||
			 strcmp(g_mode, "midexit") == 0 || strcmp(g_mode, "fork") == 0;
	if (wait && !perfq_wait_connected(10000)) {
		fprintf(stderr, "perfq_test_app: no daemon at %s\n", argv[1]);
		return 3;
	}
	if (strcmp(g_mode, "fork") == 0) {
		uint64_t i;
		for (i = 0; i < g_n; ++i) perfq_instant(g_tick, i);
		fflush(stdout);
		const pid_t child = fork();
		if (child < 0) return 5;
		if (child == 0) {
			struct perfq_stats s;
			perfq_get_stats(&s);
			if (s.connected) return 6; /* the parent's connection is not the child's */
			if (!perfq_wait_connected(10000)) return 3;
			for (i = 0; i < g_n; ++i) perfq_instant(g_tick, 1000000 + i);
			print_stats(g_n, now_ms() - start);
			perfq_shutdown();
			return 0;
		}
		int st = 0;
		waitpid(child, &st, 0);
		if (!WIFEXITED(st) || WEXITSTATUS(st) != 0) {
			fprintf(stderr, "perfq_test_app: child status 0x%x\n", (unsigned)st);
			return 7;
		}
		for (i = 0; i < g_n; ++i) perfq_instant(g_tick, g_n + i);
		print_stats(2 * g_n, now_ms() - start);
		perfq_shutdown();
		return 0;
	}
	pthread_t th[64];
	for (unsigned t = 0; t < threads; ++t)
		pthread_create(&th[t], NULL, worker, (void*)(uintptr_t)t);
	if (strcmp(g_mode, "early") == 0) {
		struct perfq_stats s;
		do {
			perfq_get_stats(&s);
		} while (s.dropped == 0 && !s.connected);
		printf("waiting\n");
		fflush(stdout);
	}
	if (strcmp(g_mode, "midexit") == 0) {
		struct perfq_stats s;
		do {
			perfq_get_stats(&s);
		} while (s.recorded < g_n);
		exit(0); /* threads still recording */
	}
	for (unsigned t = 0; t < threads; ++t) pthread_join(th[t], NULL);
	print_stats((unsigned long long)threads * g_n, now_ms() - start);
	if (strcmp(g_mode, "kill") == 0)
		for (;;) pause();
	perfq_shutdown();
	return 0;
}
