// weft/nn/cuda/detail/column_sums.cuh — the column reductions behind the layers' parameter
// gradients on the GPU (linear's dbias, LayerNorm's dweight and dbias, RMSNorm's dweight): out[j]
// += Σ_r term(r, j) over the rows of a [rows, cols] batch, ACCUMULATING into the gradient, in the
// compute type with one rounding per column.
//
// One thread per column over all the rows gives only cols / 256 blocks: 16 blocks for a width of
// 4096, however many rows, so most of a GPU idles while each thread walks 16384 rows in turn. Here
// the rows are cut into chunks: a block sums one chunk of rows for 256 columns (coalesced: a warp
// reads 32 adjacent columns of a row), writes the partial sums in the compute type, and a second
// pass adds, per column, the gradient's old value and the chunks' sums in chunk order. The chunks
// depend only on (rows, cols), so the result is deterministic. A batch that fits in one chunk
// (fewer than 64 rows, or more than half the target grid's blocks in columns alone) is summed
// in one pass exactly as the CPU loops do: the old value first, then the rows in order.
#pragma once

#if !defined(__CUDACC__)
#error \
    "weft/nn/cuda/detail/column_sums.cuh holds CUDA kernels: include it only from .cu files compiled by nvcc"
#endif

#include <weft/core/config.hpp>
#include <weft/core/error.hpp>
#include <weft/core/math.hpp>  // compute_t

#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>

namespace weft::nn::kernels::column_detail {

inline constexpr int block = 256;             // columns per block
inline constexpr std::int64_t min_rows = 32;  // rows per chunk at least
inline constexpr std::int64_t target_blocks = 1024;

//! Up to N gradients of one element type; a null pointer is a gradient not wanted (its terms are
//! summed and dropped).
template <class T, int N>
struct outputs {
  T* p[N];
};

//! How `rows` are cut: `chunks` chunks of `chunk_rows` rows, the last possibly shorter.
struct row_split {
  std::int64_t chunks, chunk_rows;
};

inline row_split split_rows(std::int64_t rows, std::int64_t cols) {
  std::int64_t const col_blocks = (cols + block - 1) / block;
  std::int64_t const by_rows = rows / min_rows;  // so that a chunk has min_rows rows at least
  std::int64_t const by_grid = std::max<std::int64_t>(1, target_blocks / col_blocks);
  std::int64_t const want = std::max<std::int64_t>(1, std::min(by_rows, by_grid));
  std::int64_t const chunk_rows = (rows + want - 1) / want;
  return {(rows + chunk_rows - 1) / chunk_rows, chunk_rows};
}

//! Block (x, y) sums rows [y·chunk_rows, min(rows, (y + 1)·chunk_rows)) of columns
//! [x·block, x·block + block) through `term(r, j, acc)`, which adds its N terms to acc. With
//! partial null (one chunk) it starts from the gradients' values and writes them back rounded;
//! otherwise it writes its sums to partial[(n·chunks + y)·cols + j].
template <int N, class T, class Term>
__global__ void __launch_bounds__(block)
    column_sums_kernel(Term term, compute_t<T>* __restrict__ partial, outputs<T, N> out,
                       std::int64_t rows, std::int64_t cols, std::int64_t chunk_rows) {
  using C = compute_t<T>;
  std::int64_t const j = static_cast<std::int64_t>(blockIdx.x) * block + threadIdx.x;
  if (j >= cols) return;
  std::int64_t const r0 = static_cast<std::int64_t>(blockIdx.y) * chunk_rows;
  std::int64_t const r1 = std::min(rows, r0 + chunk_rows);
  C acc[N];
#pragma unroll
  for (int n = 0; n < N; ++n)
    acc[n] = partial == nullptr && out.p[n] != nullptr ? static_cast<C>(out.p[n][j]) : C(0);
  for (std::int64_t r = r0; r < r1; ++r) term(r, j, acc);
  if (partial == nullptr) {
#pragma unroll
    for (int n = 0; n < N; ++n)
      if (out.p[n] != nullptr) out.p[n][j] = static_cast<T>(acc[n]);
    return;
  }
#pragma unroll
  for (int n = 0; n < N; ++n)
    partial[(static_cast<std::int64_t>(n) * gridDim.y + blockIdx.y) * cols + j] = acc[n];
}

//! out[n][j] = round(out[n][j] + Σ_chunks partial, in chunk order).
template <int N, class T>
__global__ void __launch_bounds__(block)
    column_finish_kernel(compute_t<T> const* __restrict__ partial, std::int64_t chunks,
                         outputs<T, N> out, std::int64_t cols) {
  using C = compute_t<T>;
  std::int64_t const j = static_cast<std::int64_t>(blockIdx.x) * block + threadIdx.x;
  if (j >= cols) return;
#pragma unroll
  for (int n = 0; n < N; ++n) {
    if (out.p[n] == nullptr) continue;
    C acc = static_cast<C>(out.p[n][j]);
    for (std::int64_t c = 0; c < chunks; ++c) acc += partial[(n * chunks + c) * cols + j];
    out.p[n][j] = static_cast<T>(acc);
  }
}

//! out[n][j] += Σ_r term's n-th value at (r, j), for r < rows, j < cols, on `stream`.
template <int N, class T, class Term>
void column_sums(cudaStream_t stream, Term const& term, outputs<T, N> out, std::int64_t rows,
                 std::int64_t cols) {
  if (rows <= 0 || cols <= 0) return;
  bool any = false;
  for (int n = 0; n < N; ++n) any = any || out.p[n] != nullptr;
  if (!any) return;
  row_split const s = split_rows(rows, cols);
  auto const col_blocks = static_cast<unsigned>((cols + block - 1) / block);
  if (s.chunks == 1) {
    column_sums_kernel<N, T>
        <<<col_blocks, block, 0, stream>>>(term, nullptr, out, rows, cols, s.chunk_rows);
    WEFT_CUDA_TRY(cudaGetLastError());
    return;
  }
  using C = compute_t<T>;
  C* partial = nullptr;
  WEFT_CUDA_TRY(cudaMallocAsync(reinterpret_cast<void**>(&partial),
                                static_cast<std::size_t>(N * s.chunks * cols) * sizeof(C), stream));
  column_sums_kernel<N, T><<<dim3(col_blocks, static_cast<unsigned>(s.chunks)), block, 0, stream>>>(
      term, partial, out, rows, cols, s.chunk_rows);
  cudaError_t const launched = cudaGetLastError();
  if (launched == cudaSuccess)
    column_finish_kernel<N, T><<<col_blocks, block, 0, stream>>>(partial, s.chunks, out, cols);
  cudaError_t const finished = launched == cudaSuccess ? cudaGetLastError() : launched;
  WEFT_CUDA_TRY(cudaFreeAsync(partial, stream));
  WEFT_CUDA_TRY(finished);
}

}  // namespace weft::nn::kernels::column_detail
