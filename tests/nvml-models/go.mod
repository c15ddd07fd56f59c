module tessera.dev/nvml-models

go 1.24

require github.com/NVIDIA/go-nvml v0.13.4-1

require github.com/google/uuid v1.6.0 // indirect
