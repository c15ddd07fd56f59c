#!/usr/bin/env bash
# One release, end to end: up.sh, tessera-up.sh (install), the scenarios, down.sh --
# the cluster is stopped whatever happens (set TESSERA_CLUSTER_KEEP=1 to leave it up
# for inspection after a failure). Exit status: non-zero if any step failed.
# Usage (root): tessera-e2e.sh VERSION [DIR]      e.g. tessera-e2e.sh 1.34
# Needs the release artifacts: nice -n 19 cargo build --release -p tessera -p tessera-interpose -p tessera-cdi-hook && cargo preload --release
set -uo pipefail
here=$(cd "$(dirname "$0")" && pwd)
. "$here/lib.sh"
version=${1:?usage: tessera-e2e.sh VERSION [DIR]}
DIR=${2:-$(mktemp -d /tmp/tessera-e2e.XXXXXX)}
mkdir -p "$DIR"
DIR=$(cd "$DIR" && pwd)
status=0
trap e2e_stop EXIT
trap 'status=130; exit 130' INT TERM
e2e_step "up.sh $version" "$here/up.sh" "$version" "$DIR" || exit 1
echo "=== install tessera"
"$here/tessera-up.sh" "$DIR"
case $? in
  0) ;;
  2) echo "=== install tessera: FAILED (not registered with the kubelet; the scenarios run anyway)" >&2; status=1 ;;
  *) echo "=== install tessera: FAILED" >&2; status=1; exit 1 ;;
esac
e2e_step "scenario inventory" "$here/scenario-inventory.sh" "$DIR"
e2e_step "scenario one-gpu" "$here/scenario-one-gpu.sh" "$DIR"
e2e_step "scenario inventory after one-gpu" "$here/scenario-inventory.sh" "$DIR"
e2e_step "scenario workloads" python3 "$here/scenario-workloads.py" "$DIR"
e2e_step "scenario rules" python3 "$here/scenario-rules.py" "$DIR"
e2e_step "scenario workload claims" python3 "$here/scenario-workload-claims.py" "$DIR"
e2e_step "scenario plan agreement" "$here/scenario-plan-agreement.sh" "$DIR"
# Every LIST and WATCH the real plugin made (publisher, watchdog, claim GETs, doctor)
# scoped to its node, from the API server's audit log of its ServiceAccount (#44).
e2e_step "the plugin's API calls, each scoped to its node" python3 "$here/scale/api-calls.py" "$DIR"
# TESSERA_E2E_BENCH=quick|full: the pod start-up benchmark too (tests/real_cluster.rs
# asks for the quick mode on the newest release, so that it cannot rot).
case ${TESSERA_E2E_BENCH:-} in
  quick) e2e_step "bench start-up (quick)" python3 "$here/bench-startup.py" "$DIR" --quick ;;
  full) e2e_step "bench start-up" python3 "$here/bench-startup.py" "$DIR" ;;
esac
[ "$status" = 0 ] && echo "=== $version: all passed ($DIR)" || echo "=== $version: FAILED ($DIR)" >&2
exit "$status"
