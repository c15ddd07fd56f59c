package model

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"syscall"
)

// Control is control.json in the state dir, written by tests and read at every call.
// Tests replace it whole (temp file + rename), so a call reads one state or the next.
//
//	{"refuse": ["nvmlDeviceGetNumGpuCores"]}
//
// Refused exports return NVML_ERROR_NOT_SUPPORTED. `killBefore` and `killAfter` list
// exports at which the calling process dies by SIGKILL, on entry or once the call has
// succeeded (its change saved): a `kill -9` between two NVML calls, for crash tests.
// `xid`, `processes` and `utilization` are what the models lack (see their types).
type Control struct {
	Refuse      []string               `json:"refuse"`
	KillBefore  []string               `json:"killBefore,omitempty"`
	KillAfter   []string               `json:"killAfter,omitempty"`
	Xid         []Xid                  `json:"xid,omitempty"`
	Processes   map[string][]Process   `json:"processes,omitempty"`
	Utilization map[string]Utilization `json:"utilization,omitempty"`
}

// Xid is one XID critical error on GPU `gpu` (NVML index). An event set registered for
// that GPU's XID events delivers it once (by `seq`, which tells two equal XIDs apart),
// whenever it was written: tests write it after the set exists.
type Xid struct {
	Seq           int     `json:"seq"`
	GPU           int     `json:"gpu"`
	Xid           uint64  `json:"xid"`
	GpuInstanceID *uint32 `json:"gpuInstanceId,omitempty"`
}

// Process is one process with a compute context on a GPU:
// nvmlDeviceGetComputeRunningProcesses_v3 lists `processes[<GPU index>]`. Without a
// `processes` key the call is NOT_SUPPORTED; a GPU not listed has none. `usedBytes`
// null is NVML_VALUE_NOT_AVAILABLE.
type Process struct {
	Pid               uint32  `json:"pid"`
	UsedBytes         *uint64 `json:"usedBytes"`
	GpuInstanceID     *uint32 `json:"gpuInstanceId,omitempty"`
	ComputeInstanceID *uint32 `json:"computeInstanceId,omitempty"`
}

// Utilization is one GPU's nvmlDeviceGetUtilizationRates answer and its
// nvmlDeviceGetProcessUtilization samples, at `utilization[<GPU index>]`. A GPU not
// listed answers NOT_SUPPORTED to both.
type Utilization struct {
	GPU     uint32   `json:"gpu"`
	Memory  uint32   `json:"memory"`
	Samples []Sample `json:"samples"`
}

// Sample is one process's utilization sample.
type Sample struct {
	Pid         uint32 `json:"pid"`
	TimestampUs uint64 `json:"timestampUs"`
	SM          uint32 `json:"sm"`
	Mem         uint32 `json:"mem"`
	Enc         uint32 `json:"enc"`
	Dec         uint32 `json:"dec"`
}

// Control reads control.json for an export that has passed Refused; an unreadable one
// (which Refused has already failed closed on) reads as empty.
func (m *Model) Control() Control {
	c, err := ReadControl(m.StateDir)
	if err != nil {
		return Control{}
	}
	return c
}

// ReadControl reads control.json; none (or no state dir) is an empty Control.
func ReadControl(stateDir string) (Control, error) {
	var c Control
	if stateDir == "" {
		return c, nil
	}
	path := filepath.Join(stateDir, "control.json")
	b, err := os.ReadFile(path)
	if errors.Is(err, os.ErrNotExist) {
		return c, nil
	}
	if err != nil {
		return c, err
	}
	if err := json.Unmarshal(b, &c); err != nil {
		return c, fmt.Errorf("%s: %w", path, err)
	}
	return c, nil
}

// Refused says whether control.json refuses export `symbol`. An unreadable
// control.json refuses everything (fail closed), with a message on stderr.
func (m *Model) Refused(symbol string) bool {
	c, err := ReadControl(m.StateDir)
	if err != nil {
		fmt.Fprintf(os.Stderr, "nvml-model: %v\n", err)
		return true
	}
	for _, s := range c.Refuse {
		if s == symbol {
			return true
		}
	}
	return false
}

// Kill sends SIGKILL to this process when control.json lists `symbol` under
// killBefore (`after` false) or killAfter (`after` true). An unreadable control.json
// kills nobody (Refused already fails the call).
func (m *Model) Kill(symbol string, after bool) {
	c, err := ReadControl(m.StateDir)
	if err != nil {
		return
	}
	list := c.KillBefore
	if after {
		list = c.KillAfter
	}
	for _, s := range list {
		if s == symbol {
			fmt.Fprintf(os.Stderr, "nvml-model: killing the process at %s (after: %v)\n", symbol, after)
			syscall.Kill(os.Getpid(), syscall.SIGKILL)
			select {}
		}
	}
}
