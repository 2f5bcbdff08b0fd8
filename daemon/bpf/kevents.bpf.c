// SPDX-License-Identifier: GPL-2.0
/*
 * perfq-daemon's host kernel events: scheduler switches and wakeups,
 * syscalls and uprobes of the traced processes, into one BPF ring buffer
 * drained by the daemon's kernel collector thread.  CO-RE: built once
 * against vmlinux.h, relocated by libbpf against the running kernel's BTF.
 *
 * The daemon sets the rodata switches before load, fills `traced` with the
 * process ids being traced, and attaches the uprobe programs once per
 * --uprobe function with the probe's index as its BPF cookie.
 */
#include "vmlinux.h"

#include <bpf/bpf_core_read.h>
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_tracing.h>

#include "perfq_kevent.h"

char LICENSE[] SEC("license") = "GPL";

const volatile bool want_sched = false;
const volatile bool want_syscalls = false;
/* Wake the collector only when this much is waiting; it polls anyway. */
const volatile __u64 wakeup_bytes = 1 << 20;

struct {
	__uint(type, BPF_MAP_TYPE_RINGBUF);
	__uint(max_entries, 8 << 20);
} events SEC(".maps");

/* Process ids being traced (sched and syscalls). */
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 4096);
	__type(key, __u32);
	__type(value, __u8);
} traced SEC(".maps");

/* Events that found the ring buffer full, per CPU. */
struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, __u64);
} dropped SEC(".maps");

static __always_inline bool is_traced(__u32 tgid)
{
	return bpf_map_lookup_elem(&traced, &tgid) != NULL;
}

static __always_inline void emit(__u16 event, __u32 tid, __u32 tgid, __u64 value)
{
	struct perfq_kevent *e = bpf_ringbuf_reserve(&events, sizeof(*e), 0);
	if (!e) {
		__u32 zero = 0;
		__u64 *n = bpf_map_lookup_elem(&dropped, &zero);
		if (n)
			__sync_fetch_and_add(n, 1);
		return;
	}
	e->time = bpf_ktime_get_ns();
	e->value = value;
	e->tid = tid;
	e->tgid = tgid;
	e->event = event;
	e->cpu = (__u16)bpf_get_smp_processor_id();
	e->reserved = 0;
	const __u64 waiting = bpf_ringbuf_query(&events, BPF_RB_AVAIL_DATA);
	bpf_ringbuf_submit(e, waiting >= wakeup_bytes ? BPF_RB_FORCE_WAKEUP : BPF_RB_NO_WAKEUP);
}

SEC("tp_btf/sched_switch")
int BPF_PROG(pq_sched_switch, bool preempt, struct task_struct *prev, struct task_struct *next)
{
	if (!want_sched)
		return 0;
	const __u32 prev_tgid = BPF_CORE_READ(prev, tgid);
	const __u32 next_tgid = BPF_CORE_READ(next, tgid);
	if (is_traced(prev_tgid)) {
		/* __state since 5.14, state before. */
		__u64 state = 0;
		if (bpf_core_field_exists(prev->__state))
			state = BPF_CORE_READ(prev, __state);
		emit(PERFQ_KEV_SCHED_OUT, BPF_CORE_READ(prev, pid), prev_tgid, preempt ? 0 : state);
	}
	if (is_traced(next_tgid))
		emit(PERFQ_KEV_SCHED_IN, BPF_CORE_READ(next, pid), next_tgid, 0);
	return 0;
}

static __always_inline int on_wakeup(struct task_struct *p)
{
	if (!want_sched)
		return 0;
	const __u32 tgid = BPF_CORE_READ(p, tgid);
	if (is_traced(tgid))
		emit(PERFQ_KEV_SCHED_WAKEUP, BPF_CORE_READ(p, pid), tgid, BPF_CORE_READ(p, wake_cpu));
	return 0;
}

SEC("tp_btf/sched_wakeup")
int BPF_PROG(pq_sched_wakeup, struct task_struct *p)
{
	return on_wakeup(p);
}

SEC("tp_btf/sched_wakeup_new")
int BPF_PROG(pq_sched_wakeup_new, struct task_struct *p)
{
	return on_wakeup(p);
}

/* BTF raw tracepoints: no tracefs needed. */
SEC("tp_btf/sys_enter")
int BPF_PROG(pq_sys_enter, struct pt_regs *regs, long id)
{
	if (!want_syscalls)
		return 0;
	const __u64 pt = bpf_get_current_pid_tgid();
	if (is_traced((__u32)(pt >> 32)))
		emit(PERFQ_KEV_SYSCALL_ENTER, (__u32)pt, (__u32)(pt >> 32), (__u64)id);
	return 0;
}

SEC("tp_btf/sys_exit")
int BPF_PROG(pq_sys_exit, struct pt_regs *regs, long ret)
{
	if (!want_syscalls)
		return 0;
	const __u64 pt = bpf_get_current_pid_tgid();
	if (is_traced((__u32)(pt >> 32)))
		emit(PERFQ_KEV_SYSCALL_EXIT, (__u32)pt, (__u32)(pt >> 32), (__u64)ret);
	return 0;
}

/* Attached per --uprobe function; the cookie is the probe's index. */
SEC("uprobe")
int BPF_KPROBE(pq_uprobe_entry)
{
	const __u64 i = bpf_get_attach_cookie(ctx);
	const __u64 id = bpf_get_current_pid_tgid();
	if (i < PERFQ_KEV_MAX_UPROBES)
		emit(PERFQ_KEV_UPROBE_BASE + 2 * i, (__u32)id, (__u32)(id >> 32), PT_REGS_PARM1(ctx));
	return 0;
}

SEC("uretprobe")
int BPF_KRETPROBE(pq_uprobe_return)
{
	const __u64 i = bpf_get_attach_cookie(ctx);
	const __u64 id = bpf_get_current_pid_tgid();
	if (i < PERFQ_KEV_MAX_UPROBES)
		emit(PERFQ_KEV_UPROBE_BASE + 2 * i + 1, (__u32)id, (__u32)(id >> 32), PT_REGS_RC(ctx));
	return 0;
}
