/*
 * fake_cuda.c: a fake `libcuda.so.1` backed by host memory, for the interception
 * library's tests. Built by the test harness (tests/support/mod.rs):
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
 *     release down to their threshold at synchronisation; VMM sizes must be
 *     multiples of the 2 MiB granularity.
 *
 * Configuration (environment; this is the fake's own wiring, not a tenant knob):
 *   FAKE_CUDA_DEVICES  "GPU-<uuid>:<bytes>,..." (default one 80 GiB GPU)
 *   FAKE_CUDA_LEDGER   path of the ledger file (created by the harness, >= 64 KiB)
 *   FAKE_CUDA_DRIVER_VERSION  default 13050
 *   FAKE_CUDA_ALLOC_DELAY_MS  sleep inside cuMemAlloc_v2 after taking the memory
 *   FAKE_CUDA_CHECK_SCRUB     1: on free, count whether the memory was all zero
 *   FAKE_CUDA_NO_BACKING      1: linear memory gets addresses but no host pages (for
 *                             benchmarks, so that mmap does not drown the library's cost)
 *   CUDA_VISIBLE_DEVICES      comma-separated indices into FAKE_CUDA_DEVICES
 *
 * The ledger is the independent judge: device memory really held, per device
 * (used, peak across processes) and per process (one 128-byte record per process,
 * owned through an OFD lock on its range, so a reader can tell live records).
 *   offset 0: magic "FAKECUDA"; 64 + 64*dev: used, peak, scrub_ok, scrub_dirty (u64);
 *   4096 + 128*rec: u64 owner flag, u64 bytes[8] per device.
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
#include <time.h>
#include <unistd.h>

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

static void ledger_open(void) {
    const char *p = getenv("FAKE_CUDA_LEDGER");
    if (!p || ledger) return;
    int fd = open(p, O_RDWR | O_CLOEXEC);
    if (fd < 0) { fprintf(stderr, "fake-cuda: ledger %s: %s\n", p, strerror(errno)); return; }
    void *m = mmap(NULL, 65536, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (m == MAP_FAILED) { close(fd); return; }
    ledger = m;
    for (int r = 0; r < LEDGER_RECS; r++) {
        struct flock fl = {.l_type = F_WRLCK, .l_whence = SEEK_SET,
                           .l_start = LEDGER_REC0 + LEDGER_RECSZ * r, .l_len = LEDGER_RECSZ};
        if (fcntl(fd, F_OFD_SETLK, &fl) == 0) {
            ledger_rec = r;
            volatile u64 *rec = &ledger[(LEDGER_REC0 + LEDGER_RECSZ * r) / 8];
            for (int i = 0; i < 1 + MAXDEV; i++) rec[i] = 0;
            rec[0] = 1;
            break;
        }
    }
    /* fd stays open: the record's lock lives as long as the process */
}

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

/* ---- contexts ---- */
struct ctx { int magic; int dev; };
#define CTX_MAGIC 0x43545821
static struct ctx primary[MAXDEV];
static __thread struct ctx *current;

static int cur_dev(void) { return current && current->magic == CTX_MAGIC ? current->dev : -1; }

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
struct pool { int magic; int dev; u64 reserved, used, threshold; };
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
        parse_devices();
        ledger_open();
        for (int i = 0; i < ndev; i++) {
            primary[i] = (struct ctx){CTX_MAGIC, i};
            default_pool[i] = (struct pool){POOL_MAGIC, i, 0, 0, 0};
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
static CUresult i_cuDevicePrimaryCtxRetain(struct ctx **c, CUdevice d) {
    if (!inited) return NOT_INITIALIZED;
    if (d < 0 || d >= ndev) return INVALID_DEVICE;
    *c = &primary[d]; return OK;
}
static CUresult i_cuDevicePrimaryCtxRelease_v2(CUdevice d) { return d < 0 || d >= ndev ? INVALID_DEVICE : OK; }
static CUresult i_cuCtxCreate_v2(struct ctx **c, unsigned flags, CUdevice d) {
    (void)flags;
    if (!inited) return NOT_INITIALIZED;
    if (d < 0 || d >= ndev) return INVALID_DEVICE;
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
    if (current == c) current = NULL;
    if (c < primary || c >= primary + MAXDEV) { c->magic = 0; free(c); }
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
static CUresult i_cuCtxSynchronize(void) { return cur_dev() < 0 ? INVALID_CONTEXT : i_sync_all(); }
static CUresult i_cuCtxSynchronize_v2(struct ctx *c) {
    if (c && c->magic != CTX_MAGIC) return INVALID_CONTEXT;
    return c ? i_sync_all() : i_cuCtxSynchronize();
}
static CUresult i_cuStreamSynchronize(void *s) { (void)s; return i_cuCtxSynchronize(); }

static int no_backing = -1;
static u64 next_fake_addr = 0x7f0000000000ull;
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
        void *p = no_backing ? (void *)(uintptr_t)(next_fake_addr += led) : host_map(size);
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
static void check_scrub(struct alloc *a) {
    const char *c = getenv("FAKE_CUDA_CHECK_SCRUB");
    if (!c || strcmp(c, "1") != 0) return;
    const unsigned char *p = (const unsigned char *)(uintptr_t)a->id;
    int clean = 1;
    for (u64 i = 0; i < a->size; i++) if (p[i]) { clean = 0; break; }
    ledger_scrub(devs[a->dev].phys, clean);
}
static CUresult i_cuMemFree_v2(CUdeviceptr ptr) {
    struct alloc a;
    pthread_mutex_lock(&mu);
    int found = untrack(ptr, K_LINEAR, &a) || untrack(ptr, K_MANAGED, &a);
    if (found) {
        give(a.dev, a.ledger);
        if (no_backing != 1) {
            check_scrub(&a);
            munmap((void *)(uintptr_t)a.id, a.size ? a.size : 1);
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
        ((struct pool *)a.pool)->used -= a.ledger;
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
    pthread_mutex_lock(&mu);
    pool_release(p, 0);
    if (p->reserved) give(p->dev, p->reserved); /* live allocations die with it */
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
static CUresult i_cuMemCreate(u64 *handle, size_t size, const struct prop *p, unsigned long long flags) {
    (void)flags;
    if (!inited) return NOT_INITIALIZED;
    if (!p || !handle || p->loc_type != 1 || p->loc_id < 0 || p->loc_id >= ndev) return INVALID_VALUE;
    if (size == 0 || size % PAGE) return INVALID_VALUE;
    pthread_mutex_lock(&mu);
    CUresult rc = take(p->loc_id, size);
    if (rc == OK) {
        static u64 next = 0x1000;
        *handle = next++;
        track(*handle, size, size, p->loc_id, K_VMM, NULL);
    }
    pthread_mutex_unlock(&mu);
    return rc;
}
static CUresult i_cuMemRelease(u64 handle) {
    struct alloc a;
    pthread_mutex_lock(&mu);
    int found = untrack(handle, K_VMM, &a);
    if (found) give(a.dev, a.ledger);
    pthread_mutex_unlock(&mu);
    return found ? OK : INVALID_VALUE;
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

/* graphs: allocation nodes materialize from a per-device graph pool at upload or
 * launch (the graph frees them by its end); the pool keeps what it reserved until
 * cuDeviceGraphMemTrim. */
struct graph { int magic; int dev; u64 bytes; };
struct gexec { int magic; struct graph *g; };
#define GRAPH_MAGIC 0x47524150
#define GEXEC_MAGIC 0x47455843
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
    g->magic = 0; free(g); return OK;
}
static CUresult i_cuGraphAddMemAllocNode(void **node, struct graph *g, const void *deps, size_t n, unsigned char *params) {
    (void)deps; (void)n;
    if (!node || !g || g->magic != GRAPH_MAGIC || !params) return INVALID_VALUE;
    int ltype, lid; size_t bytes;
    memcpy(&ltype, params + 8, 4); memcpy(&lid, params + 12, 4); memcpy(&bytes, params + 104, 8);
    if (ltype != 1 || lid < 0 || lid >= ndev || bytes == 0) return INVALID_VALUE;
    g->dev = lid;
    g->bytes += round_up(bytes, PAGE);
    u64 dptr = 0x7e0000000000ull + g->bytes;
    memcpy(params + 112, &dptr, 8);
    *node = g;
    return OK;
}
static CUresult i_cuGraphInstantiateWithFlags(struct gexec **e, struct graph *g, u64 flags) {
    (void)flags;
    if (!e || !g || g->magic != GRAPH_MAGIC) return INVALID_VALUE;
    *e = calloc(1, sizeof **e);
    (*e)->magic = GEXEC_MAGIC; (*e)->g = g;
    return OK;
}
static CUresult i_cuGraphExecDestroy(struct gexec *e) {
    if (!e || e->magic != GEXEC_MAGIC) return INVALID_VALUE;
    e->magic = 0; free(e); return OK;
}
static CUresult i_cuGraphLaunch(struct gexec *e, void *stream) {
    (void)stream;
    if (cur_dev() < 0) return INVALID_CONTEXT;
    if (!e || e->magic != GEXEC_MAGIC) return INVALID_VALUE;
    struct graph *g = e->g;
    if (g->dev < 0) return OK;
    CUresult rc = OK;
    pthread_mutex_lock(&mu);
    if (graph_reserved[g->dev] < g->bytes) {
        rc = take(g->dev, g->bytes - graph_reserved[g->dev]);
        if (rc == OK) graph_reserved[g->dev] = g->bytes;
    }
    pthread_mutex_unlock(&mu);
    return rc;
}
static CUresult i_cuGraphUpload(struct gexec *e, void *stream) { return i_cuGraphLaunch(e, stream); }
static CUresult i_cuGraphLaunch_ptsz(struct gexec *e, void *stream) { return i_cuGraphLaunch(e, stream); }
static CUresult i_cuGraphUpload_ptsz(struct gexec *e, void *stream) { return i_cuGraphLaunch(e, stream); }
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

static CUresult i_cuLaunchKernel(void *f, unsigned gx, unsigned gy, unsigned gz, unsigned bx,
                                 unsigned by, unsigned bz, unsigned shmem, void *s, void **p, void **e) {
    (void)f; (void)gx; (void)gy; (void)gz; (void)bx; (void)by; (void)bz; (void)shmem; (void)s; (void)p; (void)e;
    return OK;
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
    E("cuMemAlloc", 2000, cuMemAlloc),
    E("cuMemAlloc", 3020, cuMemAlloc_v2),
    E("cuMemAllocPitch", 3020, cuMemAllocPitch_v2),
    E("cuMemAllocManaged", 6000, cuMemAllocManaged),
    E("cuMemFree", 3020, cuMemFree_v2),
    E("cuMemGetInfo", 3020, cuMemGetInfo_v2),
    E("cuMemsetD8", 3020, cuMemsetD8_v2),
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
X(CUresult, cuMemAlloc, (unsigned *d, unsigned s), (d, s))
X(CUresult, cuMemAlloc_v2, (CUdeviceptr *d, size_t s), (d, s))
X(CUresult, cuMemAllocPitch_v2, (CUdeviceptr *d, size_t *p, size_t w, size_t h, unsigned e), (d, p, w, h, e))
X(CUresult, cuMemAllocManaged, (CUdeviceptr *d, size_t s, unsigned f), (d, s, f))
X(CUresult, cuMemFree_v2, (CUdeviceptr p), (p))
X(CUresult, cuMemGetInfo_v2, (size_t *f, size_t *t), (f, t))
X(CUresult, cuMemsetD8_v2, (CUdeviceptr p, unsigned char v, size_t n), (p, v, n))
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
X(CUresult, cuGetErrorName, (CUresult e, const char **s), (e, s))
X(CUresult, cuGetProcAddress, (const char *s, void **p, int v, u64 f), (s, p, v, f))
X(CUresult, cuGetProcAddress_v2, (const char *s, void **p, int v, u64 f, int *st), (s, p, v, f, st))
