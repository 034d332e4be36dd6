#!/usr/bin/env bash
# A checkpoint holds the whole model, so another layout resumes it (Megatron's resharding of a
# distributed checkpoint): in f64 every layout takes the same steps within rounding (--check), so
# a checkpoint that layout A wrote after RL step 2, resumed on layout B, must continue as the
# uninterrupted run on A does. Checked twice:
# - the final checkpoints (after step 4): the counters equal, the parameters and AdamW's moments
#   within 1e-11 of the uninterrupted run's, relative to each array's largest element (they were
#   within 1.5e-14), and the metric history as the metrics below;
# - every metric after the resume equal as metrics.csv prints it (6 significant digits; within
#   2e-5 relative, one unit of the sixth digit, plus 1e-12 for losses that are 0 up to rounding).
# GRPO after 100 SFT steps on 4 layers, so that the RL steps before a checkpoint update the model
# and move the moments. Layouts:
#   A  pp 2 x dp 2 x tp 2 + SP, vocabulary 1F1B, ZeRO-1 (8 ranks: stages, vocabulary shards over
#      pp x tp, the moments gathered over the data group)
#   B  pp 2 x cp 2, interleaved 1F1B (two looped chunks a rank)
#   C  pp 4 x tp 2 + SP, vocabulary 1F1B with two barriers (other vocabulary shards)
#   1  one rank
# A's run (4 RL steps, a checkpoint every 2) is the reference; its step-2 checkpoint resumes on
# 1 and on B; B's run writes a checkpoint after step 3, which resumes on C. (A checkpoint folder's
# `latest` names the step a resume starts from; the test points it at an earlier one.)
#   reshard_test.sh RL_TRAINER WORK_DIR
set -euo pipefail
bin=$1; work=$2; shift 2
rm -rf "$work" && mkdir -p "$work"
run=(--f64 --mode grpo --sft-steps 100 --layers 4 --eval-prompts 50 --quiet "$@")
A=(--pp 2 --dp 2 --tp 2 --sp --schedule vocab-1 --zero1)
B=(--pp 2 --cp 2 --schedule interleaved)
C=(--pp 4 --tp 2 --sp --schedule vocab-2)
close() {  # close A.csv B.csv WHAT: every column but the timings within 2e-5 relative (+1e-12)
  python3 "$(dirname "${BASH_SOURCE[0]}")/metrics_close.py" "$1" "$2" "$3" 2e-5 1e-12
}
same() {  # same A.bin B.bin WHAT: the final checkpoints (f64): counters, arrays, metric history
  python3 "$(dirname "${BASH_SOURCE[0]}")/checkpoint_close.py" "$1" "$2" "$3" 1e-11 2e-5 1e-12
}
"$bin" "${run[@]}" "${A[@]}" --rl-steps 4 --out "$work/whole" --save "$work/ckA" --save-every 2 \
  > /dev/null
[[ $(wc -l < "$work/whole/metrics.csv") -eq 5 ]] || { echo "FAILED: not 4 metric rows"; exit 1; }
cp "$work/ckA/step_4/model.bin" "$work/whole.bin"
echo step_2 > "$work/ckA/latest"
"$bin" "${run[@]}" --rl-steps 4 --resume "$work/ckA" --out "$work/A_on_1" --save "$work/ck1" \
  > /dev/null
close "$work/whole/metrics.csv" "$work/A_on_1/metrics.csv" "A's checkpoint on one rank"
same "$work/whole.bin" "$work/ck1/step_4/model.bin" "A's checkpoint on one rank"
"$bin" "${run[@]}" "${B[@]}" --rl-steps 4 --resume "$work/ckA" --out "$work/A_on_B" \
  --save "$work/ckB" --save-every 1 > /dev/null
close "$work/whole/metrics.csv" "$work/A_on_B/metrics.csv" "A's checkpoint on B"
same "$work/whole.bin" "$work/ckB/step_4/model.bin" "A's checkpoint on B"
echo step_3 > "$work/ckB/latest"
"$bin" "${run[@]}" "${C[@]}" --rl-steps 4 --resume "$work/ckB" --out "$work/B_on_C" \
  --save "$work/ckC" > /dev/null
close "$work/whole/metrics.csv" "$work/B_on_C/metrics.csv" "B's checkpoint on C"
same "$work/whole.bin" "$work/ckC/step_4/model.bin" "B's checkpoint on C"
echo "reshard: passed"
