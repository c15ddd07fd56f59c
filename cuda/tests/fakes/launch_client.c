/*
 * launch_client.c: a CUDA client for the compute-rate tests (tests/throttle.rs). It
 * loads the driver as cuda-bindings does (dlopen("libcuda.so.1", RTLD_LOCAL) and
 * cuGetProcAddress_v2, or dlsym by exact name in mode "dlsym"), and launches kernels
 * through each launch entry point. Kernels are dummy handles: the fake driver runs
 * none.
 *
 * Usage: launch_client <mode> <command>...   one result line per command on stdout:
 *   ctx <dev>                    cuInit + primary context of <dev>, made current
 *   has <base> <version> <flags> -> "yes <symbol address>" | "no"
 *   launch <entry> <n> <blocks>  n launches of <blocks> thread blocks (a 1-D grid,
 *                                split as <blocks>/4 x 2 x 2 when divisible by 4)
 *                                -> "ok <start ns> <end ns> <errors>" (CLOCK_MONOTONIC)
 *       entry: kernel | kernel_ptsz (cuGetProcAddress flag 2) | ex | ex_ptsz | coop |
 *              coop_ptsz | multi (cuLaunchCooperativeKernelMultiDevice on devices 0
 *              and 1, one stream each: <blocks> per device) | graph<K> (a graph of K
 *              kernel nodes of <blocks> each, instantiated once, launched n times)
 *   threads <t> <n> <blocks>     t threads at once, each with device 0's context and n
 *                                cuLaunchKernel -> "ok <start ns> <end ns> <errors>"
 *   fork <n> <blocks>            fork; the child makes n cuLaunchKernel and exits
 *                                (exit(3)); the parent waits -> "ok <child status>"
 *   spin <blocks>                launches <blocks> forever; prints "spinning" first
 *   nosys <n> <blocks>           in a new thread: device 0's primary context made
 *                                current, 10 launches, then a seccomp filter under
 *                                which any system call but exit(2) kills the process
 *                                (SIGSYS), then n cuLaunchKernel, then exit(2) of the
 *                                thread -> "ok <errors>"
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <linux/filter.h>
#include <linux/seccomp.h>
#include <pthread.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

typedef int CUresult;
typedef unsigned long long u64;
typedef CUresult (*gpa2_t)(const char *, void **, int, u64, int *);
typedef CUresult (*launch_t)(void *, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned,
                             unsigned, void *, void **, void **);
typedef CUresult (*coop_t)(void *, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned,
                           unsigned, void *, void **);

/* CUlaunchConfig */
struct launch_config {
    unsigned grid[3], block[3], shmem;
    void *stream;
    void *attrs;
    unsigned nattrs;
};
typedef CUresult (*launch_ex_t)(const struct launch_config *, void *, void **, void **);

/* CUDA_LAUNCH_PARAMS_v1 */
struct launch_params {
    void *function;
    unsigned grid[3], block[3], shmem;
    void *stream;
    void **params;
};

/* CUDA_KERNEL_NODE_PARAMS_v2 (v1 is its first 56 bytes) */
struct kernel_node_params {
    void *func;
    unsigned grid[3], block[3], shmem;
    void **params, **extra;
    void *kern, *ctx;
};

static void *lib;
static gpa2_t gpa;
static const char *mode = "gpa";
static void *const KERNEL = (void *)0x6b65726eULL;

static void *lookup(const char *base, int ver, u64 flags, const char *exact) {
    void *p = NULL;
    if (strcmp(mode, "dlsym") == 0) p = dlsym(lib, exact);
    else gpa(base, &p, ver, flags, NULL);
    return p;
}

static void *get(const char *base, int ver, u64 flags, const char *exact) {
    void *p = lookup(base, ver, flags, exact);
    if (!p) { fprintf(stderr, "launch_client: no %s\n", exact); exit(3); }
    return p;
}

static u64 now_ns(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (u64)t.tv_sec * 1000000000ULL + (u64)t.tv_nsec;
}

static void grid_of(unsigned blocks, unsigned g[3]) {
    if (blocks >= 4 && blocks % 4 == 0) { g[0] = blocks / 4; g[1] = 2; g[2] = 2; }
    else { g[0] = blocks; g[1] = 1; g[2] = 1; }
}

static void ctx(int dev) {
    CUresult (*init)(unsigned) = get("cuInit", 2000, 0, "cuInit");
    CUresult (*retain)(void **, int) = get("cuDevicePrimaryCtxRetain", 7000, 0, "cuDevicePrimaryCtxRetain");
    CUresult (*setc)(void *) = get("cuCtxSetCurrent", 4000, 0, "cuCtxSetCurrent");
    void *c = NULL;
    CUresult rc = init(0);
    if (!rc) rc = retain(&c, dev);
    if (!rc) rc = setc(c);
    if (rc) { printf("err %d\n", rc); exit(4); }
}

/* n launches through one entry point; returns the number of failed launches */
static long run(const char *entry, long n, unsigned blocks) {
    unsigned g[3];
    long errors = 0;
    grid_of(blocks, g);
    if (!strcmp(entry, "kernel") || !strcmp(entry, "kernel_ptsz")) {
        int pt = !strcmp(entry, "kernel_ptsz");
        launch_t f = get("cuLaunchKernel", 12000, pt ? 2 : 0, pt ? "cuLaunchKernel_ptsz" : "cuLaunchKernel");
        for (long i = 0; i < n; i++)
            errors += f(KERNEL, g[0], g[1], g[2], 32, 1, 1, 0, NULL, NULL, NULL) != 0;
    } else if (!strcmp(entry, "ex") || !strcmp(entry, "ex_ptsz")) {
        int pt = !strcmp(entry, "ex_ptsz");
        launch_ex_t f = get("cuLaunchKernelEx", 12000, pt ? 2 : 0, pt ? "cuLaunchKernelEx_ptsz" : "cuLaunchKernelEx");
        struct launch_config cfg;
        memset(&cfg, 0, sizeof cfg);
        memcpy(cfg.grid, g, sizeof g);
        cfg.block[0] = 32; cfg.block[1] = 1; cfg.block[2] = 1;
        for (long i = 0; i < n; i++) errors += f(&cfg, KERNEL, NULL, NULL) != 0;
    } else if (!strcmp(entry, "coop") || !strcmp(entry, "coop_ptsz")) {
        int pt = !strcmp(entry, "coop_ptsz");
        coop_t f = get("cuLaunchCooperativeKernel", 12000, pt ? 2 : 0,
                       pt ? "cuLaunchCooperativeKernel_ptsz" : "cuLaunchCooperativeKernel");
        for (long i = 0; i < n; i++)
            errors += f(KERNEL, g[0], g[1], g[2], 32, 1, 1, 0, NULL, NULL) != 0;
    } else if (!strcmp(entry, "multi")) {
        CUresult (*mk)(void **, unsigned) = get("cuStreamCreate", 2000, 0, "cuStreamCreate");
        CUresult (*multi)(struct launch_params *, unsigned, unsigned) =
            get("cuLaunchCooperativeKernelMultiDevice", 9000, 0, "cuLaunchCooperativeKernelMultiDevice");
        struct launch_params lp[2];
        memset(lp, 0, sizeof lp);
        for (int d = 1; d >= 0; d--) {
            ctx(d);
            if (mk(&lp[d].stream, 0)) { printf("err stream\n"); exit(4); }
            lp[d].function = KERNEL;
            memcpy(lp[d].grid, g, sizeof g);
            lp[d].block[0] = 32; lp[d].block[1] = 1; lp[d].block[2] = 1;
        }
        /* device 0's context is current */
        for (long i = 0; i < n; i++) errors += multi(lp, 2, 0) != 0;
    } else if (!strncmp(entry, "graph", 5)) {
        int k = atoi(entry + 5);
        CUresult (*mk)(void **, unsigned) = get("cuGraphCreate", 10000, 0, "cuGraphCreate");
        CUresult (*add)(void **, void *, void **, size_t, const struct kernel_node_params *) =
            get("cuGraphAddKernelNode", 12000, 0, "cuGraphAddKernelNode_v2");
        CUresult (*inst)(void **, void *, u64) = get("cuGraphInstantiateWithFlags", 11040, 0, "cuGraphInstantiateWithFlags");
        CUresult (*glaunch)(void *, void *) = get("cuGraphLaunch", 10000, 0, "cuGraphLaunch");
        void *graph = NULL, *exec = NULL, *prev = NULL;
        struct kernel_node_params p;
        memset(&p, 0, sizeof p);
        p.func = KERNEL;
        memcpy(p.grid, g, sizeof g);
        p.block[0] = 32; p.block[1] = 1; p.block[2] = 1;
        if (mk(&graph, 0)) { printf("err graph\n"); exit(4); }
        for (int j = 0; j < k; j++) {
            void *node = NULL;
            if (add(&node, graph, prev ? &prev : NULL, prev ? 1 : 0, &p)) { printf("err node\n"); exit(4); }
            prev = node;
        }
        if (inst(&exec, graph, 0)) { printf("err instantiate\n"); exit(4); }
        for (long i = 0; i < n; i++) errors += glaunch(exec, NULL) != 0;
    } else {
        fprintf(stderr, "launch_client: unknown entry %s\n", entry);
        exit(2);
    }
    return errors;
}

static long threads_n;
static unsigned threads_blocks;

static void *launcher(void *arg) {
    launch_t f = get("cuLaunchKernel", 12000, 0, "cuLaunchKernel");
    long errors = 0;
    ctx(0);
    for (long i = 0; i < threads_n; i++)
        errors += f(KERNEL, threads_blocks, 1, 1, 32, 1, 1, 0, NULL, NULL, NULL) != 0;
    *(long *)arg = errors;
    return NULL;
}

static long nosys_n;
static unsigned nosys_blocks;
static volatile long nosys_errors = -1;

static void *nosys_thread(void *arg) {
    (void)arg;
    launch_t f = get("cuLaunchKernel", 12000, 0, "cuLaunchKernel");
    long errors = 0;
    ctx(0); /* the context is current per thread */
    /* Warm-up: the thread's first launch registers its counters (may allocate). */
    for (int i = 0; i < 10; i++) errors += f(KERNEL, nosys_blocks, 1, 1, 32, 1, 1, 0, NULL, NULL, NULL) != 0;
    /* Not strict mode: on x86 it also disables the TSC, which the vDSO's clock reads. */
    struct sock_filter filter[] = {
        BPF_STMT(BPF_LD | BPF_W | BPF_ABS, offsetof(struct seccomp_data, nr)),
        BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, SYS_exit, 0, 1),
        BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ALLOW),
        BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_KILL_PROCESS),
    };
    struct sock_fprog prog = {(unsigned short)(sizeof filter / sizeof filter[0]), filter};
    if (prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0 ||
        prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, &prog, 0, 0) != 0) {
        nosys_errors = -2;
        return NULL;
    }
    for (long i = 0; i < nosys_n; i++)
        errors += f(KERNEL, nosys_blocks, 1, 1, 32, 1, 1, 0, NULL, NULL, NULL) != 0;
    nosys_errors = errors;
    /* exit(2) of this thread only: the one call the filter allows. */
    syscall(SYS_exit, 0);
    return NULL;
}

int main(int argc, char **argv) {
    if (argc < 2) return 2;
    mode = argv[1];
    lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
    if (!lib) { fprintf(stderr, "launch_client: %s\n", dlerror()); return 3; }
    gpa = (gpa2_t)dlsym(lib, "cuGetProcAddress_v2");
    if (!gpa) return 3;
    setvbuf(stdout, NULL, _IOLBF, 0);
    for (int i = 2; i < argc; i++) {
        const char *c = argv[i];
        if (!strcmp(c, "ctx")) {
            ctx(atoi(argv[i + 1]));
            printf("ok\n");
            i += 1;
        } else if (!strcmp(c, "has")) {
            void *p = lookup(argv[i + 1], atoi(argv[i + 2]), strtoull(argv[i + 3], NULL, 0), argv[i + 1]);
            if (p) printf("yes %p\n", p); else printf("no\n");
            i += 3;
        } else if (!strcmp(c, "launch")) {
            long n = atol(argv[i + 2]);
            unsigned blocks = (unsigned)atol(argv[i + 3]);
            u64 t0 = now_ns();
            long errors = run(argv[i + 1], n, blocks);
            u64 t1 = now_ns();
            printf("ok %llu %llu %ld\n", t0, t1, errors);
            i += 3;
        } else if (!strcmp(c, "threads")) {
            int t = atoi(argv[i + 1]);
            pthread_t tid[64];
            long errs[64];
            long errors = 0;
            if (t < 1 || t > 64) return 2;
            threads_n = atol(argv[i + 2]);
            threads_blocks = (unsigned)atol(argv[i + 3]);
            u64 t0 = now_ns();
            for (int k = 0; k < t; k++)
                if (pthread_create(&tid[k], NULL, launcher, &errs[k])) return 5;
            for (int k = 0; k < t; k++) { pthread_join(tid[k], NULL); errors += errs[k]; }
            u64 t1 = now_ns();
            printf("ok %llu %llu %ld\n", t0, t1, errors);
            i += 3;
        } else if (!strcmp(c, "fork")) {
            launch_t f = get("cuLaunchKernel", 12000, 0, "cuLaunchKernel");
            long n = atol(argv[i + 1]);
            unsigned blocks = (unsigned)atol(argv[i + 2]);
            fflush(stdout);
            pid_t pid = fork();
            if (pid == 0) {
                long errors = 0;
                for (long k = 0; k < n; k++) errors += f(KERNEL, blocks, 1, 1, 32, 1, 1, 0, NULL, NULL, NULL) != 0;
                exit(errors ? 1 : 0);
            }
            int st = -1;
            waitpid(pid, &st, 0);
            printf("ok %d\n", st);
            i += 2;
        } else if (!strcmp(c, "spin")) {
            launch_t f = get("cuLaunchKernel", 12000, 0, "cuLaunchKernel");
            unsigned blocks = (unsigned)atol(argv[i + 1]);
            printf("spinning\n");
            for (;;) f(KERNEL, blocks, 1, 1, 32, 1, 1, 0, NULL, NULL, NULL);
        } else if (!strcmp(c, "nosys")) {
            pthread_t t;
            nosys_n = atol(argv[i + 1]);
            nosys_blocks = (unsigned)atol(argv[i + 2]);
            if (pthread_create(&t, NULL, nosys_thread, NULL)) return 5;
            pthread_join(t, NULL);
            if (nosys_errors == -2) printf("err seccomp\n");
            else printf("ok %ld\n", nosys_errors);
            i += 2;
        } else {
            fprintf(stderr, "launch_client: unknown command %s\n", c);
            return 2;
        }
    }
    return 0;
}
