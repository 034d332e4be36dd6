#!/usr/bin/env bash
# The reference RL trainer against its PyTorch peer (benchmarks/peers/rl_trainer_torch.py), the
# same specification (issue 13's default run: SFT to 30 %, 150 DAPO steps), in the same run, one
# after the other, OpenBLAS and torch single-threaded. Prints seconds per RL step and per SFT step
# of each and their ratios. The two draw different random numbers (Philox vs torch's generator),
# so their SFT lengths and accuracies differ; the per-step times are what is compared.
#   benchmarks/peers/rl_trainer_compare.sh BUILD_DIR [SEED]
set -euo pipefail
bin="$1/examples/rl_trainer/rl_trainer"
seed=${2:-0}
py=python3
for p in /usr/bin/python3 python3; do
  if "$p" -c "import torch" 2>/dev/null; then py=$p; break; fi
done
export OPENBLAS_NUM_THREADS=1 OMP_NUM_THREADS=1
out=$(mktemp -d)
"$bin" --quiet --seed "$seed" --out "$out" > "$out/weft.txt"
"$py" "$(dirname "$0")/rl_trainer_torch.py" --mode dapo --seed "$seed" --threads 1 > "$out/torch.txt"
"$py" - "$out" <<'PY'
import json, re, sys
out = sys.argv[1]
w = json.load(open(out + "/summary.json"))
t = dict(kv.split("=") for kv in re.search(r"^RESULT (.*)$", open(out + "/torch.txt").read(), re.M).group(1).split())
w_rl, w_sft = w["seconds"]["rl_per_step"], w["seconds"]["sft"] / max(1, w["sft_steps"])
t_rl, t_sft = float(t["s_per_rl_step"]), float(t["s_per_sft_step"])
print(f"weft:    {w_rl*1e3:.1f} ms per RL step, {w_sft*1e3:.2f} ms per SFT step (with its evaluations); "
      f"accuracy {w['acc_after_sft']['sampled']:.3f} -> {w['acc_after_rl']['sampled']:.3f}")
print(f"PyTorch: {t_rl*1e3:.1f} ms per RL step, {t_sft*1e3:.2f} ms per SFT step; "
      f"accuracy {float(t['acc_sft']):.3f} -> {float(t['acc_rl']):.3f}")
print(f"weft is {t_rl/w_rl:.2f}x faster per RL step, {t_sft/w_sft:.2f}x per SFT step")
PY
rm -rf "$out"
