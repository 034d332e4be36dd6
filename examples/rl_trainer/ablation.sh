#!/usr/bin/env bash
# The ablation of docs/trainer.md: GRPO vs DAPO (verl's whole-round refill) vs DAPO (refill sized
# from the keep rate), 3 seeds each, plus the zero-advantage control, on the default regime (SFT
# to 30 % sampled exact match) and a harder one (a high-accuracy start: SFT to 70 %, where most
# groups are all correct and dynamic sampling has to work). Prints a markdown table of the
# held-out accuracies and the samples generated (the compute), and leaves each run's
# metrics.csv, summary.json and plots under OUT.
#
#   examples/rl_trainer/ablation.sh BUILD_DIR [OUT]      (BUILD_DIR: where rl_trainer was built)
set -euo pipefail
bin="$1/examples/rl_trainer/rl_trainer"
out="${2:-rl_ablation}"
[[ -x "$bin" ]] || { echo "ablation: $bin not found (build the rl_trainer target)" >&2; exit 2; }
mkdir -p "$out"
run() {  # name, flags...
  local name=$1; shift
  [[ -f "$out/$name/summary.json" ]] && return 0  # done in an earlier, interrupted call
  "$bin" --quiet --out "$out/$name" "$@" > "$out/$name.log"
}
for regime in default high; do
  extra=()
  [[ $regime == high ]] && extra=(--sft-target 0.7)
  for seed in 0 1 2; do
    run "$regime-grpo-s$seed" --mode grpo --seed $seed "${extra[@]}"
    run "$regime-dapo-s$seed" --mode dapo --seed $seed "${extra[@]}"
    run "$regime-dapo_sized-s$seed" --mode dapo --refill sized --seed $seed "${extra[@]}"
    [[ $regime == default ]] && run "$regime-zero_adv-s$seed" --mode dapo --zero-advantage --seed $seed
  done
done
python3 - "$out" <<'PY'
import json, os, sys
out = sys.argv[1]
rows = {}
for name in sorted(os.listdir(out)):
    p = os.path.join(out, name, "summary.json")
    if not os.path.isfile(p):
        continue
    s = json.load(open(p))
    key = name.rsplit("-s", 1)[0]
    rows.setdefault(key, []).append(s)
print("| regime / method | seeds | SFT steps | sampled acc after SFT | after RL | gain | greedy after SFT | after RL | samples generated | s per RL step |")
print("|---|---|---|---|---|---|---|---|---|---|")
for key, ss in rows.items():
    n = len(ss)
    f = lambda k, j: sum(s[k][j] for s in ss) / n
    a0, a1 = f("acc_after_sft", "sampled"), f("acc_after_rl", "sampled")
    g0, g1 = f("acc_after_sft", "greedy"), f("acc_after_rl", "greedy")
    per = " / ".join(f'{s["acc_after_sft"]["sampled"]:.3f}->{s["acc_after_rl"]["sampled"]:.3f}' for s in ss)
    print(f'| {key} | {n} | {sum(s["sft_steps"] for s in ss)/n:.0f} | {a0:.3f} | {a1:.3f} ({per}) | {a1-a0:+.3f} | {g0:.3f} | {g1:.3f} | {sum(s["samples_generated"] for s in ss)/n:.0f} | {sum(s["seconds"]["rl_per_step"] for s in ss)/n:.3f} |')

# The figure: sampled accuracy of every generated sample (rollout/acc, mean of 10 steps) against
# samples generated, one line per seed, a panel per regime.
import csv
colors = {"grpo": "#1f77b4", "dapo": "#d62728", "dapo_sized": "#2ca02c", "zero_adv": "#7f7f7f"}
W, H, pad = 420, 300, 45
svg = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{2*W}" height="{H+30}" font-family="sans-serif" font-size="11">']
for k, regime in enumerate(["default", "high"]):
    runs = {}
    for name in sorted(os.listdir(out)):
        p = os.path.join(out, name, "metrics.csv")
        if name.startswith(regime + "-") and os.path.isfile(p):
            rows = list(csv.DictReader(open(p)))
            xs = [float(r["samples"]) for r in rows]
            ys = [float(r["rollout/acc"]) for r in rows]
            sm = [sum(ys[max(0, i - 9):i + 1]) / len(ys[max(0, i - 9):i + 1]) for i in range(len(ys))]
            runs[name] = (name.split("-")[1], xs, sm)
    if not runs:
        continue
    x1 = max(max(r[1]) for r in runs.values())
    y0 = min(min(r[2]) for r in runs.values()); y1 = max(max(r[2]) for r in runs.values())
    ox = k * W
    svg.append(f'<rect x="{ox+pad}" y="20" width="{W-pad-10}" height="{H-pad-10}" fill="none" stroke="#999"/>')
    svg.append(f'<text x="{ox+pad}" y="14">{regime} start: rollout accuracy ({y0:.2f}..{y1:.2f}) vs samples generated (0..{x1:.0f})</text>')
    for m, xs, ys in runs.values():
        pts = " ".join(f'{ox+pad+x/x1*(W-pad-10):.1f},{20+(1-(y-y0)/(y1-y0+1e-12))*(H-pad-10):.1f}' for x, y in zip(xs, ys))
        svg.append(f'<polyline fill="none" stroke="{colors.get(m, "#000")}" stroke-width="1" points="{pts}"/>')
for i, (m, c) in enumerate(colors.items()):
    svg.append(f'<text x="{pad+i*110}" y="{H+20}" fill="{c}">{m}</text>')
svg.append("</svg>")
open(os.path.join(out, "ablation.svg"), "w").write("\n".join(svg) + "\n")
PY
