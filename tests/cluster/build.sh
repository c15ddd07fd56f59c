#!/usr/bin/env bash
# Builds kube-apiserver, kube-controller-manager, kube-scheduler, kubelet and kubectl of
# one pinned Kubernetes release from its Go modules (k8s/v1.<minor>/go.mod), as one
# multiplexing binary `hyperkube` plus a symlink per component, into
# <repo>/target/k8s/<version>-<key>/ (the key: a hash of the build's inputs, lib.sh
# resolve_version). Skips the build when that directory is complete, and waits for a
# build of the same release under way (a lock beside the directory).
# Usage: build.sh [--dir] VERSION      VERSION: 1.34 | v1.34 | v1.34.4 (the pinned patch)
#   --dir: print the binaries' directory only, build nothing.
# Env: GO (default: go). TESSERA_BUILD_NICE: the compiler's niceness (default 19: a
# developer's machine is shared; CI's builds are its critical path and run at 0).
set -euo pipefail
print_dir=""
[ "${1:-}" = --dir ] && { print_dir=1; shift; }
arg=${1:?usage: build.sh [--dir] VERSION (e.g. 1.34 or v1.37.2)}
here=$(cd "$(dirname "$0")" && pwd)
. "$here/lib.sh"
resolve_version "$arg"
mod=$K8S_MOD version=$K8S_VERSION minor=$K8S_MINOR out=$K8S_BIN
components="kube-apiserver kube-controller-manager kube-scheduler kubelet kubectl"
[ -z "$print_dir" ] || { echo "$out"; exit 0; }
if [ -f "$out/.complete" ]; then
  echo "k8s $version: cached in $out"
  exit 0
fi
# One build of a release at a time: a second caller (a test, while CI's background build
# of the same release is under way) waits for the first and then finds it cached. The
# lock is fd 9, closed for every child (`9>&-`): nothing outlives the script holding it.
mkdir -p "$out"
exec 9>"$out.lock"
if ! flock -n 9; then
  echo "k8s $version: waiting for the build under way ($out.lock)"
  flock 9
fi
if [ -f "$out/.complete" ]; then
  echo "k8s $version: cached in $out"
  exit 0
fi
GO=${GO:-go}
start=$(date +%s)
# What hack/lib/version.sh stamps (the module zip has no git commit), so the binaries
# report their release (Node status, /version, skew checks). The build date is the
# release's publication time from the module proxy, for reproducible binaries.
date=$(cd "$mod" && "$GO" mod download -json "k8s.io/kubernetes@$version" 9>&- | sed -n 's/^\t"Info": "\(.*\)",$/\1/p' | xargs sed -n 's/.*"Time":"\([^"]*\)".*/\1/p')
ldx=""
for pkg in k8s.io/client-go/pkg/version k8s.io/component-base/version; do
  ldx+=" -X '$pkg.gitVersion=$version' -X '$pkg.gitMajor=1' -X '$pkg.gitMinor=$minor'"
  ldx+=" -X '$pkg.gitTreeState=clean' -X '$pkg.buildDate=${date:-1970-01-01T00:00:00Z}'"
done
echo "k8s $version: building hyperkube ($components) with $("$GO" version 9>&- | cut -d' ' -f3) into $out"
# As upstream's release builds (hack/lib/golang.sh): static (CGO off, as for every server
# binary but the kubelet, which works without cgo too), -trimpath, -s -w, tags
# selinux,notest,grpcnotrace. No DWARF from the compiler either (-dwarf=false): the
# link strips it (-w) anyway, and generating it is compile time for nothing.
(cd "$mod" && CGO_ENABLED=0 nice -n "${TESSERA_BUILD_NICE:-19}" "$GO" build -trimpath \
  -tags selinux,notest,grpcnotrace -gcflags=all=-dwarf=false -ldflags "-s -w$ldx" -o "$out/hyperkube.tmp" . 9>&-)
mv "$out/hyperkube.tmp" "$out/hyperkube"
for c in $components; do ln -sfn hyperkube "$out/$c"; done
"$out/kubectl" version --client >/dev/null 9>&-
touch "$out/.complete"
echo "k8s $version: built in $(( $(date +%s) - start ))s ($(du -m "$out/hyperkube" | cut -f1) MB)"
