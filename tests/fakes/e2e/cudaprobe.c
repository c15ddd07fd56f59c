/* Linked with -lcuda and run in a container with no LD_LIBRARY_PATH: prints
 * KEY=VALUE lines a test greps. */
#include <stdio.h>

typedef int CUresult;
CUresult cuInit(unsigned);
CUresult cuDriverGetVersion(int *);
const char *tessera_probe_origin(void);

int main(void) {
    int v = 0;
    printf("cuInit=%d\n", cuInit(0));
    printf("cuDriverGetVersion=%d VERSION=%d\n", cuDriverGetVersion(&v), v);
    printf("LIBCUDA=%s\n", tessera_probe_origin());
    return 0;
}
