#!/usr/bin/env bash
# One release, end to end with Helm: up.sh, scenario-helm.sh (server-side dry runs, helm
# install with the mock backend, scenario-one-gpu.sh and scenario-inventory.sh on that
# install, helm upgrade under load, helm uninstall), down.sh -- the cluster is stopped
# whatever happens (TESSERA_CLUSTER_KEEP=1 leaves a failed run's cluster up).
# Why a sibling of tessera-e2e.sh rather than a step of it: the chart and the kustomize
# install own the same objects (names, DeviceClasses, policies), so the Helm scenario
# needs a cluster without the kustomize install; a fresh cluster (about 10 s) is simpler
# and more faithful than uninstalling one first.
# Usage (root): tessera-helm-e2e.sh VERSION [DIR]      e.g. tessera-helm-e2e.sh 1.37 /tmp/h137
# Needs the release artifacts (nice -n 19 cargo build --release -p tessera -p tessera-interpose -p tessera-cdi-hook && cargo preload --release);
# builds helm (helm/build.sh) when it is not cached.
set -uo pipefail
here=$(cd "$(dirname "$0")" && pwd)
. "$here/lib.sh"
version=${1:?usage: tessera-helm-e2e.sh VERSION [DIR]}
DIR=${2:-$(mktemp -d /tmp/tessera-helm.XXXXXX)}
mkdir -p "$DIR"
DIR=$(cd "$DIR" && pwd)
status=0
trap e2e_stop EXIT
trap 'status=130; exit 130' INT TERM
e2e_step "helm (tests/cluster/helm/build.sh)" "$here/helm/build.sh" || exit 1
e2e_step "up.sh $version" "$here/up.sh" "$version" "$DIR" || exit 1
e2e_step "scenario helm" "$here/scenario-helm.sh" "$DIR"
[ "$status" = 0 ] && echo "=== $version (helm): all passed ($DIR)" || echo "=== $version (helm): FAILED ($DIR)" >&2
exit "$status"
