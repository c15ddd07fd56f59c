#!/usr/bin/env python3
"""Compares `tessera inventory -o json` (the slices the plugin would publish) with the
ResourceSlices the API server stores (`kubectl get resourceslices -o json`), for one
driver and node, modulo what the server sets (metadata.name: the server's suffix to
the generateName; uid, resourceVersion, creationTimestamp, generation, managedFields)
and the Node owner reference the plugin adds when it publishes (`inventory`, offline,
knows no Node UID): that one must be exactly {apiVersion v1, kind Node, name NODE, uid
NODE_UID, controller true}. Every other difference (a field the server dropped,
defaulted or changed) is printed by path and fails.

Usage: compare-slices.py INVENTORY.json STORED.json DRIVER NODE NODE_UID
Exit 0 when equal, 1 when not.
"""
import json
import sys

SERVER_SET = ["uid", "resourceVersion", "creationTimestamp", "generation", "managedFields"]


def diff(a, b, path, out):
    if isinstance(a, dict) and isinstance(b, dict):
        for k in sorted(set(a) | set(b)):
            p = f"{path}.{k}"
            if k not in b:
                out.append(f"{p}: published {json.dumps(a[k])[:200]}, not stored (dropped by the server)")
            elif k not in a:
                out.append(f"{p}: not published, stored {json.dumps(b[k])[:200]} (set by the server)")
            else:
                diff(a[k], b[k], p, out)
    elif isinstance(a, list) and isinstance(b, list):
        if len(a) != len(b):
            out.append(f"{path}: {len(a)} items published, {len(b)} stored")
        for i, (x, y) in enumerate(zip(a, b)):
            diff(x, y, f"{path}[{i}]", out)
    elif a != b:
        out.append(f"{path}: published {json.dumps(a)}, stored {json.dumps(b)}")


def main():
    inv_path, stored_path, driver, node, node_uid = sys.argv[1:6]
    inv = json.load(open(inv_path))["items"]
    stored = [
        s
        for s in json.load(open(stored_path))["items"]
        if s["spec"].get("driver") == driver and s["spec"].get("nodeName") == node
    ]
    problems = []
    print(f"  inventory: {len(inv)} slices; API server: {len(stored)} slices of {driver} on {node}")
    if len(inv) != len(stored):
        problems.append(f"slice count: inventory {len(inv)}, stored {len(stored)}")
    by_prefix = {}
    for s in stored:
        name = s["metadata"]["name"]
        gn = s["metadata"].get("generateName", "")
        if not gn or not name.startswith(gn):
            problems.append(f"{name}: name does not extend generateName {gn!r}")
        by_prefix.setdefault(gn, []).append(s)
    for want in inv:
        gn = want["metadata"].get("generateName")
        got = by_prefix.get(gn, [])
        if len(got) != 1:
            problems.append(f"generateName {gn!r}: {len(got)} stored slices")
            continue
        got = json.loads(json.dumps(got[0]))
        want = json.loads(json.dumps(want))
        name = got["metadata"].pop("name")
        for k in SERVER_SET:
            got["metadata"].pop(k, None)
        owner = {"apiVersion": "v1", "kind": "Node", "name": node, "uid": node_uid, "controller": True}
        refs = got["metadata"].pop("ownerReferences", None)
        if "ownerReferences" in want["metadata"]:
            problems.append(f"{name}: inventory has ownerReferences {want['metadata']['ownerReferences']}")
        elif refs != [owner]:
            problems.append(f"{name}: ownerReferences {refs}, want [{owner}]")
        got.pop("status", None)
        want.pop("status", None)
        out = []
        diff(want, got, "", out)
        ndev = len(got["spec"].get("devices", []))
        if out:
            problems += [f"{name} ({gn}){p}" for p in out]
            print(f"  {name}: {ndev} devices, {len(out)} difference(s)")
        else:
            print(f"  {name}: {ndev} devices, equal")
    for p in problems:
        print(f"  DIFF {p}")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
