#!/usr/bin/env python3
"""Every target of the workspace is linted somewhere in CI, or this fails.

CI lints as its debug builds compile (.ci/with-clippy), so a target those builds do
not compile would go unlinted. Reads the JSON of the test build's `cargo test
... --no-run` (through .ci/with-clippy) on stdin, and checks every target
of `cargo metadata` against it and against the ones linted elsewhere, listed below.
Usage: { .ci/with-clippy cargo test --workspace --exclude tessera-cluster-tests --no-run \\
           --message-format=json-render-diagnostics; same with --benches; } | .ci/lint-coverage.py
"""
import json
import subprocess
import sys

# (package, target): linted elsewhere, and where.
ELSEWHERE = {
    ("tessera-front", "tessera_front"): "cargo clippy-preload",
    ("tessera-preload", "tessera_preload"): "cargo clippy-preload",
    ("tessera-shim-cuda", "tessera_shim_cuda"): "cargo clippy-preload",
    ("tessera-shim-nvml", "tessera_shim_nvml"): "cargo clippy-preload",
    ("tessera-cluster-tests", "*"): "the cluster lane's test build",
}
# The AFL++ entries (`required-features = ["afl"]`): that test checks it compiles them all.
AFL_ENTRIES = ["abi_files", "cdi_spec", "claim_plan", "node_config", "node_prepare", "plan", "quantity_semver"]
ELSEWHERE.update({("tessera-fuzz", e): "fuzz/tests/afl_entries.rs" for e in AFL_ENTRIES})

meta = json.loads(subprocess.check_output(["cargo", "metadata", "--no-deps", "--format-version", "1"]))
members = {p["id"]: p for p in meta["packages"]}
built = set()
finished = []
for line in sys.stdin:
    try:
        msg = json.loads(line)
    except ValueError:
        continue
    if msg.get("reason") == "compiler-artifact" and msg["package_id"] in members:
        built.add((members[msg["package_id"]]["name"], msg["target"]["name"]))
    if msg.get("reason") == "build-finished":
        finished.append(msg["success"])
if finished.count(True) != len(finished) or not finished:
    sys.exit("lint-coverage: the test build failed (its errors are above)")
if not built:
    sys.exit("lint-coverage: no workspace artifact on stdin (cargo's JSON messages expected)")

missing = []
for p in meta["packages"]:
    for t in p["targets"]:
        key = (p["name"], t["name"])
        if key in built or key in ELSEWHERE or (p["name"], "*") in ELSEWHERE:
            continue
        # A build script lints with its package (`cargo clippy -p` lints both).
        if t["kind"] == ["custom-build"] and any(k[0] == p["name"] for k in ELSEWHERE):
            continue
        missing.append(f"{p['name']} {t['name']} ({', '.join(t['kind'])})")
stale = [k for k in ELSEWHERE if k[1] != "*" and k in built]
for m in missing:
    print(f"lint-coverage: {m}: no CI build lints it (build it in the test build, or list it here)", file=sys.stderr)
for k in stale:
    print(f"lint-coverage: {k[0]} {k[1]} is built by the test build: drop it from ELSEWHERE", file=sys.stderr)
if missing or stale:
    sys.exit(1)
print(f"lint-coverage: {len(built)} targets linted as the test build compiles them, {len(ELSEWHERE)} elsewhere")
