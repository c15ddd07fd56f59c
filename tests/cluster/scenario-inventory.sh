#!/usr/bin/env bash
# Scenario: `tessera inventory` for the node equals the ResourceSlices the real API
# server stores, modulo server-set fields (compare-slices.py). inventory runs in the
# plugin's own container (same binary, mock node file, node config, state dir and node
# name) for this release and the cluster's feature gates.
# Usage (root): scenario-inventory.sh DIR
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
. "$here/lib.sh"
DIR=$(cd "${1:?usage: scenario-inventory.sh DIR}" && pwd)
. "$DIR/env"
. "$DIR/tessera/env"
export KUBECONFIG
k() { "$K8S_BIN/kubectl" "$@"; }
OUT=$DIR/tessera/inventory
mkdir -p "$OUT"
minor=$(cut -d. -f2 <<<"$K8S_VERSION")
gates=$(cat "$DIR/feature-gates")
echo "scenario inventory ($K8S_VERSION): tessera inventory --k8s-version 1.$minor --gates $gates"
k -n tessera-system exec "$TESSERA_POD" -c plugin -- tessera inventory \
  --backend mock:/etc/tessera-mock/mock-node.yaml --k8s-version "1.$minor" --gates "$gates" -o json \
  >"$OUT/inventory.json" 2>"$OUT/inventory.err" || { cat "$OUT/inventory.err" >&2; echo "tessera inventory failed" >&2; exit 1; }
k get resourceslices -o json >"$OUT/stored.json"
node_uid=$(k get node "$NODE_NAME" -o jsonpath='{.metadata.uid}')
if python3 "$here/compare-slices.py" "$OUT/inventory.json" "$OUT/stored.json" gpu.tessera.dev "$NODE_NAME" "$node_uid"; then
  echo "scenario inventory ($K8S_VERSION): passed (inventory equals the stored slices)"
else
  echo "scenario inventory ($K8S_VERSION): FAILED (inventory: $OUT/inventory.json, stored: $OUT/stored.json)" >&2
  exit 1
fi
