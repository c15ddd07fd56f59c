#!/usr/bin/env bash
# Scenario: for every file of examples/claims/, the allocations the real kube-scheduler
# makes equal what `tessera plan` prints for the same claims, slices and DeviceClasses
# (issue #22). Why: `tessera plan` (the k8s-model crate) claims to be an offline model
# of the scheduler's structured allocator; this holds it against the real one.
#
# Two passes over the files, one per node config of the plugin: `installed` (the
# ConfigMap as tessera-up.sh left it: deploy/base/node-config.yaml, both H100s in
# `mig` mode) and `mock-node` (the `config:` of the simulated node's file, the
# default mock node the examples' comments describe: gpu-1 `shared`, so shared-gpus.yaml
# exercises consumable capacity). The plugin is restarted with the other config and we
# wait until the stored slices equal `tessera inventory` in the new pod; at exit the
# installed config is put back the same way (DIR/tessera/env gets the new pod's name).
#
# Per file, in a fresh namespace, the file's documents in order, as `tessera plan`
# reads them: a ResourceClaim is created with a Pod `use-NAME` that references it (the
# scheduler allocates a claim only for a pod it schedules; one pod per claim, so each
# claim is allocated alone, as plan allocates it), then we wait until the claim has
# status.allocation, or until the pod's PodScheduled condition says Unschedulable
# "cannot allocate all claims" (and, within 15 s of a release, stays so for 3 s: a
# retry after a stale view of the release would allocate), in which case the pod is deleted at once (plan's failed
# claims hold nothing, and a pending pod would take devices freed later). A Release
# document deletes the pods of its claims and waits until the resourceclaim controller
# has removed their allocations. Then `tessera plan -o yaml FILE` runs with the
# ResourceSlices and DeviceClasses the API server stored when the file started
# (`kubectl get -o json` Lists), the cluster's release (--k8s-version) and feature
# gates (--gates), and plan-agreement.py compares claim by claim. Agreement (spelled
# out in plan-agreement.py): same outcome (allocated / unschedulable); per request the
# identical devices (driver/pool/device) -- not just as many of the same kind, since
# with one node and one pool the model claims to follow the scheduler's deterministic
# order; consumedCapacity equal as quantities; shareID present on both or neither (the
# scheduler's is a random UUID); the same node selector and config. The namespace is
# deleted after each file and we wait until the plugin has unprepared its claims
# (checkpoint and CDI dir no longer name them), and the slices must not have changed
# meanwhile. Prints the agreement table; exit 1 on any disagreement.
# `tessera plan` is the host's target/release/tessera (the binary image.sh put in the
# plugin's image).
# Usage (root): scenario-plan-agreement.sh DIR       (after tessera-up.sh DIR)
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
. "$here/lib.sh"
repo=$(cd "$here/../.." && pwd)
DIR=$(cd "${1:?usage: scenario-plan-agreement.sh DIR}" && pwd)
cluster_env tessera
# No kubectl here reads stdin (the steps are read from fd 3).
exec </dev/null
tessera=$repo/target/release/tessera
OUT=$DIR/tessera/plan-agreement
rm -rf "$OUT"
mkdir -p "$OUT"
table=$OUT/table.tsv
: >"$table"
pinned_pods=0
last_release=0
T0=$(now)
echo "scenario plan agreement ($K8S_VERSION): tessera plan --k8s-version 1.$K8S_MINOR --gates '$GATES'"

slice_versions() { k get resourceslices -o jsonpath='{range .items[*]}{.metadata.name}={.metadata.resourceVersion} {end}'; }
has_allocation() { [ -n "$(k -n "$ns" get resourceclaim "$1" -o jsonpath='{.status.allocation}' 2>/dev/null)" ]; }

# allocate NAME: the claim and its pod; the scheduler's outcome in $fo/scheduler/.
allocate() {
  local name=$1 t0 cond deadline
  t0=$(now)
  k apply -f "$fo/claims/$name.yaml" >/dev/null
  deadline=$(( $(date +%s) + 60 ))
  while [ "$(date +%s)" -lt "$deadline" ]; do
    if has_allocation "$name"; then
      k -n "$ns" get resourceclaim "$name" -o json >"$fo/scheduler/$name.json"
      echo "  $name: allocated by the scheduler $(since "$t0")s after apply: $(jq -r '[.status.allocation.devices.results[] | "\(.request)=\(.device)"] | join(" ")' "$fo/scheduler/$name.json")"
      # A claim of shares: of a shared GPU's capacity (shareID) or of its fallback slots.
      if [ "$(jq '[.status.allocation.devices.results[] | select(.shareID or (.device | test("-slot-[0-9]+$")))] | length' "$fo/scheduler/$name.json")" -gt 0 ]; then
        pinned "$name"
      fi
      return 0
    fi
    cond=$(k -n "$ns" get pod "use-$name" -o jsonpath='{range .status.conditions[?(@.type=="PodScheduled")]}{.status} {.reason} {.message}{end}' 2>/dev/null || true)
    if [[ $cond == "False Unschedulable "*"cannot allocate all claims"* ]]; then
      # Right after a release the scheduler may not have seen the deallocation yet;
      # the claim's update requeues the pod, so a stale "unschedulable" turns into an
      # allocation within a retry. Devices are freed only by releases.
      [ $(( $(date +%s) - last_release )) -lt 15 ] && sleep 3
      if ! has_allocation "$name"; then
        cond=$(k -n "$ns" get pod "use-$name" -o jsonpath='{range .status.conditions[?(@.type=="PodScheduled")]}{.status} {.reason} {.message}{end}' 2>/dev/null || true)
        echo "${cond#False Unschedulable }" >"$fo/scheduler/$name.unschedulable"
        echo "  $name: unschedulable $(since "$t0")s after apply: ${cond#False Unschedulable }"
        k -n "$ns" delete pod "use-$name" --wait=true >/dev/null
        return 0
      fi
      continue
    fi
    sleep 0.1
  done
  bad "$name: neither allocated nor unschedulable 60s after apply (PodScheduled: $cond; node: $(node_pressure k))"
  k -n "$ns" get events --field-selector involvedObject.name="use-$name" -o custom-columns=REASON:.reason,MESSAGE:.message 2>/dev/null | sed 's/^/    event: /' >&2
  k -n "$ns" delete pod "use-$name" --wait=true >/dev/null
}

# pinned NAME: the pod of a shared claim starts (the kubelet and containerd ran the
# spec's createContainer hook, tessera-cdi-hook) and, as root in it, cannot rename /etc
# or a directory above Tessera's mounts; /etc/ld.so.preload names the front.
pinned() {
  local name=$1 i phase out want
  for i in $(seq 600); do
    phase=$(k -n "$ns" get pod "use-$name" -o jsonpath='{.status.phase}' 2>/dev/null || true)
    [ "$phase" = Running ] && break
    sleep 0.1
  done
  if [ "$phase" != Running ]; then
    bad "$name: the pod of a shared claim is not Running 60s after its allocation (phase '$phase')"
    k -n "$ns" get events --field-selector involvedObject.name="use-$name" -o custom-columns=REASON:.reason,MESSAGE:.message 2>/dev/null | sed 's/^/    event: /' >&2
    return 0
  fi
  out=$(exec_retry k -n "$ns" exec "use-$name" -- sh -c 'for d in /etc /usr /usr/local /usr/local/tessera; do if mv $d $d.x 2>/dev/null; then echo "renamed $d"; else echo "refused $d"; fi; done; head -1 /etc/ld.so.preload' 2>&1 || true)
  want=$(printf 'refused %s\n' /etc /usr /usr/local /usr/local/tessera; echo /usr/local/tessera/lib/libtessera_preload.so)
  if [ "$out" = "$want" ]; then
    pass "$name: its pod is Running; /etc, /usr, /usr/local, /usr/local/tessera cannot be renamed in it (the CDI hook ran)"
    pinned_pods=$((pinned_pods + 1))
  else
    bad "$name: in its pod: $(tr '\n' ';' <<<"$out")"
  fi
}

# release NAME...: delete the pods; the controller removes the allocations.
release() {
  local name t0 i
  t0=$(now)
  for name in "$@"; do
    k -n "$ns" delete pod "use-$name" --ignore-not-found --wait=true >/dev/null
  done
  for name in "$@"; do
    for i in $(seq 600); do has_allocation "$name" || break; sleep 0.1; done
    if has_allocation "$name"; then
      bad "release $name: still allocated 60s after its pod's deletion"
    fi
  done
  last_release=$(date +%s)
  echo "  released $*: pods deleted, allocations removed $(since "$t0")s after"
}

# ---------- the plugin's node config (node-config.sh) ----------
"$here/node-config.sh" "$DIR" save "$OUT/node-config.installed.yaml"
"$here/node-config.sh" "$DIR" mock-node "$OUT/node-config.mock-node.yaml"
# use_node_config FILE: the plugin runs with FILE (and DIR/tessera/env names its pod).
use_node_config() {
  "$here/node-config.sh" "$DIR" use "$1" || return 1
  . "$DIR/tessera/env"
}
switched=0
restore() {
  if [ "$switched" = 1 ]; then
    echo "--- restoring the installed node config"
    switched=0
    use_node_config "$OUT/node-config.installed.yaml" || { echo "scenario plan agreement: FAILED to restore the installed node config" >&2; exit 1; }
  fi
}
trap restore EXIT

# run_file CONFIG FILE: one claims file, scheduler and plan, into the table.
run_file() {
  local config=$1 file=$2 base fo tf before after uids left plan i uid
  base=$(basename "$file" .yaml)
  ns=agree-$base
  fo=$OUT/$config/$base
  mkdir -p "$fo/claims" "$fo/scheduler"
  tf=$(now)
  echo "--- $config: $file (namespace $ns)"
  k create namespace "$ns" >/dev/null
  default_sa "$ns" || true
  k get resourceslices -o json >"$fo/slices.json"
  k get deviceclasses -o json >"$fo/deviceclasses.json"
  before=$(slice_versions)
  python3 "$here/plan-agreement.py" steps "$file" "$ns" "$fo/claims" >"$fo/steps"
  while read -r -u 3 op args; do
    # shellcheck disable=SC2086 # args: claim names
    case $op in
      claim) allocate $args ;;
      release) release $args ;;
    esac
  done 3<"$fo/steps"
  k -n "$ns" get pods -o custom-columns='POD:.metadata.name,PHASE:.status.phase' --no-headers | sed 's/^/  pod /'

  # ---------- cleanup: namespace gone, claims unprepared ----------
  uids=$(k -n "$ns" get resourceclaims -o jsonpath='{.items[*].metadata.uid}')
  k delete namespace "$ns" --wait=true --timeout=120s >/dev/null
  for i in $(seq 300); do
    left=""
    for uid in $uids; do
      if grep -qs "$uid" "$DIR"/tessera-node/state/checkpoint.json || compgen -G "$CDI_DIR/*$uid*" >/dev/null; then left="$left $uid"; fi
    done
    [ -z "$left" ] && break
    sleep 0.2
  done
  [ -z "$left" ] || bad "claims still prepared on the node 60s after the namespace's deletion:$left"
  after=$(slice_versions)
  [ "$before" = "$after" ] || bad "the ResourceSlices changed while the file ran (plan had the ones of its start): $before -> $after"

  # ---------- tessera plan, and the comparison ----------
  plan=("$tessera" plan --slices "$fo/slices.json" --classes "$fo/deviceclasses.json" --k8s-version "1.$K8S_MINOR" --gates "$GATES")
  "${plan[@]}" -o yaml "$file" >"$fo/plan.yaml" 2>"$fo/plan.err" || { cat "$fo/plan.err" >&2; bad "tessera plan"; return; }
  "${plan[@]}" -o table "$file" >"$fo/plan.txt" 2>&1 || true
  if python3 "$here/plan-agreement.py" compare "$file" "$fo/scheduler" "$fo/plan.yaml" "$table" "$config"; then
    echo "  $config/$base: scheduler and plan agree ($(since "$tf")s)"
  else
    bad "$config/$base: scheduler and plan disagree (plan: $fo/plan.txt; scheduler: $fo/scheduler/)"
  fi
}

for config in installed mock-node; do
  if [ "$config" = mock-node ]; then
    echo "--- node config mock-node: the simulated node's own config ($OUT/node-config.mock-node.yaml)"
    switched=1
    use_node_config "$OUT/node-config.mock-node.yaml" || { bad "the plugin did not take the mock-node config"; break; }
  else
    echo "--- node config installed: the ConfigMap as installed ($OUT/node-config.installed.yaml)"
  fi
  for file in "$repo"/examples/claims/*.yaml; do run_file "$config" "$file"; done
done
restore

echo "agreement table ($K8S_VERSION; gates $GATES):"
python3 "$here/plan-agreement.py" table "$table"
echo "pods of shared claims checked for the CDI hook's pinned directories: $pinned_pods"
[ "$pinned_pods" -gt 0 ] || bad "no pod of a shared claim was checked"
echo "TIME_PLAN_AGREEMENT=$(since "$T0")" >"$OUT/times"
if [ "$errors" -gt 0 ]; then
  echo "scenario plan agreement ($K8S_VERSION): $errors failure(s) ($(since "$T0")s)" >&2
  exit 1
fi
echo "scenario plan agreement ($K8S_VERSION): passed, every claim of examples/claims/ allocated as tessera plan says ($(since "$T0")s)"
