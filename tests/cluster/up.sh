#!/usr/bin/env bash
# Starts a one-node Kubernetes cluster on loopback, from binaries built from the Go
# modules (build.sh) and Debian trixie's containerd 1.7, runc, CNI plugins and etcd 3.5
# (chroot.sh), and waits until the node is Ready.
# Usage (root): up.sh VERSION [DIR]     VERSION: 1.34 | 1.37 | v1.37.2 ...
#   DIR (new or empty; default: a new /tmp/tessera-cluster.XXXXXX) holds everything: certs, configs,
#   etcd data, containerd root/state, kubelet root dir, pod logs, CNI state, logs/,
#   pids/. `down.sh DIR` stops it all.
# Prints KUBECONFIG=<DIR>/kubeconfig (admin) and the time from start to Ready.
# Env: TESSERA_CLUSTER_SHARES: extra host dirs containerd must see at the same path
#      (e.g. CDI hostPaths outside DIR), space-separated.
#      TESSERA_CLUSTER_GATES: when set (even empty: the release's defaults), the feature
#      gates of all four components instead of Tessera's DRA gates all on.
#      TESSERA_CLUSTER_NODELESS=1: the control plane only (etcd, apiserver,
#      controller-manager, scheduler): no containerd, images or kubelet, no node; for
#      simulated nodes (scale/run.sh). DIR/env then has no kubelet or containerd entries.
#
# Layout (see README.md): every component runs in one private mount namespace (the
# "cluster namespace") in which /etc/hosts maps the node name to 127.0.0.1, /etc/resolv.conf
# is empty (no component can reach an external resolver) and /var/log is DIR/var-log (the
# kubelet's hardcoded /var/log/containers). etcd, the control plane and the kubelet run on
# the host's root there; containerd runs in a nested mount namespace whose root is the
# trixie chroot (pivot_root) and in which DIR is bind-mounted at the same path, as a slave
# of the cluster namespace's DIR, so the kubelet's volume mounts under DIR reach the
# containers.
# Network: the host's network namespace, every listener on 127.0.0.1; pods get a bridge
# of their own with no address on the host side, no gateway, no routes, no masquerade.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
. "$here/lib.sh"

if [ "${TESSERA_CLUSTER_INNER:-}" != 1 ]; then
  [ "$(id -u)" = 0 ] || { echo "up.sh must run as root" >&2; exit 1; }
  [ $# -ge 1 ] || { echo "usage: up.sh VERSION [DIR]" >&2; exit 2; }
  export TESSERA_CLUSTER_T0=$(now)
  resolve_version "$1"
  "$here/build.sh" "$1"
  root=$("$here/chroot.sh")
  dir=${2:-$(mktemp -d /tmp/tessera-cluster.XXXXXX)}
  mkdir -p "$dir"
  dir=$(cd "$dir" && pwd)
  [ -z "$(ls -A "$dir")" ] || { echo "$dir is not empty (a cluster's DIR is used once: down.sh $dir --purge)" >&2; exit 1; }
  [[ $dir != *[[:space:]]* ]] || { echo "DIR must not contain spaces" >&2; exit 2; }
  disk_headroom "$dir" || exit 1
  # Re-run in the cluster namespace: a private mount namespace that the daemons keep
  # alive after this script exits (and that vanishes, with every mount in it, when the
  # last of them is stopped).
  TESSERA_CLUSTER_INNER=1 TESSERA_CLUSTER_ROOT=$root exec unshare --mount --propagation private "$0" "$1" "$dir"
fi

# ---------- inside the cluster namespace ----------
resolve_version "$1"
DIR=$2
R=$TESSERA_CLUSTER_ROOT
T0=$TESSERA_CLUSTER_T0
BIN=$K8S_BIN
NODE=tessera-node
mkdir -p "$DIR"/{pids,logs,pki,etc,var-log,cdi,cni/net.d,cni/ipam,kubelet,pod-logs,images,containerd}
mkdir -m 700 -p "$DIR/etcd"
echo "$K8S_VERSION" >"$DIR/version"
readlink /proc/self/ns/mnt >"$DIR/mntns"
# The cgroup hierarchies in which containerd's /k8s.io parent is new (runc creates it for
# the first container; down.sh removes it again when empty).
for h in /sys/fs/cgroup/*/; do [ -d "$h/k8s.io" ] || echo "${h}k8s.io"; done >"$DIR/cgroup-parents"
# The kubelet's cgroup root, one per cluster: the pods' cgroups are
# <root>/kubepods/<qos>/pod<uid>/<container> (cgroupsPerQOS, as on every production
# node; the memory watchdog finds a process's pod from that path). A root of its own
# keeps this kubelet's cleanup of "orphaned" pod cgroups away from another cluster's
# pods, and down.sh removes it whole. In every mounted hierarchy (v1 controllers, the
# named systemd one and cgroup2's "unified" on a hybrid host; the one tree of a
# cgroup2-only host), with the cpuset of its parent (a new v1 cpuset cgroup starts empty).
CGROUP_ROOT=/tessera-cluster-$(printf %s "$DIR" | sha256sum | cut -c1-12)
echo "$CGROUP_ROOT" >"$DIR/cgroup-root"
for h in $(cgroup_hierarchies); do
  mkdir -p "$h${CGROUP_ROOT#/}"
  for f in cpuset.cpus cpuset.mems; do
    [ -f "$h$f" ] && cat "$h$f" >"$h${CGROUP_ROOT#/}/$f"
  done
done
# A failure (lib.sh die) prints the end of every log.
log_tails() {
  for f in "$DIR"/logs/*.log; do [ -s "$f" ] && { echo "--- tail $f"; tail -15 "$f"; }; done
  echo "(cluster left running for inspection: $here/down.sh $DIR)"
}
DIE_CONTEXT=log_tails

# The cluster namespace's own view of a few host files.
mount --bind "$DIR" "$DIR"
mount --make-shared "$DIR"
{ cat /etc/hosts; echo "127.0.0.1 $NODE"; } >"$DIR/etc/hosts"
: >"$DIR/etc/resolv.conf"
mount --bind "$DIR/etc/hosts" /etc/hosts
mount --bind "$DIR/etc/resolv.conf" /etc/resolv.conf
mount --bind "$DIR/var-log" /var/log

# ---------- ports: free ones on 127.0.0.1 ----------
# Below the kernel's ephemeral range (ip_local_port_range, 32768-60999 here): a port in
# it may become some outgoing connection's local port between this check and the bind
# (seen once: the kubelet's "bind: address already in use").
# reserve_port (lib.sh): free now, and held for this cluster against any other cluster
# started at the same time (down.sh gives them back).
port() { reserve_port "$DIR"; }
ETCD_PORT=$(port) ETCD_PEER_PORT=$(port) API_PORT=$(port) KCM_PORT=$(port) SCHED_PORT=$(port)
KUBELET_PORT=$(port) KUBELET_HEALTHZ_PORT=$(port)
# Named from DIR's hash, as the cgroup root below (15 characters, the kernel's limit):
# clusters running at once never share a bridge (their pods have the same POD_CIDR).
BRIDGE=tessera$(printf %s "$DIR" | sha256sum | cut -c1-8)
! ip link show "$BRIDGE" >/dev/null 2>&1 || die "bridge $BRIDGE exists already (another cluster in $DIR?)"
POD_CIDR=10.244.0.0/24
# The apiserver must be given a Service range, but nothing here may send traffic to it:
# no kube-proxy runs, the pods' bridge has no route to it, the `kubernetes` Service has no
# endpoints (--endpoint-reconciler-type=none), and the serving certificate does not name
# its first IP, so a client that tried would fail closed. Tessera's pod reaches the API
# server at 127.0.0.1 (KUBERNETES_SERVICE_HOST in the test overlay).
SERVICE_CIDR=10.96.0.0/16

# ---------- PKI (openssl): CA, serving and client certs, service-account key ----------
P=$DIR/pki
cat >"$P/openssl.cnf" <<EOF
[req]
distinguished_name = dn
[dn]
[ca]
basicConstraints = critical,CA:TRUE
keyUsage = critical,keyCertSign,cRLSign,digitalSignature
subjectKeyIdentifier = hash
[client]
basicConstraints = critical,CA:FALSE
keyUsage = critical,digitalSignature,keyEncipherment
extendedKeyUsage = clientAuth
[apiserver]
basicConstraints = critical,CA:FALSE
keyUsage = critical,digitalSignature,keyEncipherment
extendedKeyUsage = serverAuth
subjectAltName = IP:127.0.0.1,DNS:localhost,DNS:kubernetes,DNS:kubernetes.default,DNS:kubernetes.default.svc,DNS:kubernetes.default.svc.cluster.local
EOF
ossl() { openssl "$@" 2>>"$DIR/logs/openssl.log"; }
ossl ecparam -name prime256v1 -genkey -noout -out "$P/ca.key"
ossl req -x509 -new -key "$P/ca.key" -subj "/CN=tessera-cluster-ca" -days 30 -config "$P/openssl.cnf" -extensions ca -out "$P/ca.crt"
# cert NAME SUBJECT EXTENSIONS
cert() {
  ossl ecparam -name prime256v1 -genkey -noout -out "$P/$1.key"
  ossl req -new -key "$P/$1.key" -subj "$2" -config "$P/openssl.cnf" -out "$P/$1.csr"
  ossl x509 -req -in "$P/$1.csr" -CA "$P/ca.crt" -CAkey "$P/ca.key" -CAcreateserial -days 30 \
    -extfile "$P/openssl.cnf" -extensions "$3" -out "$P/$1.crt"
  rm -f "$P/$1.csr"
}
cert apiserver "/CN=kube-apiserver" apiserver
cert admin "/O=system:masters/CN=tessera-admin" client
cert apiserver-kubelet-client "/O=system:masters/CN=kube-apiserver-kubelet-client" client
cert controller-manager "/CN=system:kube-controller-manager" client
cert scheduler "/CN=system:kube-scheduler" client
# The kubelet's own identity (Node authorizer, NodeRestriction), not the admin's.
cert kubelet "/O=system:nodes/CN=system:node:$NODE" client
# The aggregation layer's front proxy: its own CA (the apiserver publishes it in
# kube-system/extension-apiserver-authentication; without it the controller-manager and
# scheduler log "missing content for CA bundle ... requestheader-client-ca-file").
ossl ecparam -name prime256v1 -genkey -noout -out "$P/front-proxy-ca.key"
ossl req -x509 -new -key "$P/front-proxy-ca.key" -subj "/CN=tessera-front-proxy-ca" -days 30 -config "$P/openssl.cnf" -extensions ca -out "$P/front-proxy-ca.crt"
ossl ecparam -name prime256v1 -genkey -noout -out "$P/front-proxy-client.key"
ossl req -new -key "$P/front-proxy-client.key" -subj "/CN=front-proxy-client" -config "$P/openssl.cnf" -out "$P/front-proxy-client.csr"
ossl x509 -req -in "$P/front-proxy-client.csr" -CA "$P/front-proxy-ca.crt" -CAkey "$P/front-proxy-ca.key" -CAcreateserial -days 30 \
  -extfile "$P/openssl.cnf" -extensions client -out "$P/front-proxy-client.crt"
ossl genrsa -out "$P/sa.key" 2048
ossl rsa -in "$P/sa.key" -pubout -out "$P/sa.pub"
kubeconfig() { # kubeconfig FILE CERTNAME
  cat >"$1" <<EOF
apiVersion: v1
kind: Config
clusters:
- name: tessera
  cluster:
    server: https://127.0.0.1:$API_PORT
    certificate-authority: $P/ca.crt
users:
- name: $2
  user:
    client-certificate: $P/$2.crt
    client-key: $P/$2.key
contexts:
- name: tessera
  context: {cluster: tessera, user: $2}
current-context: tessera
EOF
}
kubeconfig "$DIR/kubeconfig" admin
kubeconfig "$P/controller-manager.kubeconfig" controller-manager
kubeconfig "$P/scheduler.kubeconfig" scheduler
kubeconfig "$P/kubelet.kubeconfig" kubelet
log "certificates written"

# ---------- feature gates and API versions for this release ----------
# Tessera's DRA gates, each set where the release has it (read from its
# pkg/features/kube_features.go in the module cache): alpha ones must be turned on, the
# beta/GA ones are on by default (set anyway; a locked GA gate only warns).
features=$(go env GOMODCACHE)/k8s.io/kubernetes@$K8S_VERSION/pkg/features/kube_features.go
[ -f "$features" ] || (cd "$K8S_MOD" && go mod download k8s.io/kubernetes)
gates=""
# GenericWorkload (Workload, PodGroup, pod.spec.schedulingGroup, the scheduler's
# GangScheduling plugin) and DRAWorkloadResourceClaims (a claim reserved for a PodGroup)
# exist from 1.35 and 1.36 and are off by default in 1.37 (beta).
for g in DRAConsumableCapacity DRAPartitionableDevices DRAExtendedResource DRADeviceTaints DRADeviceTaintRules DRAAdminAccess ResourceHealthStatus GenericWorkload DRAWorkloadResourceClaims; do
  grep -q "^	$g: {" "$features" && gates+="${gates:+,}$g=true"
done
[ -n "${TESSERA_CLUSTER_GATES+set}" ] && gates=$TESSERA_CLUSTER_GATES
# resource.k8s.io/v1 is GA (on by default); the beta versions too for older clients;
# v1alpha3 (DeviceTaintRule) while DeviceTaintRule is alpha (1.34, 1.35).
runtime_config=resource.k8s.io/v1=true,resource.k8s.io/v1beta1=true,resource.k8s.io/v1beta2=true
[ "$K8S_MINOR" -le 35 ] && runtime_config+=,resource.k8s.io/v1alpha3=true
# scheduling.k8s.io/v1beta1 (Workload, PodGroup) is a beta API, off by default (1.37).
[[ ",$gates," == *",GenericWorkload=true,"* && "$K8S_MINOR" -ge 37 ]] && runtime_config+=,scheduling.k8s.io/v1beta1=true
echo "$gates" >"$DIR/feature-gates"

# start NAME CMD...: a daemon in the background, its own session, output to logs/NAME.log.
start() {
  local name=$1; shift
  setsid "$@" </dev/null >"$DIR/logs/$name.log" 2>&1 &
  echo $! >"$DIR/pids/$name"
}
# wait_for WHAT SECONDS CMD...: polls CMD until it succeeds.
wait_for() {
  local what=$1 secs=$2 t; shift 2
  t=$(now)
  until "$@" >/dev/null 2>&1; do
    awk -v a="$t" -v b="$(now)" -v s="$secs" 'BEGIN { exit !(b - a > s) }' && die "$what not up after ${secs}s"
    sleep 0.2
  done
  log "$what up"
}
alive() { kill -0 "$(cat "$DIR/pids/$1")" 2>/dev/null; }

# ---------- etcd 3.5 (Debian trixie's etcd-server, from the chroot; it needs only libc) ----------
start etcd nice -n 5 "$R/usr/bin/etcd" --name tessera --data-dir "$DIR/etcd" \
  --listen-client-urls "http://127.0.0.1:$ETCD_PORT" --advertise-client-urls "http://127.0.0.1:$ETCD_PORT" \
  --listen-peer-urls "http://127.0.0.1:$ETCD_PEER_PORT" --initial-advertise-peer-urls "http://127.0.0.1:$ETCD_PEER_PORT" \
  --initial-cluster "tessera=http://127.0.0.1:$ETCD_PEER_PORT" --initial-cluster-state new \
  --unsafe-no-fsync --snapshot-count 10000 --log-level warn
wait_for etcd 30 curl -fsS "http://127.0.0.1:$ETCD_PORT/health"

# ---------- kube-apiserver ----------
# An audit log of the plugin's own requests only (its ServiceAccount), at Metadata
# level: every call with its verb and URI (selectors included), for scale/api-calls.py.
cat >"$DIR/audit-policy.yaml" <<EOF
apiVersion: audit.k8s.io/v1
kind: Policy
omitStages: [RequestReceived]
rules:
- level: Metadata
  users: ["system:serviceaccount:tessera-system:tessera-plugin"]
- level: None
EOF
start kube-apiserver "$BIN/kube-apiserver" \
  --audit-policy-file="$DIR/audit-policy.yaml" --audit-log-path="$DIR/audit.log" --audit-log-maxsize=200 \
  --bind-address=127.0.0.1 --advertise-address=127.0.0.1 --secure-port="$API_PORT" \
  --etcd-servers="http://127.0.0.1:$ETCD_PORT" \
  --tls-cert-file="$P/apiserver.crt" --tls-private-key-file="$P/apiserver.key" \
  --client-ca-file="$P/ca.crt" --cert-dir="$DIR/apiserver-certs" \
  --service-account-issuer=https://kubernetes.default.svc.cluster.local \
  --service-account-key-file="$P/sa.pub" --service-account-signing-key-file="$P/sa.key" \
  --service-cluster-ip-range="$SERVICE_CIDR" \
  --endpoint-reconciler-type=none \
  --authorization-mode=Node,RBAC --enable-admission-plugins=NodeRestriction \
  --kubelet-client-certificate="$P/apiserver-kubelet-client.crt" --kubelet-client-key="$P/apiserver-kubelet-client.key" \
  --kubelet-preferred-address-types=Hostname \
  --requestheader-client-ca-file="$P/front-proxy-ca.crt" --requestheader-allowed-names=front-proxy-client \
  --requestheader-username-headers=X-Remote-User --requestheader-group-headers=X-Remote-Group \
  --requestheader-extra-headers-prefix=X-Remote-Extra- \
  --proxy-client-cert-file="$P/front-proxy-client.crt" --proxy-client-key-file="$P/front-proxy-client.key" \
  --allow-privileged=true \
  --runtime-config="$runtime_config" --feature-gates="$gates" --v=1
apicurl() { curl -fsS --cacert "$P/ca.crt" --cert "$P/admin.crt" --key "$P/admin.key" "https://127.0.0.1:$API_PORT$1"; }
wait_for kube-apiserver 120 apicurl /readyz

# ---------- kube-controller-manager and kube-scheduler ----------
start kube-controller-manager "$BIN/kube-controller-manager" \
  --bind-address=127.0.0.1 --secure-port="$KCM_PORT" \
  --kubeconfig="$P/controller-manager.kubeconfig" \
  --authentication-kubeconfig="$P/controller-manager.kubeconfig" --authorization-kubeconfig="$P/controller-manager.kubeconfig" \
  --service-account-private-key-file="$P/sa.key" --root-ca-file="$P/ca.crt" \
  --cluster-signing-cert-file="$P/ca.crt" --cluster-signing-key-file="$P/ca.key" \
  --use-service-account-credentials=true --controllers='*' \
  --service-cluster-ip-range="$SERVICE_CIDR" --leader-elect=false \
  --feature-gates="$gates" --v=1
start kube-scheduler "$BIN/kube-scheduler" \
  --bind-address=127.0.0.1 --secure-port="$SCHED_PORT" \
  --kubeconfig="$P/scheduler.kubeconfig" \
  --authentication-kubeconfig="$P/scheduler.kubeconfig" --authorization-kubeconfig="$P/scheduler.kubeconfig" \
  --leader-elect=false --feature-gates="$gates" --v=1

if [ "${TESSERA_CLUSTER_NODELESS:-}" = 1 ]; then
  cat >"$DIR/env" <<EOF
KUBECONFIG=$DIR/kubeconfig
K8S_VERSION=$K8S_VERSION
K8S_BIN=$BIN
API_PORT=$API_PORT
ETCD_PORT=$ETCD_PORT
KCM_PORT=$KCM_PORT
SCHED_PORT=$SCHED_PORT
EOF
  for d in etcd kube-apiserver kube-controller-manager kube-scheduler; do alive "$d" || die "$d exited"; done
  echo "control plane up without a node ($K8S_VERSION) $(since "$T0")s after up.sh started"
  echo "KUBECONFIG=$DIR/kubeconfig"
  exit 0
fi

# ---------- containerd 1.7 (chrooted, nested mount namespace) ----------
C=$DIR/containerd
cat >"$C/config.toml" <<EOF
version = 2
root = "$C/root"
state = "$C/state"
disabled_plugins = ["io.containerd.snapshotter.v1.aufs", "io.containerd.snapshotter.v1.btrfs", "io.containerd.snapshotter.v1.devmapper", "io.containerd.snapshotter.v1.zfs", "io.containerd.tracing.processor.v1.otlp", "io.containerd.internal.v1.tracing"]
[grpc]
  address = "$C/containerd.sock"
[ttrpc]
  address = "$C/containerd.sock.ttrpc"
[plugins."io.containerd.internal.v1.opt"]
  path = "$C/opt"
[plugins."io.containerd.grpc.v1.cri"]
  enable_cdi = true
  cdi_spec_dirs = ["$DIR/cdi"]
  sandbox_image = "localhost/tessera/pause:1"
  # No CAP_SYS_RESOURCE here: the pause container's oom_score_adj=-998 would fail.
  restrict_oom_score_adj = true
  stream_server_address = "127.0.0.1"
  stream_server_port = "0"
  netns_mounts_under_state_dir = true
  enable_selinux = false
  [plugins."io.containerd.grpc.v1.cri".containerd]
    snapshotter = "overlayfs"
    default_runtime_name = "runc"
    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
        SystemdCgroup = false
  [plugins."io.containerd.grpc.v1.cri".cni]
    bin_dir = "/usr/lib/cni"
    conf_dir = "$DIR/cni/net.d"
    max_conf_num = 1
EOF
# The pods' network: a bridge without an address (the host cannot reach the pods, nor
# they it), no gateway, no routes, no masquerade; host-local addresses in POD_CIDR.
cat >"$DIR/cni/net.d/10-tessera.conflist" <<EOF
{
  "cniVersion": "1.0.0",
  "name": "tessera",
  "plugins": [
    {
      "type": "bridge",
      "bridge": "$BRIDGE",
      "isGateway": false,
      "isDefaultGateway": false,
      "ipMasq": false,
      "hairpinMode": false,
      "ipam": {
        "type": "host-local",
        "ranges": [[{"subnet": "$POD_CIDR"}]],
        "routes": [],
        "dataDir": "$DIR/cni/ipam"
      }
    },
    {"type": "loopback"}
  ]
}
EOF
echo "$BRIDGE" >"$DIR/bridge"
shares="$DIR ${TESSERA_CLUSTER_SHARES:-}"
# pivot_root, not chroot: the chroot becomes the root of containerd's mount namespace, so
# that a process entering a container's mount namespace later (runc exec: kubectl exec,
# CRI ExecSync) gets the container's root. Under a mere chroot the namespace root stays
# the host's /, and runc's pivot_root in the container only moves the chrooted init:
# `kubectl exec` then lands in the host's root filesystem.
start containerd unshare --mount --propagation slave sh -c '
set -e
R=$1; CONF=$2; shift 2
mount --bind "$R" "$R"
mount -t proc proc "$R/proc"
mount --rbind /sys "$R/sys"
mount --rbind /dev "$R/dev"
mount -t tmpfs tmpfs "$R/run"
mount -t tmpfs tmpfs "$R/tmp"
for d in "$@"; do mkdir -p "$R$d"; mount --rbind "$d" "$R$d"; done
cd "$R"
pivot_root . .
umount -l .
cd /
exec /usr/bin/env -i PATH=/usr/sbin:/usr/bin:/sbin:/bin HOME=/root containerd --config "$CONF"
' sh "$R" "$C/config.toml" $shares
wait_for containerd 30 test -S "$C/containerd.sock"
CONTAINERD_SOCKET=$C/containerd.sock   # (lib.sh kctr: ctr in containerd's mount namespace)

# ---------- images, built here (no registry): busybox-static from the chroot ----------
rootfs=$DIR/images/busybox-rootfs
mkdir -p "$rootfs"/{bin,etc,dev,proc,sys,tmp,root,var/run}
cp "$R/bin/busybox" "$rootfs/bin/"
for a in $("$rootfs/bin/busybox" --list); do [ "$a" = busybox ] || ln -sf busybox "$rootfs/bin/$a"; done
echo 'root:x:0:0:root:/root:/bin/sh' >"$rootfs/etc/passwd"
echo 'root:x:0:' >"$rootfs/etc/group"
chmod 1777 "$rootfs/tmp"
# The pod sandbox ("pause") image: a process that sleeps forever.
mkimage "$rootfs" localhost/tessera/pause:1 "$DIR/images/pause.tar" '["/bin/sleep","infinity"]'
mkimage "$rootfs" localhost/tessera/busybox:1 "$DIR/images/busybox.tar" '["/bin/sh"]'
for i in pause busybox; do kctr images import "$DIR/images/$i.tar" >>"$DIR/logs/images.log" 2>&1 || die "ctr images import $i.tar"; done
log "images imported (localhost/tessera/pause:1, localhost/tessera/busybox:1)"

# ---------- kubelet ----------
{
  cat <<EOF
apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
address: 127.0.0.1
port: $KUBELET_PORT
readOnlyPort: 0
healthzBindAddress: 127.0.0.1
healthzPort: $KUBELET_HEALTHZ_PORT
authentication:
  anonymous: {enabled: false}
  webhook: {enabled: true}
  x509: {clientCAFile: $P/ca.crt}
authorization: {mode: Webhook}
cgroupDriver: cgroupfs
cgroupsPerQOS: true
cgroupRoot: $CGROUP_ROOT
enforceNodeAllocatable: []
failSwapOn: false
# The machine's disk is shared with other work: the default hard thresholds
# (imagefs.available<15%, nodefs.available<10%; containerd's image store is on the
# root filesystem, so both apply to it) put the node under DiskPressure (taint
# node.kubernetes.io/disk-pressure, pods unschedulable) as soon as the disk is 85% full.
evictionHard:
  memory.available: 100Mi
  nodefs.available: 1%
  nodefs.inodesFree: 1%
  imagefs.available: 1%
# No image garbage collection: the images are imported, not pulled (there is no
# registry), so a collected one is gone for good. With the default threshold (85 %) the
# kubelet removed the unused localhost/tessera/busybox:1 five minutes after start on the
# 86 % full shared disk, and the test pods then failed with ErrImageNeverPull.
imageGCHighThresholdPercent: 100
imageGCLowThresholdPercent: 99
# cgroup v1 host: refused by default from 1.35 (the field exists since 1.31).
failCgroupV1: false
containerRuntimeEndpoint: unix://$C/containerd.sock
resolvConf: $DIR/etc/resolv.conf
podLogsDir: $DIR/pod-logs
registerNode: true
rotateCertificates: false
serverTLSBootstrap: false
featureGates:
EOF
  tr ',' '\n' <<<"$gates" | sed 's/^\(.*\)=\(.*\)$/  \1: \2/'
} >"$DIR/kubelet.yaml"
start kubelet "$BIN/kubelet" --config="$DIR/kubelet.yaml" --kubeconfig="$P/kubelet.kubeconfig" \
  --root-dir="$DIR/kubelet" --hostname-override="$NODE" --v=2
wait_for "kubelet healthz" 60 curl -fsS "http://127.0.0.1:$KUBELET_HEALTHZ_PORT/healthz"

# ---------- node Ready ----------
cat >"$DIR/env" <<EOF
KUBECONFIG=$DIR/kubeconfig
K8S_VERSION=$K8S_VERSION
K8S_BIN=$BIN
TESSERA_CLUSTER_ROOT=$R
API_PORT=$API_PORT
ETCD_PORT=$ETCD_PORT
KUBELET_PORT=$KUBELET_PORT
KUBELET_HEALTHZ_PORT=$KUBELET_HEALTHZ_PORT
KCM_PORT=$KCM_PORT
SCHED_PORT=$SCHED_PORT
CONTAINERD_SOCKET=$C/containerd.sock
KUBELET_ROOT_DIR=$DIR/kubelet
CDI_DIR=$DIR/cdi
NODE_NAME=$NODE
BRIDGE=$BRIDGE
EOF
ready() {
  [ "$("$BIN/kubectl" --kubeconfig "$DIR/kubeconfig" get node "$NODE" \
    -o 'jsonpath={.status.conditions[?(@.type=="Ready")].status}' 2>/dev/null)" = True ]
}
t=$(now)
until ready; do
  for d in etcd kube-apiserver kube-controller-manager kube-scheduler containerd kubelet; do
    alive "$d" || die "$d exited"
  done
  awk -v a="$t" -v b="$(now)" 'BEGIN { exit !(b - a > 180) }' && die "node $NODE not Ready after 180s"
  sleep 0.5
done
"$BIN/kubectl" --kubeconfig "$DIR/kubeconfig" get node -o wide
pressure=$(node_pressure "$BIN/kubectl" --kubeconfig "$DIR/kubeconfig")
# (The not-ready taint outlives Ready by a moment: only the pressure conditions count.)
[[ $pressure != *Pressure* ]] || die "node $NODE is Ready but not schedulable: $pressure ($(df -h --output=avail,pcent "$DIR" | tail -1 | xargs) free/used on $DIR's disk)"
echo "node $NODE Ready ($K8S_VERSION) $(since "$T0")s after up.sh started"
echo "KUBECONFIG=$DIR/kubeconfig"
echo "stop with: $here/down.sh $DIR"
