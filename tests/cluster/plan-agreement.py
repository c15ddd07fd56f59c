#!/usr/bin/env python3
"""Helper of scenario-plan-agreement.sh: turns a claims file of examples/claims/ into
steps for the real cluster, and compares what the real scheduler allocated with what
`tessera plan -o yaml` printed for the same file.

  plan-agreement.py steps FILE NS OUTDIR
      For each document of FILE, in order: a ResourceClaim is written to
      OUTDIR/NAME.yaml with its namespace set to NS, followed by a Pod `use-NAME` that
      references it (busybox, no registry), and `claim NAME` is printed; a Release
      document prints `release NAME...`. Other kinds are an error (a new kind in the
      examples needs a decision here).

  plan-agreement.py table TABLE.tsv
      Prints TABLE.tsv aligned, with a header.

  plan-agreement.py compare FILE SCHEDDIR PLAN.yaml TABLE.tsv CONFIG
      SCHEDDIR/NAME.json is the claim as the API server stored it once the scheduler
      allocated it, or SCHEDDIR/NAME.unschedulable holds the scheduler's message.
      PLAN.yaml is `tessera plan -o yaml FILE`: allocated claims with status.allocation,
      failed ones without (and a `# unschedulable:` comment). Appends one row per
      request (or per claim when neither side allocated it) to TABLE.tsv and prints
      the differences; exit 1 on any. CONFIG (the plugin's node config) is the
      table's first column.

Agreement (the rule, per claim, in file order):
  * both sides allocated it, or both found it unschedulable;
  * per request (result's `request`, `req/sub` for firstAvailable): the same devices,
    identified by driver/pool/device, as a multiset (results' order within a request is
    not compared). Identical, not merely "as many of the same kind": the model claims
    to search in the scheduler's deterministic order (slices of a pool in order,
    devices in slice order, depth-first with backtracking), and with one node and one
    pool there is no map-order freedom left, so a different but equally valid device
    is a difference too;
  * consumedCapacity: the same capacity names with the same quantities, written the
    same (`tessera plan -o yaml` prints status.allocation as the scheduler writes it:
    `20Gi` and `21474836480` are equal values but a difference);
  * shareID: present on both or on neither (the scheduler draws a random UUID, the
    model a reproducible hash: the values never match);
  * the claim-level rest of status.allocation: the node selector, and the config
    entries (source, requests, opaque).
"""
import json
import sys

import yaml

# (scenario_lib reads the cluster's DIR only when DIR, ENV or KUBECTL is used.)
from scenario_lib import load_docs, quantity


def steps(path, ns, outdir):
    for d in load_docs(path):
        kind = d.get("kind")
        if kind == "ResourceClaim":
            name = d["metadata"]["name"]
            claim = {
                "apiVersion": d["apiVersion"],
                "kind": "ResourceClaim",
                "metadata": {"name": name, "namespace": ns},
                "spec": d["spec"],
            }
            pod = {
                "apiVersion": "v1",
                "kind": "Pod",
                "metadata": {"name": f"use-{name}", "namespace": ns, "labels": {"tessera.dev/agreement": "1"}},
                "spec": {
                    "terminationGracePeriodSeconds": 1,
                    "resourceClaims": [{"name": "claim", "resourceClaimName": name}],
                    "containers": [{
                        "name": "main",
                        "image": "localhost/tessera/busybox:1",
                        "imagePullPolicy": "Never",
                        "command": ["sh", "-c", "trap 'exit 0' TERM; sleep 3600 & wait"],
                        "resources": {"claims": [{"name": "claim"}]},
                    }],
                },
            }
            with open(f"{outdir}/{name}.yaml", "w") as f:
                yaml.safe_dump_all([claim, pod], f, sort_keys=False)
            print("claim", name)
        elif kind == "Release":
            # `ns/name` or `name` (plan's syntax); the namespace is the test's.
            print("release", *[c.split("/")[-1] for c in d.get("claims", [])])
        else:
            sys.exit(f"{path}: kind {kind} is neither a ResourceClaim nor a Release")


def results(claim):
    alloc = (claim.get("status") or {}).get("allocation")
    if not alloc:
        return None
    return alloc


def by_request(alloc):
    out = {}
    for r in (alloc.get("devices") or {}).get("results") or []:
        out.setdefault(r["request"], []).append(r)
    return out


def dev_key(r):
    return f'{r["driver"]}/{r["pool"]}/{r["device"]}'


def show(rs, pool):
    """Devices of one request for the table: name (driver/pool when not the usual)."""
    parts = []
    for r in sorted(rs, key=dev_key):
        s = r["device"] if (r["driver"], r["pool"]) == pool else dev_key(r)
        extra = []
        cc = r.get("consumedCapacity")
        if cc:
            extra.append(",".join(f"{k}={v}" for k, v in sorted(cc.items())))
        if r.get("shareID"):
            extra.append("shareID")
        if extra:
            s += "[" + " ".join(extra) + "]"
        parts.append(s)
    return " ".join(parts)


def compare_request(sched, plan, problems):
    ok = True
    sk = sorted(dev_key(r) for r in sched)
    pk = sorted(dev_key(r) for r in plan)
    if sk != pk:
        problems.append(f"devices: scheduler {sk}, plan {pk}")
        return False
    # Pair results by device (same multiset): order of each within the request.
    ps = sorted(plan, key=dev_key)
    for s, p in zip(sorted(sched, key=dev_key), ps):
        scc, pcc = s.get("consumedCapacity") or {}, p.get("consumedCapacity") or {}
        if set(scc) != set(pcc):
            problems.append(f"{dev_key(s)}: consumedCapacity names: scheduler {sorted(scc)}, plan {sorted(pcc)}")
            ok = False
        for k in sorted(set(scc) & set(pcc)):
            if quantity(scc[k]) != quantity(pcc[k]):
                problems.append(f"{dev_key(s)}: consumedCapacity {k}: scheduler {scc[k]}, plan {pcc[k]}")
                ok = False
            elif str(scc[k]) != str(pcc[k]):
                problems.append(f"{dev_key(s)}: consumedCapacity {k}: scheduler writes {scc[k]}, plan {pcc[k]} (equal values)")
                ok = False
        if bool(s.get("shareID")) != bool(p.get("shareID")):
            problems.append(f"{dev_key(s)}: shareID: scheduler {s.get('shareID')}, plan {p.get('shareID')}")
            ok = False
        for field in ("adminAccess", "tolerations", "bindingConditions", "bindingFailureConditions"):
            if s.get(field) != p.get(field):
                problems.append(f"{dev_key(s)}: {field}: scheduler {s.get(field)}, plan {p.get(field)}")
                ok = False
    return ok


def compare(path, sched_dir, plan_path, table_path, config):
    fname = path.rsplit("/", 1)[-1]
    plan = {}
    for d in load_docs(plan_path):
        plan[d["metadata"]["name"]] = d
    rows = []
    disagreements = 0
    for d in load_docs(path):
        if d.get("kind") == "Release":
            rows.append([fname, "-", "-", "released " + ",".join(c.split("/")[-1] for c in d.get("claims", [])), "", ""])
            continue
        name = d["metadata"]["name"]
        try:
            with open(f"{sched_dir}/{name}.json") as f:
                s_alloc = results(json.load(f))
        except FileNotFoundError:
            s_alloc = None
            try:
                open(f"{sched_dir}/{name}.unschedulable").close()
            except FileNotFoundError:
                rows.append([fname, name, "-", "(not run)", "", "no"])
                disagreements += 1
                continue
        if name not in plan:
            rows.append([fname, name, "-", "", "(not in plan output)", "no"])
            disagreements += 1
            continue
        p_alloc = results(plan[name])
        requests = [r["name"] for r in d["spec"]["devices"].get("requests", [])]
        if s_alloc is None and p_alloc is None:
            rows.append([fname, name, ",".join(requests), "unschedulable", "unschedulable", "yes"])
            continue
        if s_alloc is None or p_alloc is None:
            pool = None
            side = by_request(s_alloc or p_alloc)
            for rq in sorted(side):
                txt = show(side[rq], pool)
                rows.append([fname, name, rq,
                             txt if s_alloc else "unschedulable",
                             txt if p_alloc else "unschedulable", "no"])
            disagreements += 1
            continue
        s_req, p_req = by_request(s_alloc), by_request(p_alloc)
        first = (s_alloc.get("devices") or {}).get("results") or [{}]
        pool = (first[0].get("driver"), first[0].get("pool"))
        claim_ok = True
        for rq in sorted(set(s_req) | set(p_req)):
            problems = []
            ok = compare_request(s_req.get(rq, []), p_req.get(rq, []), problems)
            rows.append([fname, name, rq, show(s_req.get(rq, []), pool), show(p_req.get(rq, []), pool), "yes" if ok else "no"])
            for p in problems:
                print(f"  DIFF {fname} {name} {rq}: {p}")
            claim_ok &= ok
        if s_alloc.get("nodeSelector") != p_alloc.get("nodeSelector"):
            print(f"  DIFF {fname} {name}: nodeSelector: scheduler {json.dumps(s_alloc.get('nodeSelector'))}, plan {json.dumps(p_alloc.get('nodeSelector'))}")
            claim_ok = False
        sc, pc = (s_alloc.get("devices") or {}).get("config"), (p_alloc.get("devices") or {}).get("config")
        if (sc or None) != (pc or None):
            print(f"  DIFF {fname} {name}: config: scheduler {json.dumps(sc)}, plan {json.dumps(pc)}")
            claim_ok = False
        if not claim_ok:
            disagreements += 1
    with open(table_path, "a") as f:
        for r in rows:
            f.write("\t".join([config] + r) + "\n")
    return disagreements


def table(path):
    """TABLE.tsv as aligned columns, with a header."""
    head = ["NODE CONFIG", "FILE", "CLAIM", "REQUEST", "SCHEDULER", "PLAN", "AGREE"]
    with open(path) as f:
        rows = [head] + [line.rstrip("\n").split("\t") for line in f if line.strip()]
    widths = [max(len(r[i]) for r in rows) for i in range(len(head) - 1)]
    for r in rows:
        print("  " + "  ".join(c.ljust(w) for c, w in zip(r, widths)) + "  " + r[-1])


def main():
    cmd = sys.argv[1] if len(sys.argv) > 1 else ""
    if cmd == "table" and len(sys.argv) == 3:
        return table(sys.argv[2])
    if cmd == "steps" and len(sys.argv) == 5:
        steps(*sys.argv[2:5])
    elif cmd == "compare" and len(sys.argv) == 7:
        sys.exit(1 if compare(*sys.argv[2:7]) else 0)
    else:
        sys.exit(__doc__)


if __name__ == "__main__":
    main()
