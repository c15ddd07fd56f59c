#!/usr/bin/env bash
# Tessera at cluster scale (issue #44): N simulated GPU nodes against the real etcd,
# kube-apiserver, controller-manager and scheduler, with no kubelet and no containerd
# (up.sh with TESSERA_CLUSTER_NODELESS=1). `tessera-scale` (testkit, dev-only) registers
# the nodes and keeps their Leases renewed, runs Tessera's own publisher for each node
# under the plugin's identity and RBAC, and prints the figures; it fails only on hard
# properties (every node's slices present, no write at steady state, at most one write
# per slice of a changed pool in a restart storm). The cluster is stopped at the end, always
# (TESSERA_CLUSTER_KEEP=1 keeps a failed run's).
# Usage (root): scale/run.sh VERSION DIR [tessera-scale args: --nodes N --fill F ...]
# Env: TESSERA_SCALE_BIN: the binary (default target/release/tessera-scale, CI's build at
#   opt-level 1; for figures, `cargo build --profile scale -p tessera-scale` and
#   TESSERA_SCALE_BIN=target/scale/tessera-scale: optimized as the plugin is).
set -euo pipefail
here=$(cd "$(dirname "$0")/.." && pwd)
repo=$(cd "$here/../.." && pwd)
. "$here/lib.sh"
[ $# -ge 2 ] || { echo "usage: scale/run.sh VERSION DIR [tessera-scale args]" >&2; exit 2; }
version=$1 dir=$2
shift 2
bin=${TESSERA_SCALE_BIN:-$repo/target/release/tessera-scale}
[ -x "$bin" ] || { echo "no $bin (cargo build --release --bin tessera-scale)" >&2; exit 1; }
echo "tessera-scale: $bin"
t0=$(now)
stop() {
  local rc=$?
  if [ "$rc" != 0 ] && [ "${TESSERA_CLUSTER_KEEP:-}" = 1 ]; then
    echo "failed ($rc); cluster kept: $here/down.sh $dir" >&2
  elif [ -d "$dir/pids" ]; then
    "$here/down.sh" "$dir" >/dev/null || true
  fi
  exit "$rc"
}
trap stop EXIT
TESSERA_CLUSTER_NODELESS=1 "$here/up.sh" "$version" "$dir"
# shellcheck disable=SC1091
. "$dir/env"
kubectl=("$K8S_BIN/kubectl" --kubeconfig "$dir/kubeconfig")
# The plugins' identity: the DaemonSet's ServiceAccount as the API server sees it
# (user system:serviceaccount:tessera-system:tessera-plugin in group
# system:serviceaccounts: the same RBAC and API priority and fairness flow), from a
# client certificate of the cluster's CA instead of a token.
mkdir -p "$dir/scale"
P=$dir/pki S=$dir/scale
openssl ecparam -name prime256v1 -genkey -noout -out "$S/plugin.key" 2>>"$dir/logs/openssl.log"
openssl req -new -key "$S/plugin.key" -subj "/O=system:serviceaccounts/O=system:serviceaccounts:tessera-system/CN=system:serviceaccount:tessera-system:tessera-plugin" \
  -config "$P/openssl.cnf" -out "$S/plugin.csr" 2>>"$dir/logs/openssl.log"
openssl x509 -req -in "$S/plugin.csr" -CA "$P/ca.crt" -CAkey "$P/ca.key" -CAcreateserial -days 2 \
  -extfile "$P/openssl.cnf" -extensions client -out "$S/plugin.crt" 2>>"$dir/logs/openssl.log"
sed -e "s|$P/admin.crt|$S/plugin.crt|; s|$P/admin.key|$S/plugin.key|; s|name: admin|name: plugin|; s|user: admin|user: plugin|" \
  "$dir/kubeconfig" >"$S/plugin.kubeconfig"
"${kubectl[@]}" apply -f "$repo/deploy/base/namespace.yaml" -f "$repo/deploy/base/rbac.yaml" >/dev/null
echo "control plane ready for the simulated nodes after $(since "$t0")s"
"$bin" --cluster-dir "$dir" "$@"
# The publishers' calls, from the audit log: every LIST and WATCH scoped to the node.
python3 "$here/scale/api-calls.py" "$dir"
# With --sample: `tessera plan` on the same slices and the sampled claims (its time and
# its agreement with the scheduler; printed, not a hard property).
if [ -s "$dir/scale/plan/claims.yaml" ] && [ -x "$repo/target/release/tessera" ]; then
  pd=$dir/scale/plan tp=$(now)
  "$repo/target/release/tessera" plan --slices "$pd/slices.json" --k8s-version "1.${K8S_VERSION#v1.}" \
    --gates "$(cat "$dir/feature-gates")" -o yaml "$pd/claims.yaml" >"$pd/plan.yaml" 2>"$pd/plan.err" || cat "$pd/plan.err" >&2
  echo "tessera plan: $(grep -c '^kind: ResourceClaim' "$pd/plan.yaml" || true) claims on $(du -h "$pd/slices.json" | cut -f1) of slices in $(since "$tp")s"
  python3 "$here/scale/plan-sample.py" "$pd" "$pd/plan.yaml" || true
fi
echo "scale run done in $(since "$t0")s (cluster start and stop included)"
