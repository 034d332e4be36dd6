#!/usr/bin/env bash
# Proves that .ci/run turns red when a test fails: runs its `tests` stage with the planted
# canary (WEFT_CI_CANARY=1) and requires a non-zero exit caused by that very test.
set -uo pipefail
src=${1:?usage: canary.sh <weft source dir>}
log=$(mktemp)
trap 'rm -f "$log"' EXIT
WEFT_CI_CANARY=1 WEFT_CI_STAGES=tests bash "$src/.ci/run" >"$log" 2>&1
rc=$?
tail -n 25 "$log"
if ((rc == 0)); then
  echo "canary: .ci/run exited 0 although the planted failing test ran"
  exit 1
fi
if ! grep -q "ci canary: fails when WEFT_CI_CANARY=1 .*Failed" "$log"; then
  echo "canary: .ci/run failed (exit $rc), but not because of the planted test"
  exit 1
fi
if ! grep -q "^+ .*ctest --preset default" "$log"; then
  echo "canary: .ci/run's tests stage did not run the README's ctest command"
  exit 1
fi
if ! grep -q "stages: 0 passed, 1 failed" "$log"; then
  echo "canary: .ci/run's summary does not report the failed stage"
  exit 1
fi
echo "canary: .ci/run exited $rc with the planted test failing, as it must"
