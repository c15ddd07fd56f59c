/*
 * kit_cuda: the GPU acceptance kit's CUDA program (tests/gpu/run.sh). It dlopens the
 * libcuda.so.1 the dynamic linker finds (the real driver's, or under --simulated the
 * fake one), so it needs no CUDA toolkit, and prints one line of `key=value` figures.
 *
 *   kit_cuda kernel PTXFILE   cuInit + context (timed), cuMemGetInfo, the PTX's
 *                             kit_fill over 1 Mi ints, and how many values are right
 *   kit_cuda budget           cuMemGetInfo, then cuMemAlloc of all it says is free
 *                             (in 2 MiB pages) and of one byte more: the codes; then,
 *                             with the budget full and again after freeing it, the
 *                             least allocation through cuMemAllocPitch,
 *                             cuMemAllocManaged, cuMemAllocAsync (the device's default
 *                             pool), cuMemAllocFromPoolAsync (a pool of its own),
 *                             cuMemCreate (2 MiB) and cuArrayCreate: the codes
 *   kit_cuda nvml             NVML's memory total of the first GPU (libnvidia-ml.so.1)
 *   kit_cuda nvml-proc PID    the device memory NVML lists for PID on the first GPU
 *   kit_cuda nvml-util SECS PID1 PID2  NVML's SM utilization of the two processes on the
 *                             first GPU, averaged over its samples of SECS seconds
 *   kit_cuda hold MIB         allocates MIB, prints `held`, and sleeps until killed
 *   kit_cuda free             cuMemGetInfo's free and total
 *   kit_cuda costs PTXFILE    cuInit + context, and the mean of 1000 alloc+free pairs
 *                             (1 MiB), cuLaunchKernel (one block) and cuMemGetInfo
 *   kit_cuda busy SECS PTXFILE  kit_spin launched and synchronised back to back for
 *                             SECS seconds over every SM: launches and ms per launch
 *
 * Exit 0 when every call succeeded (whether the values are right is a figure: the
 * fake driver does not run kernels); 1 with `error=<call>:<code>` otherwise.
 */
#include <dlfcn.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

typedef int CUresult;
typedef int CUdevice;
typedef void *CUcontext;
typedef void *CUmodule;
typedef void *CUfunction;
typedef unsigned long long CUdeviceptr;

static void *lib;
static void *sym(const char *name) {
    void *p = dlsym(lib, name);
    if (!p) {
        printf("error=dlsym:%s\n", name);
        exit(1);
    }
    return p;
}
#define CHECK(call)                                                   \
    do {                                                              \
        CUresult r_ = (call);                                         \
        if (r_ != 0) {                                                \
            printf("error=%s:%d\n", #call, r_);                       \
            return 1;                                                 \
        }                                                             \
    } while (0)

static void pause_forever(void) { sleep(3600); }

static double now_ms(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec * 1e3 + t.tv_nsec / 1e6;
}

static char *read_file(const char *path) {
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *buf = calloc(1, (size_t)n + 1);
    if (buf && fread(buf, 1, (size_t)n, f) != (size_t)n) {
        free(buf);
        buf = NULL;
    }
    fclose(f);
    return buf;
}

static int kernel(const char *ptx_path) {
    CUresult (*cuInit)(unsigned) = sym("cuInit");
    CUresult (*cuDeviceGet)(CUdevice *, int) = sym("cuDeviceGet");
    CUresult (*cuDeviceGetName)(char *, int, CUdevice) = sym("cuDeviceGetName");
    CUresult (*cuCtxCreate)(CUcontext *, unsigned, CUdevice) = sym("cuCtxCreate_v2");
    CUresult (*cuCtxDestroy)(CUcontext) = sym("cuCtxDestroy_v2");
    CUresult (*cuMemGetInfo)(size_t *, size_t *) = sym("cuMemGetInfo_v2");
    CUresult (*cuMemAlloc)(CUdeviceptr *, size_t) = sym("cuMemAlloc_v2");
    CUresult (*cuMemFree)(CUdeviceptr) = sym("cuMemFree_v2");
    CUresult (*cuMemcpyDtoH)(void *, CUdeviceptr, size_t) = sym("cuMemcpyDtoH_v2");
    CUresult (*cuModuleLoadData)(CUmodule *, const void *) = sym("cuModuleLoadData");
    CUresult (*cuModuleGetFunction)(CUfunction *, CUmodule, const char *) =
        sym("cuModuleGetFunction");
    CUresult (*cuLaunchKernel)(CUfunction, unsigned, unsigned, unsigned, unsigned, unsigned,
                               unsigned, unsigned, void *, void **, void **) =
        sym("cuLaunchKernel");
    CUresult (*cuCtxSynchronize)(void) = sym("cuCtxSynchronize");

    char *ptx = read_file(ptx_path);
    if (!ptx) {
        printf("error=read:%s\n", ptx_path);
        return 1;
    }
    double t0 = now_ms();
    CUdevice dev;
    CUcontext ctx;
    CHECK(cuInit(0));
    CHECK(cuDeviceGet(&dev, 0));
    CHECK(cuCtxCreate(&ctx, 0, dev));
    double init_ms = now_ms() - t0;
    char name[128] = {0};
    CHECK(cuDeviceGetName(name, sizeof name - 1, dev));
    for (char *c = name; *c; c++)
        if (*c == ' ') *c = '_';
    size_t free_b = 0, total_b = 0;
    CHECK(cuMemGetInfo(&free_b, &total_b));

    const unsigned n = 1u << 20;
    CUdeviceptr out;
    CHECK(cuMemAlloc(&out, n * sizeof(uint32_t)));
    CUmodule mod;
    CUfunction fn;
    CHECK(cuModuleLoadData(&mod, ptx));
    CHECK(cuModuleGetFunction(&fn, mod, "kit_fill"));
    unsigned nn = n;
    void *params[] = {&out, &nn};
    double t1 = now_ms();
    CHECK(cuLaunchKernel(fn, n / 256, 1, 1, 256, 1, 1, 0, NULL, params, NULL));
    CHECK(cuCtxSynchronize());
    double kernel_ms = now_ms() - t1;
    uint32_t *host = malloc(n * sizeof(uint32_t));
    if (!host) return 1;
    CHECK(cuMemcpyDtoH(host, out, n * sizeof(uint32_t)));
    unsigned right = 0;
    for (unsigned i = 0; i < n; i++)
        if (host[i] == 3u * i + 7u) right++;
    CHECK(cuMemFree(out));
    CHECK(cuCtxDestroy(ctx));
    printf("device=%s init_ctx_ms=%.1f kernel_ms=%.2f free_mib=%zu total_mib=%zu right=%u of=%u\n",
           name, init_ms, kernel_ms, free_b >> 20, total_b >> 20, right, n);
    free(host);
    free(ptx);
    return 0;
}

/* cuInit, device 0 and a context; 0 or the failing call's code. */
static CUresult open_ctx(CUcontext *ctx) {
    CUresult (*cuInit)(unsigned) = sym("cuInit");
    CUresult (*cuDeviceGet)(CUdevice *, int) = sym("cuDeviceGet");
    CUresult (*cuCtxCreate)(CUcontext *, unsigned, CUdevice) = sym("cuCtxCreate_v2");
    CUdevice dev;
    CUresult r = cuInit(0);
    if (r == 0) r = cuDeviceGet(&dev, 0);
    if (r == 0) r = cuCtxCreate(ctx, 0, dev);
    return r;
}

static void paths(char *out, size_t n);

static int budget(void) {
    CUresult (*cuMemGetInfo)(size_t *, size_t *) = sym("cuMemGetInfo_v2");
    CUresult (*cuMemAlloc)(CUdeviceptr *, size_t) = sym("cuMemAlloc_v2");
    CUcontext ctx;
    CHECK(open_ctx(&ctx));
    size_t free_b = 0, total_b = 0;
    CHECK(cuMemGetInfo(&free_b, &total_b));
    size_t page = 2u << 20, want = free_b / page * page;
    CUdeviceptr a = 0, b = 0;
    CUresult up_to = cuMemAlloc(&a, want);
    CUresult one_more = cuMemAlloc(&b, 1);
    char full[200], room[200];
    paths(full, sizeof full);
    CUresult (*cuMemFree)(CUdeviceptr) = sym("cuMemFree_v2");
    if (up_to == 0) cuMemFree(a);
    paths(room, sizeof room);
    /* The line ends with the figures run.sh matches on. */
    printf("full: %s; room: %s; total_mib=%zu free_mib=%zu alloc_free=%d one_more_byte=%d\n",
           full, room, total_b >> 20, free_b >> 20, up_to, one_more);
    return 0;
}

/* CUmemAllocationProp and CUDA_ARRAY_DESCRIPTOR, as cuda.h lays them out. */
struct mem_prop {
    int type, handle_types, loc_type, loc_id;
    void *win32;
    unsigned char flags[8];
};
struct array_desc {
    size_t width, height;
    int format;
    unsigned channels;
};

/* The least allocation through each other path, freed again at once: the codes. */
static void paths(char *out, size_t n) {
    CUresult (*cuMemAllocPitch)(CUdeviceptr *, size_t *, size_t, size_t, unsigned) =
        sym("cuMemAllocPitch_v2");
    CUresult (*cuMemAllocManaged)(CUdeviceptr *, size_t, unsigned) = sym("cuMemAllocManaged");
    CUresult (*cuMemAllocAsync)(CUdeviceptr *, size_t, void *) = sym("cuMemAllocAsync");
    CUresult (*cuMemFreeAsync)(CUdeviceptr, void *) = sym("cuMemFreeAsync");
    CUresult (*cuMemPoolCreate)(void **, const void *) = sym("cuMemPoolCreate");
    CUresult (*cuMemPoolDestroy)(void *) = sym("cuMemPoolDestroy");
    CUresult (*cuMemAllocFromPoolAsync)(CUdeviceptr *, size_t, void *, void *) =
        sym("cuMemAllocFromPoolAsync");
    CUresult (*cuMemCreate)(unsigned long long *, size_t, const struct mem_prop *,
                            unsigned long long) = sym("cuMemCreate");
    CUresult (*cuMemRelease)(unsigned long long) = sym("cuMemRelease");
    CUresult (*cuArrayCreate)(void **, const struct array_desc *) = sym("cuArrayCreate_v2");
    CUresult (*cuArrayDestroy)(void *) = sym("cuArrayDestroy");
    CUresult (*cuMemFree)(CUdeviceptr) = sym("cuMemFree_v2");
    CUresult (*cuCtxSynchronize)(void) = sym("cuCtxSynchronize");
    CUdeviceptr p;
    size_t pitch;
    CUresult pi = cuMemAllocPitch(&p, &pitch, 1, 1, 4);
    if (pi == 0) cuMemFree(p);
    CUresult ma = cuMemAllocManaged(&p, 1, 1 /* CU_MEM_ATTACH_GLOBAL */);
    if (ma == 0) cuMemFree(p);
    CUresult as = cuMemAllocAsync(&p, 1, NULL);
    if (as == 0) cuMemFreeAsync(p, NULL);
    cuCtxSynchronize();
    /* CUmemPoolProps: type, handle types, location, win32 attributes, maxSize, usage,
     * reserved (88 bytes in all). */
    struct {
        int type, handle_types, loc_type, loc_id;
        void *win32;
        size_t max_size;
        unsigned short usage;
        unsigned char reserved[54];
    } pool_props = {1 /* pinned */, 0, 1 /* device */, 0, NULL, 0, 0, {0}};
    void *pool = NULL;
    CUresult po = cuMemPoolCreate(&pool, &pool_props);
    if (po == 0) {
        po = cuMemAllocFromPoolAsync(&p, 1, pool, NULL);
        if (po == 0) cuMemFreeAsync(p, NULL);
        cuCtxSynchronize();
        cuMemPoolDestroy(pool);
    }
    struct mem_prop prop = {1 /* pinned */, 0, 1 /* device */, 0, NULL, {0}};
    unsigned long long h;
    CUresult cr = cuMemCreate(&h, 2u << 20, &prop, 0);
    if (cr == 0) cuMemRelease(h);
    struct array_desc d = {1, 1, 0x01 /* CU_AD_FORMAT_UNSIGNED_INT8 */, 1};
    void *arr;
    CUresult ar = cuArrayCreate(&arr, &d);
    if (ar == 0) cuArrayDestroy(arr);
    snprintf(out, n, "pitch=%d managed=%d async=%d pool=%d create=%d array=%d", pi, ma, as, po,
             cr, ar);
}

/* nvmlProcessInfo_t (v2 and v3 share the layout). */
struct proc_info {
    unsigned pid;
    unsigned long long used;
    unsigned gi, ci;
};

static int nvml_proc(unsigned pid) {
    void *ml = dlopen("libnvidia-ml.so.1", RTLD_NOW);
    if (!ml) {
        printf("error=dlopen:%s\n", dlerror());
        return 1;
    }
    int (*init)(void) = dlsym(ml, "nvmlInit_v2");
    int (*by_index)(unsigned, void **) = dlsym(ml, "nvmlDeviceGetHandleByIndex_v2");
    int (*procs)(void *, unsigned *, struct proc_info *) =
        dlsym(ml, "nvmlDeviceGetComputeRunningProcesses_v3");
    if (!procs) procs = dlsym(ml, "nvmlDeviceGetComputeRunningProcesses_v2");
    if (!init || !by_index || !procs) {
        printf("error=dlsym:nvml\n");
        return 1;
    }
    void *dev;
    struct proc_info list[256];
    unsigned n = 256;
    int r = init();
    if (r == 0) r = by_index(0, &dev);
    if (r == 0) r = procs(dev, &n, list);
    if (r != 0) {
        printf("error=nvml:%d\n", r);
        return 1;
    }
    for (unsigned i = 0; i < n; i++)
        if (list[i].pid == pid) {
            printf("nvml_proc_mib=%llu\n", list[i].used >> 20);
            return 0;
        }
    printf("nvml_proc_mib=none processes=%u\n", n);
    return 0;
}

/* nvmlProcessUtilizationSample_t. */
struct util_sample {
    unsigned pid;
    unsigned long long ts;
    unsigned sm, mem, enc, dec;
};

static int nvml_util(double secs, unsigned p1, unsigned p2) {
    void *ml = dlopen("libnvidia-ml.so.1", RTLD_NOW);
    if (!ml) {
        printf("error=dlopen:%s\n", dlerror());
        return 1;
    }
    int (*init)(void) = dlsym(ml, "nvmlInit_v2");
    int (*by_index)(unsigned, void **) = dlsym(ml, "nvmlDeviceGetHandleByIndex_v2");
    int (*util)(void *, struct util_sample *, unsigned *, unsigned long long) =
        dlsym(ml, "nvmlDeviceGetProcessUtilization");
    if (!init || !by_index || !util) {
        printf("error=dlsym:nvml\n");
        return 1;
    }
    void *dev;
    int r = init();
    if (r == 0) r = by_index(0, &dev);
    if (r != 0) {
        printf("error=nvml:%d\n", r);
        return 1;
    }
    struct timespec t;
    clock_gettime(CLOCK_REALTIME, &t);
    unsigned long long last = (unsigned long long)t.tv_sec * 1000000ull + t.tv_nsec / 1000;
    double sum1 = 0, sum2 = 0, end = now_ms() + secs * 1e3;
    unsigned n1 = 0, n2 = 0;
    int err = 0;
    while (now_ms() < end) {
        sleep(1);
        struct util_sample samples[512];
        unsigned n = 512;
        r = util(dev, samples, &n, last);
        if (r != 0) {
            err = r;
            continue;
        }
        for (unsigned i = 0; i < n; i++) {
            if (samples[i].ts > last) last = samples[i].ts;
            if (samples[i].pid == p1) sum1 += samples[i].sm, n1++;
            if (samples[i].pid == p2) sum2 += samples[i].sm, n2++;
        }
    }
    if (!n1 && !n2) {
        printf("nvml_util=none error=%d\n", err);
        return 0;
    }
    printf("nvml_util1=%.1f nvml_util2=%.1f samples=%u,%u\n", n1 ? sum1 / n1 : 0.0,
           n2 ? sum2 / n2 : 0.0, n1, n2);
    return 0;
}

static int nvml(void) {
    void *ml = dlopen("libnvidia-ml.so.1", RTLD_NOW);
    if (!ml) {
        printf("error=dlopen:%s\n", dlerror());
        return 1;
    }
    struct { unsigned long long total, free, used; } mem = {0, 0, 0};
    int (*init)(void) = dlsym(ml, "nvmlInit_v2");
    int (*by_index)(unsigned, void **) = dlsym(ml, "nvmlDeviceGetHandleByIndex_v2");
    int (*info)(void *, void *) = dlsym(ml, "nvmlDeviceGetMemoryInfo");
    if (!init || !by_index || !info) {
        printf("error=dlsym:nvml\n");
        return 1;
    }
    void *dev;
    int r = init();
    if (r == 0) r = by_index(0, &dev);
    if (r == 0) r = info(dev, &mem);
    if (r != 0) {
        printf("error=nvml:%d\n", r);
        return 1;
    }
    printf("nvml_total_mib=%llu nvml_used_mib=%llu\n", mem.total >> 20, mem.used >> 20);
    return 0;
}

static int hold(size_t mib) {
    CUresult (*cuMemAlloc)(CUdeviceptr *, size_t) = sym("cuMemAlloc_v2");
    CUcontext ctx;
    CHECK(open_ctx(&ctx));
    CUdeviceptr a;
    CHECK(cuMemAlloc(&a, mib << 20));
    printf("held\n");
    fflush(stdout);
    for (;;) pause_forever();
}

static int free_info(void) {
    CUresult (*cuMemGetInfo)(size_t *, size_t *) = sym("cuMemGetInfo_v2");
    CUcontext ctx;
    CHECK(open_ctx(&ctx));
    size_t free_b = 0, total_b = 0;
    CHECK(cuMemGetInfo(&free_b, &total_b));
    printf("free_mib=%zu total_mib=%zu\n", free_b >> 20, total_b >> 20);
    return 0;
}

/* A context and the PTX's function `name`; 0 or the failing call's code. */
static CUresult load(const char *ptx_path, const char *name, CUfunction *fn) {
    CUresult (*cuModuleLoadData)(CUmodule *, const void *) = sym("cuModuleLoadData");
    CUresult (*cuModuleGetFunction)(CUfunction *, CUmodule, const char *) =
        sym("cuModuleGetFunction");
    char *ptx = read_file(ptx_path);
    if (!ptx) return 999;
    CUmodule mod;
    CUresult r = cuModuleLoadData(&mod, ptx);
    if (r == 0) r = cuModuleGetFunction(fn, mod, name);
    free(ptx);
    return r;
}

typedef CUresult (*launch_fn)(CUfunction, unsigned, unsigned, unsigned, unsigned, unsigned,
                              unsigned, unsigned, void *, void **, void **);

static int costs(const char *ptx_path) {
    CUresult (*cuMemGetInfo)(size_t *, size_t *) = sym("cuMemGetInfo_v2");
    CUresult (*cuMemAlloc)(CUdeviceptr *, size_t) = sym("cuMemAlloc_v2");
    CUresult (*cuMemFree)(CUdeviceptr) = sym("cuMemFree_v2");
    launch_fn cuLaunchKernel = (launch_fn)sym("cuLaunchKernel");
    CUresult (*cuCtxSynchronize)(void) = sym("cuCtxSynchronize");
    const int n = 1000;
    double t0 = now_ms();
    CUcontext ctx;
    CHECK(open_ctx(&ctx));
    double init_ms = now_ms() - t0;
    CUdeviceptr p;
    t0 = now_ms();
    for (int i = 0; i < n; i++) {
        CHECK(cuMemAlloc(&p, 1u << 20));
        CHECK(cuMemFree(p));
    }
    double alloc_us = (now_ms() - t0) * 1e3 / n;
    CUfunction fn;
    CHECK(load(ptx_path, "kit_fill", &fn));
    CUdeviceptr out;
    CHECK(cuMemAlloc(&out, 1024));
    unsigned nn = 256;
    void *params[] = {&out, &nn};
    CHECK(cuCtxSynchronize());
    t0 = now_ms();
    for (int i = 0; i < n; i++) CHECK(cuLaunchKernel(fn, 1, 1, 1, 256, 1, 1, 0, NULL, params, NULL));
    double launch_us = (now_ms() - t0) * 1e3 / n;
    CHECK(cuCtxSynchronize());
    size_t f, t;
    t0 = now_ms();
    for (int i = 0; i < n; i++) CHECK(cuMemGetInfo(&f, &t));
    double info_us = (now_ms() - t0) * 1e3 / n;
    printf("init_ctx_ms=%.1f alloc_free_us=%.2f launch_us=%.2f meminfo_us=%.2f\n", init_ms,
           alloc_us, launch_us, info_us);
    return 0;
}

static int busy(double secs, const char *ptx_path) {
    CUresult (*cuMemAlloc)(CUdeviceptr *, size_t) = sym("cuMemAlloc_v2");
    launch_fn cuLaunchKernel = (launch_fn)sym("cuLaunchKernel");
    CUresult (*cuCtxSynchronize)(void) = sym("cuCtxSynchronize");
    CUcontext ctx;
    CHECK(open_ctx(&ctx));
    CUfunction fn;
    CHECK(load(ptx_path, "kit_spin", &fn));
    const unsigned blocks = 1056, threads = 256;
    CUdeviceptr out;
    CHECK(cuMemAlloc(&out, (size_t)blocks * threads * 4));
    unsigned iters = 200000;
    void *params[] = {&out, &iters};
    unsigned long launches = 0;
    double t0 = now_ms(), end = t0 + secs * 1e3;
    while (now_ms() < end) {
        CHECK(cuLaunchKernel(fn, blocks, 1, 1, threads, 1, 1, 0, NULL, params, NULL));
        CHECK(cuCtxSynchronize());
        launches++;
    }
    double took = now_ms() - t0;
    printf("launches=%lu secs=%.2f ms_per_launch=%.3f\n", launches, took / 1e3,
           launches ? took / launches : 0.0);
    return 0;
}

int main(int argc, char **argv) {
    const char *mode = argc > 1 ? argv[1] : "";
    int ok = (argc == 3 && (!strcmp(mode, "kernel") || !strcmp(mode, "hold") ||
                            !strcmp(mode, "costs") || !strcmp(mode, "nvml-proc"))) ||
             (argc == 4 && !strcmp(mode, "busy")) || (argc == 5 && !strcmp(mode, "nvml-util")) ||
             (argc == 2 && (!strcmp(mode, "budget") || !strcmp(mode, "free") ||
                            !strcmp(mode, "nvml")));
    if (!ok) {
        fprintf(stderr,
                "usage: %s kernel PTXFILE | budget | hold MIB | free | nvml | nvml-proc PID | "
                "nvml-util SECS PID1 PID2 | "
                "costs PTXFILE | "
                "busy SECS PTXFILE\n",
                argv[0]);
        return 2;
    }
    if (!strcmp(mode, "nvml")) return nvml();
    if (!strcmp(mode, "nvml-proc")) return nvml_proc((unsigned)atoi(argv[2]));
    if (!strcmp(mode, "nvml-util"))
        return nvml_util(atof(argv[2]), (unsigned)atoi(argv[3]), (unsigned)atoi(argv[4]));
    lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_GLOBAL);
    if (!lib) {
        printf("error=dlopen:%s\n", dlerror());
        return 1;
    }
    if (!strcmp(mode, "kernel")) return kernel(argv[2]);
    if (!strcmp(mode, "hold")) return hold(strtoull(argv[2], NULL, 10));
    if (!strcmp(mode, "budget")) return budget();
    if (!strcmp(mode, "costs")) return costs(argv[2]);
    if (!strcmp(mode, "busy")) return busy(atof(argv[2]), argv[3]);
    return free_info();
}
