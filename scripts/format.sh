#!/usr/bin/env bash
# Formats weft's C++ and CUDA sources with the checked-in .clang-format (clang-format 14, as Debian
# 12 ships it: other major versions format some constructs differently). With --check, changes
# nothing and exits 1, listing the files that differ, when any tracked source is not formatted.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

cf=""
for c in clang-format-14 clang-format; do
  if command -v "$c" >/dev/null 2>&1; then cf=$c; break; fi
done
if [[ -z "$cf" ]]; then echo "format: clang-format not found (bash scripts/install-deps.sh)" >&2; exit 2; fi
major=$("$cf" --version | sed -E 's/.*version ([0-9]+).*/\1/')
if [[ "$major" != 14 ]]; then
  echo "format: $cf is version $major; the rule is checked with clang-format 14" >&2
fi

mapfile -t files < <(git ls-files '*.hpp' '*.cpp' '*.cuh' '*.cu' '*.h')
if [[ "${1:-}" == "--check" ]]; then
  bad=()
  for f in "${files[@]}"; do
    if ! "$cf" --style=file --dry-run -Werror "$f" >/dev/null 2>&1; then bad+=("$f"); fi
  done
  if ((${#bad[@]})); then
    echo "format: ${#bad[@]} of ${#files[@]} files differ from .clang-format (run scripts/format.sh):"
    printf '  %s\n' "${bad[@]}"
    exit 1
  fi
  echo "format: ${#files[@]} files match .clang-format ($cf)"
else
  "$cf" --style=file -i "${files[@]}"
  echo "format: formatted ${#files[@]} files with $cf"
fi
