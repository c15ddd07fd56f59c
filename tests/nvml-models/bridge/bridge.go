// Command bridge is built as libnvidia-ml.so.1 (-buildmode=c-shared): each NVML C
// function that nvml-wrapper and Tessera call is translated to the go-nvml mock
// system's method, and nothing more. Every other NVML symbol is a stub in stubs.c
// (gen-stubs.sh) returning NVML_ERROR_NOT_SUPPORTED. A mock method go-nvml leaves
// unset (it panics when called) is NOT_SUPPORTED too, and so is every export that
// control.json refuses.
package main

/*
#include <stdlib.h>
#include "types.h"
*/
import "C"

import (
	"fmt"
	"os"
	"strings"
	"sync"
	"unsafe"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock/server"

	"tessera.dev/nvml-models/model"
)

func main() {}

const (
	success          = C.nvmlReturn_t(nvml.SUCCESS)
	uninitialized    = C.nvmlReturn_t(nvml.ERROR_UNINITIALIZED)
	invalidArgument  = C.nvmlReturn_t(nvml.ERROR_INVALID_ARGUMENT)
	notSupported     = C.nvmlReturn_t(nvml.ERROR_NOT_SUPPORTED)
	notFound         = C.nvmlReturn_t(nvml.ERROR_NOT_FOUND)
	insufficientSize = C.nvmlReturn_t(nvml.ERROR_INSUFFICIENT_SIZE)
	inUse            = C.nvmlReturn_t(nvml.ERROR_IN_USE)
	noResources      = C.nvmlReturn_t(nvml.ERROR_INSUFFICIENT_RESOURCES)
	libraryNotFound  = C.nvmlReturn_t(nvml.ERROR_LIBRARY_NOT_FOUND)
)

var (
	mu       sync.Mutex
	loaded   *model.Model
	refcount int
)

func current() *model.Model {
	mu.Lock()
	defer mu.Unlock()
	if refcount == 0 {
		return nil
	}
	return loaded
}

// enter starts an export: the model (nil and a code other than success when the call
// must not go on).
func enter(symbol string) (*model.Model, C.nvmlReturn_t) {
	m := current()
	if m == nil {
		return nil, uninitialized
	}
	if m.Refused(symbol) {
		return nil, notSupported
	}
	m.Kill(symbol, false)
	return m, success
}

// mutate is m.Mutate for export `symbol`, then control.json's killAfter for it.
func mutate(m *model.Model, symbol string, change func() nvml.Return) nvml.Return {
	r := m.Mutate(change)
	if r == nvml.SUCCESS {
		m.Kill(symbol, true)
	}
	return r
}

// unset turns the panic of a go-nvml mock method left unset into NOT_SUPPORTED.
func unset(ret *C.nvmlReturn_t) {
	if r := recover(); r != nil {
		if s, ok := r.(string); ok && strings.Contains(s, "method is nil") {
			*ret = notSupported
			return
		}
		panic(r)
	}
}

func code(r nvml.Return) C.nvmlReturn_t { return C.nvmlReturn_t(r) }

// Handles are tokens: GPU i is 0x1000+i; GPU instances and compute instances encode
// their GPU and IDs.
const (
	devBase = 0x1000
	giBase  = 0x100000
	ciBase  = 0x10000000
	migBase = 0x40000000
)

func devHandle(m *model.Model, d nvml.Device) C.nvmlDevice_t {
	for i, x := range m.Devices {
		if x == d {
			return C.nvmlDevice_t(devBase + i)
		}
	}
	return 0
}

func deviceOf(m *model.Model, h C.nvmlDevice_t) (*server.Device, int, C.nvmlReturn_t) {
	i := int(h) - devBase
	if h < devBase || i >= len(m.Devices) {
		return nil, 0, invalidArgument
	}
	return m.Devices[i], i, success
}

func giHandle(dev int, id uint32) C.nvmlGpuInstance_t {
	return C.nvmlGpuInstance_t(giBase + dev<<12 + int(id))
}

func giOf(m *model.Model, h C.nvmlGpuInstance_t) (*server.GpuInstance, int, C.nvmlReturn_t) {
	v := int(h) - giBase
	if h < giBase || h >= ciBase {
		return nil, 0, invalidArgument
	}
	dev, id := v>>12, uint32(v&0xfff)
	if dev >= len(m.Devices) {
		return nil, 0, invalidArgument
	}
	for gi := range m.Devices[dev].GpuInstances {
		if gi.Info.Id == id {
			return gi, dev, success
		}
	}
	return nil, 0, invalidArgument
}

func ciHandle(dev int, gi, ci uint32) C.nvmlComputeInstance_t {
	return C.nvmlComputeInstance_t(ciBase + dev<<20 + int(gi)<<8 + int(ci))
}

func ciOf(m *model.Model, h C.nvmlComputeInstance_t) (*server.ComputeInstance, *server.GpuInstance, int, C.nvmlReturn_t) {
	if h < ciBase {
		return nil, nil, 0, invalidArgument
	}
	v := int(h) - ciBase
	gi, dev, r := giOf(m, giHandle(v>>20, uint32(v>>8&0xfff)))
	if r != success {
		return nil, nil, 0, invalidArgument
	}
	for ci := range gi.ComputeInstances {
		if ci.Info.Id == uint32(v&0xff) {
			return ci, gi, dev, success
		}
	}
	return nil, nil, 0, invalidArgument
}

// migHandle is the handle of a compute instance's MIG device (a gap fill: the models
// have none; see model.Model.MigUUIDs).
func migHandle(dev int, gi, ci uint32) C.nvmlDevice_t {
	return C.nvmlDevice_t(migBase + dev<<20 + int(gi)<<8 + int(ci))
}

func isMigHandle(h C.nvmlDevice_t) bool { return h >= migBase }

// migOf resolves a MIG device handle to its compute instance.
func migOf(m *model.Model, h C.nvmlDevice_t) (*server.ComputeInstance, *server.GpuInstance, int, C.nvmlReturn_t) {
	if !isMigHandle(h) {
		return nil, nil, 0, invalidArgument
	}
	v := int(h) - migBase
	return ciOf(m, ciHandle(v>>20, uint32(v>>8&0xfff), uint32(v&0xff)))
}

// migDevices lists GPU dev's MIG devices in NVML's order (GPU instance, then compute
// instance, by ID).
func migDevices(m *model.Model, dev int) []C.nvmlDevice_t {
	var out []C.nvmlDevice_t
	for _, gi := range model.SortedGIs(m.Devices[dev]) {
		for _, ci := range model.SortedCIs(gi) {
			out = append(out, migHandle(dev, gi.Info.Id, ci.Info.Id))
		}
	}
	return out
}

// onMig is onDevice for a MIG device handle.
func onMig(symbol string, h C.nvmlDevice_t, ask func(m *model.Model, ci *server.ComputeInstance, gi *server.GpuInstance, dev int) C.nvmlReturn_t) (ret C.nvmlReturn_t) {
	defer unset(&ret)
	m, r := enter(symbol)
	if m == nil {
		return r
	}
	m.Mu.Lock()
	defer m.Mu.Unlock()
	ci, gi, dev, r := migOf(m, h)
	if r != success {
		return r
	}
	return ask(m, ci, gi, dev)
}

//export nvmlDeviceIsMigDeviceHandle
func nvmlDeviceIsMigDeviceHandle(h C.nvmlDevice_t, out *C.uint) (ret C.nvmlReturn_t) {
	defer unset(&ret)
	m, r := enter("nvmlDeviceIsMigDeviceHandle")
	if m == nil {
		return r
	}
	if out == nil {
		return invalidArgument
	}
	m.Mu.Lock()
	defer m.Mu.Unlock()
	if _, _, _, r := migOf(m, h); r == success {
		*out = 1
		return success
	}
	if _, _, r := deviceOf(m, h); r != success {
		return r
	}
	*out = 0
	return success
}

//export nvmlDeviceGetDeviceHandleFromMigDeviceHandle
func nvmlDeviceGetDeviceHandleFromMigDeviceHandle(h C.nvmlDevice_t, out *C.nvmlDevice_t) C.nvmlReturn_t {
	return onMig("nvmlDeviceGetDeviceHandleFromMigDeviceHandle", h, func(_ *model.Model, _ *server.ComputeInstance, _ *server.GpuInstance, dev int) C.nvmlReturn_t {
		if out == nil {
			return invalidArgument
		}
		*out = C.nvmlDevice_t(devBase + dev)
		return success
	})
}

//export nvmlDeviceGetGpuInstanceId
func nvmlDeviceGetGpuInstanceId(h C.nvmlDevice_t, out *C.uint) C.nvmlReturn_t {
	if !isMigHandle(h) {
		// NVML: NOT_SUPPORTED for a handle that is not a MIG device's.
		return onDevice("nvmlDeviceGetGpuInstanceId", h, func(*model.Model, *server.Device, int) C.nvmlReturn_t { return notSupported })
	}
	return onMig("nvmlDeviceGetGpuInstanceId", h, func(_ *model.Model, _ *server.ComputeInstance, gi *server.GpuInstance, _ int) C.nvmlReturn_t {
		if out == nil {
			return invalidArgument
		}
		*out = C.uint(gi.Info.Id)
		return success
	})
}

//export nvmlDeviceGetComputeInstanceId
func nvmlDeviceGetComputeInstanceId(h C.nvmlDevice_t, out *C.uint) C.nvmlReturn_t {
	if !isMigHandle(h) {
		return onDevice("nvmlDeviceGetComputeInstanceId", h, func(*model.Model, *server.Device, int) C.nvmlReturn_t { return notSupported })
	}
	return onMig("nvmlDeviceGetComputeInstanceId", h, func(_ *model.Model, ci *server.ComputeInstance, _ *server.GpuInstance, _ int) C.nvmlReturn_t {
		if out == nil {
			return invalidArgument
		}
		*out = C.uint(ci.Info.Id)
		return success
	})
}

//export nvmlDeviceGetMaxMigDeviceCount
func nvmlDeviceGetMaxMigDeviceCount(h C.nvmlDevice_t, out *C.uint) C.nvmlReturn_t {
	return onDevice("nvmlDeviceGetMaxMigDeviceCount", h, func(_ *model.Model, d *server.Device, _ int) C.nvmlReturn_t {
		if out == nil {
			return invalidArgument
		}
		// The most instances any profile allows (the 1-slice profile's: one MIG device
		// per compute slice); 0 on a GPU without MIG.
		max := uint32(0)
		for _, p := range d.Config.MIGProfiles.GpuInstanceProfiles {
			if p.InstanceCount > max {
				max = p.InstanceCount
			}
		}
		*out = C.uint(max)
		return success
	})
}

//export nvmlDeviceGetMigDeviceHandleByIndex
func nvmlDeviceGetMigDeviceHandleByIndex(h C.nvmlDevice_t, index C.uint, out *C.nvmlDevice_t) C.nvmlReturn_t {
	return onDevice("nvmlDeviceGetMigDeviceHandleByIndex", h, func(m *model.Model, d *server.Device, i int) C.nvmlReturn_t {
		if out == nil {
			return invalidArgument
		}
		if d.MigMode != nvml.DEVICE_MIG_ENABLE {
			return notSupported
		}
		all := migDevices(m, i)
		if int(index) >= len(all) {
			return notFound
		}
		*out = all[index]
		return success
	})
}

// putString copies s into a C buffer of `length` bytes, NUL-terminated.
func putString(s string, buf *C.char, length C.uint) C.nvmlReturn_t {
	if buf == nil {
		return invalidArgument
	}
	if uint(len(s))+1 > uint(length) {
		return insufficientSize
	}
	b := unsafe.Slice((*byte)(unsafe.Pointer(buf)), int(length))
	copy(b, s)
	b[len(s)] = 0
	return success
}

func initModel() C.nvmlReturn_t {
	mu.Lock()
	defer mu.Unlock()
	if loaded == nil {
		m, err := model.FromEnv()
		if err != nil {
			fmt.Fprintf(os.Stderr, "nvml-model: %v\n", err)
			return libraryNotFound
		}
		loaded = m
	}
	refcount++
	return success
}

//export nvmlInit_v2
func nvmlInit_v2() C.nvmlReturn_t { return initModel() }

//export nvmlInit
func nvmlInit() C.nvmlReturn_t { return initModel() }

//export nvmlInitWithFlags
func nvmlInitWithFlags(flags C.uint) C.nvmlReturn_t { return initModel() }

//export nvmlShutdown
func nvmlShutdown() C.nvmlReturn_t {
	mu.Lock()
	defer mu.Unlock()
	if refcount == 0 {
		return uninitialized
	}
	refcount--
	return success
}

//export nvmlSystemGetDriverVersion
func nvmlSystemGetDriverVersion(buf *C.char, length C.uint) (ret C.nvmlReturn_t) {
	defer unset(&ret)
	m, r := enter("nvmlSystemGetDriverVersion")
	if m == nil {
		return r
	}
	v, rr := m.Server.SystemGetDriverVersion()
	if rr != nvml.SUCCESS {
		return code(rr)
	}
	return putString(v, buf, length)
}

//export nvmlSystemGetNVMLVersion
func nvmlSystemGetNVMLVersion(buf *C.char, length C.uint) (ret C.nvmlReturn_t) {
	defer unset(&ret)
	m, r := enter("nvmlSystemGetNVMLVersion")
	if m == nil {
		return r
	}
	v, rr := m.Server.SystemGetNVMLVersion()
	if rr != nvml.SUCCESS {
		return code(rr)
	}
	return putString(v, buf, length)
}

func cudaVersion(symbol string, out *C.int) (ret C.nvmlReturn_t) {
	defer unset(&ret)
	m, r := enter(symbol)
	if m == nil {
		return r
	}
	if out == nil {
		return invalidArgument
	}
	v, rr := m.Server.SystemGetCudaDriverVersion()
	*out = C.int(v)
	return code(rr)
}

//export nvmlSystemGetCudaDriverVersion
func nvmlSystemGetCudaDriverVersion(out *C.int) C.nvmlReturn_t {
	return cudaVersion("nvmlSystemGetCudaDriverVersion", out)
}

//export nvmlSystemGetCudaDriverVersion_v2
func nvmlSystemGetCudaDriverVersion_v2(out *C.int) C.nvmlReturn_t {
	return cudaVersion("nvmlSystemGetCudaDriverVersion_v2", out)
}

func deviceCount(symbol string, out *C.uint) (ret C.nvmlReturn_t) {
	defer unset(&ret)
	m, r := enter(symbol)
	if m == nil {
		return r
	}
	if out == nil {
		return invalidArgument
	}
	n, rr := m.Server.DeviceGetCount()
	*out = C.uint(n)
	return code(rr)
}

//export nvmlDeviceGetCount_v2
func nvmlDeviceGetCount_v2(out *C.uint) C.nvmlReturn_t {
	return deviceCount("nvmlDeviceGetCount_v2", out)
}

//export nvmlDeviceGetCount
func nvmlDeviceGetCount(out *C.uint) C.nvmlReturn_t { return deviceCount("nvmlDeviceGetCount", out) }

func handleByIndex(symbol string, index C.uint, out *C.nvmlDevice_t) (ret C.nvmlReturn_t) {
	defer unset(&ret)
	m, r := enter(symbol)
	if m == nil {
		return r
	}
	if out == nil {
		return invalidArgument
	}
	d, rr := m.Server.DeviceGetHandleByIndex(int(index))
	if rr != nvml.SUCCESS {
		return code(rr)
	}
	*out = devHandle(m, d)
	return success
}

//export nvmlDeviceGetHandleByIndex_v2
func nvmlDeviceGetHandleByIndex_v2(index C.uint, out *C.nvmlDevice_t) C.nvmlReturn_t {
	return handleByIndex("nvmlDeviceGetHandleByIndex_v2", index, out)
}

//export nvmlDeviceGetHandleByIndex
func nvmlDeviceGetHandleByIndex(index C.uint, out *C.nvmlDevice_t) C.nvmlReturn_t {
	return handleByIndex("nvmlDeviceGetHandleByIndex", index, out)
}

//export nvmlDeviceGetHandleByUUID
func nvmlDeviceGetHandleByUUID(uuid *C.char, out *C.nvmlDevice_t) (ret C.nvmlReturn_t) {
	defer unset(&ret)
	m, r := enter("nvmlDeviceGetHandleByUUID")
	if m == nil {
		return r
	}
	if uuid == nil || out == nil {
		return invalidArgument
	}
	d, rr := m.Server.DeviceGetHandleByUUID(C.GoString(uuid))
	if rr != nvml.SUCCESS {
		return code(rr)
	}
	*out = devHandle(m, d)
	return success
}

// onDevice is the shape of most device queries: enter, resolve the handle, ask.
func onDevice(symbol string, h C.nvmlDevice_t, ask func(m *model.Model, d *server.Device, i int) C.nvmlReturn_t) (ret C.nvmlReturn_t) {
	defer unset(&ret)
	m, r := enter(symbol)
	if m == nil {
		return r
	}
	d, i, r := deviceOf(m, h)
	if r != success {
		return r
	}
	m.Mu.Lock()
	defer m.Mu.Unlock()
	return ask(m, d, i)
}

//export nvmlDeviceGetUUID
func nvmlDeviceGetUUID(h C.nvmlDevice_t, buf *C.char, length C.uint) C.nvmlReturn_t {
	if isMigHandle(h) {
		return onMig("nvmlDeviceGetUUID", h, func(m *model.Model, ci *server.ComputeInstance, gi *server.GpuInstance, dev int) C.nvmlReturn_t {
			return putString(m.MigUUIDs[model.MigKey{GPU: dev, GI: gi.Info.Id, CI: ci.Info.Id}], buf, length)
		})
	}
	return onDevice("nvmlDeviceGetUUID", h, func(_ *model.Model, d *server.Device, _ int) C.nvmlReturn_t {
		v, rr := d.GetUUID()
		if rr != nvml.SUCCESS {
			return code(rr)
		}
		return putString(v, buf, length)
	})
}

//export nvmlDeviceGetName
func nvmlDeviceGetName(h C.nvmlDevice_t, buf *C.char, length C.uint) C.nvmlReturn_t {
	return onDevice("nvmlDeviceGetName", h, func(_ *model.Model, d *server.Device, _ int) C.nvmlReturn_t {
		v, rr := d.GetName()
		if rr != nvml.SUCCESS {
			return code(rr)
		}
		return putString(v, buf, length)
	})
}

//export nvmlDeviceGetBrand
func nvmlDeviceGetBrand(h C.nvmlDevice_t, out *C.int) C.nvmlReturn_t {
	return onDevice("nvmlDeviceGetBrand", h, func(_ *model.Model, d *server.Device, _ int) C.nvmlReturn_t {
		v, rr := d.GetBrand()
		if rr == nvml.SUCCESS && out != nil {
			*out = C.int(v)
		}
		return code(rr)
	})
}

//export nvmlDeviceGetArchitecture
func nvmlDeviceGetArchitecture(h C.nvmlDevice_t, out *C.uint) C.nvmlReturn_t {
	return onDevice("nvmlDeviceGetArchitecture", h, func(_ *model.Model, d *server.Device, _ int) C.nvmlReturn_t {
		v, rr := d.GetArchitecture()
		if rr == nvml.SUCCESS && out != nil {
			*out = C.uint(v)
		}
		return code(rr)
	})
}

//export nvmlDeviceGetMemoryInfo
func nvmlDeviceGetMemoryInfo(h C.nvmlDevice_t, out *C.nvmlMemory_t) C.nvmlReturn_t {
	return onDevice("nvmlDeviceGetMemoryInfo", h, func(_ *model.Model, d *server.Device, _ int) C.nvmlReturn_t {
		v, rr := d.GetMemoryInfo()
		if rr == nvml.SUCCESS && out != nil {
			out.total, out.free, out.used = C.ulonglong(v.Total), C.ulonglong(v.Free), C.ulonglong(v.Used)
		}
		return code(rr)
	})
}

//export nvmlDeviceGetMemoryInfo_v2
func nvmlDeviceGetMemoryInfo_v2(h C.nvmlDevice_t, out *C.nvmlMemory_v2_t) C.nvmlReturn_t {
	return onDevice("nvmlDeviceGetMemoryInfo_v2", h, func(_ *model.Model, d *server.Device, _ int) C.nvmlReturn_t {
		// The model has only the v1 call; v2 adds `reserved`, which it does not know (0).
		v, rr := d.GetMemoryInfo()
		if rr == nvml.SUCCESS && out != nil {
			out.total, out.reserved = C.ulonglong(v.Total), 0
			out.free, out.used = C.ulonglong(v.Free), C.ulonglong(v.Used)
		}
		return code(rr)
	})
}

//export nvmlDeviceGetMinorNumber
func nvmlDeviceGetMinorNumber(h C.nvmlDevice_t, out *C.uint) C.nvmlReturn_t {
	return onDevice("nvmlDeviceGetMinorNumber", h, func(_ *model.Model, d *server.Device, _ int) C.nvmlReturn_t {
		v, rr := d.GetMinorNumber()
		if rr == nvml.SUCCESS && out != nil {
			*out = C.uint(v)
		}
		return code(rr)
	})
}

//export nvmlDeviceGetIndex
func nvmlDeviceGetIndex(h C.nvmlDevice_t, out *C.uint) C.nvmlReturn_t {
	return onDevice("nvmlDeviceGetIndex", h, func(_ *model.Model, d *server.Device, _ int) C.nvmlReturn_t {
		v, rr := d.GetIndex()
		if rr == nvml.SUCCESS && out != nil {
			*out = C.uint(v)
		}
		return code(rr)
	})
}

func pciInfo(symbol string, h C.nvmlDevice_t, out *C.nvmlPciInfo_t) C.nvmlReturn_t {
	return onDevice(symbol, h, func(_ *model.Model, d *server.Device, _ int) C.nvmlReturn_t {
		v, rr := d.GetPciInfo()
		if rr != nvml.SUCCESS || out == nil {
			return code(rr)
		}
		busID := cString(v.BusId[:])
		if busID == "" {
			// go-nvml's GetPciInfo fills only the device ID; the model's bus ID is
			// its Device.PciBusID field, which the bridge reports as NVML would.
			busID = d.PciBusID
		}
		var dom, bus, dev, fn uint32
		fmt.Sscanf(busID, "%x:%x:%x.%x", &dom, &bus, &dev, &fn)
		*out = C.nvmlPciInfo_t{}
		out.domain, out.bus, out.device = C.uint(dom), C.uint(bus), C.uint(dev)
		out.pciDeviceId, out.pciSubSystemId = C.uint(v.PciDeviceId), C.uint(v.PciSubSystemId)
		copyC(out.busId[:], busID)
		copyC(out.busIdLegacy[:], busID)
		return success
	})
}

func cString(b []int8) string {
	var s []byte
	for _, c := range b {
		if c == 0 {
			break
		}
		s = append(s, byte(c))
	}
	return string(s)
}

func copyC(dst []C.char, s string) {
	for i := 0; i < len(s) && i < len(dst)-1; i++ {
		dst[i] = C.char(s[i])
	}
}

//export nvmlDeviceGetPciInfo_v3
func nvmlDeviceGetPciInfo_v3(h C.nvmlDevice_t, out *C.nvmlPciInfo_t) C.nvmlReturn_t {
	return pciInfo("nvmlDeviceGetPciInfo_v3", h, out)
}

//export nvmlDeviceGetPciInfo_v2
func nvmlDeviceGetPciInfo_v2(h C.nvmlDevice_t, out *C.nvmlPciInfo_t) C.nvmlReturn_t {
	return pciInfo("nvmlDeviceGetPciInfo_v2", h, out)
}

//export nvmlDeviceGetCudaComputeCapability
func nvmlDeviceGetCudaComputeCapability(h C.nvmlDevice_t, major, minor *C.int) C.nvmlReturn_t {
	return onDevice("nvmlDeviceGetCudaComputeCapability", h, func(_ *model.Model, d *server.Device, _ int) C.nvmlReturn_t {
		a, b, rr := d.GetCudaComputeCapability()
		if rr == nvml.SUCCESS && major != nil && minor != nil {
			*major, *minor = C.int(a), C.int(b)
		}
		return code(rr)
	})
}

//export nvmlDeviceGetNumGpuCores
func nvmlDeviceGetNumGpuCores(h C.nvmlDevice_t, out *C.uint) C.nvmlReturn_t {
	return onDevice("nvmlDeviceGetNumGpuCores", h, func(_ *model.Model, d *server.Device, _ int) C.nvmlReturn_t {
		v, rr := d.GetNumGpuCores()
		if rr == nvml.SUCCESS && out != nil {
			*out = C.uint(v)
		}
		return code(rr)
	})
}

//export nvmlDeviceGetNumaNodeId
func nvmlDeviceGetNumaNodeId(h C.nvmlDevice_t, out *C.uint) C.nvmlReturn_t {
	return onDevice("nvmlDeviceGetNumaNodeId", h, func(_ *model.Model, d *server.Device, _ int) C.nvmlReturn_t {
		v, rr := d.GetNumaNodeId()
		if rr == nvml.SUCCESS && out != nil {
			*out = C.uint(v)
		}
		return code(rr)
	})
}

//export nvmlDeviceGetMigMode
func nvmlDeviceGetMigMode(h C.nvmlDevice_t, current, pending *C.uint) C.nvmlReturn_t {
	return onDevice("nvmlDeviceGetMigMode", h, func(_ *model.Model, d *server.Device, _ int) C.nvmlReturn_t {
		c, p, rr := d.GetMigMode()
		if rr == nvml.SUCCESS && current != nil && pending != nil {
			*current, *pending = C.uint(c), C.uint(p)
		}
		return code(rr)
	})
}

//export nvmlDeviceSetMigMode
func nvmlDeviceSetMigMode(h C.nvmlDevice_t, mode C.uint, activation *C.int) C.nvmlReturn_t {
	return onDevice("nvmlDeviceSetMigMode", h, func(m *model.Model, d *server.Device, _ int) C.nvmlReturn_t {
		// Gap fill: NVML refuses to turn MIG off while GPU instances exist (IN_USE).
		if int(mode) == nvml.DEVICE_MIG_DISABLE && len(d.GpuInstances) > 0 {
			return inUse
		}
		return code(mutate(m, "nvmlDeviceSetMigMode", func() nvml.Return {
			act, rr := d.SetMigMode(int(mode))
			if activation != nil {
				*activation = C.int(act)
			}
			return rr
		}))
	})
}

// giProfile finds a GPU-instance profile by ID (NVML's calls take IDs; the mock's
// take the profile info).
func giProfile(d *server.Device, id C.uint) (nvml.GpuInstanceProfileInfo, bool) {
	for _, p := range d.Config.MIGProfiles.GpuInstanceProfiles {
		if p.Id == uint32(id) {
			return p, true
		}
	}
	return nvml.GpuInstanceProfileInfo{}, false
}

//export nvmlDeviceGetGpuInstanceProfileInfo
func nvmlDeviceGetGpuInstanceProfileInfo(h C.nvmlDevice_t, profile C.uint, out *C.nvmlGpuInstanceProfileInfo_t) C.nvmlReturn_t {
	return onDevice("nvmlDeviceGetGpuInstanceProfileInfo", h, func(_ *model.Model, d *server.Device, _ int) C.nvmlReturn_t {
		p, rr := d.GetGpuInstanceProfileInfo(int(profile))
		if rr == nvml.SUCCESS && out != nil {
			*out = C.nvmlGpuInstanceProfileInfo_t{
				id: C.uint(p.Id), isP2pSupported: C.uint(p.IsP2pSupported), sliceCount: C.uint(p.SliceCount),
				instanceCount: C.uint(p.InstanceCount), multiprocessorCount: C.uint(p.MultiprocessorCount),
				copyEngineCount: C.uint(p.CopyEngineCount), decoderCount: C.uint(p.DecoderCount),
				encoderCount: C.uint(p.EncoderCount), jpegCount: C.uint(p.JpegCount), ofaCount: C.uint(p.OfaCount),
				memorySizeMB: C.ulonglong(p.MemorySizeMB),
			}
		}
		return code(rr)
	})
}

//export nvmlDeviceGetGpuInstancePossiblePlacements_v2
func nvmlDeviceGetGpuInstancePossiblePlacements_v2(h C.nvmlDevice_t, profileID C.uint, out *C.nvmlGpuInstancePlacement_t, count *C.uint) C.nvmlReturn_t {
	return onDevice("nvmlDeviceGetGpuInstancePossiblePlacements_v2", h, func(_ *model.Model, d *server.Device, _ int) C.nvmlReturn_t {
		if count == nil {
			return invalidArgument
		}
		p, ok := giProfile(d, profileID)
		if !ok {
			return notSupported
		}
		v, rr := d.GetGpuInstancePossiblePlacements(&p)
		if rr != nvml.SUCCESS {
			return code(rr)
		}
		if out == nil {
			*count = C.uint(len(v))
			return success
		}
		if int(*count) < len(v) {
			*count = C.uint(len(v))
			return insufficientSize
		}
		dst := unsafe.Slice(out, len(v))
		for i, pl := range v {
			dst[i] = C.nvmlGpuInstancePlacement_t{start: C.uint(pl.Start), size: C.uint(pl.Size)}
		}
		*count = C.uint(len(v))
		return success
	})
}

//export nvmlDeviceCreateGpuInstanceWithPlacement
func nvmlDeviceCreateGpuInstanceWithPlacement(h C.nvmlDevice_t, profileID C.uint, placement *C.nvmlGpuInstancePlacement_t, out *C.nvmlGpuInstance_t) C.nvmlReturn_t {
	return onDevice("nvmlDeviceCreateGpuInstanceWithPlacement", h, func(m *model.Model, d *server.Device, i int) C.nvmlReturn_t {
		if placement == nil || out == nil {
			return invalidArgument
		}
		p, ok := giProfile(d, profileID)
		if !ok {
			return invalidArgument
		}
		pl := nvml.GpuInstancePlacement{Start: uint32(placement.start), Size: uint32(placement.size)}
		if r := admitGpuInstance(d, &p, &pl); r != success {
			return r
		}
		return code(mutate(m, "nvmlDeviceCreateGpuInstanceWithPlacement", func() nvml.Return {
			gi, rr := d.CreateGpuInstanceWithPlacement(&p, &pl)
			if rr == nvml.SUCCESS {
				*out = giHandle(i, gi.(*server.GpuInstance).Info.Id)
			}
			return rr
		}))
	})
}

// admitGpuInstance is NVML's judgement of a new GPU instance, which go-nvml's models
// lack (they create whatever is asked): a gap fill, with the model's own tables. MIG
// mode off: NOT_SUPPORTED; a placement that is not one of the profile's possible
// placements: INVALID_ARGUMENT; the profile's instanceCount reached, or memory slices
// [start, start+size) overlapping a live GPU instance's: INSUFFICIENT_RESOURCES.
func admitGpuInstance(d *server.Device, p *nvml.GpuInstanceProfileInfo, pl *nvml.GpuInstancePlacement) C.nvmlReturn_t {
	if d.MigMode != nvml.DEVICE_MIG_ENABLE {
		return notSupported
	}
	possible := false
	for _, q := range d.Config.MIGProfiles.GpuInstancePlacements[int(p.Id)] {
		if q == *pl {
			possible = true
		}
	}
	if !possible {
		return invalidArgument
	}
	same := uint32(0)
	for gi := range d.GpuInstances {
		if gi.Info.ProfileId == p.Id {
			same++
		}
		o := gi.Info.Placement
		if pl.Start < o.Start+o.Size && o.Start < pl.Start+pl.Size {
			return noResources
		}
	}
	if same >= p.InstanceCount {
		return noResources
	}
	return success
}

//export nvmlDeviceCreateGpuInstance
func nvmlDeviceCreateGpuInstance(h C.nvmlDevice_t, profileID C.uint, out *C.nvmlGpuInstance_t) C.nvmlReturn_t {
	return onDevice("nvmlDeviceCreateGpuInstance", h, func(m *model.Model, d *server.Device, i int) C.nvmlReturn_t {
		if out == nil {
			return invalidArgument
		}
		p, ok := giProfile(d, profileID)
		if !ok {
			return invalidArgument
		}
		// Gap fill: NVML places it at the profile's first free placement, or refuses.
		var free *nvml.GpuInstancePlacement
		for _, pl := range d.Config.MIGProfiles.GpuInstancePlacements[int(p.Id)] {
			if admitGpuInstance(d, &p, &pl) == success {
				free = &pl
				break
			}
		}
		if free == nil {
			if d.MigMode != nvml.DEVICE_MIG_ENABLE {
				return notSupported
			}
			return noResources
		}
		return code(mutate(m, "nvmlDeviceCreateGpuInstance", func() nvml.Return {
			gi, rr := d.CreateGpuInstanceWithPlacement(&p, free)
			if rr == nvml.SUCCESS {
				*out = giHandle(i, gi.(*server.GpuInstance).Info.Id)
			}
			return rr
		}))
	})
}

//export nvmlDeviceGetGpuInstances
func nvmlDeviceGetGpuInstances(h C.nvmlDevice_t, profileID C.uint, out *C.nvmlGpuInstance_t, count *C.uint) C.nvmlReturn_t {
	return onDevice("nvmlDeviceGetGpuInstances", h, func(_ *model.Model, d *server.Device, i int) C.nvmlReturn_t {
		if count == nil {
			return invalidArgument
		}
		p, ok := giProfile(d, profileID)
		if !ok {
			return invalidArgument
		}
		v, rr := d.GetGpuInstances(&p)
		if rr != nvml.SUCCESS {
			return code(rr)
		}
		// As NVML: *count is output only; the buffer holds the profile's instanceCount.
		if out == nil {
			return invalidArgument
		}
		if len(v) > int(p.InstanceCount) {
			return insufficientSize
		}
		ids := make([]uint32, 0, len(v))
		for _, gi := range v {
			ids = append(ids, gi.(*server.GpuInstance).Info.Id)
		}
		sortU32(ids)
		if len(ids) > 0 {
			dst := unsafe.Slice(out, len(ids))
			for k, id := range ids {
				dst[k] = giHandle(i, id)
			}
		}
		*count = C.uint(len(ids))
		return success
	})
}

func sortU32(v []uint32) {
	for a := 1; a < len(v); a++ {
		for b := a; b > 0 && v[b] < v[b-1]; b-- {
			v[b], v[b-1] = v[b-1], v[b]
		}
	}
}

//export nvmlDeviceGetGpuInstanceById
func nvmlDeviceGetGpuInstanceById(h C.nvmlDevice_t, id C.uint, out *C.nvmlGpuInstance_t) C.nvmlReturn_t {
	return onDevice("nvmlDeviceGetGpuInstanceById", h, func(_ *model.Model, d *server.Device, i int) C.nvmlReturn_t {
		// go-nvml leaves GetGpuInstanceById unset; the model's instances answer it.
		if out == nil {
			return invalidArgument
		}
		for gi := range d.GpuInstances {
			if gi.Info.Id == uint32(id) {
				*out = giHandle(i, gi.Info.Id)
				return success
			}
		}
		return notFound
	})
}

// onGI is onDevice for GPU-instance calls.
func onGI(symbol string, h C.nvmlGpuInstance_t, ask func(m *model.Model, gi *server.GpuInstance, dev int) C.nvmlReturn_t) (ret C.nvmlReturn_t) {
	defer unset(&ret)
	m, r := enter(symbol)
	if m == nil {
		return r
	}
	m.Mu.Lock()
	defer m.Mu.Unlock()
	gi, dev, r := giOf(m, h)
	if r != success {
		return r
	}
	return ask(m, gi, dev)
}

//export nvmlGpuInstanceGetInfo
func nvmlGpuInstanceGetInfo(h C.nvmlGpuInstance_t, out *C.nvmlGpuInstanceInfo_t) C.nvmlReturn_t {
	return onGI("nvmlGpuInstanceGetInfo", h, func(m *model.Model, gi *server.GpuInstance, _ int) C.nvmlReturn_t {
		v, rr := gi.GetInfo()
		if rr == nvml.SUCCESS && out != nil {
			*out = C.nvmlGpuInstanceInfo_t{
				device: devHandle(m, v.Device), id: C.uint(v.Id), profileId: C.uint(v.ProfileId),
				placement: C.nvmlGpuInstancePlacement_t{start: C.uint(v.Placement.Start), size: C.uint(v.Placement.Size)},
			}
		}
		return code(rr)
	})
}

//export nvmlGpuInstanceDestroy
func nvmlGpuInstanceDestroy(h C.nvmlGpuInstance_t) C.nvmlReturn_t {
	return onGI("nvmlGpuInstanceDestroy", h, func(m *model.Model, gi *server.GpuInstance, _ int) C.nvmlReturn_t {
		// Gap fill: NVML refuses while compute instances are active on it (IN_USE).
		if len(gi.ComputeInstances) > 0 {
			return inUse
		}
		return code(mutate(m, "nvmlGpuInstanceDestroy", gi.Destroy))
	})
}

//export nvmlGpuInstanceGetComputeInstanceProfileInfo
func nvmlGpuInstanceGetComputeInstanceProfileInfo(h C.nvmlGpuInstance_t, profile, engProfile C.uint, out *C.nvmlComputeInstanceProfileInfo_t) C.nvmlReturn_t {
	return onGI("nvmlGpuInstanceGetComputeInstanceProfileInfo", h, func(_ *model.Model, gi *server.GpuInstance, _ int) C.nvmlReturn_t {
		p, rr := gi.GetComputeInstanceProfileInfo(int(profile), int(engProfile))
		if rr == nvml.SUCCESS && out != nil {
			*out = ciProfileC(p)
		}
		return code(rr)
	})
}

func ciProfileC(p nvml.ComputeInstanceProfileInfo) C.nvmlComputeInstanceProfileInfo_t {
	return C.nvmlComputeInstanceProfileInfo_t{
		id: C.uint(p.Id), sliceCount: C.uint(p.SliceCount), instanceCount: C.uint(p.InstanceCount),
		multiprocessorCount: C.uint(p.MultiprocessorCount), sharedCopyEngineCount: C.uint(p.SharedCopyEngineCount),
		sharedDecoderCount: C.uint(p.SharedDecoderCount), sharedEncoderCount: C.uint(p.SharedEncoderCount),
		sharedJpegCount: C.uint(p.SharedJpegCount), sharedOfaCount: C.uint(p.SharedOfaCount),
	}
}

// ciProfile finds a compute-instance profile of gi by ID.
func ciProfile(gi *server.GpuInstance, id C.uint) (nvml.ComputeInstanceProfileInfo, bool) {
	for _, p := range gi.MIGProfiles.ComputeInstanceProfiles[int(gi.Info.ProfileId)] {
		if p.Id == uint32(id) {
			return p, true
		}
	}
	return nvml.ComputeInstanceProfileInfo{}, false
}

//export nvmlGpuInstanceCreateComputeInstance
func nvmlGpuInstanceCreateComputeInstance(h C.nvmlGpuInstance_t, profileID C.uint, out *C.nvmlComputeInstance_t) C.nvmlReturn_t {
	return onGI("nvmlGpuInstanceCreateComputeInstance", h, func(m *model.Model, gi *server.GpuInstance, dev int) C.nvmlReturn_t {
		if out == nil {
			return invalidArgument
		}
		p, ok := ciProfile(gi, profileID)
		if !ok {
			return invalidArgument
		}
		return code(mutate(m, "nvmlGpuInstanceCreateComputeInstance", func() nvml.Return {
			ci, rr := gi.CreateComputeInstance(&p)
			if rr == nvml.SUCCESS {
				id := ci.(*server.ComputeInstance).Info.Id
				*out = ciHandle(dev, gi.Info.Id, id)
				// Gap fill: the MIG device NVML makes for the compute instance.
				m.MigUUIDs[model.MigKey{GPU: dev, GI: gi.Info.Id, CI: id}] = model.NewMigUUID()
			}
			return rr
		}))
	})
}

//export nvmlGpuInstanceGetComputeInstances
func nvmlGpuInstanceGetComputeInstances(h C.nvmlGpuInstance_t, profileID C.uint, out *C.nvmlComputeInstance_t, count *C.uint) C.nvmlReturn_t {
	return onGI("nvmlGpuInstanceGetComputeInstances", h, func(_ *model.Model, gi *server.GpuInstance, dev int) C.nvmlReturn_t {
		if count == nil {
			return invalidArgument
		}
		p, ok := ciProfile(gi, profileID)
		if !ok {
			return invalidArgument
		}
		v, rr := gi.GetComputeInstances(&p)
		if rr != nvml.SUCCESS {
			return code(rr)
		}
		// As NVML: *count is output only; the buffer holds the profile's instanceCount.
		if out == nil {
			return invalidArgument
		}
		if len(v) > int(p.InstanceCount) {
			return insufficientSize
		}
		ids := make([]uint32, 0, len(v))
		for _, ci := range v {
			ids = append(ids, ci.(*server.ComputeInstance).Info.Id)
		}
		sortU32(ids)
		if len(ids) > 0 {
			dst := unsafe.Slice(out, len(ids))
			for k, id := range ids {
				dst[k] = ciHandle(dev, gi.Info.Id, id)
			}
		}
		*count = C.uint(len(ids))
		return success
	})
}

// onCI is onDevice for compute-instance calls.
func onCI(symbol string, h C.nvmlComputeInstance_t, ask func(m *model.Model, ci *server.ComputeInstance, gi *server.GpuInstance, dev int) C.nvmlReturn_t) (ret C.nvmlReturn_t) {
	defer unset(&ret)
	m, r := enter(symbol)
	if m == nil {
		return r
	}
	m.Mu.Lock()
	defer m.Mu.Unlock()
	ci, gi, dev, r := ciOf(m, h)
	if r != success {
		return r
	}
	return ask(m, ci, gi, dev)
}

//export nvmlComputeInstanceGetInfo_v2
func nvmlComputeInstanceGetInfo_v2(h C.nvmlComputeInstance_t, out *C.nvmlComputeInstanceInfo_t) C.nvmlReturn_t {
	return onCI("nvmlComputeInstanceGetInfo_v2", h, func(m *model.Model, ci *server.ComputeInstance, gi *server.GpuInstance, dev int) C.nvmlReturn_t {
		v, rr := ci.GetInfo()
		if rr == nvml.SUCCESS && out != nil {
			// Gap fill: the compute instance's MIG device (the model names the GPU).
			*out = C.nvmlComputeInstanceInfo_t{
				device: migHandle(dev, gi.Info.Id, v.Id), gpuInstance: giHandle(dev, gi.Info.Id),
				id: C.uint(v.Id), profileId: C.uint(v.ProfileId),
				placement: C.nvmlComputeInstancePlacement_t{start: C.uint(v.Placement.Start), size: C.uint(v.Placement.Size)},
			}
		}
		return code(rr)
	})
}

//export nvmlComputeInstanceDestroy
func nvmlComputeInstanceDestroy(h C.nvmlComputeInstance_t) C.nvmlReturn_t {
	return onCI("nvmlComputeInstanceDestroy", h, func(m *model.Model, ci *server.ComputeInstance, gi *server.GpuInstance, dev int) C.nvmlReturn_t {
		return code(mutate(m, "nvmlComputeInstanceDestroy", func() nvml.Return {
			rr := ci.Destroy()
			if rr == nvml.SUCCESS {
				delete(m.MigUUIDs, model.MigKey{GPU: dev, GI: gi.Info.Id, CI: ci.Info.Id})
			}
			return rr
		}))
	})
}
