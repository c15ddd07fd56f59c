#!/usr/bin/env bash
# CI's run of the GPU acceptance kit, against the simulated node: packs the kit (its
# size checked against 64 MiB), then runs `tests/gpu/run.sh --simulated` as root on two
# simulated nodes and asserts that every check ran and reported the verdict expected
# there (figures are not judged):
#
#   1. sim-node.yaml: an H100 with MIG mode off, with --allow-mig-changes: every claim
#      check passes, and the MIG check runs the full lifecycle (MIG switched on, NVML's
#      profiles compared, one instance of each profile, MIG switched back off) and passes.
#   2. sim-node-mig.yaml: the same H100 already in MIG mode: prepare holds one MIG claim,
#      cuda-kernel runs in its MIG instance, discovery compares the partitions with
#      NVML's profiles, the MIG check passes; interception, compute-shares and watchdog
#      (shared claims only) and costs (the bare driver's only) are SKIPs.
#
# MIG on the simulated node is go-nvml's DGX H100 model (the fake NVML forwards every MIG
# call to tests/nvml-models' bridge, packed as sim/libnvml-model.so), so the MIG claim,
# the MIG check and the MIG lifecycle create and destroy the model's instances. The
# partitions' comparison with NVML's profiles compares none here: the bridge does not
# answer nvmlDeviceGetGpuInstanceProfileInfoV, kit_nvml's call (and the model's tables
# differ from real H100s: KNOWN_DIFFERENCES in tests/plugin/nvml_models.rs).
# testkit::kit::discovery's unit tests show that the comparison finds differences.
#
#   tests/gpu/ci.sh [KIT_DIR] [OUT_DIR]   (default target/gpu-kit, target/gpu-kit-out;
#                                          the second run's JSON in OUT_DIR-mig)
#
# After CI's main job and zigbuild phase it builds nothing (pack.sh's cargo build is the
# README's); it packs the glibc 2.17 libraries from target/zig.
set -uo pipefail
cd "$(dirname "$0")/../.." || exit 1
kit=${1:-target/gpu-kit}
out=${2:-target/gpu-kit-out}
# Every check run.sh has, in its order, with the verdict each run must give.
checks=(doctor inventory discovery prepare cuda-kernel interception compute-shares watchdog costs mig)
expect_off=(PASS PASS PASS PASS PASS PASS PASS PASS PASS PASS)
expect_on=(PASS PASS PASS PASS PASS SKIP SKIP SKIP SKIP PASS)

start=$(date +%s)
tests/gpu/pack.sh "$kit" || { echo "ci.sh: pack.sh failed" >&2; exit 1; }
packed=$(date +%s)

bad=0
# judge OUT EXPECTED...: each check reported once, with its expected verdict.
judge() {
  local dir=$1 i c f g verdict
  shift
  local want=("$@")
  i=0
  for c in "${checks[@]}"; do
    f=""
    for g in "$dir"/checks/[0-9][0-9]-"$c".json; do [ -f "$g" ] && f=$g; done
    if [ -z "$f" ]; then
      echo "ci.sh: $dir: check $c did not report" >&2
      bad=1
    else
      verdict=$(sed -n 's/.*"verdict":"\([A-Z]*\)".*/\1/p' "$f")
      if [ "$verdict" != "${want[$i]}" ]; then
        echo "ci.sh: $dir: check $c: ${verdict:-no verdict}, expected ${want[$i]}: $(cat "$f")" >&2
        bad=1
      fi
    fi
    i=$((i + 1))
  done
  local n
  n=$(find "$dir/checks" -name '*.json' | wc -l)
  [ "$n" = ${#checks[@]} ] || { echo "ci.sh: $dir: $n reports, ${#checks[@]} checks expected" >&2; bad=1; }
}

echo "ci.sh: 1. sim-node.yaml (MIG off), --allow-mig-changes"
tests/gpu/run.sh --simulated --allow-mig-changes "$kit" "$out"
echo "ci.sh: run.sh exited $?"
judge "$out" "${expect_off[@]}"
first=$(date +%s)
echo "ci.sh: 2. sim-node-mig.yaml (MIG already on)"
TESSERA_KIT_SIM_NODE=sim-node-mig.yaml tests/gpu/run.sh --simulated "$kit" "$out-mig"
echo "ci.sh: run.sh exited $?"
judge "$out-mig" "${expect_on[@]}"
done_at=$(date +%s)

echo "ci.sh: packed in $((packed - start)) s, ran in $((first - packed)) s (MIG off) and $((done_at - first)) s (MIG on); $([ "$bad" = 0 ] && echo ok || echo FAILED)"
exit "$bad"
