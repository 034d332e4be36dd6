#!/usr/bin/env bash
# Checkpoint and resume continue bit for bit: N RL steps in one process, and a new process
# resuming the checkpoint written after N/2 steps, give the same final parameters (their hash)
# and the same metric history (every column but the timings). The checkpoint comes from a second
# uninterrupted run that also saves (after steps 2 and 4, `latest` then pointed back at step 2),
# which must itself end as the run without saves does: saving only reads the state. Also: a
# checkpoint of another run is refused, naming the flags of both. RESUME_SAME="FLAGS[|FLAGS...]":
# the checkpoint also resumes under each set of flags (appended: another schedule of the
# placement, dp 1 for dp 2, the host for the CPU engine) to the same bits, as those layouts'
# uninterrupted runs are. Layouts that round differently are reshard_test.sh's. RESUME_MPI=
# "MPIEXEC NP": the checkpoint is written by NP MPI processes instead (MPI runs are the threads'
# bit for bit, and so must be their checkpoint). RESUME_SANITIZED=1 (CI's sanitizer builds): no run
# without saves; the saving run is the reference (the default suite shows the two equal).
#   resume_test.sh RL_TRAINER WORK_DIR [layout flags...]
set -euo pipefail
bin=$1; work=$2; shift 2
rm -rf "$work" && mkdir -p "$work"
flags=(--sft-steps 30 --eval-prompts 50 --quiet "$@")
hash() { grep "final parameters" | awk '{print $NF}'; }
rows4() {  # the reference run printed a hash and wrote 4 metric rows
  [[ -n "$whole" && $(wc -l < "$work/whole/metrics.csv") -eq 5 ]] \
    || { echo "FAILED: the run printed no hash or not 4 metric rows"; exit 1; }
}
if [[ -z "${RESUME_SANITIZED:-}" || -n "${RESUME_MPI:-}" ]]; then
  whole=$("$bin" "${flags[@]}" --rl-steps 4 --out "$work/whole" | hash)
  rows4
fi
if [[ -n "${RESUME_MPI:-}" ]]; then
  read -r mpiexec np <<< "$RESUME_MPI"
  "$mpiexec" --oversubscribe --allow-run-as-root -n "$np" "$bin" --backend mpi "${flags[@]}" \
    --rl-steps 2 --save "$work/ck" > /dev/null
else
  out=()  # sanitized: the saving run is the reference
  [[ -n "${RESUME_SANITIZED:-}" ]] && out=(--out "$work/whole")
  saving=$("$bin" "${flags[@]}" --rl-steps 4 --save "$work/ck" --save-every 2 "${out[@]}" | hash)
  if [[ -n "${RESUME_SANITIZED:-}" ]]; then
    whole=$saving
    rows4
  else
    echo "whole run: $whole; the same run saving after steps 2 and 4: $saving"
    [[ "$saving" == "$whole" ]] || { echo "FAILED: saving changed the run"; exit 1; }
  fi
  [[ $(cat "$work/ck/latest") == step_4 ]] || { echo "FAILED: latest is not step_4"; exit 1; }
  echo step_2 > "$work/ck/latest"
fi
[[ -f "$work/ck/step_2/model.bin" ]] || { echo "FAILED: no $work/ck/step_2/model.bin"; exit 1; }
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
if [[ -n "${RESUME_SAME:-}" ]]; then
  IFS='|' read -ra sets <<< "$RESUME_SAME"
  for set in "${sets[@]}"; do
    read -ra extra <<< "$set"
    other=$("$bin" "${flags[@]}" --rl-steps 4 --resume "$work/ck" "${extra[@]}" | hash)
    echo "resumed under ${extra[*]}: $other"
    [[ "$other" == "$whole" ]] || { echo "FAILED: ${extra[*]} resumed elsewhere"; exit 1; }
  done
fi
echo "resume: bit for bit"
