/*
 * rtld_next_shim.c: a library that interposes getenv and finds the real one with
 * dlsym(RTLD_NEXT), as many tracing and compatibility shims do. Linked as a
 * dependency of rtld_next_main.c, it is loaded *after* the preloaded interception
 * library, so if that library's dlsym resolved RTLD_NEXT relative to itself, the
 * shim would get its own getenv back and recurse until the stack overflows.
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <string.h>

char *getenv(const char *name) {
    static char *(*real)(const char *);
    if (!real) real = (char *(*)(const char *))dlsym(RTLD_NEXT, "getenv");
    if (!real) return NULL;
    if (real == getenv) return NULL; /* would recurse: report "not found" */
    return strcmp(name, "SHIM_PROBE") == 0 ? "via-shim" : real(name);
}
