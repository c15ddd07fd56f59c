#!/usr/bin/env bash
# Scenario: Tessera installed, used, upgraded and removed with Helm (deploy/helm/tessera)
# on a cluster of up.sh that has no Tessera yet (a fresh one: the chart and the kustomize
# install of tessera-up.sh own the same objects). The helm CLI is the pinned one of
# helm/build.sh (built from its Go module, cached in target/helm/<version>/).
#
# Steps, each check printed ok/FAIL:
#  1. dry run: the chart rendered (`helm template`) with the default values, this cluster's
#     values and the other modes passes `kubectl apply --dry-run=server`, and the API
#     server returns every rendered field unchanged (nothing dropped or rewritten);
#  2. install: `helm install --create-namespace` with the node's backend (the mock, or
#     `--backend nvml` on NVIDIA's model: TESSERA_CLUSTER_BACKEND, mock-node-root.sh) and this cluster's
#     paths and ports: the DaemonSet rolls out, the plugin registers with the kubelet and
#     publishes ResourceSlices; `kubectl exec ... tessera doctor` in the plugin's pod
#     exits 0 (its output printed); then scenario-one-gpu.sh
#     (examples/workloads/01-one-gpu.yaml) and scenario-inventory.sh run against it
#     unchanged;
#  3. upgrade: the image retagged in the cluster's containerd (`ctr images tag`), `helm
#     upgrade --set image.tag=...` while pods with GPU claims are created and deleted in a
#     loop: the DaemonSet's pod is replaced by a surge pod (maxSurge 1; with the host's
#     network the new pod gets another metrics port, see below), every pod created
#     meanwhile starts, and no FailedPrepareDynamicResources event is recorded;
#  4. uninstall: `helm uninstall` leaves no object with the chart's labels or Tessera's
#     names (every listable resource type, namespaced and cluster-scoped); the kubelet
#     removes the node's ResourceSlices; lists what stays on the node (checkpoint, run
#     dir) -- deploy/helm/tessera/README.md documents it.
#
# Why the metrics port changes in step 3: this cluster has no kube-proxy, so the plugin
# uses the host's network and its metrics port is a host port; a surge pod with the same
# port could not be scheduled beside the old one. Production installs (pod network) surge
# with one port.
# TESSERA_HELM_UPGRADE=replace upgrades with the chart's host-network default instead
# (maxSurge 0: a gap without plugin; the no-failed-prepare check is expected to fail then).
# Usage (root): scenario-helm.sh DIR     (after `up.sh VERSION DIR`; tessera-helm-e2e.sh runs both)
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
. "$here/lib.sh"
repo=$(cd "$here/../.." && pwd)
DIR=$(cd "${1:?usage: scenario-helm.sh DIR}" && pwd)
cluster_env
DIE_CONTEXT=plugin_state
chart=$repo/deploy/helm/tessera
NS=tessera-system
NODE_ROOT=$DIR/tessera-node
OUT=$DIR/tessera-helm
mkdir -p "$OUT" "$DIR/tessera"
HELM=$("$here/helm/build.sh" | tail -1)
# No user helm config, cache or repositories.
export HELM_CACHE_HOME=$OUT/helm-home/cache HELM_CONFIG_HOME=$OUT/helm-home/config HELM_DATA_HOME=$OUT/helm-home/data
h() { "$HELM" "$@"; }
UPGRADE=${TESSERA_HELM_UPGRADE:-surge}
[[ $UPGRADE == surge || $UPGRADE == replace ]] || { echo "TESSERA_HELM_UPGRADE: surge or replace, not $UPGRADE" >&2; exit 2; }
T0=$(now)
echo "scenario helm ($K8S_VERSION): $(h version --short), chart $(sed -n 's/^version: //p' "$chart/Chart.yaml")"

# ---------- 0. a cluster without Tessera ----------
[ -z "$(k get daemonsets -A -l app.kubernetes.io/name=tessera -o name)" ] ||
  die "Tessera is already installed on this cluster (tessera-up.sh?): use a fresh cluster"
"$here/mock-node-root.sh" "$DIR" | sed 's/^/  /'
node_backend_flags
"$here/image.sh" "$DIR" >/dev/null 2>&1 || die "image.sh $DIR"
k label node "$NODE_NAME" feature.node.kubernetes.io/pci-10de.present=true --overwrite >/dev/null
grep -qx localhost/tessera/tessera:dev <<<"$(kctr images ls -q)" || die "localhost/tessera/tessera:dev not in the cluster's containerd"
log "simulated node, image localhost/tessera/tessera:dev imported, node labelled"

# ---------- this cluster's values ----------
METRICS_PORT=$(reserve_port "$DIR")
METRICS_PORT2=$(reserve_port "$DIR")
ext=nvidia.com/gpu
if ! grep -q 'DRAExtendedResource=true' <<<"$GATES" && [ "$K8S_MINOR" -lt 37 ]; then
  ext=""   # as deploy/overlays/k8s-1.34: the API server would drop the field
fi
# The node: the chart's mock mode, or (`nvml:MODEL`, mock-node-root.sh) the chart's
# default `--backend nvml` with the simulated node's driver and dev roots as a user sets
# them, and the model's environment.
if [ "$(node_backend)" = mock ]; then
  node_values="mock:
  enabled: true
  hostRoot: $NODE_ROOT"
else
  node_values="extraEnv:
$BACKEND_ENV_YAML"
fi
if [ "$(node_backend)" != mock ]; then
  # Off the mock node the chart mounts the host's / HostToContainer (a driver container
  # may mount its root later), which the CRI refuses unless / is a shared or slave mount,
  # as systemd leaves it on a real node. This cluster's containerd namespace has it
  # private: made shared there (only there; gone with it at down.sh).
  nsenter --mount --target "$(cat "$DIR/pids/containerd")" mount --make-rshared / || die "mount --make-rshared / in containerd's namespace"
fi
cat >"$OUT/values.yaml" <<EOF
# Written by tests/cluster/scenario-helm.sh for the cluster in $DIR: the simulated node
# ($(node_backend)), the local image, and this cluster's kubelet root dir, CDI dir, API
# server and ports.
image:
  repository: localhost/tessera/tessera
  tag: dev
  pullPolicy: Never
$node_values
hostNetwork: true
apiServer:
  host: 127.0.0.1
  port: "$API_PORT"
metrics:
  host: 127.0.0.1
  port: $METRICS_PORT
hostPaths:
  kubeletRootDir: $KUBELET_ROOT_DIR
  cdiDir: $CDI_DIR
  runDir: $NODE_ROOT/run
  stateDir: $NODE_ROOT/state
$([ "$(node_backend)" = mock ] || printf '  driverRoot: %s\n  devRoot: %s' "$NODE_ROOT/driver-root" "$NODE_ROOT")
deviceClasses:
  gpu:
    enabled: true
    extendedResourceName: "$ext"
EOF

# ---------- 1. server-side dry run of each mode ----------
echo "step 1: kubectl apply --dry-run=server of the rendered chart"
# The namespace exists first, as `helm install --create-namespace` makes it before the objects.
k create namespace "$NS" >/dev/null
dry_run() { # dry_run NAME HELM-ARGS...
  local name=$1 f=$OUT/dry-run-$1
  shift
  h template tessera "$chart" -n "$NS" "$@" >"$f.yaml" 2>"$f.err" || { bad "$name: helm template: $(cat "$f.err")"; return; }
  if ! k apply --dry-run=server -o json -f "$f.yaml" >"$f.json" 2>"$f.err"; then
    bad "$name: kubectl apply --dry-run=server: $(tr '\n' ' ' <"$f.err")"
    return
  fi
  # Every field of every rendered object, as the API server would store it.
  if python3 - "$f.yaml" "$f.json" >"$f.check" 2>&1 <<'PY'; then
import json, sys, yaml
sent = [d for d in yaml.safe_load_all(open(sys.argv[1])) if d]
got = json.load(open(sys.argv[2]))
got = got["items"] if got.get("kind") == "List" else [got]
index = {(o["kind"], o["metadata"]["name"]): o for o in got}
problems = []
def sub(a, b, path):
    if isinstance(a, dict):
        if not isinstance(b, dict):
            return problems.append(f"{path}: {b!r}")
        for key in a:
            if key not in b:
                problems.append(f"{path}.{key}: dropped")
            else:
                sub(a[key], b[key], f"{path}.{key}")
    elif isinstance(a, list):
        if not isinstance(b, list) or len(a) != len(b):
            return problems.append(f"{path}: {a!r} -> {b!r}")
        for i, (x, y) in enumerate(zip(a, b)):
            sub(x, y, f"{path}[{i}]")
    elif a != b and str(a) != str(b):
        problems.append(f"{path}: {a!r} -> {b!r}")
for o in sent:
    key = (o["kind"], o["metadata"]["name"])
    if key not in index:
        problems.append(f"{key}: not in the server's answer")
        continue
    sub(o, index[key], f"{key[0]}/{key[1]}")
print(f"{len(sent)} objects, {len(problems)} changed fields")
for p in problems:
    print("  " + p)
sys.exit(1 if problems else 0)
PY
    pass "$name: dry run accepted, every field kept ($(head -1 "$f.check"))"
  else
    bad "$name: the API server changed the rendered objects: $(cat "$f.check")"
  fi
}
dry_run defaults --set "deviceClasses.gpu.extendedResourceName=$ext"
dry_run this-cluster -f "$OUT/values.yaml"
dry_run watchdog-report -f "$OUT/values.yaml" --set watchdog.mode=report,watchdog.tolerance=1Gi
dry_run watchdog-off-classes-policies-off -f "$OUT/values.yaml" --set watchdog.mode=off,admissionPolicies.gpuConfig=false,admissionPolicies.resourceSlicesOwnNode=false,deviceClasses.gpu.enabled=false,deviceClasses.mig.enabled=false,deviceClasses.shared.enabled=false,deviceClasses.slot.enabled=false
dry_run dashboard-no-annotations --set metrics.grafanaDashboard.enabled=true,metrics.prometheusAnnotations=false --set "deviceClasses.gpu.extendedResourceName=$ext"
dry_run node-config -f "$repo/tests/data/helm/node-config.yaml" --set "deviceClasses.gpu.extendedResourceName=$ext"
# (The PodMonitor needs the Prometheus Operator's CRD, which this cluster has not.)
k delete namespace "$NS" --wait=true --timeout=120s >/dev/null
log "dry runs done; namespace $NS deleted again"

# ---------- 2. helm install ----------
echo "step 2: helm install"
t_install=$(now)
if ! h install tessera "$chart" -n "$NS" --create-namespace -f "$OUT/values.yaml" --wait --timeout 180s >"$OUT/install.out" 2>&1; then
  cat "$OUT/install.out" >&2
  die "helm install"
fi
t_helm=$(since "$t_install")
sed -n '/^NOTES:/,$p' "$OUT/install.out" | head -12 | sed 's/^/  | /'
eq "helm status" "$(h status tessera -n "$NS" -o json | jq -r .info.status)" deployed
# helm's --wait counts a DaemonSet ready when desired - maxUnavailable pods are: with the
# host network's replace strategy (maxUnavailable 1) on one node, at once. Wait here.
# (lib.sh plugin_pod_ready: the rollout, then the pod itself; a pod not Ready within
# 180 s fails the check below.)
pod=$(plugin_pod_ready) || true
[ -n "$pod" ] || pod=$(k -n "$NS" get pods -l app.kubernetes.io/name=tessera -o jsonpath='{.items[0].metadata.name}' 2>/dev/null || true)
[ -n "$pod" ] || die "no plugin pod after helm install"
t_ready=$(since "$t_install")
eq "plugin pod Ready ${t_ready}s after helm install (helm install --wait returned after ${t_helm}s)" "$(k -n "$NS" get pod "$pod" -o jsonpath='{.status.conditions[?(@.type=="Ready")].status}')" True
for i in $(seq 150); do [ -n "$(node_slices)" ] && break; sleep 0.2; done
[ -n "$(node_slices)" ] && pass "ResourceSlices published: $(node_slices | wc -l) ($(since "$t_install")s after helm install)" || bad "no ResourceSlices of gpu.tessera.dev for $NODE_NAME"
plugin_registered "$pod" && pass "the plugin registered with the kubelet" || bad "no registration with the kubelet in the plugin's log"
reg=$(ls "$KUBELET_ROOT_DIR/plugins_registry/")
[[ $reg == gpu.tessera.dev-*reg.sock ]] && pass "registration socket: $reg" || bad "registration socket: '$reg'"
eq "DeviceClasses (labelled by the chart)" "$(k get deviceclasses -l app.kubernetes.io/instance=tessera -o name | sort | tr '\n' ' ')" \
  "deviceclass.resource.k8s.io/gpu.tessera.dev deviceclass.resource.k8s.io/mig.tessera.dev deviceclass.resource.k8s.io/shared.tessera.dev deviceclass.resource.k8s.io/slot.tessera.dev "
# What the other scenarios read: the applied objects, the pod, the metrics port.
h get manifest tessera -n "$NS" >"$DIR/tessera/rendered.yaml"
printf 'TESSERA_POD=%s\nMETRICS_PORT=%s\n' "$pod" "$METRICS_PORT" >"$DIR/tessera/env"
k get resourceslices -o yaml >"$DIR/tessera/resourceslices.yaml"
log "installed: pod $pod"
# `tessera doctor` in the plugin's pod, as docs/operating.md's "When a pod does not start" runs
# it: with no flags it takes the plugin's; exit 0 (no check fails; warnings allowed).
if k -n "$NS" exec "$pod" -- tessera doctor >"$OUT/doctor.txt" 2>"$OUT/doctor.err"; then
  pass "tessera doctor in $pod: exit 0 ($(tail -1 "$OUT/doctor.txt"))"
else
  bad "tessera doctor in $pod exited non-zero: $(tail -3 "$OUT/doctor.err" | tr '\n' ' ')"
fi
sed 's/^/  | /' "$OUT/doctor.txt"
for s in one-gpu inventory; do
  if "$here/scenario-$s.sh" "$DIR" 2>&1 | sed 's/^/  /'; then pass "scenario-$s.sh on the Helm install"; else bad "scenario-$s.sh on the Helm install"; fi
done

# ---------- 3. helm upgrade to a new image tag, pods created meanwhile ----------
echo "step 3: helm upgrade (image tag dev -> dev2, $UPGRADE) with GPU pods created during it"
kctr images rm localhost/tessera/tessera:dev2 >/dev/null 2>&1 || true
kctr images tag localhost/tessera/tessera:dev localhost/tessera/tessera:dev2 >/dev/null
grep -qx localhost/tessera/tessera:dev2 <<<"$(kctr images ls -q)" && pass "localhost/tessera/tessera:dev2 tagged in the cluster's containerd" || die "ctr images tag"
example=$repo/examples/workloads/01-one-gpu.yaml
# The example's ResourceClaimTemplate; pods like the example's, one claim each.
python3 - "$example" "$OUT/churn-template.yaml" <<'PY'
import sys, yaml
docs = [d for d in yaml.safe_load_all(open(sys.argv[1])) if d]
yaml.safe_dump([d for d in docs if d["kind"] == "ResourceClaimTemplate"][0], open(sys.argv[2], "w"))
PY
k apply -f "$OUT/churn-template.yaml" >/dev/null
churn_pod() { # churn_pod NAME: the example's pod, busybox image, NAME
  cat <<EOF
apiVersion: v1
kind: Pod
metadata:
  name: $1
  labels: {tessera-test: churn}
spec:
  resourceClaims:
  - name: gpu
    resourceClaimTemplateName: one-gpu
  containers:
  - name: cuda
    image: localhost/tessera/busybox:1
    command: ["nvidia-smi", "-L"]
    resources:
      claims:
      - name: gpu
  restartPolicy: Never
  terminationGracePeriodSeconds: 1
EOF
}
# churn LANE: create a pod, wait until Running (120 s), delete it; again until the
# upgrade is done. One line per pod in churn-LANE.log: name, created (s), to-Running (s), phase.
churn() {
  local lane=$1 i=0 name t phase
  while :; do
    i=$((i + 1)); name=churn-$lane-$i
    t=$(now)
    if ! churn_pod "$name" | k apply -f - >/dev/null 2>&1; then
      echo "$name $t - create-failed"
      [ -e "$OUT/upgrade.done" ] && break
      sleep 1; continue
    fi
    phase=""
    for _ in $(seq 600); do
      phase=$(k get pod "$name" -o jsonpath='{.status.phase}' 2>/dev/null || true)
      [ "$phase" = Running ] || [ "$phase" = Failed ] || [ "$phase" = Succeeded ] && break
      sleep 0.2
    done
    echo "$name $t $(since "$t") ${phase:-none}"
    k delete pod "$name" --wait=true --timeout=120s >/dev/null 2>&1 || true
    [ -e "$OUT/upgrade.done" ] && break
  done >"$OUT/churn-$lane.log"
}
rm -f "$OUT/upgrade.done"
churn a & churn_a=$!
churn b & churn_b=$!
for i in $(seq 300); do [ -s "$OUT/churn-a.log" ] && [ -s "$OUT/churn-b.log" ] && break; sleep 0.2; done
old_uid=$(k -n "$NS" get pod "$pod" -o jsonpath='{.metadata.uid}')
# The old pod's log to its end (the kubelet deletes it with the pod): its prepares count.
k -n "$NS" logs -f "$pod" >"$OUT/old-plugin.log" 2>&1 & oldlog=$!
t_up=$(now)
upgrade_ok=1
if [ "$UPGRADE" = surge ]; then
  up_args=(--set "metrics.port=$METRICS_PORT2" --set-json 'updateStrategy={"type":"RollingUpdate","rollingUpdate":{"maxSurge":1,"maxUnavailable":0}}')
else
  up_args=()   # the chart's default with hostNetwork: replace (maxSurge 0, maxUnavailable 1)
fi
h upgrade tessera "$chart" -n "$NS" --reuse-values --set image.tag=dev2 "${up_args[@]}" \
  --wait --timeout 180s >"$OUT/upgrade.out" 2>&1 || upgrade_ok=0
# (With replace, helm's --wait returns at once: see step 2.)
new_pod=$(plugin_pod_ready "$pod") || upgrade_ok=0
t_up_end=$(now)
# Keep creating pods a little after the rollout (the old pod's exit, the kubelet's switch).
sleep 5
touch "$OUT/upgrade.done"
wait "$churn_a" "$churn_b" || true
up_s=$(since "$t_up")
[ "$upgrade_ok" = 1 ] && pass "helm upgrade --wait and the rollout (${up_s}s with the trailing 5 s)" || { cat "$OUT/upgrade.out" >&2; bad "helm upgrade"; }
eq "helm revision" "$(h status tessera -n "$NS" -o json | jq -r .version)" 2
pods=$(k -n "$NS" get pods -l app.kubernetes.io/name=tessera -o jsonpath='{range .items[*]}{.metadata.name} {.metadata.uid} {.spec.containers[0].image}{"\n"}{end}')
eq "plugin pods after the upgrade" "$(wc -l <<<"$pods") $(awk '{print $3}' <<<"$pods")" "1 localhost/tessera/tessera:dev2"
[ -n "$new_pod" ] || new_pod=$(awk '{print $1}' <<<"$pods")
[ "$(awk '{print $2}' <<<"$pods")" != "$old_uid" ] && pass "the plugin pod was replaced ($pod -> $new_pod)" || bad "the plugin pod was not replaced"
plugin_registered "$new_pod" && pass "the new plugin pod registered with the kubelet" || bad "the new plugin pod did not register"
# The old pod's sockets are gone: one registration socket (the new pod's) and one DRA
# socket, the new pod's (dra-<pod UID>.sock).
new_uid=$(awk '{print $2}' <<<"$pods")
for i in $(seq 150); do [ "$(ls "$KUBELET_ROOT_DIR/plugins_registry/" | wc -l)" = 1 ] && break; sleep 0.2; done
eq "registration sockets after the upgrade" "$(ls "$KUBELET_ROOT_DIR/plugins_registry/" | wc -l)" 1
eq "DRA sockets after the upgrade (the new pod's)" "$(ls "$KUBELET_ROOT_DIR/plugins/gpu.tessera.dev/" | grep '\.sock$' | tr '\n' ' ')" "dra-$new_uid.sock "
# The surge: the new pod was Ready before the old one went away.
new_ready=$(k -n "$NS" get pod "$new_pod" -o jsonpath='{.status.conditions[?(@.type=="Ready")].lastTransitionTime}')
echo "  new pod Ready at $new_ready; DaemonSet events:"
k -n "$NS" get events --field-selector involvedObject.kind=DaemonSet -o custom-columns=TIME:.lastTimestamp,REASON:.reason,MESSAGE:.message --sort-by=.lastTimestamp 2>/dev/null | tail -4 | sed 's/^/    /'
cat "$OUT"/churn-*.log | sort -k2 >"$OUT/churn.log"
total=$(wc -l <"$OUT/churn.log")
during=$(awk -v a="$t_up" -v b="$t_up_end" '$2 >= a && $2 <= b' "$OUT/churn.log" | wc -l)
notrun=$(awk '$4 != "Running"' "$OUT/churn.log")
slowest=$(awk '{print $3}' "$OUT/churn.log" | sort -n | tail -1)
[ "$during" -ge 2 ] && pass "$during of $total churn pods created while helm upgrade ran (${total} in all)" || bad "only $during churn pods were created during the upgrade (want >= 2)"
[ -z "$notrun" ] && pass "every churn pod started (slowest: ${slowest}s to Running)" || bad "churn pods that did not start: $notrun"
# No claim prepared twice across the old and the new plugin.
{ sleep 30; kill "$oldlog" 2>/dev/null; } & wait "$oldlog" 2>/dev/null || true
prepared=$(cat "$OUT/old-plugin.log" <(plog "$new_pod") | sed 's/\x1b\[[0-9;]*m//g' | grep 'prepared devices=' | grep -o 'prepare{claim=[^ }]*' | sort)
twice=$(uniq -d <<<"$prepared")
[ -n "$prepared" ] && [ -z "$twice" ] && pass "each claim prepared once across the old and the new plugin ($(uniq <<<"$prepared" | grep -c .) claims; old pod $(grep -c 'prepared devices=' "$OUT/old-plugin.log") prepares)" \
  || bad "claims prepared twice across the upgrade: ${twice:-(no prepare logged at all)}"
failed_prep=$(k get events -A --field-selector reason=FailedPrepareDynamicResources -o custom-columns=OBJ:.involvedObject.name,MSG:.message --no-headers 2>/dev/null || true)
[ -z "$failed_prep" ] && pass "no FailedPrepareDynamicResources event" || bad "failed prepares: $failed_prep"
# The kubelet's own account (its log is the cluster's whole life: steps 2 and 3).
eq "kubelet log: failed prepares" "$(grep -cE 'Failed to prepare dynamic resources|err="prepare dynamic resources' "$DIR/logs/kubelet.log" || true)" 0
eq "kubelet log: failed unprepares" "$(grep -cE 'Failed to unprepare dynamic resources|err="unprepare dynamic resources' "$DIR/logs/kubelet.log" || true)" 0
sed 's/^/    /' "$OUT/churn.log" | head -40
k delete resourceclaimtemplate one-gpu --ignore-not-found >/dev/null
for i in $(seq 150); do [ -z "$(ls "$CDI_DIR" 2>/dev/null | grep tessera || true)" ] && break; sleep 0.2; done
eq "CDI specs left after the churn pods' deletion" "$(ls "$CDI_DIR" | grep -c tessera || true)" 0
printf 'TESSERA_POD=%s\nMETRICS_PORT=%s\n' "$new_pod" "$METRICS_PORT2" >"$DIR/tessera/env"

# ---------- 4. helm uninstall ----------
echo "step 4: helm uninstall"
t_un=$(now)
h uninstall tessera -n "$NS" --wait --timeout 120s >"$OUT/uninstall.out" 2>&1 && pass "helm uninstall --wait ($(since "$t_un")s): $(head -1 "$OUT/uninstall.out")" || { cat "$OUT/uninstall.out" >&2; bad "helm uninstall"; }
eq "helm releases left" "$(h list -A -q | tr '\n' ' ')" ""
# Every listable resource type, namespaced (all namespaces) and cluster-scoped.
k api-resources --verbs=list -o name | sort >"$OUT/api-resources"
names='tessera-plugin|tessera-node-config|tessera-mock-node|tessera-grafana-dashboard|tessera-gpuconfig|tessera-resourceslices-own-node|\.tessera\.dev|sh\.helm\.release\.v1\.tessera'
: >"$OUT/left.txt"
while read -r r; do
  [ "$r" = events ] || [ "$r" = events.events.k8s.io ] && continue   # the cluster's record, expiring by TTL
  [ "$r" = resourceslices.resource.k8s.io ] && continue               # the kubelet's job: below
  k get "$r" -A -l app.kubernetes.io/instance=tessera -o name 2>/dev/null | sed "s|^|$r (label): |" >>"$OUT/left.txt" || true
  k get "$r" -A -o name 2>/dev/null | grep -E "/($names)" | sed "s|^|$r (name): |" >>"$OUT/left.txt" || true
done <"$OUT/api-resources"
eq "objects with the chart's label or Tessera's names left ($(wc -l <"$OUT/api-resources") resource types listed)" "$(sort -u "$OUT/left.txt" | tr '\n' ' ')" ""
ns_left=$(k -n "$NS" get "$(k api-resources --verbs=list --namespaced -o name | grep -v '^events' | tr '\n' ',' | sed 's/,$//')" -o name 2>/dev/null | sort | tr '\n' ' ' || true)
echo "  left in namespace $NS (made by --create-namespace, which helm never deletes): ${ns_left:-nothing}"
for i in $(seq 600); do [ -z "$(k get resourceslices --field-selector spec.driver=gpu.tessera.dev -o name)" ] && break; sleep 0.2; done
n=$(k get resourceslices --field-selector spec.driver=gpu.tessera.dev -o name | wc -l)
eq "ResourceSlices of gpu.tessera.dev left ($(since "$t_un")s after helm uninstall; the kubelet removes them)" "$n" 0
eq "registration sockets left in the kubelet's plugin registry" "$(ls "$KUBELET_ROOT_DIR/plugins_registry/" | tr '\n' ' ')" ""
k delete namespace "$NS" --wait=true --timeout=120s >/dev/null && pass "namespace $NS deleted" || bad "kubectl delete namespace $NS"
echo "  left on the node (by design, see deploy/helm/tessera/README.md):"
for d in "$KUBELET_ROOT_DIR/plugins/gpu.tessera.dev" "$NODE_ROOT/state" "$NODE_ROOT/run" "$CDI_DIR"; do
  echo "    $d: $( (cd "$d" 2>/dev/null && find . -mindepth 1 -maxdepth 2 | sort | tr '\n' ' ') || echo '(absent)')"
done

if [ "$errors" -gt 0 ]; then echo "scenario helm ($K8S_VERSION): $errors check(s) FAILED" >&2; exit 1; fi
echo "scenario helm ($K8S_VERSION): passed (helm install -> Ready ${t_ready}s; upgrade with $during pods created meanwhile, all started)"
