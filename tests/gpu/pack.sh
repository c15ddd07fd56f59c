#!/usr/bin/env bash
# Packs the GPU acceptance kit into one folder (default target/gpu-kit/, at most 64 MiB):
#   bin/   tessera (release) and tessera-kit, the kit's driver (testkit/src/bin/tessera-kit.rs)
#   lib/   the interception library, its front, the soname shims and the CDI hook: the
#          glibc 2.17 builds (target/zig/x86_64-unknown-linux-gnu/release) when all are
#          there, else target/release; it says which
#   progs/ the C test programs (tests/gpu/progs/*.c): kit_cuda dlopens the real
#          libcuda.so.1 and loads the kit's PTX (tests/gpu/ptx/*.ptx, copied to ptx/)
#          with cuModuleLoadData: no CUDA toolkit or compiler is needed where the kit
#          runs; kit_nvml reads MIG modes and profiles from the real libnvidia-ml.so.1.
#          Built with `zig cc` for glibc 2.17 when zig is there (python3 -m ziglang, as
#          cuda/ci-setup.sh installs it), else with gcc (it prints the glibc they need)
#   sim/   the simulated node for `run.sh --simulated`: the fake NVML
#          (tests/fakes/fake_nvml.c), the NVML models it forwards MIG calls to
#          (tests/nvml-models, libnvml-model.so; needs go), the fake CUDA driver
#          (cuda/tests/fakes/fake_cuda.c) and the simulated nodes tests/gpu/sim-node.yaml
#          (MIG off) and sim-node-mig.yaml (MIG on)
# It builds what is missing with the README's build (`cargo build --release && cargo
# preload --release`: tessera-kit is a default member's binary), a no-op after CI's
# main job. TESSERA_KIT_PROFILE=debug packs debug builds instead (a
# developer's quick check; the binaries are stripped either way).
# TESSERA_KIT_NO_BUILD=1 packs what is built, building nothing. The kit's GLIBC file
# says the glibc it needs (run.sh checks the host's); bin/ needs the build host's unless
# TESSERA_KIT_ZIGBUILD=1 builds tessera and tessera-kit for glibc 2.17 (cargo-zigbuild,
# as cuda/ci-setup.sh installs it; an extra release build, not tried yet).
set -euo pipefail
cd "$(dirname "$0")/../.."
repo=$PWD
kit=${1:-target/gpu-kit}
profile=${TESSERA_KIT_PROFILE:-release}
limit_mib=64
nice=(nice -n "${TESSERA_BUILD_NICE:-19}")

flag=()
[ "$profile" = release ] && flag=(--release)
bin_dir=target/$profile
[ "$profile" = release ] || bin_dir=target/debug
if [ "${TESSERA_KIT_ZIGBUILD:-}" = 1 ]; then
  # tessera and tessera-kit for glibc 2.17 as well (an extra release build).
  "${nice[@]}" cargo zigbuild -q --offline --release -p tessera -p tessera-testkit --bin tessera --bin tessera-kit \
    --target x86_64-unknown-linux-gnu.2.17 --target-dir target/zig
  bin_dir=target/zig/x86_64-unknown-linux-gnu/release
fi
if [ "${TESSERA_KIT_NO_BUILD:-}" != 1 ]; then
  "${nice[@]}" cargo build -q "${flag[@]}"
  "${nice[@]}" cargo preload -q "${flag[@]}"
fi
dir=target/$profile
[ "$profile" = release ] || dir=target/debug

rm -rf "$kit"
mkdir -p "$kit"/{bin,lib,progs,ptx,sim}
kit=$(cd "$kit" && pwd)

for b in tessera tessera-kit; do
  install -m 0755 "$bin_dir/$b" "$kit/bin/$b"
done
libs=(libtessera_cuda.so libtessera_preload.so libtessera_shim_cuda.so libtessera_shim_nvml.so tessera-cdi-hook)
zig_dir=target/zig/x86_64-unknown-linux-gnu/release
from=$dir
have_zig_libs=1
for l in "${libs[@]}"; do [ -f "$zig_dir/$l" ] || have_zig_libs=0; done
if [ "$have_zig_libs" = 1 ]; then
  from=$zig_dir
  echo "lib/: the glibc 2.17 builds ($zig_dir)"
else
  echo "lib/: $dir (no complete glibc 2.17 build in $zig_dir; CI's zigbuild phase makes one)"
fi
for l in "${libs[@]}"; do install -m 0755 "$from/$l" "$kit/lib/$l"; done
# tessera finds the interception library next to itself by default; the kit passes it.
strip --strip-all "$kit"/bin/* "$kit"/lib/tessera-cdi-hook
strip --strip-unneeded "$kit"/lib/*.so

# The C programs: zig for glibc 2.17 when there, else gcc.
cc=(gcc)
if command -v zig >/dev/null 2>&1; then
  cc=(zig cc -target x86_64-linux-gnu.2.17)
elif python3 -c 'import ziglang' 2>/dev/null; then
  cc=(python3 -m ziglang cc -target x86_64-linux-gnu.2.17)
fi
echo "progs/: ${cc[*]}"
for src in tests/gpu/progs/*.c; do
  name=$(basename "$src" .c)
  flags=(-O2 -std=gnu11 -Wall -Wextra -Werror -o "$kit/progs/$name" "$src" -ldl -lpthread)
  if ! "${nice[@]}" "${cc[@]}" "${flags[@]}"; then
    [ "${cc[0]}" != gcc ] || exit 1
    echo "progs/: ${cc[*]} failed on $src; gcc instead (the host's glibc)" >&2
    "${nice[@]}" gcc "${flags[@]}"
  fi
done
cp tests/gpu/ptx/*.ptx "$kit/ptx/"
# The glibc each part needs (the newest versioned symbol), and the kit's: run.sh
# compares it with the host's before it starts.
glibc_of() { objdump -T "$@" 2>/dev/null | grep -o 'GLIBC_[0-9.]*' | sort -uV | tail -1 || true; }
for part in bin lib progs; do echo "$part/: need $(glibc_of "$kit/$part"/*)"; done
glibc_of "$kit"/bin/* "$kit"/lib/* "$kit"/progs/* | sed 's/^GLIBC_//' >"$kit/GLIBC"
echo "kit: needs glibc $(cat "$kit/GLIBC") on the GPU host (a release build of bin/ needs the build host's; TESSERA_KIT_ZIGBUILD=1 builds bin/ for glibc 2.17 with cargo-zigbuild)"

# The simulated node's fakes (the host's compiler: they run where the kit is packed).
"${nice[@]}" gcc -shared -fPIC -pthread -std=c11 -O1 -Wall -Wextra -Werror \
  -Wl,-soname,libnvidia-ml.so.1 -o "$kit/sim/libnvidia-ml.so.1" tests/fakes/fake_nvml.c -ldl
"${nice[@]}" gcc -shared -fPIC -pthread -O1 -Wall -Wextra \
  -Wl,-soname,libcuda.so.1 -o "$kit/sim/libcuda.so.1" cuda/tests/fakes/fake_cuda.c
cp tests/gpu/sim-node.yaml tests/gpu/sim-node-mig.yaml "$kit/sim/"
# The simulated node's MIG: the bridge over NVIDIA's go-nvml models (tests/nvml-models,
# built once into target/tmp/nvml-models), which the fake NVML forwards MIG calls to.
if command -v go >/dev/null 2>&1; then
  "${nice[@]}" tests/nvml-models/build.sh target/tmp/nvml-models
  install -m 0644 target/tmp/nvml-models/libnvidia-ml.so.1 "$kit/sim/libnvml-model.so"
elif [ -n "${CI:-}" ]; then
  echo "sim/: no go to build the NVML models (tests/nvml-models) for the simulated node" >&2
  exit 1
else
  echo "sim/: no go: no NVML model, so run.sh --simulated cannot run (a GPU host needs none)"
fi
git -C "$repo" rev-parse HEAD >"$kit/COMMIT" 2>/dev/null || true

size_kib=$(du -sk "$kit" | cut -f1)
echo "kit: $kit, $((size_kib / 1024)) MiB (${size_kib} KiB; limit ${limit_mib} MiB)"
if [ "$size_kib" -gt $((limit_mib * 1024)) ]; then
  du -sk "$kit"/*/* | sort -n | tail -5 >&2
  if [ "$profile" = release ]; then
    echo "the kit is larger than ${limit_mib} MiB" >&2
    exit 1
  fi
  echo "the kit is larger than ${limit_mib} MiB: allowed for a $profile build only" >&2
fi
