/*
 * fake_nvml.c: a fake `libnvidia-ml.so.1` over Tessera's simulated node.
 *
 * Owns: the NVML C ABI that nvml-wrapper 0.13 uses for whole-GPU discovery, answered
 * from the simulated node's state file `$TESSERA_FAKE_NVML_STATE_DIR/mock-node.state`
 * (the line format documented in src/backend/state.rs). The mock backend writes that
 * file, so the NVML backend and the mock backend see one and the same node.
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
 *   - Device handles are pointers into a static array of per-GPU records; exported
 *     functions never call each other (internal helpers are static), as in the real
 *     driver, so an interposer on one symbol cannot change what another returns.
 *   - One mutex serialises every entry point (NVML is thread-safe).
 *
 * Extending: MIG calls and state writes will add fields to `struct fake_gpu` and keys
 * to `gpu_set()`; unknown keys are ignored here exactly as in state.rs.
 */
#define _POSIX_C_SOURCE 200809L

#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

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

/* The struct layouts above are the ABI; catch accidental edits at compile time. */
_Static_assert(sizeof(nvmlMemory_t) == 24, "nvmlMemory_t layout");
_Static_assert(sizeof(nvmlMemory_v2_t) == 40, "nvmlMemory_v2_t layout");
_Static_assert(sizeof(nvmlPciInfo_t) == 68, "nvmlPciInfo_t layout");

/* The exported entry points, declared as nvml.h declares them. */
nvmlReturn_t nvmlInit_v2(void);
nvmlReturn_t nvmlInitWithFlags(unsigned int flags);
nvmlReturn_t nvmlShutdown(void);
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
nvmlReturn_t nvmlDeviceGetMinorNumber(nvmlDevice_t device, unsigned int *minorNumber);
nvmlReturn_t nvmlDeviceGetPciInfo_v3(nvmlDevice_t device, nvmlPciInfo_t *pci);
nvmlReturn_t nvmlDeviceGetNumaNodeId(nvmlDevice_t device, unsigned int *node);
nvmlReturn_t nvmlDeviceGetCudaComputeCapability(nvmlDevice_t device, int *major, int *minor);
nvmlReturn_t nvmlDeviceGetNumGpuCores(nvmlDevice_t device, unsigned int *numCores);
nvmlReturn_t nvmlDeviceGetMigMode(nvmlDevice_t device, unsigned int *currentMode,
                                  unsigned int *pendingMode);

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

/* What an `nvmlDevice_t` points at. MIG device handles will become a second kind. */
struct nvmlDevice_st {
    struct fake_gpu gpu;
};

struct fake_node {
    char driver_version[NVML_SYSTEM_DRIVER_VERSION_BUFFER_SIZE];
    int cuda_driver_version;
    unsigned int gpu_count;
    /* In state-file order (by minor). */
    struct nvmlDevice_st devices[FAKE_MAX_GPUS];
    /* NVML index -> device. */
    struct nvmlDevice_st *by_index[FAKE_MAX_GPUS];
};

static pthread_mutex_t g_lock = PTHREAD_MUTEX_INITIALIZER;
static unsigned int g_init_count;
static struct fake_node g_node;

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
 * NVIDIA's cuda-samples helper_cuda.h. Must agree with src/backend/nvml.rs, which
 * divides the core count back into SMs. 0 = unknown. */
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
 * Returns 0, or -1 for a bad value. Unknown keys (e.g. `pcie-root`, which lives in
 * sysfs for NVML's consumers) are ignored. */
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
                if ((seen & KEYS_REQUIRED) != KEYS_REQUIRED)
                    rc = fail(err, NVML_ERROR_DRIVER_NOT_LOADED, gpu_start,
                              "gpu block lacks a required key", "");
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
                cur = &node->devices[node->gpu_count++].gpu;
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
        /* `source`, `major` and unknown top-level keys: not NVML's business. */
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
    for (unsigned int i = 0; i < node->gpu_count; i++) {
        struct nvmlDevice_st *d = &node->devices[i];
        if (d->gpu.index >= node->gpu_count || node->by_index[d->gpu.index] != NULL)
            return fail(err, NVML_ERROR_DRIVER_NOT_LOADED, 0,
                        "gpu indices are not a permutation of 0..count-1", "");
        node->by_index[d->gpu.index] = d;
    }
    return NVML_SUCCESS;
}

/* Loads the state file named by the environment into g_node. */
static nvmlReturn_t load_node(void) {
    const char *dir = getenv(STATE_DIR_ENV);
    if (dir == NULL || dir[0] == '\0') {
        fprintf(stderr, "fake-nvml: %s is not set\n", STATE_DIR_ENV);
        return NVML_ERROR_DRIVER_NOT_LOADED;
    }
    char path[4096];
    if (snprintf(path, sizeof path, "%s/%s", dir, STATE_FILE) >= (int)sizeof path) {
        fprintf(stderr, "fake-nvml: %s is too long\n", STATE_DIR_ENV);
        return NVML_ERROR_DRIVER_NOT_LOADED;
    }
    FILE *f = fopen(path, "r");
    if (f == NULL) {
        fprintf(stderr, "fake-nvml: cannot open %s: %s\n", path, strerror(errno));
        return NVML_ERROR_DRIVER_NOT_LOADED;
    }
    struct parse_error err = {NVML_SUCCESS, 0, ""};
    nvmlReturn_t rc = parse_state(f, &g_node, &err);
    fclose(f);
    if (rc != NVML_SUCCESS) {
        fprintf(stderr, "fake-nvml: %s line %u: %s\n", path, err.line, err.reason);
        memset(&g_node, 0, sizeof g_node);
    }
    return rc;
}

/* ---- Internal implementations (called with g_lock held) ---------------------------- */

static nvmlReturn_t init_locked(void) {
    if (g_init_count == 0) {
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

/* Resolves a handle to its GPU: UNINITIALIZED before init, INVALID_ARGUMENT for a
 * handle that is not one of ours. */
static nvmlReturn_t gpu_of(nvmlDevice_t device, const struct fake_gpu **out) {
    if (g_init_count == 0)
        return NVML_ERROR_UNINITIALIZED;
    for (unsigned int i = 0; i < g_node.gpu_count; i++) {
        if (device == &g_node.devices[i]) {
            *out = &g_node.devices[i].gpu;
            return NVML_SUCCESS;
        }
    }
    return NVML_ERROR_INVALID_ARGUMENT;
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
    *device = g_node.by_index[index];
    return NVML_SUCCESS;
}

static nvmlReturn_t device_uuid(nvmlDevice_t device, char *uuid, unsigned int length) {
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

/* Nothing runs on a simulated GPU: all memory is free, none reserved or used. */
static nvmlReturn_t device_memory(nvmlDevice_t device, nvmlMemory_t *memory) {
    const struct fake_gpu *g;
    nvmlReturn_t rc = gpu_of(device, &g);
    if (rc != NVML_SUCCESS)
        return rc;
    if (memory == NULL)
        return NVML_ERROR_INVALID_ARGUMENT;
    memory->total = g->memory_bytes;
    memory->free = g->memory_bytes;
    memory->used = 0;
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
    memory->total = g->memory_bytes;
    memory->reserved = 0;
    memory->free = g->memory_bytes;
    memory->used = 0;
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
    *current = g->mig_enabled ? NVML_DEVICE_MIG_ENABLE : NVML_DEVICE_MIG_DISABLE;
    *pending = *current;
    return NVML_SUCCESS;
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
