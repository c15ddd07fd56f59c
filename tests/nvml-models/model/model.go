// Package model loads one of go-nvml's mock DGX systems by name and keeps its mutable
// state (UUIDs, MIG mode, GPU and compute instances) in a JSON file, so that what one
// process creates is still there for the next one, even after a kill.
//
// Environment:
//
//	TESSERA_NVML_MODEL        dgxa100 | dgxh100 | dgxh200 | dgxb200 (required)
//	TESSERA_NVML_MODEL_STATE  a directory: state.json, state.lock, control.json
//	TESSERA_NVML_MODEL_MIG    "on": MIG mode on for every GPU when the state is new
//
// The models' tables are used as go-nvml ships them; nothing here corrects them.
package model

import (
	"crypto/rand"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"sync"
	"syscall"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock/dgxa100"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock/dgxb200"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock/dgxh100"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock/dgxh200"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock/server"
)

const (
	EnvModel = "TESSERA_NVML_MODEL"
	EnvState = "TESSERA_NVML_MODEL_STATE"
	EnvMig   = "TESSERA_NVML_MODEL_MIG"
)

// Names lists the systems a model can be.
var Names = []string{"dgxa100", "dgxh100", "dgxh200", "dgxb200"}

// Model is a loaded system and where its state lives ("" for none).
type Model struct {
	Name     string
	Server   *server.Server
	Devices  []*server.Device
	StateDir string
	// Mu serialises the bridge's calls that read or change instances.
	Mu sync.Mutex
	// MigUUIDs holds the UUID ("MIG-...") of each compute instance's MIG device. A gap
	// fill: go-nvml's models have no MIG devices; NVML gives each compute instance one,
	// with a UUID of its own that stays until the instance is destroyed.
	MigUUIDs map[MigKey]string
}

// MigKey names a compute instance: GPU index, GPU-instance ID, compute-instance ID.
type MigKey struct {
	GPU int
	GI  uint32
	CI  uint32
}

// NewMigUUID returns a fresh MIG device UUID, as NVML prints them (MIG-<uuid v4>).
func NewMigUUID() string {
	var b [16]byte
	if _, err := rand.Read(b[:]); err != nil {
		panic(err)
	}
	b[6] = b[6]&0x0f | 0x40
	b[8] = b[8]&0x3f | 0x80
	return fmt.Sprintf("MIG-%x-%x-%x-%x-%x", b[0:4], b[4:6], b[6:8], b[8:10], b[10:16])
}

// State is state.json.
type State struct {
	Model string     `json:"model"`
	GPUs  []GPUState `json:"gpus"`
}

type GPUState struct {
	UUID      string    `json:"uuid"`
	MigMode   int       `json:"migMode"`
	GICounter uint32    `json:"giCounter"`
	GIs       []GIState `json:"gpuInstances"`
}

type GIState struct {
	ID        uint32    `json:"id"`
	ProfileID uint32    `json:"profileId"`
	Start     uint32    `json:"start"`
	Size      uint32    `json:"size"`
	CICounter uint32    `json:"ciCounter"`
	CIs       []CIState `json:"computeInstances"`
}

type CIState struct {
	// UUID of the compute instance's MIG device (see Model.MigUUIDs).
	UUID      string `json:"uuid"`
	ID        uint32 `json:"id"`
	ProfileID uint32 `json:"profileId"`
	Start     uint32 `json:"start"`
	Size      uint32 `json:"size"`
}

func newServer(name string) (*server.Server, error) {
	switch name {
	case "dgxa100":
		return dgxa100.New(), nil
	case "dgxh100":
		return dgxh100.New(), nil
	case "dgxh200":
		return dgxh200.New(), nil
	case "dgxb200":
		return dgxb200.New(), nil
	}
	return nil, fmt.Errorf("%s=%q: expected one of %v", EnvModel, name, Names)
}

// FromEnv loads the model the environment names, with its saved state.
func FromEnv() (*Model, error) {
	return Load(os.Getenv(EnvModel), os.Getenv(EnvState), os.Getenv(EnvMig) == "on")
}

// Load builds system `name`; with a state dir, applies state.json (creating it from
// the fresh system, MIG mode `mig`, when absent).
func Load(name, stateDir string, mig bool) (*Model, error) {
	s, err := newServer(name)
	if err != nil {
		return nil, err
	}
	m := &Model{Name: name, Server: s, StateDir: stateDir, MigUUIDs: map[MigKey]string{}}
	for _, d := range s.Devices {
		m.Devices = append(m.Devices, d.(*server.Device))
	}
	if stateDir == "" {
		if mig {
			for _, d := range m.Devices {
				d.MigMode = nvml.DEVICE_MIG_ENABLE
			}
		}
		return m, nil
	}
	unlock, err := m.lock()
	if err != nil {
		return nil, err
	}
	defer unlock()
	st, err := m.read()
	if err != nil {
		return nil, err
	}
	if st == nil {
		if mig {
			for _, d := range m.Devices {
				d.MigMode = nvml.DEVICE_MIG_ENABLE
			}
		}
		return m, m.write(m.snapshot())
	}
	if st.Model != name || len(st.GPUs) != len(m.Devices) {
		return nil, fmt.Errorf("%s holds model %q with %d GPUs, not %q", m.statePath(), st.Model, len(st.GPUs), name)
	}
	m.apply(st)
	return m, nil
}

func (m *Model) statePath() string { return filepath.Join(m.StateDir, "state.json") }

// lock takes the state dir's flock (exclusive); the returned func releases it.
func (m *Model) lock() (func(), error) {
	if err := os.MkdirAll(m.StateDir, 0o755); err != nil {
		return nil, err
	}
	f, err := os.OpenFile(filepath.Join(m.StateDir, "state.lock"), os.O_CREATE|os.O_RDWR, 0o644)
	if err != nil {
		return nil, err
	}
	if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX); err != nil {
		f.Close()
		return nil, err
	}
	return func() { syscall.Flock(int(f.Fd()), syscall.LOCK_UN); f.Close() }, nil
}

func (m *Model) read() (*State, error) {
	b, err := os.ReadFile(m.statePath())
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	var st State
	if err := json.Unmarshal(b, &st); err != nil {
		return nil, fmt.Errorf("%s: %w", m.statePath(), err)
	}
	return &st, nil
}

// write replaces state.json atomically: temp file, fsync, rename, fsync of the dir.
func (m *Model) write(st *State) error {
	b, err := json.MarshalIndent(st, "", "  ")
	if err != nil {
		return err
	}
	tmp, err := os.CreateTemp(m.StateDir, ".state-*.json")
	if err != nil {
		return err
	}
	defer os.Remove(tmp.Name())
	if _, err := tmp.Write(append(b, '\n')); err != nil {
		tmp.Close()
		return err
	}
	if err := tmp.Sync(); err != nil {
		tmp.Close()
		return err
	}
	if err := tmp.Close(); err != nil {
		return err
	}
	if err := os.Rename(tmp.Name(), m.statePath()); err != nil {
		return err
	}
	dir, err := os.Open(m.StateDir)
	if err != nil {
		return err
	}
	defer dir.Close()
	return dir.Sync()
}

// apply puts saved state into the fresh system.
func (m *Model) apply(st *State) {
	for i, d := range m.Devices {
		g := st.GPUs[i]
		d.UUID = g.UUID
		d.MigMode = g.MigMode
		d.GpuInstanceCounter = g.GICounter
		d.GpuInstances = map[*server.GpuInstance]struct{}{}
		for _, gs := range g.GIs {
			gi := server.NewGpuInstanceFromInfo(nvml.GpuInstanceInfo{
				Device:    d,
				Id:        gs.ID,
				ProfileId: gs.ProfileID,
				Placement: nvml.GpuInstancePlacement{Start: gs.Start, Size: gs.Size},
			}, d.Config.MIGProfiles)
			gi.ComputeInstanceCounter = gs.CICounter
			for _, cs := range gs.CIs {
				ci := server.NewComputeInstanceFromInfo(nvml.ComputeInstanceInfo{
					Device:      d,
					GpuInstance: gi,
					Id:          cs.ID,
					ProfileId:   cs.ProfileID,
					Placement:   nvml.ComputeInstancePlacement{Start: cs.Start, Size: cs.Size},
				})
				gi.ComputeInstances[ci] = struct{}{}
				m.MigUUIDs[MigKey{i, gs.ID, cs.ID}] = cs.UUID
			}
			d.GpuInstances[gi] = struct{}{}
		}
	}
}

func (m *Model) snapshot() *State {
	st := &State{Model: m.Name}
	for i, d := range m.Devices {
		g := GPUState{UUID: d.UUID, MigMode: d.MigMode, GICounter: d.GpuInstanceCounter, GIs: []GIState{}}
		for _, gi := range SortedGIs(d) {
			gs := GIState{ID: gi.Info.Id, ProfileID: gi.Info.ProfileId, Start: gi.Info.Placement.Start,
				Size: gi.Info.Placement.Size, CICounter: gi.ComputeInstanceCounter, CIs: []CIState{}}
			for _, ci := range SortedCIs(gi) {
				gs.CIs = append(gs.CIs, CIState{UUID: m.MigUUIDs[MigKey{i, gi.Info.Id, ci.Info.Id}], ID: ci.Info.Id, ProfileID: ci.Info.ProfileId,
					Start: ci.Info.Placement.Start, Size: ci.Info.Placement.Size})
			}
			g.GIs = append(g.GIs, gs)
		}
		st.GPUs = append(st.GPUs, g)
	}
	return st
}

// Mutate runs change (which alters the system) under the state lock and saves the
// result; a failed save is reported as NVML_ERROR_UNKNOWN.
func (m *Model) Mutate(change func() nvml.Return) nvml.Return {
	if m.StateDir == "" {
		return change()
	}
	unlock, err := m.lock()
	if err != nil {
		fmt.Fprintf(os.Stderr, "nvml-model: %v\n", err)
		return nvml.ERROR_UNKNOWN
	}
	defer unlock()
	ret := change()
	if ret == nvml.SUCCESS {
		if err := m.write(m.snapshot()); err != nil {
			fmt.Fprintf(os.Stderr, "nvml-model: saving state: %v\n", err)
			return nvml.ERROR_UNKNOWN
		}
	}
	return ret
}

// SortedGIs lists a GPU's GPU instances by ID.
func SortedGIs(d *server.Device) []*server.GpuInstance {
	var out []*server.GpuInstance
	for gi := range d.GpuInstances {
		out = append(out, gi)
	}
	sort.Slice(out, func(a, b int) bool { return out[a].Info.Id < out[b].Info.Id })
	return out
}

// SortedCIs lists a GPU instance's compute instances by ID.
func SortedCIs(gi *server.GpuInstance) []*server.ComputeInstance {
	var out []*server.ComputeInstance
	for ci := range gi.ComputeInstances {
		out = append(out, ci)
	}
	sort.Slice(out, func(a, b int) bool { return out[a].Info.Id < out[b].Info.Id })
	return out
}
