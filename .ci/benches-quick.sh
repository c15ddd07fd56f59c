#!/usr/bin/env bash
# Runs every benchmark of the workspace in quick mode (TESSERA_BENCH_QUICK=1: a few
# iterations, figures printed, no target judged), so that a benchmark docs/testing.md names
# cannot break unnoticed. Each bench's time is printed, then a table of them.
#
# The benches are listed here one by one, and the script first checks that list
# against every bench target cargo knows in the workspace (`[[bench]]` entries and
# auto-discovered benches/*.rs alike): a new bench not listed fails the run.
# Benches needing root or unshare (tessera-interpose's) skip, saying why, when CI is unset,
# and fail under CI=true, as their tests do.
# Usage: .ci/benches-quick.sh   (from anywhere; runs at the repository root)
set -euo pipefail
cd "$(dirname "$0")/.."

# package bench profile
# tessera's benches run from the test profile's build (unoptimized; `cargo test` has
# built nearly all of it): their bench-profile build recompiles the plugin with its fail
# points, its dev-dependencies and the test kit optimized, about 5 minutes of both
# cores, for figures that quick mode does not judge. tessera-interpose's are measured as
# built for release (compute_shares' throttle and interpose's overhead depend on it),
# and their build reuses the release artifacts. `cargo bench` gives every figure
# from optimized code.
BENCHES=(
  "tessera prepare test"
  "tessera mig test"
  "tessera-interpose interpose bench"
  "tessera-interpose compute_shares bench"
)

known=$(cargo metadata --no-deps --format-version 1 | python3 -c '
import json, sys
for p in json.load(sys.stdin)["packages"]:
    for t in p["targets"]:
        if "bench" in t["kind"]:
            print(p["name"], t["name"])
' | sort)
listed=$(printf '%s\n' "${BENCHES[@]}" | cut -d' ' -f1,2 | sort)
unlisted=$(comm -23 <(echo "$known") <(echo "$listed"))
stale=$(comm -13 <(echo "$known") <(echo "$listed"))
if [ -n "$unlisted" ]; then
  echo "benches cargo knows that $0 does not list (add them to BENCHES):" >&2
  echo "$unlisted" | sed 's/^/  /' >&2
fi
if [ -n "$stale" ]; then
  echo "benches $0 lists that cargo does not know (remove them from BENCHES):" >&2
  echo "$stale" | sed 's/^/  /' >&2
fi
[ -z "$unlisted" ] && [ -z "$stale" ] || exit 1

times=()
failed=()
start=$(date +%s)
for entry in "${BENCHES[@]}"; do
  read -r pkg name profile <<<"$entry"
  echo "== bench $pkg/$name (quick, profile $profile$([ "$profile" = bench ] || echo ": unoptimized, figures not representative"))"
  t0=$(date +%s)
  status=ok
  # CI's debug builds all go through one wrapper (.ci/with-clippy) and must agree, or the
  # workspace's crates rebuild: it names it for the test-profile ones.
  runner=()
  [ "$profile" != test ] || [ -z "${TESSERA_BENCH_TEST_PROFILE_WRAPPER:-}" ] || runner=("$TESSERA_BENCH_TEST_PROFILE_WRAPPER")
  TESSERA_BENCH_QUICK=1 "${runner[@]}" cargo bench -q --profile "$profile" -p "$pkg" --bench "$name" || { status=FAILED; failed+=("$pkg/$name"); }
  took=$(( $(date +%s) - t0 ))
  echo "== bench $pkg/$name: $status in ${took}s"
  times+=("$(printf '%6ss  %-7s %s/%s' "$took" "$status" "$pkg" "$name")")
done
echo "== bench times (quick mode)"
printf '%s\n' "${times[@]}"
echo "benches finished in $(( $(date +%s) - start ))s"
if [ ${#failed[@]} -gt 0 ]; then
  echo "failed: ${failed[*]}" >&2
  exit 1
fi
