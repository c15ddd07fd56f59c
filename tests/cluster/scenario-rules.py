#!/usr/bin/env python3
"""Scenario: the cluster's rules hold for Tessera, and the plugin survives kill -9.

Usage (root): scenario-rules.py DIR      (a cluster of up.sh with Tessera installed)

Admission (the shipped ValidatingAdmissionPolicies, as the API server runs them):
  * a claim template whose GpuConfig is invalid (computeLimit 150; an unknown field) is
    refused by `kubectl apply` with the policy's message; a valid one is accepted;
  * in a namespace labelled gpu.tessera.dev/tenant-pods=hardened, a pod that is
    privileged, keeps SYS_CHROOT, adds SYS_ADMIN, runs seccomp Unconfined, shares the
    host's PID namespace or mounts a hostPath is refused with the policy's message (the
    same pods pass in an unlabelled namespace), a hardened one is accepted, and `kubectl
    debug --profile=sysadmin` cannot add its privileged container; the policy type-checks
    against the Pod schema (no warning in its status);
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
whole-GPU pod and a shared-GPU pod run (8 GiB of the shared GPU, or one fallback slot
where the server has no consumable capacity), the latter with a process holding 5 GiB of
its budget: the kubelet restarts the container, which registers again; the running
pods keep running, untouched (same container), and the budget still counts the held
memory; a new pod with a claim is prepared; no claim is prepared twice (the plugin's
"prepared" lines of both containers' logs).
Device health (`tessera mock` injects events into the simulated node from the plugin's
pod): XID 94 on gpu-2 taints it NoSchedule in its slice; a pod whose claim selects gpu-2
stays Pending while a pod wanting any whole GPU runs elsewhere; the taint clears after
the configured quiet period (health.xidClearAfter: 20s) and the waiting pod is then
scheduled onto gpu-2. XID 79 taints it NoExecute and the device-taint eviction
controller deletes that pod, the other runs on; a loss followed by a recovery clears it.
Where the server drops taints (DRADeviceTaints off), the unhealthy gpu-2 leaves the slice
instead, and nothing is evicted.
Pod health (ResourceHealthStatus on): while that pod runs on gpu-2, its
allocatedResourcesStatus shows the device Healthy, an XID 94 makes it Unhealthy and the
quiet period Healthy again.
kubelet restart (SIGTERM, then the same command line again) while two pods with
whole-GPU claims run: the node is Ready again, the pods keep their containers, the claims
stay prepared and are not prepared again, a new pod is prepared, and deleting the pods
unprepares every claim (CDI spec, checkpoint entry, claim directory).
Races: twelve pods with MIG or whole-GPU claims, each deleted (or its claim, then it)
0 to 1.5 s after creation, while its prepare may be in flight: nothing is left on the
node (CDI specs, checkpoint entries, claim directories, MIG instances).
These need the simulated node's own node config (gpu-0 `mig`, gpu-1 `shared`) with
`health:` added: switched with node-config.sh, the installed one put back.
"""

import json
import os
import subprocess
import sys
import time

import yaml

import scenario_lib as lib
from scenario_lib import CLIENT, DIR, ENV, GIB, IMAGE, KUBECTL, build_image, claim_doc, client, expect, fail, k, \
    kj, metric, mig_instances, mock_only, pod_doc, simulated_node_config, wait

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


TENANTS_LABEL = "gpu.tessera.dev/tenant-pods=hardened"


def admission_tenant_pods():
    print(f"--- admission: tenant pods (namespaces labelled {TENANTS_LABEL})", flush=True)
    # The API server's type check of the policy against the Pod schema (status.typeChecking,
    # written by a controller after the policy is stored): no expression warned about.
    vap = wait("the tenant-pods policy type-checked",
               lambda: (lambda v: v if v.get("status", {}).get("observedGeneration") else None)(
                   kj("get", "validatingadmissionpolicy", "tessera-tenant-pods")), timeout=30)
    warnings = ((vap or {}).get("status", {}).get("typeChecking") or {}).get("expressionWarnings") or []
    expect(vap is not None and not warnings, "the tenant-pods policy type-checks against the Pod schema",
           "; ".join(f"{w.get('fieldRef')}: {w.get('warning')}" for w in warnings) or "no status")
    ns = "tessera-tenants"
    # Created with its label: a label added later could reach the policy's namespace
    # lookup after the first pods.
    key, value = TENANTS_LABEL.split("=")
    k("apply", "-f", "-", stdin=yaml.safe_dump(
        {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns, "labels": {key: value}}}))

    def pod(namespace, name, context=None, spec=None):
        p = pod_doc(namespace, name)
        p["spec"]["securityContext"] = {"seccompProfile": {"type": "RuntimeDefault"}}
        p["spec"]["containers"][0]["securityContext"] = (
            context if context is not None else {"capabilities": {"drop": ["ALL"]}})
        p["spec"].update(spec or {})
        return p

    drop = {"capabilities": {"drop": ["ALL"]}}
    cases = [
        ("hardened", None, None, None),
        ("privileged", dict(drop, privileged=True), None, "container main: privileged"),
        ("chroot", {"capabilities": {"drop": ["NET_RAW"]}}, None,
         "container main: securityContext.capabilities.drop must have ALL or SYS_CHROOT"),
        ("sys-admin", {"capabilities": {"drop": ["ALL"], "add": ["SYS_ADMIN"]}}, None,
         "container main: securityContext.capabilities.add may only have"),
        ("unconfined", dict(drop, seccompProfile={"type": "Unconfined"}), None,
         "container main: seccompProfile.type must be RuntimeDefault or Localhost"),
        ("host-pid", None, {"hostPID": True}, "hostPID: the host's PID namespace"),
        ("host-path", None, {"volumes": [{"name": "run", "hostPath": {"path": "/run/tessera"}}]},
         "volume run: hostPath volumes"),
    ]
    for name, context, spec, want in cases:
        done, err = apply([pod(ns, name, context, spec)], "--dry-run=server")
        if want is None:
            expect(done, f"pod {name} accepted (server-side dry run)", err)
        else:
            expect(not done and want in err and "tessera-tenant-pods" in err,
                   f"pod {name} refused: {err.splitlines()[-1] if err else ''}", f"want '{want}'")
            done, err = apply([pod("default", name, context, spec)], "--dry-run=server")
            expect(done, "  the same pod accepted in an unlabelled namespace (server-side dry run)", err)
    # kubectl debug adds an ephemeral container (an UPDATE of pods/ephemeralcontainers).
    k("apply", "-f", "-", stdin=yaml.safe_dump(pod(ns, "debuggee")))
    debug = KUBECTL + ["-n", ns, "debug", "debuggee", "--image", IMAGE,
                       "--image-pull-policy", "Never", "-c"]
    r = subprocess.run(debug + ["sysadmin", "--profile=sysadmin"], capture_output=True, text=True)
    expect(r.returncode != 0 and "container sysadmin: privileged" in r.stderr,
           f"kubectl debug --profile=sysadmin refused: {r.stderr.strip().splitlines()[-1] if r.stderr.strip() else ''}",
           r.stdout + r.stderr)
    r = subprocess.run(debug + ["restricted", "--profile=restricted"], capture_output=True, text=True)
    expect(r.returncode == 0, "kubectl debug --profile=restricted accepted (drops ALL, seccomp RuntimeDefault)",
           r.stdout + r.stderr)
    k("delete", "namespace", ns, "--wait=false")


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
    pod = pod_doc("default", "legacy-gpu")
    pod["spec"]["containers"][0]["resources"] = {"limits": {name: 1}}
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


def kill_plugin(share_class):
    """share_class: the DeviceClass of a share on this node (shared.tessera.dev; or
    slot.tessera.dev, one fallback slot, where the server has no consumable capacity);
    None: the whole-GPU pod alone."""
    shared = share_class is not None
    print("--- kill -9 of the plugin while claims are in use", flush=True)
    ns = "rules-kill"
    k("create", "namespace", ns)
    wait("serviceaccount", lambda: k("-n", ns, "get", "serviceaccount", "default", check=False))

    def pod(name, claim):
        return pod_doc(ns, name, claim)

    def claim(name, cls, capacity=None):
        exactly = {"deviceClassName": cls}
        if capacity:
            exactly["capacity"] = {"requests": capacity}
        return claim_doc(ns, name, exactly)

    docs = [claim("whole", "gpu.tessera.dev"), pod("whole", "whole")]
    names = ["whole"]
    if shared:
        capacity = {"memory": "8Gi", "compute": "10"} if share_class == "shared.tessera.dev" else None
        docs += [claim("share", share_class, capacity), pod("share", "share")]
        names.append("share")
    done, err = apply(docs)
    if not expect(done, f"pods with claims created: {', '.join(names)}", err):
        return
    if not expect(wait("Running", lambda: all(kj("-n", ns, "get", "pod", n)["status"].get("phase") == "Running"
                                              for n in names)), "  Running"):
        return
    budget = None
    if shared:
        lines, _ = client(ns, "share", "main", "ctx", "0", "meminfo")
        budget = int(lines[1].split()[2]) if len(lines) == 2 and lines[1].startswith("ok ") else None
        if not expect(budget, f"  the shared pod's budget ({share_class}): {(budget or 0) / GIB:.2f} GiB", f"{lines}"):
            return
        lib.run_kubectl(["-n", ns, "exec", "share", "--", "sh", "-c",
                         f"{CLIENT} gpa ctx 0 alloc {5 * GIB} hold >/tmp/held 2>&1 </dev/null &"])
        expect(wait("holding", lambda: "holding" in k("-n", ns, "exec", "share", "--", "cat", "/tmp/held", check=False),
                    timeout=30), f"  a process in the shared pod holds 5 GiB of its {budget / GIB:.2f} GiB budget")
    before = {n: kj("-n", ns, "get", "pod", n)["status"]["containerStatuses"][0]["containerID"] for n in names}
    p = plugin_pod()
    name, cid = p["metadata"]["name"], p["status"]["containerStatuses"][0]["containerID"].split("//", 1)[1]
    restarts = p["status"]["containerStatuses"][0].get("restartCount", 0)
    r = lib.ctr("tasks", "kill", "--signal", "SIGKILL", cid)
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
        expect(free is not None and free <= budget - 5 * GIB,
               f"  the budget still counts the held 5 GiB: {free / GIB if free else 0:.2f} GiB free of "
               f"{budget / GIB:.2f}", f"{lines}")
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


TAINT_KEY = "gpu.tessera.dev/unhealthy"
# The quiet period after which a NoSchedule XID taint clears (node config `health:`).
XID_CLEAR_AFTER = 20


def taints(device):
    """The taints (key, value, effect) of DEVICE in this node's stored slices; None when
    no slice publishes it."""
    for s in kj("get", "resourceslices")["items"]:
        if s["spec"]["driver"] != "gpu.tessera.dev" or s["spec"].get("nodeName") != ENV["NODE_NAME"]:
            continue
        for d in s["spec"].get("devices") or []:
            if d["name"] == device:
                return [(t["key"], t.get("value"), t["effect"]) for t in d.get("taints") or []]
    return None


def mock_event(*args):
    """`tessera mock ARGS` in the plugin's container: an event on the simulated node."""
    pod = plugin_pod()["metadata"]["name"]
    r = lib.run_kubectl(["-n", "tessera-system", "exec", pod, "-c", "plugin", "--", "tessera", "mock"] + list(args))
    return expect(r.returncode == 0, f"tessera mock {' '.join(args)}: {(r.stdout + r.stderr).strip()}")


def device_health():
    """gpu-2 and gpu-3 are whole GPUs; health.xidClearAfter is XID_CLEAR_AFTER. Where the
    API server drops taints (DRADeviceTaints off: 1.34's default gates) the plugin leaves
    an unhealthy device out of its slice instead, and nothing evicts."""
    if mock_only("--- device health", "XID events and lost GPUs are not modelled by NVIDIA's models "
                 "(`tessera mock` injects them into the mock node only)"):
        return
    kept = "DRADeviceTaints=true" in open(f"{DIR}/feature-gates").read()
    print("--- device health: XIDs taint devices in the slice; the scheduler and the eviction controller obey"
          if kept else "--- device health (DRADeviceTaints off): an unhealthy device leaves the slice", flush=True)
    ns = "rules-health"
    k("create", "namespace", ns)
    wait("serviceaccount", lambda: k("-n", ns, "get", "serviceaccount", "default", check=False))

    def pod(name):
        """Pod NAME with claim NAME, its pod-level entry named NAME too: the 1.34 kubelet
        matches a container's claim entries by the ResourceClaim's name when it fills
        allocatedResourcesStatus (1.37 resolves the entry; pod_health)."""
        d = pod_doc(ns, name, name, grace=1)
        d["spec"]["resourceClaims"][0]["name"] = name
        d["spec"]["containers"][0]["resources"]["claims"][0]["name"] = name
        return d

    def claim(name, cel=None):
        exactly = {"deviceClassName": "gpu.tessera.dev"}
        if cel:
            exactly["selectors"] = [{"cel": {"expression": cel}}]
        return claim_doc(ns, name, exactly)

    def phase(name):
        """The pod's phase; None when it is gone."""
        out = k("-n", ns, "get", "pod", name, "-o", "json", "--ignore-not-found")
        return json.loads(out)["status"].get("phase") if out.strip() else None

    def device_of(name):
        st = kj("-n", ns, "get", "resourceclaim", name).get("status") or {}
        res = (st.get("allocation") or {}).get("devices", {}).get("results") or []
        return [r["device"] for r in res]

    def unhealthy(effect, value):
        """gpu-2 as an unhealthy device is published here: tainted, or left out."""
        if kept:
            return lambda: taints("gpu-2") == [(TAINT_KEY, value, effect)]
        return lambda: taints("gpu-2") is None

    if not expect(taints("gpu-2") == [] and taints("gpu-3") == [], "gpu-2 and gpu-3 published, untainted",
                  f"{taints('gpu-2')} {taints('gpu-3')}"):
        return
    # XID 94 (contained ECC error): neither an application XID nor a fatal one, so NoSchedule.
    if not mock_event("xid", "--gpu", "2", "--xid", "94"):
        return
    t_xid = time.monotonic()
    got = wait("gpu-2 unhealthy", unhealthy("NoSchedule", "xid-94"), timeout=30)
    expect(got, f"  gpu-2 {'tainted NoSchedule in its slice' if kept else 'left out of the slice'} "
                f"{time.monotonic() - t_xid:.1f}s after the XID: {taints('gpu-2')}")
    expect(taints("gpu-3") == [], "  gpu-3 published, untainted", f"{taints('gpu-3')}")

    done, err = apply([claim("pinned", 'device.attributes["gpu.tessera.dev"].minor == 2'), pod("pinned"),
                       claim("other"), pod("other")])
    if not expect(done, "a pod whose claim selects gpu-2 (minor == 2), and a pod with any whole GPU", err):
        return
    running = wait("other Running", lambda: phase("other") == "Running", timeout=90)
    expect(running and device_of("other") != ["gpu-2"], f"  the other pod is Running on {device_of('other')}, not gpu-2")
    p = kj("-n", ns, "get", "pod", "pinned")
    cond = [c for c in p["status"].get("conditions") or [] if c["type"] == "PodScheduled"]
    msg = cond[0].get("message", "") if cond else ""
    expect(p["status"].get("phase") == "Pending" and cond and cond[0]["status"] == "False" and not device_of("pinned"),
           f"  the pod needing gpu-2 stays Pending, unallocated: {msg}")

    cleared = wait("gpu-2 healthy", lambda: taints("gpu-2") == [], timeout=XID_CLEAR_AFTER + 60)
    quiet = time.monotonic() - t_xid
    expect(cleared and quiet >= XID_CLEAR_AFTER - 2,
           f"  gpu-2 healthy again {quiet:.1f}s after the XID (xidClearAfter {XID_CLEAR_AFTER}s)")
    expect(wait("pinned Running", lambda: phase("pinned") == "Running", timeout=120) and device_of("pinned") == ["gpu-2"],
           f"  then the pod needing gpu-2 is scheduled and Running on {device_of('pinned')}")

    pod_health(ns, "pinned")


    # XID 79 (fallen off the bus): fatal, NoExecute; only a recovery after a loss clears it.
    if not mock_event("xid", "--gpu", "2", "--xid", "79"):
        return
    t_xid = time.monotonic()
    got = wait("gpu-2 NoExecute", unhealthy("NoExecute", "xid-79"), timeout=30)
    expect(got, f"  XID 79: gpu-2 {'tainted NoExecute' if kept else 'left out of the slice'}: {taints('gpu-2')}")
    if kept:
        gone = wait("pinned evicted", lambda: phase("pinned") is None, timeout=120)
        expect(gone, f"  the eviction controller deleted the pod using gpu-2 ({time.monotonic() - t_xid:.1f}s after the XID)")
    else:
        time.sleep(5)
        expect(phase("pinned") == "Running", "  with no taint nothing evicts: the pod using gpu-2 runs on")
    expect(phase("other") == "Running", "  the pod on another GPU runs on")
    mock_event("lost", "--gpu", "2")
    mock_event("recover", "--gpu", "2")
    expect(wait("gpu-2 healthy", lambda: taints("gpu-2") == [], timeout=30),
           f"  a recovery (the GPU lost, then answering again) makes gpu-2 healthy: {taints('gpu-2')}")
    k("delete", "namespace", ns, "--wait=true", "--timeout=120s")


def pod_health(ns, name):
    """ResourceHealthStatus: the kubelet copies the plugin's health stream into the pod's
    `containerStatuses[].allocatedResourcesStatus` (entry `claim:<the pod's claim entry>`,
    each device by its CDI ID; the 1.34 kubelet fills it only where that entry is named as
    the ResourceClaim: it compares the two names, a bug 1.37 no longer has). POD runs on gpu-2: healthy; an XID 94 (NoSchedule: the pod runs on) makes
    it Unhealthy; the quiet period (xidClearAfter) makes it Healthy again. Where the
    kubelet's gate is off (1.34 and 1.35 by default) the field never appears: said, not
    asserted."""
    gates = open(f"{DIR}/feature-gates").read()
    minor = int(ENV["K8S_VERSION"].split(".")[1])
    on = "ResourceHealthStatus=true" in gates or (minor >= 36 and "ResourceHealthStatus=false" not in gates)
    if not on:
        print("  (pod health: the kubelet's ResourceHealthStatus gate is off here; not asserted)", flush=True)
        return

    def health():
        """The health of every device in the pod's claim:NAME entry: [] when absent."""
        p = kj("-n", ns, "get", "pod", name)
        out = []
        for cs in p["status"].get("containerStatuses") or []:
            for rs in cs.get("allocatedResourcesStatus") or []:
                if rs.get("name") == f"claim:{name}":
                    out += [(r.get("resourceID"), r.get("health")) for r in rs.get("resources") or []]
        return out

    def all_are(state):
        return lambda: (h := health()) != [] and all(v == state for _, v in h)

    expect(wait(f"{name} Healthy", all_are("Healthy"), timeout=60),
           f"  pod health: {name}'s allocatedResourcesStatus shows its device Healthy: {health()}")
    if not mock_event("xid", "--gpu", "2", "--xid", "94"):
        return
    t = time.monotonic()
    expect(wait(f"{name} Unhealthy", all_are("Unhealthy"), timeout=60),
           f"  pod health: an XID 94 on gpu-2 makes it Unhealthy in the running pod's status "
           f"({time.monotonic() - t:.1f}s): {health()}")
    expect(phase_of(ns, name) == "Running", "  the pod runs on (NoSchedule evicts nothing)")
    expect(wait(f"{name} Healthy again", all_are("Healthy"), timeout=XID_CLEAR_AFTER + 60),
           f"  pod health: Healthy again after the quiet period ({time.monotonic() - t:.1f}s after the XID): {health()}")
    wait("gpu-2 untainted", lambda: taints("gpu-2") == [], timeout=30)


def phase_of(ns, name):
    out = k("-n", ns, "get", "pod", name, "-o", "json", "--ignore-not-found")
    return json.loads(out)["status"].get("phase") if out.strip() else None


NODE_ROOT = f"{DIR}/tessera-node"


def leftovers(uids):
    """What the node still holds for any of the claims UIDS: CDI specs, checkpoint
    entries, claim directories; and every MIG instance of the simulated node."""
    left = []
    for f in os.listdir(ENV["CDI_DIR"]):
        left += [f"CDI spec {f}" for u in uids if u in f]
    ck = f"{NODE_ROOT}/state/checkpoint.json"
    text = open(ck).read() if os.path.exists(ck) else ""
    left += [f"checkpoint entry {u}" for u in uids if u in text]
    claims = f"{NODE_ROOT}/run/claims"
    for f in os.listdir(claims) if os.path.isdir(claims) else []:
        left += [f"claim directory {f}" for u in uids if u in f]
    left += [f"MIG instance '{i}'" for i in mig_instances()]
    return left


def races():
    """Pods deleted while their prepare may be in flight, claims deleted while their pod
    starts: whatever the timing, nothing is left on the node. Needs gpu-0 in `mig` mode."""
    print("--- races: pods and claims deleted while pods start", flush=True)
    ns = "rules-races"
    k("create", "namespace", ns)
    wait("serviceaccount", lambda: k("-n", ns, "get", "serviceaccount", "default", check=False))
    created0 = metric("tessera_mig_devices_created")
    uids = []
    # (name, class, what is deleted, delay in s before the deletion)
    cases = [(f"r{i}", "mig.tessera.dev" if i % 2 else "gpu.tessera.dev", "claim" if i % 3 == 2 else "pod",
              [0, 0.1, 0.3, 0.6, 1.0, 1.5][i % 6]) for i in range(12)]
    for name, cls, victim, delay in cases:
        claim = claim_doc(ns, name, {"deviceClassName": cls})
        pod = pod_doc(ns, name, name, grace=0)
        uids.append(json.loads(k("create", "-o", "json", "-f", "-", stdin=json.dumps(claim)))["metadata"]["uid"])
        k("create", "-f", "-", stdin=json.dumps(pod))
        time.sleep(delay)
        k("-n", ns, "delete", "resourceclaim" if victim == "claim" else "pod", name, "--wait=false")
        if victim == "claim":
            # The claim stays (reserved) until its pod goes: delete the pod too, later.
            time.sleep(0.5)
            k("-n", ns, "delete", "pod", name, "--wait=false")
    print(f"  {len(cases)} pods with claims (MIG and whole GPUs), deleted 0 to 1.5 s after creation "
          f"(the pod, or its claim then the pod)", flush=True)
    k("delete", "namespace", ns, "--wait=true", "--timeout=180s")
    left = wait("nothing left", lambda: not leftovers(uids), timeout=60)
    expect(left, "nothing left on the node: no CDI spec, checkpoint entry, claim directory or MIG instance",
           "; ".join(leftovers(uids)[:6]))
    print(f"  MIG devices created meanwhile: {metric('tessera_mig_devices_created') - created0:g}", flush=True)


def restart_kubelet():
    """Stops the kubelet (SIGTERM) and starts it again with the same command line,
    environment and working directory, its log appended; returns seconds to healthz."""
    import signal
    import urllib.request
    pidf = f"{DIR}/pids/kubelet"
    pid = int(open(pidf).read().strip())
    argv = [a.decode() for a in open(f"/proc/{pid}/cmdline", "rb").read().split(b"\0")[:-1]]
    env = dict(e.decode().split("=", 1) for e in open(f"/proc/{pid}/environ", "rb").read().split(b"\0") if b"=" in e)
    cwd = os.readlink(f"/proc/{pid}/cwd")
    # up.sh runs the cluster in a mount namespace of its own: the new kubelet must be
    # there too (its volume mounts are where containerd looks), so it is started through
    # nsenter into another component's namespace, the same as the kubelet's.
    ns = os.readlink(f"/proc/{pid}/ns/mnt")
    peers = [int(open(f"{DIR}/pids/{c}").read().strip()) for c in ["kube-apiserver", "etcd", "kube-scheduler"]]
    peer = next((p for p in peers if os.path.exists(f"/proc/{p}") and os.readlink(f"/proc/{p}/ns/mnt") == ns), None)
    if peer is None:
        raise RuntimeError(f"no cluster component shares the kubelet's mount namespace {ns}")
    argv = ["nsenter", "--mount", "--target", str(peer), "--"] + argv
    os.kill(pid, signal.SIGTERM)
    if not wait("kubelet stopped", lambda: not os.path.exists(f"/proc/{pid}") or
                open(f"/proc/{pid}/stat").read().split()[2] == "Z", timeout=60):
        os.kill(pid, signal.SIGKILL)
    t0 = time.monotonic()
    with open(f"{DIR}/logs/kubelet.log", "ab") as log:
        p = subprocess.Popen(argv, env=env, cwd=cwd, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                             start_new_session=True)
    with open(pidf, "w") as f:
        f.write(f"{p.pid}\n")

    def healthy():
        try:
            return urllib.request.urlopen(f"http://127.0.0.1:{ENV['KUBELET_HEALTHZ_PORT']}/healthz", timeout=2).status == 200
        except Exception:
            return False
    wait("kubelet healthz", healthy, timeout=60)
    return time.monotonic() - t0


def kubelet_restart():
    """Prepared claims survive a kubelet restart: pods keep running, nothing is prepared
    again, and deleting the pods afterwards unprepares their claims."""
    print("--- kubelet restart with prepared claims", flush=True)
    ns = "rules-kubelet"
    k("create", "namespace", ns)
    wait("serviceaccount", lambda: k("-n", ns, "get", "serviceaccount", "default", check=False))
    docs = []
    for name in ["k1", "k2"]:
        docs += [claim_doc(ns, name, {"deviceClassName": "gpu.tessera.dev"}), pod_doc(ns, name, name, grace=1)]
    done, err = apply(docs)
    if not expect(done and wait("Running", lambda: all(kj("-n", ns, "get", "pod", n)["status"].get("phase") == "Running"
                                                       for n in ["k1", "k2"])), "two pods with whole-GPU claims Running", err):
        return
    uids = [kj("-n", ns, "get", "resourceclaim", n)["metadata"]["uid"] for n in ["k1", "k2"]]
    before = {n: kj("-n", ns, "get", "pod", n)["status"]["containerStatuses"][0]["containerID"] for n in ["k1", "k2"]}
    plugin = plugin_pod()["metadata"]["name"]
    prepared_before = prepared_lines(k("-n", "tessera-system", "logs", plugin, "-c", "plugin"))
    secs = restart_kubelet()
    expect(secs < 60, f"  the kubelet restarted (healthz after {secs:.1f}s)")
    ready = wait("node Ready", lambda: any(c["type"] == "Ready" and c["status"] == "True"
                                           for c in kj("get", "node", ENV["NODE_NAME"])["status"]["conditions"]), timeout=60)
    expect(ready, "  the node is Ready again")
    # The kubelet found the plugin's registration socket again.
    time.sleep(5)
    after = {n: kj("-n", ns, "get", "pod", n)["status"]["containerStatuses"][0]["containerID"] for n in ["k1", "k2"]}
    expect(after == before and all(kj("-n", ns, "get", "pod", n)["status"]["phase"] == "Running" for n in after),
           "  the pods kept running, their containers untouched")
    expect(all(any(u in f for f in os.listdir(ENV["CDI_DIR"])) for u in uids), "  their claims are still prepared (CDI specs)")
    prepared_after = prepared_lines(k("-n", "tessera-system", "logs", plugin, "-c", "plugin"))
    expect(all(prepared_after.get(u) == prepared_before.get(u) == 1 for u in uids),
           f"  nothing prepared again: {[prepared_after.get(u, 0) for u in uids]} prepare(s) per claim")
    done, err = apply([claim_doc(ns, "k3", {"deviceClassName": "gpu.tessera.dev"}), pod_doc(ns, "k3", "k3", grace=1)])
    expect(done and wait("k3 Running", lambda: kj("-n", ns, "get", "pod", "k3")["status"].get("phase") == "Running", timeout=90),
           "  a new pod with a claim is prepared through the restarted kubelet and Running", err)
    token_ns = k("-n", ns, "exec", "k3", "--", "cat", "/var/run/secrets/kubernetes.io/serviceaccount/namespace", check=False)
    expect(token_ns == ns, f"  and has its volumes (the projected ServiceAccount namespace file reads {token_ns!r})")
    uids.append(kj("-n", ns, "get", "resourceclaim", "k3")["metadata"]["uid"])
    k("delete", "namespace", ns, "--wait=true", "--timeout=120s")
    expect(wait("unprepared", lambda: not leftovers(uids), timeout=60),
           "  deleting the pods unprepared every claim (CDI specs, checkpoint, claim directories)",
           "; ".join(leftovers(uids)[:4]))


def main():
    t0 = time.monotonic()
    build_image()
    admission_gpuconfig()
    admission_tenant_pods()
    admission_slices()
    extended_resource()
    with simulated_node_config(OUT, health={"xidClearAfter": f"{XID_CLEAR_AFTER}s"}):
        for what, fn in [("device health", device_health), ("kubelet restart", kubelet_restart), ("races", races)]:
            try:
                fn()
            except Exception as e:  # the other scenarios still run
                fail(f"{what}: {e}")
        try:
            types = {d["attributes"].get("type", {}).get("string")
                     for s in kj("get", "resourceslices")["items"] for d in s["spec"].get("devices") or []}
            share_class = ("shared.tessera.dev" if "gpu-shared" in types else
                           "slot.tessera.dev" if "gpu-slot" in types else None)
            if share_class is None:
                print("  (no shared GPU and no slots published here: the whole-GPU pod alone)", flush=True)
            kill_plugin(share_class)
        except Exception as e:  # the other scenarios still run
            fail(f"kill -9: {e}")
    if lib.errors:
        print(f"scenario rules ({ENV['K8S_VERSION']}): {lib.errors} check(s) FAILED", file=sys.stderr)
        sys.exit(1)
    print(f"scenario rules ({ENV['K8S_VERSION']}): passed ({time.monotonic() - t0:.0f}s)")


main()
