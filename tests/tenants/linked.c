/* `linked <bytes>`: linked against libcuda.so.1 (no dlsym, no cuGetProcAddress):
 * cuInit and the primary context of device 0 (a line), then cuMemAlloc_v2 of <bytes>
 * (a line: `ok` or `err <code>`). Built and run by tests/runtimes/podman.rs. */
#include <stdio.h>
#include <stdlib.h>
#include <stddef.h>
typedef int CUresult;
typedef unsigned long long CUdeviceptr;
CUresult cuInit(unsigned);
CUresult cuDevicePrimaryCtxRetain(void **, int);
CUresult cuCtxSetCurrent(void *);
CUresult cuMemAlloc_v2(CUdeviceptr *, size_t);
static void say(CUresult rc) { if (rc) printf("err %d\n", rc); else printf("ok\n"); }
int main(int argc, char **argv) {
    void *ctx = NULL;
    CUdeviceptr p;
    CUresult rc = cuInit(0);
    if (!rc) rc = cuDevicePrimaryCtxRetain(&ctx, 0);
    if (!rc) rc = cuCtxSetCurrent(ctx);
    say(rc);
    if (argc > 1) say(cuMemAlloc_v2(&p, strtoull(argv[1], NULL, 10)));
    return 0;
}
