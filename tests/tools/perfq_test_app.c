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
 *   quiet     wait for the daemon, N events on the main thread, print stats,
 *             and wait forever with the thread alive and its ring kept (to be
 *             killed): a partly filled chunk that nothing completes
 *   midexit   wait for the daemon, threads record without end; exit(0) from
 *             main once N events were recorded in all
 *   early     threads record "early" events until connected (dropped), print
 *             "waiting" once some were dropped; once connected, N "tick" events
 *             per thread; print stats
 *   nodaemon  N events per thread without waiting for anything; print stats
 *   fork      wait for the daemon, N events on the main thread, fork; the child
 *             waits for the daemon and records N events, prints its stats and
 *             exits; then the parent records N more and prints its stats
 *   scopes    wait for the daemon; on the main thread, N times: PERFQ_SCOPE of
 *             "span", PERFQ_SCOPE_IN of "on_span" (category "on") and of
 *             "off_span" (category "off"), an instant "off_tick" if "off" is
 *             enabled, and a function that returns from inside PERFQ_SCOPE of
 *             "early_return"; then enables "off" and records N "off_span"
 *             scopes more.  Arg: the iteration.  Before that, three refused
 *             calls whose errno it checks (exit 8 if wrong): a name of 48
 *             bytes, "span" again as an instant, a category of 48 bytes.
 *             Run it with PERFQ_CATEGORIES="-*,on" in its environment.
 * Stats: one JSON line {"pid":..,"recorded":..,"dropped":..,"not_recording":..,
 * "lost":..,"attempted":..,"elapsed_ms":..}.  Exit 3: no daemon in time.
 */
#define _POSIX_C_SOURCE 200809L
#include <errno.h>
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
	       "\"attempted\":%llu,\"connections\":%llu,\"errors\":%llu,\"elapsed_ms\":%.3f}\n",
	       (int)getpid(), (unsigned long long)s.recorded, (unsigned long long)s.dropped,
	       (unsigned long long)s.not_recording, (unsigned long long)s.lost, attempted,
	       (unsigned long long)s.connections, (unsigned long long)s.errors, elapsed_ms);
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

static int returns_early(uint32_t event, uint64_t i) {
	PERFQ_SCOPE(event, i);
	if (i % 2 == 0)
		return 0;
	return 1;
}

/* Mode "scopes": see the top of the file. */
static int scopes(void) {
	char long_name[PERFQ_EVENT_NAME_LEN + 1];
	memset(long_name, 'x', PERFQ_EVENT_NAME_LEN);
	long_name[PERFQ_EVENT_NAME_LEN] = '\0';
	const uint32_t span = perfq_event("span", PERFQ_KIND_BEGIN);
	const uint32_t on_span = perfq_event("on_span", PERFQ_KIND_BEGIN);
	const uint32_t off_span = perfq_event("off_span", PERFQ_KIND_BEGIN);
	const uint32_t off_tick = perfq_event("off_tick", PERFQ_KIND_INSTANT);
	const uint32_t early = perfq_event("early_return", PERFQ_KIND_BEGIN);
	if (!span || !on_span || !off_span || !off_tick || !early) return 2;
	errno = 0;
	if (perfq_event(long_name, PERFQ_KIND_INSTANT) != 0 || errno != ENAMETOOLONG) return 8;
	errno = 0;
	if (perfq_event("span", PERFQ_KIND_INSTANT) != 0 || errno != EEXIST) return 8;
	errno = 0;
	const struct perfq_category* bad = perfq_category(long_name);
	if (!bad || perfq_category_enabled(bad) || errno != ENAMETOOLONG) return 8;
	if (perfq_category_enable(long_name, 1) != -ENAMETOOLONG || perfq_category_enabled(bad))
		return 8;
	struct perfq_category* on = perfq_category("on");
	struct perfq_category* off = perfq_category("off");
	if (perfq_category("on") != on) return 8;
	if (perfq_thread_init("scopes") != 0) return 4;
	uint64_t i;
	for (i = 0; i < g_n; ++i) {
		PERFQ_SCOPE(span, i);
		PERFQ_SCOPE_IN(on, on_span, i);
		PERFQ_SCOPE_IN(off, off_span, i);
		if (perfq_category_enabled(off)) perfq_instant(off_tick, i);
		returns_early(early, i);
	}
	if (perfq_category_enable("off", 1) != 0 || !perfq_category_enabled(off)) return 8;
	for (i = 0; i < g_n; ++i) {
		PERFQ_SCOPE_IN(off, off_span, g_n + i);
	}
	print_stats(g_n, 0);
	perfq_shutdown();
	return 0;
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
			 strcmp(g_mode, "midexit") == 0 || strcmp(g_mode, "fork") == 0 ||
			 strcmp(g_mode, "scopes") == 0 || strcmp(g_mode, "quiet") == 0;
	if (wait && !perfq_wait_connected(10000)) {
		fprintf(stderr, "perfq_test_app: no daemon at %s\n", argv[1]);
		return 3;
	}
	if (strcmp(g_mode, "scopes") == 0)
		return scopes();
	if (strcmp(g_mode, "quiet") == 0) {
		for (uint64_t i = 0; i < g_n; ++i) perfq_instant(g_tick, i);
		print_stats(g_n, now_ms() - start);
		for (;;) pause();
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
