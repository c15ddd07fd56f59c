/* The tenant's own library defining dlsym, to preload. Built and run by
 * tests/runtimes/podman.rs. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stddef.h>
/* A tenant's own dlsym, preloaded: every lookup answered by glibc's dlsym, past any
 * interposer of dlsym. */
void *dlsym(void *handle, const char *name) {
    static void *(*glibc)(void *, const char *);
    if (!glibc) glibc = (void *(*)(void *, const char *))dlvsym(RTLD_NEXT, "dlsym", "GLIBC_2.34");
    if (!glibc) glibc = (void *(*)(void *, const char *))dlvsym(RTLD_NEXT, "dlsym", "GLIBC_2.2.5");
    return glibc ? glibc(handle, name) : NULL;
}
