#!/usr/bin/env python3
"""Builds tests/data/gpa-lookups.tsv: the lookups cuda-bindings 12.9.4, 13.0.3 and 13.5.0
really make (shared/reference/data/gpa-requests-cuda-bindings-*.tsv, all flags 0), plus
rows for flags 1 and 2, versions below a variant's introduction, a version above any
driver's, and unknown names, each with the expected exported variant.

The expectation is computed here, independently of the Rust resolver, from the variant
rows of facts B4.1 (../../data/gpa-variants.tsv): the plain variant with the largest
introduction version <= cudaVersion; with flag 2 its per-thread sibling if one exists
for that version. "-" = known name, no variant old enough (the driver gives NULL);
"driver" = not a name the table knows (passed through).

Usage: python3 gen-lookups.py <dir with gpa-requests-*.tsv> > gpa-lookups.tsv
"""
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
rows = []
for line in open(os.path.join(HERE, "../../data/gpa-variants.tsv")):
    if line.startswith("#") or not line.strip():
        continue
    base, ver, sym, of = line.rstrip("\n").split("\t")
    rows.append((base, int(ver), sym, None if of == "-" else of))
bases = {r[0] for r in rows}


def expect(name, ver, flags):
    if name not in bases:
        return "driver"
    plain = [r for r in rows if r[0] == name and r[3] is None and r[1] <= ver]
    if not plain:
        return "-"
    p = max(plain, key=lambda r: r[1])
    if flags & 2 and not flags & 1:
        pt = [r for r in rows if r[3] == p[2] and r[1] <= ver]
        if pt:
            return pt[0][2]
    return p[2]


out = []
seen = set()


def add(src, name, ver, flags):
    key = (src, name, ver, flags)
    if key in seen:
        return
    seen.add(key)
    out.append((src, name, ver, flags, expect(name, ver, flags)))


src_dir = sys.argv[1]
for v in ("12.9.4", "13.0.3", "13.5.0"):
    for line in open(os.path.join(src_dir, f"gpa-requests-cuda-bindings-{v}.tsv")):
        f = line.rstrip("\n").split("\t")
        if f[0] == "symbol":
            continue
        add(v, f[0], int(f[1]), int(f[2]))
        if f[0] in bases:
            add("flags", f[0], int(f[1]), 1)
            add("flags", f[0], int(f[1]), 2)
for base, ver, sym, of in rows:
    add("below", base, ver - 1, 0)
    add("intro", base, ver, 2 if of else 0)
    add("above-driver", base, 99990, 0)
    add("above-driver", base, 99990, 2)
for name in ("cuNoSuchFunction", "cuMemAlloc_v2", "cuMemAlloc_v3", "nvmlInit", ""):
    add("unknown", name, 12000, 0)
print("source\tsymbol\tcudaVersion\tflags\texpected")
for r in out:
    print("\t".join(str(x) for x in r))
