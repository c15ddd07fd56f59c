#!/usr/bin/env bash
# Copies the kustomize sources that the Helm chart renders unchanged (the DeviceClasses,
# the ValidatingAdmissionPolicies, the Grafana dashboard, the test-cluster's mock
# node) into deploy/helm/tessera/files/, so that deploy/ stays their one source.
# Why copies, not symlinks: helm follows symlinks in a chart directory but logs a
# warning for each on every command. tests/manifests/helm_chart.rs fails when a copy differs.
# Usage: deploy/helm/sync.sh   (after editing one of the sources)
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
deploy=$(cd "$here/.." && pwd)
files=$here/tessera/files
mkdir -p "$files/deviceclasses"
rm -f "$files"/deviceclasses/*.yaml
cp "$deploy"/deviceclasses/*.tessera.dev.yaml "$files/deviceclasses/"
cp "$deploy"/base/admission-resourceslices.yaml "$deploy"/base/admission-gpuconfig.yaml \
  "$deploy"/base/admission-tenant-pods.yaml "$files/"
cp "$deploy"/overlays/k8s-1.34/admission-shares.yaml "$files/"
cp "$deploy"/monitoring/tessera-dashboard.json "$files/"
cp "$deploy"/overlays/test-cluster/mock-node.yaml "$files/"
echo "synced $(find "$files" -type f ! -name README.md | wc -l) files into $files"
