#!/usr/bin/env bash
# Scenario: examples/workloads/01-one-gpu.yaml, only its image swapped for the cluster's
# local busybox, on a cluster with Tessera installed (tessera-up.sh). Checks, each
# printed: the pod reaches Running; its claim is allocated by the real scheduler to
# driver gpu.tessera.dev, this node's pool, the device the example promises (`# expect:`),
# and reserved for the pod; the claim's CDI spec is in the node's CDI dir and names the
# GPU's device node; inside the container the GPU's device node is there (char
# major:minor of the simulated node, mock-node-root.sh's node.json) and no other GPU's, and the driver's nvidia-smi (the
# fake driver root's stand-in, mounted by the CDI spec) listed it; deleting the pod
# unprepares the claim (plugin log), removes its CDI spec and its checkpoint entry.
# Prints the time from `kubectl apply` to Running and from the delete to the spec's removal.
# Usage (root): scenario-one-gpu.sh DIR
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
. "$here/lib.sh"
repo=$(cd "$here/../.." && pwd)
DIR=$(cd "${1:?usage: scenario-one-gpu.sh DIR}" && pwd)
cluster_env tessera
DIE_CONTEXT="k describe pod one-gpu"
OUT=$DIR/tessera/one-gpu
mkdir -p "$OUT"
example=$repo/examples/workloads/01-one-gpu.yaml

# The example, with only its image replaced.
image=$(sed -n 's/^ *image: *//p' "$example")
[ "$(wc -l <<<"$image")" = 1 ] || die "expected one image in $example"
sed "s#image: $image\$#image: localhost/tessera/busybox:1#" "$example" >"$OUT/workload.yaml"
diff "$example" "$OUT/workload.yaml" | sed 's/^/  workload diff: /' || true
expect_device=$(sed -n 's/^# expect: one-gpu: *//p' "$example")
echo "scenario one-gpu ($K8S_VERSION): $example, image $image -> localhost/tessera/busybox:1, expect device $expect_device"

default_sa || true
t0=$(now)
k apply -f "$OUT/workload.yaml" 2>&1 | sed 's/^/  apply: /'
phase=""
deadline=$(( $(date +%s) + 90 ))
while [ "$(date +%s)" -lt "$deadline" ]; do
  phase=$(k get pod one-gpu -o jsonpath='{.status.phase}' 2>/dev/null || true)
  [ "$phase" = Running ] && break
  [ "$phase" = Failed ] || [ "$phase" = Succeeded ] && break
  sleep 0.1
done
t_running=$(since "$t0")
if [ "$phase" != Running ]; then
  k get events --field-selector involvedObject.name=one-gpu -o custom-columns=REASON:.reason,MESSAGE:.message 2>/dev/null | sed 's/^/  event: /' >&2
  k delete -f "$OUT/workload.yaml" --ignore-not-found --wait=false >/dev/null 2>&1
  echo "  FAIL pod one-gpu not Running after ${t_running}s (phase: $phase)" >&2
  echo "scenario one-gpu ($K8S_VERSION): FAILED" >&2
  exit 1
fi
echo "  ok   pod one-gpu Running ${t_running}s after kubectl apply"
echo "TIME_APPLY_TO_RUNNING=$t_running" >"$OUT/times"

# ---------- the claim, as the API server stores it ----------
claim=$(k get pod one-gpu -o jsonpath='{.status.resourceClaimStatuses[?(@.name=="gpu")].resourceClaimName}')
[ -n "$claim" ] || die "the pod has no resourceClaimStatuses entry for gpu"
k get resourceclaim "$claim" -o yaml >"$OUT/claim.yaml"
k get resourceclaim "$claim" -o json >"$OUT/claim.json"
uid=$(jq -r .metadata.uid "$OUT/claim.json")
pod_uid=$(k get pod one-gpu -o jsonpath='{.metadata.uid}')
echo "  claim $claim (uid $uid), from template one-gpu:"
sed -n '/^status:/,$p' "$OUT/claim.yaml" | sed 's/^/    /'
eq "allocation results" "$(jq -r '.status.allocation.devices.results | length' "$OUT/claim.json")" 1
eq "allocated driver" "$(jq -r '.status.allocation.devices.results[0].driver' "$OUT/claim.json")" gpu.tessera.dev
eq "allocated pool" "$(jq -r '.status.allocation.devices.results[0].pool' "$OUT/claim.json")" "$NODE_NAME"
eq "allocated device (the example's # expect:)" "$(jq -r '.status.allocation.devices.results[0].device' "$OUT/claim.json")" "$expect_device"
eq "allocated request" "$(jq -r '.status.allocation.devices.results[0].request' "$OUT/claim.json")" gpu
eq "allocation node selector" "$(jq -r '[.status.allocation.nodeSelector.nodeSelectorTerms[].matchFields[]? | select(.key == "metadata.name") | .values[]] | join(",")' "$OUT/claim.json")" "$NODE_NAME"
eq "reserved for" "$(jq -r '[.status.reservedFor[] | "\(.resource)/\(.name)/\(.uid)"] | join(",")' "$OUT/claim.json")" "pods/one-gpu/$pod_uid"
eq "pod scheduled on" "$(k get pod one-gpu -o jsonpath='{.spec.nodeName}')" "$NODE_NAME"

# ---------- the node: CDI spec and checkpoint ----------
spec=$CDI_DIR/tessera.dev-gpu-$uid.json
check "CDI spec $spec written" test -f "$spec"
cp "$spec" "$OUT/cdi-spec.json" 2>/dev/null || true
minor=${expect_device#gpu-}
major=$(jq -r '.charDevices.nvidia' "$DIR/tessera-node/node.json")
eq "CDI spec kind" "$(jq -r .kind "$spec")" tessera.dev/gpu
eq "CDI device nodes of the claim's device" "$(jq -r '[.devices[].containerEdits.deviceNodes[] | "\(.path)=\(.hostPath) \(.major):\(.minor)"] | join(",")' "$spec")" \
  "/dev/nvidia$minor=$DIR/tessera-node/dev/nvidia$minor $major:$minor"
eq "CDI device name" "$(jq -r '[.devices[].name] | join(",")' "$spec")" "$uid-$expect_device"
check "checkpoint has the claim PrepareCompleted" grep -q "$uid" "$DIR"/tessera-node/state/*

# ---------- inside the container ----------
logs=""
for i in $(seq 50); do logs=$(k logs one-gpu 2>&1) && [ -n "$logs" ] && break; sleep 0.2; done
echo "$logs" | sed 's/^/    nvidia-smi -L: /'
eq "nvidia-smi -L in the container (driver root's, via the CDI spec)" "$logs" "GPU $minor: /dev/nvidia$minor (char $major:$minor)"
inside=$(k exec one-gpu -- sh -c 'for d in /dev/nvidia*; do echo "$d $(stat -c "%F %t %T" "$d")"; done; ls /usr/lib/x86_64-linux-gnu/' 2>&1 || true)
echo "$inside" | sed 's/^/    exec: /'
want_hex=$(printf '%x %x' "$major" "$minor")
check "/dev/nvidia$minor in the container: character special file $major:$minor" grep -qx "/dev/nvidia$minor character special file $want_hex" <<<"$inside"
others=$(grep -E '^/dev/nvidia[0-9]+ ' <<<"$inside" | grep -v "^/dev/nvidia$minor " || true)
eq "other GPUs' device nodes in the container" "$others" ""
check "/dev/nvidiactl and /dev/nvidia-uvm in the container" grep -q '^/dev/nvidiactl character special file' <<<"$inside"
check "libcuda.so.1 mounted from the driver root" grep -qx 'libcuda.so.1' <<<"$inside"

# ---------- delete: unprepare ----------
t1=$(now)
k delete pod one-gpu --wait=true >/dev/null
t_deleted=$(since "$t1")
for i in $(seq 300); do [ -e "$spec" ] || break; sleep 0.1; done
t_spec=$(since "$t1")
check "CDI spec removed after the pod's deletion (${t_spec}s; pod gone after ${t_deleted}s)" test ! -e "$spec"
for i in $(seq 100); do grep -q "unprepared.*$uid" <<<"$(plog "$TESSERA_POD")" && break; sleep 0.2; done
check "plugin logged the unprepare of $uid" grep -q "unprepared.*$uid" <<<"$(plog "$TESSERA_POD")"
plog "$TESSERA_POD" | grep "$uid" | sed 's/^/    plugin: /' || true
check "checkpoint no longer names the claim" not grep -q "$uid" "$DIR"/tessera-node/state/*
for i in $(seq 100); do k get resourceclaim "$claim" >/dev/null 2>&1 || break; sleep 0.2; done
check "the generated claim $claim deleted by the resourceclaim controller" not k get resourceclaim "$claim"
k delete -f "$OUT/workload.yaml" --ignore-not-found >/dev/null
echo "TIME_DELETE_TO_SPEC_REMOVED=$t_spec" >>"$OUT/times"
if [ "$errors" -gt 0 ]; then echo "scenario one-gpu ($K8S_VERSION): $errors check(s) FAILED" >&2; exit 1; fi
echo "scenario one-gpu ($K8S_VERSION): passed (apply -> Running ${t_running}s, delete -> CDI spec removed ${t_spec}s)"
