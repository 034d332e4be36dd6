#!/usr/bin/env bash
# scripts/gpu-check.sh — weft's GPU checks in one command, for a machine with a GPU but no build
# tools of weft's (the CUDA runtime, cuBLAS and NCCL are found where the machine has them).
#
#   bash scripts/gpu-check.sh pack BUILD_DIR [DEST]   (on the build machine) copies the gpu-labelled
#        test programs, rl_trainer_cuda (a build with WEFT_BUILD_EXAMPLES=ON), the CUDA benchmarks,
#        weft.bench.comm and the non-CUDA shared libraries they
#        need (Google Benchmark) from BUILD_DIR (a `cmake --preset cuda`-like build with
#        CMAKE_BUILD_TYPE=Release) into DEST (default .gpubin)
#   bash scripts/gpu-check.sh run [DEST] [OUT]        (on the GPU machine) runs the kernels not yet
#        run on a GPU first (the wgmma_tma flash cases, 120 s at most; where they fail, once more
#        under memcheck, 180 s at most, and left out of the full run below), then every test program
#        (doctest, slow suite excluded), rl_trainer_cuda's two runs, every CUDA benchmark, PyTorch's SDPA peer
#        (benchmarks/peers/sdpa_bench.py, if torch is there) and the 8-byte all_reduce overhead of
#        the straggler monitor (CPU only: a quiet many-core machine); logs go to OUT (default out/);
#        WEFT_GPU_CHECK_NO_PEERS=1 skips the PyTorch peer; WEFT_GPU_CHECK_PROFILE=1 adds an Nsight
#        Compute profile of the wgmma, wgmma_ws and wgmma_tma flash forwards and backwards (d 128,
#        causal)
#        where ncu is installed (out/ncu.txt)
set -uo pipefail
mode=${1:-}
case "$mode" in
  pack)
    build=${2:?usage: gpu-check.sh pack BUILD_DIR [DEST]}
    dest=${3:-.gpubin}
    rm -rf "$dest" && mkdir -p "$dest/lib"
    while IFS= read -r f; do cp "$f" "$dest/"; done < <(
      find "$build" -type f -perm -u+x \( -name 'weft.test.*.cuda' -o -name 'weft.test.nccl.gpu' \
        -o -name 'weft.bench.cuda.*' -o -name 'weft.bench.comm' -o -name 'rl_trainer_cuda' \))
    for f in "$dest"/weft.* "$dest"/rl_trainer_cuda; do
      [[ -e "$f" ]] || continue
      ldd "$f" | awk '/=> \//{print $3}' | grep -E 'libbenchmark|libgomp|libopenblas|libblas|libgfortran|libquadmath' || true
    done | sort -u | while IFS= read -r l; do cp -L "$l" "$dest/lib/"; done
    ls -la "$dest" "$dest/lib"
    du -sh "$dest"
    ;;
  run)
    dest=${2:-.gpubin}
    out=${3:-${OUT:-out}}
    mkdir -p "$out"
    # The CUDA libraries: the toolkit's, else the ones pip installed beside PyTorch.
    extra=""
    for lib in libcudart.so.13 libcublas.so.13 libcublasLt.so.13 libnccl.so.2; do
      p=$(find /usr/local/cuda*/lib* /usr/lib/x86_64-linux-gnu /usr/local/lib /opt -name "$lib" 2>/dev/null | head -1)
      [[ -n "$p" ]] && extra="$extra:$(dirname "$p")"
    done
    export LD_LIBRARY_PATH="$dest/lib$extra:${LD_LIBRARY_PATH:-}"
    {
      nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.max.sm,clocks.max.mem --format=csv
      echo "LD_LIBRARY_PATH=$LD_LIBRARY_PATH"
      nproc
    } > "$out/machine.txt" 2>&1
    cat "$out/machine.txt"
    # The kernels not yet run on a GPU go first, alone and on a short leash (a pipeline that never
    # completes costs 120 s, not the whole program's 300); where they fail, the full run below
    # leaves them out so that the other cases still report.
    fresh='*on wgmma_tma*'
    skip_fresh=()
    : > "$out/tests.log"
    if [[ -x "$dest/weft.test.attention.cuda" ]]; then
      {
        echo "=== weft.test.attention.cuda ($fresh first)"
        timeout 120 "$dest/weft.test.attention.cuda" --test-case="$fresh"
        rc=$?
        echo "$rc" > "$out/fresh.rc"
        echo "=== weft.test.attention.cuda ($fresh first) rc=$rc"
      } 2>&1 | tee -a "$out/tests.log"
      if [[ "$(cat "$out/fresh.rc")" != 0 ]]; then
        skip_fresh=(--test-case-exclude="$fresh")
        # What went wrong, for the next change: the failing case once under memcheck (an access
        # out of bounds or a misaligned TMA address names its kernel and line), at most 180 s.
        if command -v compute-sanitizer >/dev/null 2>&1; then
          echo "=== weft.test.attention.cuda ($fresh) memcheck after its failure"
          timeout 180 compute-sanitizer --tool memcheck --error-exitcode 1 \
            "$dest/weft.test.attention.cuda" --test-case="$fresh"
          echo "=== weft.test.attention.cuda ($fresh) memcheck rc=$?"
        fi 2>&1 | tee -a "$out/tests.log"
      fi
    fi
    for t in "$dest"/weft.test.*; do
      echo "=== $(basename "$t")"
      if [[ $(basename "$t") == weft.test.attention.cuda ]]; then
        timeout 300 "$t" --test-suite-exclude=slow "${skip_fresh[@]}"
      else
        timeout 300 "$t" --test-suite-exclude=slow
      fi
      rc=$?
      echo "=== $(basename "$t") rc=$rc"
    done 2>&1 | tee -a "$out/tests.log"
    # The GPU decoder, the sampler, the row scans and the wgmma flash kernels once more under
    # compute-sanitizer's memcheck, where it is installed: an access past a row or a cache slot
    # but inside an allocation changes no result. (doctest splits a --test-case filter at commas:
    # the filters name no comma.)
    if command -v compute-sanitizer >/dev/null 2>&1; then
      for pair in "weft.test.nn.cuda|*cuda_gpt_decoder*" "weft.test.rl.cuda|*rl/cuda: GAE*" \
        "weft.test.rl.cuda|*sample_tokens*" "weft.test.attention.cuda|*on wgmma*"; do
        prog="${pair%%|*}" cases="${pair#*|}"
        [[ -x "$dest/$prog" ]] || continue
        echo "=== $prog memcheck ($cases)"
        extra=()
        [[ $prog == weft.test.attention.cuda ]] && extra=("${skip_fresh[@]}")
        timeout 600 compute-sanitizer --tool memcheck --error-exitcode 1 "$dest/$prog" \
          --test-case="$cases" "${extra[@]}"
        echo "=== $prog memcheck rc=$?"
      done
      # The wgmma flash forwards' buffers change hands between cp.async groups, warpgroups and
      # asynchronous MMAs: racecheck for shared-memory hazards.
      if [[ -x "$dest/weft.test.attention.cuda" ]]; then
        echo "=== weft.test.attention.cuda racecheck (*on wgmma*)"
        timeout 600 compute-sanitizer --tool racecheck --error-exitcode 1 \
          "$dest/weft.test.attention.cuda" --test-case='*on wgmma*' "${skip_fresh[@]}"
        echo "=== weft.test.attention.cuda racecheck rc=$?"
      fi
      # The sampler's block hands the row's peak, mass and each tile's first draw through shared
      # memory between cub's block reductions and scan.
      if [[ -x "$dest/weft.test.rl.cuda" ]]; then
        echo "=== weft.test.rl.cuda racecheck (*sample_tokens*)"
        timeout 300 compute-sanitizer --tool racecheck --error-exitcode 1 \
          "$dest/weft.test.rl.cuda" --test-case='*sample_tokens*'
        echo "=== weft.test.rl.cuda racecheck rc=$?"
      fi
    fi 2>&1 | tee -a "$out/tests.log"
    # The reference trainer's model step on the GPU: the f64 run against the one-rank CPU run
    # (--check), then the README's smoke run in f32 (the ctest cases examples/rl_trainer/cuda_*).
    if [[ -x "$dest/rl_trainer_cuda" ]]; then
      rl=(--sft-steps 300 --rl-steps 4 --eval-prompts 50 --quiet --check)
      echo "=== rl_trainer_cuda f64 check"
      timeout 600 "$dest/rl_trainer_cuda" --device cuda --f64 "${rl[@]}"
      echo "=== rl_trainer_cuda f64 check rc=$?"
      echo "=== rl_trainer_cuda dp 2 f64 check"
      timeout 600 "$dest/rl_trainer_cuda" --device cuda --dp 2 --f64 "${rl[@]}"
      echo "=== rl_trainer_cuda dp 2 f64 check rc=$?"
      echo "=== rl_trainer_cuda smoke"
      timeout 300 "$dest/rl_trainer_cuda" --device cuda --preset smoke
      echo "=== rl_trainer_cuda smoke rc=$?"
    fi 2>&1 | tee -a "$out/tests.log"
    for b in "$dest"/weft.bench.cuda.*; do
      echo "=== $(basename "$b")"
      timeout 240 "$b" --benchmark_min_time=0.1 --benchmark_counters_tabular=true 2>&1
    done 2>&1 | tee "$out/bench.log"
    if [[ -z "${WEFT_GPU_CHECK_NO_PEERS:-}" ]] && python3 -c 'import torch' 2>/dev/null; then
      timeout 240 python3 benchmarks/peers/sdpa_bench.py 2>&1 | tee "$out/sdpa.log"
    fi
    if [[ -x "$dest/weft.bench.comm" ]]; then
      timeout 150 "$dest/weft.bench.comm" --benchmark_filter='all_reduce_8B|straggler_detector' \
        --benchmark_repetitions=15 --benchmark_enable_random_interleaving=true \
        --benchmark_report_aggregates_only=true 2>&1 | tee "$out/comm.log"
    fi
    ncu=$(command -v ncu || ls /usr/local/cuda*/bin/ncu 2>/dev/null | head -1)
    if [[ -n "${WEFT_GPU_CHECK_PROFILE:-}" && -n "$ncu" && -x "$dest/weft.bench.cuda.flash" ]]; then
      # kernel|flags (wgmma 1: the wgmma set, automatic's forward at d 128; 2: wgmma_ws, its
      # forward and the two-warpgroup backward, automatic's backward; 4: wgmma_tma's forward and
      # TMA backward).
      for pass in "forward_kernel_wgmma|bwd:0/wgmma:1" "backward_kernel_wgmma|bwd:1/wgmma:1" \
        "forward_kernel_wgmma_ws|bwd:0/wgmma:2" "backward_kernel_wgmma|bwd:1/wgmma:2" \
        "forward_kernel_wgmma_tma|bwd:0/wgmma:4" "backward_kernel_wgmma_tma|bwd:1/wgmma:4"; do
        echo "##### ${pass%%|*} ${pass#*|}"
        timeout 120 "$ncu" -k "regex:^${pass%%|*}\$" --launch-skip 1 --launch-count 1 \
          --section SpeedOfLight --section WarpStateStats --section SchedulerStats \
          --section ComputeWorkloadAnalysis --section MemoryWorkloadAnalysis --section Occupancy \
          --section LaunchStats --section InstructionStats "$dest/weft.bench.cuda.flash" \
          --benchmark_filter="BM_flash/B:4/S:4096/H:16/d:128/causal:1/${pass#*|}"
      done > "$out/ncu.txt" 2>&1
    fi
    grep -E '=== .* rc=' "$out/tests.log"
    ;;
  *)
    echo "usage: gpu-check.sh pack BUILD_DIR [DEST] | run [DEST] [OUT]" >&2
    exit 2
    ;;
esac
