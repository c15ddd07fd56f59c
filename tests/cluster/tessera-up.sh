#!/usr/bin/env bash
# Installs Tessera on a running cluster of up.sh the way users install it: the image
# (image.sh, imported into the cluster's containerd) and `kubectl apply -k` of
# deploy/overlays/test-cluster (the production base with the simulated node), with this
# cluster's paths and ports layered on top in DIR/tessera-deploy/. Then waits until the
# plugin pod is Ready, has registered with the kubelet through its plugin registry, and
# its ResourceSlices are stored by the API server.
# Usage (root): tessera-up.sh DIR        (after `up.sh VERSION DIR`)
# Exit status: 0 installed and registered; 2 installed (pod Ready, slices stored) but the
# kubelet did not register the plugin; 1 anything else.
# The node is TESSERA_CLUSTER_BACKEND's (mock-node-root.sh): the mock backend, or
# `--backend nvml` on one of NVIDIA's models (nvml:dgxh100), whose bridge is the driver
# root's libnvidia-ml.so.1 and whose environment (TESSERA_NVML_MODEL*) the pod gets.
# Writes: DIR/tessera-node/ (the simulated node's host side: dev/ of mknod'ed device
# nodes, driver-root/ of fake driver files, run/, state/), DIR/tessera-deploy/
# (kustomization), DIR/tessera/ (apply output, plugin log, slices as stored).
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
. "$here/lib.sh"
repo=$(cd "$here/../.." && pwd)
DIR=$(cd "${1:?usage: tessera-up.sh DIR}" && pwd)
cluster_env
DIE_CONTEXT=plugin_state
overlay=$repo/deploy/overlays/test-cluster
NODE_ROOT=$DIR/tessera-node
OUT=$DIR/tessera
mkdir -p "$OUT"
T0=$(now)

# Unix socket paths are limited to 107 bytes (sun_path): the kubelet must reach
# <root-dir>/plugins_registry/gpu.tessera.dev-<pod UID>-reg.sock and
# <root-dir>/plugins/gpu.tessera.dev/dra-<pod UID>.sock.
reg_sock=$KUBELET_ROOT_DIR/plugins_registry/gpu.tessera.dev-00000000-0000-0000-0000-000000000000-reg.sock
longest=${#reg_sock}
if [ "$longest" -gt 107 ]; then
  die "DIR too long for the plugin's sockets: $KUBELET_ROOT_DIR/plugins_registry/gpu.tessera.dev-<uid>-reg.sock would be $longest bytes (max 107)"
fi

# ---------- the simulated node's host side (mock-node-root.sh) ----------
"$here/mock-node-root.sh" "$DIR" | sed 's/^/  /'
node_backend_flags

# ---------- the image ----------
"$here/image.sh" "$DIR" >/dev/null
log "image imported"

# ---------- the node label Node Feature Discovery would set (the DaemonSet's nodeSelector) ----------
k label node "$NODE_NAME" feature.node.kubernetes.io/pci-10de.present=true --overwrite >/dev/null

REGISTRY=$KUBELET_ROOT_DIR/plugins_registry

# ---------- this cluster's layer: kubelet root dir, CDI dir, node root, API port ----------
METRICS_PORT=$(reserve_port "$DIR")
D=$DIR/tessera-deploy
mkdir -p "$D"
cat >"$D/kustomization.yaml" <<EOF
# Written by tests/cluster/tessera-up.sh for the cluster in $DIR: the test-cluster
# overlay with this cluster's kubelet root dir ($KUBELET_ROOT_DIR), CDI dir, simulated
# node root ($NODE_ROOT), API server port and a free metrics port; the node's backend
# ($(node_backend)).
apiVersion: kustomize.config.k8s.io/v1beta1
kind: Kustomization
resources:
- $(realpath --relative-to="$D" "$overlay")
patches:
- target: {group: apps, version: v1, kind: DaemonSet, name: tessera-plugin}
  patch: |-
    apiVersion: apps/v1
    kind: DaemonSet
    metadata:
      name: tessera-plugin
    spec:
      template:
        metadata:
          annotations:
            prometheus.io/port: "$METRICS_PORT"
        spec:
          containers:
          - name: plugin
            args:
            - $BACKEND_FLAG
            - --plugin-dir=$KUBELET_ROOT_DIR/plugins/gpu.tessera.dev
            - --dev-root=/host
            - --host-dev-root=$NODE_ROOT
            - --host-root=/host-root
            - --driver-root=/host-root$NODE_ROOT/driver-root
            - --host-driver-root=$NODE_ROOT/driver-root
            - --proc-root=/host/proc
            - --run-dir=/run/tessera
            - --host-run-dir=$NODE_ROOT/run
            - --state-dir=/var/lib/tessera
            - --cdi-dir=/var/run/cdi
            - --interception-lib=/usr/local/lib/tessera/libtessera_cuda.so
            env:
            - name: KUBERNETES_SERVICE_PORT
              value: "$API_PORT"
            - name: TESSERA_METRICS_ADDR
              value: 127.0.0.1:$METRICS_PORT
$(sed 's/^/            /' <<<"$BACKEND_ENV_YAML")
            ports:
            - containerPort: 9464
              \$patch: delete
            - name: metrics
              containerPort: $METRICS_PORT
            # The plugin's socket directory at the kubelet's own path: the endpoint the
            # plugin registers is a path the kubelet opens.
            volumeMounts:
            - mountPath: /var/lib/kubelet/plugins
              \$patch: delete
            - name: plugins
              mountPath: $KUBELET_ROOT_DIR/plugins
          volumes:
          - name: plugins-registry
            hostPath: {path: $REGISTRY}
          - name: plugins
            hostPath: {path: $KUBELET_ROOT_DIR/plugins}
          - name: cdi
            hostPath: {path: $CDI_DIR}
          - name: host-dev
            hostPath: {path: $NODE_ROOT/dev}
          - name: run-tessera
            hostPath: {path: $NODE_ROOT/run}
          - name: state
            hostPath: {path: $NODE_ROOT/state}
EOF
# Before 1.37 with DRAExtendedResource off (its default there), users apply the
# k8s-1.34 overlay's change: DeviceClass gpu.tessera.dev without extendedResourceName.
if [ "$K8S_MINOR" -lt 37 ] && ! grep -q 'DRAExtendedResource=true' "$DIR/feature-gates"; then
  cat >>"$D/kustomization.yaml" <<EOF
# DRAExtendedResource is off: as deploy/overlays/k8s-1.34.
- target: {group: resource.k8s.io, version: v1, kind: DeviceClass, name: gpu.tessera.dev}
  patch: |-
    - op: remove
      path: /spec/extendedResourceName
EOF
  log "DRAExtendedResource off: DeviceClass gpu.tessera.dev without extendedResourceName (as deploy/overlays/k8s-1.34)"
fi
# 1.34 with DRAConsumableCapacity on: the k8s-1.34 overlay's one-share-per-request
# policy (its scheduler panics on a request's second share; README finding 7).
if [ "$K8S_MINOR" = 34 ] && grep -q 'DRAConsumableCapacity=true' "$DIR/feature-gates"; then
  cp "$repo/deploy/overlays/k8s-1.34/admission-shares.yaml" "$D/"
  sed -i 's/^resources:$/resources:\n- admission-shares.yaml/' "$D/kustomization.yaml"
  log "DRAConsumableCapacity on 1.34: one share per request (as deploy/overlays/k8s-1.34)"
fi
k kustomize "$D" >"$OUT/rendered.yaml"
# Nothing of the rendered DaemonSet may still point at a production host path.
if grep -nE 'path: (/var/lib/kubelet|/var/run/cdi|/run/tessera|/var/lib/tessera|/dev$|/var/lib/tessera-mock)' "$OUT/rendered.yaml"; then
  die "the rendered DaemonSet still has production host paths (above)"
fi

# ---------- kubectl apply -k ----------
default_sa || true
t_apply=$(now)
k apply -k "$D" >"$OUT/apply.out" 2>"$OUT/apply.err" || { cat "$OUT/apply.out" "$OUT/apply.err" >&2; die "kubectl apply -k $D"; }
sed 's/^/  apply: /' "$OUT/apply.out"
[ -s "$OUT/apply.err" ] && sed 's/^/  apply (stderr): /' "$OUT/apply.err"
log "kubectl apply -k $D"

# ---------- the plugin pod: Ready, registered, slices published ----------
pod=$(plugin_pod_ready) || die "the plugin pod is not Ready"
t_ready=$(since "$t_apply")
log "plugin pod $pod Ready ${t_ready}s after kubectl apply"
for i in $(seq 150); do [ -n "$(node_slices)" ] && break; sleep 0.2; done
[ -n "$(node_slices)" ] || die "no ResourceSlices of gpu.tessera.dev for $NODE_NAME"
t_slices=$(since "$t_apply")
k get resourceslices -o yaml >"$OUT/resourceslices.yaml"
k get resourceslices -o custom-columns='NAME:.metadata.name,NODE:.spec.nodeName,DRIVER:.spec.driver,POOL:.spec.pool.name,GEN:.spec.pool.generation,COUNT:.spec.pool.resourceSliceCount,DEVICES:.spec.devices[*].name' | sed 's/^/  /'
log "ResourceSlices stored ${t_slices}s after kubectl apply (all of them: $OUT/resourceslices.yaml)"
registered=1
if ! plugin_registered "$pod"; then
  registered=0
  grep -E 'RegisterPlugin error' "$DIR/logs/kubelet.log" | tail -1 | sed 's/^/  kubelet: /' >&2
  echo "  FAIL the plugin logged no registration with the kubelet (30s); continuing without it" >&2
else
  echo "  ok   the plugin logged: registered with the kubelet"
fi
for i in $(seq 50); do reg=$(ls "$KUBELET_ROOT_DIR/plugins_registry/"); [ -n "$reg" ] && break; sleep 0.1; done
echo "  registration socket in the kubelet's plugin registry: $reg"
[[ $reg == gpu.tessera.dev-*reg.sock ]] || die "no gpu.tessera.dev registration socket in $KUBELET_ROOT_DIR/plugins_registry"
plog "$pod" >"$OUT/plugin.log"
if grep -E ' (WARN|ERROR) ' "$OUT/plugin.log"; then
  echo "  (warnings of the plugin above; full log $OUT/plugin.log)"
fi
# The shipped backend: `tessera doctor` in the plugin's pod (with no flags it takes the
# plugin's, as docs/operating.md runs it) must pass on NVIDIA's model (exit 0: no check
# fails; warnings allowed). scenario-helm.sh runs it on its install of either backend.
if [ "$(node_backend)" != mock ]; then
  if exec_retry k -n tessera-system exec "$pod" -c plugin -- tessera doctor >"$OUT/doctor.txt" 2>"$OUT/doctor.err"; then
    echo "  ok   tessera doctor in $pod: exit 0 ($(tail -1 "$OUT/doctor.txt"))"
    sed 's/^/  | /' "$OUT/doctor.txt"
  else
    sed 's/^/  | /' "$OUT/doctor.txt" "$OUT/doctor.err" >&2
    die "tessera doctor in $pod exited non-zero on $(node_backend)"
  fi
fi
echo "TESSERA_POD=$pod" >"$OUT/env"
echo "METRICS_PORT=$METRICS_PORT" >>"$OUT/env"
if [ "$registered" = 0 ]; then
  echo "tessera installed on $NODE_NAME ($K8S_VERSION) but NOT registered with the kubelet: pod Ready ${t_ready}s, slices ${t_slices}s after kubectl apply" >&2
  exit 2
fi
echo "tessera installed on $NODE_NAME ($K8S_VERSION): pod Ready ${t_ready}s, slices ${t_slices}s after kubectl apply"
