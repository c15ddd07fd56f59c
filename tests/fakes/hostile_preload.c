/*
 * hostile_preload.c: a tenant's own preload library that gets past the interception
 * library's memory wall (tests/plugin/watchdog.rs). Preloaded ahead of libtessera_cuda.so,
 * it rebinds cuMemAlloc_v2 straight to the driver, found with dlopen("libcuda.so.1")
 * and glibc's own dlsym (taken from libc.so.6 with dlvsym, since the interception
 * library's exported dlsym would swap the name for its hook):
 *   - its exported cuMemAlloc_v2 (for clients linked against libcuda);
 *   - dlsym(handle, "cuMemAlloc_v2") (clients that dlopen the driver);
 *   - cuGetProcAddress / cuGetProcAddress_v2 answers for "cuMemAlloc" (cudart and
 *     cuda-bindings).
 * Every other lookup goes on to the next dlsym in the search order (the interception
 * library's), so the rest of the process stays intercepted.
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stddef.h>
#include <stdio.h>
#include <string.h>

typedef int CUresult;
typedef unsigned long long CUdeviceptr;
typedef unsigned long long u64;
typedef void *(*dlsym_fn)(void *, const char *);
typedef CUresult (*alloc_fn)(CUdeviceptr *, size_t);
typedef CUresult (*gpa_fn)(const char *, void **, int, u64);
typedef CUresult (*gpa2_fn)(const char *, void **, int, u64, int *);

/* glibc's dlsym, never an interposer's. */
static dlsym_fn libc_dlsym(void) {
    static dlsym_fn f;
    if (f == NULL) {
        void *libc = dlopen("libc.so.6", RTLD_NOW | RTLD_NOLOAD);
        if (libc != NULL) {
            f = (dlsym_fn)dlvsym(libc, "dlsym", "GLIBC_2.34");
            if (f == NULL)
                f = (dlsym_fn)dlvsym(libc, "dlsym", "GLIBC_2.2.5");
        }
        if (f == NULL)
            fprintf(stderr, "hostile: no glibc dlsym\n");
    }
    return f;
}

/* The next dlsym after this library: the interception library's. */
static dlsym_fn next_dlsym(void) {
    static dlsym_fn f;
    if (f == NULL && libc_dlsym() != NULL)
        f = (dlsym_fn)libc_dlsym()(RTLD_NEXT, "dlsym");
    return f;
}

static void *driver(void) {
    static void *h;
    if (h == NULL)
        h = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
    return h;
}

/* The driver's own cuMemAlloc_v2. */
static alloc_fn real_alloc(void) {
    static alloc_fn f;
    if (f == NULL && driver() != NULL && libc_dlsym() != NULL)
        f = (alloc_fn)libc_dlsym()(driver(), "cuMemAlloc_v2");
    return f;
}

CUresult cuMemAlloc_v2(CUdeviceptr *dptr, size_t bytes) {
    alloc_fn f = real_alloc();
    return f != NULL ? f(dptr, bytes) : 999; /* CUDA_ERROR_UNKNOWN */
}

static int is_alloc(const char *symbol) {
    return symbol != NULL && strcmp(symbol, "cuMemAlloc") == 0;
}

CUresult cuGetProcAddress_v2(const char *symbol, void **pfn, int version, u64 flags,
                             int *status) {
    dlsym_fn next = next_dlsym();
    gpa2_fn f = next != NULL && driver() != NULL
                    ? (gpa2_fn)next(driver(), "cuGetProcAddress_v2")
                    : NULL;
    if (f == NULL)
        return 999;
    CUresult rc = f(symbol, pfn, version, flags, status);
    if (rc == 0 && pfn != NULL && is_alloc(symbol) && version >= 3020 && real_alloc() != NULL)
        *pfn = (void *)real_alloc();
    return rc;
}

CUresult cuGetProcAddress(const char *symbol, void **pfn, int version, u64 flags) {
    dlsym_fn next = next_dlsym();
    gpa_fn f = next != NULL && driver() != NULL
                   ? (gpa_fn)next(driver(), "cuGetProcAddress")
                   : NULL;
    if (f == NULL)
        return 999;
    CUresult rc = f(symbol, pfn, version, flags);
    if (rc == 0 && pfn != NULL && is_alloc(symbol) && version >= 3020 && real_alloc() != NULL)
        *pfn = (void *)real_alloc();
    return rc;
}

void *dlsym(void *handle, const char *name) {
    if (handle != RTLD_NEXT) {
        if (strcmp(name, "cuMemAlloc_v2") == 0)
            return (void *)cuMemAlloc_v2;
        if (strcmp(name, "cuGetProcAddress_v2") == 0)
            return (void *)cuGetProcAddress_v2;
        if (strcmp(name, "cuGetProcAddress") == 0)
            return (void *)cuGetProcAddress;
    }
    dlsym_fn next = handle == RTLD_NEXT ? libc_dlsym() : next_dlsym();
    return next != NULL ? next(handle, name) : NULL;
}
