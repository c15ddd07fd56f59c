#!/bin/sh
# Builds the NVML models into OUTDIR: libnvidia-ml.so.1 (the bridge, a Go c-shared
# library) and nvml-model (the CLI). Skips the build when OUTDIR holds a build of the
# same inputs (every source here, go.mod, go.sum and the Go version). Pinned by go.sum;
# -mod=readonly never changes it. Usage: build.sh OUTDIR
set -eu
[ $# -eq 1 ] || { echo "usage: $0 OUTDIR" >&2; exit 2; }
here=$(cd "$(dirname "$0")" && pwd)
mkdir -p "$1"
out=$(cd "$1" && pwd)
cd "$here"
exec 9>"$out/.build.lock"
flock 9
hash=$( { go version; find . -type f \( -name '*.go' -o -name '*.c' -o -name '*.h' -o -name '*.sh' -o -name go.mod -o -name go.sum \) | LC_ALL=C sort | xargs sha256sum; } | sha256sum | cut -d' ' -f1)
if [ -f "$out/.inputs" ] && [ "$(cat "$out/.inputs")" = "$hash" ] &&
    [ -f "$out/libnvidia-ml.so.1" ] && [ -f "$out/nvml-model" ]; then
    echo "nvml-models: up to date in $out"
    exit 0
fi
rm -f "$out/.inputs"
export GOFLAGS="-mod=readonly -trimpath" CGO_ENABLED=1
# go-nvml's own cgo code calls deprecated NVML functions: a page of warnings otherwise.
export CGO_CFLAGS="${CGO_CFLAGS:--O2 -g} -Wno-deprecated-declarations"
go build -buildmode=c-shared -ldflags=-extldflags=-Wl,-soname,libnvidia-ml.so.1 \
    -o "$out/libnvidia-ml.so.1.tmp" ./bridge
go build -o "$out/nvml-model.tmp" ./cmd/nvml-model
rm -f "$out/libnvidia-ml.so.1.tmp.h"
mv "$out/libnvidia-ml.so.1.tmp" "$out/libnvidia-ml.so.1"
mv "$out/nvml-model.tmp" "$out/nvml-model"
echo "$hash" >"$out/.inputs"
echo "nvml-models: built in $out"
