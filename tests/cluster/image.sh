#!/usr/bin/env bash
# Assembles Tessera's image from the release artifacts already built (no registry, no
# base image): `nice -n 19 cargo build --release -p tessera -p tessera-interpose -p tessera-cdi-hook && cargo preload --release` first.
# The layout is deploy/Containerfile's runtime stage: /usr/bin/tessera, the
# interception library, its front, shims and CDI hook in /usr/local/lib/tessera/, the DeviceClasses in
# /usr/share/tessera/deviceclasses, entrypoint tessera, command plugin. In place of
# bookworm-slim: the glibc the binary needs (its NEEDED libraries, from the trixie
# chroot of chroot.sh) and busybox-static for a shell. One layer, a docker-archive.
# Unlike the Containerfile, the libraries are the host build of target/release (not
# the glibc 2.17 zigbuild): the test images that load them have the same glibc.
# Usage: image.sh [DIR]   prints the archive; with DIR (a running cluster of up.sh), also
#                         imports it into that cluster's containerd.
# Env: TESSERA_IMAGE (default localhost/tessera/tessera:dev, the test-cluster overlay's).
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
. "$here/lib.sh"
repo=$(cd "$here/../.." && pwd)
tag=${TESSERA_IMAGE:-localhost/tessera/tessera:dev}
rel=$repo/target/release
shims="libtessera_shim_cuda.so libtessera_shim_nvml.so tessera-cdi-hook"
for f in tessera libtessera_cuda.so libtessera_preload.so $shims; do
  [ -f "$rel/$f" ] || { echo "image.sh: $rel/$f missing (nice -n 19 cargo build --release -p tessera -p tessera-interpose -p tessera-cdi-hook && cargo preload --release)" >&2; exit 1; }
done
R=$("$here/chroot.sh")
out=$repo/target/cluster-image
mkdir -p "$out"
archive=$out/tessera.tar
# One assembly at a time (clusters started at once share target/cluster-image): the lock
# is fd 8, held until this script exits.
exec 8>"$out.lock"
flock 8
# Rebuild only when an input changed.
inputs=$( { sha256sum "$rel/tessera" "$rel/libtessera_cuda.so" "$rel/libtessera_preload.so" "$rel/libtessera_shim_cuda.so" "$rel/libtessera_shim_nvml.so" "$rel/tessera-cdi-hook" "$repo"/deploy/deviceclasses/*.yaml "$0" "$here/lib.sh"; echo "$tag"; } | sha256sum | cut -d' ' -f1)
if [ ! -f "$archive" ] || [ "$(cat "$archive.inputs" 2>/dev/null)" != "$inputs" ]; then
  rootfs=$out/rootfs
  rm -rf "$rootfs"
  mkdir -p "$rootfs"/{bin,etc,dev,proc,sys,tmp,root,run,var/run,usr/bin,usr/lib/x86_64-linux-gnu,usr/local/lib/tessera,usr/share/tessera}
  ln -s usr/lib "$rootfs/lib"
  mkdir -p "$rootfs/lib64"
  ln -s ../usr/lib/x86_64-linux-gnu/ld-linux-x86-64.so.2 "$rootfs/lib64/ld-linux-x86-64.so.2"
  install -m 755 "$rel/tessera" "$rootfs/usr/bin/tessera"
  install -m 755 "$rel/libtessera_cuda.so" "$rel/libtessera_preload.so" "$rel/libtessera_shim_cuda.so" "$rel/libtessera_shim_nvml.so" "$rel/tessera-cdi-hook" "$rootfs/usr/local/lib/tessera/"
  cp -r "$repo/deploy/deviceclasses" "$rootfs/usr/share/tessera/"
  # The shared libraries the three ELF files need, transitively, and the loader, all
  # from the chroot's glibc.
  libdir=$R/usr/lib/x86_64-linux-gnu
  needed() { readelf -d "$1" | sed -n 's/.*(NEEDED).*\[\(.*\)\]/\1/p'; }
  todo=$( { needed "$rel/tessera"; needed "$rel/libtessera_cuda.so"; needed "$rel/libtessera_preload.so"; echo ld-linux-x86-64.so.2; } | sort -u)
  done_=" "
  while [ -n "$todo" ]; do
    next=""
    for l in $todo; do
      [[ $done_ == *" $l "* ]] && continue
      done_+="$l "
      [ -e "$libdir/$l" ] || { echo "image.sh: $l not in $libdir" >&2; exit 1; }
      cp -L "$libdir/$l" "$rootfs/usr/lib/x86_64-linux-gnu/$l"
      next+=" $(needed "$libdir/$l")"
    done
    todo=$(echo $next)
  done
  cp "$R/bin/busybox" "$rootfs/bin/"
  for a in $("$rootfs/bin/busybox" --list); do [ "$a" = busybox ] || [ -e "$rootfs/bin/$a" ] || ln -s busybox "$rootfs/bin/$a"; done
  echo 'root:x:0:0:root:/root:/bin/sh' >"$rootfs/etc/passwd"
  echo 'root:x:0:' >"$rootfs/etc/group"
  chmod 1777 "$rootfs/tmp"
  # The binary must start on this root alone (its loader, its libraries).
  chroot "$rootfs" /usr/bin/tessera --version >/dev/null || { echo "image.sh: tessera does not run in $rootfs" >&2; exit 1; }
  mkimage "$rootfs" "$tag" "$archive.tmp" '["plugin"]' '["/usr/bin/tessera"]'
  mv "$archive.tmp" "$archive"
  echo "$inputs" >"$archive.inputs"
  echo "image.sh: $tag in $archive ($(du -h "$archive" | cut -f1); libraries: $done_)" >&2
fi
if [ -n "${1:-}" ]; then
  DIR=$(cd "$1" && pwd)
  . "$DIR/env"
  # ctr runs in containerd's mount namespace (the chroot), which sees DIR, not target/.
  mkdir -p "$DIR/images"
  cp "$archive" "$DIR/images/tessera.tar"
  kctr images import "$DIR/images/tessera.tar" >&2
  echo "image.sh: $tag imported into $DIR's containerd" >&2
fi
echo "$archive"
