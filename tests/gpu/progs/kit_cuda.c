/*
 * kit_cuda: the GPU acceptance kit's CUDA program (tests/gpu/run.sh). It dlopens the
 * libcuda.so.1 the dynamic linker finds (the real driver's, or under --simulated the
 * fake one), so it needs no CUDA toolkit, and prints one line of `key=value` figures.
 *
 *   kit_cuda kernel PTXFILE   cuInit + context (timed), cuMemGetInfo, the PTX's
 *                             kit_fill over 1 Mi ints, and how many values are right
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

int main(int argc, char **argv) {
    if (argc != 3 || strcmp(argv[1], "kernel") != 0) {
        fprintf(stderr, "usage: %s kernel PTXFILE\n", argv[0]);
        return 2;
    }
    lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_GLOBAL);
    if (!lib) {
        printf("error=dlopen:%s\n", dlerror());
        return 1;
    }
    return kernel(argv[2]);
}
