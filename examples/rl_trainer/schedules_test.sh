#!/usr/bin/env bash
# Every pipeline schedule trains the same model: the same run under --schedule 1f1b, gpipe, zb-h1
# and zb-h2 ends with the same final parameters (their hash), since each stage adds its
# microbatches' gradients in the same order whatever the schedule, and the split backward of the
# zero-bubble schedules equals the fused one bit for bit. Also: a bad --schedule is refused by name.
#   schedules_test.sh RL_TRAINER [flags...]
set -euo pipefail
bin=$1; shift
hash() { grep "final parameters" | awk '{print $NF}'; }
want=""
for s in 1f1b gpipe zb-h1 zb-h2; do
  got=$("$bin" "$@" --schedule "$s" | hash)
  echo "--schedule $s: final parameters $got"
  [[ -n "$got" ]] || { echo "FAILED: no final parameters line"; exit 1; }
  [[ -z "$want" || "$got" == "$want" ]] || { echo "FAILED: $s differs from 1f1b"; exit 1; }
  want=$got
done
refused=$(mktemp)
trap 'rm -f "$refused"' EXIT
if "$bin" "$@" --schedule zbv > /dev/null 2> "$refused"; then
  echo "FAILED: --schedule zbv was accepted"; exit 1
fi
grep -q "argument \`--schedule\`: expected 1f1b, gpipe, zb-h1 or zb-h2, actual \`zbv\`" "$refused" \
  || { echo "FAILED: no clear error for a bad schedule"; cat "$refused"; exit 1; }
echo "schedules: bit for bit"
