/* An LD_AUDIT module that answers ld.so's search for libcuda.so.1 with the real
 * driver file. Built and run by tests/runtimes/podman.rs. */
#define _GNU_SOURCE
#include <link.h>
#include <string.h>
unsigned int la_version(unsigned int v) { (void)v; return LAV_CURRENT; }
char *la_objsearch(const char *name, uintptr_t *cookie, unsigned int flag) {
    (void)cookie; (void)flag;
    if (strcmp(name, "libcuda.so.1") == 0) return "/usr/local/tessera/driver/libcuda.real";
    return (char *)name;
}
