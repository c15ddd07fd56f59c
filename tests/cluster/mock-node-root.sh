#!/usr/bin/env bash
# Makes the simulated node's host side for a cluster of up.sh: DIR/tessera-node/ with dev/
# (the simulated GPUs' device nodes, mknod'ed), driver-root/ (fake driver files, a
# stand-in nvidia-smi and, on the NVML backend, NVIDIA's models as libnvidia-ml.so.1),
# run/, state/, and node.json (what the scenarios may rely on: backend, driver version,
# device majors, GPUs by minor with UUID, product name, memory, MIG capability).
# Why: a GPU-less node. The CDI specs Tessera writes name real host paths that
# containerd bind-mounts into claim containers.
# The node is TESSERA_CLUSTER_BACKEND's:
#   mock (default)  Tessera's mock backend (--backend mock:FILE) on the mock node of
#                   deploy/overlays/test-cluster/mock-node.yaml (2 H100, 2 T4);
#   nvml:MODEL      the shipped backend (--backend nvml) on one of NVIDIA's models of
#                   go-nvml (tests/nvml-models, built into target/tmp/nvml-models): dgxa100,
#                   dgxh100, dgxh200, dgxb200. The bridge is the driver root's
#                   libnvidia-ml.so.<driver version> (and .so.1), its state (UUIDs, MIG
#                   mode, GPU and compute instances; TESSERA_NVML_MODEL_STATE) in
#                   state/nvml-model/ (the plugin's state dir, so it outlives plugin pods),
#                   MIG on (TESSERA_NVML_MODEL_MIG=on). What the kernel module would add
#                   to /proc/devices (nvidia, nvidia-uvm, nvidia-caps: the majors the
#                   plugin reads) is bind-mounted over /proc/devices in containerd's mount
#                   namespace only, so that the plugin's hostPath /proc shows it as on a
#                   GPU node; nothing changes in the host's namespace.
# Shared by tessera-up.sh (kustomize install) and scenario-helm.sh (Helm install).
# Usage (root): [TESSERA_CLUSTER_BACKEND=nvml:dgxh100] mock-node-root.sh DIR     Idempotent
# (a second call with another backend for the same DIR fails).
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
repo=$(cd "$here/../.." && pwd)
DIR=$(cd "${1:?usage: mock-node-root.sh DIR}" && pwd)
overlay=$repo/deploy/overlays/test-cluster
NODE_ROOT=$DIR/tessera-node
backend=${TESSERA_CLUSTER_BACKEND:-mock}
case $backend in
  mock) model="" ;;
  nvml:dgxa100 | nvml:dgxh100 | nvml:dgxh200 | nvml:dgxb200) model=${backend#nvml:} ;;
  *) echo "mock-node-root.sh: TESSERA_CLUSTER_BACKEND=$backend: want mock or nvml:MODEL (dgxa100, dgxh100, dgxh200, dgxb200)" >&2; exit 2 ;;
esac
if [ -f "$NODE_ROOT/node.json" ]; then
  was=$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["backend"])' "$NODE_ROOT/node.json")
  [ "$was" = "$backend" ] || { echo "mock-node-root.sh: $NODE_ROOT is the node of backend $was, not $backend" >&2; exit 1; }
fi
# Device nodes as the node would have them (testkit/src/e2e.rs make_dev_root): one
# per GPU, the MIG capability nodes of MIG-capable GPUs, nvidiactl and the uvm pair;
# fake driver files (testkit/src/harness.rs make_driver_root), except that libcuda is
# the fake driver and nvidia-smi a script (see below).
mkdir -p "$NODE_ROOT"/{dev,driver-root/usr/lib/x86_64-linux-gnu,driver-root/usr/bin,run,state,registry}
lib=$NODE_ROOT/driver-root/usr/lib/x86_64-linux-gnu
if [ -n "$model" ]; then
  # NVIDIA's model: built (cached by its inputs), its state made once (the UUIDs are
  # drawn then), and its dump (tests/nvml-models: nvml-model dump) is the node's truth.
  models=$repo/target/tmp/nvml-models     # as `cargo test -p tessera --test plugin nvml_models` builds it
  "$repo/tests/nvml-models/build.sh" "$models" >/dev/null
  mkdir -p "$NODE_ROOT/state/nvml-model"
  TESSERA_NVML_MODEL=$model TESSERA_NVML_MODEL_MIG=on TESSERA_NVML_MODEL_STATE=$NODE_ROOT/state/nvml-model \
    "$models/nvml-model" dump >"$NODE_ROOT/nvml-model.json.tmp"
  mv "$NODE_ROOT/nvml-model.json.tmp" "$NODE_ROOT/nvml-model.json"
fi
driver_version=$(python3 - "$backend" "$overlay/mock-node.yaml" "$NODE_ROOT" <<'EOF'
import json, os, stat, sys, yaml
backend, mock_file, root = sys.argv[1:]
if backend == "mock":
    mock = yaml.safe_load(open(mock_file))
    node = {"driverVersion": mock["driverVersion"], "charDevices": mock["charDevices"],
            "gpus": [{k: g[k] for k in ("minor", "uuid", "productName", "memoryBytes", "migCapable")}
                     for g in mock["gpus"]]}
else:
    dump = json.load(open(os.path.join(root, "nvml-model.json")))
    # The majors a GPU node's /proc/devices lists (the same as the mock node's).
    node = {"driverVersion": dump["driverVersion"],
            "charDevices": {"nvidia": 195, "nvidia-uvm": 508, "nvidia-caps": 511},
            "gpus": [{"minor": g["minor"], "uuid": g["uuid"], "productName": g["name"],
                      "memoryBytes": g["memoryBytes"], "migCapable": g["migCapable"]}
                     for g in dump["gpus"]]}
    m = node["charDevices"]
    with open(os.path.join(root, "proc-devices"), "w") as f:
        f.write("Character devices:\n" + "".join(f"{v} {k}\n" for k, v in sorted(m.items(), key=lambda x: x[1])))
node["backend"] = backend
node["gpus"].sort(key=lambda g: g["minor"])
with open(os.path.join(root, "node.json.tmp"), "w") as f:
    json.dump(node, f, indent=1)
os.rename(os.path.join(root, "node.json.tmp"), os.path.join(root, "node.json"))
m = node["charDevices"]
def mknod(path, major, minor):
    p = os.path.join(root, "dev", path)
    os.makedirs(os.path.dirname(p), exist_ok=True)
    if not os.path.exists(p):
        os.mknod(p, 0o666 | stat.S_IFCHR, os.makedev(major, minor))
        os.chmod(p, 0o666)
for g in node["gpus"]:
    mknod(f"nvidia{g['minor']}", m["nvidia"], g["minor"])
    if g.get("migCapable") and "nvidia-caps" in m:
        for gi in range(15):
            gm = 3 + 135 * g["minor"] + 9 * gi          # mig/geometry.rs gi_cap_minor
            mknod(f"nvidia-caps/nvidia-cap{gm}", m["nvidia-caps"], gm)
            for ci in range(8):
                mknod(f"nvidia-caps/nvidia-cap{gm + 1 + ci}", m["nvidia-caps"], gm + 1 + ci)
mknod("nvidiactl", m["nvidia"], 255)
mknod("nvidia-uvm", m["nvidia-uvm"], 0)
mknod("nvidia-uvm-tools", m["nvidia-uvm"], 1)
lib = os.path.join(root, "driver-root/usr/lib/x86_64-linux-gnu")
for base in ["libnvidia-ml.so", "libnvidia-ptxjitcompiler.so", "libnvidia-nvvm.so"]:
    if backend == "mock" or base != "libnvidia-ml.so":
        open(os.path.join(lib, f"{base}.{node['driverVersion']}"), "a").close()
print(node["driverVersion"])
EOF
)
if [ -n "$model" ]; then
  # The bridge as the driver's NVML, named as a driver installs it.
  nvml=$lib/libnvidia-ml.so.$driver_version
  cmp -s "$models/libnvidia-ml.so.1" "$nvml" || { cp "$models/libnvidia-ml.so.1" "$nvml.tmp" && mv "$nvml.tmp" "$nvml"; }
  ln -sfn "libnvidia-ml.so.$driver_version" "$lib/libnvidia-ml.so.1"
  # The kernel module's majors, in containerd's mount namespace (where the plugin pod's
  # hostPath /proc comes from); gone with that namespace at down.sh.
  nsenter --mount --target "$(cat "$DIR/pids/containerd")" sh -c \
    'grep -q "^ *[0-9]* nvidia$" /proc/devices || mount --bind "$1" /proc/devices' sh "$NODE_ROOT/proc-devices"
fi
# The driver's libcuda: the project's fake driver (cuda/tests/fakes/fake_cuda.c), so
# that a CUDA client in a claim's container goes through the interception library the
# CDI spec mounts to a driver, as on a GPU node. With FAKE_CUDA_DEVICE_NODES=1 (the
# client image's environment, scenario-workloads.py) it shows the GPUs whose
# /dev/nvidiaN the container has, as the real driver does.
libcuda=$NODE_ROOT/driver-root/usr/lib/x86_64-linux-gnu/libcuda.so.$driver_version
if [ ! -s "$libcuda" ] || [ "$repo/cuda/tests/fakes/fake_cuda.c" -nt "$libcuda" ]; then
  cc -shared -fPIC -pthread -std=gnu11 -O1 -Wl,-Bsymbolic-functions -Wl,-soname,libcuda.so.1 \
    -I"$repo/cuda/tests/fakes" -o "$libcuda.tmp" "$repo/cuda/tests/fakes/fake_cuda.c"
  mv "$libcuda.tmp" "$libcuda"
fi
# The stand-in nvidia-smi, mounted into claim containers by the CDI spec: `-L` lists the
# GPU device nodes the container has (name, major:minor), then it stays up until
# SIGTERM so that the test can look into the running container.
cat >"$NODE_ROOT/driver-root/usr/bin/nvidia-smi" <<'EOF'
#!/bin/sh
# tests/cluster: a stand-in for nvidia-smi (the driver root is fake).
for d in /dev/nvidia[0-9]*; do
  [ -c "$d" ] || continue
  set -- $(stat -c '%t %T' "$d")
  echo "GPU ${d#/dev/nvidia}: $d (char $((0x$1)):$((0x$2)))"
done
trap 'exit 0' TERM INT
sleep 2147483647 &
wait
EOF
chmod 755 "$NODE_ROOT/driver-root/usr/bin/nvidia-smi"
echo "simulated node: $(find "$NODE_ROOT/dev" -type c | wc -l) device nodes in $NODE_ROOT/dev, driver root $NODE_ROOT/driver-root"
