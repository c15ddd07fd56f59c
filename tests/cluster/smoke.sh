#!/usr/bin/env bash
# The trivial-pod check on a cluster from up.sh: a busybox pod (the locally built image,
# imagePullPolicy Never, pod network, default service account token) must reach Running
# and log what it printed, and `kubectl exec` must run in its root; prints the time from
# `kubectl create` to Running. Deletes it.
# Usage: smoke.sh DIR
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
. "$here/lib.sh"
DIR=$(cd "${1:?usage: smoke.sh DIR}" && pwd)
cluster_env
name=smoke-$RANDOM
default_sa || true
t0=$(now)
k create -f - >/dev/null <<EOF
apiVersion: v1
kind: Pod
metadata: {name: $name}
spec:
  hostNetwork: false
  terminationGracePeriodSeconds: 1
  containers:
  - name: c
    image: localhost/tessera/busybox:1
    imagePullPolicy: Never
    command: ["/bin/sh", "-c"]
    args:
    - |
      echo "hello from \$(hostname)"
      echo "addresses: \$(ip -o -4 addr show eth0 | awk '{print \$4}')"
      echo "routes: [\$(ip route | tr '\n' ';')]"
      echo "token files: \$(ls /var/run/secrets/kubernetes.io/serviceaccount | tr '\n' ' ')"
      exec sleep 3600
EOF
phase=""
for i in $(seq 600); do
  phase=$(k get pod "$name" -o jsonpath='{.status.phase}')
  [ "$phase" = Running ] && break
  sleep 0.1
done
running=$(since "$t0")
if [ "$phase" != Running ]; then
  k describe pod "$name" >&2
  echo "pod $name not Running after 60s (phase: $phase)" >&2
  exit 1
fi
echo "pod $name Running ${running}s after kubectl create"
logs=""
for i in $(seq 50); do
  logs=$(k logs "$name" 2>&1) && [[ $logs == *"token files:"* ]] && break
  sleep 0.2
done
echo "$logs" | sed 's/^/  log: /'
# kubectl exec (runc exec: setns into the container) must land in the image's root, not
# the host's: the host's /work and /usr/bin/dpkg are not in the busybox image.
exec_out=$(k exec "$name" -- sh -c 'head -1 /etc/hosts; ls /work /usr/bin/dpkg 2>&1 | head -1' 2>&1 || true)
echo "$exec_out" | sed 's/^/  exec: /'
k delete pod "$name" --wait=true >/dev/null
[[ $logs == *"hello from $name"* ]] || { echo "the pod's log lacks its greeting" >&2; exit 1; }
[[ $logs == *"token files: ca.crt namespace token"* ]] || { echo "the service-account volume is not in the container" >&2; exit 1; }
[[ $exec_out == "# Kubernetes-managed hosts file."*"No such file"* ]] || { echo "kubectl exec did not run in the container's root" >&2; exit 1; }
echo "smoke test passed"
