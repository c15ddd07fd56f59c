#!/usr/bin/env python3
"""`tessera plan` against the scheduler at scale (issue #44): compares the claims of
tessera-scale's paced sample as the scheduler allocated them with what `tessera plan`
printed for the same claims on the same cluster's slices.

  plan-sample.py PLANDIR PLAN.yaml

PLANDIR holds what tessera-scale wrote: slices.json (every slice of the driver),
claims.yaml (the sampled claims, unallocated, in the order they were scheduled) and
scheduler.json (the same claims as allocated). PLAN.yaml is `tessera plan -o yaml
PLANDIR/claims.yaml --slices PLANDIR/slices.json`.

Agreement at scale is per claim, and weaker than scenario-plan-agreement.sh's (the same
devices): plan sees the cluster's slices but not the allocations of the pods that fill
it, and it takes pools in its own deterministic order where the scheduler scores
nodes, so the same device is not expected. Agreed means: both allocated it (or neither);
per request (`req/sub` for firstAvailable, so the subrequest chosen is compared) the
same number of devices of the same kind: node config (from the pool's name), the
device's `type` and `profile` attributes; the same consumedCapacity values; shareID on
both or neither. Prints the counts; exit 1 on any disagreement.
"""
import json
import sys
from collections import Counter

sys.path.insert(0, __import__("os").path.join(__import__("os").path.dirname(__file__), ".."))
from scenario_lib import load_docs, quantity  # noqa: E402

CONFIGS = ("h100-whole", "h100-mig", "h100-shared", "t4")


def main(plandir, plan_path):
    with open(f"{plandir}/slices.json") as f:
        slices = json.load(f)["items"]
    attrs = {}
    for s in slices:
        pool = s["spec"]["pool"]["name"]
        for d in s["spec"].get("devices") or []:
            a = d.get("attributes") or {}
            attrs[(pool, d["name"])] = tuple(
                (a.get(k) or {}).get("string") for k in ("type", "profile"))
    with open(f"{plandir}/scheduler.json") as f:
        sched = {c["metadata"]["name"]: c for c in json.load(f)}
    plan = {d["metadata"]["name"]: d for d in load_docs(plan_path)}

    def kinds(claim):
        res = (((claim or {}).get("status") or {}).get("allocation") or {}).get("devices", {}).get("results")
        if not res:
            return None
        out = []
        for r in res:
            config = next((c for c in CONFIGS if f"-{c}-" in r["pool"] or r["pool"].startswith(f"scale-{c}-")), "?")
            cc = {k: quantity(v) for k, v in (r.get("consumedCapacity") or {}).items()}
            out.append((r["request"], config, attrs.get((r["pool"], r["device"])),
                        sorted(cc.items()), bool(r.get("shareID"))))
        return sorted(out, key=repr)

    agree, differ = 0, []
    for name, s in sched.items():
        sk, pk = kinds(s), kinds(plan.get(name))
        if sk == pk:
            agree += 1
        else:
            differ.append((name, sk, pk))
    print(f"tessera plan vs the scheduler, {len(sched)} sampled claims: {agree} agree, {len(differ)} differ")
    by_kind = Counter(name.rsplit("-", 1)[0] for name, _, _ in differ)
    if by_kind:
        print("  differences by kind: " + ", ".join(f"{k} {n}" for k, n in sorted(by_kind.items())))
    for name, sk, pk in differ[:10]:
        print(f"  {name}: scheduler {sk}; plan {pk}")
    return 1 if differ else 0


if __name__ == "__main__":
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    sys.exit(main(sys.argv[1], sys.argv[2]))
