#!/usr/bin/env bash
# Builds the `helm` CLI of one pinned Helm 3 release from its Go module
# (helm.sh/helm/v3/cmd/helm, pinned by the `tool` line and require of ./go.mod) into
# <repo>/target/helm/<version>-<key>/helm, as the harness builds Kubernetes (../build.sh):
# from the module proxy, never a prebuilt binary. The key hashes the build's inputs
# (go.mod, go.sum, this script, `go version`; ../lib.sh build_key), so a binary built
# from others is never used from a target/ kept between CI runs. Skips the build when
# the binary is there, and waits for a build under way (a lock beside its directory).
# Prints the path of the binary on the last line of stdout; the build time on stderr.
# Why: the chart (deploy/helm/tessera) is linted, rendered and installed by this helm in
# tests/helm_chart.rs and tests/cluster/scenario-helm.sh.
# Usage: build.sh [--path]   --path: print the binary's path only, build nothing.
# Env: GO (default: go); TESSERA_BUILD_NICE, the compiler's
# niceness (default 19; CI: 0).
# To bump: go get -tool helm.sh/helm/v3/cmd/helm@vX.Y.Z in this directory, then go mod tidy.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
repo=$(cd "$here/../../.." && pwd)
GO=${GO:-go}
version=$(sed -n 's/^\thelm\.sh\/helm\/v3 \(v[0-9.]*\)\( \/\/ indirect\)\?$/\1/p' "$here/go.mod")
[ -n "$version" ] || { echo "no helm.sh/helm/v3 require in $here/go.mod" >&2; exit 1; }
. "$here/../lib.sh"
key=$(build_key "$here/go.mod" "$here/go.sum" "$0")
out=$repo/target/helm/$version-$key
# --path: where the binary is (or would be), without building it.
if [ "${1:-}" = --path ]; then
  echo "$out/helm"
  exit 0
fi
if [ -x "$out/helm" ]; then
  echo "helm $version: cached in $out" >&2
  echo "$out/helm"
  exit 0
fi
# One build at a time: a second caller waits for the first and then finds it cached. The
# lock is fd 9, closed for every child (`9>&-`): nothing outlives the script holding it.
mkdir -p "$out"
exec 9>"$out.lock"
if ! flock -n 9; then
  echo "helm $version: waiting for the build under way ($out.lock)" >&2
  flock 9
fi
if [ -x "$out/helm" ]; then
  echo "helm $version: cached in $out" >&2
  echo "$out/helm"
  exit 0
fi
start=$(date +%s)
# The stamps helm's Makefile sets (the module zip has no git metadata: no commit, tree
# state "clean"), and the Kubernetes version helm assumes when there is no cluster
# (`helm template`'s .Capabilities.KubeVersion, lint's deprecation check): client-go
# v0.X.Y -> 1.X, computed from the resolved client-go as the Makefile does.
cgo=$(cd "$here" && "$GO" list -m -f '{{.Version}}' k8s.io/client-go 9>&-)
[[ $cgo =~ ^v0\.([0-9]+)\. ]] || { echo "unexpected k8s.io/client-go version $cgo" >&2; exit 1; }
kmin=${BASH_REMATCH[1]}
ld="-w -s -X helm.sh/helm/v3/internal/version.version=$version"
ld+=" -X helm.sh/helm/v3/internal/version.metadata= -X helm.sh/helm/v3/internal/version.gitTreeState=clean"
for p in helm.sh/helm/v3/pkg/lint/rules helm.sh/helm/v3/pkg/chartutil; do
  ld+=" -X $p.k8sVersionMajor=1 -X $p.k8sVersionMinor=$kmin"
done
echo "helm $version: building with $("$GO" version 9>&- | cut -d' ' -f3) (client-go $cgo) into $out" >&2
# No DWARF from the compiler (-dwarf=false): the link strips it (-w) anyway.
(cd "$here" && CGO_ENABLED=0 nice -n "${TESSERA_BUILD_NICE:-19}" "$GO" build -trimpath -gcflags=all=-dwarf=false -ldflags "$ld" \
  -o "$out/helm.tmp" helm.sh/helm/v3/cmd/helm 9>&-)
mv "$out/helm.tmp" "$out/helm"
"$out/helm" version --short >&2 9>&-
echo "helm $version: built in $(( $(date +%s) - start ))s ($(du -m "$out/helm" | cut -f1) MB)" >&2
echo "$out/helm"
