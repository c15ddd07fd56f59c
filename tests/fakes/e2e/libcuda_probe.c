/* A stand-in libcuda.so.1 for the container-runtime tests: proves that the library
 * mounted by the CDI spec is the one a program linked with -lcuda loads (no
 * LD_LIBRARY_PATH). It reports where it was loaded from; it allocates nothing. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdio.h>

typedef int CUresult;

CUresult cuInit(unsigned flags) { (void)flags; return 0; }

CUresult cuDriverGetVersion(int *v) { if (!v) return 1; *v = 13000; return 0; }

/* Where the dynamic loader found this library. */
const char *tessera_probe_origin(void) {
    Dl_info info;
    if (dladdr((void *)cuInit, &info) && info.dli_fname) return info.dli_fname;
    return "?";
}
