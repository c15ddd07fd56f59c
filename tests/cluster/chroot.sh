#!/usr/bin/env bash
# Prints the path of the cached Debian trixie chroot that holds the cluster's userland
# from Debian packages: containerd 1.7 and runc (the containerd suite's too,
# testkit/src/cri.rs: CDI needs containerd >= 1.7.2, bookworm has 1.6), the CNI plugins
# (containernetworking-plugins), etcd 3.5 (etcd-server) and busybox-static (for the
# locally built pause and test images). Built once with debootstrap (a lock serialises
# concurrent builders); runs never modify it.
# Cache: ${TESSERA_E2E_CACHE:-/var/cache/tessera-e2e}/trixie-cluster.
# Mirror: $TESSERA_DEBIAN_MIRROR, else the host's first .../debian apt URI, else deb.debian.org.
# TESSERA_BUILD_NICE: debootstrap's niceness (default 19; CI: 0, since its clusters and
# containerd suite wait for it, and at 19 beside CI's builds it took 22 minutes).
set -euo pipefail
PKGS=containerd,runc,containernetworking-plugins,etcd-server,busybox-static
parent=${TESSERA_E2E_CACHE:-/var/cache/tessera-e2e}
root=$parent/trixie-cluster
stamp=.tessera-cluster-complete
if [ -f "$root/$stamp" ]; then echo "$root"; exit 0; fi
mkdir -p "$parent"
exec 9>"$parent/trixie-cluster.lock"
flock 9
if [ -f "$root/$stamp" ]; then echo "$root"; exit 0; fi
mirror=${TESSERA_DEBIAN_MIRROR:-}
if [ -z "$mirror" ]; then
  mirror=$(cat /etc/apt/sources.list /etc/apt/sources.list.d/*.list /etc/apt/sources.list.d/*.sources 2>/dev/null |
    grep -oE '(https?://[^ ]*/debian)/?( |$)' | head -1 | tr -d ' ' || true)
  mirror=${mirror:-http://deb.debian.org/debian}
fi
tmp=$parent/trixie-cluster.tmp$$
start=$(date +%s)
echo "building the trixie chroot $root ($PKGS) from $mirror" >&2
if ! nice -n "${TESSERA_BUILD_NICE:-19}" debootstrap --variant=minbase --include=$PKGS trixie "$tmp" "$mirror" >"$parent/trixie-cluster.debootstrap.log" 2>&1; then
  tail -20 "$parent/trixie-cluster.debootstrap.log" >&2
  echo "debootstrap failed; left in $tmp, log $parent/trixie-cluster.debootstrap.log" >&2
  exit 1
fi
rm -f "$tmp"/var/cache/apt/archives/*.deb
# A host-network pod sandbox copies /etc/hosts from the runtime's root (cri.rs).
[ -e "$tmp/etc/hosts" ] || printf '127.0.0.1 localhost\n::1 localhost\n' >"$tmp/etc/hosts"
: >"$tmp/etc/resolv.conf"
for b in containerd runc etcd; do chroot "$tmp" "$b" --version | head -1 >>"$tmp/$stamp"; done
[ -x "$tmp/usr/lib/cni/bridge" ] && [ -x "$tmp/bin/busybox" ]
rm -rf "$root"
mv "$tmp" "$root"
echo "chroot built in $(( $(date +%s) - start ))s: $(tr '\n' ';' <"$root/$stamp")" >&2
echo "$root"
