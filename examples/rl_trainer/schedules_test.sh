#!/usr/bin/env bash
# Every pipeline schedule of a placement trains the same model: the same run under --schedule
# 1f1b, gpipe, zb-h1 and zb-h2 (one chunk a rank) ends with the same final parameters (their
# hash), and so does the run under zbv, v-half, v-min and dualpipe-v (two chunks a rank in a V, on
# a 4-layer model), since each stage adds its microbatches' gradients in the same order whatever
# the schedule, and the split backward of the zero-bubble schedules equals the fused one bit for
# bit. (The placements differ from each other only in the rounding of the gradient norm's sum, a
# --check run's business.) Also: a bad --schedule, and a pipeline deeper than the model, are
# refused by name.
#   schedules_test.sh RL_TRAINER [flags...]
set -euo pipefail
bin=$1; shift
hash() { grep "final parameters" | awk '{print $NF}'; }
same() {  # same EXTRA_FLAGS SCHEDULE...
  local extra=$1; shift
  local want="" got
  for s in "$@"; do
    # shellcheck disable=SC2086
    got=$("$bin" "${args[@]}" $extra --schedule "$s" | hash)
    echo "--schedule $s $extra: final parameters $got"
    [[ -n "$got" ]] || { echo "FAILED: no final parameters line"; exit 1; }
    [[ -z "$want" || "$got" == "$want" ]] || { echo "FAILED: $s differs from $1"; exit 1; }
    want=$got
  done
}
args=("$@")
if [[ -n "${SCHEDULES_SANITIZED:-}" ]]; then
  # Under a sanitizer (CI's asan and tsan stages) two of each placement: the fused and the split
  # backward, and the V schedules with and without DualPipeV's overlapped pairs run the same
  # stage and executor code as the rest, which the default suite compares.
  same "" 1f1b zb-h1
  same "--layers 4" zbv dualpipe-v
else
  same "" 1f1b gpipe zb-h1 zb-h2
  same "--layers 4" zbv v-half v-min dualpipe-v
fi
refused=$(mktemp)
trap 'rm -f "$refused"' EXIT
expect_refused() {  # expect_refused MESSAGE FLAGS...
  local message=$1; shift
  if "$bin" "${args[@]}" "$@" > /dev/null 2> "$refused"; then
    echo "FAILED: $* was accepted"; exit 1
  fi
  grep -qF -- "$message" "$refused" || { echo "FAILED: no clear error for $*"; cat "$refused"; exit 1; }
}
expect_refused "argument \`--schedule\`: expected 1f1b, gpipe, zb-h1, zb-h2, interleaved, zbv, v-half, v-min, dualpipe-v, vocab-1 or vocab-2, actual \`chimera\`" --schedule chimera
expect_refused "argument \`--pp x --tp\`: expected at most 14 (the vocabulary's tokens: every pipeline and tp rank holds one) under --schedule vocab-2, actual 16" --schedule vocab-2 --pp 4 --tp 4 --layers 4
expect_refused "argument \`--layers\`: expected at least 2 x pp = 4 under --schedule zbv (two chunks a rank, each at least a block), actual 2" --schedule zbv
expect_refused "argument \`--pp\`: expected at most --layers = 2 (every stage holds a block), actual 3" --pp 3
echo "schedules: bit for bit"
