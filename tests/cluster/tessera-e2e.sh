#!/usr/bin/env bash
# One release, end to end: up.sh, tessera-up.sh (install), the scenarios, down.sh --
# the cluster is stopped whatever happens (set TESSERA_CLUSTER_KEEP=1 to leave it up
# for inspection after a failure). Exit status: non-zero if any step failed.
# Usage (root): tessera-e2e.sh VERSION [DIR]      e.g. tessera-e2e.sh 1.34
# Needs the release artifacts: nice -n 19 cargo build --release -p tessera -p tessera-cuda
set -uo pipefail
here=$(cd "$(dirname "$0")" && pwd)
. "$here/lib.sh"
version=${1:?usage: tessera-e2e.sh VERSION [DIR]}
DIR=${2:-$(mktemp -d /tmp/tessera-e2e.XXXXXX)}
mkdir -p "$DIR"
DIR=$(cd "$DIR" && pwd)
status=0
stop() {
  if [ "$status" != 0 ] && [ "${TESSERA_CLUSTER_KEEP:-}" = 1 ]; then
    echo "left running for inspection: $here/down.sh $DIR" >&2
    return
  fi
  [ -d "$DIR/pids" ] && "$here/down.sh" "$DIR" >"$DIR/down.log" 2>&1
  tail -2 "$DIR/down.log" 2>/dev/null
}
trap stop EXIT
trap 'status=130; exit 130' INT TERM
step() { # step NAME CMD...
  echo "=== $1"
  "${@:2}" || { echo "=== $1: FAILED" >&2; status=1; return 1; }
}
step "up.sh $version" "$here/up.sh" "$version" "$DIR" || exit 1
echo "=== install tessera"
"$here/tessera-up.sh" "$DIR"
case $? in
  0) ;;
  2) echo "=== install tessera: FAILED (not registered with the kubelet; the scenarios run anyway)" >&2; status=1 ;;
  *) echo "=== install tessera: FAILED" >&2; status=1; exit 1 ;;
esac
step "scenario inventory" "$here/scenario-inventory.sh" "$DIR"
step "scenario one-gpu" "$here/scenario-one-gpu.sh" "$DIR"
step "scenario inventory after one-gpu" "$here/scenario-inventory.sh" "$DIR"
step "scenario plan agreement" "$here/scenario-plan-agreement.sh" "$DIR"
[ "$status" = 0 ] && echo "=== $version: all passed ($DIR)" || echo "=== $version: FAILED ($DIR)" >&2
exit "$status"
