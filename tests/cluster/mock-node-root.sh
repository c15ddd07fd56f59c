#!/usr/bin/env bash
# Makes the simulated node's host side for a cluster of up.sh: DIR/tessera-node/ with dev/
# (the device nodes the mock node of deploy/overlays/test-cluster/mock-node.yaml has,
# mknod'ed), driver-root/ (fake driver files and a stand-in nvidia-smi), run/, state/.
# Why: Tessera's mock backend (--backend mock:FILE) simulates NVML, but the CDI specs it
# writes name real host paths that containerd bind-mounts into claim containers.
# Shared by tessera-up.sh (kustomize install) and scenario-helm.sh (Helm install).
# Usage (root): mock-node-root.sh DIR        Idempotent.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
repo=$(cd "$here/../.." && pwd)
DIR=$(cd "${1:?usage: mock-node-root.sh DIR}" && pwd)
overlay=$repo/deploy/overlays/test-cluster
NODE_ROOT=$DIR/tessera-node
# Device nodes as the node would have them (testkit/src/e2e.rs make_dev_root): one
# per GPU, the MIG capability nodes of MIG-capable GPUs, nvidiactl and the uvm pair;
# fake driver files (testkit/src/harness.rs make_driver_root), except that libcuda is
# the fake driver and nvidia-smi a script (see below).
mkdir -p "$NODE_ROOT"/{dev,driver-root/usr/lib/x86_64-linux-gnu,driver-root/usr/bin,run,state,registry}
driver_version=$(python3 - "$overlay/mock-node.yaml" "$NODE_ROOT" <<'EOF'
import os, stat, sys, yaml
node = yaml.safe_load(open(sys.argv[1]))
root = sys.argv[2]
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
    open(os.path.join(lib, f"{base}.{node['driverVersion']}"), "w").close()
print(node["driverVersion"])
EOF
)
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
