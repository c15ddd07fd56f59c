#!/usr/bin/env python3
"""Scenario: every file of examples/workloads/ on the real cluster, and shared GPUs'
budgets inside real pods.

Usage (root): scenario-workloads.py DIR      (a cluster of up.sh with Tessera installed)

Each example is applied with only its images replaced by localhost/tessera/cuda-client:1
(built here: busybox, glibc, the project's CUDA client `cuda_client`). A container whose
program that image cannot have (`python` with PyTorch) gets the image's own entrypoint
instead, and the printed diff says so. Then, per example:
  * every pod reaches Running (or Succeeded) on this node;
  * each claim is allocated exactly the devices the example's `# expect:` line names;
  * each container sees exactly the device nodes of its claims' CDI specs
    (/dev/nvidia*, /dev/nvidia-caps/*), and the GPU nodes are those of the expected
    devices (gpu-N and its MIG devices: /dev/nvidiaN);
  * deleting the example unprepares every claim (CDI spec and checkpoint entry gone).
On a shared GPU (06), inside each pod a CUDA client, through the interception library
the CDI spec mounts and the fake driver of the node's driver root, sees the claim's
memory (from its allocation's consumedCapacity) as the GPU's total and is refused above
it; a third claim that does not fit stays Pending with the scheduler's reason, and runs
once a pod holding a share is deleted; a claim shared by two pods has one budget.
The plugin runs with the simulated node's own config meanwhile (the one the examples'
`# expect:` lines are planned against: gpu-1 `shared`), then the installed one again.
An example that needs devices this cluster's node does not publish (08: fallback slots,
which a server with consumable capacity never needs) is reported as such, not run.
"""

import json
import os
import subprocess
import sys
import time

import yaml

import scenario_lib as lib
from scenario_lib import CLIENT, DIR, ENV, GIB, IMAGE, REPO, build_image, claim_doc, client, expect, fail, k, kj, \
    load_docs, metric, mig_instances, mock_only, model_dump, ok, pod_doc, quantity, simulated_node, \
    simulated_node_config, wait

OUT = f"{DIR}/tessera/workloads"
os.makedirs(OUT, exist_ok=True)


# ---------- the examples ----------
def pod_specs(doc):
    """(pod spec, owner kind/name) of a Pod or a workload's template."""
    if doc["kind"] == "Pod":
        return doc["spec"]
    if doc["kind"] in ("Deployment", "StatefulSet", "DaemonSet", "Job", "ReplicaSet"):
        return doc["spec"]["template"]["spec"]
    return None


def rewrite(docs):
    """Images replaced; a program the image cannot have replaced by its entrypoint; a
    grace period of 1 s where the example sets none: `sleep` as PID 1 ignores SIGTERM, and
    with the default 30 s the namespace controller looks again only 16 s after the
    namespace's deletion (scenario_lib.pod_doc)."""
    notes = []
    for d in docs:
        spec = pod_specs(d)
        if spec is None:
            continue
        if "terminationGracePeriodSeconds" not in spec:
            spec["terminationGracePeriodSeconds"] = 1
        for c in spec.get("initContainers", []) + spec["containers"]:
            notes.append(f"{d['kind']} {d['metadata']['name']}/{c['name']}: image {c['image']} -> {IMAGE}")
            c["image"] = IMAGE
            c["imagePullPolicy"] = "Never"
            cmd = c.get("command") or []
            if cmd and cmd[0] not in ("nvidia-smi", "sleep", "sh"):
                notes.append(f"  command {cmd} -> the image's entrypoint (no {cmd[0]} in the test image)")
                del c["command"]
    return notes


# Where the node is one of NVIDIA's models (mock-node-root.sh) rather than the mock node
# the examples' `# expect:` lines are planned against: the examples that node cannot
# run, and why. The others run with their `# expect:` lines unchanged.
NOT_ON_MODEL = {
    "nvml:dgxh100": {
        "02-gpu-by-product.yaml": "it asks for a Tesla T4; a DGX H100 has 8 H100s",
        "04-two-gpus-same-pcie-root.yaml": "it asks for two GPUs under one PCIe root; the model's GPUs have no "
                                           "sysfs device, so none publishes pcieRoot (or only one, where the "
                                           "host has a PCI device at the model's bus ID)",
    },
}


def expectations(path):
    exp = {}
    for line in open(path):
        if line.startswith("# expect:"):
            name, devs = line[len("# expect:"):].split(":", 1)
            exp[name.strip()] = sorted(x.strip() for x in devs.split(","))
    return exp


def published_devices():
    """Name -> device, of this driver's stored slices."""
    devices = {}
    for s in kj("get", "resourceslices")["items"]:
        if s["spec"]["driver"] == "gpu.tessera.dev":
            devices.update((d["name"], d) for d in s["spec"].get("devices") or [])
    return devices


PUBLISHED = {}


def pods_of(docs, ns):
    """The pods the example makes: its Pods, and the pods of its workloads by label."""
    pods = []
    for d in docs:
        if d["kind"] == "Pod":
            pods.append(d["metadata"]["name"])
        elif pod_specs(d) is not None:
            sel = ",".join(f"{a}={b}" for a, b in d["spec"]["selector"]["matchLabels"].items())
            items = wait(f"pods of {d['metadata']['name']}",
                         lambda: kj("-n", ns, "get", "pods", "-l", sel)["items"], timeout=60)
            pods.extend(p["metadata"]["name"] for p in items or [])
    return pods


def gpu_of(device):
    """gpu-N, gpu-N-mig-..., gpu-N-slot-K -> N."""
    return int(device.split("-")[1])


def cdi_nodes(uid):
    """The device nodes of claim uid's CDI spec(s)."""
    nodes = set()
    cdi = ENV["CDI_DIR"]
    for f in os.listdir(cdi):
        if uid in f and f.endswith(".json"):
            spec = json.load(open(f"{cdi}/{f}"))
            for d in spec.get("devices", []):
                nodes.update(n["path"] for n in d.get("containerEdits", {}).get("deviceNodes", []))
            nodes.update(n["path"] for n in spec.get("containerEdits", {}).get("deviceNodes", []))
    return nodes




def claim_budget(claim):
    """The memory budget of a claim of shares (bytes), or None: what its allocation
    consumed of a shared device (consumable capacity), or the sum of its slots' memory
    capacity as published (fallback slots)."""
    total, any_share = 0, False
    for r in claim["status"]["allocation"]["devices"]["results"]:
        mem = (r.get("consumedCapacity") or {}).get("memory")
        dev = PUBLISHED.get(r["device"], {})
        kind = (dev.get("attributes", {}).get("type") or {}).get("string")
        if mem:
            total, any_share = total + quantity(mem), True
        elif kind == "gpu-slot":
            total, any_share = total + quantity(dev["capacity"]["memory"]["value"]), True
    return total if any_share else None




def check_budget(ns, pod, container, budget, what):
    """Inside the container: the total is the budget; above it refused, below it ok."""
    over, under = budget + GIB, budget // 2
    lines, r = client(ns, pod, container, "ctx", "0", "meminfo", "alloc", str(over), "alloc", str(under))
    if len(lines) != 4:
        return fail(f"{what}: cuda_client in {pod}/{container}: {lines} (stderr: {r.stderr.strip()[:300]})")
    total = int(lines[1].split()[2]) if lines[1].startswith("ok ") else None
    expect(lines[0] == "ok" and total == budget,
           f"{what}: {pod}/{container} sees its budget as the GPU's total: {total} bytes ({budget / GIB:.1f} GiB)",
           f"{lines}")
    expect(lines[2] == "err 2", f"{what}: 1 GiB over the {budget / GIB:.1f} GiB budget refused (err 2)", f"{lines}")
    expect(lines[3].startswith("ok "), f"{what}: half of it ({under / GIB:.1f} GiB) allocated", f"{lines}")


def run_example(path, published, more_checks):
    name = os.path.basename(path)
    ns = "wl-" + name.split("-", 1)[0]
    docs = load_docs(path)
    exp = expectations(path)
    print(f"--- {name} (namespace {ns})", flush=True)
    backend = simulated_node()["backend"]
    why = NOT_ON_MODEL.get(backend, {}).get(name)
    if why:
        print(f"  not run here: {why} ({backend})", flush=True)
        return "not applicable"
    missing = sorted({d for devs in exp.values() for d in devs} - set(published))
    if missing:
        plan = [l.strip("# \n") for l in open(path) if l.startswith("# plan:")]
        print(f"  not run here: this node publishes no {', '.join(missing)}: the example is for a "
              f"server with other feature gates ({'; '.join(plan)}; this one: {open(DIR + '/feature-gates').read().strip() or 'the defaults'})",
              flush=True)
        return "not applicable"
    notes = rewrite(docs)
    for n in notes:
        print(f"  rewrite: {n}", flush=True)
    for d in docs:
        d.setdefault("metadata", {})["namespace"] = ns
    manifest = f"{OUT}/{name}"
    with open(manifest, "w") as f:
        yaml.safe_dump_all(docs, f, sort_keys=False)
    k("create", "namespace", ns)
    wait("default serviceaccount", lambda: k("-n", ns, "get", "serviceaccount", "default", check=False))
    t0 = time.monotonic()
    k("apply", "-f", manifest)
    pods = pods_of(docs, ns)
    expect(pods, f"{name}: pods created: {', '.join(pods)}")
    claims = {}  # claim name -> (claim json, pods, [(pod, container)])
    for p in pods:
        phase = wait(f"{p} Running", lambda: (kj("-n", ns, "get", "pod", p)["status"].get("phase")
                                              in ("Running", "Succeeded")), timeout=90)
        pod = kj("-n", ns, "get", "pod", p)
        if not expect(phase, f"pod {p} {pod['status'].get('phase')} {time.monotonic() - t0:.1f}s after apply",
                      f"phase {pod['status'].get('phase')}"):
            for e in kj("-n", ns, "get", "events", "--field-selector", f"involvedObject.name={p}")["items"]:
                print(f"    event: {e['reason']}: {e['message']}", file=sys.stderr)
            continue
        expect(pod["spec"].get("nodeName") == ENV["NODE_NAME"], f"pod {p} on {ENV['NODE_NAME']}")
        statuses = {s["name"]: s.get("resourceClaimName") for s in pod["status"].get("resourceClaimStatuses", [])}
        for rc in pod["spec"].get("resourceClaims", []):
            cname = rc.get("resourceClaimName") or statuses.get(rc["name"])
            key = rc.get("resourceClaimTemplateName") or rc.get("resourceClaimName")
            claim = kj("-n", ns, "get", "resourceclaim", cname)
            entry = claims.setdefault(cname, {"claim": claim, "key": key, "containers": []})
            for c in pod["spec"]["containers"]:
                uses = [x for x in c.get("resources", {}).get("claims", []) if x["name"] == rc["name"]]
                if uses:
                    entry["containers"].append((p, c["name"]))
                    entry.setdefault("metadata", []).append(
                        (p, c["name"], rc["name"] if rc.get("resourceClaimTemplateName") else None,
                         [x.get("request") for x in uses]))
    for cname, e in sorted(claims.items()):
        claim = e["claim"]
        devs = sorted(r["device"] for r in claim["status"]["allocation"]["devices"]["results"])
        if e["key"] in exp:
            expect(devs == exp[e["key"]], f"claim {cname}: allocated {', '.join(devs)} (# expect: {e['key']})",
                   f"want {exp[e['key']]}")
        else:
            fail(f"claim {cname}: no '# expect: {e['key']}:' line in {name}")
        uid = claim["metadata"]["uid"]
        nodes = cdi_nodes(uid)
        want_gpus = {f"/dev/nvidia{gpu_of(d)}" for d in devs}
        gpus_in_spec = {n for n in nodes if n[len("/dev/nvidia"):].isdigit()}
        expect(gpus_in_spec == want_gpus, f"claim {cname}: CDI spec's GPU nodes {sorted(gpus_in_spec)}",
               f"want {sorted(want_gpus)}")
        e["nodes"] = nodes
        check_device_status(ns, cname)
        check_device_metadata(ns, cname, e.get("metadata", []))
    # Each container: exactly the device nodes of its claims' specs.
    by_container = {}
    for e in claims.values():
        for pc in e["containers"]:
            by_container.setdefault(pc, set()).update(e.get("nodes", set()))
    for (p, c), want in sorted(by_container.items()):
        r = lib.run_kubectl(["-n", ns, "exec", p, "-c", c, "--", "find", "/dev", "-name", "nvidia*", "-type", "c"])
        seen = set(r.stdout.split())
        expect(seen == want, f"{p}/{c}: sees exactly its claims' {len(want)} device nodes",
               f"extra {sorted(seen - want)}, missing {sorted(want - seen)} {r.stderr.strip()[:200]}")
    shared = {cn: e for cn, e in claims.items() if claim_budget(e["claim"]) is not None}
    for cn, e in sorted(shared.items()):
        for p, c in e["containers"]:
            check_budget(ns, p, c, claim_budget(e["claim"]), f"claim {cn}")
    if more_checks:
        more_checks(ns, docs, claims)
    # Delete: every claim unprepared.
    uids = [e["claim"]["metadata"]["uid"] for e in claims.values()]
    k("delete", "namespace", ns, "--wait=true", "--timeout=120s")
    wait("unprepared", lambda: not any(prepared(u) for u in uids), timeout=60)
    left = [u for u in uids if prepared(u)]
    expect(not left, f"{name}: every claim unprepared after the namespace's deletion (CDI spec, checkpoint)",
           f"still prepared: {left}")
    return "run"


def check_device_status(ns, cname):
    """`kubectl get resourceclaim -o yaml` shows status.devices (KEP-4817): one Ready
    entry per allocated device, whose data names the GPU's UUID and product and the CDI
    device IDs, a MIG device created on demand its MIG UUID and placement, a share its
    budget (the memory and compute its allocation consumed). The YAML is kept in OUT."""
    def entries():
        c = kj("-n", ns, "get", "resourceclaim", cname)
        results = c["status"]["allocation"]["devices"]["results"]
        got = c["status"].get("devices") or []
        return (c, results, got) if len(got) >= len(results) else None
    got = wait(f"{cname} status.devices", entries, timeout=30)
    if not expect(got, f"claim {cname}: status.devices has an entry per allocated device"):
        return
    with open(f"{OUT}/{ns}-{cname}.status.yaml", "w") as f:
        f.write(k("-n", ns, "get", "resourceclaim", cname, "-o", "yaml"))
    claim, results, devices = got
    for r in results:
        d = next((d for d in devices if (d["driver"], d["pool"], d["device"], d.get("shareID"))
                  == (r["driver"], r["pool"], r["device"], r.get("shareID"))), None)
        if not expect(d, f"  {r['device']}: an entry for it", f"{devices}"):
            continue
        data = d.get("data") or {}
        ready = [(c["status"], c["reason"]) for c in d.get("conditions", []) if c["type"] == "Ready"]
        expect(ready == [("True", "Prepared")], f"  {r['device']}: Ready=True", f"{ready}")
        expect(data.get("gpuUUID", "").startswith("GPU-") and data.get("productName")
               and data.get("cdiDeviceIDs"),
               f"  {r['device']}: data gpuUUID {data.get('gpuUUID')}, {data.get('productName')}, "
               f"CDI {data.get('cdiDeviceIDs')}", f"{data}")
        if "-mig-" in r["device"]:
            mig = data.get("mig") or {}
            expect(mig.get("uuid", "").startswith("MIG-") and mig.get("createdOnDemand") is True
                   and "start" in mig.get("placement", {}),
                   f"  {r['device']}: MIG {mig.get('uuid')} {mig.get('profile')} at {mig.get('placement')}",
                   f"{mig}")
        mem = (r.get("consumedCapacity") or {}).get("memory")
        if mem:
            budget = data.get("budget") or {}
            expect(budget.get("memoryBytes") == quantity(mem)
                   and str(budget.get("computePercent")) == str(r["consumedCapacity"].get("compute")),
                   f"  {r['device']} share {r.get('shareID')}: budget {budget}",
                   f"want memory {quantity(mem)}, compute {r['consumedCapacity'].get('compute')}")


METADATA_DIR = "/var/run/kubernetes.io/dra-device-attributes"
METADATA_KEPT = []


def check_device_metadata(ns, cname, uses):
    """KEP-5304: each container reads, per request of the claim it uses, its device
    metadata file (resourceclaims/<claim>/... for a claim the pod names,
    resourceclaimtemplates/<pod claim name>/... for a template's), whose newest object
    (metadata.resource.k8s.io/v1beta1) lists the request's devices with their
    attributes: uuid the GPU's UUID (a MIG device's own MIG UUID, parentUUID its GPU's),
    as status.devices says."""
    claim = kj("-n", ns, "get", "resourceclaim", cname)
    results = [r for r in claim["status"]["allocation"]["devices"]["results"] if r["driver"] == "gpu.tessera.dev"]
    status = {(d["pool"], d["device"], d.get("shareID")): d.get("data") or {}
              for d in claim["status"].get("devices") or [] if d["driver"] == "gpu.tessera.dev"}
    for pod, container, pod_claim, requests in uses:
        wanted = sorted({r["request"].split("/")[0] for r in results
                         if None in requests or r["request"].split("/")[0] in requests})
        for req in wanted:
            base = f"resourceclaimtemplates/{pod_claim}" if pod_claim else f"resourceclaims/{cname}"
            path = f"{METADATA_DIR}/{base}/{req}/gpu.tessera.dev-metadata.json"
            r = lib.run_kubectl(["-n", ns, "exec", pod, "-c", container, "--", "cat", path])
            try:
                doc, _ = json.JSONDecoder().raw_decode(r.stdout)
            except ValueError:
                fail(f"{pod}/{container}: reads {path}: {r.stdout[:200]} {r.stderr.strip()[:200]}")
                continue
            if len(METADATA_KEPT) < 2 and (pod_claim is None) not in [k for k, _ in METADATA_KEPT]:
                METADATA_KEPT.append((pod_claim is None, path))
                with open(f"{OUT}/{ns}-{pod}-{container}-{req}.metadata.json", "w") as f:
                    f.write(r.stdout)
            devices = {d["name"]: d for q in doc.get("requests", []) for d in q.get("devices", [])}
            mine = [x for x in results if x["request"].split("/")[0] == req]
            ok_uuid = True
            for x in mine:
                attrs = (devices.get(x["device"]) or {}).get("attributes") or {}
                data = status.get((x["pool"], x["device"], x.get("shareID")), {})
                want = (data.get("mig") or {}).get("uuid") or data.get("gpuUUID")
                got = (attrs.get("uuid") or {}).get("string")
                ok_uuid = ok_uuid and want is not None and got == want
                if data.get("mig"):
                    ok_uuid = ok_uuid and (attrs.get("parentUUID") or {}).get("string") == data.get("gpuUUID")
            expect(doc.get("apiVersion") == "metadata.resource.k8s.io/v1beta1"
                   and doc.get("metadata", {}).get("uid") == claim["metadata"]["uid"]
                   and sorted(devices) == sorted(x["device"] for x in mine) and ok_uuid,
                   f"{pod}/{container}: {'template' if pod_claim else 'direct'} claim {cname} request {req}: "
                   f"{path} lists {sorted(devices)} with their UUIDs",
                   f"{json.dumps(doc)[:600]}")


def prepared(uid):
    cdi = ENV["CDI_DIR"]
    if any(uid in f for f in os.listdir(cdi)):
        return True
    ck = f"{DIR}/tessera-node/state/checkpoint.json"
    return os.path.exists(ck) and uid in open(ck).read()


def stays_pending(ns, name, what):
    """Pod NAME (with claim NAME) is Unschedulable, with the scheduler's message, and is
    still Pending with its claim unallocated 3 s later."""
    def unschedulable():
        for c in kj("-n", ns, "get", "pod", name)["status"].get("conditions", []):
            if c["type"] == "PodScheduled" and c["status"] == "False" and c.get("reason") == "Unschedulable":
                return c.get("message") or "?"
        return None
    msg = wait(f"{name} Unschedulable", unschedulable, timeout=60)
    expect(msg, f"{what}: pod Pending, Unschedulable: {msg}")
    time.sleep(3)
    expect(kj("-n", ns, "get", "pod", name)["status"].get("phase") == "Pending"
           and not kj("-n", ns, "get", "resourceclaim", name)["status"].get("allocation"),
           "  and still Pending, its claim unallocated, 3 s later")


def shared_gpu_checks(ns, docs, claims):
    """06's pods run: a third claim that does not fit waits, then takes a freed share;
    a claim shared by two pods has one budget."""
    used = sum(claim_budget(e["claim"]) for e in claims.values())
    gpu = {r["device"] for e in claims.values() for r in e["claim"]["status"]["allocation"]["devices"]["results"]}
    total = {f"gpu-{g['minor']}": g["memoryBytes"] for g in simulated_node()["gpus"]}[sorted(gpu)[0]]
    big = (total - used) // GIB + 1  # GiB: more than is left
    print(f"  {sorted(gpu)}: {used // GIB} GiB of {total / GIB:.1f} GiB taken; a third claim asks {big} GiB", flush=True)
    third = claim_doc(ns, "third", {"deviceClassName": "shared.tessera.dev",
                                    "capacity": {"requests": {"memory": f"{big}Gi", "compute": "10"}}})
    k("apply", "-f", "-", stdin=yaml.safe_dump_all([third, pod_doc(ns, "third", "third")]))
    stays_pending(ns, "third", f"a third claim of {big} GiB that does not fit")
    # Free a share: delete the workload holding the most.
    owner = max(((e["claim"], e["containers"]) for e in claims.values()), key=lambda x: claim_budget(x[0]))
    freed = claim_budget(owner[0])
    for d in docs:
        if d["kind"] == "Deployment" and any(p.startswith(d["metadata"]["name"] + "-") for p, _ in owner[1]):
            k("-n", ns, "delete", "deployment", d["metadata"]["name"], "--wait=true")
    running = wait("third Running", lambda: kj("-n", ns, "get", "pod", "third")["status"].get("phase") == "Running",
                   timeout=90)
    expect(running, f"  after deleting the pod holding {freed // GIB} GiB: the third pod Running")
    if running:
        check_budget(ns, "third", "main", big * GIB, "claim third")

    # One claim, two pods: one budget.
    budget = 8 * GIB
    one = claim_doc(ns, "two-pods", {"deviceClassName": "shared.tessera.dev",
                                     "capacity": {"requests": {"memory": "8Gi", "compute": "5"}}})
    pods = [pod_doc(ns, n, "two-pods") for n in ("user-a", "user-b")]
    k("apply", "-f", "-", stdin=yaml.safe_dump_all([one] + pods))
    both = wait("user-a and user-b Running", lambda: all(
        kj("-n", ns, "get", "pod", n)["status"].get("phase") == "Running" for n in ("user-a", "user-b")), timeout=90)
    if not expect(both, "a claim shared by two pods: both Running"):
        return
    reserved = sorted(r["name"] for r in kj("-n", ns, "get", "resourceclaim", "two-pods")["status"]["reservedFor"])
    expect(reserved == ["user-a", "user-b"], f"  reserved for {reserved}")
    # A claim the pods name (the examples' are all from templates): its status.devices,
    # and each pod's metadata file under resourceclaims/two-pods/.
    check_device_status(ns, "two-pods")
    check_device_metadata(ns, "two-pods", [(p, "main", None, [None]) for p in ("user-a", "user-b")])
    # user-a holds 5 GiB in a process that stays; user-b sees it gone from the budget and
    # may take what is left (its free memory), not more. (A context is charged too: the
    # library counts each process's context as a real one takes, so "left" is less than
    # 3 GiB.)
    lib.run_kubectl(["-n", ns, "exec", "user-a", "--", "sh", "-c",
                     f"{CLIENT} gpa ctx 0 alloc {5 * GIB} hold >/tmp/held 2>&1 </dev/null &"])
    held = wait("user-a holding", lambda: "holding" in k("-n", ns, "exec", "user-a", "--", "cat", "/tmp/held",
                                                         check=False), timeout=30)
    expect(held, "  user-a holds 5 GiB of the 8 GiB budget")
    lines, _ = client(ns, "user-b", "main", "ctx", "0", "meminfo")
    free = int(lines[1].split()[1]) if len(lines) == 2 and lines[1].startswith("ok ") else None
    if not expect(free is not None and free <= budget - 5 * GIB,
                  f"  user-b: {free / GIB if free else 0:.2f} GiB free of 8 (user-a's 5 GiB counted)", f"{lines}"):
        return
    margin = 64 << 20
    lines, _ = client(ns, "user-b", "main", "ctx", "0", "alloc", str(free + margin), "alloc", str(free - margin))
    expect(lines[1:2] == ["err 2"], f"  user-b: its free memory + 64 MiB refused: {lines[1:2]}")
    expect(len(lines) > 2 and lines[2].startswith("ok "), f"  user-b: its free memory - 64 MiB allocated: {lines[2:3]}")




def slot_checks(ns, docs, claims):
    """08's pod holds every slot of the shared GPU (a server without consumable
    capacity): a claim of one more slot stays Pending (Unschedulable), and once 08's pod
    is deleted it runs with one slot's budget, as 06's third claim does with shares."""
    claim = claim_doc(ns, "one-slot", {"deviceClassName": "slot.tessera.dev"})
    k("apply", "-f", "-", stdin=yaml.safe_dump_all([claim, pod_doc(ns, "one-slot", "one-slot")]))
    stays_pending(ns, "one-slot", "every slot taken: a claim of one more slot")
    for d in docs:
        if d["kind"] == "Pod":
            k("-n", ns, "delete", "pod", d["metadata"]["name"], "--wait=true")
    running = wait("one-slot Running",
                   lambda: kj("-n", ns, "get", "pod", "one-slot")["status"].get("phase") == "Running", timeout=90)
    expect(running, "  after deleting the pod holding every slot: the one-slot pod Running")
    if running:
        budget = claim_budget(kj("-n", ns, "get", "resourceclaim", "one-slot"))
        check_budget(ns, "one-slot", "main", budget, "claim one-slot")


# Where the pods of watchdog_checks find the simulated driver's ledger (the mock node's
# driverLedger, under the plugin's state dir).
LEDGER = f"{DIR}/tessera-node/state/driver-ledger"


def watchdog_checks(published):
    """The memory watchdog as the backstop for what needs tenant code: in a pod of a
    shared claim (8 GiB of a shared GPU, or one fallback slot where the server has no
    consumable capacity), a process that gets around the interception library
    (bypass.c: linked statically with a driver of its own, as raw ioctls would) and
    holds more than the claim's budget is killed within 2 s, with a GpuMemoryOverBudget
    Event on its pod, while a process within budget in the same pod is left alone. The
    pod mounts the simulated driver's ledger, so its fake driver records what each
    process holds, and the plugin lists those processes as NVML does (host PIDs,
    through the PID namespace)."""
    if mock_only("--- the memory watchdog", "NVIDIA's models report no processes (NOT_SUPPORTED), and the "
                 "fake driver's ledger is the mock node's"):
        return
    ns, name = "wl-watchdog", "walled"
    slots = any(d.get("attributes", {}).get("type", {}).get("string") == "gpu-slot" for d in published.values())
    request = ({"deviceClassName": "slot.tessera.dev", "count": 1} if slots else
               {"deviceClassName": "shared.tessera.dev",
                "capacity": {"requests": {"memory": "8Gi", "compute": "10"}}})
    claim = claim_doc(ns, name, request)
    # The fake driver's wiring: the ledger, and addresses without host pages (more than
    # the machine's memory).
    pod = pod_doc(ns, name, name,
                  env=[{"name": "FAKE_CUDA_LEDGER", "value": "/var/lib/fake-driver/ledger"},
                       {"name": "FAKE_CUDA_NO_BACKING", "value": "1"}],
                  mounts=[{"name": "ledger", "mountPath": "/var/lib/fake-driver/ledger"}],
                  volumes=[{"name": "ledger", "hostPath": {"path": LEDGER, "type": "File"}}])
    print(f"--- watchdog (namespace {ns}): a claim of {'one slot' if slots else '8 GiB of a shared GPU'}",
          flush=True)
    k("create", "namespace", ns)
    wait("default serviceaccount", lambda: k("-n", ns, "get", "serviceaccount", "default", check=False))
    k("apply", "-f", "-", stdin=yaml.safe_dump_all([claim, pod]))
    claim_uid = kj("-n", ns, "get", "resourceclaim", name)["metadata"]["uid"]
    try:
        running = wait(f"{name} Running", lambda: kj("-n", ns, "get", "pod", name)["status"].get("phase") == "Running",
                       timeout=90)
        if not expect(running, f"watchdog: pod {name} Running"):
            return
        budget = claim_budget(kj("-n", ns, "get", "resourceclaim", name))
        if not expect(budget, f"watchdog: claim {name} has a budget of {(budget or 0) / GIB:.1f} GiB"):
            return
        uid = kj("-n", ns, "get", "pod", name)["metadata"]["uid"]
        # Within budget, through the library: a quarter of the budget, held.
        lib.run_kubectl(["-n", ns, "exec", name, "--", "sh", "-c",
                         f"{CLIENT} gpa ctx 0 alloc {budget // 4} hold >/tmp/held 2>&1 </dev/null &"])
        held = wait("holder holding", lambda: "holding" in k("-n", ns, "exec", name, "--", "cat", "/tmp/held",
                                                             check=False), timeout=30)
        holder = k("-n", ns, "exec", name, "--", "pidof", "cuda_client", check=False).split()
        if not expect(held and len(holder) == 1, f"watchdog: a process holding {budget // 4 / GIB:.1f} GiB "
                      f"through the library (pid {holder} in the pod)"):
            return
        time.sleep(2)  # four watchdog ticks with the holder's memory in the ledger
        expect(lib.run_kubectl(["-n", ns, "exec", name, "--", "kill", "-0", holder[0]]).returncode == 0,
               "  within budget: still running 2 s later")
        # Past the library: 1.5 budgets. kubectl exec ends when the process does.
        over = budget * 3 // 2
        p = subprocess.Popen(lib.KUBECTL + ["-n", ns, "exec", name, "--", "/usr/local/bin/bypass", str(over)],
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        lines, t_held = [], None
        for line in p.stdout:
            lines.append(line.strip())
            if line.strip() == "holding":
                t_held = time.monotonic()
                break
        if t_held is None:
            p.kill()
            _, err = p.communicate()
            return fail(f"watchdog: the bypass holds {over / GIB:.1f} GiB past the library: {lines} {err[:300]}")
        ok(f"watchdog: the bypass holds {over / GIB:.1f} GiB past the library")
        try:
            rc = p.wait(timeout=30)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()
            return fail("  the bypass still runs 30 s after it held the memory")
        took = time.monotonic() - t_held
        # kubectl exec reports the process's status as 128 + signal.
        expect(rc == 137 and took <= 2.0, f"  killed (SIGKILL) within 2 s of holding the memory: {took:.2f} s",
               f"exit status {rc}")
        events = wait("GpuMemoryOverBudget", lambda: [
            e for e in kj("-n", ns, "get", "events", "--field-selector",
                          f"involvedObject.uid={uid},reason=GpuMemoryOverBudget")["items"]], timeout=15)
        expect(events, "  a GpuMemoryOverBudget Event on the pod: "
               + (events[0]["message"][:160] if events else "none"))
        time.sleep(1.5)
        alive = lib.run_kubectl(["-n", ns, "exec", name, "--", "kill", "-0", holder[0]]).returncode == 0
        still = "holding" in k("-n", ns, "exec", name, "--", "cat", "/tmp/held", check=False)
        expect(alive and still, "  the process within budget in the same pod left alone")
    finally:
        k("delete", "namespace", ns, "--wait=true", "--timeout=120s", check=False)
        expect(wait("walled unprepared", lambda: not prepared(claim_uid), timeout=60),
               "  namespace deleted: the claim unprepared")


def mig_checks(ns, docs, claims):
    """05's pod runs: the MIG device was created (recorded first) at the placement the
    scheduler chose, the container's capability nodes are that instance's, a whole-GPU
    claim for the parent GPU waits; deleting the pod destroys the device and the whole
    GPU is then allocated."""
    for cname, e in claims.items():
        uid = e["claim"]["metadata"]["uid"]
        dev = e["claim"]["status"]["allocation"]["devices"]["results"][0]["device"]
        gpu, profile, start = gpu_of(dev), int(dev.split("-")[-2]), int(dev.split("-")[-1])
        ck = json.load(open(f"{DIR}/tessera-node/state/checkpoint.json"))
        rec = next((d for c, r in ck.get("claims", {}).items() if c == uid for d in r.get("devices", [])), None)
        mig = (rec or {}).get("mig") or {}
        expect(mig.get("created") and mig.get("gpuMinor") == gpu and mig.get("profileId") == profile
               and mig.get("start") == start and str(mig.get("uuid", "")).startswith("MIG-"),
               f"MIG device of {dev} created at the scheduler's placement (GPU {gpu}, profile {profile}, start {start}): "
               f"checkpoint gi {mig.get('giId')} ci {mig.get('ciId')} {mig.get('uuid')}", json.dumps(mig))
        if mig.get("giId") is not None and mig.get("ciId") is not None:
            gi_cap = 3 + 135 * gpu + 9 * mig["giId"]  # mock-node-root.sh, mig/geometry.rs
            want = {f"/dev/nvidia-caps/nvidia-cap{gi_cap}", f"/dev/nvidia-caps/nvidia-cap{gi_cap + 1 + mig['ciId']}"}
            caps = {n for n in e.get("nodes", set()) if "nvidia-caps" in n}
            expect(caps == want, f"  the container's capability nodes are that instance's: {sorted(caps)}",
                   f"want {sorted(want)}")
        if simulated_node()["backend"] != "mock":
            live = [ci["uuid"] for g in model_dump()["gpus"] if g["minor"] == gpu for gi in g["gpuInstances"]
                    if gi["id"] == mig.get("giId") for ci in gi["computeInstances"] if ci["id"] == mig.get("ciId")]
            expect(live == [mig.get("uuid")], f"  NVIDIA's model has that GPU and compute instance, with that MIG "
                                              f"UUID: {live}", f"want [{mig.get('uuid')}]")
        created, destroyed = metric("tessera_mig_devices_created"), metric("tessera_mig_devices_destroyed")
        uuid = next(g["uuid"] for g in simulated_node()["gpus"] if g["minor"] == gpu)
        whole = claim_doc(ns, "whole-parent", {
            "deviceClassName": "gpu.tessera.dev",
            "selectors": [{"cel": {"expression": f'device.attributes["gpu.tessera.dev"].uuid == "{uuid}"'}}]})
        k("apply", "-f", "-", stdin=yaml.safe_dump_all([whole, pod_doc(ns, "whole-parent", "whole-parent")]))

        def unschedulable():
            for c in kj("-n", ns, "get", "pod", "whole-parent")["status"].get("conditions", []):
                if c["type"] == "PodScheduled" and c.get("reason") == "Unschedulable":
                    return c.get("message") or "?"
        msg = wait("whole-parent Unschedulable", unschedulable, timeout=60)
        expect(msg, f"  a whole-GPU claim for gpu-{gpu} waits while the MIG device exists: {msg}")
        for p, _ in e["containers"]:
            k("-n", ns, "delete", "pod", p, "--wait=true")
        wait("unprepared", lambda: not prepared(uid), timeout=60)
        expect(wait("destroyed", lambda: metric("tessera_mig_devices_destroyed") >= destroyed + 1, timeout=30),
               f"  deleting the pod destroyed the MIG device (tessera_mig_devices_destroyed {destroyed:g} -> "
               f"{metric('tessera_mig_devices_destroyed'):g}; created {created:g})")
        if simulated_node()["backend"] != "mock":
            expect(not mig_instances(), f"  and NVIDIA's model has no GPU instance left: {mig_instances()}")
        running = wait("whole-parent Running",
                       lambda: kj("-n", ns, "get", "pod", "whole-parent")["status"].get("phase") == "Running", timeout=90)
        got = [r["device"] for r in (kj("-n", ns, "get", "resourceclaim", "whole-parent")["status"].get("allocation") or
                                     {"devices": {"results": []}})["devices"]["results"]]
        expect(running and got == [f"gpu-{gpu}"], f"  then the whole GPU is allocated and its pod Running: {got}")


def main():
    build_image()
    # The examples' `# expect:` lines are planned against the simulated node's own
    # config (gpu-1 `shared`); the installed one (both H100s in `mig` mode) is put back.
    # Device metadata files on, as the shipped configs have them.
    with simulated_node_config(OUT, deviceMetadata=True):
        run_all()


def run_all():
    published = published_devices()
    PUBLISHED.update(published)
    t0 = time.monotonic()
    results = {}
    for f in sorted(os.listdir(f"{REPO}/examples/workloads")):
        if f.endswith(".yaml"):
            try:
                more = {"05": mig_checks, "06": shared_gpu_checks, "08": slot_checks}.get(f.split("-", 1)[0])
                results[f] = run_example(f"{REPO}/examples/workloads/{f}", published, more)
            except Exception as e:  # one example's error must not hide the others
                fail(f"{f}: {e}")
                results[f] = "error"
                k("delete", "namespace", "wl-" + f.split("-", 1)[0], "--ignore-not-found", "--wait=false", check=False)
    try:
        watchdog_checks(published)
    except Exception as e:
        fail(f"watchdog: {e}")
        k("delete", "namespace", "wl-watchdog", "--ignore-not-found", "--wait=false", check=False)
    run = sum(1 for v in results.values() if v == "run")
    na = [f for f, v in results.items() if v == "not applicable"]
    summary = f"{run} of {len(results)} examples run" + (f", not applicable here: {', '.join(na)}" if na else "")
    if lib.errors:
        print(f"scenario workloads ({ENV['K8S_VERSION']}): {lib.errors} check(s) FAILED; {summary}", file=sys.stderr)
        sys.exit(1)
    print(f"scenario workloads ({ENV['K8S_VERSION']}): passed; {summary} ({time.monotonic() - t0:.0f}s)")


main()
