/*
 * sim_client.c: a workload for the simulated GPU (fakesim.h), and a small NVML probe.
 * It loads libcuda.so.1 as cudart and cuda-bindings do: dlopen, then every entry
 * point through cuGetProcAddress_v2 (or, with load=dlsym, by exact exported name), so
 * a preloaded interposer that hooks dlsym/cuGetProcAddress sees every call.
 *
 * Usage:
 *   sim_client <workload> <seed> <seconds> [device] [key=value...]
 * Workloads (each runs until <seconds> have passed, checked after each synchronisation):
 *   loop         cuLaunchKernel (NULL stream), cuCtxSynchronize; repeat
 *   graph50      one graph of 50 kernel nodes (cuGraphAddKernelNode_v2), instantiated
 *                once; cuGraphLaunch on a stream, cuStreamSynchronize; repeat
 *   burst        `burst` cuLaunchKernel on a stream, cuStreamSynchronize; repeat
 *   idle-active  loop for `active` s, idle for `idle` s, loop again until the end
 *   coop         cuLaunchCooperativeKernel (NULL stream), cuCtxSynchronize; repeat
 *   ex           cuLaunchKernelEx (a stream in the CUlaunchConfig), cuStreamSynchronize
 *   ptsz         cuLaunchKernel_ptsz and cuStreamSynchronize_ptsz (cuGetProcAddress with
 *                flag 2, cudaVersion 7000), per-thread default stream; repeat
 *   multidev     cuLaunchCooperativeKernelMultiDevice with one kernel per visible device
 *                (a stream each), then cuCtxSynchronize on each; repeat
 * [device] is the CUDA ordinal whose primary context is current (default 0).
 * Keys: min=<ms> max=<ms> (the body of the mix), tail=<percent>, tmax=<ms>, burst=<n>
 *   (default 8), active=<s> idle=<s> (default 1 and 1), load=gpa|dlsym.
 * Kernel mix (fixed by the seed): with probability tail% a duration log-uniform in
 *   [max, tmax] ms, else log-uniform in [min, max] ms. Defaults min 0.05, max 2, tail
 *   5, tmax 200: mean 0.95 * 0.529 + 0.05 * 43.0 = 2.65 ms per kernel; the tail carries
 *   81% of the busy time. min=max gives fixed-length kernels (tail=0 to drop the tail).
 *   A duration d becomes a grid of round(d / FAKE_SIM_BLOCK_NS) blocks (at least 1;
 *   FAKE_SIM_BLOCK_NS as the fake driver reads it, default 1000): gridDimX = blocks,
 *   gridDimY = gridDimZ = 1, block 128x1x1.
 * Output: one final line "pid <pid> launches <n> kernels <k> blocks <b> cpu_us <c>":
 *   launch calls made, kernels they carried (a graph launch carries 50; a multi-device
 *   launch one per device), their blocks, and the process's CPU time.
 *   Errors: "err <call> <CUresult>" on stderr, exit 4.
 *
 *   sim_client nvml util <seconds> <interval_ms> <index>
 *       every interval: nvmlDeviceGetProcessUtilization (lastSeenTimeStamp = the newest
 *       timestamp seen so far) -> "sample <pid> <timeStamp_us> <smUtil>" per sample, and
 *       nvmlDeviceGetUtilizationRates -> "gpu <CLOCK_MONOTONIC us> <gpu %>"
 *   sim_client nvml procs <index>  nvmlDeviceGetComputeRunningProcesses_v3
 *       -> "proc <pid> <usedGpuMemory> <gpuInstanceId> <computeInstanceId>" per process
 *   sim_client nvml mem <index>    nvmlDeviceGetMemoryInfo -> "mem <total> <free> <used>"
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

typedef int CUresult;
typedef unsigned long long u64;
typedef CUresult (*gpa2_t)(const char *, void **, int, u64, int *);

static void *lib;
static gpa2_t gpa;
static int by_dlsym;

static void *get(const char *base, int ver, u64 flags, const char *exact) {
    void *p = NULL;
    if (by_dlsym) p = dlsym(lib, exact);
    else gpa(base, &p, ver, flags, NULL);
    if (!p) { fprintf(stderr, "sim_client: no %s\n", exact); exit(3); }
    return p;
}
#define FN(var, type, base, ver, flags, exact) __typeof__(type) var = (__typeof__(type))get(base, ver, flags, exact)
#define CHECK(call, expr) do { CUresult rc_ = (expr); if (rc_) { fprintf(stderr, "err %s %d\n", call, rc_); exit(4); } } while (0)

static u64 now_ns(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (u64)t.tv_sec * 1000000000ull + (u64)t.tv_nsec;
}

/* ---- the kernel mix ---- */
static u64 rng;
static u64 next_u64(void) {
    u64 z = (rng += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}
static double uniform(void) { return (double)(next_u64() >> 11) * (1.0 / 9007199254740992.0); }
static double log_uniform(double a, double b) { return a == b ? a : exp(log(a) + uniform() * (log(b) - log(a))); }

static double mix_min = 0.05, mix_max = 2, mix_tail = 5, mix_tmax = 200;
static u64 block_ns = 1000;

static unsigned next_blocks(void) {
    double ms = uniform() * 100 < mix_tail ? log_uniform(mix_max, mix_tmax) : log_uniform(mix_min, mix_max);
    double b = floor(ms * 1e6 / (double)block_ns + 0.5);
    return b < 1 ? 1 : b > 2147483647.0 ? 2147483647u : (unsigned)b;
}

/* ---- the NVML probe ---- */
typedef struct { unsigned pid; u64 ts; unsigned sm, mem, enc, dec; } util_sample;
typedef struct { unsigned pid; u64 used; unsigned gi, ci; } proc_info;

static int nvml(int argc, char **argv) {
    if (argc < 4) { fprintf(stderr, "usage: sim_client nvml util|procs|mem ...\n"); return 2; }
    void *l = dlopen("libnvidia-ml.so.1", RTLD_NOW | RTLD_LOCAL);
    if (!l) { fprintf(stderr, "sim_client: %s\n", dlerror()); return 3; }
#define NV(var, type, name) __typeof__(type) var = (__typeof__(type))dlsym(l, name); if (!var) { fprintf(stderr, "sim_client: no %s\n", name); return 3; }
    NV(init, int (*)(void), "nvmlInit_v2");
    NV(handle, int (*)(unsigned, void **), "nvmlDeviceGetHandleByIndex_v2");
    int rc = init();
    if (rc) { fprintf(stderr, "err nvmlInit_v2 %d\n", rc); return 4; }
    const char *what = argv[2];
    void *dev = NULL;
    unsigned index = (unsigned)atoi(argv[!strcmp(what, "util") ? 5 : 3]);
    if (!strcmp(what, "util") && argc < 6) { fprintf(stderr, "usage: sim_client nvml util <s> <ms> <index>\n"); return 2; }
    if ((rc = handle(index, &dev))) { fprintf(stderr, "err nvmlDeviceGetHandleByIndex_v2 %d\n", rc); return 4; }
    if (!strcmp(what, "util")) {
        NV(pu, int (*)(void *, util_sample *, unsigned *, u64), "nvmlDeviceGetProcessUtilization");
        NV(ur, int (*)(void *, unsigned *), "nvmlDeviceGetUtilizationRates");
        u64 end = now_ns() + (u64)(atof(argv[3]) * 1e9), step = (u64)(atof(argv[4]) * 1e6), seen = 0;
        while (now_ns() < end) {
            util_sample buf[64];
            unsigned n = 0;
            rc = pu(dev, NULL, &n, seen);
            if (rc != 0 && rc != 7) { fprintf(stderr, "err nvmlDeviceGetProcessUtilization %d\n", rc); return 4; }
            if (n > 64) n = 64;
            if (n && (rc = pu(dev, buf, &n, seen))) { fprintf(stderr, "err nvmlDeviceGetProcessUtilization %d\n", rc); return 4; }
            for (unsigned i = 0; i < n; i++) {
                printf("sample %u %llu %u\n", buf[i].pid, buf[i].ts, buf[i].sm);
                if (buf[i].ts > seen) seen = buf[i].ts;
            }
            unsigned u[2];
            if ((rc = ur(dev, u))) { fprintf(stderr, "err nvmlDeviceGetUtilizationRates %d\n", rc); return 4; }
            printf("gpu %llu %u\n", now_ns() / 1000, u[0]);
            fflush(stdout);
            struct timespec ts = {(time_t)(step / 1000000000ull), (long)(step % 1000000000ull)};
            nanosleep(&ts, NULL);
        }
    } else if (!strcmp(what, "procs")) {
        NV(rp, int (*)(void *, unsigned *, proc_info *), "nvmlDeviceGetComputeRunningProcesses_v3");
        unsigned n = 0;
        rc = rp(dev, &n, NULL);
        if (rc != 0 && rc != 7) { fprintf(stderr, "err nvmlDeviceGetComputeRunningProcesses_v3 %d\n", rc); return 4; }
        proc_info buf[256];
        if (n > 256) n = 256;
        if (n && (rc = rp(dev, &n, buf))) { fprintf(stderr, "err nvmlDeviceGetComputeRunningProcesses_v3 %d\n", rc); return 4; }
        for (unsigned i = 0; i < n; i++) printf("proc %u %llu %u %u\n", buf[i].pid, buf[i].used, buf[i].gi, buf[i].ci);
    } else if (!strcmp(what, "mem")) {
        NV(mi, int (*)(void *, u64 *), "nvmlDeviceGetMemoryInfo");
        u64 m[3];
        if ((rc = mi(dev, m))) { fprintf(stderr, "err nvmlDeviceGetMemoryInfo %d\n", rc); return 4; }
        printf("mem %llu %llu %llu\n", m[0], m[1], m[2]);
    } else {
        fprintf(stderr, "sim_client: unknown nvml query %s\n", what);
        return 2;
    }
    return 0;
}

/* ---- CUDA ---- */
struct launch_config { unsigned gx, gy, gz, bx, by, bz, shmem; void *stream; void *attrs; unsigned nattrs; };
struct launch_params { void *func; unsigned gx, gy, gz, bx, by, bz, shmem; void *stream; void **params; };
struct kparams_v2 { void *func; unsigned gx, gy, gz, bx, by, bz, shmem; void **params; void **extra; void *kern; void *ctx; };

typedef CUresult (*launch_t)(void *, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, void *, void **, void **);
typedef CUresult (*coop_t)(void *, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, void *, void **);
typedef CUresult (*sync_t)(void);
typedef CUresult (*ssync_t)(void *);

int main(int argc, char **argv) {
    if (argc >= 2 && !strcmp(argv[1], "nvml")) return nvml(argc, argv);
    if (argc < 4) {
        fprintf(stderr, "usage: sim_client <workload> <seed> <seconds> [device] [key=value...]\n");
        return 2;
    }
    const char *work = argv[1];
    u64 seed = strtoull(argv[2], NULL, 10);
    double secs = atof(argv[3]);
    int ordinal = 0, burst = 8;
    double active = 1, idle = 1;
    for (int i = 4; i < argc; i++) {
        char *eq = strchr(argv[i], '=');
        if (!eq) { ordinal = atoi(argv[i]); continue; }
        *eq = 0;
        const char *k = argv[i], *v = eq + 1;
        if (!strcmp(k, "min")) mix_min = atof(v);
        else if (!strcmp(k, "max")) mix_max = atof(v);
        else if (!strcmp(k, "tail")) mix_tail = atof(v);
        else if (!strcmp(k, "tmax")) mix_tmax = atof(v);
        else if (!strcmp(k, "burst")) burst = atoi(v);
        else if (!strcmp(k, "active")) active = atof(v);
        else if (!strcmp(k, "idle")) idle = atof(v);
        else if (!strcmp(k, "load")) by_dlsym = !strcmp(v, "dlsym");
        else { fprintf(stderr, "sim_client: unknown key %s\n", k); return 2; }
    }
    if (mix_min <= 0 || mix_max < mix_min || mix_tmax < mix_max || burst < 1) {
        fprintf(stderr, "sim_client: bad mix\n");
        return 2;
    }
    const char *b = getenv("FAKE_SIM_BLOCK_NS");
    if (b && strtoull(b, NULL, 10) > 0) block_ns = strtoull(b, NULL, 10);
    rng = seed * 0x2545f4914f6cdd1dull + 1;

    lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
    if (!lib) { fprintf(stderr, "sim_client: %s\n", dlerror()); return 3; }
    gpa = (gpa2_t)dlsym(lib, "cuGetProcAddress_v2");
    if (!gpa && !by_dlsym) { fprintf(stderr, "sim_client: no cuGetProcAddress_v2\n"); return 3; }

    FN(cuInit, CUresult (*)(unsigned), "cuInit", 2000, 0, "cuInit");
    FN(cuDeviceGetCount, CUresult (*)(int *), "cuDeviceGetCount", 2000, 0, "cuDeviceGetCount");
    FN(retain, CUresult (*)(void **, int), "cuDevicePrimaryCtxRetain", 7000, 0, "cuDevicePrimaryCtxRetain");
    FN(set_current, CUresult (*)(void *), "cuCtxSetCurrent", 4000, 0, "cuCtxSetCurrent");
    FN(ctx_sync, sync_t, "cuCtxSynchronize", 2000, 0, "cuCtxSynchronize");
    FN(stream_create, CUresult (*)(void **, unsigned), "cuStreamCreate", 2000, 0, "cuStreamCreate");
    FN(stream_sync, ssync_t, "cuStreamSynchronize", 2000, 0, "cuStreamSynchronize");
    FN(load, CUresult (*)(void **, const void *), "cuModuleLoadData", 2000, 0, "cuModuleLoadData");
    FN(get_function, CUresult (*)(void **, void *, const char *), "cuModuleGetFunction", 2000, 0, "cuModuleGetFunction");

    CHECK("cuInit", cuInit(0));
    int ndev = 0;
    CHECK("cuDeviceGetCount", cuDeviceGetCount(&ndev));
    if (ordinal < 0 || ordinal >= ndev) { fprintf(stderr, "sim_client: no device %d\n", ordinal); return 2; }
    void *ctxs[8] = {0};
    for (int d = 0; d < ndev && d < 8; d++) CHECK("cuDevicePrimaryCtxRetain", retain(&ctxs[d], d));
    CHECK("cuCtxSetCurrent", set_current(ctxs[ordinal]));
    static const char image[] = "// fake PTX\n.version 8.0\n.target sm_90\n";
    void *module = NULL, *func = NULL;
    CHECK("cuModuleLoadData", load(&module, image));
    CHECK("cuModuleGetFunction", get_function(&func, module, "kernel"));

    u64 launches = 0, kernels = 0, blocks = 0;
    u64 t0 = now_ns(), end = t0 + (u64)(secs * 1e9);
    if (!strcmp(work, "loop") || !strcmp(work, "idle-active") || !strcmp(work, "coop") || !strcmp(work, "ptsz")) {
        int coop = !strcmp(work, "coop"), ptsz = !strcmp(work, "ptsz");
        launch_t launch = NULL;
        coop_t launch_coop = NULL;
        ssync_t sync_ptsz = NULL;
        if (coop) launch_coop = (coop_t)get("cuLaunchCooperativeKernel", 9000, 0, "cuLaunchCooperativeKernel");
        else if (ptsz) {
            launch = (launch_t)get("cuLaunchKernel", 7000, 2, "cuLaunchKernel_ptsz");
            sync_ptsz = (ssync_t)get("cuStreamSynchronize", 7000, 2, "cuStreamSynchronize_ptsz");
        } else launch = (launch_t)get("cuLaunchKernel", 4000, 0, "cuLaunchKernel");
        u64 idle_from = !strcmp(work, "idle-active") ? t0 + (u64)(active * 1e9) : end;
        u64 idle_to = idle_from + (u64)(idle * 1e9);
        while (now_ns() < end) {
            u64 now = now_ns();
            if (now >= idle_from && now < idle_to) {
                struct timespec ts = {(time_t)((idle_to - now) / 1000000000ull), (long)((idle_to - now) % 1000000000ull)};
                nanosleep(&ts, NULL);
                continue;
            }
            unsigned g = next_blocks();
            if (coop) CHECK("cuLaunchCooperativeKernel", launch_coop(func, g, 1, 1, 128, 1, 1, 0, NULL, NULL));
            else CHECK(ptsz ? "cuLaunchKernel_ptsz" : "cuLaunchKernel", launch(func, g, 1, 1, 128, 1, 1, 0, NULL, NULL, NULL));
            launches++, kernels++, blocks += g;
            if (ptsz) CHECK("cuStreamSynchronize_ptsz", sync_ptsz(NULL));
            else CHECK("cuCtxSynchronize", ctx_sync());
        }
    } else if (!strcmp(work, "burst") || !strcmp(work, "ex")) {
        int ex = !strcmp(work, "ex");
        void *stream = NULL;
        CHECK("cuStreamCreate", stream_create(&stream, 0));
        launch_t launch = ex ? NULL : (launch_t)get("cuLaunchKernel", 4000, 0, "cuLaunchKernel");
        CUresult (*launch_ex)(const struct launch_config *, void *, void **, void **) =
            ex ? (CUresult (*)(const struct launch_config *, void *, void **, void **))get("cuLaunchKernelEx", 11060, 0, "cuLaunchKernelEx") : NULL;
        while (now_ns() < end) {
            for (int i = 0; i < (ex ? 1 : burst); i++) {
                unsigned g = next_blocks();
                if (ex) {
                    struct launch_config c = {g, 1, 1, 128, 1, 1, 0, stream, NULL, 0};
                    CHECK("cuLaunchKernelEx", launch_ex(&c, func, NULL, NULL));
                } else {
                    CHECK("cuLaunchKernel", launch(func, g, 1, 1, 128, 1, 1, 0, stream, NULL, NULL));
                }
                launches++, kernels++, blocks += g;
            }
            CHECK("cuStreamSynchronize", stream_sync(stream));
        }
    } else if (!strcmp(work, "graph50")) {
        FN(graph_create, CUresult (*)(void **, unsigned), "cuGraphCreate", 10000, 0, "cuGraphCreate");
        FN(add_kernel, CUresult (*)(void **, void *, const void *, size_t, const struct kparams_v2 *), "cuGraphAddKernelNode", 12000, 0, "cuGraphAddKernelNode_v2");
        FN(instantiate, CUresult (*)(void **, void *, u64), "cuGraphInstantiateWithFlags", 11040, 0, "cuGraphInstantiateWithFlags");
        FN(graph_launch, CUresult (*)(void *, void *), "cuGraphLaunch", 10000, 0, "cuGraphLaunch");
        void *graph = NULL, *exec = NULL, *stream = NULL, *prev = NULL;
        CHECK("cuStreamCreate", stream_create(&stream, 0));
        CHECK("cuGraphCreate", graph_create(&graph, 0));
        u64 graph_blocks = 0;
        for (int i = 0; i < 50; i++) {
            unsigned g = next_blocks();
            struct kparams_v2 p = {func, g, 1, 1, 128, 1, 1, 0, NULL, NULL, NULL, NULL};
            void *node = NULL;
            CHECK("cuGraphAddKernelNode_v2", add_kernel(&node, graph, prev ? &prev : NULL, prev ? 1 : 0, &p));
            prev = node;
            graph_blocks += g;
        }
        CHECK("cuGraphInstantiateWithFlags", instantiate(&exec, graph, 0));
        while (now_ns() < end) {
            CHECK("cuGraphLaunch", graph_launch(exec, stream));
            launches++, kernels += 50, blocks += graph_blocks;
            CHECK("cuStreamSynchronize", stream_sync(stream));
        }
    } else if (!strcmp(work, "multidev")) {
        FN(multi, CUresult (*)(struct launch_params *, unsigned, unsigned), "cuLaunchCooperativeKernelMultiDevice", 9000, 0, "cuLaunchCooperativeKernelMultiDevice");
        int n = ndev < 8 ? ndev : 8;
        void *streams[8] = {0};
        for (int d = 0; d < n; d++) {
            CHECK("cuCtxSetCurrent", set_current(ctxs[d]));
            CHECK("cuStreamCreate", stream_create(&streams[d], 0));
        }
        CHECK("cuCtxSetCurrent", set_current(ctxs[ordinal]));
        while (now_ns() < end) {
            struct launch_params p[8];
            for (int d = 0; d < n; d++) {
                unsigned g = next_blocks();
                p[d] = (struct launch_params){func, g, 1, 1, 128, 1, 1, 0, streams[d], NULL};
                kernels++, blocks += g;
            }
            CHECK("cuLaunchCooperativeKernelMultiDevice", multi(p, (unsigned)n, 0));
            launches++;
            for (int d = 0; d < n; d++) {
                CHECK("cuCtxSetCurrent", set_current(ctxs[d]));
                CHECK("cuCtxSynchronize", ctx_sync());
            }
            CHECK("cuCtxSetCurrent", set_current(ctxs[ordinal]));
        }
    } else {
        fprintf(stderr, "sim_client: unknown workload %s\n", work);
        return 2;
    }
    struct timespec cpu;
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &cpu);
    printf("pid %d launches %llu kernels %llu blocks %llu cpu_us %llu\n", (int)getpid(), launches, kernels, blocks,
           (u64)cpu.tv_sec * 1000000ull + (u64)cpu.tv_nsec / 1000);
    return 0;
}
