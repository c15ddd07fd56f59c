#!/usr/bin/env python3
"""The plugin's API calls, from the API server's audit log (issue #44, item 3).

Usage: api-calls.py DIR [--nodes-prefix PREFIX]

up.sh writes DIR/audit.log: every request of the plugin's ServiceAccount
(system:serviceaccount:tessera-system:tessera-plugin), at Metadata level. This prints
each distinct call (verb, resource, subresource, selectors, with the node's name
replaced by <node>) and how often it was made, and fails when a LIST or WATCH is not
scoped to the plugin's node: a field selector on spec.nodeName (the node's pods, its
slices) is the only scope a per-node plugin needs. A call that must stay unscoped is
listed in JUSTIFIED with the reason; none is today.
"""
import json
import re
import sys
import urllib.parse
from collections import Counter

USER = "system:serviceaccount:tessera-system:tessera-plugin"
# (verb, resource) -> why an unscoped LIST/WATCH is needed. Empty: none is.
JUSTIFIED = {}


def node_of(fs):
    m = re.search(r"spec\.nodeName=([^,]+)", fs or "")
    return m.group(1) if m else None


def main():
    if len(sys.argv) < 2:
        sys.exit("usage: api-calls.py DIR")
    path = sys.argv[1].rstrip("/") + "/audit.log"
    calls = Counter()
    unscoped = Counter()
    nodes = set()
    try:
        f = open(path)
    except OSError as e:
        sys.exit(f"api-calls.py: {e}")
    with f:
        for line in f:
            try:
                ev = json.loads(line)
            except ValueError:
                continue
            if ev.get("user", {}).get("username") != USER or ev.get("stage") != "ResponseComplete":
                continue
            verb = ev.get("verb", "")
            ref = ev.get("objectRef") or {}
            uri = urllib.parse.urlsplit(ev.get("requestURI", ""))
            q = urllib.parse.parse_qs(uri.query)
            fs = q.get("fieldSelector", [""])[0]
            ls = q.get("labelSelector", [""])[0]
            node = node_of(fs)
            if node:
                nodes.add(node)
                fs = fs.replace(node, "<node>")
            name = ref.get("name") or ""
            resource = ref.get("resource") or uri.path
            if ref.get("subresource"):
                resource += "/" + ref["subresource"]
            if resource == "nodes" and name:
                nodes.add(name)
                name = "<node>"
            elif name:
                name = "<name>"
            dry = " (dry run)" if "dryRun" in q else ""
            key = (verb + dry, resource, "ns" if ref.get("namespace") else "cluster", name, fs, ls)
            calls[key] += 1
            if verb in ("list", "watch") and not node and (verb, resource) not in JUSTIFIED:
                unscoped[key] += 1
    print(f"## The plugin's API calls ({path}: {sum(calls.values())} requests, {len(nodes)} nodes)\n")
    print("| verb | resource | scope | name | fieldSelector | labelSelector | calls | per node |")
    print("|---|---|---|---|---|---|---|---|")
    for key, n in sorted(calls.items()):
        verb, res, scope, name, fs, ls = key
        print(f"| {verb} | {res} | {scope} | {name} | {fs} | {ls} | {n} | {n / max(len(nodes), 1):.1f} |")
    if unscoped:
        print("\nUNSCOPED LIST/WATCH (not limited to the plugin's node; justify in JUSTIFIED or scope it):")
        for key, n in sorted(unscoped.items()):
            print(f"  {key}: {n}")
        sys.exit(1)
    print("\nevery LIST and WATCH is scoped to the plugin's node (spec.nodeName)")


if __name__ == "__main__":
    main()
