#!/usr/bin/env bash
# Fuzzing campaigns: runs every fuzz target of fuzz/ (cargo-afl, AFL++) from its
# committed seed corpus for TESSERA_FUZZ_SECONDS each, and fails if any target finds a
# crash or a hang. Not part of CI (its instrumented build alone costs CI about 16
# minutes of both cores): CI replays every seed and regression input in `cargo test`
# (fuzz/tests/corpus.rs). Campaigns are run by hand and recorded in fuzz/RESULTS.md
# (which calls this script by its former name, .ci/fuzz-quick.sh).
#
# Installs cargo-afl (pinned, built from crates.io source) and builds AFL++ from the
# source cargo-afl bundles (`cargo afl config --build`: the system cc and make), then
# builds the targets (`cargo afl build --release --features afl`, in target/afl so the
# instrumented build never replaces the normal one) and runs each target for
# TESSERA_FUZZ_SECONDS (default 60) seconds, two targets at a time. Prints per target: executions, exec/s,
# edges covered, corpus size, crashes and hangs; then the times.
#
# Works as root on a fresh Debian machine with a stable Rust toolchain: no nightly, no
# LLVM plugins. AFL's machine checks are relaxed for containers: AFL_SKIP_CPUFREQ (no CPU
# governor to set), AFL_I_DONT_CARE_ABOUT_MISSING_CRASHES (a core_pattern piped to a
# handler), AFL_NO_UI (plain status lines), AFL_NO_AFFINITY (no CPU pinning).
#
# Usage: fuzz/run.sh [target...]   (default: every target)
#   TESSERA_FUZZ_SECONDS=N   run time per target (default 60)
#   TESSERA_FUZZ_OUT=DIR     AFL output directory (default target/fuzz-out; replaced)
#   TESSERA_FUZZ_JOBS=N      targets fuzzed at once (default 2, one per core here)
set -euo pipefail
cd "$(dirname "$0")/.."
start=$(date +%s)

CARGO_AFL_VERSION=0.18.2
SECONDS_PER_TARGET=${TESSERA_FUZZ_SECONDS:-60}
OUT=${TESSERA_FUZZ_OUT:-target/fuzz-out}
JOBS=${TESSERA_FUZZ_JOBS:-2}
[[ $JOBS =~ ^[1-9][0-9]*$ ]] || { echo "TESSERA_FUZZ_JOBS must be a positive number, not '$JOBS'" >&2; exit 1; }
TARGETS=(claim_plan node_prepare node_config plan abi_files cdi_spec quantity_semver)
[ $# -gt 0 ] && TARGETS=("$@")

# Every target in fuzz/Cargo.toml is listed here (and the other way round).
known=$(sed -n 's/^name = "\(.*\)"$/\1/p' fuzz/Cargo.toml | grep -v '^tessera-fuzz$' | sort)
listed=$(printf '%s\n' claim_plan node_prepare node_config plan abi_files cdi_spec quantity_semver | sort)
if [ "$known" != "$listed" ]; then
  echo "fuzz/Cargo.toml's targets and $0's list differ:" >&2
  diff <(echo "$known") <(echo "$listed") >&2 || true
  exit 1
fi

t0=$(date +%s)
export PATH="$HOME/.cargo/bin:$PATH"
command -v cc >/dev/null 2>&1 && command -v make >/dev/null 2>&1 || {
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends gcc libc6-dev make
}
if ! cargo afl --version 2>/dev/null | grep -q "^cargo-afl ${CARGO_AFL_VERSION}\$"; then
  cargo install -q --locked cargo-afl --version "$CARGO_AFL_VERSION"
fi
# Builds AFL++ and its runtime for this rustc once; "already built" is success.
if ! config_out=$(cargo afl config --build 2>&1); then
  if ! grep -q "already built" <<<"$config_out"; then
    echo "$config_out" >&2
    exit 1
  fi
fi
install_time=$(( $(date +%s) - t0 ))

t0=$(date +%s)
# No `--cfg fuzzing`: the vendored h2 has a fuzzing-only module that fails its own
# `missing_docs` lint, and the targets should run the code as shipped.
AFL_NO_CFG_FUZZING=1 cargo afl build -q --release -p tessera-fuzz --features afl --bins --target-dir target/afl
build_time=$(( $(date +%s) - t0 ))

rm -rf "$OUT"
mkdir -p "$OUT"
export AFL_SKIP_CPUFREQ=1 AFL_I_DONT_CARE_ABOUT_MISSING_CRASHES=1 AFL_NO_UI=1 AFL_NO_AFFINITY=1
stat() { sed -n "s/^$1 *: *//p" "$2" | head -1; }
# Runs one target; writes its result line to $OUT/$t.result and, on a finding or a
# failure to start, the reason to $OUT/$t.failed (the jobs run in the background).
fuzz_one() {
  local t=$1 t1 status=0 s execs eps edges total corpus crashes hangs n f
  t1=$(date +%s)
  # -t: 5 s per input (the state targets fsync); -m none: Rust reserves address space.
  cargo afl fuzz -V "$SECONDS_PER_TARGET" -t 5000 -m none -i "fuzz/corpus/$t" -o "$OUT/$t" \
    "target/afl/release/$t" >"$OUT/$t.log" 2>&1 || status=$?
  s="$OUT/$t/default/fuzzer_stats"
  if [ ! -f "$s" ]; then
    { echo "== $t did not start (exit $status):"; tail -30 "$OUT/$t.log"; } >&2
    echo "$t (did not start, exit $status)" >"$OUT/$t.failed"
    printf '%-16s did not start\n' "$t" >"$OUT/$t.result"
    return
  fi
  execs=$(stat execs_done "$s"); eps=$(stat execs_per_sec "$s")
  edges=$(stat edges_found "$s"); total=$(stat total_edges "$s")
  corpus=$(stat corpus_count "$s")
  crashes=$(stat saved_crashes "$s"); hangs=$(stat saved_hangs "$s")
  printf '%-16s %10s execs %8s/s  edges %6s/%-7s corpus %5s  crashes %s  hangs %s  (%ss)\n' \
    "$t" "$execs" "$eps" "$edges" "$total" "$corpus" "$crashes" "$hangs" "$(( $(date +%s) - t1 ))" \
    >"$OUT/$t.result"
  if [ "${crashes:-0}" != 0 ] || [ "${hangs:-0}" != 0 ]; then
    echo "$t" >"$OUT/$t.failed"
    # The input itself (gzip, then base64): a CI machine keeps no file, and the log is
    # what comes back (`base64 -d | gunzip > input`, then replay it). The first three.
    {
      n=0
      for f in "$OUT/$t/default/crashes"/id:* "$OUT/$t/default/hangs"/id:*; do
        [ -f "$f" ] || continue
        n=$((n + 1))
        if [ "$n" -gt 3 ]; then
          echo "  (more findings not printed)"
          break
        fi
        echo "  finding of $t: $f ($(wc -c < "$f") bytes), gzip+base64:"
        gzip -9c "$f" | base64 -w 0
        echo
      done
    } >"$OUT/$t.findings"
  fi
}
# JOBS targets at a time (each afl-fuzz is one process on one core): on 2 idle cores
# the seven minutes of fuzzing take four. Each target still runs its full time.
# (A fuzzer left running when this script is killed stops by itself: -V.)
running=0
for t in "${TARGETS[@]}"; do
  if [ "$running" -ge "$JOBS" ]; then
    wait -n || true
    running=$((running - 1))
  fi
  echo "== fuzz $t (${SECONDS_PER_TARGET}s)"
  fuzz_one "$t" &
  running=$((running + 1))
done
wait
results=()
failed=()
for t in "${TARGETS[@]}"; do
  # A job that died before writing its result is a failure, not a missing line.
  if [ ! -f "$OUT/$t.result" ]; then
    printf '%-16s job failed (see %s)\n' "$t" "$OUT/$t.log" >"$OUT/$t.result"
    echo "$t (job failed)" >"$OUT/$t.failed"
  fi
  results+=("$(cat "$OUT/$t.result")")
  [ -f "$OUT/$t.findings" ] && cat "$OUT/$t.findings"
  [ -f "$OUT/$t.failed" ] && failed+=("$(cat "$OUT/$t.failed")")
done
echo "== fuzz results (${SECONDS_PER_TARGET}s per target)"
printf '%s\n' "${results[@]}"
echo "install ${install_time}s, build ${build_time}s; fuzz/run.sh finished in $(( $(date +%s) - start ))s"
if [ ${#failed[@]} -gt 0 ]; then
  echo "findings or failures: ${failed[*]} (inputs under $OUT; replay one with target/afl/release/<target> < file)" >&2
  exit 1
fi
