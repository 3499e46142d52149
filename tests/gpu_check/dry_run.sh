#!/usr/bin/env bash
# ctest gpu_check_dry: the next GPU session's call, as bench/gpu/NOTES.md writes it, run dry
# (scripts/gpu-check with GPU_CHECK_DRY=BUILD). Fails when a step of that call would be wasted on
# the GPU for a reason this machine can see: a test filter that selects no case, a point that
# bench_gpu does not know, a step that fails or is skipped, a results writer that fails, or a
# comparison the session's decisions are read from missing from results.md.
#   tests/gpu_check/dry_run.sh BUILD     (a build folder made with CUDA, e.g. build/release)
set -uo pipefail
command -v python3 >/dev/null || { echo "gpu_check_dry: python3 not found: skipped"; exit 77; }
ROOT="$(cd "$(dirname "$0")/../.." && pwd)"
BUILD="$(cd "${1:?usage: dry_run.sh BUILD}" && pwd)"
fail() { echo "gpu_check_dry: $*" >&2; FAILED=1; }
FAILED=0
# bench_gpu refuses, before any device work, what the dry run's stub relies on it to refuse.
B="$BUILD/bench/gpu/bench_gpu"
refused() {  # what-it-should-say args...
  local want=$1; shift
  local err; err="$("$B" "$@" 2>&1 >/dev/null)"; local rc=$?
  [[ $rc -eq 2 && "$err" == *"$want"* && $(wc -l <<<"$err") -eq 1 ]] ||
    fail "bench_gpu $* gave exit $rc and '$err' (expected exit 2 and one line with '$want')"
}
refused "'dense-124m' is not a point" --only dense-124M,dense-124m
refused "experts=tiled64 is not known" --only dense-124M --kernels experts=tiled64
refused "logits and gemm are not point kernels here" --kernels logits=2048
refused "--kernels needs a spec" --kernels ""
"$B" --list-points | grep -qx "moe-ra0.2-tiled128-fused-mma-lean-attn-adamw-beside" ||
  fail "bench_gpu --list-points lacks the MoE goal's point"
# The call: the first command line of the section "The next GPU session".
CMD="$(awk '/^## The next GPU session/{f=1} f && /^`set -o pipefail; GPU_CHECK_SKIP=/{print; exit}' \
  "$ROOT/bench/gpu/NOTES.md" | sed 's/^`//; s/`$//')"
if [[ -z "$CMD" ]]; then
  echo "gpu_check_dry: bench/gpu/NOTES.md has no line '\`set -o pipefail; GPU_CHECK_SKIP=...' under '## The next GPU session'" >&2
  exit 1
fi
echo "the call: $CMD"
OUT="$(mktemp -d /tmp/gpu-check-dry.XXXX)"
trap 'rm -rf "$OUT"' EXIT
(cd "$ROOT" && OUT="$OUT" GPU_CHECK_DRY="$BUILD" bash -c "$CMD") >"$OUT/dry.out" 2>&1
rc=$?
cat "$OUT/dry.out"
(( rc == 0 )) || fail "the dry run exited $rc (a failed step or test, or the results writer)"
R="$OUT/results.md"
[[ -f "$R" ]] || { fail "no results.md"; exit 1; }
grep -q "DRY RUN" "$R" || fail "results.md does not say it is a dry run"
grep -qE "=FAIL|=SKIPPED" "$R" &&
  fail "a test failed or was skipped: $(grep -oE '[a-z0-9-]+=(FAIL|SKIPPED)(\([^)]*\))?' "$R" | tr '\n' ' ')"
# Each test step of the call ran (a step left out would open the benchmarks that wait on it).
for t in kernels-wgmma model-wgmma kernels-wgmma-attn model-wgmma-attn kernels-wgmma4 kernels-wgmma3w0 kernels kernels-new model \
  model-new model-router model-capacity model-gemm-table nccl kernels-pdl model-pdl model-pdl-wgmma; do
  grep -qE " $t=pass" "$R" || fail "the test step $t did not run"
done
grep -q "skipped, past\|skipped, under" "$OUT/dry.out" && fail "a step was skipped for time"
grep -q "not a point" "$OUT/dry.out" && fail "a call names a point bench_gpu does not know"
# What the next session decides from (NOTES.md): each comparison, the host table, the goals at
# both batches.
for line in "MoE goal point with the wgmma expert kernels against tiled128" \
  "MoE goal point, wgmma at 4 stages" "MoE goal point, wgmma at 3 stages two steps ahead" \
  "dense goal point with wgmma attention" "MoE goal point with both wgmma paths" \
  "dense goal point with programmatic dependent launches (launch=pdl) against plain" \
  "MoE goal point with programmatic dependent launches (launch=pdl) against plain" \
  "MoE goal point with the router's products on the tiled kernels (router=tiled) against cuBLAS" \
  "MoE goal point, the gradient norm summed beside the backward against after" \
  "The host per step" "## Against the goals"; do
  grep -qF "$line" "$R" || fail "results.md lacks '$line'"
done
for b in 8 32; do
  for p in dense-124M-fused-mma-lean-attn-adamw-beside moe-ra0.2-tiled128-fused-mma-lean-attn-adamw-beside \
    moe-ra0.2-tiled128-fused-mma-lean-attn-adamw-beside-pdl \
    moe-ra0.2-tiled128-fused-mma-lean-attn-adamw-beside-router-tiled \
    moe-ra0.2-wgmma-fused-mma-lean-attn-adamw-beside; do
    grep -qE "^\| $p \| $b \|" "$R" || fail "the goals table lacks $p at batch $b"
  done
done
# The decisions (bench/gpu/decisions.py): each read, and none left undecided, which would mean
# the call lacks a test or a measurement that decision needs.
for d in "launch=pdl:" "router=tiled:" "experts=wgmma:" "wgmma pipeline" "attention=fused_wgmma:" \
  "gradient norm beside the backward:" "the MoE step's bound"; do
  grep -qF -- "- $d" "$R" || fail "results.md's decisions lack '$d'"
done
grep -F -- "- " "$R" | grep -q "undecided" &&
  fail "a decision is undecided: $(grep -F -- '- ' "$R" | grep 'undecided' | cut -c1-160)"
# The goals' points with the kernels the decisions chose (bench-best), at both batches: the stub
# makes every option win, so the step must have run.
grep -q "The kernels these choose: \`" "$R" || fail "results.md names no kernels chosen"
for b in 8 32; do
  for p in dense-124M-fused-mma-lean-attn-adamw-beside moe-ra0.2-tiled128-fused-mma-lean-attn-adamw-beside; do
    grep -qE "^\| $p-with-[a-z_=,]+ \| $b \|" "$R" || fail "the goals table lacks $p with the chosen kernels at batch $b"
  done
done
tar -xzf "$OUT/logs.tar.gz" -C "$OUT" ./kernel-times-vs-baseline.md ./kernel-times-wgmma-vs-tiled128.md \
  ./kernel-times-wgmma-attn-vs-lean.md 2>/dev/null || fail "the kernel-times comparisons are missing"

# The second call of that section: the equal-time sweep alone (its line starting
# `set -o pipefail; GPU_CHECK_ONLY=sweep`). Dry, it plans the real grid and trains a stand-in of
# 200k parameters on the CPU through the same steps: every step exits 0, no other part runs, and
# results.md carries the report's tables; a second call resumes (every point already complete),
# and one on runs of another plan removes them first.
CMD2="$(awk '/^## The next GPU session/{f=1} f && /^`set -o pipefail; GPU_CHECK_ONLY=sweep/{print; exit}' \
  "$ROOT/bench/gpu/NOTES.md" | sed 's/^`//; s/`$//')"
if [[ -z "$CMD2" ]]; then
  fail "bench/gpu/NOTES.md has no line '\`set -o pipefail; GPU_CHECK_ONLY=sweep...' under '## The next GPU session'"
else
  echo "the sweep's call: $CMD2"
  S="$OUT/sweep"; mkdir -p "$S/1" "$S/2" "$S/3"
  sweep_call() {  # n: the call's own OUT folder; the sweep's folder is the calls' one
    (cd "$ROOT" && OUT="$S/$1" GPU_CHECK_DRY="$BUILD" GPU_CHECK_SWEEP_DIR="$S/dir" bash -c "$CMD2") \
      >"$S/$1/dry.out" 2>&1
  }
  sweep_call 1
  rc=$?
  (( rc == 0 )) || fail "the sweep's call exited $rc: $(grep -E ' exit [1-9]' "$S/1/dry.out" | head -3 | tr '\n' ' ')"
  for step in "sweep grid exit 0" "sweep: dry run: the grid above planned" "sweep stand-in grid exit 0" \
    "sweep estimate exit 0" "sweep run exit 0" "sweep report md exit 0" "sweep report html exit 0"; do
    grep -qF "$step" "$S/1/dry.out" || fail "the sweep's call lacks '$step'"
  done
  grep -qE "^  moe-ra0\.200 .* E88 K6 " "$S/1/dry.out" || fail "the sweep's call did not plan the 124M grid"
  OTHER='\] (test: |test [a-z0-9-]+: skipped|bench_gpu[ ,]|torch_ref|moeplan run --device cuda)'
  grep -qE "$OTHER" "$S/1/dry.out" &&
    fail "the sweep's call ran another part: $(grep -E "$OTHER" "$S/1/dry.out" | head -2 | tr '\n' ' ')"
  R="$S/1/results.md"
  for line in "## Equal time: the sweep \`moeplan grid --N 2e5" "The estimate before training" \
    "projected train time vs dense" "measured vs plan: 2 of 2 complete point(s)" \
    "### Time and achieved FLOP rate" "dense's final BPC reached" \
    "Time = work / rate" "Time to the dense baseline's final validation BPC" \
    "No benchmark and no GPU test ran in this call"; do
    grep -qF -- "$line" "$R" || fail "the sweep's results.md lacks '$line'"
  done
  # (the listing whole first: `tar | grep -q` under pipefail fails when grep stops at its match)
  LISTED="$(tar -tzf "$S/1/logs.tar.gz")"
  for p in dense moe-ra0.250; do
    grep -qE "^\| $p \| .*\| complete \|$" "$R" || fail "the sweep's results.md has no complete $p"
    grep -qx "./sweep-records/$p.json" <<<"$LISTED" || fail "logs.tar.gz lacks $p's record"
  done
  grep -qx "./sweep-report.html" <<<"$LISTED" || fail "logs.tar.gz lacks the sweep's HTML report"
  # A second call on the same machine: the runs are this plan's, so nothing trains again.
  sweep_call 2
  (( $? == 0 )) || fail "the sweep's second call exited non-zero"
  [[ $(grep -c "already complete" "$S/2/dry.out") -ge 2 ]] || fail "the sweep's second call did not find both points complete"
  grep -qF "held another plan's runs" "$S/2/dry.out" && fail "the sweep's second call removed its own plan's runs"
  # Runs of another plan: removed, and the sweep trained afresh.
  echo "# another plan" >>"$S/dir/sweep.toml"
  sweep_call 3
  (( $? == 0 )) || fail "the sweep's call after another plan exited non-zero"
  grep -qF "held another plan's runs: removed" "$S/3/dry.out" || fail "another plan's runs were not removed"
  grep -qF "already complete" "$S/3/dry.out" && fail "another plan's runs were resumed"
  grep -qE "^\| moe-ra0\.250 \| .*\| complete \|$" "$S/3/results.md" || fail "the sweep did not train again"
  # The call with less device time than the sweep needs (NOTES: GPU_CHECK_END lowered to the time
  # left): the training stops at that end with a checkpoint, which is no failure, and the report
  # is still written, the point stopped in it as running. The stand-in's baseline reads 4M unique
  # tokens here (several minutes on a CPU), so the 45 s end comes first whatever the machine.
  mkdir -p "$S/4"
  CMD4="${CMD2/GPU_CHECK_END=570/GPU_CHECK_END=45}"
  [[ "$CMD4" != "$CMD2" ]] || fail "the sweep's call has no GPU_CHECK_END=570 to lower"
  (cd "$ROOT" && OUT="$S/4" GPU_CHECK_DRY="$BUILD" GPU_CHECK_SWEEP_DIR="$S/dir4" \
    GPU_CHECK_DRY_STANDIN="--N 2e5 --ra 0.25 --dense-tokens 4e6" bash -c "$CMD4") >"$S/4/dry.out" 2>&1
  rc=$?
  (( rc == 0 )) || fail "the sweep's call stopped at its end exited $rc: $(grep -E ' exit [1-9]' "$S/4/dry.out" | head -3 | tr '\n' ' ')"
  for step in "sweep run exit 124 (stopped at the 45 s end, checkpointed: not a failure" \
    "interrupted: checkpoint at step" "sweep report md exit 0" "sweep report html exit 0"; do
    grep -qF "$step" "$S/4/dry.out" || fail "the sweep's call stopped at its end lacks '$step'"
  done
  grep -qE "^\| dense \| .*\| running \(step [0-9]+\) \|$" "$S/4/results.md" ||
    fail "the stopped sweep's results.md has no running dense point"
  # A part's name misspelt: refused before any work, in one line.
  err="$(cd "$ROOT" && OUT="$S/x" GPU_CHECK_DRY="$BUILD" GPU_CHECK_ONLY=sweeps bash scripts/gpu-check 2>&1 >/dev/null)"
  rc=$?
  [[ $rc -eq 2 && "$err" == *"GPU_CHECK_ONLY names 'sweeps', which is not a part"* && $(wc -l <<<"$err") -eq 1 ]] ||
    fail "GPU_CHECK_ONLY=sweeps gave exit $rc and '$err' (expected exit 2, one line)"
  [[ -e "$S/x" ]] && fail "GPU_CHECK_ONLY=sweeps left $S/x behind"
fi

# gpu-check with nothing left out but what a dry run cannot do (the steps the call above skips:
# the earlier points, the large-batch options, the GEMM table's absence): each runs and exits 0.
A="$OUT/all"; mkdir -p "$A"
(cd "$ROOT" && OUT="$A" GPU_CHECK_DRY="$BUILD" GPU_CHECK_BATCH2=32 \
  GPU_CHECK_TORCH_JSON=bench/gpu/torch-h200-2026-12-04.json \
  GPU_CHECK_TORCH_B2_JSON=bench/gpu/torch-b32-h200-2026-12-04.json bash scripts/gpu-check) >"$A/dry.out" 2>&1
rc=$?
(( rc == 0 )) || fail "gpu-check with every step exited $rc: $(grep -E ' exit [1-9]' "$A/dry.out" | head -3 | tr '\n' ' ')"
for step in "bench bench exit 0" "bench bench-opt exit 0" "bench gemm-none exit 0"; do
  grep -qF "$step" "$A/dry.out" || fail "gpu-check with every step lacks '$step'"
done

# The same call with GPU tests failing, the paths a first GPU run is likeliest to take: the
# experts' wgmma kernels wrong (exit 1: the LBO/SBO exchanges run), attention's hung (124: no
# exchanges, its model test not run), the router's model test failed. Each option's benchmarks
# are then left out and its decision is no; launch=pdl, whose tests passed, is still decided.
F="$OUT/fail"; mkdir -p "$F"
(cd "$ROOT" && OUT="$F" GPU_CHECK_DRY="$BUILD" GPU_CHECK_DRY_RC=kernels-wgmma=1,kernels-wgmma-attn=124,model-router=1 \
  bash -c "$CMD") >"$F/dry.out" 2>&1
rc=$?
(( rc == 1 )) || fail "with failing tests the dry run exited $rc (expected 1)"
R="$F/results.md"
for want in "kernels-wgmma=FAIL(rc 1)" "kernels-wgmma-swap-k=pass" "kernels-wgmma-swap-both=pass" \
  "model-wgmma=pass" "kernels-wgmma-attn=FAIL(rc 124)" "model-wgmma-attn=SKIPPED(kernels-wgmma-attn hung)" \
  "model-router=FAIL(rc 1)" "- router=tiled: **no**: its tests failed (model-router)" \
  "- experts=wgmma: **no**: its tests failed (kernels-wgmma)" \
  "- attention=fused_wgmma: **no**: its tests failed (kernels-wgmma-attn)" "- launch=pdl: **yes**" \
  "The kernels these choose: \`launch=pdl\`"; do
  grep -qF -- "$want" "$R" || fail "with failing tests, results.md lacks '$want'"
done
grep -qF "kernels-wgmma-attn-swap" "$R" && fail "the exchanges ran after a hang"
for step in bench-wgmma bench-wgmma4 bench-wgmma-attn bench-router "batch-32 wgmma" "batch-32 router" \
  kernel-times-wgmma; do
  grep -qE "bench $step exit" "$F/dry.out" && fail "with failing tests, '$step' still ran"
done
(( FAILED == 0 )) && echo "gpu_check_dry: the call ran dry: every step, filter and point fits, and failing tests close their options"
exit $FAILED
