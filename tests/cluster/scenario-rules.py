#!/usr/bin/env python3
"""Scenario: the cluster's rules hold for Tessera, and the plugin survives kill -9.

Usage (root): scenario-rules.py DIR      (a cluster of up.sh with Tessera installed)

Admission (the shipped ValidatingAdmissionPolicies, as the API server runs them):
  * a claim template whose GpuConfig is invalid (computeLimit 150; an unknown field) is
    refused by `kubectl apply` with the policy's message; a valid one is accepted;
  * with the plugin's own ServiceAccount token (read from its pod: a bound token that
    carries the node's name), the plugin cannot create a ResourceSlice of another node or
    of another driver, nor change or delete another node's slice; it can still update its
    own (server-side dry run);
  * the ServiceAccount cannot do what the ClusterRole does not grant (create pods, update
    nodes, read secrets), and the plugin's log has no 403.
Device-plugin pods: where the stored DeviceClass gpu.tessera.dev has an
extendedResourceName (DRAExtendedResource), a pod asking `resources.limits:
{nvidia.com/gpu: 1}` runs with one whole GPU, allocated by the scheduler in a claim it
made, and sees that GPU's device node.
kill -9 of the plugin (its container's main process, SIGKILL through containerd) while a
whole-GPU pod and a shared-GPU pod run, the latter with a process holding 5 GiB of its
8 GiB budget: the kubelet restarts the container, which registers again; the running
pods keep running, untouched (same container), and the budget still counts the held
memory; a new pod with a claim is prepared; no claim is prepared twice (the plugin's
"prepared" lines of both containers' logs). The shared GPU needs the simulated node's own
node config (gpu-1 `shared`): switched with node-config.sh, the installed one put back.
"""

import json
import os
import subprocess
import sys
import time

import yaml

import scenario_lib as lib
from scenario_lib import CLIENT, DIR, ENV, GIB, IMAGE, KUBECTL, build_image, client, expect, fail, k, kj, \
    simulated_node_config, wait

OUT = f"{DIR}/tessera/rules"
os.makedirs(OUT, exist_ok=True)
SA = "system:serviceaccount:tessera-system:tessera-plugin"


def plugin_pod():
    return kj("-n", "tessera-system", "get", "pods", "-l", "app.kubernetes.io/name=tessera")["items"][0]


def apply(docs, *extra):
    """kubectl apply of docs; (ok, stderr)."""
    r = subprocess.run(KUBECTL + ["apply", "-f", "-"] + list(extra), input=yaml.safe_dump_all(docs),
                       capture_output=True, text=True)
    return r.returncode == 0, r.stderr.strip()


def template(name, params):
    return {
        "apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaimTemplate",
        "metadata": {"name": name, "namespace": "default"},
        "spec": {"spec": {"devices": {
            "requests": [{"name": "gpu", "exactly": {"deviceClassName": "gpu.tessera.dev"}}],
            "config": [{"requests": ["gpu"], "opaque": {"driver": "gpu.tessera.dev", "parameters": dict(
                {"apiVersion": "resource.tessera.dev/v1alpha1", "kind": "GpuConfig"}, **params)}}],
        }}},
    }


def admission_gpuconfig():
    print("--- admission: GpuConfig", flush=True)
    for params, want in [({"computeLimit": 150}, "computeLimit: must be an integer from 1 to 100"),
                         ({"memoryLimit": "1Gi"}, "memoryLimit: unknown field of GpuConfig"),
                         ({"scrubOnFree": "yes"}, "scrubOnFree: must be true or false")]:
        done, err = apply([template("bad-config", params)])
        expect(not done and want in err, f"GpuConfig {params} refused by kubectl apply: {err.splitlines()[-1] if err else ''}",
               f"want '{want}'")
    done, err = apply([template("good-config", {"computeLimit": 30, "scrubOnFree": True})], "--dry-run=server")
    expect(done, "a valid GpuConfig (computeLimit 30, scrubOnFree) accepted (server-side dry run)", err)


def plugin_kubectl():
    """kubectl as the plugin: its pod's projected ServiceAccount token, nothing else."""
    pod = plugin_pod()["metadata"]["name"]
    token = k("-n", "tessera-system", "exec", pod, "-c", "plugin", "--", "cat",
              "/var/run/secrets/kubernetes.io/serviceaccount/token").strip()
    return [KUBECTL[0], "--kubeconfig=/dev/null", f"--server=https://127.0.0.1:{ENV['API_PORT']}",
            f"--certificate-authority={DIR}/pki/ca.crt", f"--token={token}"]


def as_plugin(kc, *args, stdin=None):
    r = subprocess.run(kc + list(args), input=stdin, capture_output=True, text=True)
    return r.returncode == 0, (r.stderr or r.stdout).strip()


def slice_doc(name, node, driver="gpu.tessera.dev"):
    return {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceSlice", "metadata": {"name": name},
            "spec": {"driver": driver, "nodeName": node,
                     "pool": {"name": node, "generation": 1, "resourceSliceCount": 1},
                     "devices": [{"name": "gpu-9"}]}}


def admission_slices():
    print("--- admission: the plugin's ResourceSlices", flush=True)
    kc = plugin_kubectl()
    me = ENV["NODE_NAME"]
    r = subprocess.run(kc + ["auth", "whoami", "-o", "json"], capture_output=True, text=True)
    info = json.loads(r.stdout or "{}").get("status", {}).get("userInfo", {})
    expect(info.get("username") == SA and info.get("extra", {}).get("authentication.kubernetes.io/node-name") == [me],
           f"the plugin's token: {info.get('username')}, node-name {info.get('extra', {}).get('authentication.kubernetes.io/node-name')}")
    cases = [
        ("create a slice of another node", ["create", "-f", "-"], slice_doc("evil-other", "other-node"),
         "may only write ResourceSlices of its own node"),
        ("create a slice of another driver on its node", ["create", "-f", "-"],
         slice_doc("evil-driver", me, "other.example.com"), "may only write ResourceSlices of driver gpu.tessera.dev"),
    ]
    for what, args, doc, want in cases:
        done, err = as_plugin(kc, *args, stdin=yaml.safe_dump(doc))
        expect(not done and want in err, f"the plugin cannot {what}: {err.splitlines()[-1] if err else 'allowed'}")
    # Another node's slice, made by an administrator: the plugin may not change or delete it.
    k("create", "-f", "-", stdin=yaml.safe_dump(slice_doc("other-node-slice", "other-node")))
    # The ClusterRole grants no `get` (the plugin lists and watches): changes are PUTs of
    # the object an administrator read, as the plugin's own updates are.
    def relabeled(name):
        obj = kj("get", "resourceslice", name)
        obj["metadata"].setdefault("labels", {})["tessera.dev/probe"] = "1"
        return json.dumps(obj)
    try:
        done, err = as_plugin(kc, "replace", "-f", "-", stdin=relabeled("other-node-slice"))
        expect(not done and "its own node" in err, f"the plugin cannot change another node's slice: {err.splitlines()[-1] if err else 'allowed'}")
        done, err = as_plugin(kc, "delete", "resourceslice", "other-node-slice")
        expect(not done and "its own node" in err, f"the plugin cannot delete another node's slice: {err.splitlines()[-1] if err else 'allowed'}")
    finally:
        k("delete", "resourceslice", "other-node-slice", "--ignore-not-found")
    own = [s["metadata"]["name"] for s in kj("get", "resourceslices")["items"]
           if s["spec"].get("nodeName") == me and s["spec"]["driver"] == "gpu.tessera.dev"]
    done, err = as_plugin(kc, "replace", "-f", "-", "--dry-run=server", stdin=relabeled(own[0]))
    expect(done, f"the plugin can still update its own slice {own[0]} (server-side dry run)", err)
    for verb, res in [("create", "pods"), ("update", "nodes"), ("get", "secrets"), ("delete", "resourceclaims")]:
        done, out = as_plugin(kc, "auth", "can-i", verb, res, "-A")
        expect(not done and out.startswith("no"), f"the plugin's ServiceAccount may not {verb} {res}: {out}")
    logs = k("-n", "tessera-system", "logs", plugin_pod()["metadata"]["name"], "-c", "plugin")
    bad = [l for l in logs.splitlines() if " 403" in l or "Forbidden" in l or "forbidden" in l]
    expect(not bad, "the plugin's log has no 403 (it runs with the shipped ClusterRole only)", "; ".join(bad[:3]))


def extended_resource():
    print("--- device-plugin pods: resources.limits nvidia.com/gpu", flush=True)
    cls = kj("get", "deviceclass", "gpu.tessera.dev")
    name = cls["spec"].get("extendedResourceName")
    if not name:
        print("  not applicable here: the stored DeviceClass gpu.tessera.dev has no extendedResourceName "
              "(DRAExtendedResource off)", flush=True)
        return
    pod = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "legacy-gpu", "namespace": "default"},
           "spec": {"containers": [{"name": "main", "image": IMAGE, "imagePullPolicy": "Never",
                                    "resources": {"limits": {name: 1}}}]}}
    done, err = apply([pod])
    expect(done, f"a pod asking limits {name}: 1 created", err)
    running = wait("legacy-gpu Running", lambda: kj("get", "pod", "legacy-gpu")["status"].get("phase") == "Running",
                   timeout=90)
    p = kj("get", "pod", "legacy-gpu")
    if expect(running, f"  Running on {p['spec'].get('nodeName')}", json.dumps(p["status"].get("conditions"))):
        st = p["status"].get("extendedResourceClaimStatus") or {}
        claim = kj("get", "resourceclaim", st.get("resourceClaimName", "-")) if st.get("resourceClaimName") else None
        devs = [r["device"] for r in claim["status"]["allocation"]["devices"]["results"]] if claim else []
        expect(len(devs) == 1 and devs[0].count("-") == 1,
               f"  its claim {st.get('resourceClaimName')} (made by the scheduler): one whole GPU {devs}")
        if devs:
            seen = k("exec", "legacy-gpu", "--", "sh", "-c", "ls /dev | grep -E '^nvidia[0-9]+$'", check=False).split()
            expect(seen == [f"nvidia{devs[0].split('-')[1]}"], f"  the container sees /dev/{' /dev/'.join(seen)}")
    k("delete", "pod", "legacy-gpu", "--wait=true", check=False)


def prepared_lines(text):
    """claim UID -> number of "prepared" lines."""
    n = {}
    for l in text.splitlines():
        if "prepared devices=" in l and "prepare{claim=" in l:
            uid = l.split("prepare{claim=", 1)[1].split()[0]
            n[uid] = n.get(uid, 0) + 1
    return n


def kill_plugin(shared):
    """shared: whether the node publishes a shared GPU (else the whole-GPU pod alone)."""
    print("--- kill -9 of the plugin while claims are in use", flush=True)
    ns = "rules-kill"
    k("create", "namespace", ns)
    wait("serviceaccount", lambda: k("-n", ns, "get", "serviceaccount", "default", check=False))

    def pod(name, claim):
        return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "namespace": ns},
                "spec": {"resourceClaims": [{"name": "gpu", "resourceClaimName": claim}],
                         "containers": [{"name": "main", "image": IMAGE, "imagePullPolicy": "Never",
                                         "resources": {"claims": [{"name": "gpu"}]}}]}}

    def claim(name, cls, capacity=None):
        exactly = {"deviceClassName": cls}
        if capacity:
            exactly["capacity"] = {"requests": capacity}
        return {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim", "metadata": {"name": name, "namespace": ns},
                "spec": {"devices": {"requests": [{"name": "gpu", "exactly": exactly}]}}}

    docs = [claim("whole", "gpu.tessera.dev"), pod("whole", "whole")]
    names = ["whole"]
    if shared:
        docs += [claim("share", "shared.tessera.dev", {"memory": "8Gi", "compute": "10"}), pod("share", "share")]
        names.append("share")
    done, err = apply(docs)
    if not expect(done, f"pods with claims created: {', '.join(names)}", err):
        return
    if not expect(wait("Running", lambda: all(kj("-n", ns, "get", "pod", n)["status"].get("phase") == "Running"
                                              for n in names)), "  Running"):
        return
    if shared:
        lib.run_kubectl(["-n", ns, "exec", "share", "--", "sh", "-c",
                         f"{CLIENT} gpa ctx 0 alloc {5 * GIB} hold >/tmp/held 2>&1 </dev/null &"])
        expect(wait("holding", lambda: "holding" in k("-n", ns, "exec", "share", "--", "cat", "/tmp/held", check=False),
                    timeout=30), "  a process in the shared pod holds 5 GiB of its 8 GiB budget")
    before = {n: kj("-n", ns, "get", "pod", n)["status"]["containerStatuses"][0]["containerID"] for n in names}
    p = plugin_pod()
    name, cid = p["metadata"]["name"], p["status"]["containerStatuses"][0]["containerID"].split("//", 1)[1]
    restarts = p["status"]["containerStatuses"][0].get("restartCount", 0)
    with open(f"{DIR}/pids/containerd") as f:
        cpid = f.read().strip()
    r = subprocess.run(["nsenter", "--mount", "--target", cpid, "ctr", "--address", ENV["CONTAINERD_SOCKET"],
                        "--namespace", "k8s.io", "tasks", "kill", "--signal", "SIGKILL", cid], capture_output=True, text=True)
    if not expect(r.returncode == 0, f"SIGKILL to the plugin container {cid[:12]} of {name}", r.stderr.strip()):
        return
    t0 = time.monotonic()

    def back():
        s = plugin_pod()["status"]["containerStatuses"][0]
        if s.get("restartCount", 0) > restarts and s.get("ready"):
            return "registered with the kubelet" in k("-n", "tessera-system", "logs", name, "-c", "plugin", check=False)
        return False
    expect(wait("plugin back", back, timeout=120),
           f"  the kubelet restarted it ({name}, restart {restarts + 1}); Ready and registered {time.monotonic() - t0:.1f}s after the kill")
    after = {n: kj("-n", ns, "get", "pod", n)["status"]["containerStatuses"][0]["containerID"] for n in names}
    expect(after == before and all(kj("-n", ns, "get", "pod", n)["status"]["phase"] == "Running" for n in after),
           "  the running pods kept running, their containers untouched")
    if shared:
        lines, _ = client(ns, "share", "main", "ctx", "0", "meminfo")
        free = int(lines[1].split()[1]) if len(lines) == 2 and lines[1].startswith("ok ") else None
        expect(free is not None and free <= 3 * GIB,
               f"  the budget still counts the held 5 GiB: {free / GIB if free else 0:.2f} GiB free of 8", f"{lines}")
        if free:
            lines, _ = client(ns, "share", "main", "ctx", "0", "alloc", str(free + (64 << 20)))
            expect(lines[1:2] == ["err 2"], f"  and refuses 64 MiB above it: {lines[1:2]}")
    done, err = apply([claim("after", "gpu.tessera.dev"), pod("after", "after")])
    expect(done and wait("after Running", lambda: kj("-n", ns, "get", "pod", "after")["status"].get("phase") == "Running"),
           "  a new pod with a claim is prepared by the restarted plugin and Running", err)
    prev = k("-n", "tessera-system", "logs", name, "-c", "plugin", "--previous", check=False)
    now = k("-n", "tessera-system", "logs", name, "-c", "plugin", check=False)
    counts = prepared_lines(prev)
    for uid, n in prepared_lines(now).items():
        counts[uid] = counts.get(uid, 0) + n
    uids = {n: kj("-n", ns, "get", "resourceclaim", n)["metadata"]["uid"] for n in names + ["after"]}
    expect(all(counts.get(u) == 1 for u in uids.values()),
           f"  each claim prepared once across both containers: {dict((n, counts.get(u, 0)) for n, u in uids.items())}")
    k("delete", "namespace", ns, "--wait=true", "--timeout=120s")


def main():
    t0 = time.monotonic()
    build_image()
    admission_gpuconfig()
    admission_slices()
    extended_resource()
    with simulated_node_config(OUT):
        try:
            shared = any(d["attributes"].get("type", {}).get("string") == "gpu-shared"
                         for s in kj("get", "resourceslices")["items"] for d in s["spec"].get("devices") or [])
            if not shared:
                print("  (no shared GPU published here, consumable capacity off: the whole-GPU pod alone)", flush=True)
            kill_plugin(shared)
        except Exception as e:  # the other scenarios still run
            fail(f"kill -9: {e}")
    if lib.errors:
        print(f"scenario rules ({ENV['K8S_VERSION']}): {lib.errors} check(s) FAILED", file=sys.stderr)
        sys.exit(1)
    print(f"scenario rules ({ENV['K8S_VERSION']}): passed ({time.monotonic() - t0:.0f}s)")


main()
