/*
 * fakesim.h: the simulated GPU shared by the fake libcuda (fake_cuda.c) and the fake
 * NVML (tests/fakes/fake_nvml.c, which includes this file by relative path). Header
 * only: every function is static inline, so each fake carries its own copy and no
 * symbol is exported.
 *
 * The model (issue #9, "Simulated GPU for the tests"; fixed so that the compute
 * controller cannot be tuned to a simulator of our own choosing):
 *   - One kernel runs at a time on the whole GPU, across all processes (time-slicing
 *     between contexts, no MPS).
 *   - A process's kernels on one GPU run FIFO (all its streams share one FIFO, so each
 *     stream is FIFO too). Between processes with pending kernels the GPU switches
 *     round-robin at kernel boundaries: after a kernel of process record i, the next
 *     kernel is the head of the first record after i (cyclically) with work pending.
 *   - A kernel occupies the GPU for blocks x FAKE_SIM_BLOCK_NS (default 1000 ns).
 *   - Arbitration lives in one file shared by all processes (FAKE_CUDA_SIM) under one
 *     lock, so the timeline is the GPU's, not each process's.
 *
 * Lazy exact simulation: nothing runs in the background. Every entry point that
 * touches the simulation (a launch, a synchronisation, an NVML query) takes the lock
 * and calls fakesim_advance(now): it completes the running kernel if it ended by
 * `now`, credits its busy time, appends the interval to the timeline log, starts the
 * next kernel in round-robin order at the previous one's end, and repeats. A kernel
 * launched on an idle GPU starts at its launch time. On the way it records, for
 * every process record and for the GPU, the cumulative busy time at every tick
 * (tick k = CLOCK_MONOTONIC k/6 s, i.e. every 1/6 s), computing the exact partial
 * busy of the kernel running at the tick instant. Time is CLOCK_MONOTONIC in ns.
 *
 * Processes: a process claims one record per GPU at its first launch there, by
 * taking an OFD write lock on the record's byte range (released by the kernel when
 * the process dies, SIGKILL included). A record whose lock is free belongs to a dead
 * process: its pending kernels are discarded when its turn comes (the kernel running
 * when it died completes), and the record may be claimed again. A full queue (256
 * pending kernels) makes the launch wait, as real CUDA blocks when its launch queue
 * is full.
 *
 * Lock: flock(LOCK_EX) on the state file (per open file description, so each process
 * opens the file itself), plus a process-local mutex for threads sharing that
 * description. Both die with the process. Nobody sleeps holding them.
 *
 * State file layout (FAKE_CUDA_SIM; created and sized by the first opener with
 * ftruncate, so zero-filled; native little-endian x86-64 layout, see the structs):
 *   0       struct fakesim_header (4096 bytes): magic "FAKESIM1", version 1, device
 *           count, file size, sizeof(struct fakesim_gpu), the timeline log path, and
 *           the GPU UUIDs in FAKE_CUDA_DEVICES order (the simulator's device index is
 *           the device's position there, independent of CUDA_VISIBLE_DEVICES).
 *   4096    struct fakesim_gpu[8], each: running kernel (record, start, end), round-
 *           robin cursor, cumulative busy, tick bookkeeping, a ring of GPU busy
 *           snapshots, and 64 struct fakesim_proc records: pid (getpid()), tag
 *           (FAKE_SIM_TAG), FIFO of pending kernel durations (256, ns), cumulative
 *           busy, kernels and blocks launched, and a ring of busy snapshots at ticks.
 *   Size: FAKESIM_FILE_SIZE = 4096 + 8 * 153984 = 1235968 bytes.
 *
 * Timeline log (path in FAKE_CUDA_SIM_LOG of the first process that opens the state
 * file; stored in the header, so every process, NVML included, appends to the same
 * log): append-only binary records of 32 bytes, little-endian, written under the
 * lock in completion order (per GPU, in start order too):
 *   u32 gpu index, u32 pid, u32 tag, u32 pad (0), u64 start_ns, u64 end_ns
 * with [start_ns, end_ns) in CLOCK_MONOTONIC ns. Parsed by testkit/src/interpose/timeline.rs.
 *
 * Utilisation samples (for the fake NVML): busy over the 1 s before tick k =
 * snapshot(k) - snapshot(k - 6); a record (or GPU) that did not exist at tick k - 6
 * had 0 busy then.
 */
#ifndef FAKESIM_H
#define FAKESIM_H

#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#if !defined(F_OFD_GETLK) || !defined(F_OFD_SETLK)
#error "fakesim.h needs F_OFD_GETLK/F_OFD_SETLK: define _GNU_SOURCE before any include"
#endif

#define FAKESIM_MAGIC "FAKESIM1"
#define FAKESIM_VERSION 1u
#define FAKESIM_MAXDEV 8
#define FAKESIM_PROCS 64
#define FAKESIM_QUEUE 256
#define FAKESIM_RING 16
#define FAKESIM_WINDOW_TICKS 6 /* 1 s = 6 ticks of 1/6 s */
#define FAKESIM_HEADER_SIZE 4096
#define FAKESIM_LOG_PATH 512
#define FAKESIM_UUID 64

enum { FAKESIM_FREE = 0, FAKESIM_LIVE = 1, FAKESIM_DEAD = 2 };

/* Cumulative busy ns at the instant of tick `tick`. */
struct fakesim_snap {
    uint64_t tick;
    uint64_t busy;
};

/* One process on one GPU (2400 bytes; the OFD lock covers exactly this range). */
struct fakesim_proc {
    uint32_t pid;
    uint32_t tag;
    uint32_t state; /* FAKESIM_FREE / LIVE / DEAD (found dead, queue discarded) */
    uint32_t pad;
    uint64_t head, tail;   /* pending kernels: queue[head % Q .. tail % Q); the head runs first */
    uint64_t busy_ns;      /* completed kernels' busy time */
    uint64_t launched;     /* kernels enqueued */
    uint64_t blocks;       /* blocks enqueued */
    uint64_t join_tick;    /* last tick before the record was claimed */
    uint64_t reserved[4];
    struct fakesim_snap snaps[FAKESIM_RING]; /* at tick k: snaps[k % RING] */
    uint64_t queue[FAKESIM_QUEUE];           /* durations, ns */
};
_Static_assert(sizeof(struct fakesim_proc) == 2400, "fakesim_proc layout");

struct fakesim_gpu {
    uint32_t inited;
    int32_t running; /* record whose head kernel runs, -1 when idle */
    uint32_t cursor; /* record whose kernel started last (round-robin) */
    uint32_t pad;
    uint64_t run_start, run_end;
    uint64_t busy_ns;   /* completed kernels' busy time, all records */
    uint64_t kernels;   /* kernels completed */
    uint64_t last_tick; /* snapshots are recorded up to this tick */
    uint64_t init_tick; /* the GPU had 0 busy at this tick */
    uint64_t reserved[8];
    struct fakesim_snap snaps[FAKESIM_RING];
    struct fakesim_proc procs[FAKESIM_PROCS];
};
_Static_assert(sizeof(struct fakesim_gpu) == 153984, "fakesim_gpu layout");

struct fakesim_header {
    char magic[8];
    uint32_t version;
    uint32_t ndev; /* UUIDs below */
    uint64_t file_size;
    uint64_t gpu_size;
    char log_path[FAKESIM_LOG_PATH];
    char uuid[FAKESIM_MAXDEV][FAKESIM_UUID];
    uint8_t reserved[FAKESIM_HEADER_SIZE - 32 - FAKESIM_LOG_PATH - FAKESIM_MAXDEV * FAKESIM_UUID];
};
_Static_assert(sizeof(struct fakesim_header) == FAKESIM_HEADER_SIZE, "fakesim_header layout");

struct fakesim_file {
    struct fakesim_header h;
    struct fakesim_gpu gpu[FAKESIM_MAXDEV];
};
#define FAKESIM_FILE_SIZE ((off_t)sizeof(struct fakesim_file))

/* One timeline log record. */
struct fakesim_interval {
    uint32_t gpu, pid, tag, pad;
    uint64_t start_ns, end_ns;
};
_Static_assert(sizeof(struct fakesim_interval) == 32, "fakesim_interval layout");

/* A process's handle on the simulation. */
struct fakesim {
    int fd;     /* the state file: flock and the records' OFD locks */
    int log_fd; /* -1 not opened yet, -2 cannot open */
    struct fakesim_file *f;
    pthread_mutex_t mu;
    int own[FAKESIM_MAXDEV]; /* this process's record per GPU, -1 none */
};

static inline uint64_t fakesim_now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

/* Tick k happens at floor(k * 10^9 / 6) ns. */
static inline uint64_t fakesim_tick_ns(uint64_t k) {
    return k / 3 * 500000000ull + (k % 3) * 500000000ull / 3;
}

/* The last tick at or before t. */
static inline uint64_t fakesim_tick_of(uint64_t t) {
    uint64_t q = t / 500000000ull, r = t % 500000000ull;
    return 3 * q + (r >= 333333333ull ? 2 : r >= 166666666ull ? 1 : 0);
}

static inline void fakesim_sleep_until(uint64_t t) {
    struct timespec ts = {(time_t)(t / 1000000000ull), (long)(t % 1000000000ull)};
    while (clock_nanosleep(CLOCK_MONOTONIC, TIMER_ABSTIME, &ts, NULL) == EINTR) {
    }
}

static inline uint64_t fakesim_mix(uint64_t x) {
    x += 0x9e3779b97f4a7c15ull;
    x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
    x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
    return x ^ (x >> 31);
}

/* Sampling noise in [-3, +3] points: a deterministic hash of seed, pid and tick. */
static inline int fakesim_noise(uint64_t seed, uint32_t pid, uint64_t tick) {
    uint64_t h = fakesim_mix(seed ^ fakesim_mix(((uint64_t)pid << 32) ^ fakesim_mix(tick)));
    return (int)(h % 7) - 3;
}

/* round(100 * busy / 1 s) + noise, clamped to 0..100. */
static inline unsigned fakesim_percent(uint64_t busy_ns, int noise) {
    long long p = (long long)((busy_ns * 100 + 500000000ull) / 1000000000ull) + noise;
    return p < 0 ? 0u : p > 100 ? 100u : (unsigned)p;
}

static inline off_t fakesim_rec_off(unsigned gi, unsigned idx) {
    return (off_t)(offsetof(struct fakesim_file, gpu) + gi * sizeof(struct fakesim_gpu) +
                   offsetof(struct fakesim_gpu, procs) + idx * sizeof(struct fakesim_proc));
}

/* Opens (creating and sizing it if needed) and maps the state file. 0 or -1. */
static inline int fakesim_open(struct fakesim *s, const char *path) {
    s->fd = -1;
    s->log_fd = -1;
    s->f = NULL;
    for (int i = 0; i < FAKESIM_MAXDEV; i++) s->own[i] = -1;
    pthread_mutex_init(&s->mu, NULL);
    int fd = open(path, O_RDWR | O_CREAT | O_CLOEXEC, 0666);
    if (fd < 0) {
        fprintf(stderr, "fakesim: %s: %s\n", path, strerror(errno));
        return -1;
    }
    while (flock(fd, LOCK_EX) != 0 && errno == EINTR) {
    }
    struct stat st;
    const char *why = NULL;
    void *m = MAP_FAILED;
    if (fstat(fd, &st) != 0) why = "fstat";
    else if (st.st_size < FAKESIM_FILE_SIZE && ftruncate(fd, FAKESIM_FILE_SIZE) != 0) why = "ftruncate";
    else if ((m = mmap(NULL, (size_t)FAKESIM_FILE_SIZE, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0)) == MAP_FAILED)
        why = "mmap";
    if (!why) {
        struct fakesim_header *h = m;
        if (memcmp(h->magic, FAKESIM_MAGIC, 8) != 0) {
            static const char zero[8];
            if (memcmp(h->magic, zero, 8) != 0) why = "not a simulator state file";
            else {
                h->version = FAKESIM_VERSION;
                h->file_size = (uint64_t)FAKESIM_FILE_SIZE;
                h->gpu_size = sizeof(struct fakesim_gpu);
                memcpy(h->magic, FAKESIM_MAGIC, 8);
            }
        } else if (h->version != FAKESIM_VERSION || h->gpu_size != sizeof(struct fakesim_gpu)) {
            why = "simulator state of another version";
        }
    }
    flock(fd, LOCK_UN);
    if (why) {
        fprintf(stderr, "fakesim: %s: %s\n", path, why);
        if (m != MAP_FAILED) munmap(m, (size_t)FAKESIM_FILE_SIZE);
        close(fd);
        return -1;
    }
    s->fd = fd;
    s->f = m;
    return 0;
}

static inline void fakesim_lock(struct fakesim *s) {
    pthread_mutex_lock(&s->mu);
    while (flock(s->fd, LOCK_EX) != 0 && errno == EINTR) {
    }
}

static inline void fakesim_unlock(struct fakesim *s) {
    flock(s->fd, LOCK_UN);
    pthread_mutex_unlock(&s->mu);
}

/* Records the GPUs of `devices` ("GPU-<uuid>:<bytes>,...", FAKE_CUDA_DEVICES syntax)
 * unless the header has some already, and the log path unless it has one. */
static inline void fakesim_setup(struct fakesim *s, const char *devices, const char *log) {
    struct fakesim_header *h = &s->f->h;
    fakesim_lock(s);
    if (h->ndev == 0 && devices) {
        char buf[1024];
        snprintf(buf, sizeof buf, "%s", devices);
        unsigned n = 0;
        for (char *save = NULL, *tok = strtok_r(buf, ",", &save); tok && n < FAKESIM_MAXDEV;
             tok = strtok_r(NULL, ",", &save)) {
            char *colon = strrchr(tok, ':');
            if (!colon) continue;
            *colon = 0;
            snprintf(h->uuid[n], FAKESIM_UUID, "%s", tok);
            n++;
        }
        h->ndev = n;
    }
    if (h->log_path[0] == 0 && log && log[0]) snprintf(h->log_path, FAKESIM_LOG_PATH, "%s", log);
    fakesim_unlock(s);
}

/* The simulator's index of the GPU with this UUID, or -1. */
static inline int fakesim_index_of(const struct fakesim *s, const char *uuid) {
    const struct fakesim_header *h = &s->f->h;
    for (unsigned i = 0; i < h->ndev && i < FAKESIM_MAXDEV; i++)
        if (strncmp(h->uuid[i], uuid, FAKESIM_UUID) == 0) return (int)i;
    return -1;
}

/* The GPU, initialised on first touch. Lock held. */
static inline struct fakesim_gpu *fakesim_gpu(struct fakesim *s, unsigned gi, uint64_t now) {
    struct fakesim_gpu *g = &s->f->gpu[gi];
    if (!g->inited) {
        g->running = -1;
        g->cursor = FAKESIM_PROCS - 1;
        g->last_tick = g->init_tick = fakesim_tick_of(now);
        g->inited = 1;
    }
    return g;
}

/* Whether record idx's owner is alive (holds its OFD lock). Lock held. */
static inline int fakesim_alive(struct fakesim *s, unsigned gi, unsigned idx) {
    if (s->own[gi] == (int)idx) return 1; /* our own lock does not conflict with us */
    struct flock fl;
    memset(&fl, 0, sizeof fl);
    fl.l_type = F_WRLCK;
    fl.l_whence = SEEK_SET;
    fl.l_start = fakesim_rec_off(gi, idx);
    fl.l_len = (off_t)sizeof(struct fakesim_proc);
    if (fcntl(s->fd, F_OFD_GETLK, &fl) != 0) return 1;
    return fl.l_type != F_UNLCK;
}

static inline void fakesim_log(struct fakesim *s, unsigned gi, const struct fakesim_proc *p,
                               uint64_t start, uint64_t end) {
    if (s->log_fd == -1 && s->f->h.log_path[0]) {
        char path[FAKESIM_LOG_PATH];
        memcpy(path, s->f->h.log_path, sizeof path);
        path[sizeof path - 1] = 0;
        s->log_fd = open(path, O_WRONLY | O_APPEND | O_CREAT | O_CLOEXEC, 0666);
        if (s->log_fd < 0) {
            fprintf(stderr, "fakesim: log %s: %s\n", path, strerror(errno));
            s->log_fd = -2;
        }
    }
    if (s->log_fd < 0) return;
    struct fakesim_interval r = {gi, p->pid, p->tag, 0, start, end};
    if (write(s->log_fd, &r, sizeof r) != (ssize_t)sizeof r) {
        /* nothing sensible to do: the log is the test's ground truth; it will see the gap */
    }
}

/* Records the busy snapshots of every tick in (last_tick, t]. No kernel completed
 * between the previous event and t, so busy at a tick is the completed busy plus the
 * running kernel's part before the tick. Lock held. */
static inline void fakesim_ticks(struct fakesim_gpu *g, uint64_t t) {
    uint64_t last = fakesim_tick_of(t);
    if (last <= g->last_tick) return;
    if (last - g->last_tick > FAKESIM_RING) g->last_tick = last - FAKESIM_RING;
    for (uint64_t k = g->last_tick + 1; k <= last; k++) {
        uint64_t tt = fakesim_tick_ns(k), part = 0;
        if (g->running >= 0 && g->run_start < tt) part = (tt < g->run_end ? tt : g->run_end) - g->run_start;
        for (int i = 0; i < FAKESIM_PROCS; i++) {
            struct fakesim_proc *p = &g->procs[i];
            if (p->state != FAKESIM_LIVE) continue;
            p->snaps[k % FAKESIM_RING].tick = k;
            p->snaps[k % FAKESIM_RING].busy = p->busy_ns + (i == g->running ? part : 0);
        }
        g->snaps[k % FAKESIM_RING].tick = k;
        g->snaps[k % FAKESIM_RING].busy = g->busy_ns + part;
    }
    g->last_tick = last;
}

/* Starts the next kernel at time t, round-robin after the cursor; dead owners' queues
 * are discarded on the way. Lock held, GPU idle. */
static inline void fakesim_start_next(struct fakesim *s, unsigned gi, struct fakesim_gpu *g, uint64_t t) {
    for (unsigned n = 1; n <= FAKESIM_PROCS; n++) {
        unsigned i = (g->cursor + n) % FAKESIM_PROCS;
        struct fakesim_proc *p = &g->procs[i];
        if (p->state != FAKESIM_LIVE || p->head == p->tail) continue;
        if (!fakesim_alive(s, gi, i)) {
            p->head = p->tail;
            p->state = FAKESIM_DEAD;
            continue;
        }
        g->running = (int32_t)i;
        g->cursor = i;
        g->run_start = t;
        g->run_end = t + p->queue[p->head % FAKESIM_QUEUE];
        return;
    }
    g->running = -1;
}

/* Simulates GPU gi up to `now`. Lock held. */
static inline struct fakesim_gpu *fakesim_advance(struct fakesim *s, unsigned gi, uint64_t now) {
    struct fakesim_gpu *g = fakesim_gpu(s, gi, now);
    for (;;) {
        if (g->running < 0 || g->run_end > now) {
            fakesim_ticks(g, now);
            return g;
        }
        fakesim_ticks(g, g->run_end);
        struct fakesim_proc *p = &g->procs[g->running];
        uint64_t d = g->run_end - g->run_start, t = g->run_end;
        p->busy_ns += d;
        g->busy_ns += d;
        g->kernels++;
        fakesim_log(s, gi, p, g->run_start, g->run_end);
        p->head++;
        g->running = -1;
        fakesim_start_next(s, gi, g, t);
    }
}

/* This process's record on GPU gi, claimed on first use; -1 when all are taken.
 * Lock held, GPU advanced. */
static inline int fakesim_claim(struct fakesim *s, unsigned gi, uint32_t pid, uint32_t tag) {
    if (s->own[gi] >= 0) return s->own[gi];
    struct fakesim_gpu *g = &s->f->gpu[gi];
    for (unsigned i = 0; i < FAKESIM_PROCS; i++) {
        if ((int)i == g->running) continue; /* a dead owner's kernel still runs */
        struct flock fl;
        memset(&fl, 0, sizeof fl);
        fl.l_type = F_WRLCK;
        fl.l_whence = SEEK_SET;
        fl.l_start = fakesim_rec_off(gi, i);
        fl.l_len = (off_t)sizeof(struct fakesim_proc);
        if (fcntl(s->fd, F_OFD_SETLK, &fl) != 0) continue;
        struct fakesim_proc *p = &g->procs[i];
        memset(p, 0, offsetof(struct fakesim_proc, queue));
        p->pid = pid;
        p->tag = tag;
        p->join_tick = g->last_tick;
        p->state = FAKESIM_LIVE;
        s->own[gi] = (int)i;
        return (int)i;
    }
    return -1;
}

/* Appends one kernel to record idx's FIFO and starts it if the GPU is idle. 0, or -1
 * when the queue is full. Lock held, GPU advanced to now. */
static inline int fakesim_push(struct fakesim *s, unsigned gi, unsigned idx, uint64_t dur,
                               uint64_t blocks, uint64_t now) {
    struct fakesim_gpu *g = &s->f->gpu[gi];
    struct fakesim_proc *p = &g->procs[idx];
    if (p->tail - p->head >= FAKESIM_QUEUE) return -1;
    p->queue[p->tail % FAKESIM_QUEUE] = dur;
    p->tail++;
    p->launched++;
    p->blocks += blocks;
    if (g->running < 0) fakesim_start_next(s, gi, g, now);
    return 0;
}

/* When the first n pending kernels of record idx will have completed, by a dry run of
 * round-robin on the current queues (no new arrivals); 0 if nothing runs. Lock held,
 * GPU advanced. */
static inline uint64_t fakesim_project(struct fakesim *s, unsigned gi, unsigned idx, uint64_t n) {
    struct fakesim_gpu *g = &s->f->gpu[gi];
    if (g->running < 0 || n == 0) return 0;
    uint64_t heads[FAKESIM_PROCS];
    signed char alive[FAKESIM_PROCS];
    for (int i = 0; i < FAKESIM_PROCS; i++) {
        heads[i] = g->procs[i].head;
        alive[i] = -1;
    }
    unsigned cur = (unsigned)g->running;
    uint64_t t = g->run_end, done = 0;
    heads[cur]++;
    if (cur == idx && ++done >= n) return t;
    for (;;) {
        int pick = -1;
        for (unsigned k = 1; k <= FAKESIM_PROCS; k++) {
            unsigned i = (cur + k) % FAKESIM_PROCS;
            const struct fakesim_proc *p = &g->procs[i];
            if (p->state != FAKESIM_LIVE || heads[i] >= p->tail) continue;
            if (alive[i] < 0) alive[i] = (signed char)fakesim_alive(s, gi, i);
            if (!alive[i]) continue;
            pick = (int)i;
            break;
        }
        if (pick < 0) return t;
        t += g->procs[pick].queue[heads[pick] % FAKESIM_QUEUE];
        heads[pick]++;
        cur = (unsigned)pick;
        if (cur == idx && ++done >= n) return t;
    }
}

/* Busy of a ring over the 1 s before tick k (ticks at or before `floor` had 0 busy).
 * 1, or 0 when a snapshot is missing. */
static inline int fakesim_window(const struct fakesim_snap *ring, uint64_t k, uint64_t floor,
                                 uint64_t *busy) {
    uint64_t v[2];
    for (int j = 0; j < 2; j++) {
        if (j && k < FAKESIM_WINDOW_TICKS) { v[j] = 0; continue; }
        uint64_t t = j ? k - FAKESIM_WINDOW_TICKS : k;
        if (t <= floor) v[j] = 0;
        else if (ring[t % FAKESIM_RING].tick == t) v[j] = ring[t % FAKESIM_RING].busy;
        else return 0;
    }
    *busy = v[0] - v[1];
    return 1;
}

#endif
