#!/usr/bin/env python3
"""Benchmark (not a test): what Tessera adds to pod start-up on the real cluster.

Usage (root): bench-startup.py DIR [--quick]   (a cluster of up.sh with Tessera installed)

Per kind, N pods one after another (20; --quick or TESSERA_BENCH_QUICK=1: 3), each
created alone and deleted (and its claim unprepared) before the next: (a) no claim,
(b) a whole GPU, (c) a share of the shared GPU (1 GiB, 1 % compute), (d) a MIG
1g.10gb partition (created on demand). Printed per kind: p50 and p95 of the time from
`kubectl create` returning to the pod observed Running (polled every 50 ms through the
API server, so each figure carries up to ~0.1 s of polling and kubectl start-up), the
time added over (a), and Tessera's own share: the plugin's prepare latency
(`tessera_claim_prepare_duration_seconds` of its /metrics: the mean of the kind's
prepares in the run, and the histogram bucket holding its p95). Target (issue #23):
Tessera's prepare adds at most 100 ms p95 per kind on the mock node; the verdict is
printed, never enforced.
Then M shared-claim pods created at once (100; quick: 10), each with its own claim of
the shared GPU (512 MiB, 1 % compute): the time to the last one Running, and the budget
a CUDA client sees in every tenth pod (it must be 512 MiB).
Runs on the simulated node's own node config (gpu-1 `shared`; node-config.sh), the
installed one put back at the end.
"""

import json
import os
import sys
import time

import yaml

QUICK = os.environ.get("TESSERA_BENCH_QUICK") == "1" or "--quick" in sys.argv[1:]
sys.argv = [a for a in sys.argv if a != "--quick"]

import scenario_lib as lib  # noqa: E402 (reads DIR from sys.argv)
from scenario_lib import (DIR, ENV, build_image, claim_doc, client, expect, k, kj, metrics_text, pod_doc,  # noqa: E402
                          simulated_node_config, wait)

N = 3 if QUICK else 20
M = 10 if QUICK else 100
NS = "bench-startup"
OUT = f"{DIR}/tessera/bench-startup"
os.makedirs(OUT, exist_ok=True)
KINDS = {
    "none": None,
    "whole": {"deviceClassName": "gpu.tessera.dev"},
    "shared": {"deviceClassName": "shared.tessera.dev", "capacity": {"requests": {"memory": "1Gi", "compute": "1"}}},
    "mig": {"deviceClassName": "mig.tessera.dev",
            "selectors": [{"cel": {"expression": 'device.attributes["gpu.tessera.dev"].profile == "1g.10gb"'}}]},
}


def objects(name, kind_req, labels=None):
    pod = pod_doc(NS, name, name if kind_req is not None else None, grace=1, labels=labels or {"bench": "startup"})
    return ([claim_doc(NS, name, kind_req)] if kind_req is not None else []) + [pod]


def histogram(name):
    """{kind: (count, sum, {le: cumulative count})} of a histogram of the plugin."""
    text = metrics_text()
    h = {}
    for line in text.splitlines():
        if not line.startswith(name):
            continue
        series, value = line.rsplit(" ", 1)
        labels = dict(kv.split("=", 1) for kv in series[series.find("{") + 1:-1].split(",")) if "{" in series else {}
        kind = labels.get("kind", "").strip('"')
        c, s, b = h.get(kind, (0.0, 0.0, {}))
        if series.startswith(name + "_count"):
            c = float(value)
        elif series.startswith(name + "_sum"):
            s = float(value)
        elif series.startswith(name + "_bucket"):
            b = dict(b, **{labels["le"].strip('"'): float(value)})
        h[kind] = (c, s, b)
    return h


def pct(xs, p):
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(round(p / 100 * (len(xs) - 1))))]


def one(kind, i):
    name = f"{kind}-{i}"
    k("apply", "-f", "-", stdin=yaml.safe_dump_all(objects(name, KINDS[kind])))
    t0 = time.monotonic()
    running = wait(name, lambda: k("-n", NS, "get", "pod", name, "-o", "jsonpath={.status.phase}",
                                   check=False) == "Running", timeout=120, step=0.05)
    dt = time.monotonic() - t0
    if not running:
        raise RuntimeError(f"pod {name} not Running after 120 s")
    uid = kj("-n", NS, "get", "resourceclaim", name)["metadata"]["uid"] if KINDS[kind] else None
    k("-n", NS, "delete", "pod", name, "--wait=true")
    if uid:
        k("-n", NS, "delete", "resourceclaim", name, "--wait=true")
        wait("unprepared", lambda: not any(uid in f for f in os.listdir(ENV["CDI_DIR"])), timeout=60)
    return dt


def bucket_p95(before, after):
    """The upper bound of the bucket holding the p95 of the prepares between two scrapes."""
    (c0, _, b0), (c1, _, b1) = before, after
    n = c1 - c0
    if n <= 0:
        return None
    for le in sorted(b1, key=lambda x: float("inf") if x == "+Inf" else float(x)):
        if b1[le] - b0.get(le, 0.0) >= 0.95 * n:
            return le
    return "+Inf"


def sequential():
    rows = {}
    for kind in KINDS:
        h0 = histogram("tessera_claim_prepare_duration_seconds")
        times = [one(kind, i) for i in range(N)]
        h1 = histogram("tessera_claim_prepare_duration_seconds")
        own = None
        if KINDS[kind] is not None:
            tkind = kind  # the plugin's kind label: whole, shared, mig
            before = h0.get(tkind, (0.0, 0.0, {}))
            after = h1.get(tkind, (0.0, 0.0, {}))
            n = after[0] - before[0]
            own = ((after[1] - before[1]) / n if n else None, bucket_p95(before, after), int(n))
        rows[kind] = (pct(times, 50), pct(times, 95), own)
    base = rows["none"][1]
    print(f"pod start-up, {N} pods per kind, one at a time ({ENV['K8S_VERSION']}; create -> Running as observed "
          f"through the API server, 50 ms polling):")
    print(f"  {'kind':<7} {'p50':>7} {'p95':>7} {'p95 added':>10}   Tessera's prepare (plugin metrics)")
    verdicts = []
    for kind, (p50, p95, own) in rows.items():
        mine = "-"
        if own:
            mean, le, n = own
            mine = f"mean {mean * 1000:.1f} ms over {n}, p95 <= {float(le) * 1000:g} ms" if mean is not None and le not in (None, "+Inf") \
                else f"{n} prepares seen"
            if mean is not None and le not in (None, "+Inf"):
                verdicts.append((kind, float(le) <= 0.1))
        print(f"  {kind:<7} {p50:>6.2f}s {p95:>6.2f}s {p95 - base:>+9.2f}s   {mine}")
    for kind, met in verdicts:
        print(f"  target: Tessera's prepare adds <= 100 ms p95 ({kind}): {'met' if met else 'MISSED'}")
    with open(f"{OUT}/sequential.json", "w") as f:
        json.dump(rows, f)


def at_once():
    req = {"deviceClassName": "shared.tessera.dev", "capacity": {"requests": {"memory": "512Mi", "compute": "1"}}}
    all_docs = [d for i in range(M) for d in objects(f"many-{i}", req, {"bench": "many"})]
    t0 = time.monotonic()
    k("apply", "-f", "-", stdin=yaml.safe_dump_all(all_docs))
    created = time.monotonic() - t0

    def running():
        pods = kj("-n", NS, "get", "pods", "-l", "bench=many")["items"]
        return sum(1 for p in pods if p["status"].get("phase") == "Running") == M
    done = wait("all Running", running, timeout=600, step=0.25)
    total = time.monotonic() - t0
    expect(done, f"{M} shared-claim pods created at once (apply took {created:.1f}s): all Running {total:.1f}s after")
    if done:
        for i in range(0, M, 10):
            lines, _ = client(NS, f"many-{i}", "main", "ctx", "0", "meminfo")
            tot = int(lines[1].split()[2]) if len(lines) == 2 and lines[1].startswith("ok ") else None
            expect(tot == 512 << 20, f"  many-{i}: the CUDA client sees a 512 MiB budget ({tot} bytes)")
    k("delete", "namespace", NS, "--wait=true", "--timeout=300s")


def main():
    t0 = time.monotonic()
    build_image()
    with simulated_node_config(OUT):
        try:
            k("create", "namespace", NS)
            wait("serviceaccount", lambda: k("-n", NS, "get", "serviceaccount", "default", check=False))
            sequential()
            at_once()
        except Exception as e:
            lib.fail(f"bench: {e}")
            k("delete", "namespace", NS, "--ignore-not-found", "--wait=true", "--timeout=300s", check=False)
    if lib.errors:
        print(f"bench start-up ({ENV['K8S_VERSION']}): {lib.errors} check(s) FAILED", file=sys.stderr)
        sys.exit(1)
    print(f"bench start-up ({ENV['K8S_VERSION']}, {'quick' if QUICK else 'full'}): done ({time.monotonic() - t0:.0f}s)")


main()
