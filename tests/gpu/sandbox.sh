#!/usr/bin/env bash
# sandbox.sh EDITS CMD [ARG...]: run under `unshare -m --propagation private` as root.
# Applies a CDI spec's container edits (the lines of `tessera-kit cdi-edits`: `mount
# HOST CONTAINER OPTIONS`, `env KEY=VALUE`) to this mount namespace as a runtime applies them
# to a container, then runs CMD with the spec's environment. A mount whose target does
# not exist gets one: the nearest existing directory above it is covered with an
# overlay (upper layer in a tmpfs), so nothing outside the namespace changes.
set -euo pipefail
edits=$1
shift
# The overlays' upper layers: a tmpfs on a fresh directory under TESSERA_KIT_SANDBOX_DIR
# (run.sh's work dir, removed with it; default /tmp).
up=$(mktemp -d "${TESSERA_KIT_SANDBOX_DIR:-/tmp}/tessera-kit-sandbox.XXXXXX")
mount -t tmpfs tmpfs "$up"
overlaid=" "
under_overlay() {
  local o
  for o in $overlaid; do
    case $1 in "$o" | "$o"/*) return 0 ;; esac
  done
  return 1
}
# Makes TARGET exist (a file or a directory, as SOURCE is).
ensure() {
  local src=$1 t=$2 d key
  [ -e "$t" ] && return 0
  d=$(dirname "$t")
  while [ ! -d "$d" ]; do d=$(dirname "$d"); done
  # Below an overlay made here already: writable as it is (a second overlay would
  # hide the files bound into the first).
  if ! under_overlay "$d"; then
    key=$(printf '%s' "$d" | tr / _)
    mkdir -p "$up/$key/u" "$up/$key/w"
    mount -t overlay overlay -o "lowerdir=$d,upperdir=$up/$key/u,workdir=$up/$key/w" "$d"
    overlaid+="$d "
  fi
  if [ -d "$src" ]; then mkdir -p "$t"; else mkdir -p "$(dirname "$t")" && : >"$t"; fi
}
envs=()
while read -r what a b opts; do
  case $what in
    mount)
      ensure "$a" "$b"
      mount --bind "$a" "$b"
      case ",$opts," in *,ro,*) mount -o remount,bind,ro "$b" ;; esac
      ;;
    env) envs+=("$a") ;;
  esac
done <"$edits"
exec env "${envs[@]}" "$@"
