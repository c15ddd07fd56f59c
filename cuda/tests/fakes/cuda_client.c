/*
 * cuda_client.c: a CUDA client for the interception tests, loading the driver the
 * way cuda-bindings and cudart do: dlopen("libcuda.so.1", RTLD_LOCAL), then either
 * every entry point through cuGetProcAddress_v2 (mode "gpa"; "gpa-ptds" passes flag 2
 * as a per-thread-stream client does) or by exact versioned name with dlsym ("dlsym").
 *
 * Usage: cuda_client <mode> <command>...   one result line per command on stdout:
 *   ctx <dev>                  cuInit + primary context of <dev>, made current
 *   ctxcreate <dev> <2|3|4>    cuCtxCreate_v2/_v3/_v4 (made current) -> "ok <id>"
 *   ctxdestroy <id>            cuCtxDestroy_v2
 *   pretain|prelease|preset <dev>   cuDevicePrimaryCtxRetain / Release_v2 / Reset_v2
 *   vreserve <bytes>           cuMemAddressReserve -> "ok <id>" (the address)
 *   vmap <va-id> <vmm-id> <bytes>   cuMemMap at offset 0 + cuMemSetAccess (read-write)
 *   vunmap <va-id> <bytes> / vfree <va-id> <bytes>   cuMemUnmap / cuMemAddressFree
 *   bgunmap <va-id> <bytes> <ms>|during   cuMemUnmap from another thread after <ms>, or
 *                              "during" the next slow call of the fake driver (a delay
 *                              knob of fake_cuda.c: the unmap lands inside that call)
 *   vretain <va-id>            cuMemRetainAllocationHandle of the address -> "ok <id>"
 *   pooldestroy                cuMemPoolDestroy of the pool "pool" created
 *   dalloc <bytes>             cuMemAlloc through the fake's own entry point, past any
 *                              interposer (memory the library never saw allocated)
 *   alloc <bytes>              cuMemAlloc            -> "ok <id>" | "err <code>"
 *   pitch <w> <h>              cuMemAllocPitch (elem 4) -> "ok <id> <pitch>"
 *   managed <bytes>            cuMemAllocManaged (global)
 *   async <bytes>              cuMemAllocAsync on the null stream
 *   pool <bytes>               cuMemAllocFromPoolAsync from a pool created on first use
 *   vmm <bytes>                cuMemCreate on the current device
 *   array <w> <h> / array3d <w> <h> <d>   float4 arrays
 *   mipmap <w> <h> <levels> / mipfree <id>   float4 mipmapped 2D arrays
 *   limit <CUlimit> <value>    cuCtxSetLimit
 *   graph <bytes>              a graph with one allocation node, instantiated -> "ok <id>"
 *   glaunch <id> / gupload <id> / gtrim   launch or upload it; cuDeviceGraphMemTrim
 *   free <id> / freeasync <id> / release <id> / destroy <id>
 *   fill <id> <bytes>          writes 0xAB into the allocation (cuMemsetD8)
 *   sync / trim <pool-keep>
 *   meminfo                    cuMemGetInfo  -> "ok <free> <total>"
 *   total <dev>                cuDeviceTotalMem -> "ok <bytes>"
 *   sleep <ms> / hold          (hold: print "holding" and sleep until killed)
 *   waitfile <path>            wait until <path> exists (at most 60 s; the test's go-ahead)
 *   waitslow                   wait until a slow call of the fake driver is under way
 *                              (at most 60 s; one a background call makes)
 *   bgwait                     wait until every background call has returned
 *   random <seconds> <max>     random alloc/free of up to <max> bytes; -> "ok <allocs> <refusals>"
 *   bench-pair|bench-launch|bench-meminfo <n>   timing loops -> "ok <wall ns/op> <cpu ns/op>"
 *   bench-direct-pair|-launch|-meminfo <n>     the same through the fake's own entry points
 *                              (fakecuda_lookup), past any interposer: the in-process baseline
 *   spawn <n> <program>        posix_spawn <program> and wait, n times, timed the same way
 *   writefile <file> <line>|-  rewrite <file> in place with <line>, or empty (the bench
 *                              toggles the sandbox's preload line through its host file)
 *   lookup <file.tsv>          every row: "<symbol>\t<ver>\t<flags>\t<answer>\t<fake's own>"
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <pthread.h>
#include <spawn.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <sys/wait.h>
#include <unistd.h>

extern char **environ;

typedef int CUresult;
typedef unsigned long long u64;
typedef CUresult (*gpa2_t)(const char *, void **, int, u64, int *);

static void *lib;
static gpa2_t gpa;
static const char *mode = "gpa";
static u64 flags;

static void *get(const char *base, int ver, const char *exact) {
    void *p = NULL;
    if (strcmp(mode, "dlsym") == 0) p = dlsym(lib, exact);
    else gpa(base, &p, ver, flags, NULL);
    if (!p) { fprintf(stderr, "client: no %s\n", exact); exit(3); }
    return p;
}
#define FN(var, type, base, ver, exact) __typeof__(type) var = (__typeof__(type))get(base, ver, exact)

/* The fake driver's ordering hooks (fake_cuda.c: its slow calls under way, and the
 * background calls it waits for), or counters of our own when the driver has none. */
static int own_slow, own_pending;
static int *slow_calls = &own_slow, *bg_pending = &own_pending;
static int load(int *p) { return __atomic_load_n(p, __ATOMIC_SEQ_CST); }
/* Polls `*p` (every ms, at most 60 s) until it is (want_zero ? 0 : > 0). */
static int wait_count(int *p, int want_zero) {
    for (int i = 0; i < 60000; i++) {
        if (want_zero ? load(p) == 0 : load(p) > 0) return 0;
        usleep(1000);
    }
    return 1;
}
/* A background call's start: after <ms>, or once a slow call is under way ("during"). */
static void bg_start(unsigned ms, int during) {
    usleep(ms * 1000);
    if (during) wait_count(slow_calls, 0);
}
/* <ms> or "during" as a background command's delay argument. */
static unsigned bg_delay(const char *arg, int *during) {
    *during = !strcmp(arg, "during");
    return *during ? 0 : (unsigned)strtoul(arg, NULL, 0);
}

/* A free made from another thread (the "bgfree" command). */
struct bgfree { CUresult (*free)(u64); u64 ptr; unsigned ms; int during; };
static void *bgfree_run(void *arg) {
    struct bgfree *b = arg;
    bg_start(b->ms, b->during);
    b->free(b->ptr);
    __atomic_sub_fetch(bg_pending, 1, __ATOMIC_SEQ_CST);
    return NULL;
}

/* An unmap made from another thread (the "bgunmap" command). */
struct bgunmap { CUresult (*unmap)(u64, size_t); u64 va; size_t size; unsigned ms; int during; };
static void *bgunmap_run(void *arg) {
    struct bgunmap *b = arg;
    bg_start(b->ms, b->during);
    b->unmap(b->va, b->size);
    __atomic_sub_fetch(bg_pending, 1, __ATOMIC_SEQ_CST);
    return NULL;
}

/* Threads allocating and freeing stream-ordered memory at once (the "asyncstorm"
 * command): each makes <iters> rounds of cuMemAllocAsync + cuMemFreeAsync of 2 MiB
 * and a trim of the device's pool to nothing (so that allocations grow it again). */
struct storm {
    CUresult (*alloc)(u64 *, size_t, void *);
    CUresult (*free)(u64, void *);
    void *ctx;
    CUresult (*setc)(void *);
    CUresult (*trim)(void *, size_t);
    void *pool;
    unsigned iters, failed;
};
static void *storm_run(void *arg) {
    struct storm *s = arg;
    s->setc(s->ctx);
    for (unsigned k = 0; k < s->iters; k++) {
        u64 p = 0;
        if (s->alloc(&p, 2u << 20, NULL)) { s->failed++; continue; }
        if (s->free(p, NULL)) s->failed++;
        if (s->trim(s->pool, 0)) s->failed++;
    }
    return NULL;
}

/* A primary-context retain made from another thread (the "forkretain" command). */
struct bgretain { CUresult (*retain)(void **, int); int dev; };
static void *bgretain_run(void *arg) {
    struct bgretain *b = arg;
    void *ctx = NULL;
    b->retain(&ctx, b->dev);
    return NULL;
}

static u64 ids[4096];
static size_t nids;
static u64 save(u64 v) { ids[nids] = v; return nids++; }

int main(int argc, char **argv) {
    if (argc < 2) return 2;
    mode = argv[1];
    if (strcmp(mode, "gpa-ptds") == 0) flags = 2;
    lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
    if (!lib) { fprintf(stderr, "client: %s\n", dlerror()); return 3; }
    gpa = (gpa2_t)dlsym(lib, "cuGetProcAddress_v2");
    if (!gpa) return 3;
    int *hook = (int *)dlsym(lib, "fakecuda_slow_calls");
    if (hook) slow_calls = hook;
    hook = (int *)dlsym(lib, "fakecuda_bg_pending");
    if (hook) bg_pending = hook;
    setvbuf(stdout, NULL, _IOLBF, 0);
    void *pool = NULL;
    for (int i = 2; i < argc; i++) {
        const char *c = argv[i];
        CUresult rc = 0;
#define ARG(k) strtoull(argv[i + (k)], NULL, 0)
        if (!strcmp(c, "ctx")) {
            FN(init, CUresult (*)(unsigned), "cuInit", 2000, "cuInit");
            FN(retain, CUresult (*)(void **, int), "cuDevicePrimaryCtxRetain", 7000, "cuDevicePrimaryCtxRetain");
            FN(setc, CUresult (*)(void *), "cuCtxSetCurrent", 4000, "cuCtxSetCurrent");
            void *ctx = NULL;
            rc = init(0);
            if (!rc) rc = retain(&ctx, (int)ARG(1));
            if (!rc) rc = setc(ctx);
            i += 1;
            printf(rc ? "err %d\n" : "ok\n", rc);
        } else if (!strcmp(c, "ctxcreate")) {
            int dev = (int)ARG(1), v = (int)ARG(2);
            void *ctx = NULL;
            if (v == 2) {
                FN(f, CUresult (*)(void **, unsigned, int), "cuCtxCreate", 3020, "cuCtxCreate_v2");
                rc = f(&ctx, 0, dev);
            } else if (v == 3) {
                FN(f, CUresult (*)(void **, void *, int, unsigned, int), "cuCtxCreate", 11040, "cuCtxCreate_v3");
                rc = f(&ctx, NULL, 0, 0, dev);
            } else {
                FN(f, CUresult (*)(void **, void *, unsigned, int), "cuCtxCreate", 12050, "cuCtxCreate_v4");
                rc = f(&ctx, NULL, 0, dev);
            }
            i += 2;
            if (rc) printf("err %d\n", rc); else printf("ok %llu\n", save((u64)(uintptr_t)ctx));
        } else if (!strcmp(c, "ctxdestroy")) {
            FN(f, CUresult (*)(void *), "cuCtxDestroy", 4000, "cuCtxDestroy_v2");
            rc = f((void *)(uintptr_t)ids[ARG(1)]);
            i += 1;
            printf(rc ? "err %d\n" : "ok\n", rc);
        } else if (!strcmp(c, "pretain")) {
            FN(f, CUresult (*)(void **, int), "cuDevicePrimaryCtxRetain", 7000, "cuDevicePrimaryCtxRetain");
            void *ctx = NULL;
            rc = f(&ctx, (int)ARG(1));
            i += 1;
            printf(rc ? "err %d\n" : "ok\n", rc);
        } else if (!strcmp(c, "prelease") || !strcmp(c, "preset")) {
            int rel = !strcmp(c, "prelease");
            FN(f, CUresult (*)(int), rel ? "cuDevicePrimaryCtxRelease" : "cuDevicePrimaryCtxReset", 11000,
               rel ? "cuDevicePrimaryCtxRelease_v2" : "cuDevicePrimaryCtxReset_v2");
            rc = f((int)ARG(1));
            i += 1;
            printf(rc ? "err %d\n" : "ok\n", rc);
        } else if (!strcmp(c, "vreserve")) {
            FN(f, CUresult (*)(u64 *, size_t, size_t, u64, u64), "cuMemAddressReserve", 10020, "cuMemAddressReserve");
            u64 va = 0;
            rc = f(&va, ARG(1), 0, 0, 0);
            i += 1;
            if (rc) printf("err %d\n", rc); else printf("ok %llu\n", save(va));
        } else if (!strcmp(c, "vmap")) {
            FN(f, CUresult (*)(u64, size_t, size_t, u64, u64), "cuMemMap", 10020, "cuMemMap");
            FN(acc, CUresult (*)(u64, size_t, const int *, size_t), "cuMemSetAccess", 10020, "cuMemSetAccess");
            FN(getdev, CUresult (*)(int *), "cuCtxGetDevice", 2000, "cuCtxGetDevice");
            int dev = 0;
            getdev(&dev);
            int desc[3] = {1, dev, 3};
            rc = f(ids[ARG(1)], ARG(3), 0, ids[ARG(2)], 0);
            if (!rc) rc = acc(ids[ARG(1)], ARG(3), desc, 1);
            i += 3;
            printf(rc ? "err %d\n" : "ok\n", rc);
        } else if (!strcmp(c, "vunmap") || !strcmp(c, "vfree")) {
            FN(un, CUresult (*)(u64, size_t), "cuMemUnmap", 10020, "cuMemUnmap");
            FN(fr, CUresult (*)(u64, size_t), "cuMemAddressFree", 10020, "cuMemAddressFree");
            rc = (!strcmp(c, "vunmap") ? un : fr)(ids[ARG(1)], ARG(2));
            i += 2;
            printf(rc ? "err %d\n" : "ok\n", rc);
        } else if (!strcmp(c, "pooldestroy")) {
            FN(f, CUresult (*)(void *), "cuMemPoolDestroy", 11020, "cuMemPoolDestroy");
            rc = pool ? f(pool) : 1;
            pool = NULL;
            printf(rc ? "err %d\n" : "ok\n", rc);
        } else if (!strcmp(c, "dalloc")) {
            void *(*own)(const char *, int, u64) = (void *(*)(const char *, int, u64))dlsym(lib, "fakecuda_lookup");
            if (!own) return 4;
            CUresult (*f)(u64 *, size_t) = (CUresult (*)(u64 *, size_t))own("cuMemAlloc", 3020, 0);
            u64 p = 0;
            rc = f(&p, ARG(1));
            i += 1;
            if (rc) printf("err %d\n", rc); else printf("ok %llu\n", save(p));
        } else if (!strcmp(c, "alloc") || !strcmp(c, "managed") || !strcmp(c, "async") || !strcmp(c, "pool")) {
            u64 p = 0;
            if (!strcmp(c, "alloc")) {
                FN(f, CUresult (*)(u64 *, size_t), "cuMemAlloc", 3020, "cuMemAlloc_v2");
                rc = f(&p, ARG(1));
            } else if (!strcmp(c, "managed")) {
                FN(f, CUresult (*)(u64 *, size_t, unsigned), "cuMemAllocManaged", 6000, "cuMemAllocManaged");
                rc = f(&p, ARG(1), 1);
            } else if (!strcmp(c, "async")) {
                FN(f, CUresult (*)(u64 *, size_t, void *), "cuMemAllocAsync", 11020,
                   flags ? "cuMemAllocAsync_ptsz" : "cuMemAllocAsync");
                rc = f(&p, ARG(1), NULL);
            } else {
                if (!pool) {
                    FN(mk, CUresult (*)(void **, const int *), "cuMemPoolCreate", 11020, "cuMemPoolCreate");
                    FN(getdev, CUresult (*)(int *), "cuCtxGetDevice", 2000, "cuCtxGetDevice");
                    int props[8] = {1, 0, 1, 0, 0, 0, 0, 0}, dev = 0;
                    getdev(&dev);
                    props[3] = dev;
                    mk(&pool, props);
                }
                FN(f, CUresult (*)(u64 *, size_t, void *, void *), "cuMemAllocFromPoolAsync", 11020,
                   flags ? "cuMemAllocFromPoolAsync_ptsz" : "cuMemAllocFromPoolAsync");
                rc = f(&p, ARG(1), pool, NULL);
            }
            i += 1;
            if (rc) printf("err %d\n", rc); else printf("ok %llu\n", save(p));
        } else if (!strcmp(c, "pitch")) {
            FN(f, CUresult (*)(u64 *, size_t *, size_t, size_t, unsigned), "cuMemAllocPitch", 3020, "cuMemAllocPitch_v2");
            u64 p = 0; size_t pitch = 0;
            rc = f(&p, &pitch, ARG(1), ARG(2), 4);
            i += 2;
            if (rc) printf("err %d\n", rc); else printf("ok %llu %zu\n", save(p), pitch);
        } else if (!strcmp(c, "vmm")) {
            FN(f, CUresult (*)(u64 *, size_t, const int *, u64), "cuMemCreate", 10020, "cuMemCreate");
            FN(getdev, CUresult (*)(int *), "cuCtxGetDevice", 2000, "cuCtxGetDevice");
            int prop[8] = {1, 0, 1, 0, 0, 0, 0, 0}, dev = 0;
            getdev(&dev);
            prop[3] = dev;
            u64 h = 0;
            rc = f(&h, ARG(1), prop, 0);
            i += 1;
            if (rc) printf("err %d\n", rc); else printf("ok %llu\n", save(h));
        } else if (!strcmp(c, "vretain")) {
            FN(f, CUresult (*)(u64 *, void *), "cuMemRetainAllocationHandle", 11000, "cuMemRetainAllocationHandle");
            u64 h = 0;
            rc = f(&h, (void *)(uintptr_t)ids[ARG(1)]);
            i += 1;
            if (rc) printf("err %d\n", rc); else printf("ok %llu\n", save(h));
        } else if (!strcmp(c, "array") || !strcmp(c, "array3d")) {
            void *a = NULL;
            if (!strcmp(c, "array")) {
                FN(f, CUresult (*)(void **, const void *), "cuArrayCreate", 3020, "cuArrayCreate_v2");
                struct { size_t w, h; int fmt; unsigned ch; } d = {ARG(1), ARG(2), 0x20, 4};
                rc = f(&a, &d);
                i += 2;
            } else {
                FN(f, CUresult (*)(void **, const void *), "cuArray3DCreate", 3020, "cuArray3DCreate_v2");
                struct { size_t w, h, d; int fmt; unsigned ch, flags; } d = {ARG(1), ARG(2), ARG(3), 0x20, 4, 0};
                rc = f(&a, &d);
                i += 3;
            }
            if (rc) printf("err %d\n", rc); else printf("ok %llu\n", save((u64)(uintptr_t)a));
        } else if (!strcmp(c, "mipmap")) {
            FN(f, CUresult (*)(void **, const void *, unsigned), "cuMipmappedArrayCreate", 5000, "cuMipmappedArrayCreate");
            struct { size_t w, h, d; int fmt; unsigned ch, flags; } d = {ARG(1), ARG(2), 0, 0x20, 4, 0};
            void *a = NULL;
            rc = f(&a, &d, (unsigned)ARG(3));
            i += 3;
            if (rc) printf("err %d\n", rc); else printf("ok %llu\n", save((u64)(uintptr_t)a));
        } else if (!strcmp(c, "mipfree")) {
            FN(f, CUresult (*)(void *), "cuMipmappedArrayDestroy", 5000, "cuMipmappedArrayDestroy");
            rc = f((void *)(uintptr_t)ids[ARG(1)]);
            i += 1;
            printf(rc ? "err %d\n" : "ok\n", rc);
        } else if (!strcmp(c, "limit")) {
            FN(f, CUresult (*)(int, size_t), "cuCtxSetLimit", 3010, "cuCtxSetLimit");
            rc = f((int)ARG(1), ARG(2));
            i += 2;
            printf(rc ? "err %d\n" : "ok\n", rc);
        } else if (!strcmp(c, "graph")) {
            /* a graph with one allocation node of <bytes> on the current device, instantiated */
            FN(mk, CUresult (*)(void **, unsigned), "cuGraphCreate", 10000, "cuGraphCreate");
            FN(add, CUresult (*)(void **, void *, const void *, size_t, void *), "cuGraphAddMemAllocNode", 11040, "cuGraphAddMemAllocNode");
            FN(inst, CUresult (*)(void **, void *, u64), "cuGraphInstantiateWithFlags", 11040, "cuGraphInstantiateWithFlags");
            FN(getdev, CUresult (*)(int *), "cuCtxGetDevice", 2000, "cuCtxGetDevice");
            unsigned char params[120];
            int one = 1, dev = 0;
            size_t bytes = ARG(1);
            void *g = NULL, *node = NULL, *exec = NULL;
            memset(params, 0, sizeof params);
            getdev(&dev);
            memcpy(params, &one, 4);       /* allocType pinned */
            memcpy(params + 8, &one, 4);   /* location type device */
            memcpy(params + 12, &dev, 4);  /* location id */
            memcpy(params + 104, &bytes, 8);
            rc = mk(&g, 0);
            if (!rc) rc = add(&node, g, NULL, 0, params);
            if (!rc) rc = inst(&exec, g, 0);
            i += 1;
            if (rc) printf("err %d\n", rc); else printf("ok %llu\n", save((u64)(uintptr_t)exec));
        } else if (!strcmp(c, "glaunch") || !strcmp(c, "gupload")) {
            FN(la, CUresult (*)(void *, void *), "cuGraphLaunch", 10000, flags ? "cuGraphLaunch_ptsz" : "cuGraphLaunch");
            FN(up, CUresult (*)(void *, void *), "cuGraphUpload", 11010, flags ? "cuGraphUpload_ptsz" : "cuGraphUpload");
            void *e = (void *)(uintptr_t)ids[ARG(1)];
            rc = !strcmp(c, "glaunch") ? la(e, NULL) : up(e, NULL);
            i += 1;
            printf(rc ? "err %d\n" : "ok\n", rc);
        } else if (!strcmp(c, "gtrim")) {
            FN(trim, CUresult (*)(int), "cuDeviceGraphMemTrim", 11040, "cuDeviceGraphMemTrim");
            FN(getdev, CUresult (*)(int *), "cuCtxGetDevice", 2000, "cuCtxGetDevice");
            int dev = 0;
            getdev(&dev);
            rc = trim(dev);
            printf(rc ? "err %d\n" : "ok\n", rc);
        } else if (!strcmp(c, "free") || !strcmp(c, "freeasync") || !strcmp(c, "release") || !strcmp(c, "destroy")) {
            u64 v = ids[ARG(1)];
            if (!strcmp(c, "free")) {
                FN(f, CUresult (*)(u64), "cuMemFree", 3020, "cuMemFree_v2");
                rc = f(v);
            } else if (!strcmp(c, "freeasync")) {
                FN(f, CUresult (*)(u64, void *), "cuMemFreeAsync", 11020, flags ? "cuMemFreeAsync_ptsz" : "cuMemFreeAsync");
                rc = f(v, NULL);
            } else if (!strcmp(c, "release")) {
                FN(f, CUresult (*)(u64), "cuMemRelease", 10020, "cuMemRelease");
                rc = f(v);
            } else {
                FN(f, CUresult (*)(void *), "cuArrayDestroy", 2000, "cuArrayDestroy");
                rc = f((void *)(uintptr_t)v);
            }
            i += 1;
            printf(rc ? "err %d\n" : "ok\n", rc);
        } else if (!strcmp(c, "fill")) {
            FN(f, CUresult (*)(u64, unsigned char, size_t), "cuMemsetD8", 3020, "cuMemsetD8_v2");
            rc = f(ids[ARG(1)], 0xAB, ARG(2));
            i += 2;
            printf(rc ? "err %d\n" : "ok\n", rc);
        } else if (!strcmp(c, "bgfree")) {
            /* frees id <k> from another thread after <ms> (while the next command runs) */
            FN(f, CUresult (*)(u64), "cuMemFree", 3020, "cuMemFree_v2");
            static struct bgfree bg;
            static pthread_t t;
            int during;
            unsigned ms = bg_delay(argv[i + 2], &during);
            bg = (struct bgfree){f, ids[ARG(1)], ms, during};
            __atomic_add_fetch(bg_pending, 1, __ATOMIC_SEQ_CST);
            rc = pthread_create(&t, NULL, bgfree_run, &bg) ? 1 : pthread_detach(t);
            i += 2;
            printf(rc ? "err %d\n" : "ok\n", rc);
        } else if (!strcmp(c, "bgunmap")) {
            /* unmaps <va-id> <bytes> from another thread after <ms> (while the next command runs) */
            FN(un, CUresult (*)(u64, size_t), "cuMemUnmap", 10020, "cuMemUnmap");
            static struct bgunmap bu;
            static pthread_t t;
            int during;
            unsigned ms = bg_delay(argv[i + 3], &during);
            bu = (struct bgunmap){un, ids[ARG(1)], (size_t)ARG(2), ms, during};
            __atomic_add_fetch(bg_pending, 1, __ATOMIC_SEQ_CST);
            rc = pthread_create(&t, NULL, bgunmap_run, &bu) ? 1 : pthread_detach(t);
            i += 3;
            printf(rc ? "err %d\n" : "ok\n", rc);
        } else if (!strcmp(c, "asyncstorm")) {
            FN(al, CUresult (*)(u64 *, size_t, void *), "cuMemAllocAsync", 11020, "cuMemAllocAsync");
            FN(fr, CUresult (*)(u64, void *), "cuMemFreeAsync", 11020, "cuMemFreeAsync");
            FN(getc, CUresult (*)(void **), "cuCtxGetCurrent", 4000, "cuCtxGetCurrent");
            FN(setc, CUresult (*)(void *), "cuCtxSetCurrent", 4000, "cuCtxSetCurrent");
            FN(trim, CUresult (*)(void *, size_t), "cuMemPoolTrimTo", 11020, "cuMemPoolTrimTo");
            FN(getpool, CUresult (*)(void **, int), "cuDeviceGetMemPool", 11020, "cuDeviceGetMemPool");
            FN(getdev, CUresult (*)(int *), "cuCtxGetDevice", 2000, "cuCtxGetDevice");
            unsigned n = (unsigned)ARG(1), failed = 0;
            struct storm st[16];
            pthread_t t[16];
            void *ctx = NULL, *dpool = NULL;
            int dev = 0;
            getc(&ctx);
            getdev(&dev);
            getpool(&dpool, dev);
            if (n > 16) n = 16;
            for (unsigned k = 0; k < n; k++) {
                st[k] = (struct storm){al, fr, ctx, setc, trim, dpool, (unsigned)ARG(2), 0};
                pthread_create(&t[k], NULL, storm_run, &st[k]);
            }
            for (unsigned k = 0; k < n; k++) { pthread_join(t[k], NULL); failed += st[k].failed; }
            i += 2;
            printf("ok %u\n", failed);
        } else if (!strcmp(c, "forkretain")) {
            /* another thread retains device <d>'s primary context (slow with
             * FAKE_CUDA_CTX_DELAY_MS); meanwhile this one forks, and the child retains it
             * too: "ok" when the child finished, "err hung" when it was still blocked
             * after 3 s */
            FN(f, CUresult (*)(void **, int), "cuDevicePrimaryCtxRetain", 7000, "cuDevicePrimaryCtxRetain");
            static struct bgretain bg;
            pthread_t t;
            bg = (struct bgretain){f, (int)ARG(1)};
            pthread_create(&t, NULL, bgretain_run, &bg);
            usleep(100 * 1000);
            fflush(stdout);
            pid_t pid = fork();
            if (pid == 0) {
                void *ctx = NULL;
                alarm(3);
                f(&ctx, (int)ARG(1));
                _exit(0);
            }
            int status = 0;
            waitpid(pid, &status, 0);
            pthread_join(t, NULL);
            i += 1;
            printf(WIFEXITED(status) ? "ok\n" : "err hung\n");
        } else if (!strcmp(c, "peek")) {
            /* reads <n> bytes at id <k>: "ok filled" (all 0xAB), "ok zero" or "ok mixed" */
            FN(f, CUresult (*)(void *, u64, size_t), "cuMemcpyDtoH", 3020, "cuMemcpyDtoH_v2");
            size_t n = ARG(2);
            unsigned char *b = malloc(n ? n : 1);
            rc = b ? f(b, ids[ARG(1)], n) : 2;
            int ab = 1, zero = 1;
            for (size_t k = 0; !rc && k < n; k++) { ab &= b[k] == 0xAB; zero &= b[k] == 0; }
            free(b);
            i += 2;
            if (rc) printf("err %d\n", rc); else printf("ok %s\n", ab ? "filled" : zero ? "zero" : "mixed");
        } else if (!strcmp(c, "sync")) {
            FN(f, CUresult (*)(void), "cuCtxSynchronize", 2000, "cuCtxSynchronize");
            rc = f();
            printf(rc ? "err %d\n" : "ok\n", rc);
        } else if (!strcmp(c, "trim")) {
            FN(f, CUresult (*)(void *, size_t), "cuMemPoolTrimTo", 11020, "cuMemPoolTrimTo");
            rc = pool ? f(pool, ARG(1)) : 1;
            i += 1;
            printf(rc ? "err %d\n" : "ok\n", rc);
        } else if (!strcmp(c, "meminfo")) {
            FN(f, CUresult (*)(size_t *, size_t *), "cuMemGetInfo", 3020, "cuMemGetInfo_v2");
            size_t fr = 0, to = 0;
            rc = f(&fr, &to);
            if (rc) printf("err %d\n", rc); else printf("ok %zu %zu\n", fr, to);
        } else if (!strcmp(c, "total")) {
            FN(f, CUresult (*)(size_t *, int), "cuDeviceTotalMem", 3020, "cuDeviceTotalMem_v2");
            size_t to = 0;
            rc = f(&to, (int)ARG(1));
            i += 1;
            if (rc) printf("err %d\n", rc); else printf("ok %zu\n", to);
        } else if (!strcmp(c, "sleep")) {
            usleep((useconds_t)ARG(1) * 1000);
            i += 1;
            printf("ok\n");
        } else if (!strcmp(c, "waitfile")) {
            int n = 0;
            while (access(argv[i + 1], F_OK) != 0 && n++ < 60000) usleep(1000);
            i += 1;
            printf(n > 60000 ? "err timeout\n" : "ok\n");
        } else if (!strcmp(c, "waitslow") || !strcmp(c, "bgwait")) {
            int late = !strcmp(c, "waitslow") ? wait_count(slow_calls, 0) : wait_count(bg_pending, 1);
            printf(late ? "err timeout\n" : "ok\n");
        } else if (!strcmp(c, "hold")) {
            printf("holding\n");
            for (;;) pause();
        } else if (!strcmp(c, "random")) {
            FN(al, CUresult (*)(u64 *, size_t), "cuMemAlloc", 3020, "cuMemAlloc_v2");
            FN(fr, CUresult (*)(u64), "cuMemFree", 3020, "cuMemFree_v2");
            u64 live[64]; int nlive = 0; u64 allocs = 0, refused = 0;
            struct timespec t0, t;
            clock_gettime(CLOCK_MONOTONIC, &t0);
            unsigned seed = (unsigned)getpid() ^ (unsigned)t0.tv_nsec;
            u64 secs = ARG(1), max = ARG(2);
            i += 2;
            do {
                if (nlive < 64 && (nlive == 0 || rand_r(&seed) % 2)) {
                    u64 p;
                    if (al(&p, 1 + (u64)rand_r(&seed) % max) == 0) { live[nlive++] = p; allocs++; }
                    else refused++;
                } else {
                    int k = rand_r(&seed) % nlive;
                    fr(live[k]);
                    live[k] = live[--nlive];
                }
                clock_gettime(CLOCK_MONOTONIC, &t);
            } while ((u64)(t.tv_sec - t0.tv_sec) < secs);
            while (nlive) fr(live[--nlive]);
            printf("ok %llu %llu\n", allocs, refused);
        } else if (!strncmp(c, "bench-", 6) || !strcmp(c, "spawn")) {
            /* Timing loops: "ok <wall ns per op> <cpu ns per op>". */
            u64 n = ARG(1);
            struct timespec w0, w1, c0, c1;
            FN(al, CUresult (*)(u64 *, size_t), "cuMemAlloc", 3020, "cuMemAlloc_v2");
            FN(fr, CUresult (*)(u64), "cuMemFree", 3020, "cuMemFree_v2");
            FN(la, CUresult (*)(void *, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, void *, void **, void **),
               "cuLaunchKernel", 4000, "cuLaunchKernel");
            FN(mi, CUresult (*)(size_t *, size_t *), "cuMemGetInfo", 3020, "cuMemGetInfo_v2");
            int direct = !strncmp(c, "bench-direct-", 13);
            const char *what = direct ? c + 13 : c + 6;
            if (direct) {
                void *(*own)(const char *, int, u64) = (void *(*)(const char *, int, u64))dlsym(lib, "fakecuda_lookup");
                if (!own) return 4;
                al = (__typeof__(al))own("cuMemAlloc", 3020, 0);
                fr = (__typeof__(fr))own("cuMemFree", 3020, 0);
                la = (__typeof__(la))own("cuLaunchKernel", 4000, 0);
                mi = (__typeof__(mi))own("cuMemGetInfo", 3020, 0);
                if (!al || !fr || !la || !mi) return 4;
            }
            int op = !strcmp(what, "pair") ? 0 : !strcmp(what, "launch") ? 1 : !strcmp(what, "meminfo") ? 2 : 3;
            clock_gettime(CLOCK_MONOTONIC, &w0);
            clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &c0);
            for (u64 k = 0; k < n; k++) {
                if (op == 0) {
                    u64 p;
                    if (al(&p, 4096) || fr(p)) { printf("err\n"); return 1; }
                } else if (op == 1) {
                    la(NULL, 1, 1, 1, 1, 1, 1, 0, NULL, NULL, NULL);
                } else if (op == 2) {
                    size_t f, t;
                    mi(&f, &t);
                } else {
                    /* posix_spawn (a vfork): the child's exec, loading and exit, not
                     * a copy of this process's page tables, which varies with it */
                    pid_t pid;
                    char *args[] = {argv[i + 2], NULL};
                    int st;
                    if (posix_spawn(&pid, argv[i + 2], NULL, NULL, args, environ)) { printf("err spawn\n"); return 1; }
                    waitpid(pid, &st, 0);
                }
            }
            clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &c1);
            clock_gettime(CLOCK_MONOTONIC, &w1);
            i += strcmp(c, "spawn") ? 1 : 2;
            double wall = (w1.tv_sec - w0.tv_sec) * 1e9 + (w1.tv_nsec - w0.tv_nsec);
            double cpu = (c1.tv_sec - c0.tv_sec) * 1e9 + (c1.tv_nsec - c0.tv_nsec);
            printf("ok %.1f %.1f\n", wall / (double)n, cpu / (double)n);
        } else if (!strcmp(c, "writefile")) {
            /* rewrites <file> in place (the same inode: a bind mount of it follows) */
            FILE *f = fopen(argv[i + 1], "w");
            if (f && strcmp(argv[i + 2], "-")) fprintf(f, "%s\n", argv[i + 2]);
            rc = !f || fclose(f);
            i += 2;
            printf(rc ? "err %d\n" : "ok\n", rc);
        } else if (!strcmp(c, "lookup")) {
            void *(*direct)(const char *, int, u64) = (void *(*)(const char *, int, u64))dlsym(lib, "fakecuda_lookup");
            const char *(*name_of)(const void *) = (const char *(*)(const void *))dlsym(lib, "fakecuda_symbol_of");
            if (!direct || !name_of) return 4;
            FILE *in = fopen(argv[i + 1], "r");
            if (!in) return 4;
            char line[512];
            i += 1;
            while (fgets(line, sizeof line, in)) {
                char src[64], sym[128] = "", exp[128];
                int ver; u64 fl;
                line[strcspn(line, "\n")] = 0;
                /* source, symbol (may be empty), version, flags, expected */
                char *f[5]; int n = 0;
                for (char *s = line, *tab; n < 5; s = tab + 1) {
                    f[n++] = s;
                    tab = strchr(s, '\t');
                    if (!tab) break;
                    *tab = 0;
                }
                if (n < 5 || !strcmp(f[0], "source")) continue;
                snprintf(src, sizeof src, "%s", f[0]);
                snprintf(sym, sizeof sym, "%s", f[1]);
                ver = atoi(f[2]); fl = strtoull(f[3], NULL, 10);
                snprintf(exp, sizeof exp, "%s", f[4]);
                void *p = NULL;
                gpa(sym, &p, ver, fl, NULL);
                void *d = direct(sym, ver, fl);
                Dl_info info;
                char got[256], own[256];
                if (!p) snprintf(got, sizeof got, "null");
                else if (name_of(p)) snprintf(got, sizeof got, "driver:%s", name_of(p));
                else if (dladdr(p, &info) && info.dli_sname) snprintf(got, sizeof got, "hook:%s", info.dli_sname);
                else snprintf(got, sizeof got, "unknown");
                snprintf(own, sizeof own, "%s", d ? name_of(d) : "null");
                printf("%s\t%s\t%d\t%llu\t%s\t%s\t%s\n", src, sym, ver, fl, exp, got, own);
            }
            fclose(in);
        } else {
            fprintf(stderr, "client: unknown command %s\n", c);
            return 2;
        }
    }
    return 0;
}
