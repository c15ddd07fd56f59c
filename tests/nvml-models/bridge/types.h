/* The subset of nvml.h (go-nvml v0.13.4-1's copy) the bridge implements. Handles are
 * integers here (same size and passing as nvml.h's pointers on 64-bit ABIs): the bridge
 * hands out tokens, never addresses. */
#ifndef TESSERA_NVML_MODEL_TYPES_H
#define TESSERA_NVML_MODEL_TYPES_H
#include <stdint.h>

typedef int nvmlReturn_t;
typedef uintptr_t nvmlDevice_t;
typedef uintptr_t nvmlGpuInstance_t;
typedef uintptr_t nvmlComputeInstance_t;

typedef struct { unsigned long long total, free, used; } nvmlMemory_t;
typedef struct { unsigned int version; unsigned long long total, reserved, free, used; } nvmlMemory_v2_t;
typedef struct {
    char busIdLegacy[16];
    unsigned int domain, bus, device, pciDeviceId, pciSubSystemId;
    char busId[32];
} nvmlPciInfo_t;
typedef struct {
    unsigned int id, isP2pSupported, sliceCount, instanceCount, multiprocessorCount,
        copyEngineCount, decoderCount, encoderCount, jpegCount, ofaCount;
    unsigned long long memorySizeMB;
} nvmlGpuInstanceProfileInfo_t;
typedef struct { unsigned int start, size; } nvmlGpuInstancePlacement_t;
typedef struct {
    nvmlDevice_t device;
    unsigned int id, profileId;
    nvmlGpuInstancePlacement_t placement;
} nvmlGpuInstanceInfo_t;
typedef struct {
    unsigned int id, sliceCount, instanceCount, multiprocessorCount, sharedCopyEngineCount,
        sharedDecoderCount, sharedEncoderCount, sharedJpegCount, sharedOfaCount;
} nvmlComputeInstanceProfileInfo_t;
typedef struct { unsigned int start, size; } nvmlComputeInstancePlacement_t;
typedef struct {
    nvmlDevice_t device;
    nvmlGpuInstance_t gpuInstance;
    unsigned int id, profileId;
    nvmlComputeInstancePlacement_t placement;
} nvmlComputeInstanceInfo_t;
/* For control.json's XID events, processes and utilization (model/control.go). */
typedef uintptr_t nvmlEventSet_t;
typedef struct {
    nvmlDevice_t device;
    unsigned long long eventType, eventData;
    unsigned int gpuInstanceId, computeInstanceId;
} nvmlEventData_t;
typedef struct {
    unsigned int pid;
    unsigned long long usedGpuMemory;
    unsigned int gpuInstanceId, computeInstanceId;
} nvmlProcessInfo_t;
typedef struct {
    unsigned int pid;
    unsigned long long timeStamp;
    unsigned int smUtil, memUtil, encUtil, decUtil;
} nvmlProcessUtilizationSample_t;
typedef struct { unsigned int gpu, memory; } nvmlUtilization_t;
#endif
