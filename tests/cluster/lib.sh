# shellcheck shell=bash
# The shell helpers of tests/cluster, sourced (not run) by every script there: the one
# definition of each. Sections: building (resolve_version, build_key), the machine
# (disk, ports, cgroups, processes, images), a running cluster (cluster_env, k, kctr,
# the plugin pod's waits), a scenario's checks (pass, bad, eq, check, die) and the
# end-to-end scripts (e2e_step, e2e_stop). Editing this file changes the image's input
# hash (image.sh), not the Kubernetes or helm build keys.

# resolve_version ARG: sets K8S_MOD (the module dir), K8S_VERSION (the pinned release,
# vX.Y.Z), K8S_MINOR and K8S_BIN (<repo>/target/k8s/<version>-<key>) for ARG = 1.34 |
# v1.34 | v1.34.4. The key is a hash of everything the binaries are built from (go.mod,
# go.sum, the mux's main.go, build.sh and `go version`): CI keeps target/ between runs,
# and a binary built from other inputs must never be taken for this one.
resolve_version() {
  local arg=$1 here repo
  here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
  repo=$(cd "$here/../.." && pwd)
  [[ ${arg#v} =~ ^1\.([0-9]+)(\.[0-9]+)?$ ]] || { echo "bad version: $arg (want e.g. 1.34 or v1.37.2)" >&2; return 2; }
  K8S_MINOR=${BASH_REMATCH[1]}
  K8S_MOD=$here/k8s/v1.$K8S_MINOR
  [ -f "$K8S_MOD/go.mod" ] || { echo "no module for $arg: $K8S_MOD/go.mod (make one with k8s/gen.sh)" >&2; return 2; }
  K8S_VERSION=$(sed -n 's/^\tk8s\.io\/kubernetes \(v[0-9.]*\(-[a-z]*\.[0-9]*\)\{0,1\}\)$/\1/p' "$K8S_MOD/go.mod")
  [ -n "$K8S_VERSION" ] || { echo "no k8s.io/kubernetes require in $K8S_MOD/go.mod" >&2; return 1; }
  if [ -n "${BASH_REMATCH[2]}" ] && [ "v${arg#v}" != "$K8S_VERSION" ]; then
    echo "$K8S_MOD/go.mod pins $K8S_VERSION, not $arg (k8s/gen.sh v${arg#v} to change it)" >&2; return 2
  fi
  go_for_module "$K8S_MOD/go.mod" || return 1
  local key
  local inputs=("$K8S_MOD/go.mod" "$K8S_MOD/go.sum" "$K8S_MOD/main.go" "$here/build.sh")
  # A module replaced by a directory of this repo (k8s/iptables-wrappers) is an input too.
  if grep -q '=> \.\./iptables-wrappers$' "$K8S_MOD/go.mod"; then
    inputs+=("$here/k8s/iptables-wrappers/go.mod" "$here/k8s/iptables-wrappers/pkg/iptables/iptables.go")
  fi
  key=$(build_key "${inputs[@]}") || return 1
  K8S_BIN=$repo/target/k8s/$K8S_VERSION-$key
}

# go_for_module GO_MOD: exports GOTOOLCHAIN=go1.27.3 when GO_MOD's go directive is newer
# than the machine's Go (1.26): Kubernetes 1.38 needs Go 1.27, which the go command then
# takes from the module proxy (about 76 MB, once per machine). The only approved newer
# toolchain here; CI's releases (1.34, 1.37) build with the machine's own Go.
go_for_module() {
  local want have
  want=$(sed -n 's/^go \([0-9.]*\)$/\1/p' "$1")
  have=$(GOTOOLCHAIN=local "${GO:-go}" env GOVERSION) || return 1
  have=${have#go}
  [ -n "$want" ] || return 0
  if [ "$(printf '%s\n%s\n' "$want" "$have" | sort -V | tail -1)" != "$have" ]; then
    export GOTOOLCHAIN=${TESSERA_GOTOOLCHAIN:-go1.27.3}
  fi
}

# build_key FILE...: 12 hex digits of a hash of the files' contents and `go version`
# (${GO:-go}): the key of a binary built by `go build` from them.
build_key() {
  local gov
  gov=$("${GO:-go}" version) || { echo "build_key: '${GO:-go} version' failed" >&2; return 1; }
  { cat "$@" || return 1; echo "$gov"; } | sha256sum | cut -c1-12
}

# disk_headroom DIR: fails, saying why, unless DIR's filesystem has room for a cluster
# above the kubelet's hard eviction threshold (up.sh: nodefs/imagefs.available 1%).
# Below it the kubelet reports DiskPressure, the node is tainted
# node.kubernetes.io/disk-pressure and no pod is scheduled: every scenario then waits
# out its timeouts instead of failing at once (a CI run on a 99 % full disk did).
# TESSERA_CLUSTER_MIN_FREE_GIB: the room wanted above the threshold (default 3).
disk_headroom() {
  local dir=$1 size avail need
  read -r size avail < <(df -k --output=size,avail "$dir" | tail -1)
  need=$(( size / 100 + ${TESSERA_CLUSTER_MIN_FREE_GIB:-3} * 1024 * 1024 ))
  if [ "$avail" -lt "$need" ]; then
    echo "disk: $((avail / 1024 / 1024)) GiB free on $(df --output=target "$dir" | tail -1) ($dir), a cluster needs $((need / 1024 / 1024)) GiB (the kubelet's 1% eviction threshold + ${TESSERA_CLUSTER_MIN_FREE_GIB:-3} GiB); free some space" >&2
    return 1
  fi
}

# node_pressure KUBECTL... : the node conditions other than Ready that are True
# (DiskPressure, MemoryPressure, PIDPressure) and the node's taints, one line; empty
# when there are none. For failure messages: a node under pressure schedules nothing.
node_pressure() {
  "$@" get nodes -o jsonpath='{range .items[*]}{range .status.conditions[?(@.status=="True")]}{.type} {end}{range .spec.taints[*]}taint={.key}:{.effect} {end}{end}' 2>/dev/null \
    | sed 's/\bReady //'
}

# exec_retry CMD...: runs a `kubectl exec` command; when runc fails to start the exec
# ("OCI runtime exec failed": a transient of runc under load, e.g. "read init-p:
# connection reset by peer", seen once in CI), tries again, at most 3 times, saying so.
# Its stdout and stderr stay apart (a caller may write stdout to a JSON file). Any other
# failure, and the command's own exit status, are the caller's.
exec_retry() {
  local attempt out rc err
  err=$(mktemp)
  for attempt in 1 2 3; do
    rc=0
    out=$("$@" 2>"$err") || rc=$?
    if [ "$rc" != 0 ] && grep -q "OCI runtime exec failed" "$err" && [ "$attempt" -lt 3 ]; then
      echo "  (runc could not start the exec, attempt $attempt: $(tail -1 "$err"); again)" >&2
      sleep 1
      continue
    fi
    printf '%s\n' "$out"
    cat "$err" >&2
    rm -f "$err"
    return "$rc"
  done
}

# now: seconds since the epoch with milliseconds.
now() { date +%s.%3N; }
# since T0: seconds elapsed since T0 (one decimal).
since() { awk -v a="$1" -v b="$(now)" 'BEGIN { printf "%.1f", b - a }'; }
# log MESSAGE...: MESSAGE after the seconds since $T0 (the script's start).
log() { echo "[$(since "$T0")s] $*"; }

# kill_pid PID [NAME]: SIGTERM, up to 10 s, then SIGKILL; waits until it is gone.
kill_pid() {
  local pid=$1 i
  kill -0 "$pid" 2>/dev/null || return 0
  kill -TERM "$pid" 2>/dev/null || true
  for i in $(seq 100); do kill -0 "$pid" 2>/dev/null || return 0; sleep 0.1; done
  kill -KILL "$pid" 2>/dev/null || true
  for i in $(seq 50); do kill -0 "$pid" 2>/dev/null || return 0; sleep 0.1; done
  echo "pid $pid ${2:-} survived SIGKILL" >&2
}

# mkimage ROOTFS TAG OUT CMD_JSON [ENTRYPOINT_JSON [ENV_JSON_ITEMS]]: a docker-archive
# (`docker save` layout) of one layer holding ROOTFS, for `ctr images import`.
# ENV_JSON_ITEMS: more environment after PATH, e.g. '"A=1","B=2"'. Reproducible: sorted
# names, owner 0, mtime 0.
mkimage() {
  local rootfs=$1 tag=$2 out=$3 cmd=$4 entrypoint=${5:-null} env=${6:+,$6} t diff config cfg
  t=$(mktemp -d "$(dirname "$out")/tmp.XXXXXX")
  (cd "$rootfs" && tar --numeric-owner --owner=0 --group=0 --sort=name --mtime=@0 -cf "$t/layer.tar" $(ls -A))
  diff=$(sha256sum "$t/layer.tar" | cut -d' ' -f1)
  config='{"architecture":"amd64","os":"linux","config":{"Entrypoint":'$entrypoint',"Cmd":'$cmd',"Env":["PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"'$env']},"rootfs":{"type":"layers","diff_ids":["sha256:'$diff'"]},"history":[{"created_by":"tessera tests/cluster"}]}'
  cfg=$(printf %s "$config" | sha256sum | cut -d' ' -f1).json
  printf %s "$config" >"$t/$cfg"
  printf '[{"Config":"%s","RepoTags":["%s"],"Layers":["layer.tar"]}]' "$cfg" "$tag" >"$t/manifest.json"
  tar -C "$t" -cf "$out" manifest.json "$cfg" layer.tar
  rm -rf "$t"
}

# free_port: a random TCP port below the kernel's ephemeral range (so that no outgoing
# connection takes it before the listener binds), 10000 or above; reserve_port checks it.
free_port() {
  local lo
  lo=$(cut -f1 /proc/sys/net/ipv4/ip_local_port_range 2>/dev/null || echo 32768)
  [ "$lo" -gt 12000 ] || lo=32768
  echo $((10000 + RANDOM % (lo - 10000)))
}

# reserve_port DIR: prints a port for DIR's cluster that is free now (free_port, not in
# `ss`) and that no other cluster of this machine holds: each cluster picks its ports at
# random and binds them later, so two clusters started at once (CI runs several) could
# pick the same one. A reservation is a file <registry>/<port> naming DIR, written under
# a lock (one caller at a time); it is given back by release_ports (down.sh), and taken
# over once DIR is gone. Registry: $TESSERA_CLUSTER_PORTS (default /run/tessera-cluster-ports).
reserve_port() {
  local dir=$1 reg=${TESSERA_CLUSTER_PORTS:-/run/tessera-cluster-ports} inuse p owner try lock
  mkdir -p "$reg" || return 1
  # One reservation at a time on this machine: a stale one is taken over only under the
  # lock, so a fresh one is never removed by a caller that read its stale owner earlier.
  exec {lock}>"$reg/.lock" || return 1
  flock "$lock"
  inuse=" $(ss -Htan | awk '{print $4}' | sed 's/.*://' | tr '\n' ' ') "
  for try in $(seq 1000); do
    p=$(free_port)
    [[ $inuse == *" $p "* ]] && continue
    if [ -e "$reg/$p" ]; then
      # Held: taken over only when its cluster's DIR is gone.
      owner=$(cat "$reg/$p" 2>/dev/null) || continue
      [ -n "$owner" ] && [ ! -d "$owner" ] || continue
    fi
    if echo "$dir" >"$reg/$p.tmp" && mv -f "$reg/$p.tmp" "$reg/$p"; then
      exec {lock}>&-
      echo "$p"
      return 0
    fi
  done
  exec {lock}>&-
  echo "reserve_port: no free port after $try tries (registry $reg)" >&2
  return 1
}
# release_ports DIR: gives back every port reserve_port gave DIR.
release_ports() {
  local reg=${TESSERA_CLUSTER_PORTS:-/run/tessera-cluster-ports} f
  for f in "$reg"/*; do
    [ -f "$f" ] && [ "$(cat "$f" 2>/dev/null)" = "$1" ] && rm -f "$f"
  done
  return 0
}

# ---------- a running cluster (after up.sh VERSION DIR) ----------

# cluster_env [tessera]: for a script run against the cluster in $DIR (the caller sets
# DIR): reads DIR/env (KUBECONFIG, exported; K8S_VERSION, K8S_BIN, the ports, paths,
# CONTAINERD_SOCKET, NODE_NAME), sets K8S_MINOR (34 for v1.34.4) and GATES (the
# feature gates the cluster runs with); with `tessera`, also DIR/tessera/env, which an
# install wrote (TESSERA_POD, METRICS_PORT).
cluster_env() {
  . "$DIR/env"
  export KUBECONFIG
  K8S_MINOR=$(cut -d. -f2 <<<"$K8S_VERSION")
  GATES=$(cat "$DIR/feature-gates")
  [ "${1:-}" != tessera ] || . "$DIR/tessera/env"
}
# k ARGS...: the cluster's kubectl.
k() { "$K8S_BIN/kubectl" "$@"; }
# kctr ARGS...: ctr in the cluster's containerd (its mount namespace, whose root is the
# chroot; namespace k8s.io, the kubelet's). Needs DIR and CONTAINERD_SOCKET.
kctr() { nsenter --mount --target "$(cat "$DIR/pids/containerd")" ctr --address "$CONTAINERD_SOCKET" --namespace k8s.io "$@"; }
# default_sa [NS]: waits up to 30 s for NS's (default: default's) ServiceAccount
# "default": pods are refused until the service-account controller has made it.
default_sa() {
  local i
  for i in $(seq 150); do k ${1:+-n "$1"} get serviceaccount default >/dev/null 2>&1 && return 0; sleep 0.2; done
  return 1
}
# plog POD: the log of the plugin pod POD (namespace tessera-system), its ANSI colours
# stripped (tracing's default).
plog() { k -n tessera-system logs "$1" 2>&1 | sed 's/\x1b\[[0-9;]*m//g'; }
# plugin_state: the plugin's pods and the end of their logs (for a failure message).
plugin_state() {
  k -n tessera-system get pods -o wide || true
  k -n tessera-system logs -l app.kubernetes.io/name=tessera --tail=30 || true
}
# plugin_pod_ready [OLD_POD]: the one wait for the plugin pod, after an install, an
# upgrade or a deleted pod: the DaemonSet tessera-plugin rolled out (180 s), then its pod
# (not OLD_POD, not terminating) exists (60 s) and is Ready (180 s); prints its name.
# Why more than `rollout status`: it returned once before the DaemonSet controller had
# counted the new pod (three clusters at once), the pod not Ready yet or not made.
# Fails, saying which wait ran out.
plugin_pod_ready() {
  local old=${1:-} pod="" i
  k -n tessera-system rollout status ds/tessera-plugin --timeout=180s >/dev/null ||
    { echo "the DaemonSet tessera-plugin did not roll out in 180s" >&2; return 1; }
  for i in $(seq 300); do
    pod=$(k -n tessera-system get pods -l app.kubernetes.io/name=tessera \
      -o jsonpath='{range .items[*]}{.metadata.name} {.metadata.deletionTimestamp}{"\n"}{end}' 2>/dev/null |
      awk -v old="$old" 'NF == 1 && $1 != old { print $1; exit }') || true
    [ -n "$pod" ] && break
    sleep 0.2
  done
  [ -n "$pod" ] || { echo "no plugin pod${old:+ other than $old} 60s after the rollout" >&2; return 1; }
  k -n tessera-system wait --for=condition=Ready "pod/$pod" --timeout=180s >/dev/null ||
    { echo "plugin pod $pod not Ready 180s after the rollout" >&2; return 1; }
  echo "$pod"
}
# plugin_registered POD: waits up to 30 s for "registered with the kubelet" in POD's log.
plugin_registered() {
  local i
  for i in $(seq 150); do grep -q "registered with the kubelet" <<<"$(plog "$1")" && return 0; sleep 0.2; done
  return 1
}
# node_slices: the names of the ResourceSlices of gpu.tessera.dev for this node.
node_slices() { k get resourceslices --field-selector spec.nodeName="$NODE_NAME",spec.driver=gpu.tessera.dev -o name; }
# node_backend: the simulated node's backend, as mock-node-root.sh made it (DIR/tessera-node/node.json):
# mock, or nvml:MODEL.
node_backend() { jq -r .backend "$DIR/tessera-node/node.json"; }
# node_backend_flags: sets BACKEND_FLAG (the plugin's --backend), BACKEND_ENV_YAML (the
# container's env entries it needs, YAML at indent 0, empty for the mock) and
# INVENTORY_BACKEND (`tessera inventory`'s flags in the plugin's container) for that node.
# NVIDIA's model needs its name and state dir (under the plugin's state dir, so that
# its GPU and compute instances outlive plugin pods, as a GPU's do); /proc/devices is
# the node's (mock-node-root.sh).
node_backend_flags() {
  local b
  b=$(node_backend) || return 1
  case $b in
    mock)
      BACKEND_FLAG=--backend=mock:/etc/tessera-mock/mock-node.yaml
      BACKEND_ENV_YAML=""
      INVENTORY_BACKEND=(--backend mock:/etc/tessera-mock/mock-node.yaml) ;;
    nvml:*)
      BACKEND_FLAG=--backend=nvml
      BACKEND_ENV_YAML="- name: TESSERA_NVML_MODEL
  value: ${b#nvml:}
- name: TESSERA_NVML_MODEL_MIG
  value: \"on\"
- name: TESSERA_NVML_MODEL_STATE
  value: /var/lib/tessera/nvml-model"
      INVENTORY_BACKEND=(--backend "nvml:/host-root$DIR/tessera-node/driver-root/usr/lib/x86_64-linux-gnu/libnvidia-ml.so.1" --proc-root /host/proc) ;;
    *) echo "node_backend_flags: unknown backend $b" >&2; return 1 ;;
  esac
}
# tessera_inventory POD: `tessera inventory -o json` in POD's plugin container (its
# binary, backend, node config, state dir and node name), for the cluster's release
# and gates: the slices the plugin publishes.
tessera_inventory() {
  node_backend_flags || return 1
  exec_retry k -n tessera-system exec "$1" -c plugin -- tessera inventory \
    "${INVENTORY_BACKEND[@]}" --k8s-version "1.$K8S_MINOR" --gates "$GATES" -o json
}
# compare_slices INVENTORY.json STORED.json: compare-slices.py for this node's
# gpu.tessera.dev slices (the differences printed; exit 1 on any).
compare_slices() {
  python3 "$(dirname "${BASH_SOURCE[0]}")/compare-slices.py" "$1" "$2" gpu.tessera.dev "$NODE_NAME" \
    "$(k get node "$NODE_NAME" -o jsonpath='{.metadata.uid}')"
}

# ---------- a scenario's checks ----------
# Each check prints "  ok   WHAT" or "  FAIL WHAT" (stderr); a failure counts in
# `errors`, which the scenario reads at its end (a check in a subshell counts nowhere).
errors=0
pass() { echo "  ok   $*"; }
bad() { echo "  FAIL $*" >&2; errors=$((errors + 1)); }
# eq WHAT ACTUAL EXPECTED
eq() { if [ "$2" = "$3" ]; then pass "$1: $2"; else bad "$1: got '$2', want '$3'"; fi; }
# check WHAT CMD...: CMD (its output discarded) must succeed; `check WHAT not CMD...`
# must fail.
check() {
  local what=$1
  shift
  if "$@" >/dev/null 2>&1; then pass "$what"; else bad "$what"; fi
}
not() { ! "$@"; }
# die MESSAGE: "<script>: FAILED: MESSAGE", then what the command in DIE_CONTEXT prints
# when the script set one (e.g. plugin_state); exit 1.
die() {
  echo "${0##*/}: FAILED: $*" >&2
  if [ -n "${DIE_CONTEXT:-}" ]; then $DIE_CONTEXT >&2 2>&1 || true; fi
  exit 1
}

# ---------- the end-to-end scripts (tessera-e2e.sh, tessera-helm-e2e.sh) ----------
# They set `here`, `DIR` and `status`. e2e_stop (their EXIT trap): the cluster is stopped
# whatever happened, unless a failed run is to be kept (TESSERA_CLUSTER_KEEP=1).
e2e_stop() {
  if [ "$status" != 0 ] && [ "${TESSERA_CLUSTER_KEEP:-}" = 1 ]; then
    echo "left running for inspection: $here/down.sh $DIR" >&2
    return
  fi
  [ -d "$DIR/pids" ] && "$here/down.sh" "$DIR" >"$DIR/down.log" 2>&1
  tail -2 "$DIR/down.log" 2>/dev/null
}
# e2e_step NAME CMD...: runs a step; a failure is recorded in `status`. Its time is
# printed, and appended to $TESSERA_TEST_TIMINGS when set (CI prints that file after the
# tests: where a suite's minutes go).
e2e_step() {
  echo "=== $1"
  local t0=$SECONDS rc=0 dir=${DIR:-}
  "${@:2}" || rc=$?
  local took="$1 (${dir##*/}): $([ "$rc" = 0 ] && echo ok || echo FAILED) after $((SECONDS - t0))s"
  [ -z "${TESSERA_TEST_TIMINGS:-}" ] || echo "    step $took" >>"$TESSERA_TEST_TIMINGS"
  [ "$rc" = 0 ] && { echo "=== $took"; return 0; }
  echo "=== $took" >&2
  status=1
  # A node under pressure schedules nothing: say so, or every failure looks like a bug.
  if [ -f "${DIR:-}/env" ]; then
    local pressure
    pressure=$(. "$DIR/env" && node_pressure "$K8S_BIN/kubectl" --kubeconfig "$KUBECONFIG")
    echo "    node now: ${pressure:-no pressure, no taint}; disk: $(df -h --output=avail,pcent "$DIR" | tail -1 | xargs) (free, used)" >&2
  fi
  return 1
}

# The cgroup hierarchies to make (or remove) a cgroup in, one directory per line with a
# trailing /: every mounted hierarchy under /sys/fs/cgroup on a v1 or hybrid host, or
# /sys/fs/cgroup/ itself on a cgroup2-only host (where its subdirectories are cgroups).
cgroup_hierarchies() {
  if [ -f /sys/fs/cgroup/cgroup.controllers ]; then
    echo /sys/fs/cgroup/
  else
    for h in /sys/fs/cgroup/*/; do echo "$h"; done
  fi
}
