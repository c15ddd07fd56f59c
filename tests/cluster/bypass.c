/* tests/cluster: a tenant that gets around the interception library with code of its
 * own (docs/security.md, threat model: the watchdog's job). Linked statically with the
 * fake driver (cuda/tests/fakes/fake_cuda.c) inside it, it has no ld.so, so neither
 * /etc/ld.so.preload's front nor the soname shims ever load: it talks to the "GPU" as
 * a program making raw ioctls on the device nodes would, and only the driver's own
 * ledger (what NVML reports) sees its memory. It allocates BYTES on device 0 and holds
 * them until killed.
 * Usage: bypass BYTES   prints "ok" (context), "ok BYTES" or "err N", then "holding". */
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

/* The fake driver's entry points (the CUDA driver API's), linked in. */
struct ctx;
int cuInit(unsigned flags);
int cuDevicePrimaryCtxRetain(struct ctx **c, int dev);
int cuCtxSetCurrent(struct ctx *c);
int cuMemAlloc_v2(unsigned long long *p, size_t bytes);

int main(int argc, char **argv) {
    if (argc != 2) {
        fprintf(stderr, "usage: bypass BYTES\n");
        return 2;
    }
    struct ctx *c = NULL;
    int rc = cuInit(0);
    if (!rc) rc = cuDevicePrimaryCtxRetain(&c, 0);
    if (!rc) rc = cuCtxSetCurrent(c);
    if (rc) {
        printf("err %d\n", rc);
        return 4;
    }
    printf("ok\n");
    unsigned long long p;
    size_t bytes = strtoull(argv[1], NULL, 10);
    rc = cuMemAlloc_v2(&p, bytes);
    if (rc) {
        printf("err %d\n", rc);
        return 4;
    }
    printf("ok %zu\nholding\n", bytes);
    fflush(stdout);
    for (;;)
        pause();
}
