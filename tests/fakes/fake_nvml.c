/*
 * fake_nvml.c: a fake `libnvidia-ml.so.1` over Tessera's simulated node.
 *
 * Owns: the NVML C ABI that Tessera's NVML backend uses (nvml-wrapper 0.13 for
 * discovery, plus the raw MIG calls), answered from the simulated node's state file
 * `$TESSERA_FAKE_NVML_STATE_DIR/mock-node.state` (the line format documented in
 * src/inventory/mock/state.rs, "state.rs" below). The mock backend reads and writes
 * that same file, so the NVML backend and the mock backend see one and the same node.
 *
 * Build:
 *   cc -shared -fPIC -pthread -Wall -Wextra -Wl,-soname,libnvidia-ml.so.1 \
 *      -o libnvidia-ml.so.1 fake_nvml.c
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
 *   - Device handles point into static arrays of per-GPU records; exported functions
 *     never call each other (internal helpers are static), as in the real driver, so
 *     an interposer on one symbol cannot change what another returns.
 *   - One mutex serialises every entry point (NVML is thread-safe).
 *
 * MIG (facts A2; geometry as src/mig/geometry.rs, which the mock backend applies):
 *   - The GPU's profiles are its `mig-profile` rows; there is no catalog in C. Profile
 *     info takes the NVML profile index (INVALID_ARGUMENT at >= 0x12 or for a bad
 *     `version` of the V call, NOT_SUPPORTED for an index the GPU lacks); every other
 *     GI call takes the profile ID. `sliceCount` is the compute-slice count (1g -> 1,
 *     7g -> 7) as on real GPUs; placements are in memory slices.
 *   - Reads re-read the MIG lines (mode, instances, `mig-busy`) from the state file on
 *     every MIG call, so what the mock backend changed is seen at once.
 *   - Every mutating call takes the writers' exclusive flock on
 *     `mock-node.state.lock`, re-reads the whole file, applies its change and rewrites
 *     the file atomically (temp file, fsync, rename, fsync of the directory), rendered
 *     line for line as state.rs renders it; lines state.rs does not know are dropped,
 *     as state.rs drops them.
 *   - Create GI with placement: NOT_SUPPORTED when MIG is off, INVALID_ARGUMENT for an
 *     unknown profile ID or a placement the profile cannot take, INSUFFICIENT_RESOURCES
 *     for an overlap or when the profile's instance count is reached. GI ID = heap
 *     index of the memory-slice range. Only the full-GI compute instance exists (CI ID
 *     0); its MIG UUID is geometry::mig_uuid (SHA-256 of parent UUID and IDs).
 *   - Destroy: a CI of a `mig-busy` GI, or a GI with a CI or `mig-busy`: IN_USE.
 *     Unknown GI ID: NOT_FOUND. Stale GI/CI handles: INVALID_ARGUMENT.
 *   - Set MIG mode: NOT_SUPPORTED unless MIG-capable; the request is accepted and the
 *     activation status says IN_USE (disabling while GPU instances exist) or
 *     RESET_REQUIRED (a GPU before Hopper, which would need a reset; pending modes are
 *     not simulated), leaving the mode unchanged.
 *   - State-file I/O failing inside a MIG call: NVML_ERROR_UNKNOWN, with the reason on
 *     stderr.
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
 *   - Writers keep the `health-event` lines (rendered after the GPU blocks, as state.rs
 *     does).
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
#define _GNU_SOURCE /* F_OFD_GETLK/F_OFD_SETLK for the simulator's process records */
#define _POSIX_C_SOURCE 200809L
#define _DEFAULT_SOURCE

#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/file.h>
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

/* MIG profile indices and counts (nvml.h, NVML_API_VERSION 13). */
#define NVML_GPU_INSTANCE_PROFILE_COUNT 0x12u
#define NVML_COMPUTE_INSTANCE_PROFILE_COUNT 0x9u
#define NVML_COMPUTE_INSTANCE_ENGINE_PROFILE_SHARED 0u
#define NVML_DEVICE_ARCH_HOPPER 9u

typedef struct nvmlGpuInstancePlacement_st {
    unsigned int start;
    unsigned int size;
} nvmlGpuInstancePlacement_t;

typedef struct nvmlGpuInstanceProfileInfo_st {
    unsigned int id;
    unsigned int isP2pSupported;
    unsigned int sliceCount;
    unsigned int instanceCount;
    unsigned int multiprocessorCount;
    unsigned int copyEngineCount;
    unsigned int decoderCount;
    unsigned int encoderCount;
    unsigned int jpegCount;
    unsigned int ofaCount;
    unsigned long long memorySizeMB;
} nvmlGpuInstanceProfileInfo_t;

typedef struct nvmlGpuInstanceProfileInfo_v2_st {
    unsigned int version;
    unsigned int id;
    unsigned int isP2pSupported;
    unsigned int sliceCount;
    unsigned int instanceCount;
    unsigned int multiprocessorCount;
    unsigned int copyEngineCount;
    unsigned int decoderCount;
    unsigned int encoderCount;
    unsigned int jpegCount;
    unsigned int ofaCount;
    unsigned long long memorySizeMB;
    char name[NVML_DEVICE_NAME_V2_BUFFER_SIZE];
} nvmlGpuInstanceProfileInfo_v2_t;

/* v3 drops isP2pSupported and adds capabilities; same size as v2. */
typedef struct nvmlGpuInstanceProfileInfo_v3_st {
    unsigned int version;
    unsigned int id;
    unsigned int sliceCount;
    unsigned int instanceCount;
    unsigned int multiprocessorCount;
    unsigned int copyEngineCount;
    unsigned int decoderCount;
    unsigned int encoderCount;
    unsigned int jpegCount;
    unsigned int ofaCount;
    unsigned long long memorySizeMB;
    char name[NVML_DEVICE_NAME_V2_BUFFER_SIZE];
    unsigned int capabilities;
} nvmlGpuInstanceProfileInfo_v3_t;

#define nvmlGpuInstanceProfileInfo_v2                                                      \
    ((unsigned int)(sizeof(nvmlGpuInstanceProfileInfo_v2_t) | (2u << 24)))
#define nvmlGpuInstanceProfileInfo_v3                                                      \
    ((unsigned int)(sizeof(nvmlGpuInstanceProfileInfo_v3_t) | (3u << 24)))

typedef struct nvmlGpuInstanceInfo_st {
    nvmlDevice_t device;
    unsigned int id;
    unsigned int profileId;
    nvmlGpuInstancePlacement_t placement;
} nvmlGpuInstanceInfo_t;

typedef struct nvmlComputeInstanceProfileInfo_st {
    unsigned int id;
    unsigned int sliceCount;
    unsigned int instanceCount;
    unsigned int multiprocessorCount;
    unsigned int sharedCopyEngineCount;
    unsigned int sharedDecoderCount;
    unsigned int sharedEncoderCount;
    unsigned int sharedJpegCount;
    unsigned int sharedOfaCount;
} nvmlComputeInstanceProfileInfo_t;

typedef struct nvmlComputeInstanceProfileInfo_v2_st {
    unsigned int version;
    unsigned int id;
    unsigned int sliceCount;
    unsigned int instanceCount;
    unsigned int multiprocessorCount;
    unsigned int sharedCopyEngineCount;
    unsigned int sharedDecoderCount;
    unsigned int sharedEncoderCount;
    unsigned int sharedJpegCount;
    unsigned int sharedOfaCount;
    char name[NVML_DEVICE_NAME_V2_BUFFER_SIZE];
} nvmlComputeInstanceProfileInfo_v2_t;

typedef struct nvmlComputeInstanceProfileInfo_v3_st {
    unsigned int version;
    unsigned int id;
    unsigned int sliceCount;
    unsigned int instanceCount;
    unsigned int multiprocessorCount;
    unsigned int sharedCopyEngineCount;
    unsigned int sharedDecoderCount;
    unsigned int sharedEncoderCount;
    unsigned int sharedJpegCount;
    unsigned int sharedOfaCount;
    char name[NVML_DEVICE_NAME_V2_BUFFER_SIZE];
    unsigned int capabilities;
} nvmlComputeInstanceProfileInfo_v3_t;

#define nvmlComputeInstanceProfileInfo_v2                                                  \
    ((unsigned int)(sizeof(nvmlComputeInstanceProfileInfo_v2_t) | (2u << 24)))
#define nvmlComputeInstanceProfileInfo_v3                                                  \
    ((unsigned int)(sizeof(nvmlComputeInstanceProfileInfo_v3_t) | (3u << 24)))

typedef struct nvmlComputeInstancePlacement_st {
    unsigned int start;
    unsigned int size;
} nvmlComputeInstancePlacement_t;

typedef struct nvmlComputeInstanceInfo_st {
    nvmlDevice_t device;
    nvmlGpuInstance_t gpuInstance;
    unsigned int id;
    unsigned int profileId;
    nvmlComputeInstancePlacement_t placement;
} nvmlComputeInstanceInfo_t;

/* The struct layouts above are the ABI; catch accidental edits at compile time. */
_Static_assert(sizeof(nvmlMemory_t) == 24, "nvmlMemory_t layout");
_Static_assert(sizeof(nvmlMemory_v2_t) == 40, "nvmlMemory_v2_t layout");
_Static_assert(sizeof(nvmlPciInfo_t) == 68, "nvmlPciInfo_t layout");
_Static_assert(sizeof(nvmlGpuInstancePlacement_t) == 8, "GI placement layout");
_Static_assert(sizeof(nvmlGpuInstanceProfileInfo_t) == 48, "GI profile info layout");
_Static_assert(nvmlGpuInstanceProfileInfo_v2 == 0x02000098u, "GI profile info v2 version");
_Static_assert(nvmlGpuInstanceProfileInfo_v3 == 0x03000098u, "GI profile info v3 version");
_Static_assert(sizeof(nvmlGpuInstanceInfo_t) == 24, "GI info layout");
_Static_assert(sizeof(nvmlComputeInstanceProfileInfo_t) == 36, "CI profile info layout");
_Static_assert(nvmlComputeInstanceProfileInfo_v2 == 0x02000088u, "CI profile info v2 version");
_Static_assert(nvmlComputeInstanceProfileInfo_v3 == 0x0300008cu, "CI profile info v3 version");
_Static_assert(sizeof(nvmlComputeInstanceInfo_t) == 32, "CI info layout");

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
#define LOCK_FILE "mock-node.state.lock"
#define STATE_HEADER "tessera-node-state 1"
#define FAKE_MAX_GPUS 64
#define PCI_VENDOR_NVIDIA 0x10deu

/* MIG limits: GI IDs 0..14 and CI IDs 0..7 (the nvidia-caps layout, facts A2.1). */
#define FAKE_MAX_GIS 15u
#define FAKE_MAX_CIS 8u
#define FAKE_MAX_PLACEMENTS 8u
#define FAKE_MAX_BUSY 16u
#define FAKE_PROFILE_NAME_SIZE 48

/* One `mig-profile` row: a GPU-instance profile as NVML reports it. */
struct fake_profile {
    unsigned int nvml_index;
    unsigned int profile_id;
    unsigned int instance_count;
    unsigned long long memory_mib;
    unsigned int multiprocessors;
    unsigned int copy_engines;
    unsigned int decoders;
    unsigned int encoders;
    unsigned int jpegs;
    unsigned int ofas;
    /* Memory slices one instance occupies: the placement size. */
    unsigned int memory_slices;
    unsigned int placements[FAKE_MAX_PLACEMENTS];
    unsigned int placement_count;
    /* The full-GI compute-instance profile (its index is also its ID). */
    unsigned int ci_profile_index;
    char name[FAKE_PROFILE_NAME_SIZE];
};

/* One `mig-gi` line. */
struct fake_gi {
    unsigned int gi_id;
    unsigned int profile_id;
    unsigned int start;
    unsigned int size;
};

/* One `mig-ci` line. */
struct fake_ci {
    unsigned int gi_id;
    unsigned int ci_id;
    unsigned int ci_profile;
    char uuid[NVML_DEVICE_UUID_V2_BUFFER_SIZE];
};

/* A GPU's MIG lines: profiles, instances (GIs ascending by ID, as the mock keeps them;
 * at most one CI per GI is kept, as state.rs keeps the first), busy GI IDs ascending. */
struct fake_mig {
    struct fake_profile profiles[NVML_GPU_INSTANCE_PROFILE_COUNT];
    unsigned int profile_count;
    struct fake_gi gis[FAKE_MAX_GIS];
    unsigned int gi_count;
    struct fake_ci cis[FAKE_MAX_GIS];
    unsigned int ci_count;
    unsigned int busy[FAKE_MAX_BUSY];
    unsigned int busy_count;
};

/* One physical GPU as the state file describes it. The `*_text` fields keep values as
 * written so that a rewrite renders them unchanged. */
struct fake_gpu {
    unsigned int index;
    unsigned int minor;
    char uuid[NVML_DEVICE_UUID_V2_BUFFER_SIZE];
    char name[NVML_DEVICE_NAME_V2_BUFFER_SIZE];
    nvmlBrandType_t brand;
    char brand_text[32];
    nvmlDeviceArchitecture_t architecture;
    char architecture_text[32];
    unsigned long long memory_bytes;
    unsigned int multiprocessors;
    int cc_major;
    int cc_minor;
    char cc_text[16];
    unsigned int pci_domain;
    unsigned int pci_bus;
    unsigned int pci_device;
    unsigned int pci_function;
    char bus_id_text[NVML_DEVICE_PCI_BUS_ID_BUFFER_SIZE];
    int has_pcie_root;
    char pcie_root[64];
    int has_numa_node;
    int numa_node;
    int mig_capable;
    int mig_enabled;
    struct fake_mig mig;
};

struct fake_node {
    char source[80];
    char driver_version[NVML_SYSTEM_DRIVER_VERSION_BUFFER_SIZE];
    int cuda_driver_version;
    int has_major_nvidia, has_major_uvm, has_major_caps;
    unsigned int major_nvidia, major_uvm, major_caps;
    unsigned int gpu_count;
    /* In state-file order (by minor). */
    struct fake_gpu gpus[FAKE_MAX_GPUS];
    /* NVML index -> position in gpus. */
    unsigned int by_index[FAKE_MAX_GPUS];
    /* The `health-event` lines, verbatim (kept by writers). */
    char health_text[32768];
    size_t health_len;
};

/* What the opaque handles point at. A handle's identity is its address in one of the
 * static tables below; the fields only make a core dump readable. MIG device handles
 * (one per possible CI) are `nvmlDevice_t`s too, as NVML's are. */
struct nvmlDevice_st {
    unsigned int slot;
    unsigned int gi_id;
    unsigned int ci_id;
    int is_mig;
};
struct nvmlGpuInstance_st {
    unsigned int slot;
    unsigned int gi_id;
};
struct nvmlComputeInstance_st {
    unsigned int slot;
    unsigned int gi_id;
    unsigned int ci_id;
};

static pthread_mutex_t g_lock = PTHREAD_MUTEX_INITIALIZER;
static unsigned int g_init_count;
static char g_state_dir[4096];
/* The node as of the last read; MIG lines are refreshed by every MIG call. */
static struct fake_node g_node;
/* The node as just re-read from the file (refreshes and read-modify-writes). */
static struct fake_node g_scratch;
static struct nvmlDevice_st g_gpu_handles[FAKE_MAX_GPUS];
static struct nvmlDevice_st g_mig_handles[FAKE_MAX_GPUS][FAKE_MAX_GIS][FAKE_MAX_CIS];
static struct nvmlGpuInstance_st g_gi_handles[FAKE_MAX_GPUS][FAKE_MAX_GIS];
static struct nvmlComputeInstance_st g_ci_handles[FAKE_MAX_GPUS][FAKE_MAX_GIS][FAKE_MAX_CIS];

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

/* Like copy_value, but an empty value is fine (`source` may be empty). */
static int copy_text(char *dst, size_t size, const char *value) {
    size_t len = strlen(value);
    if (len >= size)
        return -1;
    memcpy(dst, value, len + 1);
    return 0;
}

/* Splits off the next space-separated word of *cursor; NULL when none is left. Like
 * Rust's `split(' ')`, two spaces in a row make an empty word (which parses as bad). */
static char *next_word(char **cursor) {
    char *start = *cursor;
    if (*start == '\0')
        return NULL;
    char *space = strchr(start, ' ');
    if (space != NULL) {
        *space = '\0';
        *cursor = space + 1;
    } else {
        *cursor = start + strlen(start);
    }
    return start;
}

/* Parses exactly `n` space-separated unsigned words of `value`, and nothing else. */
static int parse_uint_words(const char *value, unsigned int *out, unsigned int n) {
    char buf[256];
    if (copy_value(buf, sizeof buf, value) != 0)
        return -1;
    char *cur = buf;
    for (unsigned int i = 0; i < n; i++) {
        char *w = next_word(&cur);
        if (w == NULL || parse_uint(w, &out[i]) != 0)
            return -1;
    }
    return *cur == '\0' ? 0 : -1;
}

/* `mig-profile <nvml-index> <profile-id> <instances> <memory-MiB> <SMs> <CEs> <DECs>
 * <ENCs> <JPEGs> <OFAs> <slices> <starts,comma-separated> <ci-profile-index> <name>` */
static int parse_profile(const char *value, struct fake_profile *p) {
    char buf[512];
    unsigned long long mem;
    unsigned int *before_mem[3] = {&p->nvml_index, &p->profile_id, &p->instance_count};
    unsigned int *after_mem[7] = {&p->multiprocessors, &p->copy_engines, &p->decoders,
                                  &p->encoders,        &p->jpegs,        &p->ofas,
                                  &p->memory_slices};
    if (copy_value(buf, sizeof buf, value) != 0)
        return -1;
    memset(p, 0, sizeof *p);
    char *cur = buf;
    char *w;
    for (unsigned int i = 0; i < 3; i++)
        if ((w = next_word(&cur)) == NULL || parse_uint(w, before_mem[i]) != 0)
            return -1;
    if ((w = next_word(&cur)) == NULL || parse_ull(w, ~0ull, &mem) != 0)
        return -1;
    p->memory_mib = mem;
    for (unsigned int i = 0; i < 7; i++)
        if ((w = next_word(&cur)) == NULL || parse_uint(w, after_mem[i]) != 0)
            return -1;
    if ((w = next_word(&cur)) == NULL)
        return -1;
    for (char *start = w;;) {
        char *comma = strchr(start, ',');
        if (comma != NULL)
            *comma = '\0';
        if (p->placement_count == FAKE_MAX_PLACEMENTS ||
            parse_uint(start, &p->placements[p->placement_count++]) != 0)
            return -1;
        if (comma == NULL)
            break;
        start = comma + 1;
    }
    if ((w = next_word(&cur)) == NULL || parse_uint(w, &p->ci_profile_index) != 0)
        return -1;
    /* The name is the rest of the line. */
    return copy_value(p->name, sizeof p->name, cur);
}

/* Inserts `gi_id` into the ascending set of busy GI IDs. */
static int busy_insert(struct fake_mig *m, unsigned int gi_id) {
    unsigned int i = 0;
    while (i < m->busy_count && m->busy[i] < gi_id)
        i++;
    if (i < m->busy_count && m->busy[i] == gi_id)
        return 0;
    if (m->busy_count == FAKE_MAX_BUSY)
        return -1;
    memmove(&m->busy[i + 1], &m->busy[i], (m->busy_count - i) * sizeof m->busy[0]);
    m->busy[i] = gi_id;
    m->busy_count++;
    return 0;
}

static const struct fake_ci *find_ci(const struct fake_mig *m, unsigned int gi_id) {
    for (unsigned int i = 0; i < m->ci_count; i++)
        if (m->cis[i].gi_id == gi_id)
            return &m->cis[i];
    return NULL;
}

static struct fake_gi *find_gi(struct fake_mig *m, unsigned int gi_id) {
    for (unsigned int i = 0; i < m->gi_count; i++)
        if (m->gis[i].gi_id == gi_id)
            return &m->gis[i];
    return NULL;
}

static int is_busy(const struct fake_mig *m, unsigned int gi_id) {
    for (unsigned int i = 0; i < m->busy_count; i++)
        if (m->busy[i] == gi_id)
            return 1;
    return 0;
}

/* Applies one MIG line inside a gpu block. Returns 1 if `key` is not a MIG key, 0 when
 * applied, -1 for a bad value. */
static int mig_set(struct fake_mig *m, const char *key, const char *value) {
    unsigned int f[3];
    if (strcmp(key, "mig-profile") == 0) {
        if (m->profile_count == NVML_GPU_INSTANCE_PROFILE_COUNT)
            return -1;
        return parse_profile(value, &m->profiles[m->profile_count++]);
    }
    if (strcmp(key, "mig-gi") == 0) {
        unsigned int g[4];
        if (parse_uint_words(value, g, 4) != 0 || g[0] >= FAKE_MAX_GIS ||
            m->gi_count == FAKE_MAX_GIS || find_gi(m, g[0]) != NULL)
            return -1;
        m->gis[m->gi_count++] = (struct fake_gi){g[0], g[1], g[2], g[3]};
        return 0;
    }
    if (strcmp(key, "mig-ci") == 0) {
        char buf[256];
        if (copy_value(buf, sizeof buf, value) != 0)
            return -1;
        /* Three numbers, then the UUID (the rest of the line, as one word). */
        char *cur = buf;
        for (unsigned int i = 0; i < 3; i++) {
            char *w = next_word(&cur);
            if (w == NULL || parse_uint(w, &f[i]) != 0)
                return -1;
        }
        if (f[1] >= FAKE_MAX_CIS || strchr(cur, ' ') != NULL)
            return -1;
        /* state.rs keeps the first CI of a GI; so does the fake. */
        if (find_ci(m, f[0]) != NULL)
            return 0;
        if (m->ci_count == FAKE_MAX_GIS)
            return -1;
        struct fake_ci *ci = &m->cis[m->ci_count++];
        ci->gi_id = f[0];
        ci->ci_id = f[1];
        ci->ci_profile = f[2];
        return copy_value(ci->uuid, sizeof ci->uuid, cur);
    }
    if (strcmp(key, "mig-busy") == 0) {
        return parse_uint(value, &f[0]) == 0 ? busy_insert(m, f[0]) : -1;
    }
    return 1;
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
 * Returns 0, or -1 for a bad value. Unknown keys are ignored, as state.rs ignores them. */
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
        rc = lookup_name(BRANDS, sizeof BRANDS / sizeof BRANDS[0], value, &v) |
             copy_value(g->brand_text, sizeof g->brand_text, value);
        g->brand = (nvmlBrandType_t)v;
    } else if (strcmp(key, "architecture") == 0) {
        bit = KEY_ARCHITECTURE;
        rc = lookup_name(ARCHITECTURES, sizeof ARCHITECTURES / sizeof ARCHITECTURES[0], value,
                         &g->architecture) |
             copy_value(g->architecture_text, sizeof g->architecture_text, value);
    } else if (strcmp(key, "memory") == 0) {
        bit = KEY_MEMORY;
        rc = parse_ull(value, ~0ull, &u64);
        g->memory_bytes = u64;
    } else if (strcmp(key, "multiprocessors") == 0) {
        bit = KEY_MULTIPROCESSORS;
        rc = parse_uint(value, &g->multiprocessors);
    } else if (strcmp(key, "compute-capability") == 0) {
        bit = KEY_COMPUTE_CAPABILITY;
        rc = parse_compute_capability(value, &g->cc_major, &g->cc_minor) |
             copy_value(g->cc_text, sizeof g->cc_text, value);
    } else if (strcmp(key, "pci-bus-id") == 0) {
        bit = KEY_PCI_BUS_ID;
        rc = parse_bus_id(value, g) | copy_value(g->bus_id_text, sizeof g->bus_id_text, value);
    } else if (strcmp(key, "pcie-root") == 0) {
        /* Lives in sysfs for NVML's consumers; kept only to write it back. */
        g->has_pcie_root = 1;
        rc = copy_text(g->pcie_root, sizeof g->pcie_root, value);
    } else if (strcmp(key, "numa-node") == 0) {
        g->has_numa_node = 1;
        rc = parse_int(value, &g->numa_node);
    } else if (strcmp(key, "mig-capable") == 0) {
        g->mig_capable = strcmp(value, "1") == 0;
    } else if (strcmp(key, "mig-enabled") == 0) {
        g->mig_enabled = strcmp(value, "1") == 0;
    } else {
        rc = mig_set(&g->mig, key, value);
        if (rc == 1)
            rc = 0;
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

/* Checks a finished gpu block: required keys present, every CI on a known GI. */
static nvmlReturn_t finish_gpu(const struct fake_gpu *g, unsigned int seen, unsigned int start,
                               struct parse_error *err) {
    if ((seen & KEYS_REQUIRED) != KEYS_REQUIRED)
        return fail(err, NVML_ERROR_DRIVER_NOT_LOADED, start, "gpu block lacks a required key",
                    "");
    for (unsigned int i = 0; i < g->mig.ci_count; i++) {
        unsigned int gi_id = g->mig.cis[i].gi_id;
        int found = 0;
        for (unsigned int j = 0; j < g->mig.gi_count; j++)
            found |= g->mig.gis[j].gi_id == gi_id;
        if (!found)
            return fail(err, NVML_ERROR_DRIVER_NOT_LOADED, start,
                        "mig-ci names a GPU instance without a mig-gi line", "");
    }
    return NVML_SUCCESS;
}

/* `major <name> <number>`; names other than the three NVIDIA ones are ignored. */
static int node_major(struct fake_node *node, const char *value) {
    char buf[64];
    if (copy_value(buf, sizeof buf, value) != 0)
        return -1;
    char *num = strchr(buf, ' ');
    if (num == NULL)
        return -1;
    *num++ = '\0';
    unsigned int v;
    if (parse_uint(num, &v) != 0)
        return -1;
    if (strcmp(buf, "nvidia") == 0) {
        node->has_major_nvidia = 1;
        node->major_nvidia = v;
    } else if (strcmp(buf, "nvidia-uvm") == 0) {
        node->has_major_uvm = 1;
        node->major_uvm = v;
    } else if (strcmp(buf, "nvidia-caps") == 0) {
        node->has_major_caps = 1;
        node->major_caps = v;
    }
    return 0;
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
                rc = finish_gpu(cur, seen, gpu_start, err);
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
        } else if (strcmp(key, "source") == 0) {
            if (copy_text(node->source, sizeof node->source, value) != 0)
                rc = fail(err, NVML_ERROR_DRIVER_NOT_LOADED, n, "bad value of", key);
        } else if (strcmp(key, "major") == 0) {
            if (node_major(node, value) != 0)
                rc = fail(err, NVML_ERROR_DRIVER_NOT_LOADED, n, "bad value of", key);
        } else if (strcmp(key, "health-event") == 0) {
            int w = snprintf(node->health_text + node->health_len,
                             sizeof node->health_text - node->health_len, "health-event %s\n",
                             value);
            if (w < 0 || (size_t)w >= sizeof node->health_text - node->health_len)
                rc = fail(err, NVML_ERROR_DRIVER_NOT_LOADED, n, "too many", key);
            else
                node->health_len += (size_t)w;
        }
        /* Unknown top-level keys: ignored, as in state.rs. */
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
    for (unsigned int s = 0; s < FAKE_MAX_GPUS; s++) {
        g_gpu_handles[s] = (struct nvmlDevice_st){s, 0, 0, 0};
        for (unsigned int gi = 0; gi < FAKE_MAX_GIS; gi++) {
            g_gi_handles[s][gi] = (struct nvmlGpuInstance_st){s, gi};
            for (unsigned int ci = 0; ci < FAKE_MAX_CIS; ci++) {
                g_ci_handles[s][gi][ci] = (struct nvmlComputeInstance_st){s, gi, ci};
                g_mig_handles[s][gi][ci] = (struct nvmlDevice_st){s, gi, ci, 1};
            }
        }
    }
}

/* ---- Writing the state file ------------------------------------------------------- */

/* Renders *node exactly as `NodeState::render` in src/inventory/mock/state.rs does. */
static void render_state(FILE *out, const struct fake_node *node) {
    int cuda = node->cuda_driver_version;
    fprintf(out, "%s\n", STATE_HEADER);
    fprintf(out, "source %s\n", node->source);
    fprintf(out, "driver-version %s\n", node->driver_version);
    /* state.rs keeps the version as `major.minor` and writes it back normalised. */
    fprintf(out, "cuda-driver-version %d\n", (cuda / 1000) * 1000 + ((cuda % 1000) / 10) * 10);
    if (node->has_major_nvidia)
        fprintf(out, "major nvidia %u\n", node->major_nvidia);
    if (node->has_major_uvm)
        fprintf(out, "major nvidia-uvm %u\n", node->major_uvm);
    if (node->has_major_caps)
        fprintf(out, "major nvidia-caps %u\n", node->major_caps);
    for (unsigned int i = 0; i < node->gpu_count; i++) {
        const struct fake_gpu *g = &node->gpus[i];
        const struct fake_mig *m = &g->mig;
        fprintf(out, "gpu\nindex %u\nminor %u\nuuid %s\nname %s\nbrand %s\narchitecture %s\n",
                g->index, g->minor, g->uuid, g->name, g->brand_text, g->architecture_text);
        fprintf(out, "memory %llu\nmultiprocessors %u\ncompute-capability %s\npci-bus-id %s\n",
                g->memory_bytes, g->multiprocessors, g->cc_text, g->bus_id_text);
        if (g->has_pcie_root)
            fprintf(out, "pcie-root %s\n", g->pcie_root);
        if (g->has_numa_node)
            fprintf(out, "numa-node %d\n", g->numa_node);
        fprintf(out, "mig-capable %d\nmig-enabled %d\n", g->mig_capable ? 1 : 0,
                g->mig_enabled ? 1 : 0);
        if (g->mig_capable) {
            for (unsigned int p = 0; p < m->profile_count; p++) {
                const struct fake_profile *pr = &m->profiles[p];
                fprintf(out, "mig-profile %u %u %u %llu %u %u %u %u %u %u %u ", pr->nvml_index,
                        pr->profile_id, pr->instance_count, pr->memory_mib,
                        pr->multiprocessors, pr->copy_engines, pr->decoders, pr->encoders,
                        pr->jpegs, pr->ofas, pr->memory_slices);
                for (unsigned int k = 0; k < pr->placement_count; k++)
                    fprintf(out, "%s%u", k ? "," : "", pr->placements[k]);
                fprintf(out, " %u %s\n", pr->ci_profile_index, pr->name);
            }
        }
        for (unsigned int k = 0; k < m->gi_count; k++) {
            const struct fake_gi *gi = &m->gis[k];
            fprintf(out, "mig-gi %u %u %u %u\n", gi->gi_id, gi->profile_id, gi->start, gi->size);
            const struct fake_ci *ci = find_ci(m, gi->gi_id);
            if (ci != NULL)
                fprintf(out, "mig-ci %u %u %u %s\n", ci->gi_id, ci->ci_id, ci->ci_profile,
                        ci->uuid);
        }
        for (unsigned int k = 0; k < m->busy_count; k++)
            fprintf(out, "mig-busy %u\n", m->busy[k]);
        fprintf(out, "end\n");
    }
    fwrite(node->health_text, 1, node->health_len, out);
}

static int write_all(int fd, const char *buf, size_t len) {
    while (len > 0) {
        ssize_t w = write(fd, buf, len);
        if (w < 0 && errno == EINTR)
            continue;
        if (w <= 0)
            return -1;
        buf += w;
        len -= (size_t)w;
    }
    return 0;
}

/* Replaces the state file with *node atomically: temp file, fsync, rename, fsync of
 * the directory (as tessera_cdi::atomic::write_atomic). The temp name differs from
 * state.rs's so that a writer outside the lock (state creation) cannot clash. */
static int store_state(const struct fake_node *node) {
    char *text = NULL;
    size_t len = 0;
    FILE *out = open_memstream(&text, &len);
    if (out == NULL)
        return -1;
    render_state(out, node);
    if (fclose(out) != 0) {
        free(text);
        return -1;
    }
    char tmp[4300], path[4300];
    snprintf(tmp, sizeof tmp, "%s/.%s.fake-nvml-%ld.tmp", g_state_dir, STATE_FILE, (long)getpid());
    snprintf(path, sizeof path, "%s/%s", g_state_dir, STATE_FILE);
    int fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    int rc = -1;
    if (fd >= 0) {
        rc = write_all(fd, text, len) == 0 && fsync(fd) == 0 ? 0 : -1;
        rc |= close(fd);
        if (rc == 0)
            rc = rename(tmp, path);
        if (rc != 0)
            unlink(tmp);
    }
    free(text);
    if (rc == 0) {
        int dir = open(g_state_dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
        rc = dir >= 0 && fsync(dir) == 0 ? 0 : -1;
        if (dir >= 0)
            close(dir);
    }
    if (rc != 0)
        fprintf(stderr, "fake-nvml: cannot write %s: %s\n", path, strerror(errno));
    return rc;
}

/* Copies what may change (MIG mode and MIG lines) from *fresh into g_node, matching
 * GPUs by UUID; a GPU gone from the file loses its MIG state. */
static void adopt_mig_state(const struct fake_node *fresh) {
    for (unsigned int i = 0; i < g_node.gpu_count; i++) {
        struct fake_gpu *g = &g_node.gpus[i];
        const struct fake_gpu *src = NULL;
        for (unsigned int j = 0; j < fresh->gpu_count && src == NULL; j++)
            if (strcmp(fresh->gpus[j].uuid, g->uuid) == 0)
                src = &fresh->gpus[j];
        if (src != NULL) {
            g->mig_enabled = src->mig_enabled;
            g->mig = src->mig;
        } else {
            g->mig_enabled = 0;
            memset(&g->mig, 0, sizeof g->mig);
        }
    }
}

/* Re-reads the state file so that MIG reads see what other writers changed. */
static nvmlReturn_t refresh_locked(void) {
    nvmlReturn_t rc = read_state(&g_scratch, NVML_ERROR_UNKNOWN);
    if (rc != NVML_SUCCESS)
        return NVML_ERROR_UNKNOWN;
    adopt_mig_state(&g_scratch);
    return NVML_SUCCESS;
}

/* A change to one GPU of a freshly read node. Sets *dirty when the file must be
 * rewritten; anything but NVML_SUCCESS leaves the file alone. */
typedef nvmlReturn_t (*gpu_change)(struct fake_gpu *g, void *arg, int *dirty);

/* The writers' protocol of state.rs `update`: exclusive flock on the lock file, re-read,
 * change, atomic rewrite, unlock. The GPU is matched by the UUID of g_node slot `slot`. */
static nvmlReturn_t mutate_locked(unsigned int slot, gpu_change change, void *arg) {
    char lock_path[4200];
    snprintf(lock_path, sizeof lock_path, "%s/%s", g_state_dir, LOCK_FILE);
    int lock = open(lock_path, O_RDWR | O_CREAT | O_CLOEXEC, 0644);
    if (lock < 0) {
        fprintf(stderr, "fake-nvml: cannot open %s: %s\n", lock_path, strerror(errno));
        return NVML_ERROR_UNKNOWN;
    }
    int locked;
    while ((locked = flock(lock, LOCK_EX)) != 0 && errno == EINTR)
        ;
    nvmlReturn_t rc = NVML_ERROR_UNKNOWN;
    if (locked != 0) {
        fprintf(stderr, "fake-nvml: cannot lock %s: %s\n", lock_path, strerror(errno));
    } else if (read_state(&g_scratch, NVML_ERROR_UNKNOWN) == NVML_SUCCESS) {
        struct fake_gpu *g = NULL;
        for (unsigned int j = 0; j < g_scratch.gpu_count && g == NULL; j++)
            if (strcmp(g_scratch.gpus[j].uuid, g_node.gpus[slot].uuid) == 0)
                g = &g_scratch.gpus[j];
        int dirty = 0;
        rc = g == NULL ? NVML_ERROR_GPU_IS_LOST : change(g, arg, &dirty);
        if (rc == NVML_SUCCESS && dirty && store_state(&g_scratch) != 0)
            rc = NVML_ERROR_UNKNOWN;
        if (rc == NVML_SUCCESS)
            adopt_mig_state(&g_scratch);
    }
    close(lock); /* releases the flock */
    return rc;
}

/* ---- MIG geometry (src/mig/geometry.rs over the mig-profile rows) ---------------- */

static const struct fake_profile *profile_by_id(const struct fake_mig *m, unsigned int id) {
    for (unsigned int i = 0; i < m->profile_count; i++)
        if (m->profiles[i].profile_id == id)
            return &m->profiles[i];
    return NULL;
}

static const struct fake_profile *profile_by_index(const struct fake_mig *m, unsigned int idx) {
    for (unsigned int i = 0; i < m->profile_count; i++)
        if (m->profiles[i].nvml_index == idx)
            return &m->profiles[i];
    return NULL;
}

/* Compute slices of a compute-instance profile index (NVML_COMPUTE_INSTANCE_PROFILE_*):
 * 1, 2, 3, 4, 7, 8, 6 slices, 1_SLICE_REV1, 7_SLICE_NVL. This is the GI profile's
 * `sliceCount` for its full-GI CI. */
static unsigned int ci_profile_slices(unsigned int ci_profile_index) {
    static const unsigned int SLICES[NVML_COMPUTE_INSTANCE_PROFILE_COUNT] = {1, 2, 3, 4, 7,
                                                                             8, 6, 1, 7};
    return ci_profile_index < NVML_COMPUTE_INSTANCE_PROFILE_COUNT ? SLICES[ci_profile_index]
                                                                  : 0;
}

/* Memory slices of the GPU: the end of its largest placement (8, or 4 on A30). */
static unsigned int total_memory_slices(const struct fake_mig *m) {
    unsigned int total = 0;
    for (unsigned int i = 0; i < m->profile_count; i++) {
        const struct fake_profile *p = &m->profiles[i];
        for (unsigned int k = 0; k < p->placement_count; k++)
            if (p->placements[k] + p->memory_slices > total)
                total = p->placements[k] + p->memory_slices;
    }
    return total;
}

static int overlaps(const struct fake_gi *gi, unsigned int start, unsigned int size) {
    return gi->start < start + size && start < gi->start + gi->size;
}

static int overlaps_any(const struct fake_mig *m, unsigned int start, unsigned int size) {
    for (unsigned int i = 0; i < m->gi_count; i++)
        if (overlaps(&m->gis[i], start, size))
            return 1;
    return 0;
}

static unsigned int instances_of(const struct fake_mig *m, unsigned int profile_id) {
    unsigned int n = 0;
    for (unsigned int i = 0; i < m->gi_count; i++)
        n += m->gis[i].profile_id == profile_id;
    return n;
}

static int has_placement(const struct fake_profile *p, unsigned int start) {
    for (unsigned int k = 0; k < p->placement_count; k++)
        if (p->placements[k] == start)
            return 1;
    return 0;
}

/* geometry::check_create, plus NVML's size check: the GI ID to create, or the code. */
static nvmlReturn_t check_create(const struct fake_mig *m, unsigned int profile_id,
                                 unsigned int start, unsigned int size, unsigned int *gi_id) {
    const struct fake_profile *p = profile_by_id(m, profile_id);
    if (p == NULL || !has_placement(p, start) || size != p->memory_slices)
        return NVML_ERROR_INVALID_ARGUMENT;
    if (overlaps_any(m, start, size) || instances_of(m, profile_id) >= p->instance_count)
        return NVML_ERROR_INSUFFICIENT_RESOURCES;
    /* The heap index of the memory-slice range (geometry::gi_id_for_placement). */
    unsigned int slices = total_memory_slices(m);
    if (size == 0 || slices % size != 0 || start % size != 0 || start >= slices ||
        slices / size - 1 + start / size >= FAKE_MAX_GIS)
        return NVML_ERROR_INVALID_ARGUMENT;
    *gi_id = slices / size - 1 + start / size;
    return NVML_SUCCESS;
}

/* geometry::remaining_capacity. */
static unsigned int remaining_capacity(const struct fake_mig *m, const struct fake_profile *p) {
    unsigned int used = instances_of(m, p->profile_id);
    unsigned int left = p->instance_count > used ? p->instance_count - used : 0;
    struct fake_mig taken = *m;
    unsigned int free_placements = 0;
    for (unsigned int k = 0; k < p->placement_count; k++) {
        unsigned int start = p->placements[k];
        if (!overlaps_any(&taken, start, p->memory_slices) && taken.gi_count < FAKE_MAX_GIS) {
            taken.gis[taken.gi_count++] = (struct fake_gi){FAKE_MAX_GIS, p->profile_id, start,
                                                            p->memory_slices};
            free_placements++;
        }
    }
    return free_placements < left ? free_placements : left;
}

/* ---- MIG device UUIDs: geometry::mig_uuid (SHA-256, FIPS 180-4) ------------------- */

static const uint32_t SHA256_K[64] = {
    0x428a2f98, 0x71374491, 0xb5c0fbcf, 0xe9b5dba5, 0x3956c25b, 0x59f111f1, 0x923f82a4,
    0xab1c5ed5, 0xd807aa98, 0x12835b01, 0x243185be, 0x550c7dc3, 0x72be5d74, 0x80deb1fe,
    0x9bdc06a7, 0xc19bf174, 0xe49b69c1, 0xefbe4786, 0x0fc19dc6, 0x240ca1cc, 0x2de92c6f,
    0x4a7484aa, 0x5cb0a9dc, 0x76f988da, 0x983e5152, 0xa831c66d, 0xb00327c8, 0xbf597fc7,
    0xc6e00bf3, 0xd5a79147, 0x06ca6351, 0x14292967, 0x27b70a85, 0x2e1b2138, 0x4d2c6dfc,
    0x53380d13, 0x650a7354, 0x766a0abb, 0x81c2c92e, 0x92722c85, 0xa2bfe8a1, 0xa81a664b,
    0xc24b8b70, 0xc76c51a3, 0xd192e819, 0xd6990624, 0xf40e3585, 0x106aa070, 0x19a4c116,
    0x1e376c08, 0x2748774c, 0x34b0bcb5, 0x391c0cb3, 0x4ed8aa4a, 0x5b9cca4f, 0x682e6ff3,
    0x748f82ee, 0x78a5636f, 0x84c87814, 0x8cc70208, 0x90befffa, 0xa4506ceb, 0xbef9a3f7,
    0xc67178f2};

static uint32_t rotr(uint32_t x, unsigned int n) { return (x >> n) | (x << (32 - n)); }

static void sha256_block(uint32_t h[8], const uint8_t *block) {
    uint32_t w[64];
    for (unsigned int i = 0; i < 16; i++)
        w[i] = (uint32_t)block[4 * i] << 24 | (uint32_t)block[4 * i + 1] << 16 |
               (uint32_t)block[4 * i + 2] << 8 | (uint32_t)block[4 * i + 3];
    for (unsigned int i = 16; i < 64; i++) {
        uint32_t s0 = rotr(w[i - 15], 7) ^ rotr(w[i - 15], 18) ^ (w[i - 15] >> 3);
        uint32_t s1 = rotr(w[i - 2], 17) ^ rotr(w[i - 2], 19) ^ (w[i - 2] >> 10);
        w[i] = w[i - 16] + s0 + w[i - 7] + s1;
    }
    uint32_t a = h[0], b = h[1], c = h[2], d = h[3], e = h[4], f = h[5], g = h[6], hh = h[7];
    for (unsigned int i = 0; i < 64; i++) {
        uint32_t t1 = hh + (rotr(e, 6) ^ rotr(e, 11) ^ rotr(e, 25)) + ((e & f) ^ (~e & g)) +
                      SHA256_K[i] + w[i];
        uint32_t t2 = (rotr(a, 2) ^ rotr(a, 13) ^ rotr(a, 22)) + ((a & b) ^ (a & c) ^ (b & c));
        hh = g;
        g = f;
        f = e;
        e = d + t1;
        d = c;
        c = b;
        b = a;
        a = t1 + t2;
    }
    h[0] += a;
    h[1] += b;
    h[2] += c;
    h[3] += d;
    h[4] += e;
    h[5] += f;
    h[6] += g;
    h[7] += hh;
}

/* SHA-256 of a message of at most 247 bytes (one or a few blocks; ours are short). */
static void sha256(const uint8_t *msg, size_t len, uint8_t out[32]) {
    uint32_t h[8] = {0x6a09e667, 0xbb67ae85, 0x3c6ef372, 0xa54ff53a,
                     0x510e527f, 0x9b05688c, 0x1f83d9ab, 0x5be0cd19};
    uint8_t buf[256] = {0};
    size_t padded = (len + 9 + 63) / 64 * 64;
    memcpy(buf, msg, len);
    buf[len] = 0x80;
    uint64_t bits = (uint64_t)len * 8;
    for (unsigned int i = 0; i < 8; i++)
        buf[padded - 1 - i] = (uint8_t)(bits >> (8 * i));
    for (size_t off = 0; off < padded; off += 64)
        sha256_block(h, buf + off);
    for (unsigned int i = 0; i < 8; i++) {
        out[4 * i] = (uint8_t)(h[i] >> 24);
        out[4 * i + 1] = (uint8_t)(h[i] >> 16);
        out[4 * i + 2] = (uint8_t)(h[i] >> 8);
        out[4 * i + 3] = (uint8_t)h[i];
    }
}

/* `MIG-xxxxxxxx-xxxx-5xxx-yxxx-xxxxxxxxxxxx` from SHA-256("tessera-mig-uuid\0" parent
 * "\0" gi_be32 ci_be32), version nibble 5, variant 10xx: exactly geometry::mig_uuid. */
static void mig_uuid(const char *parent, unsigned int gi_id, unsigned int ci_id,
                     char out[NVML_DEVICE_UUID_V2_BUFFER_SIZE]) {
    static const char PREFIX[] = "tessera-mig-uuid"; /* hashed with its NUL */
    uint8_t msg[200];
    size_t n = 0, plen = strlen(parent);
    memcpy(msg, PREFIX, sizeof PREFIX);
    n += sizeof PREFIX;
    memcpy(msg + n, parent, plen + 1); /* parent UUID and its NUL separator */
    n += plen + 1;
    for (int shift = 24; shift >= 0; shift -= 8)
        msg[n++] = (uint8_t)(gi_id >> shift);
    for (int shift = 24; shift >= 0; shift -= 8)
        msg[n++] = (uint8_t)(ci_id >> shift);
    uint8_t d[32];
    sha256(msg, n, d);
    d[6] = (uint8_t)((d[6] & 0x0f) | 0x50);
    d[8] = (uint8_t)((d[8] & 0x3f) | 0x80);
    snprintf(out, NVML_DEVICE_UUID_V2_BUFFER_SIZE,
             "MIG-%02x%02x%02x%02x-%02x%02x-%02x%02x-%02x%02x-%02x%02x%02x%02x%02x%02x", d[0],
             d[1], d[2], d[3], d[4], d[5], d[6], d[7], d[8], d[9], d[10], d[11], d[12], d[13],
             d[14], d[15]);
}

/* ---- Internal implementations (called with g_lock held) ---------------------------- */

static nvmlReturn_t init_locked(void) {
    if (g_init_count == 0) {
        init_handles();
        nvmlReturn_t rc = load_node();
        if (rc != NVML_SUCCESS)
            return rc;
    }
    g_init_count++;
    return NVML_SUCCESS;
}

static nvmlReturn_t shutdown_locked(void) {
    if (g_init_count == 0)
        return NVML_ERROR_UNINITIALIZED;
    if (--g_init_count == 0)
        memset(&g_node, 0, sizeof g_node);
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
 * INVALID_ARGUMENT for a handle that is not one of ours (MIG device handles included). */
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

/* A GPU's UUID, or the `MIG-...` UUID of a live MIG device (its compute instance). */
static nvmlReturn_t device_uuid(nvmlDevice_t device, char *uuid, unsigned int length) {
    size_t i;
    if (g_init_count != 0 &&
        table_index(device, g_mig_handles, sizeof g_mig_handles[0][0][0],
                    (size_t)FAKE_MAX_GPUS * FAKE_MAX_GIS * FAKE_MAX_CIS, &i) == 0) {
        unsigned int slot = (unsigned int)(i / (FAKE_MAX_GIS * FAKE_MAX_CIS));
        unsigned int gi_id = (unsigned int)(i / FAKE_MAX_CIS % FAKE_MAX_GIS);
        unsigned int ci_id = (unsigned int)(i % FAKE_MAX_CIS);
        if (slot >= g_node.gpu_count)
            return NVML_ERROR_INVALID_ARGUMENT;
        nvmlReturn_t rc = refresh_locked();
        if (rc != NVML_SUCCESS)
            return rc;
        const struct fake_ci *ci = find_ci(&g_node.gpus[slot].mig, gi_id);
        if (ci == NULL || ci->ci_id != ci_id)
            return NVML_ERROR_INVALID_ARGUMENT;
        return copy_string(uuid, length, ci->uuid);
    }
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
    if (g->mig_enabled)
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
    if (s == NULL || g->mig_enabled)
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

static nvmlReturn_t device_mig_mode(nvmlDevice_t device, unsigned int *current,
                                    unsigned int *pending) {
    const struct fake_gpu *g;
    nvmlReturn_t rc = gpu_of(device, &g);
    if (rc != NVML_SUCCESS)
        return rc;
    if (current == NULL || pending == NULL)
        return NVML_ERROR_INVALID_ARGUMENT;
    if (!g->mig_capable)
        return NVML_ERROR_NOT_SUPPORTED;
    /* The mode may have been switched by another writer (the mock backend). */
    rc = refresh_locked();
    if (rc != NVML_SUCCESS)
        return rc;
    *current = g->mig_enabled ? NVML_DEVICE_MIG_ENABLE : NVML_DEVICE_MIG_DISABLE;
    *pending = *current;
    return NVML_SUCCESS;
}

/* ---- MIG (called with g_lock held) ------------------------------------------------- */

/* The slot of a physical GPU handle for a MIG call: NOT_SUPPORTED unless the GPU is
 * MIG-capable and has profiles (a capable GPU without a catalogued model has none, and
 * the mock backend refuses it the same way). */
static nvmlReturn_t mig_slot_of(nvmlDevice_t device, unsigned int *slot) {
    nvmlReturn_t rc = slot_of(device, slot);
    if (rc != NVML_SUCCESS)
        return rc;
    const struct fake_gpu *g = &g_node.gpus[*slot];
    return g->mig_capable && g->mig.profile_count > 0 ? NVML_SUCCESS : NVML_ERROR_NOT_SUPPORTED;
}

/* As mig_slot_of, then refreshes the MIG lines and requires MIG mode to be on. */
static nvmlReturn_t mig_enabled_slot_of(nvmlDevice_t device, unsigned int *slot) {
    nvmlReturn_t rc = mig_slot_of(device, slot);
    if (rc == NVML_SUCCESS)
        rc = refresh_locked();
    if (rc == NVML_SUCCESS && !g_node.gpus[*slot].mig_enabled)
        rc = NVML_ERROR_NOT_SUPPORTED;
    return rc;
}

/* The coordinates a GPU-instance handle stands for (it may be stale). */
static nvmlReturn_t gi_coords(nvmlGpuInstance_t gpu_instance, unsigned int *slot,
                              unsigned int *gi_id) {
    size_t i;
    if (g_init_count == 0)
        return NVML_ERROR_UNINITIALIZED;
    if (table_index(gpu_instance, g_gi_handles, sizeof g_gi_handles[0][0],
                    (size_t)FAKE_MAX_GPUS * FAKE_MAX_GIS, &i) != 0 ||
        i / FAKE_MAX_GIS >= g_node.gpu_count)
        return NVML_ERROR_INVALID_ARGUMENT;
    *slot = (unsigned int)(i / FAKE_MAX_GIS);
    *gi_id = (unsigned int)(i % FAKE_MAX_GIS);
    return NVML_SUCCESS;
}

/* The live GPU instance behind a handle, after a refresh; INVALID_ARGUMENT once it is
 * destroyed. */
static nvmlReturn_t live_gi(nvmlGpuInstance_t gpu_instance, unsigned int *slot,
                            const struct fake_gi **out) {
    unsigned int gi_id;
    nvmlReturn_t rc = gi_coords(gpu_instance, slot, &gi_id);
    if (rc == NVML_SUCCESS)
        rc = refresh_locked();
    if (rc != NVML_SUCCESS)
        return rc;
    *out = find_gi(&g_node.gpus[*slot].mig, gi_id);
    return *out != NULL ? NVML_SUCCESS : NVML_ERROR_INVALID_ARGUMENT;
}

/* The coordinates a compute-instance handle stands for (it may be stale). */
static nvmlReturn_t ci_coords(nvmlComputeInstance_t compute_instance, unsigned int *slot,
                              unsigned int *gi_id, unsigned int *ci_id) {
    size_t i;
    if (g_init_count == 0)
        return NVML_ERROR_UNINITIALIZED;
    if (table_index(compute_instance, g_ci_handles, sizeof g_ci_handles[0][0][0],
                    (size_t)FAKE_MAX_GPUS * FAKE_MAX_GIS * FAKE_MAX_CIS, &i) != 0 ||
        i / (FAKE_MAX_GIS * FAKE_MAX_CIS) >= g_node.gpu_count)
        return NVML_ERROR_INVALID_ARGUMENT;
    *slot = (unsigned int)(i / (FAKE_MAX_GIS * FAKE_MAX_CIS));
    *gi_id = (unsigned int)(i / FAKE_MAX_CIS % FAKE_MAX_GIS);
    *ci_id = (unsigned int)(i % FAKE_MAX_CIS);
    return NVML_SUCCESS;
}

/* The GI profile fields shared by every version of the profile-info struct. */
static void gi_profile_fields(const struct fake_profile *p, nvmlGpuInstanceProfileInfo_t *v1) {
    memset(v1, 0, sizeof *v1);
    v1->id = p->profile_id;
    v1->isP2pSupported = 0;
    v1->sliceCount = ci_profile_slices(p->ci_profile_index);
    v1->instanceCount = p->instance_count;
    v1->multiprocessorCount = p->multiprocessors;
    v1->copyEngineCount = p->copy_engines;
    v1->decoderCount = p->decoders;
    v1->encoderCount = p->encoders;
    v1->jpegCount = p->jpegs;
    v1->ofaCount = p->ofas;
    v1->memorySizeMB = p->memory_mib;
}

/* The profile at NVML profile index `index` (geometry::profile_info): INVALID_ARGUMENT
 * at or above NVML_GPU_INSTANCE_PROFILE_COUNT, NOT_SUPPORTED for one the GPU lacks.
 * Profiles do not depend on MIG mode. */
static nvmlReturn_t gi_profile_at(nvmlDevice_t device, unsigned int index,
                                  const struct fake_profile **out) {
    const struct fake_gpu *g;
    nvmlReturn_t rc = gpu_of(device, &g);
    if (rc != NVML_SUCCESS)
        return rc;
    if (!g->mig_capable)
        return NVML_ERROR_NOT_SUPPORTED;
    if (index >= NVML_GPU_INSTANCE_PROFILE_COUNT)
        return NVML_ERROR_INVALID_ARGUMENT;
    *out = profile_by_index(&g->mig, index);
    return *out != NULL ? NVML_SUCCESS : NVML_ERROR_NOT_SUPPORTED;
}

static nvmlReturn_t gi_profile_info(nvmlDevice_t device, unsigned int index,
                                    nvmlGpuInstanceProfileInfo_t *info) {
    const struct fake_profile *p;
    nvmlReturn_t rc = gi_profile_at(device, index, &p);
    if (rc != NVML_SUCCESS)
        return rc;
    if (info == NULL)
        return NVML_ERROR_INVALID_ARGUMENT;
    gi_profile_fields(p, info);
    return NVML_SUCCESS;
}

/* The versioned call: `info->version` must be v2 or v3 (INVALID_ARGUMENT otherwise).
 * Names read `MIG 1g.10gb`, as nvidia-smi lists them. */
static nvmlReturn_t gi_profile_info_v(nvmlDevice_t device, unsigned int index,
                                      nvmlGpuInstanceProfileInfo_v2_t *info) {
    if (info == NULL)
        return NVML_ERROR_INVALID_ARGUMENT;
    unsigned int version = info->version;
    if (version != nvmlGpuInstanceProfileInfo_v2 && version != nvmlGpuInstanceProfileInfo_v3)
        return g_init_count == 0 ? NVML_ERROR_UNINITIALIZED : NVML_ERROR_INVALID_ARGUMENT;
    const struct fake_profile *p;
    nvmlReturn_t rc = gi_profile_at(device, index, &p);
    if (rc != NVML_SUCCESS)
        return rc;
    nvmlGpuInstanceProfileInfo_t v1;
    gi_profile_fields(p, &v1);
    if (version == nvmlGpuInstanceProfileInfo_v2) {
        nvmlGpuInstanceProfileInfo_v2_t v2;
        memset(&v2, 0, sizeof v2);
        v2.version = version;
        v2.id = v1.id;
        v2.isP2pSupported = v1.isP2pSupported;
        v2.sliceCount = v1.sliceCount;
        v2.instanceCount = v1.instanceCount;
        v2.multiprocessorCount = v1.multiprocessorCount;
        v2.copyEngineCount = v1.copyEngineCount;
        v2.decoderCount = v1.decoderCount;
        v2.encoderCount = v1.encoderCount;
        v2.jpegCount = v1.jpegCount;
        v2.ofaCount = v1.ofaCount;
        v2.memorySizeMB = v1.memorySizeMB;
        snprintf(v2.name, sizeof v2.name, "MIG %s", p->name);
        memcpy(info, &v2, sizeof v2);
    } else {
        nvmlGpuInstanceProfileInfo_v3_t v3;
        memset(&v3, 0, sizeof v3);
        v3.version = version;
        v3.id = v1.id;
        v3.sliceCount = v1.sliceCount;
        v3.instanceCount = v1.instanceCount;
        v3.multiprocessorCount = v1.multiprocessorCount;
        v3.copyEngineCount = v1.copyEngineCount;
        v3.decoderCount = v1.decoderCount;
        v3.encoderCount = v1.encoderCount;
        v3.jpegCount = v1.jpegCount;
        v3.ofaCount = v1.ofaCount;
        v3.memorySizeMB = v1.memorySizeMB;
        snprintf(v3.name, sizeof v3.name, "MIG %s", p->name);
        v3.capabilities = 0;
        memcpy(info, &v3, sizeof v3);
    }
    return NVML_SUCCESS;
}

/* All placements of a profile, whatever MIG mode and occupancy; `placements == NULL`
 * asks for the count only. */
static nvmlReturn_t possible_placements(nvmlDevice_t device, unsigned int profile_id,
                                        nvmlGpuInstancePlacement_t *placements,
                                        unsigned int *count) {
    unsigned int slot;
    nvmlReturn_t rc = mig_slot_of(device, &slot);
    if (rc != NVML_SUCCESS)
        return rc;
    if (count == NULL)
        return NVML_ERROR_INVALID_ARGUMENT;
    const struct fake_profile *p = profile_by_id(&g_node.gpus[slot].mig, profile_id);
    if (p == NULL)
        return NVML_ERROR_INVALID_ARGUMENT;
    unsigned int n = p->placement_count;
    if (placements == NULL) {
        *count = n;
        return NVML_SUCCESS;
    }
    if (*count < n) {
        *count = n;
        return NVML_ERROR_INSUFFICIENT_SIZE;
    }
    for (unsigned int k = 0; k < n; k++)
        placements[k] = (nvmlGpuInstancePlacement_t){p->placements[k], p->memory_slices};
    *count = n;
    return NVML_SUCCESS;
}

static nvmlReturn_t gi_remaining_capacity(nvmlDevice_t device, unsigned int profile_id,
                                          unsigned int *count) {
    unsigned int slot;
    nvmlReturn_t rc = mig_enabled_slot_of(device, &slot);
    if (rc != NVML_SUCCESS)
        return rc;
    if (count == NULL)
        return NVML_ERROR_INVALID_ARGUMENT;
    const struct fake_mig *m = &g_node.gpus[slot].mig;
    const struct fake_profile *p = profile_by_id(m, profile_id);
    if (p == NULL)
        return NVML_ERROR_INVALID_ARGUMENT;
    *count = remaining_capacity(m, p);
    return NVML_SUCCESS;
}

struct create_gi_args {
    unsigned int profile_id;
    nvmlGpuInstancePlacement_t placement;
    unsigned int gi_id; /* out */
};

static nvmlReturn_t create_gi_change(struct fake_gpu *g, void *arg, int *dirty) {
    struct create_gi_args *a = arg;
    struct fake_mig *m = &g->mig;
    if (!g->mig_enabled)
        return NVML_ERROR_NOT_SUPPORTED;
    nvmlReturn_t rc =
        check_create(m, a->profile_id, a->placement.start, a->placement.size, &a->gi_id);
    if (rc != NVML_SUCCESS)
        return rc;
    if (m->gi_count == FAKE_MAX_GIS)
        return NVML_ERROR_INSUFFICIENT_RESOURCES;
    /* Keep GIs ascending by ID, as the mock backend does. */
    unsigned int k = m->gi_count++;
    while (k > 0 && m->gis[k - 1].gi_id > a->gi_id) {
        m->gis[k] = m->gis[k - 1];
        k--;
    }
    m->gis[k] = (struct fake_gi){a->gi_id, a->profile_id, a->placement.start,
                                 a->placement.size};
    *dirty = 1;
    return NVML_SUCCESS;
}

static nvmlReturn_t create_gi_with_placement(nvmlDevice_t device, unsigned int profile_id,
                                             const nvmlGpuInstancePlacement_t *placement,
                                             nvmlGpuInstance_t *gpu_instance) {
    unsigned int slot;
    nvmlReturn_t rc = mig_slot_of(device, &slot);
    if (rc != NVML_SUCCESS)
        return rc;
    if (placement == NULL || gpu_instance == NULL)
        return NVML_ERROR_INVALID_ARGUMENT;
    struct create_gi_args args = {profile_id, *placement, 0};
    rc = mutate_locked(slot, create_gi_change, &args);
    if (rc == NVML_SUCCESS)
        *gpu_instance = &g_gi_handles[slot][args.gi_id];
    return rc;
}

/* The GIs of one profile, ascending by ID. The buffer must hold the profile's
 * instanceCount, as NVML requires; `*count` is output only. */
static nvmlReturn_t gpu_instances(nvmlDevice_t device, unsigned int profile_id,
                                  nvmlGpuInstance_t *gpu_instances, unsigned int *count) {
    unsigned int slot;
    nvmlReturn_t rc = mig_enabled_slot_of(device, &slot);
    if (rc != NVML_SUCCESS)
        return rc;
    if (gpu_instances == NULL || count == NULL)
        return NVML_ERROR_INVALID_ARGUMENT;
    const struct fake_mig *m = &g_node.gpus[slot].mig;
    const struct fake_profile *p = profile_by_id(m, profile_id);
    if (p == NULL)
        return NVML_ERROR_INVALID_ARGUMENT;
    unsigned int n = 0;
    for (unsigned int i = 0; i < m->gi_count && n < p->instance_count; i++)
        if (m->gis[i].profile_id == profile_id)
            gpu_instances[n++] = &g_gi_handles[slot][m->gis[i].gi_id];
    *count = n;
    return NVML_SUCCESS;
}

static nvmlReturn_t gpu_instance_by_id(nvmlDevice_t device, unsigned int id,
                                       nvmlGpuInstance_t *gpu_instance) {
    unsigned int slot;
    nvmlReturn_t rc = mig_enabled_slot_of(device, &slot);
    if (rc != NVML_SUCCESS)
        return rc;
    if (gpu_instance == NULL)
        return NVML_ERROR_INVALID_ARGUMENT;
    if (find_gi(&g_node.gpus[slot].mig, id) == NULL)
        return NVML_ERROR_NOT_FOUND;
    *gpu_instance = &g_gi_handles[slot][id];
    return NVML_SUCCESS;
}

/* `device` is the parent GPU (facts A2). */
static nvmlReturn_t gpu_instance_info(nvmlGpuInstance_t gpu_instance,
                                      nvmlGpuInstanceInfo_t *info) {
    unsigned int slot;
    const struct fake_gi *gi;
    nvmlReturn_t rc = live_gi(gpu_instance, &slot, &gi);
    if (rc != NVML_SUCCESS)
        return rc;
    if (info == NULL)
        return NVML_ERROR_INVALID_ARGUMENT;
    info->device = &g_gpu_handles[slot];
    info->id = gi->gi_id;
    info->profileId = gi->profile_id;
    info->placement = (nvmlGpuInstancePlacement_t){gi->start, gi->size};
    return NVML_SUCCESS;
}

struct destroy_args {
    unsigned int gi_id;
    unsigned int ci_id;
};

static nvmlReturn_t destroy_gi_change(struct fake_gpu *g, void *arg, int *dirty) {
    const struct destroy_args *a = arg;
    struct fake_mig *m = &g->mig;
    struct fake_gi *gi = find_gi(m, a->gi_id);
    if (gi == NULL)
        return NVML_ERROR_NOT_FOUND;
    if (find_ci(m, a->gi_id) != NULL || is_busy(m, a->gi_id))
        return NVML_ERROR_IN_USE;
    size_t at = (size_t)(gi - m->gis);
    memmove(gi, gi + 1, (m->gi_count - at - 1) * sizeof *gi);
    m->gi_count--;
    *dirty = 1;
    return NVML_SUCCESS;
}

/* IN_USE while the GI has a compute instance or processes (`mig-busy`); NOT_FOUND when
 * the GI is already gone. */
static nvmlReturn_t gpu_instance_destroy(nvmlGpuInstance_t gpu_instance) {
    unsigned int slot;
    struct destroy_args args = {0, 0};
    nvmlReturn_t rc = gi_coords(gpu_instance, &slot, &args.gi_id);
    if (rc != NVML_SUCCESS)
        return rc;
    if (!g_node.gpus[slot].mig_capable)
        return NVML_ERROR_NOT_SUPPORTED;
    return mutate_locked(slot, destroy_gi_change, &args);
}

/* The full-GI CI profile of a live GI: NOT_SUPPORTED for any other valid CI profile
 * index, INVALID_ARGUMENT for an index out of range or an engine profile but SHARED. */
static nvmlReturn_t full_gi_ci_profile(nvmlGpuInstance_t gpu_instance, unsigned int profile,
                                       unsigned int eng_profile,
                                       const struct fake_profile **out) {
    unsigned int slot;
    const struct fake_gi *gi;
    nvmlReturn_t rc = live_gi(gpu_instance, &slot, &gi);
    if (rc != NVML_SUCCESS)
        return rc;
    if (profile >= NVML_COMPUTE_INSTANCE_PROFILE_COUNT ||
        eng_profile != NVML_COMPUTE_INSTANCE_ENGINE_PROFILE_SHARED)
        return NVML_ERROR_INVALID_ARGUMENT;
    *out = profile_by_id(&g_node.gpus[slot].mig, gi->profile_id);
    return *out != NULL && (*out)->ci_profile_index == profile ? NVML_SUCCESS
                                                                : NVML_ERROR_NOT_SUPPORTED;
}

static void ci_profile_fields(const struct fake_profile *p, nvmlComputeInstanceProfileInfo_t *ci) {
    memset(ci, 0, sizeof *ci);
    ci->id = p->ci_profile_index;
    ci->sliceCount = ci_profile_slices(p->ci_profile_index);
    ci->instanceCount = 1;
    ci->multiprocessorCount = p->multiprocessors;
    ci->sharedCopyEngineCount = p->copy_engines;
    ci->sharedDecoderCount = p->decoders;
    ci->sharedEncoderCount = p->encoders;
    ci->sharedJpegCount = p->jpegs;
    ci->sharedOfaCount = p->ofas;
}

static nvmlReturn_t ci_profile_info(nvmlGpuInstance_t gpu_instance, unsigned int profile,
                                    unsigned int eng_profile,
                                    nvmlComputeInstanceProfileInfo_t *info) {
    const struct fake_profile *p;
    nvmlReturn_t rc = full_gi_ci_profile(gpu_instance, profile, eng_profile, &p);
    if (rc != NVML_SUCCESS)
        return rc;
    if (info == NULL)
        return NVML_ERROR_INVALID_ARGUMENT;
    ci_profile_fields(p, info);
    return NVML_SUCCESS;
}

/* The versioned call: `info->version` must be v2 or v3 (INVALID_ARGUMENT otherwise). */
static nvmlReturn_t ci_profile_info_v(nvmlGpuInstance_t gpu_instance, unsigned int profile,
                                      unsigned int eng_profile,
                                      nvmlComputeInstanceProfileInfo_v2_t *info) {
    if (info == NULL)
        return NVML_ERROR_INVALID_ARGUMENT;
    unsigned int version = info->version;
    if (version != nvmlComputeInstanceProfileInfo_v2 &&
        version != nvmlComputeInstanceProfileInfo_v3)
        return g_init_count == 0 ? NVML_ERROR_UNINITIALIZED : NVML_ERROR_INVALID_ARGUMENT;
    const struct fake_profile *p;
    nvmlReturn_t rc = full_gi_ci_profile(gpu_instance, profile, eng_profile, &p);
    if (rc != NVML_SUCCESS)
        return rc;
    nvmlComputeInstanceProfileInfo_t v1;
    ci_profile_fields(p, &v1);
    /* v2 and v3 share their first fields; v3 adds capabilities (0) after the name. */
    nvmlComputeInstanceProfileInfo_v3_t v3;
    memset(&v3, 0, sizeof v3);
    v3.version = version;
    v3.id = v1.id;
    v3.sliceCount = v1.sliceCount;
    v3.instanceCount = v1.instanceCount;
    v3.multiprocessorCount = v1.multiprocessorCount;
    v3.sharedCopyEngineCount = v1.sharedCopyEngineCount;
    v3.sharedDecoderCount = v1.sharedDecoderCount;
    v3.sharedEncoderCount = v1.sharedEncoderCount;
    v3.sharedJpegCount = v1.sharedJpegCount;
    v3.sharedOfaCount = v1.sharedOfaCount;
    snprintf(v3.name, sizeof v3.name, "MIG %s", p->name);
    memcpy(info, &v3,
           version == nvmlComputeInstanceProfileInfo_v3 ? sizeof v3
                                                        : sizeof(nvmlComputeInstanceProfileInfo_v2_t));
    return NVML_SUCCESS;
}

struct create_ci_args {
    unsigned int gi_id;
    unsigned int profile_id;
};

static nvmlReturn_t create_ci_change(struct fake_gpu *g, void *arg, int *dirty) {
    const struct create_ci_args *a = arg;
    struct fake_mig *m = &g->mig;
    const struct fake_gi *gi = find_gi(m, a->gi_id);
    if (gi == NULL)
        return NVML_ERROR_INVALID_ARGUMENT;
    const struct fake_profile *p = profile_by_id(m, gi->profile_id);
    if (p == NULL || p->ci_profile_index != a->profile_id)
        return NVML_ERROR_NOT_SUPPORTED;
    if (find_ci(m, a->gi_id) != NULL || m->ci_count == FAKE_MAX_GIS)
        return NVML_ERROR_INSUFFICIENT_RESOURCES;
    struct fake_ci *ci = &m->cis[m->ci_count++];
    ci->gi_id = a->gi_id;
    ci->ci_id = 0;
    ci->ci_profile = a->profile_id;
    mig_uuid(g->uuid, a->gi_id, 0, ci->uuid);
    *dirty = 1;
    return NVML_SUCCESS;
}

/* Only the compute instance spanning the whole GI (CI ID 0): NOT_SUPPORTED for any
 * other profile, INSUFFICIENT_RESOURCES when it exists already. */
static nvmlReturn_t create_compute_instance(nvmlGpuInstance_t gpu_instance,
                                            unsigned int profile_id,
                                            nvmlComputeInstance_t *compute_instance) {
    unsigned int slot;
    struct create_ci_args args = {0, profile_id};
    nvmlReturn_t rc = gi_coords(gpu_instance, &slot, &args.gi_id);
    if (rc != NVML_SUCCESS)
        return rc;
    if (compute_instance == NULL || profile_id >= NVML_COMPUTE_INSTANCE_PROFILE_COUNT)
        return NVML_ERROR_INVALID_ARGUMENT;
    rc = mutate_locked(slot, create_ci_change, &args);
    if (rc == NVML_SUCCESS)
        *compute_instance = &g_ci_handles[slot][args.gi_id][0];
    return rc;
}

static nvmlReturn_t compute_instances(nvmlGpuInstance_t gpu_instance, unsigned int profile_id,
                                      nvmlComputeInstance_t *compute_instances,
                                      unsigned int *count) {
    const struct fake_profile *p;
    unsigned int slot = 0, gi_id = 0;
    nvmlReturn_t rc = gi_coords(gpu_instance, &slot, &gi_id);
    if (rc == NVML_SUCCESS)
        rc = full_gi_ci_profile(gpu_instance, profile_id,
                                NVML_COMPUTE_INSTANCE_ENGINE_PROFILE_SHARED, &p);
    if (rc != NVML_SUCCESS)
        return rc;
    if (compute_instances == NULL || count == NULL)
        return NVML_ERROR_INVALID_ARGUMENT;
    const struct fake_ci *ci = find_ci(&g_node.gpus[slot].mig, gi_id);
    unsigned int n = 0;
    if (ci != NULL && ci->ci_profile == profile_id)
        compute_instances[n++] = &g_ci_handles[slot][gi_id][ci->ci_id];
    *count = n;
    return NVML_SUCCESS;
}

/* `device` is the MIG device handle of this CI, whose UUID is the `MIG-...` one (facts
 * A2 note); the placement spans the GI's compute slices. */
static nvmlReturn_t compute_instance_info(nvmlComputeInstance_t compute_instance,
                                          nvmlComputeInstanceInfo_t *info) {
    unsigned int slot, gi_id, ci_id;
    nvmlReturn_t rc = ci_coords(compute_instance, &slot, &gi_id, &ci_id);
    if (rc == NVML_SUCCESS)
        rc = refresh_locked();
    if (rc != NVML_SUCCESS)
        return rc;
    const struct fake_ci *ci = find_ci(&g_node.gpus[slot].mig, gi_id);
    if (ci == NULL || ci->ci_id != ci_id || info == NULL)
        return NVML_ERROR_INVALID_ARGUMENT;
    info->device = &g_mig_handles[slot][gi_id][ci_id];
    info->gpuInstance = &g_gi_handles[slot][gi_id];
    info->id = ci_id;
    info->profileId = ci->ci_profile;
    info->placement = (nvmlComputeInstancePlacement_t){0, ci_profile_slices(ci->ci_profile)};
    return NVML_SUCCESS;
}

static nvmlReturn_t destroy_ci_change(struct fake_gpu *g, void *arg, int *dirty) {
    const struct destroy_args *a = arg;
    struct fake_mig *m = &g->mig;
    const struct fake_ci *ci = find_ci(m, a->gi_id);
    if (ci == NULL || ci->ci_id != a->ci_id)
        return NVML_ERROR_NOT_FOUND;
    if (is_busy(m, a->gi_id))
        return NVML_ERROR_IN_USE;
    size_t at = (size_t)(ci - m->cis);
    memmove(&m->cis[at], &m->cis[at + 1], (m->ci_count - at - 1) * sizeof m->cis[0]);
    m->ci_count--;
    *dirty = 1;
    return NVML_SUCCESS;
}

/* IN_USE while processes run on the MIG device (`mig-busy` on its GI); NOT_FOUND when
 * the CI is already gone. */
static nvmlReturn_t compute_instance_destroy(nvmlComputeInstance_t compute_instance) {
    unsigned int slot;
    struct destroy_args args = {0, 0};
    nvmlReturn_t rc = ci_coords(compute_instance, &slot, &args.gi_id, &args.ci_id);
    if (rc != NVML_SUCCESS)
        return rc;
    if (!g_node.gpus[slot].mig_capable)
        return NVML_ERROR_NOT_SUPPORTED;
    return mutate_locked(slot, destroy_ci_change, &args);
}

struct set_mode_args {
    int enable;
    nvmlReturn_t status; /* out: the activation status */
};

static nvmlReturn_t set_mode_change(struct fake_gpu *g, void *arg, int *dirty) {
    struct set_mode_args *a = arg;
    a->status = NVML_SUCCESS;
    if (g->mig_enabled == a->enable)
        return NVML_SUCCESS;
    if (g->architecture < NVML_DEVICE_ARCH_HOPPER) {
        a->status = NVML_ERROR_RESET_REQUIRED;
    } else if (!a->enable && g->mig.gi_count > 0) {
        a->status = NVML_ERROR_IN_USE;
    } else {
        g->mig_enabled = a->enable;
        *dirty = 1;
    }
    return NVML_SUCCESS;
}

/* The request is accepted unless the GPU cannot do MIG; what happened is the
 * activation status (see the contract at the top). */
static nvmlReturn_t set_mig_mode(nvmlDevice_t device, unsigned int mode,
                                 nvmlReturn_t *activation_status) {
    unsigned int slot;
    nvmlReturn_t rc = mig_slot_of(device, &slot);
    if (rc != NVML_SUCCESS)
        return rc;
    if (activation_status == NULL ||
        (mode != NVML_DEVICE_MIG_DISABLE && mode != NVML_DEVICE_MIG_ENABLE))
        return NVML_ERROR_INVALID_ARGUMENT;
    struct set_mode_args args = {mode == NVML_DEVICE_MIG_ENABLE, NVML_SUCCESS};
    rc = mutate_locked(slot, set_mode_change, &args);
    if (rc == NVML_SUCCESS)
        *activation_status = args.status;
    return rc;
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
    LOCKED(set_mig_mode(device, mode, activationStatus));
}

nvmlReturn_t nvmlDeviceGetGpuInstanceProfileInfo(nvmlDevice_t device, unsigned int profile,
                                                 nvmlGpuInstanceProfileInfo_t *info) {
    LOCKED(gi_profile_info(device, profile, info));
}

nvmlReturn_t nvmlDeviceGetGpuInstanceProfileInfoV(nvmlDevice_t device, unsigned int profile,
                                                  nvmlGpuInstanceProfileInfo_v2_t *info) {
    LOCKED(gi_profile_info_v(device, profile, info));
}

nvmlReturn_t nvmlDeviceGetGpuInstancePossiblePlacements_v2(
    nvmlDevice_t device, unsigned int profileId, nvmlGpuInstancePlacement_t *placements,
    unsigned int *count) {
    LOCKED(possible_placements(device, profileId, placements, count));
}

nvmlReturn_t nvmlDeviceGetGpuInstanceRemainingCapacity(nvmlDevice_t device,
                                                       unsigned int profileId,
                                                       unsigned int *count) {
    LOCKED(gi_remaining_capacity(device, profileId, count));
}

nvmlReturn_t nvmlDeviceCreateGpuInstanceWithPlacement(
    nvmlDevice_t device, unsigned int profileId, const nvmlGpuInstancePlacement_t *placement,
    nvmlGpuInstance_t *gpuInstance) {
    LOCKED(create_gi_with_placement(device, profileId, placement, gpuInstance));
}

nvmlReturn_t nvmlDeviceGetGpuInstances(nvmlDevice_t device, unsigned int profileId,
                                       nvmlGpuInstance_t *gpuInstances, unsigned int *count) {
    LOCKED(gpu_instances(device, profileId, gpuInstances, count));
}

nvmlReturn_t nvmlDeviceGetGpuInstanceById(nvmlDevice_t device, unsigned int id,
                                          nvmlGpuInstance_t *gpuInstance) {
    LOCKED(gpu_instance_by_id(device, id, gpuInstance));
}

nvmlReturn_t nvmlGpuInstanceGetInfo(nvmlGpuInstance_t gpuInstance, nvmlGpuInstanceInfo_t *info) {
    LOCKED(gpu_instance_info(gpuInstance, info));
}

nvmlReturn_t nvmlGpuInstanceDestroy(nvmlGpuInstance_t gpuInstance) {
    LOCKED(gpu_instance_destroy(gpuInstance));
}

nvmlReturn_t nvmlGpuInstanceGetComputeInstanceProfileInfo(
    nvmlGpuInstance_t gpuInstance, unsigned int profile, unsigned int engProfile,
    nvmlComputeInstanceProfileInfo_t *info) {
    LOCKED(ci_profile_info(gpuInstance, profile, engProfile, info));
}

nvmlReturn_t nvmlGpuInstanceGetComputeInstanceProfileInfoV(
    nvmlGpuInstance_t gpuInstance, unsigned int profile, unsigned int engProfile,
    nvmlComputeInstanceProfileInfo_v2_t *info) {
    LOCKED(ci_profile_info_v(gpuInstance, profile, engProfile, info));
}

nvmlReturn_t nvmlGpuInstanceCreateComputeInstance(nvmlGpuInstance_t gpuInstance,
                                                  unsigned int profileId,
                                                  nvmlComputeInstance_t *computeInstance) {
    LOCKED(create_compute_instance(gpuInstance, profileId, computeInstance));
}

nvmlReturn_t nvmlGpuInstanceGetComputeInstances(nvmlGpuInstance_t gpuInstance,
                                                unsigned int profileId,
                                                nvmlComputeInstance_t *computeInstances,
                                                unsigned int *count) {
    LOCKED(compute_instances(gpuInstance, profileId, computeInstances, count));
}

nvmlReturn_t nvmlComputeInstanceGetInfo_v2(nvmlComputeInstance_t computeInstance,
                                           nvmlComputeInstanceInfo_t *info) {
    LOCKED(compute_instance_info(computeInstance, info));
}

nvmlReturn_t nvmlComputeInstanceDestroy(nvmlComputeInstance_t computeInstance) {
    LOCKED(compute_instance_destroy(computeInstance));
}
