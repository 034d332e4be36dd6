#!/usr/bin/env bash
# A checkpoint holds the whole model, so another layout resumes it (Megatron's resharding of a
# distributed checkpoint): in f64 every layout takes the same steps within rounding (--check), so
# a checkpoint that layout A wrote after RL step 2, resumed on layout B, must continue as the
# uninterrupted run on A does: every metric equal as metrics.csv prints it (6 significant
# digits; checked within 2e-5 relative, one unit of the sixth digit, plus 1e-12 for the losses
# that are 0 up to rounding, against differences of ~1e-12). A wrong piece of the parameters or
# of AdamW's moments changes the losses from the first resumed step: a resume with the moments
# zeroed turns pg_loss's sign (zero1_test.sh). GRPO after 100 SFT steps on 4 layers, so that the
# RL steps before a checkpoint update the model and move the moments. Layouts:
#   A  pp 2 x dp 2 x tp 2 + SP, vocabulary 1F1B, ZeRO-1 (8 ranks: stages, vocabulary shards over
#      pp x tp, the moments gathered over the data group)
#   B  pp 2 x cp 2, interleaved 1F1B (two looped chunks a rank)
#   C  pp 4 x tp 2 + SP, ZB-H1
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
C=(--pp 4 --tp 2 --sp --schedule zb-h1)
close() {  # close A.csv B.csv WHAT: every column but the timings within 2e-5 relative (+1e-12)
  python3 - "$1" "$2" "$3" <<'PY'
import csv, sys
a, b = (list(csv.reader(open(p))) for p in sys.argv[1:3])
assert a[0] == b[0] and len(a) == len(b), f"{sys.argv[3]}: the metric tables differ in shape"
worst = 0.0
for ra, rb in zip(a[1:], b[1:]):
    for name, x, y in zip(a[0], ra, rb):
        if name.startswith("timing_s/"):
            continue
        x, y = float(x), float(y)
        d = abs(x - y) / max(abs(x), abs(y)) if abs(x - y) > 1e-12 else 0.0
        worst = max(worst, d)
        assert d <= 2e-5, f"{sys.argv[3]}: {name} {x} against {y}"
print(f"{sys.argv[3]}: largest relative metric difference {worst:.2e}")
PY
}
"$bin" "${run[@]}" "${A[@]}" --rl-steps 4 --out "$work/whole" --save "$work/ckA" --save-every 2 \
  > /dev/null
[[ -f "$work/ckA/step_2/model.bin" ]] || { echo "FAILED: no $work/ckA/step_2/model.bin"; exit 1; }
echo step_2 > "$work/ckA/latest"
"$bin" "${run[@]}" --rl-steps 4 --resume "$work/ckA" --out "$work/A_on_1" > /dev/null
close "$work/whole/metrics.csv" "$work/A_on_1/metrics.csv" "A's checkpoint on one rank"
"$bin" "${run[@]}" "${B[@]}" --rl-steps 4 --resume "$work/ckA" --out "$work/A_on_B" \
  --save "$work/ckB" --save-every 1 > /dev/null
close "$work/whole/metrics.csv" "$work/A_on_B/metrics.csv" "A's checkpoint on B"
echo step_3 > "$work/ckB/latest"
"$bin" "${run[@]}" "${C[@]}" --rl-steps 4 --resume "$work/ckB" --out "$work/B_on_C" > /dev/null
close "$work/whole/metrics.csv" "$work/B_on_C/metrics.csv" "B's checkpoint on C"
echo "reshard: passed"
