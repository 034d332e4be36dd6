// weft/nn/cuda/embedding.cuh — CUDA kernels for the embedding lookup (out[t] = table[ids[t]]) and
// its backward scatter-add. The backward is deterministic without sorting or atomics: a thread
// owns one column of the table rows r ≡ b (mod buckets) and adds the matching tokens in token
// order, exactly the CPU's per-row order and rounding (bitwise equal to nn::embedding_backward).
#pragma once

#if !defined(__CUDACC__)
#error \
    "weft/nn/cuda/embedding.cuh holds CUDA kernels: include it only from .cu files compiled by nvcc"
#endif

#include <weft/core/config.hpp>
#include <weft/core/cuda/for_each.cuh>
#include <weft/core/dtype.hpp>
#include <weft/core/error.hpp>
#include <weft/core/math.hpp>  // compute_t

#include <cuda_runtime_api.h>

#include <concepts>
#include <cstdint>

#if !WEFT_HAS_CUDA_RUNTIME
#error "weft/nn/cuda/embedding.cuh needs WEFT_HAS_CUDA_RUNTIME=1 (link weft::cuda)"
#endif

namespace weft::nn::kernels {

//! out[k, j] = table[ids[k], j]; an id outside [0, rows) (which the device cannot report) gives
//! a zero row and trips WEFT_ASSERT in debug builds.
template <class I, class T>
struct embedding_forward_op {
  I const* ids;
  T const* table;
  T* out;
  std::int64_t rows, dim;
  WEFT_HD void operator()(std::int64_t e) const noexcept {
    std::int64_t const k = e / dim, j = e % dim;
    auto const r = static_cast<std::int64_t>(ids[k]);
    WEFT_ASSERT(r >= 0 && r < rows);
    out[e] = r >= 0 && r < rows ? table[r * dim + j] : T(0.0f);
  }
};

//! Thread (b, j) adds dout[k, j] into dtable[ids[k], j] for every token k, in order, whose id
//! is ≡ b mod buckets; one rounding per addition, as the CPU.
template <class I, class T>
__global__ void embedding_backward_kernel(I const* __restrict__ ids, std::int64_t tokens,
                                          T const* __restrict__ dout, T* __restrict__ dtable,
                                          std::int64_t rows, std::int64_t dim,
                                          std::int64_t buckets) {
  using C = compute_t<T>;
  std::int64_t const e = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (e >= dim * buckets) return;
  std::int64_t const b = e / dim, j = e % dim;
  for (std::int64_t k = 0; k < tokens; ++k) {
    auto const r = static_cast<std::int64_t>(ids[k]);
    if (r < 0 || r >= rows || r % buckets != b) continue;
    T& d = dtable[r * dim + j];
    d = static_cast<T>(static_cast<C>(d) + static_cast<C>(dout[k * dim + j]));
  }
}

//! out [tokens, dim] = table [rows, dim] gathered by ids [tokens] (device int32/int64 ids in
//! [0, rows): they are device data, so the host cannot check them). Asynchronous on `stream`.
template <std::integral I, class T>
void embedding_forward(cudaStream_t stream, I const* ids, std::int64_t tokens, T const* table,
                       std::int64_t rows, std::int64_t dim, T* out) {
  WEFT_EXPECTS(tokens >= 0, "tokens", ">= 0", tokens);
  WEFT_EXPECTS(rows >= 0, "rows", ">= 0", rows);
  WEFT_EXPECTS(dim >= 0, "dim", ">= 0", dim);
  if (tokens == 0 || dim == 0) return;
  ::weft::detail::launch_for_each_index(stream, tokens * dim,
                                        embedding_forward_op<I, T>{ids, table, out, rows, dim});
}

//! dtable[ids[k], :] += dout[k, :] for k = 0, 1, ... in order (ACCUMULATES; bitwise the CPU's
//! result). Ids outside [0, rows) are skipped. Asynchronous on `stream`.
template <std::integral I, class T>
void embedding_backward(cudaStream_t stream, I const* ids, std::int64_t tokens, T const* dout,
                        T* dtable, std::int64_t rows, std::int64_t dim) {
  WEFT_EXPECTS(tokens >= 0, "tokens", ">= 0", tokens);
  WEFT_EXPECTS(rows >= 0, "rows", ">= 0", rows);
  WEFT_EXPECTS(dim >= 0, "dim", ">= 0", dim);
  if (tokens == 0 || dim == 0 || rows == 0) return;
  // Enough (bucket, column) threads to fill the GPU (~64K), never more buckets than rows.
  std::int64_t buckets = (65536 + dim - 1) / dim;
  if (buckets > 64) buckets = 64;
  if (buckets > rows) buckets = rows;
  std::int64_t const threads = buckets * dim;
  constexpr int block = 256;
  embedding_backward_kernel<I, T>
      <<<static_cast<unsigned>((threads + block - 1) / block), block, 0, stream>>>(
          ids, tokens, dout, dtable, rows, dim, buckets);
  WEFT_CUDA_TRY(cudaGetLastError());
}

}  // namespace weft::nn::kernels
