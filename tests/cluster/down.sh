#!/usr/bin/env bash
# Stops the cluster up.sh started in DIR, by the PIDs it recorded, and what they left:
# the containers (the shims of DIR's containerd and every process under them), any
# process still in the cluster's mount namespaces, the containers' cgroups and the pod
# bridge. Mounts: up.sh mounted nothing in the host's namespace; everything it and the
# kubelet mounted lives in the cluster's private mount namespaces, which vanish with
# their last process (checked below).
# Usage (root): down.sh DIR [--purge]     --purge: also delete DIR.
set -uo pipefail
here=$(cd "$(dirname "$0")" && pwd)
. "$here/lib.sh"
DIR=${1:?usage: down.sh DIR [--purge]}
DIR=$(cd "$DIR" && pwd) || exit 1
[ -d "$DIR/pids" ] || { echo "no cluster in $DIR (no pids/)" >&2; exit 1; }
pidof_() { [ -f "$DIR/pids/$1" ] && cat "$DIR/pids/$1"; }
# The mount namespaces of the cluster (up.sh's) and of containerd (nested in it), each
# pinned by an open file while this script runs: step 4 finds processes by namespace
# inode number, and once a namespace's last process is gone the kernel may give its
# number to a new, unrelated namespace (seen: a test's `unshare -m` process killed as
# "leftover"). A namespace no recorded daemon is in any more is not searched.
ns=()
pin() { # pin PID [NAME]: adds PID's mount namespace (if it is NAME) to ns, held open
  local fd name
  { exec {fd}<"/proc/$1/ns/mnt"; } 2>/dev/null || return 1
  name=$(readlink "/proc/$$/fd/$fd") || return 1
  [ -z "${2:-}" ] || [ "$name" = "$2" ] || { exec {fd}<&-; return 1; }
  ns+=("$name")
}
if [ -f "$DIR/mntns" ]; then
  for f in "$DIR"/pids/*; do
    p=$(cat "$f" 2>/dev/null) && [ -n "$p" ] && pin "$p" "$(cat "$DIR/mntns")" && break
  done
fi
cpid=$(pidof_ containerd || true)
[ -n "$cpid" ] && pin "$cpid"

# 1. The kubelet first, so that it restarts nothing.
[ -n "$(pidof_ kubelet)" ] && kill_pid "$(pidof_ kubelet)" kubelet

# 2. The containers: the shims of this containerd (their command line names its socket)
#    and every process below them. Their cgroups are noted first, to remove them after.
sock=$DIR/containerd/containerd.sock
shims=$(for p in /proc/[0-9]*; do
  { tr '\0' ' ' <"$p/cmdline"; } 2>/dev/null | grep -q -- "-address $sock " && echo "${p#/proc/}"
done)
descendants() { # all processes below the given pids
  local all p
  all=$(ps -eo pid=,ppid=)
  local frontier="$*" next
  while [ -n "$frontier" ]; do
    next=""
    for p in $frontier; do next+=" $(awk -v p="$p" '$2 == p {print $1}' <<<"$all")"; done
    next=$(echo $next)
    [ -n "$next" ] && echo "$next"
    frontier=$next
  done
}
victims="$shims $(descendants $shims)"
cgroups=$(for p in $victims; do
  [ "$p" = "$cpid" ] && continue
  for s in $shims; do [ "$p" = "$s" ] && continue 2; done
  # hierarchy-id:controllers:path; the cgroup2 line (0::path) is the "unified" mount here.
  awk -F: '$3 ~ /^\/./ { print ($2 == "" ? "unified" : $2), $3 }' "/proc/$p/cgroup" 2>/dev/null
done | sort -u)
for p in $victims; do kill -KILL "$p" 2>/dev/null; done

# 3. The daemons.
#    SIGTERM to all at once, then each is waited for (SIGKILL after 10 s).
t=$(now)
daemons="containerd kube-scheduler kube-controller-manager kube-apiserver etcd"
for d in $daemons; do p=$(pidof_ "$d") && kill -TERM "$p" 2>/dev/null; done
for d in $daemons; do p=$(pidof_ "$d") && kill_pid "$p" "$d"; done
echo "daemons stopped ($(since "$t")s)"

# 4. Anything still in the cluster's mount namespaces (nothing, normally).
for i in 1 2 3; do
  left=""
  for p in /proc/[0-9]*; do
    m=$(readlink "$p/ns/mnt" 2>/dev/null) || continue
    for n in "${ns[@]}"; do [ "$m" = "$n" ] && left+=" ${p#/proc/}"; done
  done
  [ -z "$left" ] && break
  for p in $left; do echo "killing leftover process in the cluster namespaces: $p $({ tr '\0' ' ' <"/proc/$p/cmdline"; } 2>/dev/null)" >&2; done
  kill -KILL $left 2>/dev/null
  sleep 0.5
done
[ -n "${left:-}" ] && echo "still in the cluster namespaces: $left" >&2

# 5. The containers' cgroups (named after the container IDs, in every hierarchy), the pod
#    bridge.
while read -r ctrl path; do
  [[ ${path##*/} =~ ^[0-9a-f]{64}$ ]] || continue
  for h in ${ctrl//,/ }; do
    h=${h#name=}
    d=/sys/fs/cgroup/$h$path
    [ -d "$d" ] && find "$d" -depth -type d -exec rmdir {} + 2>/dev/null
  done
done <<<"$cgroups"
# The kubelet's cgroup root of this cluster (up.sh), with the QoS and pod cgroups below it.
if [ -s "$DIR/cgroup-root" ]; then
  root=$(cat "$DIR/cgroup-root")
  for h in $(cgroup_hierarchies); do
    [ -d "$h${root#/}" ] || continue
    find "$h${root#/}" -depth -type d -exec rmdir {} + 2>/dev/null
    [ -d "$h${root#/}" ] && echo "down.sh: $h${root#/} still there (a process left in it?)" >&2
  done
fi
# containerd's /k8s.io parents that this cluster created, once empty.
[ -f "$DIR/cgroup-parents" ] && while read -r d; do rmdir "$d" 2>/dev/null; done <"$DIR/cgroup-parents"
if [ -f "$DIR/bridge" ] && ip link show "$(cat "$DIR/bridge")" >/dev/null 2>&1; then
  ip link del "$(cat "$DIR/bridge")"
fi
rm -rf "$DIR/pids"
# The ports reserve_port held for this cluster (up.sh, the install's metrics ports).
release_ports "$DIR"
echo "cluster in $DIR stopped"
if [ "${2:-}" = --purge ]; then rm -rf "$DIR"; echo "removed $DIR"; fi
