// Command nvml-model reads and changes a model's state from outside the library:
//
//	nvml-model dump            the model's GPUs as JSON (the tests' ground truth)
//	nvml-model mig-mode on|off MIG mode of every GPU, saved in the state dir
//
// The model and state dir come from the environment, as for the library.
package main

import (
	"encoding/json"
	"fmt"
	"os"
	"sort"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock/server"

	"tessera.dev/nvml-models/model"
)

type Dump struct {
	Model             string `json:"model"`
	DriverVersion     string `json:"driverVersion"`
	CudaDriverVersion int    `json:"cudaDriverVersion"`
	GPUs              []GPU  `json:"gpus"`
}

type GPU struct {
	Index                 int          `json:"index"`
	Minor                 int          `json:"minor"`
	UUID                  string       `json:"uuid"`
	Name                  string       `json:"name"`
	Brand                 int          `json:"brand"`
	Architecture          int          `json:"architecture"`
	MemoryBytes           uint64       `json:"memoryBytes"`
	PciBusID              string       `json:"pciBusId"`
	CudaComputeCapability string       `json:"cudaComputeCapability"`
	MigCapable            bool         `json:"migCapable"`
	MigEnabled            bool         `json:"migEnabled"`
	MigProfiles           []MigProfile `json:"migProfiles"`
	GpuInstances          []Instance   `json:"gpuInstances"`
}

type MigProfile struct {
	Index               int         `json:"index"`
	ID                  uint32      `json:"id"`
	SliceCount          uint32      `json:"sliceCount"`
	InstanceCount       uint32      `json:"instanceCount"`
	MultiprocessorCount uint32      `json:"multiprocessorCount"`
	CopyEngineCount     uint32      `json:"copyEngineCount"`
	DecoderCount        uint32      `json:"decoderCount"`
	EncoderCount        uint32      `json:"encoderCount"`
	JpegCount           uint32      `json:"jpegCount"`
	OfaCount            uint32      `json:"ofaCount"`
	MemorySizeMB        uint64      `json:"memorySizeMB"`
	Placements          []Placement `json:"placements"`
}

type Placement struct {
	Start uint32 `json:"start"`
	Size  uint32 `json:"size"`
}

type Instance struct {
	ID               uint32    `json:"id"`
	ProfileID        uint32    `json:"profileId"`
	Placement        Placement `json:"placement"`
	ComputeInstances []Compute `json:"computeInstances"`
}

// Compute is a compute instance and the UUID of its MIG device.
type Compute struct {
	ID        uint32 `json:"id"`
	ProfileID uint32 `json:"profileId"`
	UUID      string `json:"uuid"`
}

func main() {
	if err := run(os.Args[1:]); err != nil {
		fmt.Fprintf(os.Stderr, "nvml-model: %v\n", err)
		os.Exit(1)
	}
}

func run(args []string) error {
	m, err := model.FromEnv()
	if err != nil {
		return err
	}
	switch {
	case len(args) == 1 && args[0] == "dump":
		enc := json.NewEncoder(os.Stdout)
		enc.SetIndent("", "  ")
		return enc.Encode(dump(m))
	case len(args) == 2 && args[0] == "mig-mode" && (args[1] == "on" || args[1] == "off"):
		mode := nvml.DEVICE_MIG_DISABLE
		if args[1] == "on" {
			mode = nvml.DEVICE_MIG_ENABLE
		}
		if r := m.Mutate(func() nvml.Return {
			for _, d := range m.Devices {
				if _, r := d.SetMigMode(mode); r != nvml.SUCCESS {
					return r
				}
			}
			return nvml.SUCCESS
		}); r != nvml.SUCCESS {
			return fmt.Errorf("mig-mode %s: %v", args[1], r)
		}
		return nil
	}
	return fmt.Errorf("usage: nvml-model dump | mig-mode on|off")
}

func dump(m *model.Model) Dump {
	s := m.Server
	out := Dump{Model: m.Name, DriverVersion: s.DriverVersion, CudaDriverVersion: s.CudaDriverVersion}
	for i, d := range m.Devices {
		out.GPUs = append(out.GPUs, gpu(m, i, d))
	}
	return out
}

func gpu(m *model.Model, i int, d *server.Device) GPU {
	c := d.Config
	g := GPU{
		Index: d.Index, Minor: d.Minor, UUID: d.UUID, Name: c.Name, Brand: int(c.Brand),
		Architecture: int(c.Architecture), MemoryBytes: d.MemoryInfo.Total, PciBusID: d.PciBusID,
		CudaComputeCapability: fmt.Sprintf("%d.%d", c.CudaMajor, c.CudaMinor),
		MigCapable:            len(c.MIGProfiles.GpuInstanceProfiles) > 0,
		MigEnabled:            d.MigMode == nvml.DEVICE_MIG_ENABLE,
		MigProfiles:           []MigProfile{}, GpuInstances: []Instance{},
	}
	for index, p := range c.MIGProfiles.GpuInstanceProfiles {
		mp := MigProfile{Index: index, ID: p.Id, SliceCount: p.SliceCount, InstanceCount: p.InstanceCount,
			MultiprocessorCount: p.MultiprocessorCount, CopyEngineCount: p.CopyEngineCount,
			DecoderCount: p.DecoderCount, EncoderCount: p.EncoderCount, JpegCount: p.JpegCount,
			OfaCount: p.OfaCount, MemorySizeMB: p.MemorySizeMB, Placements: []Placement{}}
		for _, pl := range c.MIGProfiles.GpuInstancePlacements[int(p.Id)] {
			mp.Placements = append(mp.Placements, Placement{pl.Start, pl.Size})
		}
		g.MigProfiles = append(g.MigProfiles, mp)
	}
	sort.Slice(g.MigProfiles, func(a, b int) bool { return g.MigProfiles[a].ID < g.MigProfiles[b].ID })
	for _, gi := range model.SortedGIs(d) {
		inst := Instance{gi.Info.Id, gi.Info.ProfileId,
			Placement{gi.Info.Placement.Start, gi.Info.Placement.Size}, []Compute{}}
		for _, ci := range model.SortedCIs(gi) {
			inst.ComputeInstances = append(inst.ComputeInstances, Compute{ci.Info.Id, ci.Info.ProfileId,
				m.MigUUIDs[model.MigKey{GPU: i, GI: gi.Info.Id, CI: ci.Info.Id}]})
		}
		g.GpuInstances = append(g.GpuInstances, inst)
	}
	return g
}
