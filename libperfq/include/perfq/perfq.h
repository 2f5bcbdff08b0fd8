/*
 * perfq.h - the host instrumentation API (C11 and C++).
 *
 * An instrumented application records events into one shared-memory ring
 * per thread that perfq-daemon drains.  Recording an event is a 32-byte
 * store and a release of the ring's tail: no lock, no system call, no
 * allocation, no wait.  A full ring refuses the record and counts it lost.
 *
 *   uint32_t submit = perfq_event("job_submit", PERFQ_KIND_INSTANT);
 *   ...
 *   perfq_instant(submit, job_id);
 *
 * Connection.  The first call of any perfq_* function (or perfq_init())
 * starts a background connector thread that connects to the daemon's
 * control socket: perfq_init()'s socket_path if not NULL, else the
 * environment variable PERFQ_SOCKET if set, else PERFQ_DEFAULT_SOCKET.
 * While there is no daemon, the connector retries with a back-off of up to
 * about a second, and recording is a cheap no-op (counted as `dropped`).
 * If the daemon goes away, the library notices, drops its rings and
 * reconnects when a daemon comes back.  The application never blocks on
 * the daemon while recording, never crashes and never gets SIGPIPE because
 * of it.
 *
 * Threads.  A thread gets its ring on its first event after a connection
 * (a one-time round trip to the daemon, bounded by a timeout), or up front
 * with perfq_thread_init().  When the thread exits, its ring is marked
 * finished; the daemon drains it to the end and retires it.
 *
 * Time.  Records carry CLOCK_MONOTONIC in ns, the clock of the daemon,
 * of kernel events and of the device's synchronized times.  Where the TSC
 * is invariant and the kernel's clocksource is built on it, it is read
 * with rdtsc and scaled by a map the connector thread measures against
 * clock_gettime and keeps current (a few ns from clock_gettime, at a third
 * of its cost in a VM; see app/host_clock.h); elsewhere, for the first
 * 100-200 ms of a process, and with PERFQ_HOST_CLOCK=monotonic in the
 * environment, with clock_gettime itself.
 *
 * Threading: every function may be called from any thread, at any time,
 * including before perfq_init() and after perfq_shutdown() (then recording
 * is a no-op).  Recording is not async-signal-safe: do not record from a
 * signal handler that may interrupt a recording on the same thread.
 *
 * fork(): the child forgets its parent's connection and rings and, if the
 * library was running, connects as an application of its own on its first
 * perfq_* call.
 */
#ifndef PERFQ_H
#define PERFQ_H

#include <stdint.h>

#include "perfq/perfq_abi.h"

#ifdef __cplusplus
extern "C" {
#endif

#define PERFQ_DEFAULT_SOCKET "/run/perfq/perfqd.sock"
#define PERFQ_SOCKET_ENV "PERFQ_SOCKET"

/*
 * Optional: name the application and choose the socket (NULL: see above),
 * and start connecting.  Returns 0, or -EINVAL for a name or path that is
 * too long, -EALREADY if the library already runs (the call changes
 * nothing then).  Lazy otherwise: the first perfq_* call starts the library
 * with the program's name.
 */
int perfq_init(const char* app_name, const char* socket_path);

/*
 * Register an event name (1..PERFQ_EVENT_NAME_LEN-1 bytes) with the kind
 * it is mostly recorded with (PERFQ_KIND_BEGIN for begin/end pairs,
 * INSTANT, COUNTER).  Returns its id (nonzero), the same id for the same
 * name every time; 0 for an invalid name or kind.  Takes a lock and may
 * talk to the daemon: register once, record often.
 */
uint32_t perfq_event(const char* name, int kind);

/* Record an event with the calling thread's ring.  arg: correlation id,
 * byte count... (counter: the value).  Never blocks. */
void perfq_begin(uint32_t event, uint64_t arg);
void perfq_end(uint32_t event, uint64_t arg);
void perfq_instant(uint32_t event, uint64_t arg);
void perfq_counter(uint32_t event, uint64_t value);
/* Any kind (PERFQ_KIND_BEGIN..PERFQ_KIND_COUNTER). */
void perfq_record_event(uint32_t event, int kind, uint64_t arg);

/*
 * Name the calling thread (NULL: its pthread name) and get its ring now
 * rather than on its first event.  Returns 0 when the thread has a ring,
 * -ENOTCONN when no daemon is connected (the thread gets its ring once one
 * is), another -errno when the daemon refused.
 */
int perfq_thread_init(const char* thread_name);

/* Wait up to timeout_ms for a connection to the daemon; 1 if connected. */
int perfq_wait_connected(int timeout_ms);
int perfq_connected(void);

/* Counts of this process, all threads and connections, since the start. */
struct perfq_stats {
	uint64_t recorded; /* records written into a ring */
	uint64_t dropped; /* not recorded: no daemon connected, or no ring */
	uint64_t not_recording; /* not recorded: the daemon was not recording */
	uint64_t lost; /* not recorded: the thread's ring was full */
	uint64_t connections; /* successful connections to a daemon */
	uint32_t connected; /* 1 while connected */
	uint32_t threads; /* threads that have a ring now */
};
void perfq_get_stats(struct perfq_stats* out);

/*
 * Disconnect and stop the connector (the daemon drains the rings to the
 * end and retires them).  Recording is a no-op afterwards until perfq_init() is called again.  Other threads
 * may go on recording (into nothing) while and after this runs.
 */
void perfq_shutdown(void);

#ifdef __cplusplus
} /* extern "C" */
#endif

#endif /* PERFQ_H */
