/*
 * fake_nvml.c: a fake `libnvidia-ml.so.1` over Tessera's simulated node.
 *
 * Why this is still C, and what it is not. NVIDIA's own device models (go-nvml's DGX
 * systems, bridged to the C ABI by tests/nvml-models) are the tree's NVML for devices
 * and MIG; their control file adds fixed XIDs, process lists and utilization that a
 * test writes down beforehand. This library remains for what follows live state
 * instead, and only for that:
 *   - per-process GPU memory (nvmlDeviceGetComputeRunningProcesses_v3) and free/used
 *     memory read from the fake CUDA driver's ledger (cuda/tests/fakes) as processes
 *     allocate, die and leak: the interception library, the watchdog and the kit's
 *     interception check judge NVML against what the fake driver holds right then;
 *   - per-process and device utilization from the fake driver's simulated GPU, which
 *     the compute-share controller (cuda/tests, benches) is judged on in a closed loop;
 *   - XIDs and lost GPUs (`health-event` lines, injected through
 *     `tessera::inventory::mock::inject_*`) and the GPUs themselves read from the mock
 *     backend's own state file: the tests that compare the NVML path with the mock
 *     backend (discovery, health, recovery) run both on one node.
 * MIG is not here. No MIG profile table, placement rule, instance or MIG UUID is
 * computed or stored in this file: MIG truth lives in src/mig/ (Tessera's catalog and
 * geometry) and in NVIDIA's models. Every MIG call is forwarded to the NVML library
 * that $TESSERA_FAKE_NVML_MIG_LIB names (the bridge over a go-nvml model, whose own
 * state file keeps the instances); without one, a MIG-capable GPU only reports its
 * MIG mode from the state file, and MIG changes are NOT_SUPPORTED.
 * Nor does this library write the state file, or render its format: it only reads the
 * GPU keys (the format is src/inventory/mock/state.rs's, which writes it).
 *
 * Owns: the NVML C ABI that Tessera's NVML backend uses (nvml-wrapper 0.13 for
 * discovery, the raw MIG calls forwarded), answered from the simulated node's state
 * file `$TESSERA_FAKE_NVML_STATE_DIR/mock-node.state`.
 *
 * Build:
 *   cc -shared -fPIC -pthread -Wall -Wextra -Wl,-soname,libnvidia-ml.so.1 \
 *      -o libnvidia-ml.so.1 fake_nvml.c -ldl
 *
 * Contract (mirrors NVML; signatures, struct layouts and return codes are those of
 * nvml.h as captured in nvml-wrapper-sys 0.10 `src/bindings.rs`):
 *   - `nvmlInit_v2` / `nvmlInitWithFlags` read the state file when the init count goes
 *     from 0 to 1; init/shutdown are reference counted like the real library.
 *   - Missing `TESSERA_FAKE_NVML_STATE_DIR`, or a missing or unreadable state file:
 *     NVML_ERROR_DRIVER_NOT_LOADED (9), the code real NVML gives when the kernel
 *     driver is absent, which is what "no simulated node" means. A state file with a
 *     wrong header line (another format version): NVML_ERROR_LIB_RM_VERSION_MISMATCH
 *     (18). Any other malformed content: NVML_ERROR_DRIVER_NOT_LOADED. The reason is
 *     printed to stderr with the prefix "fake-nvml:" (real NVML has no channel for it).
 *   - Calls before init: NVML_ERROR_UNINITIALIZED (1). NULL pointers, unknown handles
 *     and out-of-range indices: NVML_ERROR_INVALID_ARGUMENT (2). Too-small string
 *     buffers: NVML_ERROR_INSUFFICIENT_SIZE (7). A wrong `nvmlMemory_v2_t.version`:
 *     NVML_ERROR_ARGUMENT_VERSION_MISMATCH (25). MIG mode on a GPU that is not
 *     MIG-capable, and NUMA node when the state has none: NVML_ERROR_NOT_SUPPORTED (3).
 *   - Device handles point into a static array of per-GPU records; exported functions
 *     never call each other (internal helpers are static), as in the real driver, so
 *     an interposer on one symbol cannot change what another returns.
 *   - One mutex serialises every entry point (NVML is thread-safe).
 *
 * MIG, forwarded (see above):
 *   - $TESSERA_FAKE_NVML_MIG_LIB is loaded at the first init (once per process, never
 *     unloaded, RTLD_DEEPBIND), initialised with ours and shut down with our last
 *     shutdown. It cannot be loaded, or lacks an entry point: init fails
 *     (LIBRARY_NOT_FOUND / FUNCTION_NOT_FOUND) with the reason on stderr.
 *   - A MIG-capable GPU (`mig-capable 1`) at NVML index i is that library's GPU i: its
 *     MIG mode, profiles, placements, GPU and compute instances are that library's
 *     answers, with our handle swapped for its. A GPU that is not MIG-capable here is
 *     NOT_SUPPORTED whatever the library says. GPU/compute-instance handles and MIG
 *     device handles are the library's (nvmlDeviceGetUUID of one is its answer);
 *     nvmlGpuInstanceGetInfo's `device` is our GPU's handle.
 *   - Without it: nvmlDeviceGetMigMode reports the state file's `mig-enabled` (re-read
 *     on each call: the mock backend may switch it), every other MIG call on a GPU is
 *     NOT_SUPPORTED, and one on an instance handle INVALID_ARGUMENT (none can exist).
 *   - The `mig-*` lines the mock backend keeps in the state file are ignored.
 *
 * Health (the `health-event` lines of the state file, appended by the tests through
 * `tessera::inventory::mock::inject_*`):
 *   - A GPU whose last `lost`/`clear` line is `lost` answers every call on its handle
 *     with NVML_ERROR_GPU_IS_LOST (the file is re-read on each such call).
 *   - Event sets (`nvmlEventSetCreate`, up to 8 live) deliver, through
 *     `nvmlEventSetWait_v2`, each `xid` line written after the set was created, as
 *     nvmlEventTypeXidCriticalError with eventData = the XID, on the GPU's handle, if
 *     the GPU was registered for that type; the GI ID is the line's `gi <id>` and the
 *     CI ID 0 (the full-GI compute instance), or both 0xFFFFFFFF (the whole GPU).
 *   - A `clear` line makes a lost GPU answer again (a reset); on a GPU that is not
 *     lost it changes nothing.
 *     No event within the timeout: NVML_ERROR_TIMEOUT. Other event types are accepted
 *     at registration and never delivered.
 *
 * Work on the GPUs (the fake driver's side, cuda/tests/fakes; included by relative path):
 *   - FAKE_CUDA_SIM names the simulated GPU's state file (cuda/tests/fakes/fakesim.h,
 *     shared with the fake libcuda). A GPU is found there by UUID (the header lists the
 *     UUIDs in FAKE_CUDA_DEVICES order; when no process recorded them yet, this
 *     library records its own FAKE_CUDA_DEVICES). Each query first advances the
 *     simulation to now, under the simulator's lock.
 *   - nvmlDeviceGetProcessUtilization: for each live process record on the GPU, the
 *     sample of the latest tick (ticks every 1/6 s of CLOCK_MONOTONIC) if its timestamp
 *     (microseconds of CLOCK_MONOTONIC at the tick) is newer than lastSeenTimeStamp:
 *     smUtil = round(100 * busy in the 1 s before the tick / 1 s) + noise, uniform in
 *     [-3, +3], a deterministic hash of FAKE_SIM_SEED (default 0), pid and tick,
 *     clamped to 0..100; memUtil/encUtil/decUtil 0. Count protocol: a NULL buffer (or
 *     a count below the number of samples) gives INSUFFICIENT_SIZE with the count set,
 *     or SUCCESS with count 0 when there is no sample (real NVML says NOT_FOUND then;
 *     nvml-wrapper and the backend take both). NOT_SUPPORTED with MIG enabled.
 *   - nvmlDeviceGetUtilizationRates: gpu = the GPU's busy % over the 1 s before the
 *     latest tick, with the same noise rule (pid 0xFFFFFFFF in the hash); memory 0.
 *     NOT_SUPPORTED without FAKE_CUDA_SIM or with MIG enabled.
 *   - FAKE_CUDA_LEDGER names the fake driver's ledger (format in fake_cuda.c); GPUs map
 *     to its devices by UUID (the UUIDs the driver recorded there, else this
 *     library's FAKE_CUDA_DEVICES order). nvmlDeviceGetComputeRunningProcesses_v3
 *     lists every record, live or dead (a dead record holding bytes stands for memory
 *     a vanished process left held), with bytes on the GPU: pid and bytes, GI/CI IDs
 *     0xFFFFFFFF. Count protocol as NVML: a count below the list's size gives
 *     INSUFFICIENT_SIZE with the size; SUCCESS with 0 when empty. Without a ledger the
 *     list is empty. nvmlDeviceGetMemoryInfo/_v2: used = the ledger's bytes held on the
 *     GPU, free = total - used (reserved 0); without a ledger all memory is free.
 */
#define _GNU_SOURCE /* F_OFD_GETLK/F_OFD_SETLK (the simulator's records), RTLD_DEEPBIND */
#define _POSIX_C_SOURCE 200809L
#define _DEFAULT_SOURCE

#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "../../cuda/tests/fakes/fakesim.h"

/* ---- NVML ABI (subset of nvml.h, NVML_API_VERSION 13) ---------------------------- */

typedef enum nvmlReturn_enum {
    NVML_SUCCESS = 0,
    NVML_ERROR_UNINITIALIZED = 1,
    NVML_ERROR_INVALID_ARGUMENT = 2,
    NVML_ERROR_NOT_SUPPORTED = 3,
    NVML_ERROR_NO_PERMISSION = 4,
    NVML_ERROR_ALREADY_INITIALIZED = 5,
    NVML_ERROR_NOT_FOUND = 6,
    NVML_ERROR_INSUFFICIENT_SIZE = 7,
    NVML_ERROR_INSUFFICIENT_POWER = 8,
    NVML_ERROR_DRIVER_NOT_LOADED = 9,
    NVML_ERROR_TIMEOUT = 10,
    NVML_ERROR_IRQ_ISSUE = 11,
    NVML_ERROR_LIBRARY_NOT_FOUND = 12,
    NVML_ERROR_FUNCTION_NOT_FOUND = 13,
    NVML_ERROR_CORRUPTED_INFOROM = 14,
    NVML_ERROR_GPU_IS_LOST = 15,
    NVML_ERROR_RESET_REQUIRED = 16,
    NVML_ERROR_OPERATING_SYSTEM = 17,
    NVML_ERROR_LIB_RM_VERSION_MISMATCH = 18,
    NVML_ERROR_IN_USE = 19,
    NVML_ERROR_MEMORY = 20,
    NVML_ERROR_NO_DATA = 21,
    NVML_ERROR_VGPU_ECC_NOT_SUPPORTED = 22,
    NVML_ERROR_INSUFFICIENT_RESOURCES = 23,
    NVML_ERROR_FREQ_NOT_SUPPORTED = 24,
    NVML_ERROR_ARGUMENT_VERSION_MISMATCH = 25,
    NVML_ERROR_DEPRECATED = 26,
    NVML_ERROR_NOT_READY = 27,
    NVML_ERROR_GPU_NOT_FOUND = 28,
    NVML_ERROR_INVALID_STATE = 29,
    NVML_ERROR_UNKNOWN = 999
} nvmlReturn_t;

typedef enum nvmlBrandType_enum {
    NVML_BRAND_UNKNOWN = 0,
    NVML_BRAND_QUADRO = 1,
    NVML_BRAND_TESLA = 2,
    NVML_BRAND_NVS = 3,
    NVML_BRAND_GRID = 4,
    NVML_BRAND_GEFORCE = 5,
    NVML_BRAND_TITAN = 6,
    NVML_BRAND_NVIDIA_VAPPS = 7,
    NVML_BRAND_NVIDIA_VPC = 8,
    NVML_BRAND_NVIDIA_VCS = 9,
    NVML_BRAND_NVIDIA_VWS = 10,
    NVML_BRAND_NVIDIA_CLOUD_GAMING = 11,
    NVML_BRAND_QUADRO_RTX = 12,
    NVML_BRAND_NVIDIA_RTX = 13,
    NVML_BRAND_NVIDIA = 14,
    NVML_BRAND_GEFORCE_RTX = 15,
    NVML_BRAND_TITAN_RTX = 16
} nvmlBrandType_t;

typedef unsigned int nvmlDeviceArchitecture_t;
#define NVML_DEVICE_ARCH_UNKNOWN 0xffffffffu

#define NVML_DEVICE_PCI_BUS_ID_BUFFER_SIZE 32
#define NVML_DEVICE_PCI_BUS_ID_BUFFER_V2_SIZE 16
#define NVML_DEVICE_UUID_V2_BUFFER_SIZE 96
#define NVML_DEVICE_NAME_V2_BUFFER_SIZE 96
#define NVML_SYSTEM_DRIVER_VERSION_BUFFER_SIZE 80

#define NVML_DEVICE_MIG_DISABLE 0u
#define NVML_DEVICE_MIG_ENABLE 1u

typedef struct nvmlMemory_st {
    unsigned long long total;
    unsigned long long free;
    unsigned long long used;
} nvmlMemory_t;

/* 40 bytes on LP64: version @0, total @8, reserved @16, free @24, used @32. */
typedef struct nvmlMemory_v2_st {
    unsigned int version;
    unsigned long long total;
    unsigned long long reserved;
    unsigned long long free;
    unsigned long long used;
} nvmlMemory_v2_t;

/* NVML_STRUCT_VERSION(Memory, 2) */
#define nvmlMemory_v2 ((unsigned int)(sizeof(nvmlMemory_v2_t) | (2u << 24)))

/* 32 bytes: pid @0, timeStamp @8 (us), smUtil @16, memUtil @20, encUtil @24, decUtil @28. */
typedef struct nvmlProcessUtilizationSample_st {
    unsigned int pid;
    unsigned long long timeStamp;
    unsigned int smUtil;
    unsigned int memUtil;
    unsigned int encUtil;
    unsigned int decUtil;
} nvmlProcessUtilizationSample_t;
_Static_assert(sizeof(nvmlProcessUtilizationSample_t) == 32, "process utilization sample layout");

/* 24 bytes (nvmlProcessInfo_v2_t): pid @0, usedGpuMemory @8, gpuInstanceId @16,
 * computeInstanceId @20. */
typedef struct nvmlProcessInfo_st {
    unsigned int pid;
    unsigned long long usedGpuMemory;
    unsigned int gpuInstanceId;
    unsigned int computeInstanceId;
} nvmlProcessInfo_t;
_Static_assert(sizeof(nvmlProcessInfo_t) == 24, "process info layout");

typedef struct nvmlUtilization_st {
    unsigned int gpu;
    unsigned int memory;
} nvmlUtilization_t;

typedef struct nvmlPciInfo_st {
    char busIdLegacy[NVML_DEVICE_PCI_BUS_ID_BUFFER_V2_SIZE];
    unsigned int domain;
    unsigned int bus;
    unsigned int device;
    unsigned int pciDeviceId;
    unsigned int pciSubSystemId;
    char busId[NVML_DEVICE_PCI_BUS_ID_BUFFER_SIZE];
} nvmlPciInfo_t;

typedef struct nvmlDevice_st *nvmlDevice_t;
typedef struct nvmlGpuInstance_st *nvmlGpuInstance_t;
typedef struct nvmlComputeInstance_st *nvmlComputeInstance_t;

/* MIG structs pass through to the MIG library untouched (opaque here), except the
 * GPU instance's info, whose parent device is swapped for ours. */
typedef struct nvmlGpuInstancePlacement_st {
    unsigned int start;
    unsigned int size;
} nvmlGpuInstancePlacement_t;
typedef struct nvmlGpuInstanceProfileInfo_st nvmlGpuInstanceProfileInfo_t;
typedef struct nvmlGpuInstanceProfileInfo_v2_st nvmlGpuInstanceProfileInfo_v2_t;
typedef struct nvmlComputeInstanceProfileInfo_st nvmlComputeInstanceProfileInfo_t;
typedef struct nvmlComputeInstanceProfileInfo_v2_st nvmlComputeInstanceProfileInfo_v2_t;
typedef struct nvmlComputeInstanceInfo_st nvmlComputeInstanceInfo_t;

typedef struct nvmlGpuInstanceInfo_st {
    nvmlDevice_t device;
    unsigned int id;
    unsigned int profileId;
    nvmlGpuInstancePlacement_t placement;
} nvmlGpuInstanceInfo_t;

/* The struct layouts above are the ABI; catch accidental edits at compile time. */
_Static_assert(sizeof(nvmlMemory_t) == 24, "nvmlMemory_t layout");
_Static_assert(sizeof(nvmlMemory_v2_t) == 40, "nvmlMemory_v2_t layout");
_Static_assert(sizeof(nvmlPciInfo_t) == 68, "nvmlPciInfo_t layout");
_Static_assert(sizeof(nvmlGpuInstanceInfo_t) == 24, "GI info layout");

/* The exported entry points, declared as nvml.h declares them. */
nvmlReturn_t nvmlInit_v2(void);
nvmlReturn_t nvmlInitWithFlags(unsigned int flags);
nvmlReturn_t nvmlShutdown(void);
typedef struct nvmlEventSet_st *nvmlEventSet_t;
typedef struct nvmlEventData_st {
    nvmlDevice_t device;
    unsigned long long eventType;
    unsigned long long eventData;
    unsigned int gpuInstanceId;
    unsigned int computeInstanceId;
} nvmlEventData_t;
#define nvmlEventTypeXidCriticalError 0x0000000000000008LL
nvmlReturn_t nvmlEventSetCreate(nvmlEventSet_t *set);
nvmlReturn_t nvmlDeviceRegisterEvents(nvmlDevice_t device, unsigned long long eventTypes,
                                      nvmlEventSet_t set);
nvmlReturn_t nvmlEventSetWait_v2(nvmlEventSet_t set, nvmlEventData_t *data,
                                 unsigned int timeoutms);
nvmlReturn_t nvmlEventSetFree(nvmlEventSet_t set);
const char *nvmlErrorString(nvmlReturn_t result);
nvmlReturn_t nvmlSystemGetDriverVersion(char *version, unsigned int length);
nvmlReturn_t nvmlSystemGetCudaDriverVersion(int *cudaDriverVersion);
nvmlReturn_t nvmlSystemGetCudaDriverVersion_v2(int *cudaDriverVersion);
nvmlReturn_t nvmlDeviceGetCount_v2(unsigned int *deviceCount);
nvmlReturn_t nvmlDeviceGetHandleByIndex_v2(unsigned int index, nvmlDevice_t *device);
nvmlReturn_t nvmlDeviceGetIndex(nvmlDevice_t device, unsigned int *index);
nvmlReturn_t nvmlDeviceGetUUID(nvmlDevice_t device, char *uuid, unsigned int length);
nvmlReturn_t nvmlDeviceGetName(nvmlDevice_t device, char *name, unsigned int length);
nvmlReturn_t nvmlDeviceGetBrand(nvmlDevice_t device, nvmlBrandType_t *type);
nvmlReturn_t nvmlDeviceGetArchitecture(nvmlDevice_t device, nvmlDeviceArchitecture_t *arch);
nvmlReturn_t nvmlDeviceGetMemoryInfo(nvmlDevice_t device, nvmlMemory_t *memory);
nvmlReturn_t nvmlDeviceGetMemoryInfo_v2(nvmlDevice_t device, nvmlMemory_v2_t *memory);
nvmlReturn_t nvmlDeviceGetProcessUtilization(nvmlDevice_t device,
                                             nvmlProcessUtilizationSample_t *utilization,
                                             unsigned int *processSamplesCount,
                                             unsigned long long lastSeenTimeStamp);
nvmlReturn_t nvmlDeviceGetUtilizationRates(nvmlDevice_t device, nvmlUtilization_t *utilization);
nvmlReturn_t nvmlDeviceGetComputeRunningProcesses_v3(nvmlDevice_t device, unsigned int *infoCount,
                                                     nvmlProcessInfo_t *infos);
nvmlReturn_t nvmlDeviceGetMinorNumber(nvmlDevice_t device, unsigned int *minorNumber);
nvmlReturn_t nvmlDeviceGetPciInfo_v3(nvmlDevice_t device, nvmlPciInfo_t *pci);
nvmlReturn_t nvmlDeviceGetNumaNodeId(nvmlDevice_t device, unsigned int *node);
nvmlReturn_t nvmlDeviceGetCudaComputeCapability(nvmlDevice_t device, int *major, int *minor);
nvmlReturn_t nvmlDeviceGetNumGpuCores(nvmlDevice_t device, unsigned int *numCores);
nvmlReturn_t nvmlDeviceGetMigMode(nvmlDevice_t device, unsigned int *currentMode,
                                  unsigned int *pendingMode);
nvmlReturn_t nvmlDeviceSetMigMode(nvmlDevice_t device, unsigned int mode,
                                  nvmlReturn_t *activationStatus);
nvmlReturn_t nvmlDeviceGetGpuInstanceProfileInfo(nvmlDevice_t device, unsigned int profile,
                                                 nvmlGpuInstanceProfileInfo_t *info);
nvmlReturn_t nvmlDeviceGetGpuInstanceProfileInfoV(nvmlDevice_t device, unsigned int profile,
                                                  nvmlGpuInstanceProfileInfo_v2_t *info);
nvmlReturn_t nvmlDeviceGetGpuInstancePossiblePlacements_v2(
    nvmlDevice_t device, unsigned int profileId, nvmlGpuInstancePlacement_t *placements,
    unsigned int *count);
nvmlReturn_t nvmlDeviceGetGpuInstanceRemainingCapacity(nvmlDevice_t device,
                                                       unsigned int profileId,
                                                       unsigned int *count);
nvmlReturn_t nvmlDeviceCreateGpuInstanceWithPlacement(
    nvmlDevice_t device, unsigned int profileId, const nvmlGpuInstancePlacement_t *placement,
    nvmlGpuInstance_t *gpuInstance);
nvmlReturn_t nvmlDeviceGetGpuInstances(nvmlDevice_t device, unsigned int profileId,
                                       nvmlGpuInstance_t *gpuInstances, unsigned int *count);
nvmlReturn_t nvmlDeviceGetGpuInstanceById(nvmlDevice_t device, unsigned int id,
                                          nvmlGpuInstance_t *gpuInstance);
nvmlReturn_t nvmlGpuInstanceGetInfo(nvmlGpuInstance_t gpuInstance, nvmlGpuInstanceInfo_t *info);
nvmlReturn_t nvmlGpuInstanceDestroy(nvmlGpuInstance_t gpuInstance);
nvmlReturn_t nvmlGpuInstanceGetComputeInstanceProfileInfo(
    nvmlGpuInstance_t gpuInstance, unsigned int profile, unsigned int engProfile,
    nvmlComputeInstanceProfileInfo_t *info);
nvmlReturn_t nvmlGpuInstanceGetComputeInstanceProfileInfoV(
    nvmlGpuInstance_t gpuInstance, unsigned int profile, unsigned int engProfile,
    nvmlComputeInstanceProfileInfo_v2_t *info);
nvmlReturn_t nvmlGpuInstanceCreateComputeInstance(nvmlGpuInstance_t gpuInstance,
                                                  unsigned int profileId,
                                                  nvmlComputeInstance_t *computeInstance);
nvmlReturn_t nvmlGpuInstanceGetComputeInstances(nvmlGpuInstance_t gpuInstance,
                                                unsigned int profileId,
                                                nvmlComputeInstance_t *computeInstances,
                                                unsigned int *count);
nvmlReturn_t nvmlComputeInstanceGetInfo_v2(nvmlComputeInstance_t computeInstance,
                                           nvmlComputeInstanceInfo_t *info);
nvmlReturn_t nvmlComputeInstanceDestroy(nvmlComputeInstance_t computeInstance);

/* ---- The simulated node ------------------------------------------------------------ */

#define STATE_DIR_ENV "TESSERA_FAKE_NVML_STATE_DIR"
#define STATE_FILE "mock-node.state"
#define STATE_HEADER "tessera-node-state 1"
#define FAKE_MAX_GPUS 64
#define PCI_VENDOR_NVIDIA 0x10deu

/* One physical GPU as the state file describes it. */
struct fake_gpu {
    unsigned int index;
    unsigned int minor;
    char uuid[NVML_DEVICE_UUID_V2_BUFFER_SIZE];
    char name[NVML_DEVICE_NAME_V2_BUFFER_SIZE];
    nvmlBrandType_t brand;
    nvmlDeviceArchitecture_t architecture;
    unsigned long long memory_bytes;
    unsigned int multiprocessors;
    int cc_major;
    int cc_minor;
    unsigned int pci_domain;
    unsigned int pci_bus;
    unsigned int pci_device;
    unsigned int pci_function;
    int has_numa_node;
    int numa_node;
    int mig_capable;
    int mig_enabled;
};

struct fake_node {
    char driver_version[NVML_SYSTEM_DRIVER_VERSION_BUFFER_SIZE];
    int cuda_driver_version;
    unsigned int gpu_count;
    /* In state-file order (by minor). */
    struct fake_gpu gpus[FAKE_MAX_GPUS];
    /* NVML index -> position in gpus. */
    unsigned int by_index[FAKE_MAX_GPUS];
};

/* What a GPU handle points at. A handle's identity is its address in the static table
 * below; the slot only makes a core dump readable. Handles of the MIG library (GPU and
 * compute instances, MIG devices) are its own, passed through untouched. */
struct nvmlDevice_st {
    unsigned int slot;
};

static pthread_mutex_t g_lock = PTHREAD_MUTEX_INITIALIZER;
static unsigned int g_init_count;
static char g_state_dir[4096];
/* The node as read at init (MIG mode is re-read on each query). */
static struct fake_node g_node;
/* The node as just re-read from the file (MIG mode). */
static struct fake_node g_scratch;
static struct nvmlDevice_st g_gpu_handles[FAKE_MAX_GPUS];

/* ---- Parsing ----------------------------------------------------------------------- */

struct name_value {
    const char *name;
    unsigned int value;
};

/* Debug names of nvml-wrapper's `Brand` enum. CloudGaming and VGaming share 11 in
 * nvml.h, so `VGaming` reads back as `CloudGaming`. */
static const struct name_value BRANDS[] = {
    {"Unknown", NVML_BRAND_UNKNOWN},
    {"Quadro", NVML_BRAND_QUADRO},
    {"Tesla", NVML_BRAND_TESLA},
    {"NVS", NVML_BRAND_NVS},
    {"GRID", NVML_BRAND_GRID},
    {"GeForce", NVML_BRAND_GEFORCE},
    {"Titan", NVML_BRAND_TITAN},
    {"VApps", NVML_BRAND_NVIDIA_VAPPS},
    {"VPC", NVML_BRAND_NVIDIA_VPC},
    {"VCS", NVML_BRAND_NVIDIA_VCS},
    {"VWS", NVML_BRAND_NVIDIA_VWS},
    {"CloudGaming", NVML_BRAND_NVIDIA_CLOUD_GAMING},
    {"VGaming", NVML_BRAND_NVIDIA_CLOUD_GAMING},
    {"QuadroRTX", NVML_BRAND_QUADRO_RTX},
    {"NvidiaRTX", NVML_BRAND_NVIDIA_RTX},
    {"Nvidia", NVML_BRAND_NVIDIA},
    {"GeForceRTX", NVML_BRAND_GEFORCE_RTX},
    {"TitanRTX", NVML_BRAND_TITAN_RTX},
};

/* Debug names of nvml-wrapper's `DeviceArchitecture` enum (NVML_DEVICE_ARCH_*). */
static const struct name_value ARCHITECTURES[] = {
    {"Kepler", 2},  {"Maxwell", 3}, {"Pascal", 4},    {"Volta", 5},
    {"Turing", 6},  {"Ampere", 7},  {"Ada", 8},       {"Hopper", 9},
    {"Blackwell", 10}, {"Unknown", NVML_DEVICE_ARCH_UNKNOWN},
};

static int lookup_name(const struct name_value *table, size_t n, const char *name,
                       unsigned int *out) {
    for (size_t i = 0; i < n; i++) {
        if (strcmp(table[i].name, name) == 0) {
            *out = table[i].value;
            return 0;
        }
    }
    return -1;
}

/* CUDA cores per SM by compute capability: the table of `_ConvertSMVer2Cores` in
 * NVIDIA's cuda-samples helper_cuda.h. Must agree with `cuda_cores_per_sm` in
 * src/inventory/nvml/discovery.rs, which divides the core count back into SMs.
 * 0 = unknown. */
static unsigned int cores_per_sm(int major, int minor) {
    switch (major) {
    case 5: return (minor == 0 || minor == 2 || minor == 3) ? 128 : 0;
    case 6: return minor == 0 ? 64 : (minor == 1 || minor == 2) ? 128 : 0;
    case 7: return (minor == 0 || minor == 2 || minor == 5) ? 64 : 0;
    case 8: return minor == 0 ? 64 : (minor == 6 || minor == 7 || minor == 9) ? 128 : 0;
    case 9: return minor == 0 ? 128 : 0;
    case 10: return 128;
    case 11: return minor == 0 ? 128 : 0;
    case 12: return 128;
    default: return 0;
    }
}

static int parse_ull(const char *s, unsigned long long max, unsigned long long *out) {
    char *end = NULL;
    if (*s < '0' || *s > '9')
        return -1;
    errno = 0;
    unsigned long long v = strtoull(s, &end, 10);
    if (errno != 0 || *end != '\0' || v > max)
        return -1;
    *out = v;
    return 0;
}

static int parse_uint(const char *s, unsigned int *out) {
    unsigned long long v;
    if (parse_ull(s, 0xffffffffull, &v) != 0)
        return -1;
    *out = (unsigned int)v;
    return 0;
}

static int parse_int(const char *s, int *out) {
    unsigned long long v;
    int negative = s[0] == '-';
    if (parse_ull(s + negative, 0x7fffffffull, &v) != 0)
        return -1;
    *out = negative ? -(int)v : (int)v;
    return 0;
}

static int copy_value(char *dst, size_t size, const char *value) {
    size_t len = strlen(value);
    if (len == 0 || len >= size)
        return -1;
    memcpy(dst, value, len + 1);
    return 0;
}

/* "9.0" -> 9, 0 */
static int parse_compute_capability(const char *s, int *major, int *minor) {
    char buf[16];
    if (copy_value(buf, sizeof buf, s) != 0)
        return -1;
    char *dot = strchr(buf, '.');
    if (dot == NULL)
        return -1;
    *dot = '\0';
    return (parse_int(buf, major) == 0 && parse_int(dot + 1, minor) == 0 && *major >= 0 &&
            *minor >= 0)
               ? 0
               : -1;
}

/* "0000:19:00.0" (any case, domain of up to 8 hex digits) -> its four parts. */
static int parse_bus_id(const char *s, struct fake_gpu *g) {
    unsigned int domain, bus, device, function;
    int consumed = 0;
    if (sscanf(s, "%x:%x:%x.%x%n", &domain, &bus, &device, &function, &consumed) != 4 ||
        s[consumed] != '\0' || bus > 0xff || device > 0x1f || function > 7)
        return -1;
    g->pci_domain = domain;
    g->pci_bus = bus;
    g->pci_device = device;
    g->pci_function = function;
    return 0;
}

enum gpu_key {
    KEY_INDEX = 1u << 0,
    KEY_MINOR = 1u << 1,
    KEY_UUID = 1u << 2,
    KEY_NAME = 1u << 3,
    KEY_BRAND = 1u << 4,
    KEY_ARCHITECTURE = 1u << 5,
    KEY_MEMORY = 1u << 6,
    KEY_MULTIPROCESSORS = 1u << 7,
    KEY_COMPUTE_CAPABILITY = 1u << 8,
    KEY_PCI_BUS_ID = 1u << 9,
};
#define KEYS_REQUIRED 0x3ffu

/* Applies one `key value` line inside a gpu block; *seen collects the required keys.
 * Returns 0, or -1 for a bad value. Unknown keys are ignored, as state.rs ignores them,
 * and so are the MIG lines the mock backend keeps (`mig-profile`, `mig-gi`, `mig-ci`,
 * `mig-busy`): this library serves no MIG geometry (see the top). */
static int gpu_set(struct fake_gpu *g, unsigned int *seen, const char *key, const char *value) {
    unsigned long long u64;
    unsigned int bit = 0;
    int rc = 0;
    if (strcmp(key, "index") == 0) {
        bit = KEY_INDEX;
        rc = parse_uint(value, &g->index);
    } else if (strcmp(key, "minor") == 0) {
        bit = KEY_MINOR;
        rc = parse_uint(value, &g->minor);
    } else if (strcmp(key, "uuid") == 0) {
        bit = KEY_UUID;
        rc = copy_value(g->uuid, sizeof g->uuid, value);
    } else if (strcmp(key, "name") == 0) {
        bit = KEY_NAME;
        rc = copy_value(g->name, sizeof g->name, value);
    } else if (strcmp(key, "brand") == 0) {
        unsigned int v = 0;
        bit = KEY_BRAND;
        rc = lookup_name(BRANDS, sizeof BRANDS / sizeof BRANDS[0], value, &v);
        g->brand = (nvmlBrandType_t)v;
    } else if (strcmp(key, "architecture") == 0) {
        bit = KEY_ARCHITECTURE;
        rc = lookup_name(ARCHITECTURES, sizeof ARCHITECTURES / sizeof ARCHITECTURES[0], value,
                         &g->architecture);
    } else if (strcmp(key, "memory") == 0) {
        bit = KEY_MEMORY;
        rc = parse_ull(value, ~0ull, &u64);
        g->memory_bytes = u64;
    } else if (strcmp(key, "multiprocessors") == 0) {
        bit = KEY_MULTIPROCESSORS;
        rc = parse_uint(value, &g->multiprocessors);
    } else if (strcmp(key, "compute-capability") == 0) {
        bit = KEY_COMPUTE_CAPABILITY;
        rc = parse_compute_capability(value, &g->cc_major, &g->cc_minor);
    } else if (strcmp(key, "pci-bus-id") == 0) {
        bit = KEY_PCI_BUS_ID;
        rc = parse_bus_id(value, g);
    } else if (strcmp(key, "numa-node") == 0) {
        g->has_numa_node = 1;
        rc = parse_int(value, &g->numa_node);
    } else if (strcmp(key, "mig-capable") == 0) {
        g->mig_capable = strcmp(value, "1") == 0;
    } else if (strcmp(key, "mig-enabled") == 0) {
        g->mig_enabled = strcmp(value, "1") == 0;
    }
    *seen |= bit;
    return rc;
}

struct parse_error {
    nvmlReturn_t code;
    unsigned int line;
    char reason[160];
};

static nvmlReturn_t fail(struct parse_error *err, nvmlReturn_t code, unsigned int line,
                         const char *reason, const char *detail) {
    err->code = code;
    err->line = line;
    snprintf(err->reason, sizeof err->reason, "%s%s%s", reason, detail[0] ? ": " : "",
             detail);
    return code;
}

/* Checks a finished gpu block: required keys present. */
static nvmlReturn_t finish_gpu(unsigned int seen, unsigned int start, struct parse_error *err) {
    if ((seen & KEYS_REQUIRED) != KEYS_REQUIRED)
        return fail(err, NVML_ERROR_DRIVER_NOT_LOADED, start, "gpu block lacks a required key",
                    "");
    return NVML_SUCCESS;
}

/* Parses the whole state file into *node. On failure returns the NVML code and fills
 * *err; *node is then unspecified. */
static nvmlReturn_t parse_state(FILE *f, struct fake_node *node, struct parse_error *err) {
    char *line = NULL;
    size_t cap = 0;
    ssize_t len;
    unsigned int n = 0;
    int in_gpu = 0, have_driver = 0, have_cuda = 0;
    unsigned int seen = 0, gpu_start = 0;
    nvmlReturn_t rc = NVML_SUCCESS;
    struct fake_gpu *cur = NULL;

    memset(node, 0, sizeof *node);
    while (rc == NVML_SUCCESS && (len = getline(&line, &cap, f)) >= 0) {
        n++;
        while (len > 0 && (line[len - 1] == '\n' || line[len - 1] == '\r' ||
                           line[len - 1] == ' ' || line[len - 1] == '\t'))
            line[--len] = '\0';
        if (n == 1) {
            if (strcmp(line, STATE_HEADER) != 0)
                rc = fail(err, NVML_ERROR_LIB_RM_VERSION_MISMATCH, n,
                          "expected `" STATE_HEADER "`", "");
            continue;
        }
        if (len == 0 || line[0] == '#')
            continue;
        char *value = strchr(line, ' ');
        if (value != NULL)
            *value++ = '\0';
        else
            value = line + len;
        const char *key = line;

        if (in_gpu) {
            if (strcmp(key, "end") == 0) {
                rc = finish_gpu(seen, gpu_start, err);
                in_gpu = 0;
            } else if (strcmp(key, "gpu") == 0) {
                rc = fail(err, NVML_ERROR_DRIVER_NOT_LOADED, n, "`gpu` inside a gpu block", "");
            } else if (gpu_set(cur, &seen, key, value) != 0) {
                rc = fail(err, NVML_ERROR_DRIVER_NOT_LOADED, n, "bad value of", key);
            }
        } else if (strcmp(key, "gpu") == 0) {
            if (node->gpu_count == FAKE_MAX_GPUS) {
                rc = fail(err, NVML_ERROR_DRIVER_NOT_LOADED, n, "too many gpus", "");
            } else {
                cur = &node->gpus[node->gpu_count++];
                in_gpu = 1;
                seen = 0;
                gpu_start = n;
            }
        } else if (strcmp(key, "driver-version") == 0) {
            have_driver = 1;
            if (copy_value(node->driver_version, sizeof node->driver_version, value) != 0)
                rc = fail(err, NVML_ERROR_DRIVER_NOT_LOADED, n, "bad value of", key);
        } else if (strcmp(key, "cuda-driver-version") == 0) {
            have_cuda = 1;
            if (parse_int(value, &node->cuda_driver_version) != 0)
                rc = fail(err, NVML_ERROR_DRIVER_NOT_LOADED, n, "bad value of", key);
        }
        /* Unknown top-level keys (`source`, `major`, `health-event`, read where they are
         * used): ignored, as in state.rs. */
    }
    free(line);
    if (rc != NVML_SUCCESS)
        return rc;
    if (ferror(f))
        return fail(err, NVML_ERROR_DRIVER_NOT_LOADED, n, "read error", strerror(errno));
    if (n == 0)
        return fail(err, NVML_ERROR_LIB_RM_VERSION_MISMATCH, 0, "empty file", "");
    if (in_gpu)
        return fail(err, NVML_ERROR_DRIVER_NOT_LOADED, gpu_start, "gpu block without `end`", "");
    if (!have_driver || !have_cuda)
        return fail(err, NVML_ERROR_DRIVER_NOT_LOADED, 0, "missing driver-version or",
                    "cuda-driver-version");
    /* NVML indices must be exactly 0..count-1. */
    int taken[FAKE_MAX_GPUS] = {0};
    for (unsigned int i = 0; i < node->gpu_count; i++) {
        unsigned int index = node->gpus[i].index;
        if (index >= node->gpu_count || taken[index])
            return fail(err, NVML_ERROR_DRIVER_NOT_LOADED, 0,
                        "gpu indices are not a permutation of 0..count-1", "");
        taken[index] = 1;
        node->by_index[index] = i;
    }
    return NVML_SUCCESS;
}

/* Reads `<g_state_dir>/mock-node.state` into *node. `fail_code` is what a missing or
 * unreadable file answers. */
static nvmlReturn_t read_state(struct fake_node *node, nvmlReturn_t fail_code) {
    char path[4200];
    snprintf(path, sizeof path, "%s/%s", g_state_dir, STATE_FILE);
    FILE *f = fopen(path, "r");
    if (f == NULL) {
        fprintf(stderr, "fake-nvml: cannot open %s: %s\n", path, strerror(errno));
        return fail_code;
    }
    struct parse_error err = {NVML_SUCCESS, 0, ""};
    nvmlReturn_t rc = parse_state(f, node, &err);
    fclose(f);
    if (rc != NVML_SUCCESS) {
        fprintf(stderr, "fake-nvml: %s line %u: %s\n", path, err.line, err.reason);
        memset(node, 0, sizeof *node);
    }
    return rc;
}

/* Loads the state file named by the environment into g_node. */
static nvmlReturn_t load_node(void) {
    const char *dir = getenv(STATE_DIR_ENV);
    if (dir == NULL || dir[0] == '\0') {
        fprintf(stderr, "fake-nvml: %s is not set\n", STATE_DIR_ENV);
        return NVML_ERROR_DRIVER_NOT_LOADED;
    }
    if (copy_value(g_state_dir, sizeof g_state_dir, dir) != 0) {
        fprintf(stderr, "fake-nvml: %s is too long\n", STATE_DIR_ENV);
        return NVML_ERROR_DRIVER_NOT_LOADED;
    }
    return read_state(&g_node, NVML_ERROR_DRIVER_NOT_LOADED);
}

/* Gives every handle its coordinates (once; they never change). */
static void init_handles(void) {
    for (unsigned int s = 0; s < FAKE_MAX_GPUS; s++)
        g_gpu_handles[s] = (struct nvmlDevice_st){s};
}

/* ---- The MIG library ---------------------------------------------------------------- */

/* MIG is not this library's: every MIG call goes to the NVML library this names (in
 * the tests, the bridge over go-nvml's models, tests/nvml-models), with this GPU's
 * handle swapped for that library's GPU of the same NVML index. */
#define MIG_LIB_ENV "TESSERA_FAKE_NVML_MIG_LIB"

/* The MIG library's entry points used here, resolved by name. */
#define MIG_CALLS(X)                                                                       \
    X(nvmlInit_v2)                                                                         \
    X(nvmlShutdown)                                                                        \
    X(nvmlDeviceGetHandleByIndex_v2)                                                       \
    X(nvmlDeviceGetUUID)                                                                   \
    X(nvmlDeviceGetMigMode)                                                                \
    X(nvmlDeviceSetMigMode)                                                                \
    X(nvmlDeviceGetGpuInstanceProfileInfo)                                                 \
    X(nvmlDeviceGetGpuInstanceProfileInfoV)                                                \
    X(nvmlDeviceGetGpuInstancePossiblePlacements_v2)                                       \
    X(nvmlDeviceGetGpuInstanceRemainingCapacity)                                           \
    X(nvmlDeviceCreateGpuInstanceWithPlacement)                                            \
    X(nvmlDeviceGetGpuInstances)                                                           \
    X(nvmlDeviceGetGpuInstanceById)                                                        \
    X(nvmlGpuInstanceGetInfo)                                                              \
    X(nvmlGpuInstanceDestroy)                                                              \
    X(nvmlGpuInstanceGetComputeInstanceProfileInfo)                                        \
    X(nvmlGpuInstanceGetComputeInstanceProfileInfoV)                                       \
    X(nvmlGpuInstanceCreateComputeInstance)                                                \
    X(nvmlGpuInstanceGetComputeInstances)                                                  \
    X(nvmlComputeInstanceGetInfo_v2)                                                       \
    X(nvmlComputeInstanceDestroy)

#define MIG_FIELD(name) __typeof__(name) *name;
static struct {
    MIG_CALLS(MIG_FIELD)
} g_mig;
/* Loaded once per process and never unloaded (a Go runtime cannot be). */
static void *g_mig_dl;
/* Whether the MIG library is initialised (between our init and last shutdown). */
static int g_mig_active;

/* Loads and initialises the MIG library when MIG_LIB_ENV names one. */
static nvmlReturn_t mig_lib_init(void) {
    const char *path = getenv(MIG_LIB_ENV);
    if (path == NULL || path[0] == '\0')
        return NVML_SUCCESS;
    if (g_mig_dl == NULL) {
        /* DEEPBIND: its calls to its own exports stay its own, not ours (same names). */
        void *dl = dlopen(path, RTLD_NOW | RTLD_LOCAL | RTLD_DEEPBIND);
        if (dl == NULL) {
            fprintf(stderr, "fake-nvml: %s=%s: %s\n", MIG_LIB_ENV, path, dlerror());
            return NVML_ERROR_LIBRARY_NOT_FOUND;
        }
#define MIG_RESOLVE(name)                                                                  \
    if ((g_mig.name = (__typeof__(name) *)dlsym(dl, #name)) == NULL) {                     \
        fprintf(stderr, "fake-nvml: %s lacks %s\n", path, #name);                          \
        return NVML_ERROR_FUNCTION_NOT_FOUND;                                              \
    }
        MIG_CALLS(MIG_RESOLVE)
#undef MIG_RESOLVE
        g_mig_dl = dl;
    }
    nvmlReturn_t rc = g_mig.nvmlInit_v2();
    if (rc != NVML_SUCCESS) {
        fprintf(stderr, "fake-nvml: %s: nvmlInit_v2 failed (%d)\n", path, (int)rc);
        return rc;
    }
    g_mig_active = 1;
    return NVML_SUCCESS;
}

static void mig_lib_shutdown(void) {
    if (g_mig_active)
        g_mig.nvmlShutdown();
    g_mig_active = 0;
}

/* ---- Internal implementations (called with g_lock held) ---------------------------- */

static nvmlReturn_t init_locked(void) {
    if (g_init_count == 0) {
        init_handles();
        nvmlReturn_t rc = load_node();
        if (rc == NVML_SUCCESS)
            rc = mig_lib_init();
        if (rc != NVML_SUCCESS) {
            memset(&g_node, 0, sizeof g_node);
            return rc;
        }
    }
    g_init_count++;
    return NVML_SUCCESS;
}

static nvmlReturn_t shutdown_locked(void) {
    if (g_init_count == 0)
        return NVML_ERROR_UNINITIALIZED;
    if (--g_init_count == 0) {
        mig_lib_shutdown();
        memset(&g_node, 0, sizeof g_node);
    }
    return NVML_SUCCESS;
}

/* The position of `p` in a static table of `count` elements of `size` bytes starting
 * at `base`; -1 when `p` does not point at one of them. Compares addresses only, so a
 * foreign pointer is never dereferenced. */
static int table_index(const void *p, const void *base, size_t size, size_t count,
                       size_t *out) {
    uintptr_t a = (uintptr_t)p, b = (uintptr_t)base;
    if (p == NULL || a < b || (a - b) % size != 0 || (a - b) / size >= count)
        return -1;
    *out = (a - b) / size;
    return 0;
}

/* Resolves a physical GPU handle to its slot: UNINITIALIZED before init,
 * INVALID_ARGUMENT for a handle that is not one of ours (the MIG library's included). */
static nvmlReturn_t slot_of(nvmlDevice_t device, unsigned int *slot) {
    size_t i;
    if (g_init_count == 0)
        return NVML_ERROR_UNINITIALIZED;
    if (table_index(device, g_gpu_handles, sizeof g_gpu_handles[0], FAKE_MAX_GPUS, &i) != 0 ||
        i >= g_node.gpu_count)
        return NVML_ERROR_INVALID_ARGUMENT;
    *slot = (unsigned int)i;
    return NVML_SUCCESS;
}

/* ---- Health events (`health-event` lines) ---------------------------------------- */

struct fake_health_event {
    unsigned long long seq;
    unsigned int minor;
    int kind; /* 0 xid, 1 lost, 2 clear */
    unsigned long long xid;
    unsigned int gi; /* the `gi` of an xid line; 0xFFFFFFFF: none (the whole GPU) */
};

/* Calls `each` for every `health-event` line of the state file, in order; 0 when the
 * file cannot be read (no events). */
static void scan_health(void (*each)(const struct fake_health_event *, void *), void *arg) {
    char path[4200];
    snprintf(path, sizeof path, "%s/%s", g_state_dir, STATE_FILE);
    FILE *f = fopen(path, "r");
    if (f == NULL)
        return;
    char *line = NULL;
    size_t cap = 0;
    while (getline(&line, &cap, f) >= 0) {
        struct fake_health_event e = {0};
        char what[16] = {0};
        char gi_word[8] = {0};
        if (strncmp(line, "health-event ", 13) != 0)
            continue;
        e.gi = 0xFFFFFFFFu;
        int got = sscanf(line + 13, "%llu %u %15s %llu %7s %u", &e.seq, &e.minor, what, &e.xid,
                         gi_word, &e.gi);
        if (strcmp(what, "xid") == 0 && (got == 4 || (got == 6 && strcmp(gi_word, "gi") == 0)))
            e.kind = 0;
        else if (got == 3 && strcmp(what, "lost") == 0)
            e.kind = 1;
        else if (got == 3 && strcmp(what, "clear") == 0)
            e.kind = 2;
        else
            continue;
        each(&e, arg);
    }
    free(line);
    fclose(f);
}

struct lost_query {
    unsigned int minor;
    int lost;
};

static void lost_each(const struct fake_health_event *e, void *arg) {
    struct lost_query *q = arg;
    if (e->minor == q->minor && e->kind != 0)
        q->lost = e->kind == 1;
}

/* Whether GPU `minor` is lost now (its last lost/clear line is `lost`). */
static int gpu_is_lost(unsigned int minor) {
    struct lost_query q = {minor, 0};
    scan_health(lost_each, &q);
    return q.lost;
}

/* Resolves a physical GPU handle to its GPU (see slot_of); GPU_IS_LOST for a lost GPU. */
static nvmlReturn_t gpu_of(nvmlDevice_t device, const struct fake_gpu **out) {
    unsigned int slot;
    nvmlReturn_t rc = slot_of(device, &slot);
    if (rc == NVML_SUCCESS && gpu_is_lost(g_node.gpus[slot].minor))
        return NVML_ERROR_GPU_IS_LOST;
    if (rc == NVML_SUCCESS)
        *out = &g_node.gpus[slot];
    return rc;
}

#define FAKE_MAX_EVENT_SETS 8

struct nvmlEventSet_st {
    int used;
    unsigned long long last_seq;
    unsigned long long types[FAKE_MAX_GPUS];
};
static struct nvmlEventSet_st g_event_sets[FAKE_MAX_EVENT_SETS];

static void max_seq_each(const struct fake_health_event *e, void *arg) {
    unsigned long long *max = arg;
    if (e->seq > *max)
        *max = e->seq;
}

static nvmlReturn_t event_set_of(nvmlEventSet_t set, struct nvmlEventSet_st **out) {
    size_t i;
    if (g_init_count == 0)
        return NVML_ERROR_UNINITIALIZED;
    if (table_index(set, g_event_sets, sizeof g_event_sets[0], FAKE_MAX_EVENT_SETS, &i) != 0 ||
        !g_event_sets[i].used)
        return NVML_ERROR_INVALID_ARGUMENT;
    *out = &g_event_sets[i];
    return NVML_SUCCESS;
}

static nvmlReturn_t event_set_create(nvmlEventSet_t *set) {
    if (g_init_count == 0)
        return NVML_ERROR_UNINITIALIZED;
    if (set == NULL)
        return NVML_ERROR_INVALID_ARGUMENT;
    for (unsigned int i = 0; i < FAKE_MAX_EVENT_SETS; i++) {
        if (!g_event_sets[i].used) {
            memset(&g_event_sets[i], 0, sizeof g_event_sets[i]);
            g_event_sets[i].used = 1;
            scan_health(max_seq_each, &g_event_sets[i].last_seq);
            *set = &g_event_sets[i];
            return NVML_SUCCESS;
        }
    }
    return NVML_ERROR_INSUFFICIENT_RESOURCES;
}

static nvmlReturn_t register_events(nvmlDevice_t device, unsigned long long types,
                                    nvmlEventSet_t set) {
    struct nvmlEventSet_st *es;
    const struct fake_gpu *g;
    unsigned int slot;
    nvmlReturn_t rc = event_set_of(set, &es);
    if (rc == NVML_SUCCESS)
        rc = gpu_of(device, &g);
    if (rc == NVML_SUCCESS)
        rc = slot_of(device, &slot);
    if (rc == NVML_SUCCESS)
        es->types[slot] |= types;
    return rc;
}

struct next_query {
    struct nvmlEventSet_st *es;
    int found;
    struct fake_health_event event;
};

static void next_each(const struct fake_health_event *e, void *arg) {
    struct next_query *q = arg;
    if (q->found || e->seq <= q->es->last_seq)
        return;
    q->es->last_seq = e->seq;
    if (e->kind != 0)
        return;
    for (unsigned int i = 0; i < g_node.gpu_count; i++) {
        if (g_node.gpus[i].minor == e->minor &&
            (q->es->types[i] & (unsigned long long)nvmlEventTypeXidCriticalError)) {
            q->found = 1;
            q->event = *e;
            return;
        }
    }
}

/* One try: fills *data with the next deliverable event of the set. */
static nvmlReturn_t event_set_try(nvmlEventSet_t set, nvmlEventData_t *data) {
    struct nvmlEventSet_st *es;
    nvmlReturn_t rc = event_set_of(set, &es);
    if (rc != NVML_SUCCESS)
        return rc;
    if (data == NULL)
        return NVML_ERROR_INVALID_ARGUMENT;
    struct next_query q = {es, 0, {0}};
    scan_health(next_each, &q);
    if (!q.found)
        return NVML_ERROR_TIMEOUT;
    for (unsigned int i = 0; i < g_node.gpu_count; i++) {
        if (g_node.gpus[i].minor == q.event.minor) {
            data->device = &g_gpu_handles[i];
            break;
        }
    }
    data->eventType = (unsigned long long)nvmlEventTypeXidCriticalError;
    data->eventData = q.event.xid;
    data->gpuInstanceId = q.event.gi;
    data->computeInstanceId = q.event.gi == 0xFFFFFFFFu ? 0xFFFFFFFFu : 0;
    return NVML_SUCCESS;
}

static nvmlReturn_t event_set_free(nvmlEventSet_t set) {
    struct nvmlEventSet_st *es;
    nvmlReturn_t rc = event_set_of(set, &es);
    if (rc == NVML_SUCCESS)
        es->used = 0;
    return rc;
}

static nvmlReturn_t copy_string(char *dst, unsigned int length, const char *src) {
    if (dst == NULL)
        return NVML_ERROR_INVALID_ARGUMENT;
    size_t need = strlen(src) + 1;
    if (need > length)
        return NVML_ERROR_INSUFFICIENT_SIZE;
    memcpy(dst, src, need);
    return NVML_SUCCESS;
}

static nvmlReturn_t driver_version(char *version, unsigned int length) {
    if (g_init_count == 0)
        return NVML_ERROR_UNINITIALIZED;
    return copy_string(version, length, g_node.driver_version);
}

static nvmlReturn_t cuda_driver_version(int *version) {
    if (g_init_count == 0)
        return NVML_ERROR_UNINITIALIZED;
    if (version == NULL)
        return NVML_ERROR_INVALID_ARGUMENT;
    *version = g_node.cuda_driver_version;
    return NVML_SUCCESS;
}

static nvmlReturn_t device_count(unsigned int *count) {
    if (g_init_count == 0)
        return NVML_ERROR_UNINITIALIZED;
    if (count == NULL)
        return NVML_ERROR_INVALID_ARGUMENT;
    *count = g_node.gpu_count;
    return NVML_SUCCESS;
}

static nvmlReturn_t handle_by_index(unsigned int index, nvmlDevice_t *device) {
    if (g_init_count == 0)
        return NVML_ERROR_UNINITIALIZED;
    if (device == NULL || index >= g_node.gpu_count)
        return NVML_ERROR_INVALID_ARGUMENT;
    *device = &g_gpu_handles[g_node.by_index[index]];
    return NVML_SUCCESS;
}

/* A GPU's UUID; a handle of the MIG library (a MIG device's) is its to answer. */
static nvmlReturn_t device_uuid(nvmlDevice_t device, char *uuid, unsigned int length) {
    size_t i;
    if (g_init_count != 0 && g_mig_active &&
        table_index(device, g_gpu_handles, sizeof g_gpu_handles[0], FAKE_MAX_GPUS, &i) != 0)
        return g_mig.nvmlDeviceGetUUID(device, uuid, length);
    const struct fake_gpu *g;
    nvmlReturn_t rc = gpu_of(device, &g);
    return rc != NVML_SUCCESS ? rc : copy_string(uuid, length, g->uuid);
}

static nvmlReturn_t device_name(nvmlDevice_t device, char *name, unsigned int length) {
    const struct fake_gpu *g;
    nvmlReturn_t rc = gpu_of(device, &g);
    return rc != NVML_SUCCESS ? rc : copy_string(name, length, g->name);
}

static nvmlReturn_t device_brand(nvmlDevice_t device, nvmlBrandType_t *type) {
    const struct fake_gpu *g;
    nvmlReturn_t rc = gpu_of(device, &g);
    if (rc != NVML_SUCCESS)
        return rc;
    if (type == NULL)
        return NVML_ERROR_INVALID_ARGUMENT;
    *type = g->brand;
    return NVML_SUCCESS;
}

static nvmlReturn_t device_architecture(nvmlDevice_t device, nvmlDeviceArchitecture_t *arch) {
    const struct fake_gpu *g;
    nvmlReturn_t rc = gpu_of(device, &g);
    if (rc != NVML_SUCCESS)
        return rc;
    if (arch == NULL)
        return NVML_ERROR_INVALID_ARGUMENT;
    *arch = g->architecture;
    return NVML_SUCCESS;
}

/* MIG mode (below, with the rest of MIG). */
static nvmlReturn_t mig_mode_of(const struct fake_gpu *g, unsigned int *mode);

/* ---- The fake driver's ledger and simulated GPU ---------------------------------- */

#define LEDGER_SIZE 65536
#define LEDGER_RECS 256

static const volatile uint64_t *g_ledger;
static int g_ledger_tried;

/* The fake driver's ledger (FAKE_CUDA_LEDGER), mapped read-only; NULL without one. */
static const volatile uint64_t *ledger_map(void) {
    if (g_ledger_tried)
        return g_ledger;
    g_ledger_tried = 1;
    const char *path = getenv("FAKE_CUDA_LEDGER");
    if (path == NULL || path[0] == 0)
        return NULL;
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) {
        fprintf(stderr, "fake-nvml: ledger %s: %s\n", path, strerror(errno));
        return NULL;
    }
    struct stat st;
    void *m = MAP_FAILED;
    if (fstat(fd, &st) == 0 && st.st_size >= LEDGER_SIZE)
        m = mmap(NULL, LEDGER_SIZE, PROT_READ, MAP_SHARED, fd, 0);
    close(fd);
    if (m == MAP_FAILED) {
        fprintf(stderr, "fake-nvml: ledger %s: cannot map %d bytes\n", path, LEDGER_SIZE);
        return NULL;
    }
    g_ledger = m;
    return g_ledger;
}

static int hex_digit(char c) {
    if (c >= '0' && c <= '9')
        return c - '0';
    if (c >= 'a' && c <= 'f')
        return c - 'a' + 10;
    if (c >= 'A' && c <= 'F')
        return c - 'A' + 10;
    return -1;
}

/* "GPU-xxxxxxxx-xxxx-..." to its 16 bytes, as the fake driver parses it. */
static int uuid_bytes(const char *uuid, unsigned char raw[16]) {
    if (strncmp(uuid, "GPU-", 4) != 0)
        return -1;
    int k = 0;
    for (const char *c = uuid + 4; *c && k < 32; c++) {
        if (*c == '-')
            continue;
        int v = hex_digit(*c);
        if (v < 0)
            return -1;
        if (k % 2 == 0)
            raw[k / 2] = (unsigned char)(v << 4);
        else
            raw[k / 2] |= (unsigned char)v;
        k++;
    }
    return k == 32 ? 0 : -1;
}

/* The ledger's device index of the GPU with this UUID, or -1. */
static int ledger_device(const volatile uint64_t *ledger, const char *uuid) {
    unsigned char raw[16];
    if (uuid_bytes(uuid, raw) == 0) {
        for (int d = 0; d < 8; d++) {
            if (ledger[(64 + 64 * d + 48) / 8] != 1)
                continue;
            const volatile unsigned char *u = (const volatile unsigned char *)ledger + 64 + 64 * d + 32;
            int same = 1;
            for (int i = 0; i < 16; i++)
                same &= u[i] == raw[i];
            if (same)
                return d;
        }
    }
    const char *devices = getenv("FAKE_CUDA_DEVICES");
    if (devices == NULL)
        return -1;
    char buf[1024];
    snprintf(buf, sizeof buf, "%s", devices);
    int d = 0;
    for (char *save = NULL, *tok = strtok_r(buf, ",", &save); tok != NULL && d < 8;
         tok = strtok_r(NULL, ",", &save)) {
        char *colon = strrchr(tok, ':');
        if (colon == NULL)
            continue;
        *colon = 0;
        if (strcasecmp(tok, uuid) == 0)
            return d;
        d++;
    }
    return -1;
}

/* Bytes the fake driver holds on this GPU (0 without a ledger). */
static unsigned long long ledger_used(const struct fake_gpu *g) {
    const volatile uint64_t *ledger = ledger_map();
    int d = ledger != NULL ? ledger_device(ledger, g->uuid) : -1;
    return d < 0 ? 0 : ledger[(64 + 64 * d) / 8];
}

static struct fakesim g_sim;
static int g_sim_state; /* 0 not tried, 1 open, -1 none */
static uint64_t g_sim_seed;

/* The simulated GPUs (FAKE_CUDA_SIM), or NULL. */
static struct fakesim *sim_handle(void) {
    if (g_sim_state == 0) {
        const char *path = getenv("FAKE_CUDA_SIM");
        g_sim_state = -1;
        if (path != NULL && path[0] != 0 && fakesim_open(&g_sim, path) == 0) {
            fakesim_setup(&g_sim, getenv("FAKE_CUDA_DEVICES"), getenv("FAKE_CUDA_SIM_LOG"));
            const char *seed = getenv("FAKE_SIM_SEED");
            g_sim_seed = seed != NULL ? strtoull(seed, NULL, 10) : 0;
            g_sim_state = 1;
        }
    }
    return g_sim_state == 1 ? &g_sim : NULL;
}

/* Total minus what the fake driver holds (everything is free without a ledger). */
static nvmlReturn_t device_memory(nvmlDevice_t device, nvmlMemory_t *memory) {
    const struct fake_gpu *g;
    nvmlReturn_t rc = gpu_of(device, &g);
    if (rc != NVML_SUCCESS)
        return rc;
    if (memory == NULL)
        return NVML_ERROR_INVALID_ARGUMENT;
    unsigned long long used = ledger_used(g);
    memory->total = g->memory_bytes;
    memory->used = used;
    memory->free = used >= g->memory_bytes ? 0 : g->memory_bytes - used;
    return NVML_SUCCESS;
}

static nvmlReturn_t device_memory_v2(nvmlDevice_t device, nvmlMemory_v2_t *memory) {
    const struct fake_gpu *g;
    nvmlReturn_t rc = gpu_of(device, &g);
    if (rc != NVML_SUCCESS)
        return rc;
    if (memory == NULL)
        return NVML_ERROR_INVALID_ARGUMENT;
    if (memory->version != nvmlMemory_v2)
        return NVML_ERROR_ARGUMENT_VERSION_MISMATCH;
    unsigned long long used = ledger_used(g);
    memory->total = g->memory_bytes;
    memory->reserved = 0;
    memory->used = used;
    memory->free = used >= g->memory_bytes ? 0 : g->memory_bytes - used;
    return NVML_SUCCESS;
}

static nvmlReturn_t running_processes(nvmlDevice_t device, unsigned int *count,
                                      nvmlProcessInfo_t *infos) {
    const struct fake_gpu *g;
    nvmlReturn_t rc = gpu_of(device, &g);
    if (rc != NVML_SUCCESS)
        return rc;
    if (count == NULL)
        return NVML_ERROR_INVALID_ARGUMENT;
    static nvmlProcessInfo_t found[LEDGER_RECS];
    unsigned int n = 0;
    const volatile uint64_t *ledger = ledger_map();
    int d = ledger != NULL ? ledger_device(ledger, g->uuid) : -1;
    for (int r = 0; d >= 0 && r < LEDGER_RECS; r++) {
        const volatile uint64_t *rec = &ledger[(4096 + 128 * r) / 8];
        uint64_t bytes = rec[1 + d];
        if (rec[0] == 0 || bytes == 0)
            continue;
        found[n].pid = (unsigned int)rec[9];
        found[n].usedGpuMemory = bytes;
        found[n].gpuInstanceId = 0xFFFFFFFFu;
        found[n].computeInstanceId = 0xFFFFFFFFu;
        n++;
    }
    if (*count < n) {
        *count = n;
        return NVML_ERROR_INSUFFICIENT_SIZE;
    }
    if (n > 0 && infos == NULL)
        return NVML_ERROR_INVALID_ARGUMENT;
    if (n > 0)
        memcpy(infos, found, n * sizeof found[0]);
    *count = n;
    return NVML_SUCCESS;
}

static nvmlReturn_t process_utilization(nvmlDevice_t device, nvmlProcessUtilizationSample_t *out,
                                        unsigned int *count, unsigned long long last_seen) {
    const struct fake_gpu *g;
    nvmlReturn_t rc = gpu_of(device, &g);
    if (rc != NVML_SUCCESS)
        return rc;
    if (count == NULL)
        return NVML_ERROR_INVALID_ARGUMENT;
    unsigned int mode = NVML_DEVICE_MIG_DISABLE;
    if (g->mig_capable && mig_mode_of(g, &mode) == NVML_SUCCESS &&
        mode == NVML_DEVICE_MIG_ENABLE)
        return NVML_ERROR_NOT_SUPPORTED;
    nvmlProcessUtilizationSample_t found[FAKESIM_PROCS];
    unsigned int n = 0;
    struct fakesim *s = sim_handle();
    int gi = s != NULL ? fakesim_index_of(s, g->uuid) : -1;
    if (gi >= 0) {
        fakesim_lock(s);
        struct fakesim_gpu *sg = fakesim_advance(s, (unsigned)gi, fakesim_now());
        uint64_t k = sg->last_tick;
        unsigned long long ts = fakesim_tick_ns(k) / 1000;
        for (unsigned int i = 0; ts > last_seen && i < FAKESIM_PROCS; i++) {
            const struct fakesim_proc *p = &sg->procs[i];
            uint64_t busy;
            if (p->state != FAKESIM_LIVE || k <= p->join_tick ||
                !fakesim_window(p->snaps, k, p->join_tick, &busy) || !fakesim_alive(s, (unsigned)gi, i))
                continue;
            found[n].pid = p->pid;
            found[n].timeStamp = ts;
            found[n].smUtil = fakesim_percent(busy, fakesim_noise(g_sim_seed, p->pid, k));
            found[n].memUtil = 0;
            found[n].encUtil = 0;
            found[n].decUtil = 0;
            n++;
        }
        fakesim_unlock(s);
    }
    if (out == NULL || *count < n) {
        *count = n;
        return n > 0 ? NVML_ERROR_INSUFFICIENT_SIZE : NVML_SUCCESS;
    }
    if (n > 0)
        memcpy(out, found, n * sizeof found[0]);
    *count = n;
    return NVML_SUCCESS;
}

static nvmlReturn_t utilization_rates(nvmlDevice_t device, nvmlUtilization_t *u) {
    const struct fake_gpu *g;
    nvmlReturn_t rc = gpu_of(device, &g);
    if (rc != NVML_SUCCESS)
        return rc;
    if (u == NULL)
        return NVML_ERROR_INVALID_ARGUMENT;
    struct fakesim *s = sim_handle();
    unsigned int mode = NVML_DEVICE_MIG_DISABLE;
    if (g->mig_capable && mig_mode_of(g, &mode) == NVML_SUCCESS &&
        mode == NVML_DEVICE_MIG_ENABLE)
        return NVML_ERROR_NOT_SUPPORTED;
    if (s == NULL)
        return NVML_ERROR_NOT_SUPPORTED;
    int gi = fakesim_index_of(s, g->uuid);
    u->gpu = 0;
    u->memory = 0;
    if (gi >= 0) {
        fakesim_lock(s);
        struct fakesim_gpu *sg = fakesim_advance(s, (unsigned)gi, fakesim_now());
        uint64_t busy;
        if (fakesim_window(sg->snaps, sg->last_tick, sg->init_tick, &busy))
            u->gpu = fakesim_percent(busy, fakesim_noise(g_sim_seed, 0xFFFFFFFFu, sg->last_tick));
        fakesim_unlock(s);
    }
    return NVML_SUCCESS;
}

static nvmlReturn_t device_minor(nvmlDevice_t device, unsigned int *minor) {
    const struct fake_gpu *g;
    nvmlReturn_t rc = gpu_of(device, &g);
    if (rc != NVML_SUCCESS)
        return rc;
    if (minor == NULL)
        return NVML_ERROR_INVALID_ARGUMENT;
    *minor = g->minor;
    return NVML_SUCCESS;
}

static nvmlReturn_t device_index(nvmlDevice_t device, unsigned int *index) {
    const struct fake_gpu *g;
    nvmlReturn_t rc = gpu_of(device, &g);
    if (rc != NVML_SUCCESS)
        return rc;
    if (index == NULL)
        return NVML_ERROR_INVALID_ARGUMENT;
    *index = g->index;
    return NVML_SUCCESS;
}

/* As the real driver formats them: busId `%08X:%02X:%02X.%X` (upper case, 8-digit
 * domain), busIdLegacy with a 4-digit domain; vendor NVIDIA in pciDeviceId's low half. */
static nvmlReturn_t device_pci_info(nvmlDevice_t device, nvmlPciInfo_t *pci) {
    const struct fake_gpu *g;
    nvmlReturn_t rc = gpu_of(device, &g);
    if (rc != NVML_SUCCESS)
        return rc;
    if (pci == NULL)
        return NVML_ERROR_INVALID_ARGUMENT;
    memset(pci, 0, sizeof *pci);
    snprintf(pci->busId, sizeof pci->busId, "%08X:%02X:%02X.%X", g->pci_domain, g->pci_bus,
             g->pci_device, g->pci_function);
    snprintf(pci->busIdLegacy, sizeof pci->busIdLegacy, "%04X:%02X:%02X.%X",
             g->pci_domain & 0xffffu, g->pci_bus, g->pci_device, g->pci_function);
    pci->domain = g->pci_domain;
    pci->bus = g->pci_bus;
    pci->device = g->pci_device;
    pci->pciDeviceId = PCI_VENDOR_NVIDIA;
    pci->pciSubSystemId = 0;
    return NVML_SUCCESS;
}

static nvmlReturn_t device_numa_node(nvmlDevice_t device, unsigned int *node) {
    const struct fake_gpu *g;
    nvmlReturn_t rc = gpu_of(device, &g);
    if (rc != NVML_SUCCESS)
        return rc;
    if (node == NULL)
        return NVML_ERROR_INVALID_ARGUMENT;
    if (!g->has_numa_node || g->numa_node < 0)
        return NVML_ERROR_NOT_SUPPORTED;
    *node = (unsigned int)g->numa_node;
    return NVML_SUCCESS;
}

static nvmlReturn_t device_compute_capability(nvmlDevice_t device, int *major, int *minor) {
    const struct fake_gpu *g;
    nvmlReturn_t rc = gpu_of(device, &g);
    if (rc != NVML_SUCCESS)
        return rc;
    if (major == NULL || minor == NULL)
        return NVML_ERROR_INVALID_ARGUMENT;
    *major = g->cc_major;
    *minor = g->cc_minor;
    return NVML_SUCCESS;
}

static nvmlReturn_t device_num_cores(nvmlDevice_t device, unsigned int *cores) {
    const struct fake_gpu *g;
    nvmlReturn_t rc = gpu_of(device, &g);
    if (rc != NVML_SUCCESS)
        return rc;
    if (cores == NULL)
        return NVML_ERROR_INVALID_ARGUMENT;
    unsigned int per_sm = cores_per_sm(g->cc_major, g->cc_minor);
    if (per_sm == 0)
        return NVML_ERROR_NOT_SUPPORTED;
    *cores = g->multiprocessors * per_sm;
    return NVML_SUCCESS;
}

/* ---- MIG (called with g_lock held): the MIG library's, see the top ---------------- */

/* The MIG library's handle of a MIG-capable GPU: its GPU at this GPU's NVML index.
 * NOT_SUPPORTED for a GPU that cannot do MIG, or when no MIG library is loaded. */
static nvmlReturn_t mig_device(nvmlDevice_t device, nvmlDevice_t *out) {
    const struct fake_gpu *g;
    nvmlReturn_t rc = gpu_of(device, &g);
    if (rc != NVML_SUCCESS)
        return rc;
    if (!g->mig_capable || !g_mig_active)
        return NVML_ERROR_NOT_SUPPORTED;
    return g_mig.nvmlDeviceGetHandleByIndex_v2(g->index, out);
}

/* Whether MIG mode is on: the MIG library's mode when one is loaded, else the state
 * file's (re-read: the mock backend may have switched it). */
static nvmlReturn_t mig_mode_of(const struct fake_gpu *g, unsigned int *mode) {
    if (!g->mig_capable)
        return NVML_ERROR_NOT_SUPPORTED;
    if (g_mig_active) {
        nvmlDevice_t d;
        unsigned int pending;
        nvmlReturn_t rc = g_mig.nvmlDeviceGetHandleByIndex_v2(g->index, &d);
        return rc != NVML_SUCCESS ? rc : g_mig.nvmlDeviceGetMigMode(d, mode, &pending);
    }
    nvmlReturn_t rc = read_state(&g_scratch, NVML_ERROR_UNKNOWN);
    if (rc != NVML_SUCCESS)
        return rc;
    if (g->index >= g_scratch.gpu_count)
        return NVML_ERROR_UNKNOWN; /* the node changed under us */
    const struct fake_gpu *now = &g_scratch.gpus[g_scratch.by_index[g->index]];
    *mode = now->mig_enabled ? NVML_DEVICE_MIG_ENABLE : NVML_DEVICE_MIG_DISABLE;
    return NVML_SUCCESS;
}

static nvmlReturn_t device_mig_mode(nvmlDevice_t device, unsigned int *current,
                                    unsigned int *pending) {
    const struct fake_gpu *g;
    nvmlReturn_t rc = gpu_of(device, &g);
    if (rc != NVML_SUCCESS)
        return rc;
    if (current == NULL || pending == NULL)
        return NVML_ERROR_INVALID_ARGUMENT;
    rc = mig_mode_of(g, current);
    if (rc == NVML_SUCCESS)
        *pending = *current;
    return rc;
}

/* An export's body: a call on a GPU's handle, forwarded (under the lock) with the MIG
 * library's handle of that GPU. */
#define MIG_ON_GPU(call, device, ...)                                                      \
    do {                                                                                   \
        nvmlDevice_t mig_device_;                                                          \
        pthread_mutex_lock(&g_lock);                                                       \
        nvmlReturn_t mig_rc_ = mig_device((device), &mig_device_);                         \
        if (mig_rc_ == NVML_SUCCESS)                                                       \
            mig_rc_ = g_mig.call(mig_device_, __VA_ARGS__);                                \
        pthread_mutex_unlock(&g_lock);                                                     \
        return mig_rc_;                                                                    \
    } while (0)

/* An export's body: a call on a handle the MIG library gave out (a GPU or compute
 * instance), forwarded under the lock. Without a MIG library no instance can exist. */
#define MIG_ON_INSTANCE(call, ...)                                                         \
    do {                                                                                   \
        pthread_mutex_lock(&g_lock);                                                       \
        nvmlReturn_t mig_rc_ = g_init_count == 0 ? NVML_ERROR_UNINITIALIZED                \
                               : !g_mig_active   ? NVML_ERROR_INVALID_ARGUMENT             \
                                                 : g_mig.call(__VA_ARGS__);                \
        pthread_mutex_unlock(&g_lock);                                                     \
        return mig_rc_;                                                                    \
    } while (0)

/* `info->device` is the parent GPU: ours, not the MIG library's. */
static nvmlReturn_t gpu_instance_info(nvmlGpuInstance_t gpu_instance,
                                      nvmlGpuInstanceInfo_t *info) {
    if (g_init_count == 0)
        return NVML_ERROR_UNINITIALIZED;
    if (!g_mig_active)
        return NVML_ERROR_INVALID_ARGUMENT;
    nvmlReturn_t rc = g_mig.nvmlGpuInstanceGetInfo(gpu_instance, info);
    if (rc != NVML_SUCCESS)
        return rc;
    for (unsigned int slot = 0; slot < g_node.gpu_count; slot++) {
        nvmlDevice_t theirs;
        if (g_mig.nvmlDeviceGetHandleByIndex_v2(g_node.gpus[slot].index, &theirs) ==
                NVML_SUCCESS &&
            theirs == info->device) {
            info->device = &g_gpu_handles[slot];
            return NVML_SUCCESS;
        }
    }
    return NVML_ERROR_UNKNOWN; /* a GPU instance of a GPU this node does not have */
}

/* ---- Exported NVML entry points ---------------------------------------------------- */

#define LOCKED(expr)                                                                       \
    do {                                                                                   \
        pthread_mutex_lock(&g_lock);                                                       \
        nvmlReturn_t locked_rc_ = (expr);                                                  \
        pthread_mutex_unlock(&g_lock);                                                     \
        return locked_rc_;                                                                 \
    } while (0)

nvmlReturn_t nvmlInit_v2(void) { LOCKED(init_locked()); }

/* Flags (NO_GPUS, NO_ATTACH) change nothing for a simulated node. */
nvmlReturn_t nvmlInitWithFlags(unsigned int flags) {
    (void)flags;
    LOCKED(init_locked());
}

nvmlReturn_t nvmlShutdown(void) { LOCKED(shutdown_locked()); }

nvmlReturn_t nvmlEventSetCreate(nvmlEventSet_t *set) { LOCKED(event_set_create(set)); }

nvmlReturn_t nvmlDeviceRegisterEvents(nvmlDevice_t device, unsigned long long eventTypes,
                                      nvmlEventSet_t set) {
    LOCKED(register_events(device, eventTypes, set));
}

/* Polls the state file every 10 ms until an event or the timeout, without holding the
 * library lock while sleeping. */
nvmlReturn_t nvmlEventSetWait_v2(nvmlEventSet_t set, nvmlEventData_t *data,
                                 unsigned int timeoutms) {
    unsigned int waited = 0;
    for (;;) {
        pthread_mutex_lock(&g_lock);
        nvmlReturn_t rc = event_set_try(set, data);
        pthread_mutex_unlock(&g_lock);
        if (rc != NVML_ERROR_TIMEOUT || waited >= timeoutms)
            return rc;
        struct timespec ts = {0, 10 * 1000 * 1000};
        nanosleep(&ts, NULL);
        waited += 10;
    }
}

nvmlReturn_t nvmlEventSetFree(nvmlEventSet_t set) { LOCKED(event_set_free(set)); }

/* The strings of the real library, so that logs read the same. */
const char *nvmlErrorString(nvmlReturn_t result) {
    switch (result) {
    case NVML_SUCCESS: return "Success";
    case NVML_ERROR_UNINITIALIZED: return "Uninitialized";
    case NVML_ERROR_INVALID_ARGUMENT: return "Invalid Argument";
    case NVML_ERROR_NOT_SUPPORTED: return "Not Supported";
    case NVML_ERROR_NO_PERMISSION: return "Insufficient Permissions";
    case NVML_ERROR_ALREADY_INITIALIZED: return "Already Initialized";
    case NVML_ERROR_NOT_FOUND: return "Not Found";
    case NVML_ERROR_INSUFFICIENT_SIZE: return "Insufficient Size";
    case NVML_ERROR_INSUFFICIENT_POWER: return "Insufficient External Power";
    case NVML_ERROR_DRIVER_NOT_LOADED: return "Driver Not Loaded";
    case NVML_ERROR_TIMEOUT: return "Timeout";
    case NVML_ERROR_IRQ_ISSUE: return "Interrupt request issue";
    case NVML_ERROR_LIBRARY_NOT_FOUND: return "NVML Shared Library Not Found";
    case NVML_ERROR_FUNCTION_NOT_FOUND: return "Function Not Found";
    case NVML_ERROR_CORRUPTED_INFOROM: return "Corrupted infoROM";
    case NVML_ERROR_GPU_IS_LOST: return "GPU is lost";
    case NVML_ERROR_RESET_REQUIRED: return "GPU requires restart";
    case NVML_ERROR_OPERATING_SYSTEM: return "GPU access blocked by the operating system";
    case NVML_ERROR_LIB_RM_VERSION_MISMATCH: return "Driver/library version mismatch";
    case NVML_ERROR_IN_USE: return "In use by another client";
    case NVML_ERROR_MEMORY: return "Insufficient Memory";
    case NVML_ERROR_NO_DATA: return "No data";
    case NVML_ERROR_VGPU_ECC_NOT_SUPPORTED:
        return "Requested operation is not supported when ECC is enabled";
    case NVML_ERROR_INSUFFICIENT_RESOURCES: return "Insufficient Resources";
    case NVML_ERROR_FREQ_NOT_SUPPORTED: return "Frequency Not Supported";
    case NVML_ERROR_ARGUMENT_VERSION_MISMATCH: return "Argument Version Mismatch";
    case NVML_ERROR_DEPRECATED: return "Deprecated";
    case NVML_ERROR_NOT_READY: return "Not Ready";
    case NVML_ERROR_GPU_NOT_FOUND: return "GPU Not Found";
    case NVML_ERROR_INVALID_STATE: return "Invalid State";
    case NVML_ERROR_UNKNOWN: return "Unknown Error";
    }
    return "Unknown Error";
}

nvmlReturn_t nvmlSystemGetDriverVersion(char *version, unsigned int length) {
    LOCKED(driver_version(version, length));
}

nvmlReturn_t nvmlSystemGetCudaDriverVersion(int *cudaDriverVersion) {
    LOCKED(cuda_driver_version(cudaDriverVersion));
}

nvmlReturn_t nvmlSystemGetCudaDriverVersion_v2(int *cudaDriverVersion) {
    LOCKED(cuda_driver_version(cudaDriverVersion));
}

nvmlReturn_t nvmlDeviceGetCount_v2(unsigned int *deviceCount) { LOCKED(device_count(deviceCount)); }

nvmlReturn_t nvmlDeviceGetHandleByIndex_v2(unsigned int index, nvmlDevice_t *device) {
    LOCKED(handle_by_index(index, device));
}

nvmlReturn_t nvmlDeviceGetIndex(nvmlDevice_t device, unsigned int *index) {
    LOCKED(device_index(device, index));
}

nvmlReturn_t nvmlDeviceGetUUID(nvmlDevice_t device, char *uuid, unsigned int length) {
    LOCKED(device_uuid(device, uuid, length));
}

nvmlReturn_t nvmlDeviceGetName(nvmlDevice_t device, char *name, unsigned int length) {
    LOCKED(device_name(device, name, length));
}

nvmlReturn_t nvmlDeviceGetBrand(nvmlDevice_t device, nvmlBrandType_t *type) {
    LOCKED(device_brand(device, type));
}

nvmlReturn_t nvmlDeviceGetArchitecture(nvmlDevice_t device, nvmlDeviceArchitecture_t *arch) {
    LOCKED(device_architecture(device, arch));
}

nvmlReturn_t nvmlDeviceGetMemoryInfo(nvmlDevice_t device, nvmlMemory_t *memory) {
    LOCKED(device_memory(device, memory));
}

nvmlReturn_t nvmlDeviceGetMemoryInfo_v2(nvmlDevice_t device, nvmlMemory_v2_t *memory) {
    LOCKED(device_memory_v2(device, memory));
}

nvmlReturn_t nvmlDeviceGetProcessUtilization(nvmlDevice_t device,
                                             nvmlProcessUtilizationSample_t *utilization,
                                             unsigned int *processSamplesCount,
                                             unsigned long long lastSeenTimeStamp) {
    LOCKED(process_utilization(device, utilization, processSamplesCount, lastSeenTimeStamp));
}

nvmlReturn_t nvmlDeviceGetUtilizationRates(nvmlDevice_t device, nvmlUtilization_t *utilization) {
    LOCKED(utilization_rates(device, utilization));
}

nvmlReturn_t nvmlDeviceGetComputeRunningProcesses_v3(nvmlDevice_t device, unsigned int *infoCount,
                                                     nvmlProcessInfo_t *infos) {
    LOCKED(running_processes(device, infoCount, infos));
}

nvmlReturn_t nvmlDeviceGetMinorNumber(nvmlDevice_t device, unsigned int *minorNumber) {
    LOCKED(device_minor(device, minorNumber));
}

nvmlReturn_t nvmlDeviceGetPciInfo_v3(nvmlDevice_t device, nvmlPciInfo_t *pci) {
    LOCKED(device_pci_info(device, pci));
}

nvmlReturn_t nvmlDeviceGetNumaNodeId(nvmlDevice_t device, unsigned int *node) {
    LOCKED(device_numa_node(device, node));
}

nvmlReturn_t nvmlDeviceGetCudaComputeCapability(nvmlDevice_t device, int *major, int *minor) {
    LOCKED(device_compute_capability(device, major, minor));
}

nvmlReturn_t nvmlDeviceGetNumGpuCores(nvmlDevice_t device, unsigned int *numCores) {
    LOCKED(device_num_cores(device, numCores));
}

nvmlReturn_t nvmlDeviceGetMigMode(nvmlDevice_t device, unsigned int *currentMode,
                                  unsigned int *pendingMode) {
    LOCKED(device_mig_mode(device, currentMode, pendingMode));
}

nvmlReturn_t nvmlDeviceSetMigMode(nvmlDevice_t device, unsigned int mode,
                                  nvmlReturn_t *activationStatus) {
    MIG_ON_GPU(nvmlDeviceSetMigMode, device, mode, activationStatus);
}

nvmlReturn_t nvmlDeviceGetGpuInstanceProfileInfo(nvmlDevice_t device, unsigned int profile,
                                                 nvmlGpuInstanceProfileInfo_t *info) {
    MIG_ON_GPU(nvmlDeviceGetGpuInstanceProfileInfo, device, profile, info);
}

nvmlReturn_t nvmlDeviceGetGpuInstanceProfileInfoV(nvmlDevice_t device, unsigned int profile,
                                                  nvmlGpuInstanceProfileInfo_v2_t *info) {
    MIG_ON_GPU(nvmlDeviceGetGpuInstanceProfileInfoV, device, profile, info);
}

nvmlReturn_t nvmlDeviceGetGpuInstancePossiblePlacements_v2(
    nvmlDevice_t device, unsigned int profileId, nvmlGpuInstancePlacement_t *placements,
    unsigned int *count) {
    MIG_ON_GPU(nvmlDeviceGetGpuInstancePossiblePlacements_v2, device, profileId,
                          placements, count);
}

nvmlReturn_t nvmlDeviceGetGpuInstanceRemainingCapacity(nvmlDevice_t device,
                                                       unsigned int profileId,
                                                       unsigned int *count) {
    MIG_ON_GPU(nvmlDeviceGetGpuInstanceRemainingCapacity, device, profileId, count);
}

nvmlReturn_t nvmlDeviceCreateGpuInstanceWithPlacement(
    nvmlDevice_t device, unsigned int profileId, const nvmlGpuInstancePlacement_t *placement,
    nvmlGpuInstance_t *gpuInstance) {
    MIG_ON_GPU(nvmlDeviceCreateGpuInstanceWithPlacement, device, profileId, placement,
                          gpuInstance);
}

nvmlReturn_t nvmlDeviceGetGpuInstances(nvmlDevice_t device, unsigned int profileId,
                                       nvmlGpuInstance_t *gpuInstances, unsigned int *count) {
    MIG_ON_GPU(nvmlDeviceGetGpuInstances, device, profileId, gpuInstances, count);
}

nvmlReturn_t nvmlDeviceGetGpuInstanceById(nvmlDevice_t device, unsigned int id,
                                          nvmlGpuInstance_t *gpuInstance) {
    MIG_ON_GPU(nvmlDeviceGetGpuInstanceById, device, id, gpuInstance);
}

nvmlReturn_t nvmlGpuInstanceGetInfo(nvmlGpuInstance_t gpuInstance, nvmlGpuInstanceInfo_t *info) {
    LOCKED(gpu_instance_info(gpuInstance, info));
}

nvmlReturn_t nvmlGpuInstanceDestroy(nvmlGpuInstance_t gpuInstance) {
    MIG_ON_INSTANCE(nvmlGpuInstanceDestroy, gpuInstance);
}

nvmlReturn_t nvmlGpuInstanceGetComputeInstanceProfileInfo(
    nvmlGpuInstance_t gpuInstance, unsigned int profile, unsigned int engProfile,
    nvmlComputeInstanceProfileInfo_t *info) {
    MIG_ON_INSTANCE(nvmlGpuInstanceGetComputeInstanceProfileInfo, gpuInstance, profile,
                               engProfile, info);
}

nvmlReturn_t nvmlGpuInstanceGetComputeInstanceProfileInfoV(
    nvmlGpuInstance_t gpuInstance, unsigned int profile, unsigned int engProfile,
    nvmlComputeInstanceProfileInfo_v2_t *info) {
    MIG_ON_INSTANCE(nvmlGpuInstanceGetComputeInstanceProfileInfoV, gpuInstance, profile,
                               engProfile, info);
}

nvmlReturn_t nvmlGpuInstanceCreateComputeInstance(nvmlGpuInstance_t gpuInstance,
                                                  unsigned int profileId,
                                                  nvmlComputeInstance_t *computeInstance) {
    MIG_ON_INSTANCE(nvmlGpuInstanceCreateComputeInstance, gpuInstance, profileId,
                               computeInstance);
}

nvmlReturn_t nvmlGpuInstanceGetComputeInstances(nvmlGpuInstance_t gpuInstance,
                                                unsigned int profileId,
                                                nvmlComputeInstance_t *computeInstances,
                                                unsigned int *count) {
    MIG_ON_INSTANCE(nvmlGpuInstanceGetComputeInstances, gpuInstance, profileId,
                               computeInstances, count);
}

nvmlReturn_t nvmlComputeInstanceGetInfo_v2(nvmlComputeInstance_t computeInstance,
                                           nvmlComputeInstanceInfo_t *info) {
    MIG_ON_INSTANCE(nvmlComputeInstanceGetInfo_v2, computeInstance, info);
}

nvmlReturn_t nvmlComputeInstanceDestroy(nvmlComputeInstance_t computeInstance) {
    MIG_ON_INSTANCE(nvmlComputeInstanceDestroy, computeInstance);
}
