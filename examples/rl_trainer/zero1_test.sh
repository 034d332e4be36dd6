#!/usr/bin/env bash
# ZeRO-1 (--zero1) against the replicated optimizer on the same layout:
# 1. Without clipping (SFT only) the steps are the same bit for bit: the reduce-scatter folds the
#    data ranks as the all-reduce does, and AdamW is element by element.
# 2. A checkpoint written with --zero1 holds the whole moments: resumed without --zero1 it goes on
#    as the --zero1 run does, in f64: every metric equal as metrics.csv prints it (6 significant
#    digits, checked within 1e-9 relative; the two differ only in the order of the gradient norm's
#    sum, far below that, where resuming with the moments zeroed changes the fourth digit); and
#    the reverse, a replicated checkpoint resumed with --zero1.
#   zero1_test.sh RL_TRAINER WORK_DIR [layout flags...]
set -euo pipefail
bin=$1; work=$2; shift 2
rm -rf "$work" && mkdir -p "$work"
hash() { grep "final parameters" | awk '{print $NF}'; }
sft=(--sft-steps 30 --rl-steps 0 --eval-prompts 50 --quiet "$@")
a=$("$bin" "${sft[@]}" | hash)
b=$("$bin" "${sft[@]}" --zero1 | hash)
echo "SFT without clipping: replicated $a, ZeRO-1 $b"
[[ -n "$a" && "$a" == "$b" ]] || { echo "FAILED: ZeRO-1 is not the replicated step"; exit 1; }

flags=(--f64 --mode grpo --sft-steps 100 --eval-prompts 50 --quiet "$@")
close() {  # close A.csv B.csv: every column but the timings within 1e-9 relative
  python3 "$(dirname "${BASH_SOURCE[0]}")/metrics_close.py" "$1" "$2" "the resumed run" 1e-9
}
for mode in zero1 replicated; do
  [[ $mode == zero1 ]] && save=(--zero1) resume=() || { save=(); resume=(--zero1); }
  # The uninterrupted run writes the checkpoint after step 2 (saving reads the state only).
  "$bin" "${flags[@]}" "${save[@]}" --rl-steps 4 --out "$work/$mode-whole" \
    --save "$work/$mode-ck" --save-every 2 > /dev/null
  echo step_2 > "$work/$mode-ck/latest"
  "$bin" "${flags[@]}" "${resume[@]}" --rl-steps 4 --resume "$work/$mode-ck" \
    --out "$work/$mode-resumed" > /dev/null
  echo -n "a $mode checkpoint resumed ${resume[*]:-without --zero1}: "
  close "$work/$mode-whole/metrics.csv" "$work/$mode-resumed/metrics.csv" \
    || { echo "FAILED: the resumed run left the uninterrupted one"; exit 1; }
done
echo "zero1: passed"
