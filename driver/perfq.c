// SPDX-License-Identifier: GPL-2.0
/*
 * perfq.ko - PCIe char driver for perfq devices.
 *
 * A perfq device carries the shared region of perfq_abi.h in a memory BAR
 * (QEMU's ivshmem-plain with a file behind it is the test device; real
 * devices bind through new_id or driver_override, see driver/README.md).
 * For each bound device the driver:
 *   - validates the region header once and keeps a private copy; a device
 *     with a bad header is refused at probe with one dev_err line;
 *   - creates /dev/perfqN, whose mmap hands out the region by offset (the
 *     sections the host writes read-write, the others read-only);
 *   - answers PERFQ_IOC_INFO and PERFQ_IOC_CLOCK_SAMPLES (bracketed timer
 *     register reads with interrupts off);
 *   - publishes sysfs attributes under /sys/class/perfq/perfqN.
 * On removal it revokes every user mapping (a later access raises SIGBUS)
 * and every later ioctl returns -ENODEV; open files keep the (dead) device
 * structure alive until their last close.
 *
 * Device memory is not RAM: the kernel maps each run of the region's pages
 * with the caching its content needs (perfq_page_caching()) and user
 * mappings get the same per page: the timer page always uncached, the rest
 * write-back only when the region is system memory (the header's
 * PERFQ_FEAT_SYSTEM_MEMORY, or the module parameter system_memory=1),
 * uncached otherwise.  The kernel touches the region only through MMIO
 * accessors (readq/writeq, memcpy_fromio).
 *
 * Locking: see struct perfq_dev.  Nothing sleeps while holding pd->lock, so
 * remove's down_write waits at most for one timer read; a sync round in
 * progress sees `gone` between (and inside) its reads and ends with -ENODEV.
 */
#define pr_fmt(fmt) KBUILD_MODNAME ": " fmt

#include <linux/cdev.h>
#include <linux/delay.h>
#include <linux/device.h>
#include <linux/fs.h>
#include <linux/idr.h>
#include <linux/io.h>
#include <linux/ktime.h>
#include <linux/mm.h>
#include <linux/module.h>
#include <linux/mutex.h>
#include <linux/pci.h>
#include <linux/rwsem.h>
#include <linux/sched.h>
#include <linux/slab.h>
#include <linux/uaccess.h>
#include <linux/version.h>
#include <linux/wait.h>

#include "perfq/perfq_abi.h"
#include "perfq/perfq_ioctl.h"
#include "perfq/perfq_region_check.h"

#define PERFQ_NAME "perfq"
#define PERFQ_MAX_DEVICES 64
/*
 * The first exchange of a round, with interrupts on: the device may be
 * asleep (a software device polls its window every few ms) or, on a loaded
 * host, waiting for a CPU at the same time as the guest.
 */
#define PERFQ_WARMUP_EXTRA_NS (1000ULL * NSEC_PER_MSEC)
#define PERFQ_WARMUP_READ_NS (100ULL * NSEC_PER_USEC)
/*
 * A sample whose read timed out is tried again, with interrupts on and a
 * growing sleep in between, until timeout_ns plus this has passed: the
 * software device shares the host's CPUs and may be descheduled for tens of
 * milliseconds on a loaded host.
 */
#define PERFQ_RETRY_EXTRA_NS (100ULL * NSEC_PER_MSEC)
#define PERFQ_RETRY_SLEEP_MAX_US 5000
/* Kernel mappings of the region: runs of pages of one caching. */
#define PERFQ_MAX_MAPS 3 /* write-back, the uncached timer page, write-back */

#if LINUX_VERSION_CODE < KERNEL_VERSION(6, 3, 0)
/* Linux 6.3 made vma->vm_flags read-only outside these helpers. */
static inline void vm_flags_set(struct vm_area_struct *vma, vm_flags_t flags)
{
	vma->vm_flags |= flags;
}

static inline void vm_flags_clear(struct vm_area_struct *vma, vm_flags_t flags)
{
	vma->vm_flags &= ~flags;
}
#endif

static int perfq_bar = 2;
module_param_named(bar, perfq_bar, int, 0444);
MODULE_PARM_DESC(bar, "BAR that holds the perfq region (default 2, ivshmem's shared memory)");

static int perfq_system_memory = -1;
module_param_named(system_memory, perfq_system_memory, int, 0444);
MODULE_PARM_DESC(system_memory,
		 "-1 (default): the region is system memory (mapped write-back) only if its header sets PERFQ_FEAT_SYSTEM_MEMORY; 0: device memory (uncached); 1: system memory");

enum perfq_caching {
	PERFQ_UNCACHED,
	PERFQ_WRITE_BACK,
};

/* One kernel mapping: region bytes [off, off + len) with one caching. */
struct perfq_map {
	u64 off;
	u64 len;
	enum perfq_caching caching;
	void __iomem *va;
};

struct perfq_dev {
	struct device dev; /* /sys/class/perfq/perfqN; open files hold it */
	struct cdev cdev;
	struct pci_dev *pdev;
	int minor;

	/*
	 * lock guards every access to the region's mappings (maps, timer,
	 * host_ctrl) against remove: readers are ioctls (one timer read at a
	 * time), page faults, mmap and sysfs reads, and none of them sleeps
	 * while holding it; the writer is remove.  `gone` is set by remove
	 * before it takes the lock (so that loops waiting for the device stop)
	 * and read under the lock, or with READ_ONCE in those loops.
	 */
	struct rw_semaphore lock;
	bool gone;
	wait_queue_head_t gone_wait; /* sleepers between timer reads; woken by remove */
	struct perfq_map maps[PERFQ_MAX_MAPS]; /* devm mappings; valid while !gone */
	int nr_maps;
	struct perfq_timer_page __iomem *timer;
	struct perfq_host_ctrl __iomem *host_ctrl;
	bool system_memory; /* pages other than the timer's are write-back */
	bool memory_from_header; /* ...as the header said, not the module parameter */
	phys_addr_t bar_start;
	u64 bar_len;
	struct perfq_region_header hdr; /* the validated private copy; constant */

	struct mutex clock_lock; /* one clock-samples ioctl at a time (one timer reader) */

	struct mutex open_lock; /* guards mapping_inode */
	struct inode *mapping_inode; /* its i_mapping is every open file's */

	u32 link_speed_mtps;
	u32 link_width;
	bool link_of_port;
};

static struct class *perfq_class;
static dev_t perfq_devt;
static DEFINE_IDA(perfq_ida);

/* ------------------------------------------------------------------ */
/* Region header validation                                            */

/* The sections the host writes; the rest are mapped read-only. */
static bool perfq_section_host_writable(int id)
{
	return id == PERFQ_SECTION_DEV_CTRL || id == PERFQ_SECTION_HOST_CTRL ||
	       id == PERFQ_SECTION_TIMER || id == PERFQ_SECTION_SYNC || id == PERFQ_SECTION_APP;
}

/* The rules are perfq_check_region_header()'s, libperfq's too; one line per refusal. */
static int perfq_validate_header(struct device *dev, const struct perfq_region_header *h,
				 u64 len)
{
	const struct perfq_header_check c = perfq_check_region_header(h, len);

	if (c.fault == PERFQ_HDR_OK)
		return 0;
	if (c.fault == PERFQ_HDR_MAGIC)
		dev_err(dev, "region header: magic %#018llx is not %#018llx (not a perfq region, or not initialized yet); device refused\n",
			c.a, PERFQ_REGION_MAGIC);
	else if (c.fault == PERFQ_HDR_SECTION_OVERLAP)
		dev_err(dev, "region header: sections %s and %s overlap; device refused\n",
			perfq_section_name(c.index), perfq_section_name(c.index2));
	else if (c.fault >= PERFQ_HDR_SECTION_ALIGN && c.fault <= PERFQ_HDR_SECTION_SMALL)
		dev_err(dev, "region header: section %s: %s (%llu, %llu); device refused\n",
			perfq_section_name(c.index), perfq_header_fault_name(c.fault), c.a, c.b);
	else
		dev_err(dev, "region header: %s (%#llx, %#llx at %d; the %llu-byte BAR); device refused\n",
			perfq_header_fault_name(c.fault), c.a, c.b, c.index, len);
	return -EINVAL;
}

/* Can [off, off + len) be mapped writable: is it all in host-written sections? */
static bool perfq_range_writable(const struct perfq_dev *pd, u64 off, u64 len)
{
	u64 covered = 0;
	int i;

	for (i = 0; i < PERFQ_SECTION_COUNT; i++) {
		const struct perfq_section *s = &pd->hdr.sections[i];
		u64 lo = max(off, s->offset);
		u64 hi = min(off + len, s->offset + s->size);

		if (lo >= hi)
			continue;
		if (!perfq_section_host_writable(i))
			return false;
		covered += hi - lo;
	}
	return covered == len;
}

/*
 * The caching of the region's page at page_off: the timer page uncached
 * always (a register, read between two clock reads); the others write-back
 * when the region is system memory, uncached when it is device memory.
 */
static enum perfq_caching perfq_page_caching(const struct perfq_region_header *h,
					     bool system_memory, u64 page_off)
{
	const struct perfq_section *t = &h->sections[PERFQ_SECTION_TIMER];

	if (t->offset < page_off + PAGE_SIZE && page_off < t->offset + t->size)
		return PERFQ_UNCACHED;
	return system_memory ? PERFQ_WRITE_BACK : PERFQ_UNCACHED;
}

static pgprot_t perfq_caching_prot(enum perfq_caching c, pgprot_t prot)
{
	return c == PERFQ_WRITE_BACK ? prot : pgprot_noncached(prot);
}

static const char *perfq_caching_name(enum perfq_caching c)
{
	return c == PERFQ_WRITE_BACK ? "write-back" : "uncached";
}

/* The kernel address of region offset off, within the mapping that holds it. */
static void __iomem *perfq_region_addr(const struct perfq_dev *pd, u64 off)
{
	int i;

	for (i = 0; i < pd->nr_maps; i++)
		if (off >= pd->maps[i].off && off - pd->maps[i].off < pd->maps[i].len)
			return pd->maps[i].va + (off - pd->maps[i].off);
	WARN_ON_ONCE(1);
	return NULL;
}

/* ------------------------------------------------------------------ */
/* Timer register reads                                                */

/*
 * One read of R, with pd->lock held for reading and interrupts off: never
 * sleeps.  On hardware a load of the register; with the software device the
 * request/response exchange of perfq_timer_page, spinning at most
 * timeout_ns, or until remove marks the device gone.  The page is mapped
 * uncached: the accesses reach the device in program order.
 */
static int perfq_timer_read(struct perfq_dev *pd, u64 timeout_ns, u64 *value)
{
	struct perfq_timer_page __iomem *t = pd->timer;
	u64 start, tag;

	if (!(pd->hdr.features & PERFQ_FEAT_TIMER_REQRESP)) {
		*value = readq(&t->value);
		return 0;
	}
	tag = readq(&t->req_tag) + 1;
	start = ktime_get_ns();
	/* The device reads req_tag, then stores resp_value before resp_tag. */
	writeq(tag, &t->req_tag);
	for (;;) {
		/* readq orders the resp_value load after it (the device's release). */
		if (readq(&t->resp_tag) == tag) {
			*value = readq(&t->resp_value);
			return 0;
		}
		cpu_relax();
		if (READ_ONCE(pd->gone))
			return -ENODEV;
		if (ktime_get_ns() - start > timeout_ns)
			break;
	}
	/*
	 * Past the deadline, look once more: a guest vCPU (or an NMI) can lose
	 * the CPU between the check above and the clock read, and the answer
	 * that came meanwhile is not a timeout.
	 */
	if (readq(&t->resp_tag) == tag) {
		*value = readq(&t->resp_value);
		return 0;
	}
	return -ETIMEDOUT;
}

/*
 * One bracketed read: before <= the moment the device samples R <= after.
 * The barriers keep the register access between the two clock reads (the
 * x86 clock read is ordered like a load, the MMIO access is not ordered
 * against it by itself).  Takes pd->lock for the read only.
 */
static int perfq_bracketed_read(struct perfq_dev *pd, u64 timeout_ns,
				struct perfq_clock_sample *s)
{
	unsigned long irqflags;
	int ret;

	down_read(&pd->lock);
	if (pd->gone) {
		up_read(&pd->lock);
		return -ENODEV;
	}
	preempt_disable();
	local_irq_save(irqflags);
	s->before = ktime_get_ns();
	mb(); /* the clock read completes before the register access starts */
	ret = perfq_timer_read(pd, timeout_ns, &s->value);
	rmb(); /* the register's value has arrived before the second clock read */
	s->after = ktime_get_ns();
	local_irq_restore(irqflags);
	preempt_enable();
	up_read(&pd->lock);
	return ret;
}

/*
 * Sleeps about us microseconds between timer reads, holding nothing that
 * remove takes; remove wakes it.  -ENODEV once the device is gone, -EINTR
 * on a signal.
 */
static int perfq_pause(struct perfq_dev *pd, unsigned long us)
{
	long ret = wait_event_interruptible_hrtimeout(pd->gone_wait, READ_ONCE(pd->gone),
						       ns_to_ktime(us * NSEC_PER_USEC));

	if (READ_ONCE(pd->gone))
		return -ENODEV;
	return ret == -ERESTARTSYS ? -EINTR : 0;
}

/* Opens (round) or closes (0) the device's window for a sync round. */
static int perfq_set_window(struct perfq_dev *pd, u32 round)
{
	int ret = 0;

	down_read(&pd->lock);
	if (pd->gone)
		ret = -ENODEV;
	else
		writel(round, &pd->timer->window); /* the device polls it */
	up_read(&pd->lock);
	return ret;
}

/* A first exchange with interrupts on, while the device wakes up. */
static int perfq_timer_warmup(struct perfq_dev *pd, u64 timeout_ns)
{
	u64 deadline = ktime_get_ns() + timeout_ns + PERFQ_WARMUP_EXTRA_NS;
	struct perfq_clock_sample s;
	int ret;

	do {
		ret = perfq_bracketed_read(pd, PERFQ_WARMUP_READ_NS, &s);
		if (ret != -ETIMEDOUT)
			return ret;
		ret = perfq_pause(pd, 100);
		if (ret)
			return ret;
	} while (ktime_get_ns() < deadline);
	return -ETIMEDOUT;
}

/* ------------------------------------------------------------------ */
/* ioctls                                                              */

static void perfq_fill_info(struct perfq_dev *pd, struct perfq_ioc_info *info)
{
	info->size = sizeof(*info);
	info->version = PERFQ_IOC_VERSION;
	info->abi_version = pd->hdr.abi_version;
	info->flags = pd->link_of_port ? PERFQ_INFO_LINK_OF_PORT : 0;
	info->region_size = pd->hdr.region_size;
	info->ring_capacity = pd->hdr.ring_capacity;
	info->features = pd->hdr.features;
	info->device_clock_hz = pd->hdr.device_clock_hz;
	info->timer_hz = pd->hdr.timer_hz;
	info->bar_size = pd->bar_len;
	info->records_seen = readq(&pd->host_ctrl->tail_mirror);
	info->link_speed_mtps = pd->link_speed_mtps;
	info->link_width = pd->link_width;
	info->max_samples = PERFQ_SYNC_MAX_SAMPLES;
	memcpy(info->device_name, pd->hdr.device_name, PERFQ_DEVICE_NAME_LEN);
	strscpy((char *)info->pci_address, pci_name(pd->pdev), PERFQ_PCI_ADDR_LEN);
	memcpy(info->sections, pd->hdr.sections, sizeof(info->sections));
}

static long perfq_ioctl_info(struct perfq_dev *pd, void __user *argp)
{
	struct perfq_ioc_info info;
	u32 size;
	int ret = 0;

	if (get_user(size, (u32 __user *)argp))
		return -EFAULT;
	if (size != sizeof(info)) {
		dev_dbg(&pd->dev, "PERFQ_IOC_INFO: size %u is not %zu\n", size, sizeof(info));
		return -EINVAL;
	}
	memset(&info, 0, sizeof(info));
	down_read(&pd->lock);
	if (pd->gone)
		ret = -ENODEV;
	else
		perfq_fill_info(pd, &info);
	up_read(&pd->lock);
	if (ret)
		return ret;
	if (copy_to_user(argp, &info, sizeof(info)))
		return -EFAULT;
	return 0;
}

/* A request is valid as PERFQ_IOC_CLOCK_SAMPLES documents it; anything else is -EINVAL. */
static bool perfq_clock_req_valid(struct perfq_dev *pd, const struct perfq_ioc_clock_samples *req)
{
	if (req->size != sizeof(*req) || req->n == 0 || req->n > PERFQ_SYNC_MAX_SAMPLES ||
	    req->flags || req->reserved[0] || req->reserved[1] || req->reserved[2] ||
	    req->reserved[3] || req->timeout_ns > PERFQ_IOC_TIMEOUT_MAX_NS) {
		dev_dbg(&pd->dev, "PERFQ_IOC_CLOCK_SAMPLES: bad argument (size %u n %u flags %#x timeout %llu)\n",
			req->size, req->n, req->flags, req->timeout_ns);
		return false;
	}
	return true;
}

/*
 * One bracketed sample.  Interrupts stay off for one read only.  A device
 * that does not answer within timeout_ns is usually just not running right
 * now (the software device shares the host's CPUs): let it run, with
 * interrupts on and pd->lock not held, and try again until give_up.  A
 * failed sample is zeroed.
 */
static int perfq_clock_sample(struct perfq_dev *pd, u64 timeout_ns, struct perfq_clock_sample *s)
{
	u64 give_up = ktime_get_ns() + timeout_ns + PERFQ_RETRY_EXTRA_NS;
	unsigned long sleep_us = 100;
	int ret;

	for (;;) {
		ret = perfq_bracketed_read(pd, timeout_ns, s);
		if (ret != -ETIMEDOUT || s->after >= give_up)
			break;
		ret = perfq_pause(pd, sleep_us);
		if (ret)
			break;
		sleep_us = min_t(unsigned long, sleep_us * 2, PERFQ_RETRY_SLEEP_MAX_US);
	}
	if (ret) {
		s->before = 0;
		s->after = 0;
	}
	return ret;
}

/*
 * One round of req->n samples, with clock_lock held: opens the device's
 * window for req->round (if any), samples until the first failure, and
 * closes the window again.  req->count is the samples taken.  Every step
 * takes pd->lock by itself, so remove cuts the round short (-ENODEV).
 */
static int perfq_clock_round(struct perfq_dev *pd, struct perfq_ioc_clock_samples *req,
			     u64 timeout_ns)
{
	int ret = 0;
	u32 i;

	if (req->round) {
		ret = perfq_set_window(pd, req->round);
		if (!ret && (pd->hdr.features & PERFQ_FEAT_TIMER_REQRESP))
			ret = perfq_timer_warmup(pd, timeout_ns);
	}
	for (i = 0; !ret && i < req->n; i++) {
		ret = perfq_clock_sample(pd, timeout_ns, &req->samples[i]);
		if (ret)
			break;
		req->count = i + 1;
		cond_resched();
	}
	if (req->round && ret != -ENODEV)
		perfq_set_window(pd, 0);
	if (ret == -ETIMEDOUT)
		dev_dbg(&pd->dev, "timer read timed out after %llu ns (%u of %u samples); is the device running?\n",
			timeout_ns, req->count, req->n);
	return ret;
}

static long perfq_ioctl_clock_samples(struct perfq_dev *pd, void __user *argp)
{
	struct perfq_ioc_clock_samples *req;
	u64 timeout_ns;
	int ret = 0;

	req = kzalloc(sizeof(*req), GFP_KERNEL);
	if (!req)
		return -ENOMEM;
	if (copy_from_user(req, argp, offsetof(struct perfq_ioc_clock_samples, samples))) {
		ret = -EFAULT;
		goto out_free;
	}
	if (!perfq_clock_req_valid(pd, req)) {
		ret = -EINVAL;
		goto out_free;
	}
	timeout_ns = req->timeout_ns ? req->timeout_ns : PERFQ_IOC_TIMEOUT_DEFAULT_NS;
	memset(req->samples, 0, sizeof(req->samples));
	req->version = PERFQ_IOC_VERSION;
	req->count = 0;

	if (mutex_lock_interruptible(&pd->clock_lock)) {
		ret = -EINTR;
		goto out_free;
	}
	ret = perfq_clock_round(pd, req, timeout_ns);
	mutex_unlock(&pd->clock_lock);
	if (ret != -ENODEV && copy_to_user(argp, req, sizeof(*req)))
		ret = -EFAULT;
out_free:
	kfree(req);
	return ret;
}

static long perfq_ioctl(struct file *file, unsigned int cmd, unsigned long arg)
{
	struct perfq_dev *pd = file->private_data;
	void __user *argp = (void __user *)arg;

	if (_IOC_TYPE(cmd) != PERFQ_IOC_TYPE)
		return -ENOTTY;
	switch (_IOC_NR(cmd)) {
	case _IOC_NR(PERFQ_IOC_INFO):
		if (cmd != PERFQ_IOC_INFO) {
			dev_dbg(&pd->dev, "ioctl %#x: wrong size or direction for PERFQ_IOC_INFO\n", cmd);
			return -EINVAL;
		}
		return perfq_ioctl_info(pd, argp);
	case _IOC_NR(PERFQ_IOC_CLOCK_SAMPLES):
		if (cmd != PERFQ_IOC_CLOCK_SAMPLES) {
			dev_dbg(&pd->dev, "ioctl %#x: wrong size or direction for PERFQ_IOC_CLOCK_SAMPLES\n",
				cmd);
			return -EINVAL;
		}
		return perfq_ioctl_clock_samples(pd, argp);
	default:
		return -ENOTTY;
	}
}

/* ------------------------------------------------------------------ */
/* mmap                                                                */

static vm_fault_t perfq_vm_fault(struct vm_fault *vmf)
{
	struct vm_area_struct *vma = vmf->vma;
	struct perfq_dev *pd = vma->vm_private_data;
	u64 off = ((u64)vma->vm_pgoff << PAGE_SHIFT) + (vmf->address - vma->vm_start);
	vm_fault_t ret;

	pgprot_t prot;

	down_read(&pd->lock);
	if (pd->gone || off >= pd->hdr.region_size) {
		ret = VM_FAULT_SIGBUS;
	} else {
		/* The page's caching, as the kernel's own mapping of it has. */
		prot = perfq_caching_prot(perfq_page_caching(&pd->hdr, pd->system_memory, off),
					  vma->vm_page_prot);
		ret = vmf_insert_pfn_prot(vma, vmf->address, (pd->bar_start + off) >> PAGE_SHIFT,
					  prot);
	}
	up_read(&pd->lock);
	return ret;
}

static const struct vm_operations_struct perfq_vm_ops = {
	.fault = perfq_vm_fault,
};

static int perfq_mmap(struct file *file, struct vm_area_struct *vma)
{
	struct perfq_dev *pd = file->private_data;
	u64 len = vma->vm_end - vma->vm_start;
	u64 off;
	int ret = 0;

	if (!(vma->vm_flags & VM_SHARED) || (vma->vm_flags & VM_EXEC)) {
		dev_dbg(&pd->dev, "mmap: must be MAP_SHARED without PROT_EXEC\n");
		return -EINVAL;
	}
	if (vma->vm_pgoff > (pd->hdr.region_size >> PAGE_SHIFT)) {
		dev_dbg(&pd->dev, "mmap: page offset %lu is beyond the region\n", vma->vm_pgoff);
		return -EINVAL;
	}
	off = (u64)vma->vm_pgoff << PAGE_SHIFT;
	if (!len || len > pd->hdr.region_size - off) {
		dev_dbg(&pd->dev, "mmap: [%llu +%llu] is outside the %llu-byte region\n", off, len,
			pd->hdr.region_size);
		return -EINVAL;
	}
	if (!perfq_range_writable(pd, off, len)) {
		if (vma->vm_flags & VM_WRITE) {
			dev_dbg(&pd->dev, "mmap: [%llu +%llu] touches a read-only section\n", off, len);
			return -EACCES;
		}
		vm_flags_clear(vma, VM_MAYWRITE);
	}
	vm_flags_clear(vma, VM_MAYEXEC);

	down_read(&pd->lock);
	if (pd->gone) {
		ret = -ENODEV;
	} else {
		/* vm_page_prot stays write-back: each fault sets its page's caching. */
		vm_flags_set(vma, VM_IO | VM_PFNMAP | VM_DONTEXPAND | VM_DONTDUMP);
		vma->vm_ops = &perfq_vm_ops;
		vma->vm_private_data = pd;
	}
	up_read(&pd->lock);
	return ret;
}

/* ------------------------------------------------------------------ */
/* File operations                                                     */

static int perfq_open(struct inode *inode, struct file *file)
{
	struct perfq_dev *pd = container_of(inode->i_cdev, struct perfq_dev, cdev);
	int ret = 0;

	get_device(&pd->dev);
	down_read(&pd->lock);
	if (pd->gone)
		ret = -ENODEV;
	up_read(&pd->lock);
	if (ret)
		goto err_put;

	/*
	 * Every open file shares one address_space, so that remove can revoke
	 * all user mappings with one unmap_mapping_range().
	 */
	mutex_lock(&pd->open_lock);
	if (!pd->mapping_inode)
		pd->mapping_inode = igrab(inode);
	if (pd->mapping_inode)
		file->f_mapping = pd->mapping_inode->i_mapping;
	else
		ret = -ENODEV;
	mutex_unlock(&pd->open_lock);
	if (ret)
		goto err_put;

	file->private_data = pd;
	return 0;

err_put:
	put_device(&pd->dev);
	return ret;
}

static int perfq_release(struct inode *inode, struct file *file)
{
	struct perfq_dev *pd = file->private_data;

	put_device(&pd->dev);
	return 0;
}

static const struct file_operations perfq_fops = {
	.owner = THIS_MODULE,
	.open = perfq_open,
	.release = perfq_release,
	.mmap = perfq_mmap,
	.unlocked_ioctl = perfq_ioctl,
	.compat_ioctl = compat_ptr_ioctl,
	.llseek = noop_llseek,
};

/* ------------------------------------------------------------------ */
/* sysfs                                                               */

static struct perfq_dev *perfq_from_dev(struct device *dev)
{
	return container_of(dev, struct perfq_dev, dev);
}

static ssize_t abi_version_show(struct device *dev, struct device_attribute *attr, char *buf)
{
	return sysfs_emit(buf, "%u\n", perfq_from_dev(dev)->hdr.abi_version);
}
static DEVICE_ATTR_RO(abi_version);

static ssize_t ring_capacity_show(struct device *dev, struct device_attribute *attr, char *buf)
{
	return sysfs_emit(buf, "%llu\n", perfq_from_dev(dev)->hdr.ring_capacity);
}
static DEVICE_ATTR_RO(ring_capacity);

static ssize_t region_size_show(struct device *dev, struct device_attribute *attr, char *buf)
{
	return sysfs_emit(buf, "%llu\n", perfq_from_dev(dev)->hdr.region_size);
}
static DEVICE_ATTR_RO(region_size);

static ssize_t records_seen_show(struct device *dev, struct device_attribute *attr, char *buf)
{
	struct perfq_dev *pd = perfq_from_dev(dev);
	ssize_t ret;

	down_read(&pd->lock);
	if (pd->gone)
		ret = -ENODEV;
	else
		ret = sysfs_emit(buf, "%llu\n", readq(&pd->host_ctrl->tail_mirror));
	up_read(&pd->lock);
	return ret;
}
static DEVICE_ATTR_RO(records_seen);

static ssize_t device_name_show(struct device *dev, struct device_attribute *attr, char *buf)
{
	return sysfs_emit(buf, "%s\n", (const char *)perfq_from_dev(dev)->hdr.device_name);
}
static DEVICE_ATTR_RO(device_name);

static ssize_t link_speed_show(struct device *dev, struct device_attribute *attr, char *buf)
{
	struct perfq_dev *pd = perfq_from_dev(dev);

	if (!pd->link_speed_mtps)
		return sysfs_emit(buf, "unknown\n");
	return sysfs_emit(buf, "%u.%u GT/s%s\n", pd->link_speed_mtps / 1000,
			  (pd->link_speed_mtps % 1000) / 100,
			  pd->link_of_port ? " (upstream port)" : "");
}
static DEVICE_ATTR_RO(link_speed);

static ssize_t link_width_show(struct device *dev, struct device_attribute *attr, char *buf)
{
	struct perfq_dev *pd = perfq_from_dev(dev);

	if (!pd->link_width)
		return sysfs_emit(buf, "unknown\n");
	return sysfs_emit(buf, "%u\n", pd->link_width);
}
static DEVICE_ATTR_RO(link_width);

/* "system" (write-back, the timer page uncached) or "device" (uncached), and who said so. */
static ssize_t memory_show(struct device *dev, struct device_attribute *attr, char *buf)
{
	struct perfq_dev *pd = perfq_from_dev(dev);

	return sysfs_emit(buf, "%s (%s)\n", pd->system_memory ? "system" : "device",
			  pd->memory_from_header ? "region header" : "module parameter");
}
static DEVICE_ATTR_RO(memory);

static struct attribute *perfq_attrs[] = {
	&dev_attr_abi_version.attr,
	&dev_attr_ring_capacity.attr,
	&dev_attr_region_size.attr,
	&dev_attr_records_seen.attr,
	&dev_attr_device_name.attr,
	&dev_attr_link_speed.attr,
	&dev_attr_link_width.attr,
	&dev_attr_memory.attr,
	NULL,
};
ATTRIBUTE_GROUPS(perfq);

/* ------------------------------------------------------------------ */
/* PCI driver                                                          */

static void perfq_dev_release(struct device *dev)
{
	struct perfq_dev *pd = perfq_from_dev(dev);

	if (pd->mapping_inode)
		iput(pd->mapping_inode);
	ida_free(&perfq_ida, pd->minor);
	kfree(pd);
}

/* The link of the device, or of the nearest upstream PCIe port. */
static void perfq_read_link(struct perfq_dev *pd)
{
	static const u32 mtps[] = { 0, 2500, 5000, 8000, 16000, 32000, 64000 };
	struct pci_dev *d = pd->pdev;
	u16 lnksta = 0;
	u32 cls;

	while (d && !pci_is_pcie(d))
		d = pci_upstream_bridge(d);
	if (!d || pcie_capability_read_word(d, PCI_EXP_LNKSTA, &lnksta))
		return;
	cls = lnksta & PCI_EXP_LNKSTA_CLS;
	pd->link_speed_mtps = cls < ARRAY_SIZE(mtps) ? mtps[cls] : 0;
	pd->link_width = (lnksta & PCI_EXP_LNKSTA_NLW) >> PCI_EXP_LNKSTA_NLW_SHIFT;
	pd->link_of_port = d != pd->pdev;
}

/* Enables the device and claims the region's BAR; every step is managed. */
static int perfq_claim_bar(struct pci_dev *pdev)
{
	int ret;

	ret = pcim_enable_device(pdev);
	if (ret) {
		dev_err(&pdev->dev, "cannot enable the device: %d\n", ret);
		return ret;
	}
	if (!(pci_resource_flags(pdev, perfq_bar) & IORESOURCE_MEM) ||
	    pci_resource_len(pdev, perfq_bar) < PAGE_SIZE) {
		dev_err(&pdev->dev, "BAR %d is not a memory BAR of at least one page; device refused\n",
			perfq_bar);
		return -ENODEV;
	}
#if LINUX_VERSION_CODE >= KERNEL_VERSION(6, 11, 0)
	ret = pcim_request_region(pdev, perfq_bar, PERFQ_NAME);
#else
	/* Before 6.11 this is managed because the device is pcim-enabled. */
	ret = pci_request_region(pdev, perfq_bar, PERFQ_NAME);
#endif
	if (ret)
		dev_err(&pdev->dev, "BAR %d is busy: %d\n", perfq_bar, ret);
	return ret;
}

/*
 * A private copy of the region header, read through a temporary uncached
 * mapping of its page(s), magic first.
 */
static int perfq_read_header(struct pci_dev *pdev, struct perfq_region_header *hdr)
{
	resource_size_t len = PAGE_ALIGN(sizeof(*hdr));
	void __iomem *va;

	va = devm_ioremap(&pdev->dev, pci_resource_start(pdev, perfq_bar), len);
	if (!va) {
		dev_err(&pdev->dev, "cannot map BAR %d's first page\n", perfq_bar);
		return -ENOMEM;
	}
	/* The device writes the magic last; readq orders the loads after it. */
	hdr->magic = readq(va);
	memcpy_fromio((u8 *)hdr + sizeof(hdr->magic), va + sizeof(hdr->magic),
		      sizeof(*hdr) - sizeof(hdr->magic));
	devm_iounmap(&pdev->dev, va);
	return 0;
}

/*
 * Maps the region in runs of pages of one caching (perfq_page_caching());
 * each mapping also fixes the memory type of the user mappings of its
 * pages.  Managed; returns the number of mappings.
 */
static int perfq_map_region(struct pci_dev *pdev, const struct perfq_region_header *h,
			    bool system_memory, struct perfq_map *maps)
{
	phys_addr_t start = pci_resource_start(pdev, perfq_bar);
	u64 end = PAGE_ALIGN(h->region_size);
	u64 off, next;
	int n = 0;

	for (off = 0; off < end; off = next) {
		enum perfq_caching c = perfq_page_caching(h, system_memory, off);
		struct perfq_map *m;
		void *wb;

		next = off + PAGE_SIZE;
		while (next < end && perfq_page_caching(h, system_memory, next) == c)
			next += PAGE_SIZE;
		if (WARN_ON_ONCE(n == PERFQ_MAX_MAPS))
			return -EINVAL;
		m = &maps[n++];
		m->off = off;
		m->len = next - off;
		m->caching = c;
		if (c == PERFQ_WRITE_BACK) {
			wb = devm_memremap(&pdev->dev, start + off, m->len, MEMREMAP_WB);
			/* RAM behind a BAR; read with the MMIO accessors like the rest. */
			m->va = IS_ERR(wb) ? NULL : (void __force __iomem *)wb;
		} else {
			m->va = devm_ioremap(&pdev->dev, start + off, m->len);
		}
		if (!m->va) {
			dev_err(&pdev->dev, "cannot map region bytes [%llu, %llu) %s\n", off, next,
				perfq_caching_name(c));
			return -ENOMEM;
		}
	}
	return n;
}

/* A perfq_dev for the validated header and its mappings, with its minor; not yet visible. */
static struct perfq_dev *perfq_alloc_dev(struct pci_dev *pdev,
					 const struct perfq_region_header *hdr,
					 const struct perfq_map *maps, int nr_maps)
{
	struct perfq_dev *pd;
	int ret;

	pd = kzalloc(sizeof(*pd), GFP_KERNEL);
	if (!pd)
		return ERR_PTR(-ENOMEM);
	ret = ida_alloc_max(&perfq_ida, PERFQ_MAX_DEVICES - 1, GFP_KERNEL);
	if (ret < 0) {
		dev_err(&pdev->dev, "no free perfq minor: %d\n", ret);
		kfree(pd);
		return ERR_PTR(ret);
	}
	pd->minor = ret;
	pd->pdev = pdev;
	pd->bar_start = pci_resource_start(pdev, perfq_bar);
	pd->bar_len = pci_resource_len(pdev, perfq_bar);
	pd->hdr = *hdr;
	memcpy(pd->maps, maps, nr_maps * sizeof(*maps));
	pd->nr_maps = nr_maps;
	pd->timer = perfq_region_addr(pd, hdr->sections[PERFQ_SECTION_TIMER].offset);
	pd->host_ctrl = perfq_region_addr(pd, hdr->sections[PERFQ_SECTION_HOST_CTRL].offset);
	init_rwsem(&pd->lock);
	init_waitqueue_head(&pd->gone_wait);
	mutex_init(&pd->clock_lock);
	mutex_init(&pd->open_lock);
	perfq_read_link(pd);
	return pd;
}

/*
 * Hands pd to its struct device and adds /dev/perfqN and its sysfs
 * attributes.  From here on put_device frees pd, on failure too.
 */
static int perfq_add_dev(struct perfq_dev *pd)
{
	struct device *parent = &pd->pdev->dev;
	int ret;

	device_initialize(&pd->dev);
	pd->dev.class = perfq_class;
	pd->dev.parent = parent;
	pd->dev.devt = MKDEV(MAJOR(perfq_devt), pd->minor);
	pd->dev.groups = perfq_groups;
	pd->dev.release = perfq_dev_release;
	ret = dev_set_name(&pd->dev, PERFQ_NAME "%d", pd->minor);
	if (ret)
		goto err_put;
	cdev_init(&pd->cdev, &perfq_fops);
	pd->cdev.owner = THIS_MODULE;
	ret = cdev_device_add(&pd->cdev, &pd->dev);
	if (ret) {
		dev_err(parent, "cannot add /dev/%s: %d\n", dev_name(&pd->dev), ret);
		goto err_put;
	}
	return 0;

err_put:
	put_device(&pd->dev);
	return ret;
}

/* Is the region system memory: the module parameter, or else the header's word. */
static bool perfq_is_system_memory(const struct perfq_region_header *hdr, bool *from_header)
{
	*from_header = perfq_system_memory < 0;
	if (*from_header)
		return hdr->features & PERFQ_FEAT_SYSTEM_MEMORY;
	return perfq_system_memory > 0;
}

static int perfq_probe(struct pci_dev *pdev, const struct pci_device_id *id)
{
	struct perfq_map maps[PERFQ_MAX_MAPS];
	struct perfq_region_header hdr;
	struct perfq_dev *pd;
	bool system_memory, from_header;
	int nr_maps, ret;

	BUILD_BUG_ON(sizeof(struct perfq_region_header) != 384);
	BUILD_BUG_ON(sizeof(struct perfq_ioc_info) != 376);
	BUILD_BUG_ON(sizeof(struct perfq_ioc_clock_samples) != 64 + PERFQ_SYNC_MAX_SAMPLES * 32);
	BUILD_BUG_ON(PAGE_SIZE % PERFQ_PAGE_SIZE);

	if (perfq_bar < 0 || perfq_bar >= PCI_STD_NUM_BARS) {
		dev_err(&pdev->dev, "module parameter bar=%d is not a BAR number\n", perfq_bar);
		return -EINVAL;
	}
	ret = perfq_claim_bar(pdev);
	if (ret)
		return ret;
	ret = perfq_read_header(pdev, &hdr);
	if (ret)
		return ret;
	ret = perfq_validate_header(&pdev->dev, &hdr, pci_resource_len(pdev, perfq_bar));
	if (ret)
		return ret;
	system_memory = perfq_is_system_memory(&hdr, &from_header);
	nr_maps = perfq_map_region(pdev, &hdr, system_memory, maps);
	if (nr_maps < 0)
		return nr_maps;

	pd = perfq_alloc_dev(pdev, &hdr, maps, nr_maps);
	if (IS_ERR(pd))
		return PTR_ERR(pd);
	pd->system_memory = system_memory;
	pd->memory_from_header = from_header;
	ret = perfq_add_dev(pd);
	if (ret)
		return ret;
	pci_set_drvdata(pdev, pd);
	dev_info(&pdev->dev, "%s: device '%s', region %llu bytes in BAR %d (%llu bytes), ring %llu records, abi %u, %s memory (%s): %s, timer page uncached\n",
		 dev_name(&pd->dev), (const char *)hdr.device_name, hdr.region_size, perfq_bar,
		 pd->bar_len, hdr.ring_capacity, hdr.abi_version,
		 system_memory ? "system" : "device",
		 from_header ? "region header" : "module parameter",
		 perfq_caching_name(system_memory ? PERFQ_WRITE_BACK : PERFQ_UNCACHED));
	return 0;
}

static void perfq_remove(struct pci_dev *pdev)
{
	struct perfq_dev *pd = pci_get_drvdata(pdev);
	struct inode *inode;
	ktime_t t0 = ktime_get();

	cdev_device_del(&pd->cdev, &pd->dev);

	/*
	 * A sync round in progress sees `gone` inside its timer read or when
	 * its pause is woken, and ends; nothing sleeps holding pd->lock, so
	 * the down_write waits at most for one read.  No ioctl, fault or
	 * sysfs read touches the mappings once we held it.
	 */
	WRITE_ONCE(pd->gone, true);
	wake_up_all(&pd->gone_wait);
	down_write(&pd->lock);
	up_write(&pd->lock);

	mutex_lock(&pd->open_lock);
	inode = pd->mapping_inode;
	mutex_unlock(&pd->open_lock);
	/* Revoke every user mapping: the next access faults and gets SIGBUS. */
	if (inode)
		unmap_mapping_range(inode->i_mapping, 0, 0, 1);

	dev_info(&pdev->dev, "%s removed in %lld us: user mappings revoked, ioctls now return -ENODEV\n",
		 dev_name(&pd->dev), ktime_us_delta(ktime_get(), t0));
	pci_set_drvdata(pdev, NULL);
	put_device(&pd->dev);
}

static const struct pci_device_id perfq_pci_ids[] = {
	{ PCI_DEVICE(PCI_VENDOR_ID_REDHAT_QUMRANET, 0x1110) }, /* QEMU ivshmem */
	{ }
};
MODULE_DEVICE_TABLE(pci, perfq_pci_ids);

static struct pci_driver perfq_pci_driver = {
	.name = PERFQ_NAME,
	.id_table = perfq_pci_ids,
	.probe = perfq_probe,
	.remove = perfq_remove,
};

static int __init perfq_init(void)
{
	int ret;

	ret = alloc_chrdev_region(&perfq_devt, 0, PERFQ_MAX_DEVICES, PERFQ_NAME);
	if (ret)
		return ret;
#if LINUX_VERSION_CODE >= KERNEL_VERSION(6, 4, 0)
	perfq_class = class_create(PERFQ_NAME);
#else
	perfq_class = class_create(THIS_MODULE, PERFQ_NAME);
#endif
	if (IS_ERR(perfq_class)) {
		ret = PTR_ERR(perfq_class);
		goto err_chrdev;
	}
	ret = pci_register_driver(&perfq_pci_driver);
	if (ret)
		goto err_class;
	return 0;

err_class:
	class_destroy(perfq_class);
err_chrdev:
	unregister_chrdev_region(perfq_devt, PERFQ_MAX_DEVICES);
	return ret;
}

static void __exit perfq_exit(void)
{
	pci_unregister_driver(&perfq_pci_driver);
	class_destroy(perfq_class);
	unregister_chrdev_region(perfq_devt, PERFQ_MAX_DEVICES);
}

module_init(perfq_init);
module_exit(perfq_exit);

MODULE_DESCRIPTION("perfq: PCIe device trace region, timer register and clock sampling");
MODULE_LICENSE("GPL");
