#!/usr/bin/env bash
# Checkpoint and resume continue bit for bit: N RL steps in one process, and N/2 steps, a
# checkpoint, a new process resuming to N, give the same final parameters (their hash) and the
# same metric history (every column but the timings). Also: a checkpoint of another run is refused.
# With RESUME_SCHEDULE_SAME=S the checkpoint also resumes under --schedule S to the same result
# (another schedule of the placement); with RESUME_SCHEDULE_REFUSED=S, --schedule S (another
# placement) is refused.
#   resume_test.sh RL_TRAINER WORK_DIR [layout flags...]
set -euo pipefail
bin=$1; work=$2; shift 2
rm -rf "$work" && mkdir -p "$work"
flags=(--sft-steps 30 --eval-prompts 50 --quiet "$@")
hash() { grep "final parameters" | awk '{print $NF}'; }
whole=$("$bin" "${flags[@]}" --rl-steps 4 --out "$work/whole" | hash)
"$bin" "${flags[@]}" --rl-steps 2 --save "$work/ck" > /dev/null
resumed=$("$bin" "${flags[@]}" --rl-steps 4 --resume "$work/ck" --out "$work/resumed" | hash)
untimed() { python3 -c 'import csv,sys
r=list(csv.reader(open(sys.argv[1]))); keep=[i for i,n in enumerate(r[0]) if not n.startswith("timing_s/")]
print("\n".join(",".join(row[i] for i in keep) for row in r))' "$1"; }
echo "whole run: $whole; resumed run: $resumed"
[[ -n "$whole" && "$whole" == "$resumed" ]] || { echo "FAILED: the parameters differ"; exit 1; }
diff <(untimed "$work/whole/metrics.csv") <(untimed "$work/resumed/metrics.csv") \
  || { echo "FAILED: the metric histories differ"; exit 1; }
if "$bin" "${flags[@]}" --rl-steps 4 --seed 9 --resume "$work/ck" > "$work/refused.txt" 2>&1; then
  echo "FAILED: a checkpoint of another run was accepted"; exit 1
fi
grep -q "expected a checkpoint of the same run" "$work/refused.txt" \
  || { echo "FAILED: no clear error for a foreign checkpoint"; cat "$work/refused.txt"; exit 1; }
if [[ -n "${RESUME_SCHEDULE_SAME:-}" ]]; then
  other=$("$bin" "${flags[@]}" --rl-steps 4 --resume "$work/ck" --schedule "$RESUME_SCHEDULE_SAME" | hash)
  echo "resumed under --schedule $RESUME_SCHEDULE_SAME: $other"
  [[ "$other" == "$whole" ]] || { echo "FAILED: --schedule $RESUME_SCHEDULE_SAME resumed elsewhere"; exit 1; }
fi
if [[ -n "${RESUME_SCHEDULE_REFUSED:-}" ]]; then
  if "$bin" "${flags[@]}" --rl-steps 4 --resume "$work/ck" --schedule "$RESUME_SCHEDULE_REFUSED" \
      > "$work/refused2.txt" 2>&1; then
    echo "FAILED: --schedule $RESUME_SCHEDULE_REFUSED resumed a checkpoint of another placement"; exit 1
  fi
  grep -q "expected a checkpoint of the same run" "$work/refused2.txt" \
    || { echo "FAILED: no clear error for another placement"; cat "$work/refused2.txt"; exit 1; }
fi
echo "resume: bit for bit"
