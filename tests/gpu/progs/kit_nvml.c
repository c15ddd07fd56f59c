/*
 * kit_nvml: the GPU acceptance kit's NVML reader for MIG (tests/gpu/run.sh). It dlopens
 * the libnvidia-ml.so.1 the dynamic linker finds (the real driver's, or under
 * --simulated the fake one) and reads; it never changes anything. One line per GPU or
 * profile, `key=value` fields:
 *
 *   kit_nvml mig-modes      each GPU's MIG mode, current and pending (a change that
 *                           waits for a GPU reset shows as current != pending):
 *                           `gpu=UUID index=I current=0|1 pending=0|1`, or `mig=none`
 *                           for a GPU that cannot do MIG
 *   kit_nvml mig-profiles   each GPU's GPU-instance profiles as NVML reports them
 *                           (what `nvidia-smi mig -lgip` and `-lgipp` print), read
 *                           with nvmlDeviceGetGpuInstanceProfileInfoV (v2) by profile
 *                           index and nvmlDeviceGetGpuInstancePossiblePlacements_v2:
 *                           `gpu=UUID index=I profile_index=K id=ID name=NAME
 *                           slices=S mem_mib=M sms=N instances=C placements=START:SIZE,...`
 *                           (NAME without NVML's `MIG ` prefix); a GPU with MIG off or
 *                           none: `gpu=UUID index=I profiles=none code=RC`
 *
 * Exit 0 when NVML answered; 1 with `error=<call>:<code>` otherwise.
 */
#include <dlfcn.h>
#include <stdio.h>
#include <string.h>

#define NVML_SUCCESS 0
#define NVML_ERROR_NOT_SUPPORTED 3
/* Profile indices NVML knows (NVML_GPU_INSTANCE_PROFILE_COUNT is 0x11 in 12.x drivers;
 * later ones may add more: an index past the last answers INVALID_ARGUMENT). */
#define MAX_PROFILE_INDEX 0x20

/* nvmlGpuInstanceProfileInfo_v2_t. */
struct profile_info_v2 {
    unsigned version;
    unsigned id;
    unsigned is_p2p_supported;
    unsigned slice_count;
    unsigned instance_count;
    unsigned multiprocessor_count;
    unsigned copy_engine_count;
    unsigned decoder_count;
    unsigned encoder_count;
    unsigned jpeg_count;
    unsigned ofa_count;
    unsigned long long memory_size_mb;
    char name[96];
};
/* NVML_STRUCT_VERSION(GpuInstanceProfileInfo, 2). */
#define PROFILE_INFO_V2 ((unsigned)(sizeof(struct profile_info_v2) | (2u << 24)))

/* nvmlGpuInstancePlacement_t. */
struct placement {
    unsigned start;
    unsigned size;
};

static void *ml;
static int (*init)(void);
static int (*count_fn)(unsigned *);
static int (*by_index)(unsigned, void **);
static int (*uuid_fn)(void *, char *, unsigned);
static int (*mig_mode)(void *, unsigned *, unsigned *);
static int (*profile_info_v)(void *, unsigned, struct profile_info_v2 *);
static int (*placements_fn)(void *, unsigned, struct placement *, unsigned *);

static int load(void) {
    ml = dlopen("libnvidia-ml.so.1", RTLD_NOW);
    if (!ml) {
        printf("error=dlopen:%s\n", dlerror());
        return 1;
    }
    init = (int (*)(void))dlsym(ml, "nvmlInit_v2");
    count_fn = (int (*)(unsigned *))dlsym(ml, "nvmlDeviceGetCount_v2");
    by_index = (int (*)(unsigned, void **))dlsym(ml, "nvmlDeviceGetHandleByIndex_v2");
    uuid_fn = (int (*)(void *, char *, unsigned))dlsym(ml, "nvmlDeviceGetUUID");
    mig_mode = (int (*)(void *, unsigned *, unsigned *))dlsym(ml, "nvmlDeviceGetMigMode");
    profile_info_v = (int (*)(void *, unsigned, struct profile_info_v2 *))dlsym(
        ml, "nvmlDeviceGetGpuInstanceProfileInfoV");
    placements_fn = (int (*)(void *, unsigned, struct placement *, unsigned *))dlsym(
        ml, "nvmlDeviceGetGpuInstancePossiblePlacements_v2");
    if (!init || !count_fn || !by_index || !uuid_fn || !mig_mode || !profile_info_v ||
        !placements_fn) {
        printf("error=dlsym:nvml\n");
        return 1;
    }
    int r = init();
    if (r != NVML_SUCCESS) {
        printf("error=nvmlInit_v2:%d\n", r);
        return 1;
    }
    return 0;
}

/* One GPU's profiles, one line each. */
static int profiles_of(void *dev, const char *uuid, unsigned index) {
    int printed = 0, last = NVML_ERROR_NOT_SUPPORTED;
    for (unsigned k = 0; k < MAX_PROFILE_INDEX; k++) {
        struct profile_info_v2 info;
        memset(&info, 0, sizeof info);
        info.version = PROFILE_INFO_V2;
        int r = profile_info_v(dev, k, &info);
        if (r != NVML_SUCCESS) {
            last = r;
            continue;
        }
        struct placement pl[16];
        unsigned n = 16;
        r = placements_fn(dev, info.id, pl, &n);
        if (r != NVML_SUCCESS) {
            printf("error=nvmlDeviceGetGpuInstancePossiblePlacements_v2:%d gpu=%s profile_id=%u\n",
                   r, uuid, info.id);
            return 1;
        }
        const char *name = info.name;
        if (!strncmp(name, "MIG ", 4)) name += 4;
        printf("gpu=%s index=%u profile_index=%u id=%u name=%s slices=%u mem_mib=%llu sms=%u "
               "instances=%u placements=",
               uuid, index, k, info.id, name, info.slice_count, info.memory_size_mb,
               info.multiprocessor_count, info.instance_count);
        for (unsigned i = 0; i < n; i++) printf("%s%u:%u", i ? "," : "", pl[i].start, pl[i].size);
        printf("\n");
        printed++;
    }
    if (!printed) printf("gpu=%s index=%u profiles=none code=%d\n", uuid, index, last);
    return 0;
}

int main(int argc, char **argv) {
    const char *mode = argc == 2 ? argv[1] : "";
    if (strcmp(mode, "mig-modes") && strcmp(mode, "mig-profiles")) {
        fprintf(stderr, "usage: %s mig-modes | mig-profiles\n", argv[0]);
        return 2;
    }
    if (load()) return 1;
    unsigned count = 0;
    int r = count_fn(&count);
    if (r != NVML_SUCCESS) {
        printf("error=nvmlDeviceGetCount_v2:%d\n", r);
        return 1;
    }
    for (unsigned i = 0; i < count; i++) {
        void *dev;
        char uuid[96] = "";
        r = by_index(i, &dev);
        if (r == NVML_SUCCESS) r = uuid_fn(dev, uuid, sizeof uuid);
        if (r != NVML_SUCCESS) {
            printf("error=nvmlDeviceGetHandleByIndex_v2/UUID:%d index=%u\n", r, i);
            return 1;
        }
        if (!strcmp(mode, "mig-modes")) {
            unsigned current = 0, pending = 0;
            r = mig_mode(dev, &current, &pending);
            if (r == NVML_ERROR_NOT_SUPPORTED)
                printf("gpu=%s index=%u mig=none\n", uuid, i);
            else if (r != NVML_SUCCESS) {
                printf("error=nvmlDeviceGetMigMode:%d index=%u\n", r, i);
                return 1;
            } else
                printf("gpu=%s index=%u current=%u pending=%u\n", uuid, i, current, pending);
        } else if (profiles_of(dev, uuid, i)) {
            return 1;
        }
    }
    return 0;
}
