#!/usr/bin/env bash
# check_args.sh SOURCE_DIR BUILD_DIR: scripts/main-job with bad MOEPLAN_* values must exit
# 2 with a one-line error naming the value, and write nothing (no runs folder made).
set -uo pipefail
src=$1 build=$2
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
failures=0 n=0
refused() {  # refused "WORDS" VAR=VALUE...
  local words=$1
  shift
  local err rc out="$tmp/$((++n))/main-job"  # must not appear
  # (a check that let the job through would start training: cut short, and failed)
  err=$(env "$@" MOEPLAN_MAIN_JOB_OUT="$out" timeout 30 bash "$src/scripts/main-job" "$build" 2>&1 > /dev/null)
  rc=$?
  if ((rc != 2)) || [[ $err != *"$words"* ]] || (($(printf '%s\n' "$err" | wc -l) != 1)) || [[ -e $out ]]; then
    echo "FAIL: $* gave exit $rc, '$err' (wanted 2 and one line with '$words', no $out)"
    failures=$((failures + 1))
  else
    echo "ok: $* refused: $err"
  fi
}
refused "MOEPLAN_MAIN_JOB_SEEDS='0' is not a whole number >= 1" MOEPLAN_MAIN_JOB_SEEDS=0
refused "MOEPLAN_JOBS='two' is not a whole number >= 1" MOEPLAN_JOBS=two
refused "MOEPLAN_MAIN_JOB_LR_SCALES='0.5 1' holds '1'" MOEPLAN_MAIN_JOB_LR_SCALES="0.5 1"
refused "holds '1.0'" MOEPLAN_MAIN_JOB_LR_SCALES="1.0"
refused "holds '-0.5'" MOEPLAN_MAIN_JOB_LR_SCALES="-0.5"
refused "holds 'x2'" MOEPLAN_MAIN_JOB_LR_SCALES="x2"
refused "holds 0.5 twice" MOEPLAN_MAIN_JOB_LR_SCALES="0.5 2 .50"
# In range by its form, out of it by grid's rule: grid's own words.
refused "MOEPLAN_MAIN_JOB_LR_SCALES: the step law ×50 gives η = 1.227" MOEPLAN_MAIN_JOB_LR_SCALES="0.5 50"
refused "MOEPLAN_MAIN_JOB_LR_SCALES: --lr-scale = 1000 is invalid; it must be in (0, 100]" MOEPLAN_MAIN_JOB_LR_SCALES="1000"
((failures == 0)) && echo "main_job_args: all refused as they should be"
exit $((failures > 0))
