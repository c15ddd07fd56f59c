/* rtld_next_main.c: prints what getenv returns through rtld_next_shim.c. */
#include <stdio.h>
#include <stdlib.h>

int main(void) {
    const char *probe = getenv("SHIM_PROBE");
    const char *path = getenv("RTLD_NEXT_TEST");
    printf("%s %s\n", probe ? probe : "null", path ? path : "null");
    return 0;
}
