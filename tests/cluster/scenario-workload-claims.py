#!/usr/bin/env python3
"""Scenario: workload ResourceClaims (KEP-5729) and gang scheduling (KEP-4671) on the
real cluster, where the release has them (1.37: GenericWorkload and
DRAWorkloadResourceClaims, beta and off by default, turned on by up.sh with
scheduling.k8s.io/v1beta1; 1.34 has neither, and the scenario says so and passes).

Usage (root): scenario-workload-claims.py DIR      (a cluster of up.sh with Tessera installed)

examples/workload-claims/pod-group-shares-a-claim.yaml, images replaced:
  * both pods of the gang run, and their one claim is reserved for the PodGroup
    (status.reservedFor: one entry, scheduling.k8s.io podgroups, the group's name and UID);
  * it is prepared once on the node (one CDI spec, one checkpoint entry; the kubelet
    may ask once per pod that starts before its first prepare returns, and the plugin
    answers again from its checkpoint) and both containers see the same GPU;
  * deleting one pod keeps it prepared (CDI spec and checkpoint entry there, no
    unprepare); deleting the other unprepares it once (the kubelet unprepares a claim when
    the last pod using it on the node is gone); deleting the PodGroup releases the
    reservation.
Then a gang that cannot fit: two pods, minCount 2, each with a claim of its own for
every whole GPU the node publishes. The PodGroup is reported unschedulable; no pod is
bound, no claim allocated or prepared, and the plugin saw no prepare.
"""

import json
import os
import sys
import time

import yaml

import scenario_lib as lib
from scenario_lib import DIR, ENV, IMAGE, REPO, build_image, ctr, expect, fail, k, kj, load_docs, metric, wait

EXAMPLE = f"{REPO}/examples/workload-claims/pod-group-shares-a-claim.yaml"
NS = "wl-gang"
OUT = f"{DIR}/tessera/workload-claims"
os.makedirs(OUT, exist_ok=True)


def cdi_spec(uid):
    return any(uid in f for f in os.listdir(ENV["CDI_DIR"]))


def checkpoint_entry(uid):
    ck = f"{DIR}/tessera-node/state/checkpoint.json"
    return os.path.exists(ck) and uid in json.load(open(ck)).get("claims", {})


def prepared(uid):
    return cdi_spec(uid) or checkpoint_entry(uid)


def counters():
    return metric("tessera_claim_prepares"), metric("tessera_claim_unprepares")


def gpu_nodes(pod):
    r = lib.run_kubectl(["-n", NS, "exec", pod, "--", "find", "/dev", "-name", "nvidia[0-9]*", "-type", "c"])
    return sorted(r.stdout.split())


def apply(docs, name):
    path = f"{OUT}/{name}"
    with open(path, "w") as f:
        yaml.safe_dump_all(docs, f, sort_keys=False)
    k("apply", "-f", path)


def shared_claim():
    docs = load_docs(EXAMPLE)
    for d in docs:
        d["metadata"]["namespace"] = NS
        if d["kind"] == "Pod":
            d["spec"]["terminationGracePeriodSeconds"] = 1
            for c in d["spec"]["containers"]:
                c["image"], c["imagePullPolicy"] = IMAGE, "Never"
                c.pop("command", None)  # the image's entrypoint holds
    group = next(d for d in docs if d["kind"] == "PodGroup")["metadata"]["name"]
    cname = next(d for d in docs if d["kind"] == "ResourceClaim")["metadata"]["name"]
    pods = [d["metadata"]["name"] for d in docs if d["kind"] == "Pod"]
    print(f"--- a PodGroup of {len(pods)} pods shares one claim ({os.path.relpath(EXAMPLE, REPO)})", flush=True)
    p0, u0 = counters()
    t0 = time.monotonic()
    apply(docs, "shared.yaml")
    for p in pods:
        running = wait(f"{p} Running", lambda: kj("-n", NS, "get", "pod", p)["status"].get("phase") == "Running",
                       timeout=120)
        if not expect(running, f"pod {p} Running {time.monotonic() - t0:.1f}s after apply"):
            for e in kj("-n", NS, "get", "events")["items"]:
                print(f"    event {e['involvedObject']['name']}: {e['reason']}: {e['message']}", file=sys.stderr)
            return
        expect(kj("-n", NS, "get", "pod", p)["spec"].get("nodeName") == ENV["NODE_NAME"], f"  on {ENV['NODE_NAME']}")
    pg = kj("-n", NS, "get", "podgroups.scheduling.k8s.io", group)
    claim = kj("-n", NS, "get", "resourceclaim", cname)
    uid = claim["metadata"]["uid"]
    reserved = claim["status"].get("reservedFor") or []
    print(f"  claim {cname} status.reservedFor as stored: {json.dumps(reserved)}", flush=True)
    want = [{"apiGroup": "scheduling.k8s.io", "resource": "podgroups", "name": group, "uid": pg["metadata"]["uid"]}]
    expect(reserved == want, f"claim {cname}: reserved for PodGroup {group} only, not for its pods", f"want {want}")
    devices = [r["device"] for r in claim["status"]["allocation"]["devices"]["results"]]
    expect(len(devices) == 1, f"claim {cname}: one allocation for the group: {devices}")
    specs = [f for f in os.listdir(ENV["CDI_DIR"]) if uid in f]
    expect(len(specs) == 1 and checkpoint_entry(uid), f"claim {cname}: prepared once on the node: one CDI spec "
           f"{specs}, one checkpoint entry")
    # The kubelet asks once per pod that starts before its first prepare of the claim
    # has returned (the pods of a gang start together), and the plugin answers a claim
    # already prepared from its checkpoint, rewriting nothing (tests/plugin,
    # a_claim_reserved_for_a_pod_group_is_prepared_once_and_unprepared_on_request).
    p1, u1 = counters()
    expect(1 <= p1 - p0 <= len(pods), f"claim {cname}: {p1 - p0:g} prepare call(s) for {len(pods)} pods")
    seen = {p: gpu_nodes(p) for p in pods}
    expect(len({tuple(s) for s in seen.values()}) == 1 and len(seen[pods[0]]) == 1,
           f"every pod sees the same one GPU: {seen}")

    k("-n", NS, "delete", "pod", pods[0], "--wait=true", "--timeout=60s")
    time.sleep(3)
    p2, u2 = counters()
    expect(prepared(uid) and u2 == u1 and p2 == p1,
           f"pod {pods[0]} deleted: the claim stays prepared for {pods[1]} (unprepares +{u2 - u1:g})")
    reserved = kj("-n", NS, "get", "resourceclaim", cname)["status"].get("reservedFor") or []
    expect(reserved == want, "  and stays reserved for the PodGroup", f"{reserved}")

    for p in pods[1:]:
        k("-n", NS, "delete", "pod", p, "--wait=true", "--timeout=60s")
    gone = wait("unprepared", lambda: not prepared(uid), timeout=60)
    p3, u3 = counters()
    expect(gone and u3 - u2 == 1 and p3 == p2,
           f"the last pod deleted: the claim unprepared once (CDI spec, checkpoint entry gone; unprepares +{u3 - u2:g})")
    k("-n", NS, "delete", "podgroups.scheduling.k8s.io", group, "--wait=true", "--timeout=60s")
    released = wait("reservation released",
                    lambda: not kj("-n", NS, "get", "resourceclaim", cname)["status"].get("reservedFor"), timeout=60)
    expect(released, f"PodGroup {group} deleted: claim {cname}'s reservation released")
    k("-n", NS, "delete", "resourceclaim", cname, "--wait=true", "--timeout=60s")


def gang_that_cannot_fit():
    """Two pods, minCount 2, each claiming every whole GPU the node publishes."""
    whole = 0
    for s in kj("get", "resourceslices")["items"]:
        if s["spec"]["driver"] == "gpu.tessera.dev":
            whole += sum(1 for d in s["spec"].get("devices") or []
                         if (d.get("attributes", {}).get("type") or {}).get("string") == "gpu")
    print(f"--- a gang that cannot fit: 2 pods, minCount 2, {whole} whole GPU(s) each", flush=True)
    if not expect(whole >= 1, f"the node publishes {whole} whole GPU(s)"):
        return
    group, pods = "too-big", ["too-big-0", "too-big-1"]
    docs = [
        {"apiVersion": "scheduling.k8s.io/v1beta1", "kind": "PodGroup", "metadata": {"name": group, "namespace": NS},
         "spec": {"schedulingPolicy": {"gang": {"minCount": 2}}}},
        {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaimTemplate",
         "metadata": {"name": "every-gpu", "namespace": NS},
         "spec": {"spec": {"devices": {"requests": [{"name": "gpu", "exactly": {
             "deviceClassName": "gpu.tessera.dev", "allocationMode": "ExactCount", "count": whole}}]}}}},
    ]
    for p in pods:
        pod = lib.pod_doc(NS, p)
        pod["spec"]["schedulingGroup"] = {"podGroupName": group}
        pod["spec"]["resourceClaims"] = [{"name": "gpu", "resourceClaimTemplateName": "every-gpu"}]
        pod["spec"]["containers"][0]["resources"] = {"claims": [{"name": "gpu"}]}
        docs.append(pod)
    p0, _ = counters()
    apply(docs, "too-big.yaml")

    def unschedulable():
        for c in kj("-n", NS, "get", "podgroups.scheduling.k8s.io", group).get("status", {}).get("conditions", []):
            if c["type"] == "PodGroupInitiallyScheduled" and c["status"] == "False":
                return c
        return None
    cond = wait("PodGroup unschedulable", unschedulable, timeout=120) or {}
    expect(cond.get("reason") == "Unschedulable",
           f"PodGroup {group}: PodGroupInitiallyScheduled False, Unschedulable: {cond.get('message', '')[:240]}",
           f"{cond}")
    time.sleep(3)
    claims = []
    for p in pods:
        pod = kj("-n", NS, "get", "pod", p)
        expect(pod["status"].get("phase") == "Pending" and not pod["spec"].get("nodeName"),
               f"pod {p}: Pending, not bound")
        claims += [s.get("resourceClaimName") for s in pod["status"].get("resourceClaimStatuses", [])]
    for c in kj("-n", NS, "get", "resourceclaims")["items"]:
        uid = c["metadata"]["uid"]
        expect(not c.get("status", {}).get("allocation") and not prepared(uid),
               f"claim {c['metadata']['name']}: not allocated, not prepared")
    p1, _ = counters()
    expect(p1 == p0, f"the plugin saw no prepare (prepares +{p1 - p0:g})")


def main():
    t0 = time.monotonic()
    gates = open(f"{DIR}/feature-gates").read()
    if "DRAWorkloadResourceClaims=true" not in gates or "GenericWorkload=true" not in gates:
        print(f"scenario workload claims ({ENV['K8S_VERSION']}): not on this release (it has no "
              f"DRAWorkloadResourceClaims and GenericWorkload gates: {gates.strip()})")
        return
    if IMAGE not in ctr("images", "ls", "-q").stdout:
        build_image()
    k("create", "namespace", NS)
    wait("default serviceaccount", lambda: k("-n", NS, "get", "serviceaccount", "default", check=False))
    for part in (shared_claim, gang_that_cannot_fit):
        try:
            part()
        except Exception as e:  # one part's error must not hide the other's
            fail(f"{part.__name__}: {e}")
    k("delete", "namespace", NS, "--wait=true", "--timeout=120s", check=False)
    if lib.errors:
        print(f"scenario workload claims ({ENV['K8S_VERSION']}): {lib.errors} check(s) FAILED", file=sys.stderr)
        sys.exit(1)
    print(f"scenario workload claims ({ENV['K8S_VERSION']}): passed ({time.monotonic() - t0:.0f}s)")


main()
