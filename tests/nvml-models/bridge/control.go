// The exports that answer from control.json rather than the model (model/control.go):
// XID events, running processes and utilization, which go-nvml's models lack.
package main

/*
#include <stdlib.h>
#include "types.h"
*/
import "C"

import (
	"strconv"
	"sync"
	"time"
	"unsafe"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock/server"

	"tessera.dev/nvml-models/model"
)

const (
	timeout  = C.nvmlReturn_t(nvml.ERROR_TIMEOUT)
	setBase  = 0x70000000
	noID     = 0xFFFFFFFF // NVML's "no GPU/compute instance" in event data
	notAvail = ^C.ulonglong(0)
)

// eventSet is one nvmlEventSet_t: the GPUs registered for XID events and the XIDs
// (by seq) already delivered.
type eventSet struct {
	gpus map[int]bool
	seen map[int]bool
}

var (
	setsMu  sync.Mutex
	sets    = map[C.nvmlEventSet_t]*eventSet{}
	setNext = 0
)

//export nvmlEventSetCreate
func nvmlEventSetCreate(out *C.nvmlEventSet_t) C.nvmlReturn_t {
	if m, r := enter("nvmlEventSetCreate"); m == nil {
		return r
	}
	if out == nil {
		return invalidArgument
	}
	setsMu.Lock()
	defer setsMu.Unlock()
	setNext++
	h := C.nvmlEventSet_t(setBase + setNext)
	sets[h] = &eventSet{gpus: map[int]bool{}, seen: map[int]bool{}}
	*out = h
	return success
}

//export nvmlEventSetFree
func nvmlEventSetFree(set C.nvmlEventSet_t) C.nvmlReturn_t {
	if m, r := enter("nvmlEventSetFree"); m == nil {
		return r
	}
	setsMu.Lock()
	defer setsMu.Unlock()
	if sets[set] == nil {
		return invalidArgument
	}
	delete(sets, set)
	return success
}

//export nvmlDeviceRegisterEvents
func nvmlDeviceRegisterEvents(h C.nvmlDevice_t, types C.ulonglong, set C.nvmlEventSet_t) C.nvmlReturn_t {
	return onDevice("nvmlDeviceRegisterEvents", h, func(_ *model.Model, _ *server.Device, i int) C.nvmlReturn_t {
		if uint64(types)&^uint64(nvml.EventTypeXidCriticalError) != 0 {
			return notSupported // the bridge has XID events only
		}
		setsMu.Lock()
		defer setsMu.Unlock()
		s := sets[set]
		if s == nil {
			return invalidArgument
		}
		s.gpus[i] = true
		return success
	})
}

//export nvmlDeviceGetSupportedEventTypes
func nvmlDeviceGetSupportedEventTypes(h C.nvmlDevice_t, out *C.ulonglong) C.nvmlReturn_t {
	return onDevice("nvmlDeviceGetSupportedEventTypes", h, func(_ *model.Model, _ *server.Device, _ int) C.nvmlReturn_t {
		if out == nil {
			return invalidArgument
		}
		*out = C.ulonglong(nvml.EventTypeXidCriticalError)
		return success
	})
}

//export nvmlEventSetWait_v2
func nvmlEventSetWait_v2(set C.nvmlEventSet_t, data *C.nvmlEventData_t, timeoutMs C.uint) C.nvmlReturn_t {
	m, r := enter("nvmlEventSetWait_v2")
	if m == nil {
		return r
	}
	if data == nil {
		return invalidArgument
	}
	deadline := time.Now().Add(time.Duration(timeoutMs) * time.Millisecond)
	for {
		if r, found := nextXid(m, set, data); r != success || found {
			return r
		}
		if !time.Now().Before(deadline) {
			return timeout
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// nextXid fills `data` with the set's first undelivered XID, if any.
func nextXid(m *model.Model, set C.nvmlEventSet_t, data *C.nvmlEventData_t) (C.nvmlReturn_t, bool) {
	xids := m.Control().Xid
	setsMu.Lock()
	defer setsMu.Unlock()
	s := sets[set]
	if s == nil {
		return invalidArgument, false
	}
	for _, x := range xids {
		if s.seen[x.Seq] || !s.gpus[x.GPU] {
			continue
		}
		s.seen[x.Seq] = true
		gi := C.uint(noID)
		if x.GpuInstanceID != nil {
			gi = C.uint(*x.GpuInstanceID)
		}
		*data = C.nvmlEventData_t{
			device:            C.nvmlDevice_t(devBase + x.GPU),
			eventType:         C.ulonglong(nvml.EventTypeXidCriticalError),
			eventData:         C.ulonglong(x.Xid),
			gpuInstanceId:     gi,
			computeInstanceId: C.uint(noID),
		}
		return success, true
	}
	return success, false
}

//export nvmlDeviceGetComputeRunningProcesses_v3
func nvmlDeviceGetComputeRunningProcesses_v3(h C.nvmlDevice_t, count *C.uint, infos *C.nvmlProcessInfo_t) C.nvmlReturn_t {
	return onDevice("nvmlDeviceGetComputeRunningProcesses_v3", h, func(m *model.Model, _ *server.Device, i int) C.nvmlReturn_t {
		c := m.Control()
		if c.Processes == nil {
			return notSupported
		}
		if count == nil {
			return invalidArgument
		}
		list := c.Processes[strconv.Itoa(i)]
		if infos == nil || int(*count) < len(list) {
			*count = C.uint(len(list))
			if len(list) == 0 {
				return success
			}
			return insufficientSize
		}
		dst := unsafe.Slice(infos, len(list))
		for k, p := range list {
			used := notAvail
			if p.UsedBytes != nil {
				used = C.ulonglong(*p.UsedBytes)
			}
			gi, ci := C.uint(noID), C.uint(noID)
			if p.GpuInstanceID != nil {
				gi = C.uint(*p.GpuInstanceID)
			}
			if p.ComputeInstanceID != nil {
				ci = C.uint(*p.ComputeInstanceID)
			}
			dst[k] = C.nvmlProcessInfo_t{pid: C.uint(p.Pid), usedGpuMemory: used, gpuInstanceId: gi, computeInstanceId: ci}
		}
		*count = C.uint(len(list))
		return success
	})
}

//export nvmlDeviceGetUtilizationRates
func nvmlDeviceGetUtilizationRates(h C.nvmlDevice_t, out *C.nvmlUtilization_t) C.nvmlReturn_t {
	return onDevice("nvmlDeviceGetUtilizationRates", h, func(m *model.Model, _ *server.Device, i int) C.nvmlReturn_t {
		u, ok := m.Control().Utilization[strconv.Itoa(i)]
		if !ok {
			return notSupported
		}
		if out == nil {
			return invalidArgument
		}
		*out = C.nvmlUtilization_t{gpu: C.uint(u.GPU), memory: C.uint(u.Memory)}
		return success
	})
}

//export nvmlDeviceGetProcessUtilization
func nvmlDeviceGetProcessUtilization(h C.nvmlDevice_t, out *C.nvmlProcessUtilizationSample_t, count *C.uint, lastSeen C.ulonglong) C.nvmlReturn_t {
	return onDevice("nvmlDeviceGetProcessUtilization", h, func(m *model.Model, _ *server.Device, i int) C.nvmlReturn_t {
		u, ok := m.Control().Utilization[strconv.Itoa(i)]
		if !ok {
			return notSupported
		}
		if count == nil {
			return invalidArgument
		}
		var newer []model.Sample
		for _, s := range u.Samples {
			if s.TimestampUs > uint64(lastSeen) {
				newer = append(newer, s)
			}
		}
		if len(newer) == 0 {
			return notFound // NVML: no sample newer than lastSeen
		}
		if out == nil || int(*count) < len(newer) {
			*count = C.uint(len(newer))
			return insufficientSize
		}
		dst := unsafe.Slice(out, len(newer))
		for k, s := range newer {
			dst[k] = C.nvmlProcessUtilizationSample_t{
				pid: C.uint(s.Pid), timeStamp: C.ulonglong(s.TimestampUs),
				smUtil: C.uint(s.SM), memUtil: C.uint(s.Mem), encUtil: C.uint(s.Enc), decUtil: C.uint(s.Dec),
			}
		}
		*count = C.uint(len(newer))
		return success
	})
}
