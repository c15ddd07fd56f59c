/* `tenant path|dlmopen <driver file> <bytes>`: opens the driver file with dlopen (or
 * into a new link-map namespace with dlmopen), then cuInit, the primary context and
 * cuMemAlloc_v2 through dlsym (a line each). Built and run by tests/runtimes/podman.rs. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
typedef int (*init_t)(unsigned);
typedef int (*retain_t)(void **, int);
typedef int (*set_t)(void *);
typedef int (*alloc_t)(unsigned long long *, size_t);
static void say(int rc) { if (rc) printf("err %d\n", rc); else printf("ok\n"); }
int main(int argc, char **argv) {
    if (argc < 4) return 2;
    void *h = strcmp(argv[1], "dlmopen") == 0
        ? dlmopen(LM_ID_NEWLM, argv[2], RTLD_NOW | RTLD_LOCAL)
        : dlopen(argv[2], RTLD_NOW | RTLD_LOCAL);
    if (!h) { printf("err dlopen %s\n", dlerror()); return 3; }
    init_t init = (init_t)dlsym(h, "cuInit");
    retain_t retain = (retain_t)dlsym(h, "cuDevicePrimaryCtxRetain");
    set_t set = (set_t)dlsym(h, "cuCtxSetCurrent");
    alloc_t alloc = (alloc_t)dlsym(h, "cuMemAlloc_v2");
    void *ctx = NULL;
    unsigned long long p;
    int rc = init(0);
    if (!rc) rc = retain(&ctx, 0);
    if (!rc) rc = set(ctx);
    say(rc);
    say(alloc(&p, strtoull(argv[3], NULL, 10)));
    return 0;
}
