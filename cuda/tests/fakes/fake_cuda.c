/*
 * fake_cuda.c: a fake `libcuda.so.1` backed by host memory, for the interception
 * library's tests. Built by the test harness (testkit/src/interpose/mod.rs):
 *
 *   cc -shared -fPIC -pthread -Wl,-Bsymbolic-functions -Wl,-soname,libcuda.so.1 \
 *      -o libcuda.so.1 fake_cuda.c
 *
 * Like the real driver (facts B4-B6):
 *   - cuGetProcAddress / _v2 answer (base name, cudaVersion, flags) with the variant of
 *     the largest introduction version <= cudaVersion, the _ptsz variant with flag 2,
 *     and hand out pointers to *internal* functions; exported symbols are thin
 *     wrappers, and -Bsymbolic-functions keeps internal calls off the exported names,
 *     so a preloaded library that only exports driver names sees nothing.
 *   - cudaVersion above the driver's version: NULL + CUDA_ERROR_INVALID_VALUE; an
 *     unknown name: NULL + CUDA_ERROR_NOT_FOUND (symbolStatus 1); a known name with no
 *     variant that old: NULL + status 2.
 *   - Allocations need a current context (CUDA_ERROR_INVALID_CONTEXT otherwise).
 *   - Sizes are padded as a driver does, not as naive formulas say: linear, managed
 *     and stream-ordered memory in 2 MiB pages; pitch aligned to 512 bytes; arrays
 *     with 256-byte row pitch, rows in multiples of 16 and 64 KiB of metadata (the
 *     size cuArrayGetMemoryRequirements reports); pools grow in 32 MiB chunks and
 *     release down to their threshold at synchronisation; a pool destroyed with
 *     allocations live keeps all it reserves until the last is freed; VMM sizes must be
 *     multiples of the 2 MiB granularity; cuMemUnmap must cover whole mappings.
 *   - VMM memory is freed only once every reference to its handle is released
 *     (cuMemCreate's and one per cuMemRetainAllocationHandle) and every mapping of it
 *     is unmapped. A handle is a memfd; cuMemAddressReserve reserves host address
 *     space, cuMemMap maps the memfd there (so a handle mapped twice shows the same
 *     bytes at both addresses).
 *
 * Configuration (environment; this is the fake's own wiring, not a tenant knob):
 *   FAKE_CUDA_DEVICES  "GPU-<uuid>:<bytes>,..." (default one 80 GiB GPU)
 *   FAKE_CUDA_LEDGER   path of the ledger file (created by the harness, >= 64 KiB)
 *   FAKE_CUDA_DRIVER_VERSION  default 13050
 *   FAKE_CUDA_ALLOC_DELAY_MS  sleep inside cuMemAlloc_v2 after taking the memory
 *   FAKE_CUDA_CTX_DELAY_MS    sleep inside cuCtxCreate and cuDevicePrimaryCtxRetain after
 *                             taking the context's memory (outside the fake's lock)
 *   FAKE_CUDA_CHECK_SCRUB     1: on free, count whether the memory was all zero
 *   FAKE_CUDA_REUSE_HANDLES   1: cuMemCreate gives a freed handle's value out again
 *   FAKE_CUDA_UNMAP_DELAY_MS  cuMemUnmap sleeps this long after unmapping (and freeing)
 *   FAKE_CUDA_RELEASE_FAIL_MS the process's first cuMemRelease sleeps this long, then
 *                             fails (999) releasing nothing: a refusal racing with the
 *                             tenant's other calls
 *   (CTX_DELAY, UNMAP_DELAY and RELEASE_FAIL make slow calls, see fakecuda_slow_calls
 *   below: a call another thread makes "during" one lands inside it, however late.)
 *   FAKE_CUDA_CONTEXT_BYTES   device memory each context holds (default 0): a created
 *                             context from cuCtxCreate to cuCtxDestroy, a primary context
 *                             from its first retain to its last release or a reset (a
 *                             real driver's contexts hold hundreds of MiB)
 *   FAKE_CUDA_NO_BACKING      1: linear memory gets addresses but no host pages (for
 *                             benchmarks, so that mmap does not drown the library's cost)
 *   FAKE_CUDA_DEVICE_NODES    1: as the real driver, only the GPUs whose device node the
 *                      process sees exist: entry i of FAKE_CUDA_DEVICES (listed in minor
 *                      order) is there only if /dev/nvidia<i> is a character device (a
 *                      container given one GPU by its CDI spec sees that one)
 *   CUDA_VISIBLE_DEVICES      comma-separated indices into the GPUs that exist
 *   FAKE_CUDA_SIM      path of the simulated GPU's state file (fakesim.h; created by
 *                      the first process if missing). Unset: kernel launches are
 *                      instant no-ops and synchronisation returns at once.
 *   FAKE_CUDA_SIM_LOG  the simulator's timeline log (format in fakesim.h); the first
 *                      process to open the state file records it there for all.
 *   FAKE_SIM_BLOCK_NS  ns of GPU time per block (default 1000): a kernel occupies the
 *                      GPU for gridDimX*gridDimY*gridDimZ * FAKE_SIM_BLOCK_NS
 *   FAKE_SIM_TAG       u32 stored with this process's kernels in the timeline (default 0)
 *
 * The ledger is the independent judge: device memory really held, per device
 * (used, peak across processes) and per process (one 128-byte record per process,
 * owned through an OFD lock on its range, so a reader can tell live records).
 *   offset 0: magic "FAKECUDA" (written by the harness; not required);
 *   64 + 64*dev: used, peak, scrub_ok, scrub_dirty (u64), then at +32 the device's raw
 *     16-byte UUID and at +48 a u64 1 once the UUID is there (dev = position in
 *     FAKE_CUDA_DEVICES), so a reader can map UUIDs to ledger devices;
 *   4096 + 128*rec: u64 owner flag, u64 bytes[8] per device, u64 pid (getpid()) at +72,
 *     u64 inode of the process's PID namespace at +80 (0 if /proc/self/ns/pid is unreadable);
 *   36864 + 64*rec: u64 blocks[8] per device: blocks this process launched (every
 *     launch entry point, graphs by their kernel nodes; counted with or without the
 *     simulator), the fake's own count to judge throttling by.
 * A new process takes a never-used record before one a dead process left, so that
 * memory a dead process left held stays attributed to its pid as long as possible; taking
 * a dead process's record frees that memory (subtracts it from the devices' used).
 *
 * Kernels (see fakesim.h for the model): cuModuleLoadData / cuModuleGetFunction hand
 * out handles that carry nothing; cuLaunchKernel, cuLaunchKernelEx (CUlaunchConfig),
 * cuLaunchCooperativeKernel (each with _ptsz), cuLaunchCooperativeKernelMultiDevice
 * (CUDA_LAUNCH_PARAMS; each entry's stream picks the device, NULL = the current
 * context's) and cuGraphLaunch(_ptsz) (each kernel node, in node order, as its own
 * kernel) enqueue on the stream's device. cuStreamSynchronize(_ptsz),
 * cuCtxSynchronize(_v2) wait until this process has no kernel pending on that device
 * (all of a process's streams on one device share one FIFO), sleeping until the
 * projected completion, not spinning. With the simulator a launch needs a context (or
 * a stream) and a non-zero grid (CUDA_ERROR_INVALID_VALUE otherwise); a full queue
 * (256 kernels) makes it wait for a slot; a 65th live process on one GPU gets
 * CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES (701).
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "fakesim.h"

typedef int CUresult;
typedef int CUdevice;
typedef unsigned long long CUdeviceptr;
typedef unsigned long long u64;

#define OK 0
#define INVALID_VALUE 1
#define OUT_OF_MEMORY 2
#define NOT_INITIALIZED 3
#define INVALID_DEVICE 101
#define INVALID_CONTEXT 201
#define INVALID_HANDLE 400
#define NOT_FOUND 500
#define NOT_SUPPORTED 801

#define MAXDEV 8
#define PAGE (2ull << 20)
#define POOL_CHUNK (32ull << 20)
#define LEDGER_RECS 256
#define LEDGER_REC0 4096
#define LEDGER_RECSZ 128

static u64 round_up(u64 x, u64 to) { return (x + to - 1) / to * to; }

/* ---- devices ---- */
struct dev {
    char uuid[64];
    unsigned char raw[16];
    u64 total;
    int phys; /* index in FAKE_CUDA_DEVICES: the ledger's device index */
};
static struct dev devs[MAXDEV];
static int ndev;
static struct dev alldevs[MAXDEV]; /* FAKE_CUDA_DEVICES, before CUDA_VISIBLE_DEVICES */
static int nalldevs;
static const char *devices_spec;
static int inited;
static int driver_version = 13050;
static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;

/* ---- ledger ---- */
static volatile u64 *ledger;
static int ledger_rec = -1;

static void ledger_add(int phys, long long delta) {
    if (!ledger) return;
    volatile u64 *used = &ledger[(64 + 64 * phys) / 8];
    u64 now = __atomic_add_fetch(used, (u64)delta, __ATOMIC_SEQ_CST);
    u64 peak = __atomic_load_n(used + 1, __ATOMIC_SEQ_CST);
    while (now > peak && !__atomic_compare_exchange_n(used + 1, &peak, now, 0,
                                                     __ATOMIC_SEQ_CST, __ATOMIC_SEQ_CST)) {
    }
    if (ledger_rec >= 0)
        __atomic_add_fetch(&ledger[(LEDGER_REC0 + LEDGER_RECSZ * ledger_rec) / 8 + 1 + phys],
                           (u64)delta, __ATOMIC_SEQ_CST);
}

static void ledger_scrub(int phys, int clean) {
    if (ledger) __atomic_add_fetch(&ledger[(64 + 64 * phys) / 8 + (clean ? 2 : 3)], 1, __ATOMIC_SEQ_CST);
}

#define LEDGER_BLOCKS0 36864
#define LEDGER_BLOCKSZ 64

static void ledger_blocks(int phys, u64 blocks) {
    if (ledger && ledger_rec >= 0)
        __atomic_add_fetch(&ledger[(LEDGER_BLOCKS0 + LEDGER_BLOCKSZ * ledger_rec) / 8 + phys], blocks,
                           __ATOMIC_RELAXED);
}

static void ledger_open(const struct dev *all, int nall);

static int hexval(char c) {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    return -1;
}

static void parse_devices(void) {
    struct dev all[MAXDEV];
    int nall = 0;
    const char *s = getenv("FAKE_CUDA_DEVICES");
    if (!s) s = "GPU-00000000-0000-4000-8000-000000000001:85899345920";
    devices_spec = s;
    char buf[1024];
    snprintf(buf, sizeof buf, "%s", s);
    for (char *save = NULL, *tok = strtok_r(buf, ",", &save); tok && nall < MAXDEV;
         tok = strtok_r(NULL, ",", &save)) {
        char *colon = strrchr(tok, ':');
        if (!colon) continue;
        *colon = 0;
        struct dev *d = &all[nall];
        memset(d, 0, sizeof *d);
        snprintf(d->uuid, sizeof d->uuid, "%s", tok);
        d->total = strtoull(colon + 1, NULL, 10);
        d->phys = nall;
        int k = 0;
        for (const char *c = tok + 4; *c && k < 32; c++) {
            if (*c == '-') continue;
            int v = hexval(*c);
            if (v < 0) break;
            if (k % 2 == 0) d->raw[k / 2] = (unsigned char)(v << 4); else d->raw[k / 2] |= (unsigned char)v;
            k++;
        }
        nall++;
    }
    memcpy(alldevs, all, sizeof all);
    nalldevs = nall;
    const char *nodes = getenv("FAKE_CUDA_DEVICE_NODES");
    if (nodes && strcmp(nodes, "1") == 0) {
        int kept = 0;
        for (int i = 0; i < nall; i++) {
            char path[32];
            struct stat st;
            snprintf(path, sizeof path, "/dev/nvidia%d", i);
            if (stat(path, &st) == 0 && S_ISCHR(st.st_mode)) all[kept++] = all[i];
        }
        nall = kept;
    }
    const char *vis = getenv("CUDA_VISIBLE_DEVICES");
    ndev = 0;
    if (vis) {
        char vb[256];
        snprintf(vb, sizeof vb, "%s", vis);
        for (char *save = NULL, *tok = strtok_r(vb, ",", &save); tok && ndev < MAXDEV;
             tok = strtok_r(NULL, ",", &save)) {
            int i = atoi(tok);
            if (i < 0 || i >= nall) break;
            devs[ndev++] = all[i];
        }
    } else {
        for (int i = 0; i < nall; i++) devs[ndev++] = all[i];
    }
}

/* Claims a record (never-used ones first), stamps it with our pid and records the
 * devices' UUIDs. */
static void ledger_open(const struct dev *all, int nall) {
    const char *p = getenv("FAKE_CUDA_LEDGER");
    if (!p || ledger) return;
    int fd = open(p, O_RDWR | O_CLOEXEC);
    if (fd < 0) { fprintf(stderr, "fake-cuda: ledger %s: %s\n", p, strerror(errno)); return; }
    void *m = mmap(NULL, 65536, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (m == MAP_FAILED) { close(fd); return; }
    ledger = m;
    for (int i = 0; i < nall; i++) {
        volatile unsigned char *u = (volatile unsigned char *)m + 64 + 64 * all[i].phys + 32;
        for (int k = 0; k < 16; k++) u[k] = all[i].raw[k];
        __atomic_store_n(&ledger[(64 + 64 * all[i].phys + 48) / 8], 1, __ATOMIC_SEQ_CST);
    }
    for (int pass = 0; pass < 2 && ledger_rec < 0; pass++)
        for (int r = 0; r < LEDGER_RECS; r++) {
            volatile u64 *rec = &ledger[(LEDGER_REC0 + LEDGER_RECSZ * r) / 8];
            if (pass == 0 && rec[0] != 0) continue;
            struct flock fl = {.l_type = F_WRLCK, .l_whence = SEEK_SET,
                               .l_start = LEDGER_REC0 + LEDGER_RECSZ * r, .l_len = LEDGER_RECSZ};
            if (fcntl(fd, F_OFD_SETLK, &fl) == 0) {
                ledger_rec = r;
                /* A dead process's record: the memory it left held is freed now (the
                 * device's used counter would otherwise only grow). */
                for (int i = 0; i < MAXDEV; i++)
                    if (rec[1 + i] != 0)
                        __atomic_sub_fetch(&ledger[(64 + 64 * i) / 8], rec[1 + i], __ATOMIC_SEQ_CST);
                for (int i = 0; i < 1 + MAXDEV; i++) rec[i] = 0;
                rec[9] = (u64)getpid();
                /* The PID namespace the pid is in: a reader with another view of the
                 * processes (the plugin, with the host's /proc) translates through it,
                 * as NVML reports host PIDs for processes in containers. */
                struct stat ns;
                rec[10] = stat("/proc/self/ns/pid", &ns) == 0 ? (u64)ns.st_ino : 0;
                volatile u64 *blk = &ledger[(LEDGER_BLOCKS0 + LEDGER_BLOCKSZ * r) / 8];
                for (int i = 0; i < MAXDEV; i++) blk[i] = 0;
                rec[0] = 1;
                break;
            }
        }
    /* fd stays open: the record's lock lives as long as the process */
}

/* ---- contexts ---- */
struct ctx { int magic; int dev; };
#define CTX_MAGIC 0x43545821
static struct ctx primary[MAXDEV];
/* The primary contexts' retain counts and whether each holds its memory now. */
static unsigned primary_refs[MAXDEV];
static int primary_active[MAXDEV];
static u64 context_bytes;
static __thread struct ctx *current;

static int cur_dev(void) { return current && current->magic == CTX_MAGIC ? current->dev : -1; }

/* ---- simulated GPU (fakesim.h) ---- */
static struct fakesim sim;
static int sim_on;
static u64 sim_block_ns = 1000;
static uint32_t sim_tag;

static void sim_open(void) {
    const char *path = getenv("FAKE_CUDA_SIM");
    if (!path || !*path) return;
    const char *b = getenv("FAKE_SIM_BLOCK_NS");
    if (b && strtoull(b, NULL, 10) > 0) sim_block_ns = strtoull(b, NULL, 10);
    const char *t = getenv("FAKE_SIM_TAG");
    if (t) sim_tag = (uint32_t)strtoul(t, NULL, 10);
    if (fakesim_open(&sim, path) != 0) return;
    fakesim_setup(&sim, devices_spec, getenv("FAKE_CUDA_SIM_LOG"));
    sim_on = 1;
}

/* Timer slack makes a sleeping synchroniser oversleep by 50 us; a GPU wakes its
 * waiters at once. */
static void sim_tight_timers(void) {
    static __thread int done;
    if (!done) { prctl(PR_SET_TIMERSLACK, 1000UL, 0, 0, 0); done = 1; }
}

/* Enqueues n kernels (blocks[i] each) on logical device dev, waiting while the queue
 * is full. Also counts the blocks in the ledger. */
static CUresult enqueue(int dev, const u64 *blocks, size_t n) {
    if (dev < 0 || dev >= ndev) return INVALID_CONTEXT;
    int phys = devs[dev].phys;
    u64 total = 0;
    for (size_t i = 0; i < n; i++) total += blocks[i];
    ledger_blocks(phys, total);
    if (!sim_on || phys >= FAKESIM_MAXDEV) return OK;
    size_t i = 0;
    while (i < n) {
        fakesim_lock(&sim);
        u64 now = fakesim_now();
        fakesim_advance(&sim, (unsigned)phys, now);
        int idx = fakesim_claim(&sim, (unsigned)phys, (uint32_t)getpid(), sim_tag);
        if (idx < 0) {
            fakesim_unlock(&sim);
            fprintf(stderr, "fake-cuda: the simulated GPU has no free process record\n");
            return 701; /* CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES */
        }
        for (; i < n; i++)
            if (fakesim_push(&sim, (unsigned)phys, (unsigned)idx, blocks[i] * sim_block_ns, blocks[i], now) != 0)
                break;
        u64 wake = i < n ? fakesim_project(&sim, (unsigned)phys, (unsigned)idx, 1) : 0;
        fakesim_unlock(&sim);
        if (i < n) {
            /* Queue full: wait for our head kernel, as a full launch queue blocks. */
            sim_tight_timers();
            fakesim_sleep_until(wake > now ? wake : now + 20000);
        }
    }
    return OK;
}

/* Waits until this process has no kernel pending on logical device dev. */
static void sim_wait(int dev) {
    if (!sim_on || dev < 0 || dev >= ndev || devs[dev].phys >= FAKESIM_MAXDEV) return;
    unsigned gi = (unsigned)devs[dev].phys;
    for (;;) {
        fakesim_lock(&sim);
        u64 now = fakesim_now();
        struct fakesim_gpu *g = fakesim_advance(&sim, gi, now);
        int idx = sim.own[gi];
        u64 pending = idx < 0 ? 0 : g->procs[idx].tail - g->procs[idx].head;
        u64 wake = pending ? fakesim_project(&sim, gi, (unsigned)idx, pending) : 0;
        fakesim_unlock(&sim);
        if (!pending) return;
        sim_tight_timers();
        fakesim_sleep_until(wake > now ? wake : now + 20000);
    }
}

/* ---- streams, modules ---- */
struct stream { int magic; int dev; struct ctx *ctx; };
#define STREAM_MAGIC 0x5354524d
/* The logical device a stream's work goes to: NULL, CU_STREAM_LEGACY (1) and
 * CU_STREAM_PER_THREAD (2) are the current context's. -1: no context; -2: bad handle. */
static int stream_dev(void *s) {
    if ((uintptr_t)s <= 2) return cur_dev();
    const struct stream *st = s;
    return st->magic == STREAM_MAGIC ? st->dev : -2;
}
static CUresult dev_error(int dev) { return dev == -2 ? INVALID_HANDLE : INVALID_CONTEXT; }

/* ---- allocations ---- */
enum kind { K_LINEAR, K_MANAGED, K_ASYNC, K_VMM, K_ARRAY, K_MIPMAP };
struct alloc { u64 id; u64 size; u64 ledger; int dev; int kind; void *pool; };
static struct alloc *allocs;
static size_t nallocs, capallocs;

static void track(u64 id, u64 size, u64 led, int dev, int kind, void *pool) {
    if (nallocs == capallocs) {
        capallocs = capallocs ? capallocs * 2 : 256;
        allocs = realloc(allocs, capallocs * sizeof *allocs);
    }
    allocs[nallocs++] = (struct alloc){id, size, led, dev, kind, pool};
}

static int untrack(u64 id, int kind, struct alloc *out) {
    for (size_t i = 0; i < nallocs; i++)
        if (allocs[i].id == id && allocs[i].kind == kind) {
            *out = allocs[i];
            allocs[i] = allocs[--nallocs];
            return 1;
        }
    return 0;
}

static void *host_map(u64 size) {
    void *p = mmap(NULL, size ? size : 1, PROT_READ | PROT_WRITE,
                   MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    return p == MAP_FAILED ? NULL : p;
}

static u64 used_on(int phys) {
    return ledger ? __atomic_load_n(&ledger[(64 + 64 * phys) / 8], __ATOMIC_SEQ_CST) : 0;
}

/* Takes `led` bytes of device memory on device `dev` (ledger and capacity). */
static int take(int dev, u64 led) {
    if (used_on(devs[dev].phys) + led > devs[dev].total) return OUT_OF_MEMORY;
    ledger_add(devs[dev].phys, (long long)led);
    return OK;
}

static void give(int dev, u64 led) { ledger_add(devs[dev].phys, -(long long)led); }

/* ---- pools ---- */
/* dead: destroyed with allocations live; its memory stays held until the last is freed */
struct pool { int magic; int dev; int dead; u64 reserved, used, threshold; };
#define POOL_MAGIC 0x504f4f4c
static struct pool default_pool[MAXDEV];
static struct pool *current_pool[MAXDEV];

static void pool_release(struct pool *p, u64 keep) {
    u64 floor = p->used > keep ? p->used : keep;
    floor = round_up(floor, PAGE);
    if (p->reserved > floor) { give(p->dev, p->reserved - floor); p->reserved = floor; }
}

/* ---- internal implementations (static: never reached through exported names) ---- */
static CUresult i_cuInit(unsigned flags) {
    (void)flags;
    pthread_mutex_lock(&mu);
    if (!inited) {
        const char *v = getenv("FAKE_CUDA_DRIVER_VERSION");
        if (v) driver_version = atoi(v);
        const char *cb = getenv("FAKE_CUDA_CONTEXT_BYTES");
        if (cb) context_bytes = strtoull(cb, NULL, 10);
        parse_devices();
        ledger_open(alldevs, nalldevs);
        sim_open();
        for (int i = 0; i < ndev; i++) {
            primary[i] = (struct ctx){CTX_MAGIC, i};
            default_pool[i] = (struct pool){POOL_MAGIC, i, 0, 0, 0, 0};
            current_pool[i] = &default_pool[i];
        }
        inited = 1;
    }
    pthread_mutex_unlock(&mu);
    return OK;
}
static CUresult i_cuDriverGetVersion(int *v) { if (!v) return INVALID_VALUE; *v = driver_version; return OK; }
static CUresult i_cuDeviceGetCount(int *n) { if (!inited) return NOT_INITIALIZED; *n = ndev; return OK; }
static CUresult i_cuDeviceGet(CUdevice *d, int ord) {
    if (!inited) return NOT_INITIALIZED;
    if (ord < 0 || ord >= ndev) return INVALID_DEVICE;
    *d = ord; return OK;
}
static CUresult i_cuDeviceGetName(char *name, int len, CUdevice d) {
    if (d < 0 || d >= ndev) return INVALID_DEVICE;
    snprintf(name, (size_t)len, "Fake GPU %d", d); return OK;
}
static CUresult i_cuDeviceGetUuid(unsigned char *u, CUdevice d) {
    if (!inited) return NOT_INITIALIZED;
    if (d < 0 || d >= ndev) return INVALID_DEVICE;
    memcpy(u, devs[d].raw, 16); return OK;
}
static CUresult i_cuDeviceGetUuid_v2(unsigned char *u, CUdevice d) { return i_cuDeviceGetUuid(u, d); }
static CUresult i_cuDeviceTotalMem_v2(size_t *b, CUdevice d) {
    if (!inited) return NOT_INITIALIZED;
    if (d < 0 || d >= ndev) return INVALID_DEVICE;
    *b = devs[d].total; return OK;
}
/* Ordering hooks for cuda_client's background calls (its bgfree and bgunmap commands),
 * found with dlsym. A driver call slowed down on purpose (FAKE_CUDA_CTX_DELAY_MS,
 * FAKE_CUDA_UNMAP_DELAY_MS, FAKE_CUDA_RELEASE_FAIL_MS) counts itself in
 * fakecuda_slow_calls while it is under way; the client counts its background calls in
 * fakecuda_bg_pending until they return. A context creation or a failing release
 * returns only once no background call is pending (at most 60 s), so that a call the
 * client makes "during" it (its thread waits for a slow call to be under way) lands
 * inside it, in that order, however the machine schedules the two threads. */
int fakecuda_slow_calls;
int fakecuda_bg_pending;
static void slow_call(const char *ms, int wait_bg) {
    __atomic_add_fetch(&fakecuda_slow_calls, 1, __ATOMIC_SEQ_CST);
    usleep((useconds_t)atoi(ms) * 1000);
    for (int i = 0; wait_bg && i < 60000 && __atomic_load_n(&fakecuda_bg_pending, __ATOMIC_SEQ_CST) > 0; i++)
        usleep(1000);
    __atomic_sub_fetch(&fakecuda_slow_calls, 1, __ATOMIC_SEQ_CST);
}
static CUresult i_cuDevicePrimaryCtxRetain(struct ctx **c, CUdevice d) {
    if (!inited) return NOT_INITIALIZED;
    if (d < 0 || d >= ndev) return INVALID_DEVICE;
    if (!c) return INVALID_VALUE;
    pthread_mutex_lock(&mu);
    CUresult rc = OK;
    if (!primary_active[d]) {
        rc = take(d, context_bytes);
        if (rc == OK) primary_active[d] = 1;
    }
    if (rc == OK) { primary_refs[d]++; *c = &primary[d]; }
    pthread_mutex_unlock(&mu);
    const char *delay = getenv("FAKE_CUDA_CTX_DELAY_MS");
    if (rc == OK && delay) slow_call(delay, 1);
    return rc;
}
static CUresult i_cuDevicePrimaryCtxRelease_v2(CUdevice d) {
    if (d < 0 || d >= ndev) return INVALID_DEVICE;
    pthread_mutex_lock(&mu);
    CUresult rc = OK;
    if (primary_refs[d] == 0) rc = INVALID_CONTEXT;
    else if (--primary_refs[d] == 0 && primary_active[d]) { give(d, context_bytes); primary_active[d] = 0; }
    pthread_mutex_unlock(&mu);
    return rc;
}
static CUresult i_cuDevicePrimaryCtxReset_v2(CUdevice d) {
    if (d < 0 || d >= ndev) return INVALID_DEVICE;
    pthread_mutex_lock(&mu);
    if (primary_active[d]) { give(d, context_bytes); primary_active[d] = 0; }
    pthread_mutex_unlock(&mu);
    return OK;
}
static CUresult i_cuCtxCreate_v2(struct ctx **c, unsigned flags, CUdevice d) {
    (void)flags;
    if (!inited) return NOT_INITIALIZED;
    if (d < 0 || d >= ndev) return INVALID_DEVICE;
    if (!c) return INVALID_VALUE;
    pthread_mutex_lock(&mu);
    CUresult rc = take(d, context_bytes);
    pthread_mutex_unlock(&mu);
    if (rc != OK) return rc;
    const char *delay = getenv("FAKE_CUDA_CTX_DELAY_MS");
    if (delay) slow_call(delay, 1);
    struct ctx *n = malloc(sizeof *n);
    *n = (struct ctx){CTX_MAGIC, d};
    *c = n; current = n; return OK;
}
static CUresult i_cuCtxCreate_v3(struct ctx **c, void *affinity, int n, unsigned flags, CUdevice d) {
    (void)affinity; (void)n; return i_cuCtxCreate_v2(c, flags, d);
}
static CUresult i_cuCtxCreate_v4(struct ctx **c, void *params, unsigned flags, CUdevice d) {
    (void)params; return i_cuCtxCreate_v2(c, flags, d);
}
static CUresult i_cuCtxDestroy_v2(struct ctx *c) {
    if (!c || c->magic != CTX_MAGIC) return INVALID_CONTEXT;
    if (c >= primary && c < primary + MAXDEV) return INVALID_CONTEXT; /* primary: release it */
    if (current == c) current = NULL;
    pthread_mutex_lock(&mu);
    give(c->dev, context_bytes);
    pthread_mutex_unlock(&mu);
    c->magic = 0; free(c);
    return OK;
}
static CUresult i_cuCtxSetCurrent(struct ctx *c) {
    if (c && c->magic != CTX_MAGIC) return INVALID_CONTEXT;
    current = c; return OK;
}
static CUresult i_cuCtxGetCurrent(struct ctx **c) { *c = current; return OK; }
static CUresult i_cuCtxGetDevice(CUdevice *d) {
    int dev = cur_dev();
    if (dev < 0) return INVALID_CONTEXT;
    *d = dev; return OK;
}
static CUresult i_cuCtxGetDevice_v2(CUdevice *d, struct ctx *c) {
    if (!c) return i_cuCtxGetDevice(d);
    if (c->magic != CTX_MAGIC) return INVALID_CONTEXT;
    *d = c->dev; return OK;
}
static CUresult i_sync_all(void) {
    pthread_mutex_lock(&mu);
    for (int i = 0; i < ndev; i++) {
        pool_release(&default_pool[i], default_pool[i].threshold);
        if (current_pool[i] != &default_pool[i]) pool_release(current_pool[i], current_pool[i]->threshold);
    }
    pthread_mutex_unlock(&mu);
    return OK;
}
static CUresult i_cuCtxSynchronize(void) {
    int dev = cur_dev();
    if (dev < 0) return INVALID_CONTEXT;
    sim_wait(dev);
    return i_sync_all();
}
static CUresult i_cuCtxSynchronize_v2(struct ctx *c) {
    if (c && c->magic != CTX_MAGIC) return INVALID_CONTEXT;
    if (!c) return i_cuCtxSynchronize();
    sim_wait(c->dev);
    return i_sync_all();
}
static CUresult i_cuStreamSynchronize(void *s) {
    int dev = stream_dev(s);
    if (dev < 0) return dev_error(dev);
    sim_wait(dev);
    return i_sync_all();
}
static CUresult i_cuStreamSynchronize_ptsz(void *s) { return i_cuStreamSynchronize(s); }
static CUresult i_cuStreamCreate(struct stream **out, unsigned flags) {
    if (flags > 1) return INVALID_VALUE;
    int dev = cur_dev();
    if (dev < 0) return INVALID_CONTEXT;
    if (!out) return INVALID_VALUE;
    struct stream *st = malloc(sizeof *st);
    if (!st) return OUT_OF_MEMORY;
    *st = (struct stream){STREAM_MAGIC, dev, current};
    *out = st;
    return OK;
}
/* As the driver (12.8+): a stream's device, and (9.2+) its context; NULL, legacy and
 * per-thread streams are the current context's. */
static CUresult i_cuStreamGetDevice(void *s, CUdevice *d) {
    int dev = stream_dev(s);
    if (dev < 0) return dev_error(dev);
    if (!d) return INVALID_VALUE;
    *d = dev;
    return OK;
}
static CUresult i_cuStreamGetCtx(void *s, struct ctx **c) {
    if (!c) return INVALID_VALUE;
    if ((uintptr_t)s <= 2) {
        if (cur_dev() < 0) return INVALID_CONTEXT;
        *c = current;
        return OK;
    }
    const struct stream *st = s;
    if (st->magic != STREAM_MAGIC) return INVALID_HANDLE;
    *c = st->ctx;
    return OK;
}
static CUresult i_cuStreamDestroy_v2(struct stream *st) {
    if ((uintptr_t)st <= 2 || st->magic != STREAM_MAGIC) return INVALID_HANDLE;
    st->magic = 0;
    free(st);
    return OK;
}
struct module { int magic; };
struct func { int magic; struct module *m; char name[64]; };
#define MODULE_MAGIC 0x4d4f4455
#define FUNC_MAGIC 0x46554e43
/* Any image loads; any name is found: a function carries nothing but its name. */
static CUresult i_cuModuleLoadData(struct module **out, const void *image) {
    if (cur_dev() < 0) return INVALID_CONTEXT;
    if (!out || !image) return INVALID_VALUE;
    struct module *m = malloc(sizeof *m);
    if (!m) return OUT_OF_MEMORY;
    m->magic = MODULE_MAGIC;
    *out = m;
    return OK;
}
static CUresult i_cuModuleUnload(struct module *m) {
    if (!m || m->magic != MODULE_MAGIC) return INVALID_HANDLE;
    m->magic = 0;
    free(m); /* its functions leak, as handles into an unloaded module dangle */
    return OK;
}
static CUresult i_cuModuleGetFunction(struct func **out, struct module *m, const char *name) {
    if (!out || !name) return INVALID_VALUE;
    if (!m || m->magic != MODULE_MAGIC) return INVALID_HANDLE;
    struct func *f = malloc(sizeof *f);
    if (!f) return OUT_OF_MEMORY;
    f->magic = FUNC_MAGIC;
    f->m = m;
    snprintf(f->name, sizeof f->name, "%s", name);
    *out = f;
    return OK;
}

static int no_backing = -1;
static u64 next_fake_addr = 0x7f0000000000ull;
/* Without host pages, freed addresses are handed out again (last freed first, same
 * size), as the kernel does for the backed mode's mappings and a real driver for its
 * device addresses: a free-then-alloc loop sees the same pointer, not a new one each
 * time. Under `mu`. */
#define FREE_ADDRS 1024
static struct { u64 addr, size; } free_addrs[FREE_ADDRS];
static int nfree_addrs;
static u64 fake_addr(u64 led) {
    for (int i = nfree_addrs - 1; i >= 0; i--)
        if (free_addrs[i].size == led) {
            u64 a = free_addrs[i].addr;
            free_addrs[i] = free_addrs[--nfree_addrs];
            return a;
        }
    return next_fake_addr += led;
}
static CUresult alloc_linear(CUdeviceptr *dptr, u64 size, int kind) {
    if (no_backing < 0) {
        const char *nb = getenv("FAKE_CUDA_NO_BACKING");
        no_backing = nb && strcmp(nb, "1") == 0;
    }
    int dev = cur_dev();
    if (dev < 0) return INVALID_CONTEXT;
    if (!dptr || size == 0) return INVALID_VALUE;
    u64 led = round_up(size, PAGE);
    pthread_mutex_lock(&mu);
    CUresult rc = take(dev, led);
    if (rc == OK) {
        void *p = no_backing ? (void *)(uintptr_t)fake_addr(led) : host_map(size);
        if (!p) { give(dev, led); rc = OUT_OF_MEMORY; }
        else { *dptr = (CUdeviceptr)(uintptr_t)p; track(*dptr, size, led, dev, kind, NULL); }
    }
    pthread_mutex_unlock(&mu);
    return rc;
}
static CUresult i_cuMemAlloc_v2(CUdeviceptr *dptr, size_t size) {
    CUresult rc = alloc_linear(dptr, size, K_LINEAR);
    const char *d = getenv("FAKE_CUDA_ALLOC_DELAY_MS");
    if (rc == OK && d) usleep((useconds_t)atoi(d) * 1000);
    return rc;
}
/* The 32-bit variant: a 64-bit driver has no 32-bit device pointers to give. */
static CUresult i_cuMemAlloc(unsigned *dptr, unsigned size) { (void)dptr; (void)size; return NOT_SUPPORTED; }
static CUresult i_cuMemAllocManaged(CUdeviceptr *dptr, size_t size, unsigned flags) {
    if (flags != 1 && flags != 2) return INVALID_VALUE;
    return alloc_linear(dptr, size, K_MANAGED);
}
static CUresult i_cuMemAllocPitch_v2(CUdeviceptr *dptr, size_t *pitch, size_t w, size_t h, unsigned elem) {
    if (!pitch || w == 0 || h == 0 || (elem != 4 && elem != 8 && elem != 16)) return INVALID_VALUE;
    u64 p = round_up(w, 512);
    CUresult rc = alloc_linear(dptr, p * h, K_LINEAR);
    if (rc == OK) *pitch = p;
    return rc;
}
/* FAKE_CUDA_CHECK_SCRUB=1: counts whether `size` bytes at `p`, about to be freed, are
 * all zero. */
static void check_scrub_at(const void *p, u64 size, int dev) {
    const char *c = getenv("FAKE_CUDA_CHECK_SCRUB");
    if (!c || strcmp(c, "1") != 0) return;
    const unsigned char *b = p;
    int clean = 1;
    for (u64 i = 0; i < size; i++) if (b[i]) { clean = 0; break; }
    ledger_scrub(devs[dev].phys, clean);
}
static void check_scrub(struct alloc *a) { check_scrub_at((const void *)(uintptr_t)a->id, a->size, a->dev); }
static CUresult i_cuMemFree_v2(CUdeviceptr ptr) {
    struct alloc a;
    pthread_mutex_lock(&mu);
    int found = untrack(ptr, K_LINEAR, &a) || untrack(ptr, K_MANAGED, &a);
    if (found) {
        give(a.dev, a.ledger);
        if (no_backing != 1) {
            check_scrub(&a);
            munmap((void *)(uintptr_t)a.id, a.size ? a.size : 1);
        } else if (nfree_addrs < FREE_ADDRS) {
            free_addrs[nfree_addrs].addr = a.id;
            free_addrs[nfree_addrs++].size = a.ledger;
        }
    }
    pthread_mutex_unlock(&mu);
    return found ? OK : INVALID_VALUE;
}
static CUresult i_cuMemGetInfo_v2(size_t *free_, size_t *total) {
    int dev = cur_dev();
    if (dev < 0) return INVALID_CONTEXT;
    u64 used = used_on(devs[dev].phys);
    *total = devs[dev].total;
    *free_ = used >= devs[dev].total ? 0 : devs[dev].total - used;
    return OK;
}
static CUresult i_cuMemsetD8_v2(CUdeviceptr p, unsigned char v, size_t n) {
    if (cur_dev() < 0) return INVALID_CONTEXT;
    memset((void *)(uintptr_t)p, v, n); return OK;
}
/* Stream-ordered memsets run at once (the fake's streams are always idle). */
static CUresult i_cuMemsetD8Async(CUdeviceptr p, unsigned char v, size_t n, void *stream) {
    int dev = stream_dev(stream);
    if (dev < 0) return dev_error(dev);
    memset((void *)(uintptr_t)p, v, n); return OK;
}
static CUresult i_cuMemsetD8Async_ptsz(CUdeviceptr p, unsigned char v, size_t n, void *stream) {
    return i_cuMemsetD8Async(p, v, n, stream);
}
static CUresult i_cuMemcpyHtoD_v2(CUdeviceptr dst, const void *src, size_t n) {
    memcpy((void *)(uintptr_t)dst, src, n); return OK;
}
static CUresult i_cuMemcpyDtoH_v2(void *dst, CUdeviceptr src, size_t n) {
    memcpy(dst, (const void *)(uintptr_t)src, n); return OK;
}

/* stream-ordered */
static CUresult alloc_from(struct pool *p, CUdeviceptr *dptr, size_t size) {
    if (cur_dev() < 0) return INVALID_CONTEXT;
    if (!p || p->magic != POOL_MAGIC || !dptr || size == 0) return INVALID_VALUE;
    u64 s = round_up(size, PAGE);
    pthread_mutex_lock(&mu);
    CUresult rc = OK;
    if (p->reserved - p->used < s) {
        u64 grow = round_up(s - (p->reserved - p->used), POOL_CHUNK);
        rc = take(p->dev, grow);
        if (rc == OK) p->reserved += grow;
    }
    if (rc == OK) {
        void *m = host_map(size);
        p->used += s;
        *dptr = (CUdeviceptr)(uintptr_t)m;
        track(*dptr, size, s, p->dev, K_ASYNC, p);
    }
    pthread_mutex_unlock(&mu);
    return rc;
}
static CUresult i_cuMemAllocAsync(CUdeviceptr *dptr, size_t size, void *stream) {
    (void)stream;
    int dev = cur_dev();
    if (dev < 0) return INVALID_CONTEXT;
    return alloc_from(current_pool[dev], dptr, size);
}
static CUresult i_cuMemAllocFromPoolAsync(CUdeviceptr *dptr, size_t size, struct pool *pool, void *stream) {
    (void)stream; return alloc_from(pool, dptr, size);
}
static CUresult i_cuMemFreeAsync(CUdeviceptr ptr, void *stream) {
    (void)stream;
    struct alloc a;
    pthread_mutex_lock(&mu);
    int found = untrack(ptr, K_ASYNC, &a);
    if (found) {
        struct pool *p = a.pool;
        p->used -= a.ledger;
        if (p->dead && p->used == 0) { give(p->dev, p->reserved); p->reserved = 0; p->dead = 0; }
        check_scrub(&a);
        munmap((void *)(uintptr_t)a.id, a.size);
    }
    pthread_mutex_unlock(&mu);
    return found ? OK : INVALID_VALUE;
}
static CUresult i_cuDeviceGetDefaultMemPool(struct pool **p, CUdevice d) {
    if (d < 0 || d >= ndev) return INVALID_DEVICE;
    *p = &default_pool[d]; return OK;
}
static CUresult i_cuDeviceGetMemPool(struct pool **p, CUdevice d) {
    if (d < 0 || d >= ndev) return INVALID_DEVICE;
    *p = current_pool[d]; return OK;
}
static CUresult i_cuDeviceSetMemPool(CUdevice d, struct pool *p) {
    if (d < 0 || d >= ndev) return INVALID_DEVICE;
    if (!p || p->magic != POOL_MAGIC) return INVALID_VALUE;
    current_pool[d] = p; return OK;
}
struct pool_props { int alloc_type, handle_types, loc_type, loc_id; };
static CUresult i_cuMemPoolCreate(struct pool **out, const struct pool_props *props) {
    if (!props || props->loc_type != 1 || props->loc_id < 0 || props->loc_id >= ndev) return INVALID_VALUE;
    struct pool *p = calloc(1, sizeof *p);
    p->magic = POOL_MAGIC; p->dev = props->loc_id;
    *out = p; return OK;
}
static CUresult i_cuMemPoolDestroy(struct pool *p) {
    if (!p || p->magic != POOL_MAGIC || p == &default_pool[p->dev]) return INVALID_VALUE;
    /* Like the driver: returns at once; with allocations still live the pool's memory
     * (all it reserves) is held until the last of them is freed. */
    pthread_mutex_lock(&mu);
    if (p->used == 0) { give(p->dev, p->reserved); p->reserved = 0; }
    else p->dead = 1;
    p->magic = 0;
    pthread_mutex_unlock(&mu);
    return OK;
}
static CUresult i_cuMemPoolTrimTo(struct pool *p, size_t keep) {
    if (!p || p->magic != POOL_MAGIC) return INVALID_VALUE;
    pthread_mutex_lock(&mu); pool_release(p, keep); pthread_mutex_unlock(&mu);
    return OK;
}
static CUresult i_cuMemPoolSetAttribute(struct pool *p, int attr, void *v) {
    if (!p || p->magic != POOL_MAGIC || !v) return INVALID_VALUE;
    if (attr == 4) { p->threshold = *(u64 *)v; return OK; }
    return INVALID_VALUE;
}
static CUresult i_cuMemPoolGetAttribute(struct pool *p, int attr, void *v) {
    if (!p || p->magic != POOL_MAGIC || !v) return INVALID_VALUE;
    u64 *o = v;
    switch (attr) {
    case 4: *o = p->threshold; return OK;
    case 5: *o = p->reserved; return OK;
    case 7: *o = p->used; return OK;
    default: return INVALID_VALUE;
    }
}

/* VMM */
struct prop { int type, handle_types, loc_type, loc_id; };
static CUresult i_cuMemGetAllocationGranularity(size_t *g, const struct prop *p, int option) {
    (void)p; *g = option == 1 ? 2 * PAGE : PAGE; return OK;
}
/* A handle's memory: a memfd (the "physical" pages) with a view of its own, freed
 * once no reference to the handle and no mapping of it is left. */
struct vmm { u64 handle; u64 size; int dev; int fd; void *phys; int maps; int refs; };
#define MAXVMM 1024
static struct vmm vmms[MAXVMM];
static struct { u64 va, size; int idx; } vmaps[4 * MAXVMM];
static int nvmaps;
static struct vmm *vmm_find(u64 handle) {
    for (int i = 0; i < MAXVMM; i++) if (vmms[i].handle == handle) return &vmms[i];
    return NULL;
}
/* Under mu. */
static void vmm_free_if_done(struct vmm *v) {
    if (v->refs > 0 || v->maps > 0) return;
    check_scrub_at(v->phys, v->size, v->dev);
    give(v->dev, v->size);
    munmap(v->phys, v->size);
    close(v->fd);
    memset(v, 0, sizeof *v);
}
static CUresult i_cuMemCreate(u64 *handle, size_t size, const struct prop *p, unsigned long long flags) {
    (void)flags;
    if (!inited) return NOT_INITIALIZED;
    if (!p || !handle || p->loc_type != 1 || p->loc_id < 0 || p->loc_id >= ndev) return INVALID_VALUE;
    if (size == 0 || size % PAGE) return INVALID_VALUE;
    pthread_mutex_lock(&mu);
    struct vmm *v = vmm_find(0);
    CUresult rc = v ? take(p->loc_id, size) : OUT_OF_MEMORY;
    if (rc == OK) {
        static u64 next = 0x1000;
        int fd = memfd_create("fake-vmm", MFD_CLOEXEC);
        void *phys = fd < 0 || ftruncate(fd, (off_t)size) != 0 ? MAP_FAILED
                   : mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
        if (phys == MAP_FAILED) {
            if (fd >= 0) close(fd);
            give(p->loc_id, size);
            rc = OUT_OF_MEMORY;
        } else {
            /* FAKE_CUDA_REUSE_HANDLES: a freed handle's value comes back (as a real
             * driver's handles, pointers to its own records, can) */
            const char *reuse = getenv("FAKE_CUDA_REUSE_HANDLES");
            u64 h = reuse && *reuse == '1' ? 0x100000 + (u64)(v - vmms) : next++;
            *v = (struct vmm){h, size, p->loc_id, fd, phys, 0, 1};
            *handle = v->handle;
        }
    }
    pthread_mutex_unlock(&mu);
    return rc;
}
static CUresult i_cuMemRelease(u64 handle) {
    const char *fail = getenv("FAKE_CUDA_RELEASE_FAIL_MS");
    static int failed;
    if (fail && *fail && !__atomic_exchange_n(&failed, 1, __ATOMIC_SEQ_CST)) {
        /* fault injection: the first release takes its time and is then refused */
        slow_call(fail, 1);
        return 999; /* CUDA_ERROR_UNKNOWN */
    }
    pthread_mutex_lock(&mu);
    struct vmm *v = handle ? vmm_find(handle) : NULL;
    CUresult rc = v && v->refs > 0 ? OK : INVALID_VALUE;
    if (rc == OK) { v->refs--; vmm_free_if_done(v); }
    pthread_mutex_unlock(&mu);
    return rc;
}
/* The handle mapped at addr (anywhere in a mapping), with one more reference. */
static CUresult i_cuMemRetainAllocationHandle(u64 *handle, void *addr) {
    if (!handle) return INVALID_VALUE;
    u64 a = (u64)(uintptr_t)addr;
    CUresult rc = INVALID_VALUE;
    pthread_mutex_lock(&mu);
    for (int i = 0; i < nvmaps; i++) {
        if (a >= vmaps[i].va && a < vmaps[i].va + vmaps[i].size) {
            struct vmm *v = &vmms[vmaps[i].idx];
            v->refs++;
            *handle = v->handle;
            rc = OK;
            break;
        }
    }
    pthread_mutex_unlock(&mu);
    return rc;
}
static CUresult i_cuMemAddressReserve(CUdeviceptr *ptr, size_t size, size_t align, CUdeviceptr addr, unsigned long long flags) {
    (void)align; (void)addr; (void)flags;
    if (!ptr || size == 0 || size % PAGE) return INVALID_VALUE;
    void *m = mmap(NULL, size, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (m == MAP_FAILED) return OUT_OF_MEMORY;
    *ptr = (CUdeviceptr)(uintptr_t)m;
    return OK;
}
static CUresult i_cuMemAddressFree(CUdeviceptr ptr, size_t size) {
    if (!ptr || size == 0) return INVALID_VALUE;
    munmap((void *)(uintptr_t)ptr, size);
    return OK;
}
static CUresult i_cuMemMap(CUdeviceptr ptr, size_t size, size_t offset, u64 handle, unsigned long long flags) {
    (void)flags;
    if (!ptr || size == 0 || size % PAGE || offset % PAGE) return INVALID_VALUE;
    pthread_mutex_lock(&mu);
    struct vmm *v = handle ? vmm_find(handle) : NULL;
    CUresult rc = OK;
    if (!v || v->refs == 0 || offset + size > v->size || nvmaps == 4 * MAXVMM) rc = INVALID_VALUE;
    else if (mmap((void *)(uintptr_t)ptr, size, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_FIXED, v->fd,
                  (off_t)offset) == MAP_FAILED) rc = INVALID_VALUE;
    if (rc == OK) {
        v->maps++;
        vmaps[nvmaps].va = ptr; vmaps[nvmaps].size = size; vmaps[nvmaps].idx = (int)(v - vmms);
        nvmaps++;
    }
    pthread_mutex_unlock(&mu);
    return rc;
}
/* Ends every mapping that starts in [ptr, ptr + size). */
/* Like the driver, the range must cover whole mappings: one that it cuts is refused
 * (CUDA_ERROR_INVALID_VALUE) and nothing is unmapped. */
static CUresult i_cuMemUnmap(CUdeviceptr ptr, size_t size) {
    if (!ptr || size == 0) return INVALID_VALUE;
    pthread_mutex_lock(&mu);
    for (int i = 0; i < nvmaps; i++) {
        u64 va = vmaps[i].va, end = va + vmaps[i].size;
        if (va < ptr + size && end > ptr && (va < ptr || end > ptr + size)) {
            pthread_mutex_unlock(&mu);
            return INVALID_VALUE;
        }
    }
    int found = 0;
    for (int i = 0; i < nvmaps;) {
        if (vmaps[i].va >= ptr && vmaps[i].va < ptr + size) {
            mmap((void *)(uintptr_t)vmaps[i].va, vmaps[i].size, PROT_NONE,
                 MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE | MAP_FIXED, -1, 0);
            struct vmm *v = &vmms[vmaps[i].idx];
            v->maps--;
            vmm_free_if_done(v);
            vmaps[i] = vmaps[--nvmaps];
            found = 1;
        } else {
            i++;
        }
    }
    pthread_mutex_unlock(&mu);
    const char *delay = getenv("FAKE_CUDA_UNMAP_DELAY_MS");
    if (found && delay) slow_call(delay, 0); /* freed, not yet returned */
    return found ? OK : INVALID_VALUE;
}
/* CUmemAccessDesc: {location {type, id}, flags}. */
static CUresult i_cuMemSetAccess(CUdeviceptr ptr, size_t size, const int *desc, size_t count) {
    if (!ptr || size == 0 || !desc || count == 0) return INVALID_VALUE;
    for (size_t i = 0; i < count; i++)
        if (desc[3 * i] != 1 || desc[3 * i + 1] < 0 || desc[3 * i + 1] >= ndev) return INVALID_DEVICE;
    return OK;
}

/* arrays */
struct desc2 { size_t w, h; int fmt; unsigned ch; };
struct desc3 { size_t w, h, d; int fmt; unsigned ch, flags; };
struct array { int magic; int dev; u64 size; };
#define ARRAY_MAGIC 0x41525259
static u64 fmt_bytes(int f) {
    switch (f) {
    case 0x01: case 0x08: return 1;
    case 0x02: case 0x09: case 0x10: return 2;
    case 0x03: case 0x0a: case 0x20: return 4;
    default: return 0;
    }
}
static CUresult make_array(struct array **out, size_t w, size_t h, size_t d, int fmt, unsigned ch) {
    int dev = cur_dev();
    if (dev < 0) return INVALID_CONTEXT;
    u64 eb = fmt_bytes(fmt);
    if (!out || w == 0 || eb == 0 || (ch != 1 && ch != 2 && ch != 4)) return INVALID_VALUE;
    u64 rows = round_up(h ? h : 1, 16), depth = d ? d : 1;
    u64 size = round_up(round_up(w * eb * ch, 256) * rows * depth, 65536) + 65536;
    pthread_mutex_lock(&mu);
    CUresult rc = take(dev, size);
    if (rc == OK) {
        struct array *a = malloc(sizeof *a);
        *a = (struct array){ARRAY_MAGIC, dev, size};
        *out = a;
        track((u64)(uintptr_t)a, size, size, dev, K_ARRAY, NULL);
    }
    pthread_mutex_unlock(&mu);
    return rc;
}
static CUresult i_cuArrayCreate_v2(struct array **a, const struct desc2 *d) {
    if (!d) return INVALID_VALUE;
    return make_array(a, d->w, d->h, 1, d->fmt, d->ch);
}
static CUresult i_cuArray3DCreate_v2(struct array **a, const struct desc3 *d) {
    if (!d) return INVALID_VALUE;
    return make_array(a, d->w, d->h, d->d, d->fmt, d->ch);
}
static CUresult i_cuArrayDestroy(struct array *arr) {
    struct alloc a;
    pthread_mutex_lock(&mu);
    int found = untrack((u64)(uintptr_t)arr, K_ARRAY, &a);
    if (found) { give(a.dev, a.ledger); arr->magic = 0; free(arr); }
    pthread_mutex_unlock(&mu);
    return found ? OK : INVALID_HANDLE;
}
struct array_req { size_t size, alignment; unsigned reserved[4]; };
static CUresult i_cuArrayGetMemoryRequirements(struct array_req *r, struct array *a, CUdevice d) {
    (void)d;
    if (!r || !a || a->magic != ARRAY_MAGIC) return INVALID_VALUE;
    r->size = a->size; r->alignment = 65536; return OK;
}

/* mipmapped arrays: the sum of the levels' array sizes */
struct mipmap { int magic; int dev; u64 size; };
#define MIPMAP_MAGIC 0x4d495050
static u64 array_size(size_t w, size_t h, size_t d, u64 eb, unsigned ch) {
    u64 rows = round_up(h ? h : 1, 16), depth = d ? d : 1;
    return round_up(round_up(w * eb * ch, 256) * rows * depth, 65536) + 65536;
}
static CUresult i_cuMipmappedArrayCreate(struct mipmap **out, const struct desc3 *d, unsigned levels) {
    int dev = cur_dev();
    if (dev < 0) return INVALID_CONTEXT;
    if (!out || !d || levels == 0) return INVALID_VALUE;
    u64 eb = fmt_bytes(d->fmt);
    if (eb == 0 || d->w == 0 || (d->ch != 1 && d->ch != 2 && d->ch != 4)) return INVALID_VALUE;
    u64 size = 0;
    size_t w = d->w, h = d->h, dd = d->d;
    for (unsigned l = 0; l < levels; l++) {
        size += array_size(w, h, dd, eb, d->ch);
        w = w > 1 ? w / 2 : 1; h = h > 1 ? h / 2 : h; dd = dd > 1 ? dd / 2 : dd;
    }
    pthread_mutex_lock(&mu);
    CUresult rc = take(dev, size);
    if (rc == OK) {
        struct mipmap *m = malloc(sizeof *m);
        *m = (struct mipmap){MIPMAP_MAGIC, dev, size};
        *out = m;
        track((u64)(uintptr_t)m, size, size, dev, K_MIPMAP, NULL);
    }
    pthread_mutex_unlock(&mu);
    return rc;
}
static CUresult i_cuMipmappedArrayDestroy(struct mipmap *m) {
    struct alloc a;
    pthread_mutex_lock(&mu);
    int found = untrack((u64)(uintptr_t)m, K_MIPMAP, &a);
    if (found) { give(a.dev, a.ledger); m->magic = 0; free(m); }
    pthread_mutex_unlock(&mu);
    return found ? OK : INVALID_HANDLE;
}
static CUresult i_cuMipmappedArrayGetMemoryRequirements(struct array_req *r, struct mipmap *m, CUdevice d) {
    (void)d;
    if (!r || !m || m->magic != MIPMAP_MAGIC) return INVALID_VALUE;
    r->size = m->size; r->alignment = 65536; return OK;
}

/* device attributes and context limits */
#define SMS 108
#define THREADS_PER_SM 2048
static CUresult i_cuDeviceGetAttribute(int *v, int attr, CUdevice d) {
    if (d < 0 || d >= ndev || !v) return INVALID_VALUE;
    switch (attr) {
    case 16: *v = SMS; return OK;
    case 39: *v = THREADS_PER_SM; return OK;
    default: *v = 0; return OK;
    }
}
/* The device memory each limit holds now, per device (stack, FIFO, heap). */
static u64 limit_held[MAXDEV][3];
static CUresult i_cuCtxSetLimit(int limit, size_t value) {
    int dev = cur_dev();
    if (dev < 0) return INVALID_CONTEXT;
    if (limit < 0 || limit > 2) return OK; /* other limits hold no device memory here */
    u64 want = limit == 0 ? (u64)value * SMS * THREADS_PER_SM : (u64)value;
    pthread_mutex_lock(&mu);
    u64 have = limit_held[dev][limit];
    CUresult rc = OK;
    if (want > have) rc = take(dev, want - have);
    else give(dev, have - want);
    if (rc == OK) limit_held[dev][limit] = want;
    pthread_mutex_unlock(&mu);
    return rc;
}

/* Kernel launches: blocks = gridDimX * gridDimY * gridDimZ. Without the simulator a
 * launch is an instant no-op (even without a context), as before it existed. */
static CUresult launch_grid(void *stream, u64 gx, u64 gy, u64 gz) {
    int dev = stream_dev(stream);
    if (dev < 0) return sim_on ? dev_error(dev) : OK;
    if (gx == 0 || gy == 0 || gz == 0) return sim_on ? INVALID_VALUE : OK;
    u64 blocks = gx * gy * gz;
    return enqueue(dev, &blocks, 1);
}
static CUresult i_cuLaunchKernel(void *f, unsigned gx, unsigned gy, unsigned gz, unsigned bx,
                                 unsigned by, unsigned bz, unsigned shmem, void *s, void **p, void **e) {
    (void)f; (void)bx; (void)by; (void)bz; (void)shmem; (void)p; (void)e;
    return launch_grid(s, gx, gy, gz);
}
/* CUlaunchConfig (cuda.h 11.8+; x86-64: dims @0..24, hStream @32, attrs @40, numAttrs @48). */
struct launch_config {
    unsigned gx, gy, gz, bx, by, bz, shmem;
    void *stream;
    void *attrs;
    unsigned nattrs;
};
_Static_assert(sizeof(struct launch_config) == 56, "CUlaunchConfig layout");
static CUresult i_cuLaunchKernelEx(const struct launch_config *c, void *f, void **p, void **e) {
    (void)f; (void)p; (void)e;
    if (!c) return INVALID_VALUE;
    if (c->nattrs && !c->attrs) return INVALID_VALUE;
    return launch_grid(c->stream, c->gx, c->gy, c->gz);
}
static CUresult i_cuLaunchCooperativeKernel(void *f, unsigned gx, unsigned gy, unsigned gz, unsigned bx,
                                            unsigned by, unsigned bz, unsigned shmem, void *s, void **p) {
    (void)f; (void)bx; (void)by; (void)bz; (void)shmem; (void)p;
    return launch_grid(s, gx, gy, gz);
}
/* CUDA_LAUNCH_PARAMS (x86-64: function @0, dims @8..32, hStream @40, kernelParams @48). */
struct launch_params {
    void *func;
    unsigned gx, gy, gz, bx, by, bz, shmem;
    void *stream;
    void **params;
};
_Static_assert(sizeof(struct launch_params) == 56, "CUDA_LAUNCH_PARAMS layout");
static CUresult i_cuLaunchCooperativeKernelMultiDevice(struct launch_params *list, unsigned n, unsigned flags) {
    (void)flags;
    if (!list || n == 0) return INVALID_VALUE;
    for (unsigned i = 0; i < n; i++) {
        int dev = stream_dev(list[i].stream);
        if (dev < 0 && sim_on) return dev_error(dev);
        if (sim_on && (!list[i].gx || !list[i].gy || !list[i].gz)) return INVALID_VALUE;
    }
    for (unsigned i = 0; i < n; i++) {
        CUresult rc = launch_grid(list[i].stream, list[i].gx, list[i].gy, list[i].gz);
        if (rc != OK) return rc;
    }
    return OK;
}

/* graphs: allocation nodes materialize from a per-device graph pool at upload or
 * launch (the graph frees them by its end); the pool keeps what it reserved until
 * cuDeviceGraphMemTrim. Kernel nodes run at launch, in node order, each as a kernel
 * of its own on the launch stream's device. An executable graph is a snapshot. */
#define NODE_KERNEL 0  /* CU_GRAPH_NODE_TYPE_KERNEL */
#define NODE_MEM_ALLOC 10 /* CU_GRAPH_NODE_TYPE_MEM_ALLOC */
struct gnode {
    int magic;
    int type;
    unsigned gx, gy, gz, bx, by, bz, shmem;
    void *func, *kern, *ctx;
};
struct graph { int magic; int dev; u64 bytes; struct gnode **nodes; size_t nnodes, cap; };
struct gexec { int magic; int dev; u64 bytes; u64 *blocks; size_t nkernels; };
#define GRAPH_MAGIC 0x47524150
#define GEXEC_MAGIC 0x47455843
#define GNODE_MAGIC 0x474e4f44
/* CUDA_KERNEL_NODE_PARAMS (v1: 56 bytes) and _v2 (72 bytes: + CUkernel kern, CUcontext ctx). */
struct kparams_v1 { void *func; unsigned gx, gy, gz, bx, by, bz, shmem; void **params; void **extra; };
struct kparams_v2 { void *func; unsigned gx, gy, gz, bx, by, bz, shmem; void **params; void **extra; void *kern; void *ctx; };
_Static_assert(sizeof(struct kparams_v1) == 56, "CUDA_KERNEL_NODE_PARAMS_v1 layout");
_Static_assert(sizeof(struct kparams_v2) == 72, "CUDA_KERNEL_NODE_PARAMS_v2 layout");
static u64 graph_reserved[MAXDEV];
static CUresult i_cuGraphCreate(struct graph **g, unsigned flags) {
    (void)flags;
    if (!g) return INVALID_VALUE;
    *g = calloc(1, sizeof **g);
    (*g)->magic = GRAPH_MAGIC; (*g)->dev = -1;
    return OK;
}
static CUresult i_cuGraphDestroy(struct graph *g) {
    if (!g || g->magic != GRAPH_MAGIC) return INVALID_VALUE;
    for (size_t i = 0; i < g->nnodes; i++) { g->nodes[i]->magic = 0; free(g->nodes[i]); }
    free(g->nodes);
    g->magic = 0; free(g); return OK;
}
static struct gnode *add_node(struct graph *g, int type) {
    if (g->nnodes == g->cap) {
        size_t cap = g->cap ? g->cap * 2 : 16;
        struct gnode **n = realloc(g->nodes, cap * sizeof *n);
        if (!n) return NULL;
        g->nodes = n; g->cap = cap;
    }
    struct gnode *n = calloc(1, sizeof *n);
    if (!n) return NULL;
    n->magic = GNODE_MAGIC; n->type = type;
    g->nodes[g->nnodes++] = n;
    return n;
}
static CUresult i_cuGraphAddMemAllocNode(void **node, struct graph *g, const void *deps, size_t n, unsigned char *params) {
    (void)deps; (void)n;
    if (!node || !g || g->magic != GRAPH_MAGIC || !params) return INVALID_VALUE;
    int ltype, lid; size_t bytes;
    memcpy(&ltype, params + 8, 4); memcpy(&lid, params + 12, 4); memcpy(&bytes, params + 104, 8);
    if (ltype != 1 || lid < 0 || lid >= ndev || bytes == 0) return INVALID_VALUE;
    struct gnode *nd = add_node(g, NODE_MEM_ALLOC);
    if (!nd) return OUT_OF_MEMORY;
    g->dev = lid;
    g->bytes += round_up(bytes, PAGE);
    u64 dptr = 0x7e0000000000ull + g->bytes;
    memcpy(params + 112, &dptr, 8);
    *node = nd;
    return OK;
}
static CUresult add_kernel_node(struct gnode **node, struct graph *g, const struct kparams_v2 *p) {
    if (!node || !g || g->magic != GRAPH_MAGIC) return INVALID_VALUE;
    if (p->gx == 0 || p->gy == 0 || p->gz == 0 || p->bx == 0 || p->by == 0 || p->bz == 0) return INVALID_VALUE;
    struct gnode *nd = add_node(g, NODE_KERNEL);
    if (!nd) return OUT_OF_MEMORY;
    nd->gx = p->gx; nd->gy = p->gy; nd->gz = p->gz;
    nd->bx = p->bx; nd->by = p->by; nd->bz = p->bz; nd->shmem = p->shmem;
    nd->func = p->func; nd->kern = p->kern; nd->ctx = p->ctx;
    *node = nd;
    return OK;
}
static CUresult i_cuGraphAddKernelNode(struct gnode **node, struct graph *g, const void *deps, size_t n,
                                       const struct kparams_v1 *p) {
    (void)deps; (void)n;
    if (!p) return INVALID_VALUE;
    struct kparams_v2 v2 = {p->func, p->gx, p->gy, p->gz, p->bx, p->by, p->bz, p->shmem, p->params, p->extra, NULL, NULL};
    return add_kernel_node(node, g, &v2);
}
static CUresult i_cuGraphAddKernelNode_v2(struct gnode **node, struct graph *g, const void *deps, size_t n,
                                          const struct kparams_v2 *p) {
    (void)deps; (void)n;
    if (!p) return INVALID_VALUE;
    return add_kernel_node(node, g, p);
}
static CUresult i_cuGraphGetNodes(struct graph *g, struct gnode **nodes, size_t *num) {
    if (!g || g->magic != GRAPH_MAGIC || !num) return INVALID_VALUE;
    if (!nodes) { *num = g->nnodes; return OK; }
    size_t i = 0;
    for (; i < *num && i < g->nnodes; i++) nodes[i] = g->nodes[i];
    for (size_t k = i; k < *num; k++) nodes[k] = NULL;
    *num = i;
    return OK;
}
static CUresult i_cuGraphNodeGetType(struct gnode *n, int *type) {
    if (!n || n->magic != GNODE_MAGIC || !type) return INVALID_VALUE;
    *type = n->type;
    return OK;
}
static CUresult i_cuGraphKernelNodeGetParams_v2(struct gnode *n, struct kparams_v2 *p) {
    if (!n || n->magic != GNODE_MAGIC || n->type != NODE_KERNEL || !p) return INVALID_VALUE;
    *p = (struct kparams_v2){n->func, n->gx, n->gy, n->gz, n->bx, n->by, n->bz, n->shmem, NULL, NULL, n->kern, n->ctx};
    return OK;
}
static CUresult i_cuGraphKernelNodeGetParams(struct gnode *n, struct kparams_v1 *p) {
    if (!n || n->magic != GNODE_MAGIC || n->type != NODE_KERNEL || !p) return INVALID_VALUE;
    *p = (struct kparams_v1){n->func, n->gx, n->gy, n->gz, n->bx, n->by, n->bz, n->shmem, NULL, NULL};
    return OK;
}
static CUresult i_cuGraphInstantiateWithFlags(struct gexec **e, struct graph *g, u64 flags) {
    (void)flags;
    if (!e || !g || g->magic != GRAPH_MAGIC) return INVALID_VALUE;
    struct gexec *x = calloc(1, sizeof *x);
    if (!x) return OUT_OF_MEMORY;
    x->magic = GEXEC_MAGIC; x->dev = g->dev; x->bytes = g->bytes;
    x->blocks = calloc(g->nnodes ? g->nnodes : 1, sizeof *x->blocks);
    if (!x->blocks) { free(x); return OUT_OF_MEMORY; }
    for (size_t i = 0; i < g->nnodes; i++)
        if (g->nodes[i]->type == NODE_KERNEL)
            x->blocks[x->nkernels++] = (u64)g->nodes[i]->gx * g->nodes[i]->gy * g->nodes[i]->gz;
    *e = x;
    return OK;
}
static CUresult i_cuGraphExecDestroy(struct gexec *e) {
    if (!e || e->magic != GEXEC_MAGIC) return INVALID_VALUE;
    e->magic = 0; free(e->blocks); free(e); return OK;
}
/* The graph's memory, reserved from the device's graph pool at upload or launch. */
static CUresult graph_memory(struct gexec *e) {
    if (e->dev < 0) return OK;
    CUresult rc = OK;
    pthread_mutex_lock(&mu);
    if (graph_reserved[e->dev] < e->bytes) {
        rc = take(e->dev, e->bytes - graph_reserved[e->dev]);
        if (rc == OK) graph_reserved[e->dev] = e->bytes;
    }
    pthread_mutex_unlock(&mu);
    return rc;
}
static CUresult i_cuGraphUpload(struct gexec *e, void *stream) {
    (void)stream;
    if (cur_dev() < 0) return INVALID_CONTEXT;
    if (!e || e->magic != GEXEC_MAGIC) return INVALID_VALUE;
    return graph_memory(e);
}
static CUresult i_cuGraphLaunch(struct gexec *e, void *stream) {
    if (cur_dev() < 0) return INVALID_CONTEXT;
    if (!e || e->magic != GEXEC_MAGIC) return INVALID_VALUE;
    CUresult rc = graph_memory(e);
    if (rc != OK || e->nkernels == 0) return rc;
    int dev = stream_dev(stream);
    if (dev < 0) return dev_error(dev);
    return enqueue(dev, e->blocks, e->nkernels);
}
static CUresult i_cuGraphLaunch_ptsz(struct gexec *e, void *stream) { return i_cuGraphLaunch(e, stream); }
static CUresult i_cuGraphUpload_ptsz(struct gexec *e, void *stream) { return i_cuGraphUpload(e, stream); }
static CUresult i_cuDeviceGraphMemTrim(CUdevice d) {
    if (d < 0 || d >= ndev) return INVALID_DEVICE;
    pthread_mutex_lock(&mu);
    give(d, graph_reserved[d]);
    graph_reserved[d] = 0;
    pthread_mutex_unlock(&mu);
    return OK;
}
static CUresult i_cuDeviceGetGraphMemAttribute(CUdevice d, int attr, void *v) {
    if (d < 0 || d >= ndev || !v) return INVALID_VALUE;
    u64 *o = v;
    switch (attr) {
    case 0: case 1: *o = 0; return OK;
    case 2: case 3: *o = graph_reserved[d]; return OK;
    default: return INVALID_VALUE;
    }
}

static CUresult i_cuGetErrorName(CUresult e, const char **s) {
    switch (e) {
    case OK: *s = "CUDA_SUCCESS"; return OK;
    case OUT_OF_MEMORY: *s = "CUDA_ERROR_OUT_OF_MEMORY"; return OK;
    case INVALID_VALUE: *s = "CUDA_ERROR_INVALID_VALUE"; return OK;
    default: *s = "CUDA_ERROR_UNKNOWN"; return OK;
    }
}

/* Per-thread variants: distinct internal entry points. */
static CUresult i_cuMemAllocAsync_ptsz(CUdeviceptr *d, size_t s, void *st) { return i_cuMemAllocAsync(d, s, st); }
static CUresult i_cuMemAllocFromPoolAsync_ptsz(CUdeviceptr *d, size_t s, struct pool *p, void *st) { return i_cuMemAllocFromPoolAsync(d, s, p, st); }
static CUresult i_cuMemFreeAsync_ptsz(CUdeviceptr d, void *st) { return i_cuMemFreeAsync(d, st); }
static CUresult i_cuLaunchKernel_ptsz(void *f, unsigned gx, unsigned gy, unsigned gz, unsigned bx,
                                      unsigned by, unsigned bz, unsigned shmem, void *s, void **p, void **e) {
    return i_cuLaunchKernel(f, gx, gy, gz, bx, by, bz, shmem, s, p, e);
}
static CUresult i_cuLaunchKernelEx_ptsz(const struct launch_config *c, void *f, void **p, void **e) {
    return i_cuLaunchKernelEx(c, f, p, e);
}
static CUresult i_cuLaunchCooperativeKernel_ptsz(void *f, unsigned gx, unsigned gy, unsigned gz, unsigned bx,
                                                 unsigned by, unsigned bz, unsigned shmem, void *s, void **p) {
    return i_cuLaunchCooperativeKernel(f, gx, gy, gz, bx, by, bz, shmem, s, p);
}

static CUresult i_cuGetProcAddress_v2(const char *sym, void **pfn, int ver, u64 flags, int *status);
static CUresult i_cuGetProcAddress(const char *sym, void **pfn, int ver, u64 flags) {
    return i_cuGetProcAddress_v2(sym, pfn, ver, flags, NULL);
}

/* The fake's own variant table, written by hand from cuda.h's PFN typedefs. */
struct entry { const char *base; int ver; const char *name; void *fn; const char *pt_of; };
#define E(b, v, n) {b, v, #n, (void *)i_##n, NULL}
#define P(b, v, n, of) {b, v, #n, (void *)i_##n, #of}
static const struct entry table[] = {
    E("cuInit", 2000, cuInit),
    E("cuDriverGetVersion", 2020, cuDriverGetVersion),
    E("cuDeviceGet", 2000, cuDeviceGet),
    E("cuDeviceGetCount", 2000, cuDeviceGetCount),
    E("cuDeviceGetName", 2000, cuDeviceGetName),
    E("cuDeviceGetUuid", 9020, cuDeviceGetUuid),
    E("cuDeviceGetUuid", 11040, cuDeviceGetUuid_v2),
    E("cuDeviceTotalMem", 3020, cuDeviceTotalMem_v2),
    E("cuDevicePrimaryCtxRetain", 7000, cuDevicePrimaryCtxRetain),
    E("cuDevicePrimaryCtxRelease", 11000, cuDevicePrimaryCtxRelease_v2),
    E("cuDevicePrimaryCtxReset", 11000, cuDevicePrimaryCtxReset_v2),
    E("cuCtxCreate", 3020, cuCtxCreate_v2),
    E("cuCtxCreate", 11040, cuCtxCreate_v3),
    E("cuCtxCreate", 12050, cuCtxCreate_v4),
    E("cuCtxDestroy", 4000, cuCtxDestroy_v2),
    E("cuCtxSetCurrent", 4000, cuCtxSetCurrent),
    E("cuCtxGetCurrent", 4000, cuCtxGetCurrent),
    E("cuCtxGetDevice", 2000, cuCtxGetDevice),
    E("cuCtxGetDevice", 13000, cuCtxGetDevice_v2),
    E("cuCtxSynchronize", 2000, cuCtxSynchronize),
    E("cuCtxSynchronize", 13000, cuCtxSynchronize_v2),
    E("cuStreamSynchronize", 2000, cuStreamSynchronize),
    P("cuStreamSynchronize", 7000, cuStreamSynchronize_ptsz, cuStreamSynchronize),
    E("cuStreamCreate", 2000, cuStreamCreate),
    E("cuStreamGetDevice", 12080, cuStreamGetDevice),
    E("cuStreamGetCtx", 9020, cuStreamGetCtx),
    E("cuStreamDestroy", 4000, cuStreamDestroy_v2),
    E("cuModuleLoadData", 2000, cuModuleLoadData),
    E("cuModuleUnload", 2000, cuModuleUnload),
    E("cuModuleGetFunction", 2000, cuModuleGetFunction),
    E("cuMemAlloc", 2000, cuMemAlloc),
    E("cuMemAlloc", 3020, cuMemAlloc_v2),
    E("cuMemAllocPitch", 3020, cuMemAllocPitch_v2),
    E("cuMemAllocManaged", 6000, cuMemAllocManaged),
    E("cuMemFree", 3020, cuMemFree_v2),
    E("cuMemGetInfo", 3020, cuMemGetInfo_v2),
    E("cuMemsetD8", 3020, cuMemsetD8_v2),
    E("cuMemsetD8Async", 3020, cuMemsetD8Async),
    P("cuMemsetD8Async", 7000, cuMemsetD8Async_ptsz, cuMemsetD8Async),
    E("cuMemcpyHtoD", 3020, cuMemcpyHtoD_v2),
    E("cuMemcpyDtoH", 3020, cuMemcpyDtoH_v2),
    E("cuMemAllocAsync", 11020, cuMemAllocAsync),
    P("cuMemAllocAsync", 11020, cuMemAllocAsync_ptsz, cuMemAllocAsync),
    E("cuMemAllocFromPoolAsync", 11020, cuMemAllocFromPoolAsync),
    P("cuMemAllocFromPoolAsync", 11020, cuMemAllocFromPoolAsync_ptsz, cuMemAllocFromPoolAsync),
    E("cuMemFreeAsync", 11020, cuMemFreeAsync),
    P("cuMemFreeAsync", 11020, cuMemFreeAsync_ptsz, cuMemFreeAsync),
    E("cuDeviceGetDefaultMemPool", 11020, cuDeviceGetDefaultMemPool),
    E("cuDeviceGetMemPool", 11020, cuDeviceGetMemPool),
    E("cuDeviceSetMemPool", 11020, cuDeviceSetMemPool),
    E("cuMemPoolCreate", 11020, cuMemPoolCreate),
    E("cuMemPoolDestroy", 11020, cuMemPoolDestroy),
    E("cuMemPoolTrimTo", 11020, cuMemPoolTrimTo),
    E("cuMemPoolSetAttribute", 11020, cuMemPoolSetAttribute),
    E("cuMemPoolGetAttribute", 11020, cuMemPoolGetAttribute),
    E("cuMemGetAllocationGranularity", 10020, cuMemGetAllocationGranularity),
    E("cuMemCreate", 10020, cuMemCreate),
    E("cuMemRelease", 10020, cuMemRelease),
    E("cuMemRetainAllocationHandle", 11000, cuMemRetainAllocationHandle),
    E("cuMemAddressReserve", 10020, cuMemAddressReserve),
    E("cuMemAddressFree", 10020, cuMemAddressFree),
    E("cuMemMap", 10020, cuMemMap),
    E("cuMemUnmap", 10020, cuMemUnmap),
    E("cuMemSetAccess", 10020, cuMemSetAccess),
    E("cuArrayCreate", 3020, cuArrayCreate_v2),
    E("cuArray3DCreate", 3020, cuArray3DCreate_v2),
    E("cuArrayDestroy", 2000, cuArrayDestroy),
    E("cuArrayGetMemoryRequirements", 11060, cuArrayGetMemoryRequirements),
    E("cuMipmappedArrayCreate", 5000, cuMipmappedArrayCreate),
    E("cuMipmappedArrayDestroy", 5000, cuMipmappedArrayDestroy),
    E("cuMipmappedArrayGetMemoryRequirements", 11060, cuMipmappedArrayGetMemoryRequirements),
    E("cuDeviceGetAttribute", 2000, cuDeviceGetAttribute),
    E("cuCtxSetLimit", 3010, cuCtxSetLimit),
    E("cuGraphCreate", 10000, cuGraphCreate),
    E("cuGraphDestroy", 10000, cuGraphDestroy),
    E("cuGraphAddMemAllocNode", 11040, cuGraphAddMemAllocNode),
    E("cuGraphAddKernelNode", 10000, cuGraphAddKernelNode),
    E("cuGraphAddKernelNode", 12000, cuGraphAddKernelNode_v2),
    E("cuGraphKernelNodeGetParams", 10000, cuGraphKernelNodeGetParams),
    E("cuGraphKernelNodeGetParams", 12000, cuGraphKernelNodeGetParams_v2),
    E("cuGraphGetNodes", 10000, cuGraphGetNodes),
    E("cuGraphNodeGetType", 10000, cuGraphNodeGetType),
    E("cuGraphInstantiateWithFlags", 11040, cuGraphInstantiateWithFlags),
    E("cuGraphExecDestroy", 10000, cuGraphExecDestroy),
    E("cuGraphLaunch", 10000, cuGraphLaunch),
    P("cuGraphLaunch", 10000, cuGraphLaunch_ptsz, cuGraphLaunch),
    E("cuGraphUpload", 11010, cuGraphUpload),
    P("cuGraphUpload", 11010, cuGraphUpload_ptsz, cuGraphUpload),
    E("cuDeviceGraphMemTrim", 11040, cuDeviceGraphMemTrim),
    E("cuDeviceGetGraphMemAttribute", 11040, cuDeviceGetGraphMemAttribute),
    E("cuLaunchKernel", 4000, cuLaunchKernel),
    P("cuLaunchKernel", 7000, cuLaunchKernel_ptsz, cuLaunchKernel),
    E("cuLaunchKernelEx", 11060, cuLaunchKernelEx),
    P("cuLaunchKernelEx", 11060, cuLaunchKernelEx_ptsz, cuLaunchKernelEx),
    E("cuLaunchCooperativeKernel", 9000, cuLaunchCooperativeKernel),
    P("cuLaunchCooperativeKernel", 9000, cuLaunchCooperativeKernel_ptsz, cuLaunchCooperativeKernel),
    E("cuLaunchCooperativeKernelMultiDevice", 9000, cuLaunchCooperativeKernelMultiDevice),
    E("cuGetErrorName", 6000, cuGetErrorName),
    E("cuGetProcAddress", 11030, cuGetProcAddress),
    E("cuGetProcAddress", 12000, cuGetProcAddress_v2),
};
#define NTABLE (sizeof table / sizeof table[0])

static CUresult i_cuGetProcAddress_v2(const char *sym, void **pfn, int ver, u64 flags, int *status) {
    if (!sym || !pfn) return INVALID_VALUE;
    *pfn = NULL;
    if (ver > driver_version) { if (status) *status = 2; return INVALID_VALUE; }
    const struct entry *plain = NULL;
    int known = 0;
    for (size_t i = 0; i < NTABLE; i++) {
        if (strcmp(table[i].base, sym) != 0) continue;
        known = 1;
        if (!table[i].pt_of && table[i].ver <= ver && (!plain || plain->ver < table[i].ver)) plain = &table[i];
    }
    if (!plain) { if (status) *status = known ? 2 : 1; return NOT_FOUND; }
    const struct entry *pick = plain;
    if ((flags & 2) && !(flags & 1))
        for (size_t i = 0; i < NTABLE; i++)
            if (table[i].pt_of && strcmp(table[i].pt_of, plain->name) == 0 && table[i].ver <= ver) pick = &table[i];
    *pfn = pick->fn;
    if (status) *status = 0;
    return OK;
}

/* Test hook: the variant name of an internal pointer (NULL if not the fake's). */
const char *fakecuda_symbol_of(const void *p) {
    for (size_t i = 0; i < NTABLE; i++)
        if (table[i].fn == p) return table[i].name;
    return NULL;
}
/* Test hook: the fake's own answer to a lookup, bypassing every interposer. */
void *fakecuda_lookup(const char *sym, int ver, u64 flags) {
    void *p = NULL;
    i_cuGetProcAddress_v2(sym, &p, ver, flags, NULL);
    return p;
}

/* ---- exported wrappers ---- */
#define X(ret, name, params, args) ret name params { return i_##name args; }
X(CUresult, cuInit, (unsigned f), (f))
X(CUresult, cuDriverGetVersion, (int *v), (v))
X(CUresult, cuDeviceGet, (CUdevice *d, int o), (d, o))
X(CUresult, cuDeviceGetCount, (int *n), (n))
X(CUresult, cuDeviceGetName, (char *n, int l, CUdevice d), (n, l, d))
X(CUresult, cuDeviceGetUuid, (unsigned char *u, CUdevice d), (u, d))
X(CUresult, cuDeviceGetUuid_v2, (unsigned char *u, CUdevice d), (u, d))
X(CUresult, cuDeviceTotalMem_v2, (size_t *b, CUdevice d), (b, d))
X(CUresult, cuDevicePrimaryCtxRetain, (struct ctx **c, CUdevice d), (c, d))
X(CUresult, cuDevicePrimaryCtxRelease_v2, (CUdevice d), (d))
X(CUresult, cuDevicePrimaryCtxReset_v2, (CUdevice d), (d))
X(CUresult, cuCtxCreate_v2, (struct ctx **c, unsigned f, CUdevice d), (c, f, d))
X(CUresult, cuCtxCreate_v3, (struct ctx **c, void *a, int n, unsigned f, CUdevice d), (c, a, n, f, d))
X(CUresult, cuCtxCreate_v4, (struct ctx **c, void *p, unsigned f, CUdevice d), (c, p, f, d))
X(CUresult, cuCtxDestroy_v2, (struct ctx *c), (c))
X(CUresult, cuCtxSetCurrent, (struct ctx *c), (c))
X(CUresult, cuCtxGetCurrent, (struct ctx **c), (c))
X(CUresult, cuCtxGetDevice, (CUdevice *d), (d))
X(CUresult, cuCtxSynchronize, (void), ())
X(CUresult, cuCtxGetDevice_v2, (CUdevice *d, struct ctx *c), (d, c))
X(CUresult, cuCtxSynchronize_v2, (struct ctx *c), (c))
X(CUresult, cuStreamSynchronize, (void *s), (s))
X(CUresult, cuStreamSynchronize_ptsz, (void *s), (s))
X(CUresult, cuStreamCreate, (struct stream **s, unsigned f), (s, f))
X(CUresult, cuStreamGetDevice, (void *s, CUdevice *d), (s, d))
X(CUresult, cuStreamGetCtx, (void *s, struct ctx **c), (s, c))
X(CUresult, cuStreamDestroy_v2, (struct stream *s), (s))
X(CUresult, cuModuleLoadData, (struct module **m, const void *i), (m, i))
X(CUresult, cuModuleUnload, (struct module *m), (m))
X(CUresult, cuModuleGetFunction, (struct func **f, struct module *m, const char *n), (f, m, n))
X(CUresult, cuMemAlloc, (unsigned *d, unsigned s), (d, s))
X(CUresult, cuMemAlloc_v2, (CUdeviceptr *d, size_t s), (d, s))
X(CUresult, cuMemAllocPitch_v2, (CUdeviceptr *d, size_t *p, size_t w, size_t h, unsigned e), (d, p, w, h, e))
X(CUresult, cuMemAllocManaged, (CUdeviceptr *d, size_t s, unsigned f), (d, s, f))
X(CUresult, cuMemFree_v2, (CUdeviceptr p), (p))
X(CUresult, cuMemGetInfo_v2, (size_t *f, size_t *t), (f, t))
X(CUresult, cuMemsetD8_v2, (CUdeviceptr p, unsigned char v, size_t n), (p, v, n))
X(CUresult, cuMemsetD8Async, (CUdeviceptr p, unsigned char v, size_t n, void *s), (p, v, n, s))
X(CUresult, cuMemsetD8Async_ptsz, (CUdeviceptr p, unsigned char v, size_t n, void *s), (p, v, n, s))
X(CUresult, cuMemcpyHtoD_v2, (CUdeviceptr d, const void *s, size_t n), (d, s, n))
X(CUresult, cuMemcpyDtoH_v2, (void *d, CUdeviceptr s, size_t n), (d, s, n))
X(CUresult, cuMemAllocAsync, (CUdeviceptr *d, size_t s, void *st), (d, s, st))
X(CUresult, cuMemAllocAsync_ptsz, (CUdeviceptr *d, size_t s, void *st), (d, s, st))
X(CUresult, cuMemAllocFromPoolAsync, (CUdeviceptr *d, size_t s, struct pool *p, void *st), (d, s, p, st))
X(CUresult, cuMemAllocFromPoolAsync_ptsz, (CUdeviceptr *d, size_t s, struct pool *p, void *st), (d, s, p, st))
X(CUresult, cuMemFreeAsync, (CUdeviceptr d, void *st), (d, st))
X(CUresult, cuMemFreeAsync_ptsz, (CUdeviceptr d, void *st), (d, st))
X(CUresult, cuDeviceGetDefaultMemPool, (struct pool **p, CUdevice d), (p, d))
X(CUresult, cuDeviceGetMemPool, (struct pool **p, CUdevice d), (p, d))
X(CUresult, cuDeviceSetMemPool, (CUdevice d, struct pool *p), (d, p))
X(CUresult, cuMemPoolCreate, (struct pool **p, const struct pool_props *pp), (p, pp))
X(CUresult, cuMemPoolDestroy, (struct pool *p), (p))
X(CUresult, cuMemPoolTrimTo, (struct pool *p, size_t k), (p, k))
X(CUresult, cuMemPoolSetAttribute, (struct pool *p, int a, void *v), (p, a, v))
X(CUresult, cuMemPoolGetAttribute, (struct pool *p, int a, void *v), (p, a, v))
X(CUresult, cuMemGetAllocationGranularity, (size_t *g, const struct prop *p, int o), (g, p, o))
X(CUresult, cuMemCreate, (u64 *h, size_t s, const struct prop *p, unsigned long long f), (h, s, p, f))
X(CUresult, cuMemRelease, (u64 h), (h))
X(CUresult, cuMemRetainAllocationHandle, (u64 *h, void *a), (h, a))
X(CUresult, cuMemAddressReserve, (CUdeviceptr *p, size_t s, size_t a, CUdeviceptr ad, unsigned long long f), (p, s, a, ad, f))
X(CUresult, cuMemAddressFree, (CUdeviceptr p, size_t s), (p, s))
X(CUresult, cuMemMap, (CUdeviceptr p, size_t s, size_t o, u64 h, unsigned long long f), (p, s, o, h, f))
X(CUresult, cuMemUnmap, (CUdeviceptr p, size_t s), (p, s))
X(CUresult, cuMemSetAccess, (CUdeviceptr p, size_t s, const int *d, size_t c), (p, s, d, c))
X(CUresult, cuArrayCreate_v2, (struct array **a, const struct desc2 *d), (a, d))
X(CUresult, cuArray3DCreate_v2, (struct array **a, const struct desc3 *d), (a, d))
X(CUresult, cuArrayDestroy, (struct array *a), (a))
X(CUresult, cuArrayGetMemoryRequirements, (struct array_req *r, struct array *a, CUdevice d), (r, a, d))
X(CUresult, cuMipmappedArrayCreate, (struct mipmap **m, const struct desc3 *d, unsigned l), (m, d, l))
X(CUresult, cuMipmappedArrayDestroy, (struct mipmap *m), (m))
X(CUresult, cuMipmappedArrayGetMemoryRequirements, (struct array_req *r, struct mipmap *m, CUdevice d), (r, m, d))
X(CUresult, cuDeviceGetAttribute, (int *v, int a, CUdevice d), (v, a, d))
X(CUresult, cuCtxSetLimit, (int l, size_t v), (l, v))
X(CUresult, cuGraphCreate, (struct graph **g, unsigned f), (g, f))
X(CUresult, cuGraphDestroy, (struct graph *g), (g))
X(CUresult, cuGraphAddMemAllocNode, (void **n, struct graph *g, const void *d, size_t c, unsigned char *p), (n, g, d, c, p))
X(CUresult, cuGraphAddKernelNode, (struct gnode **n, struct graph *g, const void *d, size_t c, const struct kparams_v1 *p), (n, g, d, c, p))
X(CUresult, cuGraphAddKernelNode_v2, (struct gnode **n, struct graph *g, const void *d, size_t c, const struct kparams_v2 *p), (n, g, d, c, p))
X(CUresult, cuGraphKernelNodeGetParams, (struct gnode *n, struct kparams_v1 *p), (n, p))
X(CUresult, cuGraphKernelNodeGetParams_v2, (struct gnode *n, struct kparams_v2 *p), (n, p))
X(CUresult, cuGraphGetNodes, (struct graph *g, struct gnode **n, size_t *c), (g, n, c))
X(CUresult, cuGraphNodeGetType, (struct gnode *n, int *t), (n, t))
X(CUresult, cuGraphInstantiateWithFlags, (struct gexec **e, struct graph *g, u64 f), (e, g, f))
X(CUresult, cuGraphExecDestroy, (struct gexec *e), (e))
X(CUresult, cuGraphLaunch, (struct gexec *e, void *s), (e, s))
X(CUresult, cuGraphLaunch_ptsz, (struct gexec *e, void *s), (e, s))
X(CUresult, cuGraphUpload, (struct gexec *e, void *s), (e, s))
X(CUresult, cuGraphUpload_ptsz, (struct gexec *e, void *s), (e, s))
X(CUresult, cuDeviceGraphMemTrim, (CUdevice d), (d))
X(CUresult, cuDeviceGetGraphMemAttribute, (CUdevice d, int a, void *v), (d, a, v))
X(CUresult, cuLaunchKernel, (void *f, unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by, unsigned bz, unsigned sh, void *s, void **p, void **e), (f, gx, gy, gz, bx, by, bz, sh, s, p, e))
X(CUresult, cuLaunchKernel_ptsz, (void *f, unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by, unsigned bz, unsigned sh, void *s, void **p, void **e), (f, gx, gy, gz, bx, by, bz, sh, s, p, e))
X(CUresult, cuLaunchKernelEx, (const struct launch_config *c, void *f, void **p, void **e), (c, f, p, e))
X(CUresult, cuLaunchKernelEx_ptsz, (const struct launch_config *c, void *f, void **p, void **e), (c, f, p, e))
X(CUresult, cuLaunchCooperativeKernel, (void *f, unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by, unsigned bz, unsigned sh, void *s, void **p), (f, gx, gy, gz, bx, by, bz, sh, s, p))
X(CUresult, cuLaunchCooperativeKernel_ptsz, (void *f, unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by, unsigned bz, unsigned sh, void *s, void **p), (f, gx, gy, gz, bx, by, bz, sh, s, p))
X(CUresult, cuLaunchCooperativeKernelMultiDevice, (struct launch_params *l, unsigned n, unsigned f), (l, n, f))
X(CUresult, cuGetErrorName, (CUresult e, const char **s), (e, s))
X(CUresult, cuGetProcAddress, (const char *s, void **p, int v, u64 f), (s, p, v, f))
X(CUresult, cuGetProcAddress_v2, (const char *s, void **p, int v, u64 f, int *st), (s, p, v, f, st))
