#!/usr/bin/env bash
# Fails when a package the plugin-only build compiles (`cargo build --release -p tessera
# -p tessera-interpose -p tessera-cdi-hook`, the image's selection) gets other features than in the README's main
# job (`cargo build --release`, every default member). Why: cargo would build it twice,
# and the plugin binary tested (the main job's) would not be the one shipped. Compares
# `cargo tree`'s resolved features of the target-side graph, so it holds whatever a
# kept target/ already contains.
set -euo pipefail
cd "$(dirname "$0")/.."
tree() { cargo tree -q -e normal -f '{p} [{f}]' --prefix none "$@" | sed 's/ (\*)$//' | sort -u; }
members=$(cargo metadata -q --no-deps --format-version 1 | python3 -c '
import json, sys
m = json.load(sys.stdin)
names = {p["id"]: p["name"] for p in m["packages"]}
print(" ".join("-p " + names[i] for i in m["workspace_default_members"]))')
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
tree -p tessera -p tessera-interpose -p tessera-cdi-hook >"$tmp/plugin"
# shellcheck disable=SC2086
tree $members >"$tmp/main"
python3 - "$tmp/plugin" "$tmp/main" <<'PY'
import sys
def load(path):
    out = {}
    for line in open(path):
        pkg, _, feats = line.rstrip("\n").partition(" [")
        out.setdefault(pkg, set()).add(feats.rstrip("]"))
    return out
plugin, main = load(sys.argv[1]), load(sys.argv[2])
# An empty or partial tree would compare nothing: both roots must be there.
for root in ("tessera-interpose v", "tessera v"):
    if not any(p.startswith(root) for p in plugin) or not any(p.startswith(root) for p in main):
        sys.exit(f"cargo tree did not list {root.split()[0]} in both selections")
bad = [f"  {p}: plugin-only {sorted(plugin[p])}, main job {sorted(main.get(p, set()))}"
       for p in sorted(plugin) if plugin[p] != main.get(p)]
if bad:
    print("features differ between the plugin-only build and the main job:", *bad, sep="\n", file=sys.stderr)
    sys.exit(1)
print(f"same features: the plugin-only build's {len(plugin)} packages resolve as in the main job")
PY
