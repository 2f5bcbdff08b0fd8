/*
 * perfq.h - the host instrumentation API (C11 and C++).
 *
 * An instrumented application records events into one shared-memory ring
 * per thread that perfq-daemon drains.  Recording an event is a 32-byte
 * store and a release of the thread's position: no lock, no system call, no
 * allocation, no wait.  The ring's tail is published once per chunk of 64
 * records, so the daemon never reads the cache lines a busy thread is
 * writing; a quiet thread's last records reach the daemon within its poll
 * (2-10 ms) anyway.  A full ring refuses the record and counts it lost.
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
 *
 * Errors are never silent: a call that cannot do what it was asked returns
 * its failure value (0 for an id, NULL never: see perfq_category(), -errno
 * for an int), sets errno to say why and counts the refusal in
 * perfq_stats.errors.  Recording calls have no error: what they could not
 * record is counted (dropped, not_recording, lost).
 *
 * Compile-time switch: with PERFQ_DISABLE defined before this header is
 * included, every function below is a static inline no-op and every macro
 * expands to nothing that records: the program needs no libperfq to link.
 * The no-ops return what a working library without a daemon would, except
 * perfq_event(), perfq_event_arg() and perfq_event2(), which return 1 so that error checks
 * stay quiet.
 *
 * Two numbers in one record (bytes and a queue id): the 32-byte record
 * (perfq_abi.h) has one 64-bit arg.  An event registered with
 * perfq_event2() names the two 32-bit halves of its arg, PERFQ_ARG2()
 * packs them, and the Perfetto and Chrome JSON exports show the two
 * numbers under their names; CSV and CTF carry the packed arg.
 *
 * Byte counts: an event whose arg (perfq_event_arg()) or one of whose two
 * numbers (perfq_event2()) is named PERFQ_ARG_BYTES carries a byte count in
 * it, and `perfqctl report` gives its throughput: bytes per second and per
 * call, and their share of the PCIe link's ceiling.  A range's bytes are
 * its begin's arg (its end's arg is not counted); an instant's are its own.
 *
 * Not in this API, and why: string arguments (interned once, as the
 * Perfetto SDK interns them).  A record carries one 64-bit arg and the
 * trace file's dictionaries name events only; an interned string would
 * need a dictionary of strings per source in the application protocol, the
 * trace's metadata, the reader, every export and the report.  An event name
 * is an interned string: register the few strings you need as instant
 * events.
 */
#ifndef PERFQ_H
#define PERFQ_H

#include <stddef.h>
#include <stdint.h>

#include "perfq/perfq_abi.h"

#ifdef PERFQ_DISABLE
#include <errno.h>
#endif

#ifdef __cplusplus
extern "C" {
#endif

#define PERFQ_DEFAULT_SOCKET "/run/perfq/perfqd.sock"
#define PERFQ_SOCKET_ENV "PERFQ_SOCKET"
#define PERFQ_CATEGORIES_ENV "PERFQ_CATEGORIES"

/* Counts of this process, all threads and connections, since the start. */
struct perfq_stats {
	uint64_t recorded; /* records written into a ring */
	uint64_t dropped; /* not recorded: no daemon connected, or no ring */
	uint64_t not_recording; /* not recorded: the daemon was not recording */
	uint64_t lost; /* not recorded: the thread's ring was full */
	uint64_t connections; /* successful connections to a daemon */
	uint32_t connected; /* 1 while connected */
	uint32_t threads; /* threads that have a ring now */
	/* Added after the first release: perfq_get_stats() fills what the
	 * caller was compiled with (perfq_read_stats()). */
	uint64_t errors; /* calls refused: perfq_event(), perfq_category(),
			  * perfq_category_enable() (errno said why) */
};

/*
 * A category: a switch, on or off at run time, that a record tests first.
 * perfq_category_enabled() is one relaxed load; with a branch on it, a
 * record of a disabled category costs one predictable test and nothing else:
 *
 *   static struct perfq_category* gpu;   (gpu = perfq_category("gpu") once)
 *   if (perfq_category_enabled(gpu)) perfq_instant(submit, job_id);
 *
 * The library owns categories and never frees them: a pointer stays valid
 * for the life of the process.  Write `enabled` only through
 * perfq_category_enable().
 */
struct perfq_category {
	int enabled;
};

static inline int perfq_category_enabled(const struct perfq_category* c)
{
#if defined(PERFQ_DISABLE)
	(void)c;
	return 0;
#elif defined(__GNUC__)
	return __atomic_load_n(&c->enabled, __ATOMIC_RELAXED);
#else
	return *(const volatile int*)&c->enabled;
#endif
}

/* The longest name of an event's arg (perfq_event_arg(), perfq_event2()), with
 * its NUL. */
#define PERFQ_ARG_NAME_LEN 32u

/* The arg name that declares a byte count (perfq_event_arg(),
 * perfq_event2()). */
#define PERFQ_ARG_BYTES "bytes"

/* The arg of an event of perfq_event2(): hi in the upper 32 bits, lo in
 * the lower. */
#define PERFQ_ARG2(hi, lo) ((uint64_t)(uint32_t)(hi) << 32 | (uint64_t)(uint32_t)(lo))

#ifndef PERFQ_DISABLE

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
 * name and kind every time.  0 is never an event: it is the error return,
 * with errno set and perfq_stats.errors counted:
 *   EINVAL        name NULL or empty, or kind not PERFQ_KIND_BEGIN..COUNTER
 *   ENAMETOOLONG  name of PERFQ_EVENT_NAME_LEN bytes or more
 *   EEXIST        name already registered with another kind
 *   ENOSPC        65535 events registered already
 *   ENOMEM        out of memory
 * Takes a lock and may talk to the daemon: register once, record often.
 */
uint32_t perfq_event(const char* name, int kind);

/*
 * Register an event whose arg is two 32-bit numbers, recorded as
 * PERFQ_ARG2(hi, lo): arg_hi names the upper one, arg_lo the lower (1 to
 * PERFQ_ARG_NAME_LEN-1 bytes each), and the exports show both under these
 * names.  kind: PERFQ_KIND_BEGIN or PERFQ_KIND_INSTANT.  As perfq_event()
 * otherwise; the errors are the same, and also EINVAL for a NULL or empty
 * arg name or PERFQ_KIND_COUNTER (a counter's arg is its value),
 * ENAMETOOLONG for an arg name too long, EEXIST for a name registered with
 * other arg names or as a one-number event.
 */
uint32_t perfq_event2(const char* name, int kind, const char* arg_hi, const char* arg_lo);

/*
 * Register an event whose arg is one 64-bit number named arg (1 to
 * PERFQ_ARG_NAME_LEN-1 bytes), shown under that name by the exports;
 * PERFQ_ARG_BYTES declares a byte count (see "Byte counts" above):
 *
 *   uint32_t h2d = perfq_event_arg("h2d_copy", PERFQ_KIND_BEGIN, PERFQ_ARG_BYTES);
 *   perfq_begin(h2d, len); copy(dst, src, len); perfq_end(h2d, len);
 *
 * kind: PERFQ_KIND_BEGIN or PERFQ_KIND_INSTANT.  As perfq_event()
 * otherwise; the errors are the same, and also EINVAL for a NULL or empty
 * arg or PERFQ_KIND_COUNTER, ENAMETOOLONG for an arg name too long, EEXIST
 * for a name registered with another arg name or none.
 */
uint32_t perfq_event_arg(const char* name, int kind, const char* arg);

/* Record an event with the calling thread's ring.  arg: correlation id,
 * byte count... (counter: the value).  Never blocks. */
void perfq_begin(uint32_t event, uint64_t arg);
void perfq_end(uint32_t event, uint64_t arg);
void perfq_instant(uint32_t event, uint64_t arg);
void perfq_counter(uint32_t event, uint64_t value);
/* Any kind (PERFQ_KIND_BEGIN..PERFQ_KIND_COUNTER). */
void perfq_record_event(uint32_t event, int kind, uint64_t arg);

/*
 * The category NAME (1..PERFQ_EVENT_NAME_LEN-1 bytes), created on the first
 * call, the same pointer every time.  A new category is enabled unless the
 * environment variable PERFQ_CATEGORIES (read once) says otherwise: a
 * comma-separated list applied in order, the last match winning; "name"
 * enables, "-name" disables, "*" and "-*" match every category.
 * "-*,gpu" enables gpu only; "-net" everything but net.
 * Never NULL: an invalid name gets a category that is always disabled,
 * with errno EINVAL or ENAMETOOLONG and perfq_stats.errors counted.
 */
struct perfq_category* perfq_category(const char* name);

/*
 * Enable (nonzero) or disable (0) the category NAME, creating it if needed
 * (PERFQ_CATEGORIES does not apply to it then).  Takes effect at once for
 * every thread; a record in progress on another thread may still complete.
 * Returns 0, or -EINVAL / -ENAMETOOLONG as perfq_category() (counted).
 */
int perfq_category_enable(const char* name, int enabled);

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

/*
 * Fill *out with the process's counts.  perfq_get_stats(out) is
 * perfq_read_stats(out, sizeof(struct perfq_stats)): the library fills the
 * first `size` bytes only, so a program compiled against an older, shorter
 * struct perfq_stats keeps working with a newer library.
 */
void perfq_read_stats(struct perfq_stats* out, size_t size);
void perfq_get_stats(struct perfq_stats* out); /* the first release's */
#define perfq_get_stats(out) perfq_read_stats((out), sizeof(struct perfq_stats))

/*
 * Disconnect and stop the connector (the daemon drains the rings to the
 * end and retires them).  Recording is a no-op afterwards until
 * perfq_init() is called again.  Other threads may go on recording (into
 * nothing) while and after this runs.
 */
void perfq_shutdown(void);

#else /* PERFQ_DISABLE: every call is nothing */

static inline int perfq_init(const char* app_name, const char* socket_path)
{
	(void)app_name;
	(void)socket_path;
	return 0;
}
static inline uint32_t perfq_event(const char* name, int kind)
{
	(void)name;
	(void)kind;
	return 1;
}
static inline uint32_t perfq_event_arg(const char* name, int kind, const char* arg)
{
	(void)name;
	(void)kind;
	(void)arg;
	return 1;
}
static inline uint32_t perfq_event2(const char* name, int kind, const char* arg_hi,
				    const char* arg_lo)
{
	(void)name;
	(void)kind;
	(void)arg_hi;
	(void)arg_lo;
	return 1;
}
static inline void perfq_begin(uint32_t event, uint64_t arg)
{
	(void)event;
	(void)arg;
}
static inline void perfq_end(uint32_t event, uint64_t arg)
{
	(void)event;
	(void)arg;
}
static inline void perfq_instant(uint32_t event, uint64_t arg)
{
	(void)event;
	(void)arg;
}
static inline void perfq_counter(uint32_t event, uint64_t value)
{
	(void)event;
	(void)value;
}
static inline void perfq_record_event(uint32_t event, int kind, uint64_t arg)
{
	(void)event;
	(void)kind;
	(void)arg;
}
static inline struct perfq_category* perfq_category(const char* name)
{
	static struct perfq_category off;
	(void)name;
	return &off;
}
static inline int perfq_category_enable(const char* name, int enabled)
{
	(void)name;
	(void)enabled;
	return 0;
}
static inline int perfq_thread_init(const char* thread_name)
{
	(void)thread_name;
	return -ENOTCONN; /* as without a daemon */
}
static inline int perfq_wait_connected(int timeout_ms)
{
	(void)timeout_ms;
	return 0;
}
static inline int perfq_connected(void)
{
	return 0;
}
static inline void perfq_read_stats(struct perfq_stats* out, size_t size)
{
	unsigned char* p = (unsigned char*)out;
	size_t i;

	for (i = 0; i < size && i < sizeof(*out); i++)
		p[i] = 0;
}
static inline void perfq_get_stats(struct perfq_stats* out)
{
	perfq_read_stats(out, sizeof(*out));
}
static inline void perfq_shutdown(void)
{
}

#endif /* PERFQ_DISABLE */

/*
 * Scoped ranges in C (GCC and Clang: __attribute__((cleanup))):
 *
 *   {
 *           PERFQ_SCOPE(compute, job_id);        begin now ...
 *           ...
 *   }                                            ... end (same arg) here
 *   PERFQ_SCOPE_IN(gpu, compute, job_id);        only if gpu is enabled
 *
 * The end is recorded whatever way the block is left (return, break,
 * goto), but not by longjmp() or a C++ exception through C frames.
 * PERFQ_SCOPE_IN records the end only if it recorded the begin.  Without
 * the attribute, pair perfq_begin() and perfq_end() by hand; in C++ use
 * perfq::Scope (perfq.hpp).
 */
struct perfq_scope {
	uint32_t event;
	uint32_t active;
	uint64_t arg;
};

static inline struct perfq_scope perfq_scope_begin(const struct perfq_category* category,
						   uint32_t event, uint64_t arg)
{
	struct perfq_scope s;

	s.event = event;
	s.arg = arg;
	s.active = !category || perfq_category_enabled(category);
	if (s.active)
		perfq_begin(event, arg);
	return s;
}

static inline void perfq_scope_end(struct perfq_scope* s)
{
	if (s->active)
		perfq_end(s->event, s->arg);
}

#define PERFQ_CONCAT2_(a, b) a##b
#define PERFQ_CONCAT_(a, b) PERFQ_CONCAT2_(a, b)
#if defined(PERFQ_DISABLE)
#define PERFQ_SCOPE_IN(category, event, arg) ((void)(category), (void)(event), (void)(arg))
#elif defined(__GNUC__)
#define PERFQ_SCOPE_IN(category, event, arg)                                \
	struct perfq_scope PERFQ_CONCAT_(perfq_scope_, __COUNTER__)           \
		__attribute__((cleanup(perfq_scope_end), unused)) =           \
			perfq_scope_begin((category), (event), (arg))
#endif
#ifdef PERFQ_SCOPE_IN
#define PERFQ_SCOPE(event, arg) PERFQ_SCOPE_IN((const struct perfq_category*)0, event, arg)
#endif

#ifdef __cplusplus
} /* extern "C" */
#endif

#endif /* PERFQ_H */
