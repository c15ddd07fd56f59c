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
cluster_env tessera
OUT=$DIR/tessera/inventory
mkdir -p "$OUT"
echo "scenario inventory ($K8S_VERSION): tessera inventory --k8s-version 1.$K8S_MINOR --gates $GATES"
tessera_inventory "$TESSERA_POD" >"$OUT/inventory.json" 2>"$OUT/inventory.err" ||
  { cat "$OUT/inventory.err" >&2; die "tessera inventory failed"; }
k get resourceslices -o json >"$OUT/stored.json"
compare_slices "$OUT/inventory.json" "$OUT/stored.json" ||
  bad "inventory differs from the stored slices (inventory: $OUT/inventory.json, stored: $OUT/stored.json)"
k get deviceclasses -o json >"$OUT/deviceclasses.json"
python3 - "$DIR/tessera/rendered.yaml" "$OUT/deviceclasses.json" <<'EOF' || errors=$((errors + 1))   # (its FAIL lines printed)
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
if [ "$errors" = 0 ]; then
  echo "scenario inventory ($K8S_VERSION): passed (inventory equals the stored slices; DeviceClasses stored as applied)"
else
  echo "scenario inventory ($K8S_VERSION): FAILED" >&2
  exit 1
fi
