#!/usr/bin/env bash
# Scenario: `tessera inventory` for the node equals the ResourceSlices the real API
# server stores, modulo server-set fields (compare-slices.py). inventory runs in the
# plugin's own container (same binary, mock node file, node config, state dir and node
# name) for this release and the cluster's feature gates. Also: the DeviceClasses as
# applied (tessera-up.sh's rendering) equal their stored specs (no field dropped or
# defaulted by the server).
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
status=0
if ! python3 "$here/compare-slices.py" "$OUT/inventory.json" "$OUT/stored.json" gpu.tessera.dev "$NODE_NAME" "$node_uid"; then
  echo "  FAIL inventory differs from the stored slices (inventory: $OUT/inventory.json, stored: $OUT/stored.json)" >&2
  status=1
fi
k get deviceclasses -o json >"$OUT/deviceclasses.json"
python3 - "$DIR/tessera/rendered.yaml" "$OUT/deviceclasses.json" <<'EOF' || status=1
import json, sys, yaml
applied = {d["metadata"]["name"]: d["spec"] for d in yaml.safe_load_all(open(sys.argv[1])) if d and d["kind"] == "DeviceClass"}
stored = {d["metadata"]["name"]: d["spec"] for d in json.load(open(sys.argv[2]))["items"]}
bad = 0
for name, spec in sorted(applied.items()):
    if stored.get(name) == spec:
        print(f"  ok   DeviceClass {name}: stored spec equals the applied one")
    else:
        bad += 1
        print(f"  FAIL DeviceClass {name}: applied {json.dumps(spec, sort_keys=True)}\n       stored  {json.dumps(stored.get(name), sort_keys=True)}")
sys.exit(1 if bad else 0)
EOF
if [ "$status" = 0 ]; then
  echo "scenario inventory ($K8S_VERSION): passed (inventory equals the stored slices; DeviceClasses stored as applied)"
else
  echo "scenario inventory ($K8S_VERSION): FAILED" >&2
  exit 1
fi
