#!/usr/bin/env bash
# Developer shortcut: compile the given *.test.cpp files (and doctest's main) into one throwaway
# executable under build/dev/ and run it, without touching the CMake build trees. Extra doctest
# options go after `--`. Example: scripts/dev-test.sh tests/core/dtype.test.cpp -- -tc='*decode*'
# Set CXX=clang++ to use clang, SAN=address,undefined or SAN=thread for sanitizers.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cuda_root=""
for c in "${CUDA_PATH:-}" "$(dirname "$(dirname "$(command -v nvcc 2>/dev/null || echo /x/x)")")" /usr/local/cuda; do
  if [[ -n "$c" && -d "$c/include/cccl" ]]; then cuda_root="$c"; break; fi
done
srcs=(); args=()
while (($#)); do
  if [[ "$1" == "--" ]]; then shift; args=("$@"); break; fi
  srcs+=("$1"); shift
done
out="$root/build/dev"; mkdir -p "$out"
name=$(basename "${srcs[0]}" .test.cpp)-$$
flags=(-std=c++20 -O1 -g -Wall -Wextra -Wpedantic -Wshadow -Wconversion -Wno-sign-conversion
       -I "$root/include" -I "$root/tests" -isystem "$cuda_root/include/cccl" -isystem "$cuda_root/include"
       -pthread ${EXTRA_FLAGS:-})
[[ -n "${SAN:-}" ]] && flags+=(-fsanitize="$SAN" -fno-omit-frame-pointer -fno-sanitize-recover=all)
[[ -z "${SAN:-}" || "${SAN:-}" != *thread* ]] && flags+=(-fopenmp)
main_obj="$out/main-${CXX:-g++}-${SAN:-none}.o"
[[ -f "$main_obj" ]] || "${CXX:-g++}" "${flags[@]}" -c "$root/tests/support/main.cpp" -o "$main_obj"
"${CXX:-g++}" "${flags[@]}" "${srcs[@]}" "$main_obj" -o "$out/$name" ${LIBS:-}
set +e
"$out/$name" "${args[@]}"
rc=$?
rm -f "$out/$name"
exit $rc
