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
//
//	{"refuse": ["nvmlDeviceGetNumGpuCores"]}
//
// Refused exports return NVML_ERROR_NOT_SUPPORTED. `killBefore` and `killAfter` list
// exports at which the calling process dies by SIGKILL, on entry or once the call has
// succeeded (its change saved): a `kill -9` between two NVML calls, for crash tests.
// XID events, processes and
// utilization are not modelled: their fields are accepted, and their NVML calls
// always return NVML_ERROR_NOT_SUPPORTED (fail closed), whatever the fields say.
type Control struct {
	Refuse      []string        `json:"refuse"`
	KillBefore  []string        `json:"killBefore,omitempty"`
	KillAfter   []string        `json:"killAfter,omitempty"`
	Xid         json.RawMessage `json:"xid,omitempty"`
	Processes   json.RawMessage `json:"processes,omitempty"`
	Utilization json.RawMessage `json:"utilization,omitempty"`
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
