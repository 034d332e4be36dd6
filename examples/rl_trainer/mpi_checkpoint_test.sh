#!/usr/bin/env bash
# Checkpoints over MPI are the thread ranks' bit for bit (an MPI run is the threads' run of the
# same flags, bit for bit, and so must be what it saves and what it resumes):
# - save: X = pp 2 x tp 2 + SP, vocabulary 1F1B, 4 processes; rank 0 gathers the stages', the tp
#   shards' and the vocabulary shards' parameters and moments over MPI. Its checkpoint after 2 RL
#   steps holds the same bits as the thread ranks' of the same flags.
# - resume: Y = dp 2 x tp 2 + SP with ZeRO-1, 4 processes, each reading that checkpoint and
#   cutting its tp shard and its ZeRO-1 part; 2 more RL steps give the thread ranks' final
#   parameters (hash) and metrics, and Y's own checkpoint (the moments gathered over the data
#   group over MPI first) the threads' bits.
# f64, GRPO, 30 SFT steps.
#   mpi_checkpoint_test.sh MPIEXEC RL_TRAINER WORK_DIR
set -euo pipefail
mpiexec=$1; bin=$2; work=$3; shift 3
rm -rf "$work" && mkdir -p "$work"
here=$(dirname "${BASH_SOURCE[0]}")
run=(--f64 --mode grpo --sft-steps 30 --eval-prompts 20 --quiet "$@")
X=(--pp 2 --tp 2 --sp --schedule vocab-1)
Y=(--dp 2 --tp 2 --sp --zero1)
mpi() { "$mpiexec" --oversubscribe --allow-run-as-root -n 4 "$bin" --backend mpi "$@"; }
hash() { grep "final parameters" | awk '{print $NF}'; }
same() { python3 "$here/checkpoint_close.py" "$1" "$2" "$3" 0; }
"$bin" "${run[@]}" "${X[@]}" --rl-steps 2 --save "$work/ckT" > /dev/null
mpi "${run[@]}" "${X[@]}" --rl-steps 2 --save "$work/ckM" > /dev/null
same "$work/ckT/step_2/model.bin" "$work/ckM/step_2/model.bin" "X saved over MPI"
t=$("$bin" "${run[@]}" "${Y[@]}" --rl-steps 4 --resume "$work/ckT" --out "$work/T" \
  --save "$work/ckTY" | hash)
m=$(mpi "${run[@]}" "${Y[@]}" --rl-steps 4 --resume "$work/ckM" --out "$work/M" \
  --save "$work/ckMY" | hash)
echo "Y resumed on thread ranks: $t; over MPI: $m"
[[ -n "$t" && "$t" == "$m" ]] || { echo "FAILED: the final parameters differ"; exit 1; }
python3 "$here/metrics_close.py" "$work/T/metrics.csv" "$work/M/metrics.csv" "Y resumed" 0
same "$work/ckTY/step_4/model.bin" "$work/ckMY/step_4/model.bin" "Y saved over MPI"
echo "mpi checkpoint: bit for bit"
