// weft/core/cuda/for_each.cuh — the CUDA kernel behind for_each_index(exec::cuda, n, f): a
// grid-stride loop calling a WEFT_HD functor once per index. Included by weft/core/exec.hpp in
// nvcc translation units; g++ translation units get a static_assert from exec.hpp instead.
#pragma once

#if !defined(__CUDACC__)
#error "weft/core/cuda/for_each.cuh holds CUDA kernels: include it only from .cu files (nvcc)"
#endif

#include <weft/core/config.hpp>
#include <weft/core/error.hpp>

#include <cuda_runtime_api.h>

#include <cstdint>

#if !WEFT_HAS_CUDA_RUNTIME
#error "weft/core/cuda/for_each.cuh needs WEFT_HAS_CUDA_RUNTIME=1 (link weft::cuda)"
#endif

namespace weft::detail {

// A template, like every weft kernel, so that each TU instantiates it without ODR clashes. The
// functor is called through a const reference: every thread shares the one kernel parameter.
template <class F>
__global__ void for_each_index_kernel(std::int64_t n, F f) {
  F const& fc = f;
  std::int64_t const step = static_cast<std::int64_t>(gridDim.x) * blockDim.x;
  for (std::int64_t i = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += step)
    fc(i);
}

//! Launches for_each_index_kernel on `stream` (asynchronous; launch errors throw backend_error).
template <class F>
void launch_for_each_index(cudaStream_t stream, std::int64_t n, F const& f) {
  if (n <= 0) return;
  constexpr int block = 256;
  // The grid-stride loop covers any n, so the grid is capped well below gridDim.x's 2^31 - 1.
  constexpr std::int64_t max_blocks = std::int64_t{1} << 20;
  std::int64_t const wanted = (n + block - 1) / block;
  auto const blocks = static_cast<unsigned>(wanted < max_blocks ? wanted : max_blocks);
  for_each_index_kernel<F><<<blocks, block, 0, stream>>>(n, f);
  WEFT_CUDA_TRY(cudaGetLastError());
}

}  // namespace weft::detail
