#!/usr/bin/env bash
# The GPU acceptance kit: every check against this host's GPU (or, with --simulated,
# against the simulated node), a verdict table on stdout, JSON in OUT/report.json (one
# report per check in OUT/checks/), and a non-zero exit if any check failed.
#
#   tests/gpu/run.sh [--simulated] [--allow-mig-changes] KIT OUT
#
# KIT is what tests/gpu/pack.sh made. As root, on a host with the NVIDIA driver; it
# needs no network, Kubernetes, container runtime or compiler, and takes a few minutes
# (its budget: 8 on one H100). Without --allow-mig-changes it never changes the GPU's
# settings: no MIG mode switch, no reset, no clocks or compute mode (with it, only MIG
# mode, and back).
#
# MIG mode as found decides what runs. Off: the whole-GPU and shared claim checks; the
# MIG check reports "MIG mode off: skipped". Already on: Tessera offers whole-GPU and
# shared claims there only by switching MIG mode off, so the kit runs what it does
# offer: prepare holds one MIG claim (the smallest profile that fits, created by the
# plugin), cuda-kernel and the bare driver's costs run in that MIG instance (by its
# UUID), interception, compute-shares and watchdog (shared claims only) are SKIPs that
# say why, discovery compares the MIG partitions published with NVML's profiles and
# placements (progs/kit_nvml), and the MIG check prepares one instance of each profile
# that fits the free slices, leaving the GPU as found.
#
# --allow-mig-changes, for an operator on their own machine: with MIG off, the full MIG
# lifecycle after the claim checks: each GPU's MIG mode recorded, MIG switched on
# (nvmlDeviceSetMigMode through Tessera's backend; a GPU that needs a reset, or a change
# already pending, is a SKIP and nothing is left changed), NVML's profiles compared,
# the MIG check run, and every GPU switched back to the mode found, even if the check
# fails (and by the exit trap if run.sh dies). Without the flag MIG mode is never
# changed.
#
# --simulated (or TESSERA_KIT_SIMULATED=1): the simulated node instead of the GPU: the
# fake NVML (tests/fakes/fake_nvml.c) over KIT/sim/sim-node.yaml (an H100, MIG off; or
# the node TESSERA_KIT_SIM_NODE names in KIT/sim/, e.g. sim-node-mig.yaml with MIG on),
# its MIG calls answered by go-nvml's DGX H100 model (KIT/sim/libnvml-model.so), and
# the fake CUDA driver (cuda/tests/fakes/fake_cuda.c), as CI runs it. Every check must
# run and report there; its figures are not judged.
set -uo pipefail

usage() { echo "usage: $0 [--simulated] [--allow-mig-changes] KIT OUT" >&2; exit 2; }
simulated=${TESSERA_KIT_SIMULATED:-0}
allow_mig=0
args=()
for a in "$@"; do
  case $a in
    --simulated) simulated=1 ;;
    --allow-mig-changes) allow_mig=1 ;;
    -h|--help) sed -n '2,36p' "$0"; exit 0 ;;
    -*) usage ;;
    *) args+=("$a") ;;
  esac
done
[ ${#args[@]} = 2 ] || usage
kit=$(cd "${args[0]}" && pwd) || usage
mkdir -p "${args[1]}" && out=$(cd "${args[1]}" && pwd)
[ -x "$kit/bin/tessera-kit" ] || { echo "$kit is not a packed kit (tests/gpu/pack.sh)" >&2; exit 2; }
sim_node=${TESSERA_KIT_SIM_NODE:-sim-node.yaml}
if [ "$simulated" = 1 ] && [ ! -f "$kit/sim/$sim_node" ]; then
  echo "no simulated node $kit/sim/$sim_node (TESSERA_KIT_SIM_NODE)" >&2
  exit 2
fi
host_glibc=$(getconf GNU_LIBC_VERSION 2>/dev/null | awk '{ print $2 }')
need_glibc=$(cat "$kit/GLIBC" 2>/dev/null)
if [ -n "$host_glibc" ] && [ -n "$need_glibc" ] &&
  [ "$(printf '%s\n%s\n' "$need_glibc" "$host_glibc" | sort -V | head -1)" != "$need_glibc" ]; then
  echo "the kit needs glibc $need_glibc, this host has $host_glibc: pack it with TESSERA_KIT_ZIGBUILD=1" >&2
  exit 2
fi
root=0
[ "$(id -u)" = 0 ] && root=1
if [ "$root" != 1 ]; then
  echo "run.sh needs root (the interception checks use mount namespaces)" >&2
  exit 2
fi

here=$(cd "$(dirname "$0")" && pwd)
rm -rf "$out/checks" && mkdir -p "$out/checks"
work=$(mktemp -d /tmp/tessera-gpu-kit.XXXXXX)
export TESSERA_KIT_SANDBOX_DIR=$work/sandboxes
mkdir -p "$TESSERA_KIT_SANDBOX_DIR"
holder="" mig_holder="" mig_done=0
# On exit: kill the interception check's holder; end a held MIG claim's stdin, so that
# it unprepares (destroys its MIG instance), and wait for it; put every GPU back in the
# MIG mode found if --allow-mig-changes recorded one (a no-op when the MIG check did).
cleanup() {
  [ -z "$holder" ] || kill -9 "$holder" 2>/dev/null
  if [ -n "$mig_holder" ]; then
    exec 8>&-
    wait "$mig_holder" 2>/dev/null
  fi
  if [ -s "$work/mig-found" ]; then
    if ! "$kitbin/tessera-kit" mig-restore --backend "$backend" --proc-root "$proc_root" \
      --sys-root "$sys_root" "$work/mig-found" 2>"$work/mig-restore.stderr"; then
      cat "$work/mig-restore.stderr" >&2
      echo "run.sh: a GPU is NOT in the MIG mode it was found in (above)" >&2
    elif [ "$mig_done" != 1 ]; then
      cat "$work/mig-restore.stderr" >&2 # the MIG check did not finish: say what was put back
    fi
  fi
  rm -rf "$work"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM
started=$(date +%s)
kitbin=$kit/bin
n=0

# A check's report, written by the shell: CHECK VERDICT FIGURE [DETAIL...].
# (Quotes and backslashes are dropped from the strings: they stay plain JSON.)
report() {
  local check=$1 verdict=$2 figure=$3 d details=""
  shift 3
  for d in "$@"; do
    d=$(printf '%s' "$d" | tr -d "\"\\\\" | tr '\n\t' '  ')
    details+="${details:+,}\"$d\""
  done
  figure=$(printf '%s' "$figure" | tr -d "\"\\\\" | tr '\n\t' '  ')
  # The checks judged only on a GPU say so in the simulated node's table.
  if [ "$simulated" = 1 ] && [ "$verdict" != SKIP ]; then
    case $check in
      cuda-kernel | compute-shares | watchdog) figure="[simulated: not judged] $figure" ;;
      interception) figure="[simulated: kernel values and NVML per-process memory not judged] $figure" ;;
    esac
  fi
  # The next number, or the file report_file names (a number taken earlier).
  local f=${report_file:-}
  if [ -z "$f" ]; then
    n=$((n + 1))
    f=$(file "$check")
  fi
  printf '{"check":"%s","verdict":"%s","figure":"%s","details":[%s]}\n' \
    "$check" "$verdict" "$figure" "$details" >"$f"
}
# The current report file's path: numbered in the order the checks ran.
file() { printf '%s/checks/%02d-%s.json' "$out" "$n" "$1"; }
# Runs a tessera-kit check whose stdout is its JSON report, with a time limit; its
# exit status in kit_rc, its report file in kit_file.
kitcheck() {
  local check=$1 limit=$2 f
  shift 2
  n=$((n + 1))
  f=$(file "$check")
  kit_file=$f
  [ "$check" = doctor ] || echo "== $check" >&2
  timeout "$limit" "$@" >"$f" 2>"$work/$check.stderr"
  local rc=$?
  kit_rc=$rc
  if [ ! -s "$f" ]; then
    n=$((n - 1))
    report "$check" FAIL "could not run (exit $rc)" "$(tail -5 "$work/$check.stderr")"
  fi
}

# The host: the real one, or the simulated node.
if [ "$simulated" = 1 ]; then
  mode="simulated node $sim_node (fake NVML and fake CUDA driver; figures not judged)"
  sim=$work/sim
  "$kitbin/tessera-kit" sim-host "$sim" "$kit/sim/$sim_node" \
    --nvml-lib "$kit/sim/libnvidia-ml.so.1" --cuda-lib "$kit/sim/libcuda.so.1" || exit 1
  export TESSERA_FAKE_NVML_STATE_DIR=$sim/state
  # MIG on the simulated node is NVIDIA's model's: the fake NVML forwards every MIG call
  # to the bridge over go-nvml's DGX H100 (tests/nvml-models), whose GPU 0 is the node's
  # GPU for MIG, with MIG mode as the node has it; its instances live in $sim/model.
  [ -f "$kit/sim/libnvml-model.so" ] ||
    { echo "no $kit/sim/libnvml-model.so: pack.sh packs it when go is there" >&2; exit 1; }
  export TESSERA_FAKE_NVML_MIG_LIB=$kit/sim/libnvml-model.so TESSERA_NVML_MODEL=dgxh100 \
    TESSERA_NVML_MODEL_STATE=$sim/model
  if grep -q 'migEnabled: true' "$kit/sim/$sim_node"; then export TESSERA_NVML_MODEL_MIG=on; fi
  backend=nvml:$sim/root/usr/lib/x86_64-linux-gnu/libnvidia-ml.so.1
  proc_root=$sim/proc sys_root=$sim/sys dev_root=$sim driver_root=$sim/root
  host_root=$sim/root
else
  mode="this host's GPU ($(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader 2>/dev/null | head -1))"
  backend=nvml proc_root=/proc sys_root=/sys dev_root=/ driver_root=/ host_root=/
fi
sim_flag=() cuda_env=() bare_nvml=() nvml_dir=()
if [ "$simulated" = 1 ]; then
  sim_flag=(--simulated)
  # The fake driver's libraries for the programs run outside a sandbox.
  cuda_env=(env "LD_LIBRARY_PATH=$sim/root/usr/lib/x86_64-linux-gnu")
  # NVML outside the sandboxes: the host's (simulated: the fake in the driver root).
  bare_nvml=("${cuda_env[@]}")
  nvml_dir=(--nvml-lib-dir "$sim/root/usr/lib/x86_64-linux-gnu")
fi
echo "Tessera GPU acceptance kit ($(cat "$kit/COMMIT" 2>/dev/null || echo unknown commit)) on $mode" >&2

# 1. doctor on the bare host.
echo "== doctor" >&2
timeout 60 "$kitbin/tessera" doctor -o json --node-name kit --backend "$backend" \
  --host-root "$host_root" --driver-root "$driver_root" --dev-root "$dev_root" \
  --proc-root "$proc_root" --state-dir "$work/doctor-state" --run-dir "$work/doctor-run" \
  --cdi-dir "$work/doctor-cdi" --interception-lib "$kit/lib/libtessera_cuda.so" \
  --kubeconfig /dev/null >"$out/doctor.json" 2>"$work/doctor.stderr"
kitcheck doctor 30 "$kitbin/tessera-kit" doctor "$out/doctor.json"

# 2. discovery: tessera inventory --backend nvml against nvidia-smi -q -x (simulated:
# the node's own state).
echo "== inventory" >&2
if ! timeout 60 "$kitbin/tessera" inventory --backend "$backend" --node-name kit -o json \
  --state-dir "$work/inventory-state" --proc-root "$proc_root" --sys-root "$sys_root" \
  >"$out/inventory.json" 2>"$work/inventory.stderr"; then
  report inventory FAIL "tessera inventory --backend nvml failed" "$(tail -5 "$work/inventory.stderr")"
else
  report inventory PASS "tessera inventory --backend nvml: $(grep -c '"kind": "ResourceSlice"' "$out/inventory.json") ResourceSlice(s), $(grep -o '"productName"' "$out/inventory.json" | wc -l) device(s) (GPUs and MIG partitions), in OUT/inventory.json"
fi
if [ "$simulated" = 1 ]; then
  ref=(--reference-mock "$sim/node.yaml" --state-dir "$sim/state")
else
  nvidia-smi -q -x >"$out/nvidia-smi.xml" 2>"$work/nvidia-smi.stderr"
  ref=(--reference-xml "$out/nvidia-smi.xml" --state-dir "$work/inventory-state")
fi
# MIG mode as found (it decides the checks below, which never change it).
if [ "$simulated" = 1 ]; then
  mig_on=$(grep -c 'migEnabled: true' "$sim/node.yaml" || true)
else
  mig_on=$(grep -c '<current_mig>Enabled</current_mig>' "$out/nvidia-smi.xml" || true)
fi
mig_on=${mig_on:-0}
# With MIG on, discovery also compares the MIG partitions published with the GPU
# instance profiles and placements NVML reports (what nvidia-smi mig -lgip and -lgipp
# print), read by the kit's own kit_nvml.
partitions=()
if [ "$mig_on" -gt 0 ]; then
  timeout 60 "${bare_nvml[@]}" "$kit/progs/kit_nvml" mig-profiles >"$out/nvml-mig-profiles.txt" 2>&1
  partitions=(--inventory-json "$out/inventory.json" --nvml-profiles "$out/nvml-mig-profiles.txt")
fi
kitcheck discovery 60 "$kitbin/tessera-kit" discovery --backend "$backend" \
  --proc-root "$proc_root" --sys-root "$sys_root" "${ref[@]}" "${partitions[@]}"

# Runs a command in the sandbox of the claim whose edits are in $1 (at most 60 s; with
# SBX_NO_TIMEOUT=1, as its own process: unshare and sandbox.sh exec it).
cuda_fake=()
sbx() {
  local edits=$1 limit=(timeout 60)
  shift
  [ "${SBX_NO_TIMEOUT:-}" = 1 ] && limit=(exec)
  "${limit[@]}" unshare -m --propagation private "$here/sandbox.sh" "$edits" \
    env "${cuda_fake[@]}" LD_LIBRARY_PATH=/usr/lib/x86_64-linux-gnu "$@"
}

# 3-9 with MIG mode on: what Tessera offers there, one MIG claim held (see the top).
mig_claim_checks() {
  local w=$work/mig-claim pfile spec uuid mem line rc right total
  mkdir -p "$w"
  mkfifo "$w/in"
  n=$((n + 1))
  pfile=$(file prepare)
  echo "== prepare (MIG mode on: one MIG claim, held)" >&2
  timeout 300 "$kitbin/tessera-kit" mig-claim --backend "$backend" --proc-root "$proc_root" \
    --sys-root "$sys_root" --dev-root "$dev_root" --driver-root "$driver_root" \
    --interception-lib "$kit/lib/libtessera_cuda.so" --workdir "$w/plugin" "${sim_flag[@]}" \
    <"$w/in" >"$w/out" 2>"$w/err" &
  mig_holder=$!
  exec 8>"$w/in"
  for _ in $(seq 1200); do
    grep -q '^ready$' "$w/out" && break
    kill -0 "$mig_holder" 2>/dev/null || break
    sleep 0.1
  done
  spec=$(sed -n 's/^spec //p' "$w/out" | head -1)
  uuid=$(sed -n 's/^mig-uuid //p' "$w/out" | head -1)
  mem=$(sed -n 's/^memory-mib //p' "$w/out" | head -1)
  # The MIG instance, by its UUID, in the claim's sandbox (its CDI edits: the
  # driver's files, the MIG device's UUID variable). Simulated: the fake driver's
  # only device is the MIG device (it takes CUDA_VISIBLE_DEVICES as indices only).
  local visible=(CUDA_VISIBLE_DEVICES="$uuid")
  if [ "$simulated" = 1 ]; then
    visible=()
    cuda_fake=("FAKE_CUDA_DEVICES=$uuid:$((${mem:-0} << 20))")
  fi
  echo "== cuda-kernel (in the MIG instance)" >&2
  if ! grep -q '^ready$' "$w/out" || [ -z "$uuid" ] || [ -z "$mem" ]; then
    report cuda-kernel FAIL "no MIG claim held (see prepare)" "$(tail -3 "$w/err")"
  else
    "$kitbin/tessera-kit" cdi-edits "$spec" >"$work/edits-mig"
    line=$(sbx "$work/edits-mig" env "${visible[@]}" "$kit/progs/kit_cuda" kernel "$kit/ptx/kit_fill.ptx" 2>"$work/cuda.stderr" | tail -1)
    rc=$?
    right=$(printf '%s' "$line" | sed -n 's/.* right=\([0-9]*\) of=\([0-9]*\).*/\1 \2/p')
    total=$(printf '%s' "$line" | sed -n 's/.* total_mib=\([0-9]*\).*/\1/p')
    if [ "$rc" != 0 ] || [ -z "$right" ]; then
      report cuda-kernel FAIL "kit_cuda in MIG instance $uuid failed (exit $rc): $line" "$(tail -3 "$work/cuda.stderr")"
    elif [ "$simulated" != 1 ] && [ "${right% *}" != "${right#* }" ]; then
      report cuda-kernel FAIL "MIG instance $uuid: wrong values: $line"
    elif [ "${total:-0}" -gt $((mem + 64)) ]; then
      report cuda-kernel FAIL "MIG instance $uuid: CUDA sees ${total} MiB, more than the partition's ${mem} MiB: not the MIG instance: $line"
    else
      report cuda-kernel PASS "MIG instance $uuid (${mem} MiB partition), in the claim's sandbox: $line"
    fi
  fi
  report interception SKIP "not offered with MIG mode on: a shared claim (the library's budget) needs MIG off; here Tessera would switch MIG mode off for it (or refuse it while MIG devices exist), a change the kit does not make"
  report compute-shares SKIP "not offered with MIG mode on: compute shares are shared claims' (see interception); a MIG instance's compute is its own slices"
  report watchdog SKIP "not offered with MIG mode on: the watchdog enforces shared claims' budgets (see interception); a MIG claim's memory is bounded by its instance"
  echo "== costs (bare driver, in the MIG instance)" >&2
  if [ -z "$uuid" ] || ! grep -q '^ready$' "$w/out"; then
    report costs FAIL "no MIG claim held (see prepare)"
  else
    line=$(sbx "$work/edits-mig" env "${visible[@]}" "$kit/progs/kit_cuda" costs "$kit/ptx/kit_fill.ptx" 2>&1 | tail -1)
    case $line in
      *init_ctx_ms=*) report costs SKIP "the library's costs need a shared claim, not offered with MIG mode on (see interception); bare driver in MIG instance $uuid: $line" ;;
      *) report costs FAIL "the bare driver's costs in MIG instance $uuid failed: $line" ;;
    esac
  fi
  cuda_fake=()
  # End the claim's stdin: it unprepares, checks nothing is left and the GPU as found,
  # and prints its report last.
  exec 8>&-
  wait "$mig_holder"
  rc=$?
  mig_holder=""
  if tail -1 "$w/out" | grep -q '^{'; then
    tail -1 "$w/out" >"$pfile"
  else
    report_file=$pfile report prepare FAIL "tessera-kit mig-claim did not report (exit $rc)" "$(tail -5 "$w/err")"
  fi
}

if [ "$mig_on" -gt 0 ]; then
  mig_claim_checks
else

# 3. prepare: a whole-GPU claim and two shared claims through the plugin's gRPC.
kitcheck prepare 120 "$kitbin/tessera-kit" prepare --backend "$backend" \
  --proc-root "$proc_root" --sys-root "$sys_root" --dev-root "$dev_root" \
  --driver-root "$driver_root" --interception-lib "$kit/lib/libtessera_cuda.so" \
  --workdir "$work/prepare" "${sim_flag[@]}"

# 4. The real driver, bare (no Tessera): the kit's PTX through cuModuleLoadData.
echo "== cuda-kernel" >&2
line=$(timeout 60 "${cuda_env[@]}" "$kit/progs/kit_cuda" kernel "$kit/ptx/kit_fill.ptx" 2>"$work/cuda.stderr")
rc=$?
right=$(printf '%s' "$line" | sed -n 's/.* right=\([0-9]*\) of=\([0-9]*\).*/\1 \2/p')
if [ "$rc" != 0 ] || [ -z "$right" ]; then
  report cuda-kernel FAIL "kit_cuda failed (exit $rc): $line" "$(tail -3 "$work/cuda.stderr")"
elif [ "$simulated" = 1 ] || [ "${right% *}" = "${right#* }" ]; then
  report cuda-kernel PASS "bare driver: $line"
else
  report cuda-kernel FAIL "bare driver: wrong values: $line"
fi

# 6. Interception under the driver: two shared claims of 2 GiB (25 % and 60 % compute)
# left prepared, and the programs run in a mount namespace with the first claim's CDI
# mounts (tests/gpu/sandbox.sh), as a container would have them.
echo "== interception" >&2
ic=$work/interception
if [ "$simulated" = 1 ]; then
  uuid=$(sed -n 's/^ *uuid: *//p' "$sim/node.yaml" | head -1)
  bytes=$(sed -n 's/^ *memoryBytes: *\([0-9]*\).*/\1/p' "$sim/node.yaml" | head -1)
  cuda_fake=("FAKE_CUDA_DEVICES=$uuid:$bytes")
fi
if ! timeout 60 "$kitbin/tessera-kit" share --backend "$backend" --proc-root "$proc_root" \
  --sys-root "$sys_root" --dev-root "$dev_root" --driver-root "$driver_root" \
  --interception-lib "$kit/lib/libtessera_cuda.so" --workdir "$ic" --compute 25,60 \
  "${sim_flag[@]}" >"$work/specs" 2>"$work/share.stderr"; then
  report interception FAIL "could not prepare the shared claims" "$(tail -5 "$work/share.stderr")"
else
  i=0
  while read -r spec; do
    i=$((i + 1))
    "$kitbin/tessera-kit" cdi-edits "$spec" >"$work/edits$i"
  done <"$work/specs"
  fails=()
  budget=$(sbx "$work/edits1" "$kit/progs/kit_cuda" budget 2>&1 | tail -1)
  case $budget in
    "full: pitch=2 managed=2 async=2 pool=2 create=2 array=2; room: pitch=0 managed=0 async=0 pool=0 create=0 array=0; total_mib=2048 "*" alloc_free=0 one_more_byte=2") ;;
    *) fails+=("budget: want total_mib=2048, the free bytes allocated (0) and one more byte OUT_OF_MEMORY (2), every other path OUT_OF_MEMORY (2) when full and 0 with room: $budget") ;;
  esac
  nvml=$(sbx "$work/edits1" "$kit/progs/kit_cuda" nvml 2>&1 | tail -1)
  case $nvml in
    nvml_total_mib=2048\ *) ;;
    *) fails+=("NVML under the library: want a 2048 MiB total: $nvml") ;;
  esac
  kern=$(sbx "$work/edits1" "$kit/progs/kit_cuda" kernel "$kit/ptx/kit_fill.ptx" 2>&1 | tail -1)
  right=$(printf '%s' "$kern" | sed -n 's/.* right=\([0-9]*\) of=\([0-9]*\).*/\1 \2/p')
  if [ -z "$right" ]; then
    fails+=("PTX kernel under the library failed: $kern")
  elif [ "$simulated" != 1 ] && [ "${right% *}" != "${right#* }" ]; then
    fails+=("PTX kernel under the library: wrong values: $kern")
  fi
  # kill -9 of a process holding 1 GiB: its budget is back within 1 s.
  before=$(sbx "$work/edits1" "$kit/progs/kit_cuda" free 2>&1 | sed -n 's/^free_mib=\([0-9]*\).*/\1/p')
  SBX_NO_TIMEOUT=1 sbx "$work/edits1" "$kit/progs/kit_cuda" hold 1024 >"$work/hold.out" 2>&1 &
  holder=$!
  for _ in $(seq 300); do grep -q held "$work/hold.out" && break; sleep 0.1; done
  during=$(sbx "$work/edits1" "$kit/progs/kit_cuda" free 2>&1 | sed -n 's/^free_mib=\([0-9]*\).*/\1/p')
  # The real driver's view of the holder (NVML, outside the sandbox) against the
  # library's (the budget it took, seen by a fresh process before and during).
  proc_mib=$(timeout 30 "${bare_nvml[@]}" "$kit/progs/kit_cuda" nvml-proc "$holder" 2>&1 | sed -n 's/^nvml_proc_mib=\([0-9a-z]*\).*/\1/p')
  lib_mib="?"
  [ -n "$before" ] && [ -n "$during" ] && lib_mib=$((before - during))
  if [ "$simulated" != 1 ]; then
    case $proc_mib in
      '' | none) fails+=("NVML does not list the holder (pid $holder)") ;;
      *)
        d=$((proc_mib - ${lib_mib/\?/0}))
        [ "${d#-}" -le 64 ] || fails+=("the holder: NVML says ${proc_mib} MiB, the library accounted ${lib_mib} MiB (more than 64 MiB apart)")
        ;;
    esac
  fi
  kill -9 "$holder" 2>/dev/null
  wait "$holder" 2>/dev/null
  holder=""
  t0=$(date +%s%N)
  back=""
  for _ in $(seq 100); do
    now=$(sbx "$work/edits1" "$kit/progs/kit_cuda" free 2>&1 | sed -n 's/^free_mib=\([0-9]*\).*/\1/p')
    if [ -n "$now" ] && [ -n "$before" ] && [ "$now" -ge "$before" ]; then
      back=$((($(date +%s%N) - t0) / 1000000))
      break
    fi
  done
  if [ -z "$back" ]; then
    fails+=("after kill -9 the budget did not come back: free ${before:-?} MiB before, ${during:-?} while held, ${now:-?} after")
  elif [ "$back" -gt 1000 ]; then
    fails+=("after kill -9 the budget came back in ${back} ms (> 1000)")
  fi
  overhead="?"
  case $proc_mib in '' | none | *[!0-9]*) ;; *) overhead=$((proc_mib - 1024)) ;; esac
  figure="${budget}; ${nvml}; kernel: ${kern##*kernel_ms=}; holder of 1024 MiB: NVML ${proc_mib:-?} MiB, library ${lib_mib} MiB, context overhead ${overhead} MiB; kill -9: free ${before:-?} MiB, ${during:-?} held, back in ${back:-never} ms"
  if [ ${#fails[@]} = 0 ]; then
    report interception PASS "$figure"
  else
    report interception FAIL "$figure" "${fails[@]}"
  fi
fi

# 7. Compute shares: the two claims (25 % and 60 %) run the busy PTX kernel at once for
# 20 s; NVML's per-process SM utilization over the middle 18 s is each one's achieved
# share, judged at +-5 points (the goal is +-2) on a real GPU. Each one's throughput
# against the kernel run alone (bare driver, 5 s) is printed beside it.
echo "== compute-shares" >&2
if [ ! -s "$work/edits2" ]; then
  report compute-shares FAIL "no shared claims (see interception)"
else
  rate() { sed -n 's/^launches=\([0-9]*\) secs=\([0-9.]*\).*/\1 \2/p' | awk '{ if ($2 > 0) printf "%.3f", $1 / $2 }'; }
  # Simulated: 1 s and 2 s (the fake's kernels take no time: the runs only spin a CPU).
  solo_s=5 pair_s=20
  [ "$simulated" = 1 ] && solo_s=1 pair_s=2
  solo_line=$(timeout 60 "${cuda_env[@]}" "$kit/progs/kit_cuda" busy "$solo_s" "$kit/ptx/kit_fill.ptx" 2>&1 | tail -1)
  SBX_NO_TIMEOUT=1 sbx "$work/edits1" "$kit/progs/kit_cuda" busy "$pair_s" "$kit/ptx/kit_fill.ptx" >"$work/busy1" 2>&1 &
  b1=$!
  SBX_NO_TIMEOUT=1 sbx "$work/edits2" "$kit/progs/kit_cuda" busy "$pair_s" "$kit/ptx/kit_fill.ptx" >"$work/busy2" 2>&1 &
  b2=$!
  # NVML's view (outside the sandboxes), over the middle of the run.
  util=$(timeout 60 "${bare_nvml[@]}" "$kit/progs/kit_cuda" nvml-util $((pair_s > 4 ? pair_s - 2 : 1)) "$b1" "$b2" 2>&1 | tail -1)
  wait "$b1" "$b2"
  solo=$(printf '%s\n' "$solo_line" | rate)
  r1=$(tail -1 "$work/busy1" | rate)
  r2=$(tail -1 "$work/busy2" | rate)
  share() { awk -v r="$1" -v s="$solo" 'BEGIN { if (s > 0 && r != "") printf "%.1f", 100 * r / s; else print "?" }'; }
  s1=$(share "$r1") s2=$(share "$r2")
  u1=$(printf '%s' "$util" | sed -n 's/.*nvml_util1=\([0-9.]*\).*/\1/p')
  u2=$(printf '%s' "$util" | sed -n 's/.*nvml_util2=\([0-9.]*\).*/\1/p')
  figure="NVML: ${u1:-?} % (target 25) and ${u2:-?} % (target 60) [$util]; throughput: ${s1} % and ${s2} % of the solo rate (${solo:-?} launches/s; ${solo_line##*ms_per_launch=} ms each)"
  fails=()
  if [ -z "$r1" ] || [ -z "$r2" ] || [ -z "$solo" ]; then
    fails+=("a busy run failed: solo: $solo_line; 25 %: $(tail -1 "$work/busy1"); 60 %: $(tail -1 "$work/busy2")")
  elif [ "$simulated" != 1 ]; then
    off() { awk -v a="$1" -v t="$2" 'BEGIN { d = a - t; if (d < 0) d = -d; exit !(d > 5) }'; }
    if [ -z "$u1" ] || [ -z "$u2" ]; then
      fails+=("NVML gave no per-process utilization: $util")
    else
      off "$u1" 25 && fails+=("the 25 % claim got ${u1} % (NVML)")
      off "$u2" 60 && fails+=("the 60 % claim got ${u2} % (NVML)")
    fi
  fi
  if [ ${#fails[@]} = 0 ]; then
    report compute-shares PASS "$figure"
  else
    report compute-shares FAIL "$figure" "${fails[@]}"
  fi
fi

# 8. Watchdog: the plugin runs with its watchdog enforcing over a 2 GiB shared claim
# reserved for a made-up pod; two processes in that pod's cgroup (made here under
# kubepods.slice, removed after) reach the driver without the library: one holds 3 GiB
# (over the budget and its 256 MiB tolerance) and must be killed within 2 s (the
# watchdog judges by NVML's per-process memory), one holds 512 MiB and is left alone.
# In the simulated node the fake NVML lists no processes: nothing is killed there.
echo "== watchdog" >&2
watchdog_check() {
  local uid cg w in_fifo big small t0 killed="" fails=() i
  uid=$(cat /proc/sys/kernel/random/uuid)
  # The pod's cgroup in the cgroupfs layout (kubepods/pod<uid>/<container>), in the
  # unified hierarchy, else the hybrid layout's, else cgroup v1's pids hierarchy.
  local base=""
  for base in /sys/fs/cgroup /sys/fs/cgroup/unified /sys/fs/cgroup/pids ""; do
    [ -n "$base" ] && [ -f "$base/cgroup.procs" ] && break
  done
  if [ -z "$base" ]; then
    report watchdog FAIL "no cgroup hierarchy to make the pod's cgroup in"
    return
  fi
  cg=$base/kubepods/pod$uid
  w=$work/watchdog
  mkdir -p "$w"
  in_fifo=$w/in
  mkfifo "$in_fifo"
  "$kitbin/tessera-kit" watch --backend "$backend" --proc-root "$proc_root" \
    --sys-root "$sys_root" --dev-root "$dev_root" --driver-root "$driver_root" \
    --interception-lib "$kit/lib/libtessera_cuda.so" --workdir "$w/plugin" --pod-uid "$uid" \
    "${sim_flag[@]}" <"$in_fifo" >"$w/out" 2>"$w/err" &
  local plugin=$!
  exec 9>"$in_fifo"
  for i in $(seq 300); do grep -q ready "$w/out" && break; kill -0 "$plugin" 2>/dev/null || break; sleep 0.1; done
  if ! grep -q ready "$w/out"; then
    exec 9>&-
    wait "$plugin"
    report watchdog FAIL "the plugin did not get ready" "$(tail -5 "$w/err")"
    return
  fi
  mkdir -p "$cg/kit-big" "$cg/kit-small"
  # shellcheck disable=SC2016 # $$ is the inner shell's: it moves itself, then execs
  "${cuda_env[@]}" sh -c 'echo $$ >"$1/cgroup.procs" && exec "$2" hold "$3"' sh "$cg/kit-small" "$kit/progs/kit_cuda" 512 >"$w/small" 2>&1 &
  small=$!
  # shellcheck disable=SC2016
  "${cuda_env[@]}" sh -c 'echo $$ >"$1/cgroup.procs" && exec "$2" hold "$3"' sh "$cg/kit-big" "$kit/progs/kit_cuda" 3072 >"$w/big" 2>&1 &
  big=$!
  for i in $(seq 300); do grep -q held "$w/big" 2>/dev/null && break; kill -0 "$big" 2>/dev/null || break; sleep 0.05; done
  t0=$(date +%s%N)
  for i in $(seq 100); do
    kill -0 "$big" 2>/dev/null || { killed=$((($(date +%s%N) - t0) / 1000000)); break; }
    sleep 0.05
  done
  sleep 1
  local small_alive=no
  kill -0 "$small" 2>/dev/null && small_alive=yes
  kill -9 "$big" "$small" 2>/dev/null
  wait "$big" "$small" 2>/dev/null
  exec 9>&-
  wait "$plugin"
  rmdir "$cg/kit-big" "$cg/kit-small" "$cg" 2>/dev/null
  rmdir "$base/kubepods" 2>/dev/null # only if the kit made it (empty)
  local figure="3 GiB holder: "
  grep -q held "$w/big" || figure+="never held its memory, "
  if [ -n "$killed" ]; then figure+="killed ${killed} ms after it held"; else figure+="not killed in 5 s"; fi
  figure+="; 512 MiB holder: $([ "$small_alive" = yes ] && echo alive || echo gone) after 6 s"
  if [ "$simulated" != 1 ]; then
    grep -q held "$w/big" || fails+=("the 3 GiB holder did not get its memory: $(tail -1 "$w/big")")
    if [ -z "$killed" ]; then
      fails+=("the 3 GiB holder was not killed")
    elif [ "$killed" -gt 2000 ]; then
      fails+=("the 3 GiB holder was killed after ${killed} ms (> 2000)")
    fi
    [ "$small_alive" = yes ] || fails+=("the 512 MiB holder was killed too: $(tail -1 "$w/small")")
  fi
  if [ ${#fails[@]} = 0 ]; then
    report watchdog PASS "$figure"
  else
    report watchdog FAIL "$figure" "${fails[@]}"
  fi
}
watchdog_check

# 9. Costs on the real driver, bare and under the library (the first claim's sandbox):
# cuInit + context, alloc+free, cuLaunchKernel, cuMemGetInfo; and /bin/true with the
# front preloaded (ld.so.preload in the sandbox) against bare. Figures only.
echo "== costs" >&2
bare=$(timeout 60 "${cuda_env[@]}" "$kit/progs/kit_cuda" costs "$kit/ptx/kit_fill.ptx" 2>&1 | tail -1)
lib=""
[ -s "$work/edits1" ] && lib=$(sbx "$work/edits1" "$kit/progs/kit_cuda" costs "$kit/ptx/kit_fill.ptx" 2>&1 | tail -1)
true_ms() { # mean ms of /bin/true over 200 runs, in the given runner
  local t0 t1
  t0=$(date +%s%N)
  # shellcheck disable=SC2016 # the loop's variables are the inner shell's
  "$@" sh -c 'i=0; while [ $i -lt 200 ]; do /bin/true; i=$((i + 1)); done'
  t1=$(date +%s%N)
  awk -v d=$((t1 - t0)) 'BEGIN { printf "%.3f", d / 200 / 1e6 }'
}
true_bare=$(true_ms env)
true_front="?"
[ -s "$work/edits1" ] && true_front=$(true_ms sbx "$work/edits1")
figure="bare: $bare | library: ${lib:-not run} | /bin/true ${true_bare} ms bare, ${true_front} ms with the front"
case "$bare $lib" in
  *init_ctx_ms=*init_ctx_ms=*) report costs PASS "$figure" ;;
  *) report costs FAIL "$figure" "a costs run failed" ;;
esac

fi

# 10. MIG: on a GPU already in MIG mode, one instance of each profile that fits;
# with --allow-mig-changes and MIG off, the full lifecycle (see the top); else skipped.
mig_args=(--backend "$backend" --proc-root "$proc_root" --sys-root "$sys_root"
  --dev-root "$dev_root" --driver-root "$driver_root"
  --interception-lib "$kit/lib/libtessera_cuda.so" --workdir "$work/mig" "${sim_flag[@]}")
if [ "$mig_on" -gt 0 ]; then
  kitcheck mig 300 "$kitbin/tessera-kit" mig "${mig_args[@]}"
elif [ "$allow_mig" = 1 ]; then
  kitcheck mig 300 "$kitbin/tessera-kit" mig "${mig_args[@]}" \
    --switch-mig-on "$work/mig-found" --kit-nvml "$kit/progs/kit_nvml" "${nvml_dir[@]}"
  if [ "$kit_rc" != 0 ] && [ -s "$work/mig-found" ]; then
    # It died before putting MIG mode back itself: put it back here, and say so.
    restored=$("$kitbin/tessera-kit" mig-restore --backend "$backend" --proc-root "$proc_root" \
      --sys-root "$sys_root" "$work/mig-found" 2>&1)
    restore_rc=$?
    died=("$restored")
    [ -s "$work/mig.stderr" ] && died+=("its stderr: $(tail -3 "$work/mig.stderr")")
    report_file=$kit_file report mig FAIL "the MIG check died (exit $kit_rc); run.sh put back the MIG modes found: $([ "$restore_rc" = 0 ] && echo 'every GPU as found' || echo 'a GPU NOT as found')" \
      "${died[@]}"
  fi
  mig_done=1
else
  report mig SKIP "MIG mode off: skipped (--allow-mig-changes switches it on for the check, and back)"
fi

echo "== report ($(($(date +%s) - started)) s)" >&2
"$kitbin/tessera-kit" report --json "$out/report.json" "$out"/checks/*.json
rc=$?
echo "ran in $(($(date +%s) - started)) s on $mode; JSON in $out/report.json"
exit "$rc"
