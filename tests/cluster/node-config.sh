#!/usr/bin/env bash
# Switches the plugin of a cluster of tessera-up.sh to another node config, and waits
# until it holds: the node-config ConfigMap gets FILE, the plugin pod is replaced, the
# new pod registers with the kubelet and the stored ResourceSlices equal what
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
. "$DIR/env"
. "$DIR/tessera/env"
export KUBECONFIG
k() { "$K8S_BIN/kubectl" "$@" </dev/null; }
cmd=${2:?usage: node-config.sh DIR save|mock-node|use FILE}
file=${3:?usage: node-config.sh DIR save|mock-node|use FILE}
cm=$(k -n tessera-system get ds tessera-plugin -o jsonpath='{.spec.template.spec.volumes[?(@.name=="node-config")].configMap.name}')
[ -n "$cm" ] || { echo "no node-config ConfigMap in the DaemonSet" >&2; exit 1; }
case $cmd in
  save)
    k -n tessera-system get configmap "$cm" -o json | jq -r '.data["node-config.yaml"]' >"$file"
    exit 0 ;;
  mock-node)
    python3 -c 'import sys, yaml; yaml.safe_dump(yaml.safe_load(open(sys.argv[1]))["config"], sys.stdout, sort_keys=False)' \
      "$repo/deploy/overlays/test-cluster/mock-node.yaml" >"$file"
    exit 0 ;;
  use) ;;
  *) echo "node-config.sh: unknown command $cmd" >&2; exit 2 ;;
esac
file=$(realpath "$file")
work=$DIR/tessera/node-config
mkdir -p "$work"
minor=$(cut -d. -f2 <<<"$K8S_VERSION")
gates=$(cat "$DIR/feature-gates")
plog() { k -n tessera-system logs "$1" 2>&1 | sed 's/\x1b\[[0-9;]*m//g'; }
t0=$(now)
k -n tessera-system create configmap "$cm" --from-file=node-config.yaml="$file" --dry-run=client -o yaml >"$work/configmap.yaml"
k apply -f "$work/configmap.yaml" >/dev/null
k -n tessera-system delete pod "$TESSERA_POD" --wait=true >/dev/null
k -n tessera-system rollout status ds/tessera-plugin --timeout=120s >/dev/null
pod=$(k -n tessera-system get pods -l app.kubernetes.io/name=tessera -o jsonpath='{.items[0].metadata.name}')
[ -n "$pod" ] && [ "$pod" != "$TESSERA_POD" ] || { echo "  FAIL no new plugin pod" >&2; exit 1; }
sed -i "s/^TESSERA_POD=.*/TESSERA_POD=$pod/" "$DIR/tessera/env"
for i in $(seq 150); do plog "$pod" | grep "registered with the kubelet" >/dev/null && break; sleep 0.2; done
plog "$pod" | grep "registered with the kubelet" >/dev/null || { echo "  FAIL $pod did not register with the kubelet" >&2; exit 1; }
exec_retry k -n tessera-system exec "$pod" -c plugin -- tessera inventory --backend mock:/etc/tessera-mock/mock-node.yaml \
  --k8s-version "1.$minor" --gates "$gates" -o json >"$work/inventory.raw"
jq '.items[].spec.pool.generation = 0' "$work/inventory.raw" >"$work/inventory.json"
node_uid=$(k get node "$NODE_NAME" -o jsonpath='{.metadata.uid}')
deadline=$(( $(date +%s) + 60 ))
while :; do
  k get resourceslices -o json | jq '.items[].spec.pool.generation = 0' >"$work/stored.json"
  python3 "$here/compare-slices.py" "$work/inventory.json" "$work/stored.json" gpu.tessera.dev "$NODE_NAME" "$node_uid" >"$work/compare-slices.out" 2>&1 && break
  if [ "$(date +%s)" -ge "$deadline" ]; then
    sed 's/^/  /' "$work/compare-slices.out" >&2
    echo "  FAIL the stored slices are not $pod's inventory 60s after its start" >&2
    exit 1
  fi
  sleep 0.2
done
echo "  plugin $pod with node config $file: registered, slices stored ($(since "$t0")s)"
