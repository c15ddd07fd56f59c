#!/usr/bin/env bash
# Switches the plugin of a cluster of tessera-up.sh to another node config, and waits
# until it holds: the node-config ConfigMap gets FILE, the plugin pod is replaced, the
# new pod is Ready (lib.sh plugin_pod_ready), registers with the kubelet and the stored ResourceSlices equal what
# `tessera inventory` prints in it (compare-slices.py; the pool generation, the plugin's
# counter of updates, is not compared). DIR/tessera/env gets the new pod's name.
# Usage (root): node-config.sh DIR save OUT      the installed config into OUT
#               node-config.sh DIR mock-node OUT the simulated node's own `config:` into OUT
#               node-config.sh DIR use FILE      switch to FILE
# Used by scenario-plan-agreement.sh and scenario-workloads.py (the examples are planned
# against the simulated node's own config: gpu-1 `shared`).
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
. "$here/lib.sh"
repo=$(cd "$here/../.." && pwd)
DIR=$(cd "${1:?usage: node-config.sh DIR save|mock-node|use FILE}" && pwd)
cluster_env tessera
# No kubectl here reads stdin (this runs under Python's subprocess and in loops).
exec </dev/null
cmd=${2:?usage: node-config.sh DIR save|mock-node|use FILE}
file=${3:?usage: node-config.sh DIR save|mock-node|use FILE}
cm=$(k -n tessera-system get ds tessera-plugin -o jsonpath='{.spec.template.spec.volumes[?(@.name=="node-config")].configMap.name}')
[ -n "$cm" ] || { echo "no node-config ConfigMap in the DaemonSet" >&2; exit 1; }
case $cmd in
  save)
    k -n tessera-system get configmap "$cm" -o json | jq -r '.data["node-config.yaml"]' >"$file"
    exit 0 ;;
  mock-node)
    # On NVIDIA's model (mock-node-root.sh) the same config, its GPUs past the mock
    # node's four `exclusive`: the examples' `# expect:` lines are planned against one
    # `mig` GPU (gpu-0), and the scheduler would otherwise take a MIG partition of
    # gpu-7 (the model's default mode for them is `mig`).
    python3 - "$repo/deploy/overlays/test-cluster/mock-node.yaml" "$DIR/tessera-node/node.json" >"$file" <<'PY'
import json, sys, yaml
config = yaml.safe_load(open(sys.argv[1]))["config"]
mine = {g["match"]["minor"] for g in config["gpus"]}
config["gpus"] += [{"match": {"minor": g["minor"]}, "mode": "exclusive"}
                   for g in json.load(open(sys.argv[2]))["gpus"] if g["minor"] not in mine]
yaml.safe_dump(config, sys.stdout, sort_keys=False)
PY
    exit 0 ;;
  use) ;;
  *) echo "node-config.sh: unknown command $cmd" >&2; exit 2 ;;
esac
file=$(realpath "$file")
work=$DIR/tessera/node-config
mkdir -p "$work"
t0=$(now)
k -n tessera-system create configmap "$cm" --from-file=node-config.yaml="$file" --dry-run=client -o yaml >"$work/configmap.yaml"
k apply -f "$work/configmap.yaml" >/dev/null
k -n tessera-system delete pod "$TESSERA_POD" --wait=true >/dev/null
pod=$(plugin_pod_ready "$TESSERA_POD") || die "no new plugin pod Ready"
sed -i "s/^TESSERA_POD=.*/TESSERA_POD=$pod/" "$DIR/tessera/env"
plugin_registered "$pod" || die "$pod did not register with the kubelet"
tessera_inventory "$pod" >"$work/inventory.raw"
jq '.items[].spec.pool.generation = 0' "$work/inventory.raw" >"$work/inventory.json"
deadline=$(( $(date +%s) + 60 ))
while :; do
  k get resourceslices -o json | jq '.items[].spec.pool.generation = 0' >"$work/stored.json"
  compare_slices "$work/inventory.json" "$work/stored.json" >"$work/compare-slices.out" 2>&1 && break
  if [ "$(date +%s)" -ge "$deadline" ]; then
    sed 's/^/  /' "$work/compare-slices.out" >&2
    die "the stored slices are not $pod's inventory 60s after its start"
  fi
  sleep 0.2
done
echo "  plugin $pod with node config $file: registered, slices stored ($(since "$t0")s)"
