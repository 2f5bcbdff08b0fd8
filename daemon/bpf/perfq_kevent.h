/*
 * Host kernel events (perfq-daemon's optional BPF collector): the record
 * layout the BPF program hands to the daemon, and how the daemon stores
 * them in a trace.  C, so that the BPF program (clang -target bpf, with
 * vmlinux.h) and C++ share it.
 *
 * In a trace, kernel events come from one source of kind "kernel"
 * (PERFQ_KERNEL_SOURCE) with one stream per CPU; every record is an
 * instant in the host clock domain (bpf_ktime_get_ns: CLOCK_MONOTONIC,
 * the clock of host records), and
 *   arg = (u64)(u32)value << 32 | tid
 * so that the thread it is about is always the low 32 bits.  `value`:
 *   sched_switch_out   the state the thread left the CPU in (0: runnable,
 *                      i.e. preempted; 1: interruptible sleep; 2: ...)
 *   sched_switch_in    0
 *   sched_wakeup       the CPU the thread was woken on
 *   syscall_enter      the syscall number
 *   syscall_exit       the return value, truncated to 32 bits
 *   uprobe entry       the function's first argument, low 32 bits
 *   uprobe return      its return value, low 32 bits
 * Event ids below PERFQ_KEV_UPROBE_BASE are fixed; uprobe i (in the order
 * given to `perfqctl start --uprobe`) has entry PERFQ_KEV_UPROBE_BASE + 2i
 * and return PERFQ_KEV_UPROBE_BASE + 2i + 1, named in the trace's
 * dictionary for the source.
 */
#ifndef PERFQ_KERNEL_EVENTS_H
#define PERFQ_KERNEL_EVENTS_H

#ifndef __VMLINUX_H__
#include <linux/types.h>
#endif

#define PERFQ_KERNEL_SOURCE 255 /* source id of the kernel stream set */

enum perfq_kernel_event {
	PERFQ_KEV_SCHED_OUT = 1,
	PERFQ_KEV_SCHED_IN = 2,
	PERFQ_KEV_SCHED_WAKEUP = 3,
	PERFQ_KEV_SYSCALL_ENTER = 4,
	PERFQ_KEV_SYSCALL_EXIT = 5,
	PERFQ_KEV_UPROBE_BASE = 16,
};

/* At most this many --uprobe functions per recording. */
#define PERFQ_KEV_MAX_UPROBES 64

/* One event in the BPF ring buffer (32 bytes). */
struct perfq_kevent {
	__u64 time;  /* bpf_ktime_get_ns() */
	__u64 value; /* see above */
	__u32 tid;   /* the thread the event is about */
	__u32 tgid;  /* its process */
	__u16 event; /* enum perfq_kernel_event, or a uprobe's */
	__u16 cpu;
	__u32 reserved;
};

#endif
