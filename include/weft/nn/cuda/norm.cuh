// weft/nn/cuda/norm.cuh — CUDA kernels for LayerNorm and RMSNorm over contiguous rows x [N, C]:
// one block per row reduces the row's sums with CUB (two-pass statistics, as the CPU path), then
// every element goes through the CPU path's WEFT_HD pieces (nn::norm_elem). The weight gradients
// ACCUMULATE, by chunked column sums over the rows (detail/column_sums.cuh).
#pragma once

#if !defined(__CUDACC__)
#error "weft/nn/cuda/norm.cuh holds CUDA kernels: include it only from .cu files compiled by nvcc"
#endif

#include <weft/core/config.hpp>
#include <weft/core/dtype.hpp>
#include <weft/core/error.hpp>
#include <weft/nn/cuda/detail/column_sums.cuh>
#include <weft/nn/norm.hpp>

#include <cub/block/block_reduce.cuh>
#include <cuda_runtime_api.h>

#include <cstdint>

#if !WEFT_HAS_CUDA_RUNTIME
#error "weft/nn/cuda/norm.cuh needs WEFT_HAS_CUDA_RUNTIME=1 (link weft::cuda)"
#endif

namespace weft::nn::kernels {

inline constexpr int norm_block = 256;

namespace norm_detail {

// Block-wide sum of one value per thread, broadcast to every thread (the temp storage is reused
// by the next call, hence the barrier before returning).
template <int Block, class C>
__device__ C block_sum(C v, typename cub::BlockReduce<C, Block>::TempStorage& temp, C& shared) {
  C const total = cub::BlockReduce<C, Block>(temp).Sum(v);
  if (threadIdx.x == 0) shared = total;
  __syncthreads();
  C const out = shared;
  __syncthreads();
  return out;
}

inline void check_rows(std::int64_t rows, std::int64_t cols) {
  WEFT_EXPECTS(rows >= 0, "rows", ">= 0", rows);
  WEFT_EXPECTS(cols >= 0, "cols", ">= 0", cols);
  WEFT_EXPECTS(rows <= std::int64_t{0x7fffffff}, "rows", "<= 2^31 - 1 (one block per row)", rows);
}

}  // namespace norm_detail

//! LayerNorm forward, one block per row: y = (x − mean)·rstd·w (+ b), saves mean and rstd.
template <int Block, class T>
__global__ void __launch_bounds__(Block)
    layer_norm_forward_kernel(T const* __restrict__ x, T const* __restrict__ w,
                              T const* __restrict__ b, T* __restrict__ y, compute_t<T>* mean,
                              compute_t<T>* rstd, std::int64_t cols, compute_t<T> eps) {
  using C = compute_t<T>;
  using E = norm_elem<C>;
  __shared__ typename cub::BlockReduce<C, Block>::TempStorage temp;
  __shared__ C shared;
  std::int64_t const r = blockIdx.x;
  T const* xr = x + r * cols;
  T* yr = y + r * cols;
  C s = C(0);
  for (std::int64_t j = threadIdx.x; j < cols; j += Block) s += static_cast<C>(xr[j]);
  C const mu = E::mean(norm_detail::block_sum<Block>(s, temp, shared), cols);
  C q = C(0);
  for (std::int64_t j = threadIdx.x; j < cols; j += Block) {
    C const d = static_cast<C>(xr[j]) - mu;
    q += d * d;
  }
  C const rs = E::rstd(norm_detail::block_sum<Block>(q, temp, shared), cols, eps);
  for (std::int64_t j = threadIdx.x; j < cols; j += Block) {
    C v = E::ln_y(static_cast<C>(xr[j]), mu, rs, static_cast<C>(w[j]));
    if (b != nullptr) v += static_cast<C>(b[j]);
    yr[j] = static_cast<T>(v);
  }
  if (threadIdx.x == 0) {
    mean[r] = mu;
    rstd[r] = rs;
  }
}

//! LayerNorm input gradient, one block per row (overwrites dx).
template <int Block, class T>
__global__ void __launch_bounds__(Block)
    layer_norm_backward_input_kernel(T const* __restrict__ dy, T const* __restrict__ x,
                                     T const* __restrict__ w, compute_t<T> const* mean,
                                     compute_t<T> const* rstd, T* __restrict__ dx,
                                     std::int64_t cols) {
  using C = compute_t<T>;
  using E = norm_elem<C>;
  __shared__ typename cub::BlockReduce<C, Block>::TempStorage temp;
  __shared__ C shared;
  std::int64_t const r = blockIdx.x;
  T const* gr = dy + r * cols;
  T const* xr = x + r * cols;
  T* dr = dx + r * cols;
  C const mu = mean[r], rs = rstd[r];
  C s_dn = C(0), s_dnn = C(0);
  for (std::int64_t j = threadIdx.x; j < cols; j += Block) {
    C const dn = static_cast<C>(w[j]) * static_cast<C>(gr[j]);
    s_dn += dn;
    s_dnn += E::ln_dnn(dn, static_cast<C>(xr[j]), mu, rs);
  }
  C const inv_n = E::inv_count(cols);
  C const m_dn = norm_detail::block_sum<Block>(s_dn, temp, shared) * inv_n;
  C const m_dnn = norm_detail::block_sum<Block>(s_dnn, temp, shared) * inv_n;
  for (std::int64_t j = threadIdx.x; j < cols; j += Block) {
    C const dn = static_cast<C>(w[j]) * static_cast<C>(gr[j]);
    dr[j] = static_cast<T>(E::ln_dx(dn, static_cast<C>(xr[j]), mu, rs, m_dn, m_dnn));
  }
}

//! LayerNorm's weight and bias gradient terms of row r, column j (column_detail::column_sums).
template <class T>
struct layer_norm_weight_terms {
  T const* dy;
  T const* x;
  compute_t<T> const* mean;
  compute_t<T> const* rstd;
  std::int64_t cols;
  __device__ void operator()(std::int64_t r, std::int64_t j, compute_t<T> (&acc)[2]) const {
    using C = compute_t<T>;
    C const g = static_cast<C>(dy[r * cols + j]);
    acc[0] += norm_elem<C>::ln_dw(g, static_cast<C>(x[r * cols + j]), mean[r], rstd[r]);
    acc[1] += g;
  }
};

//! RMSNorm forward, one block per row: y = x·rstd·w, saves rstd.
template <int Block, class T>
__global__ void __launch_bounds__(Block)
    rms_norm_forward_kernel(T const* __restrict__ x, T const* __restrict__ w, T* __restrict__ y,
                            compute_t<T>* rstd, std::int64_t cols, compute_t<T> eps) {
  using C = compute_t<T>;
  using E = norm_elem<C>;
  __shared__ typename cub::BlockReduce<C, Block>::TempStorage temp;
  __shared__ C shared;
  std::int64_t const r = blockIdx.x;
  T const* xr = x + r * cols;
  T* yr = y + r * cols;
  C ss = C(0);
  for (std::int64_t j = threadIdx.x; j < cols; j += Block) {
    C const v = static_cast<C>(xr[j]);
    ss += v * v;
  }
  C const rs = E::rstd(norm_detail::block_sum<Block>(ss, temp, shared), cols, eps);
  for (std::int64_t j = threadIdx.x; j < cols; j += Block)
    yr[j] = static_cast<T>(E::rms_y(static_cast<C>(xr[j]), rs, static_cast<C>(w[j])));
  if (threadIdx.x == 0) rstd[r] = rs;
}

//! RMSNorm input gradient, one block per row (overwrites dx).
template <int Block, class T>
__global__ void __launch_bounds__(Block)
    rms_norm_backward_input_kernel(T const* __restrict__ dy, T const* __restrict__ x,
                                   T const* __restrict__ w, compute_t<T> const* rstd,
                                   T* __restrict__ dx, std::int64_t cols) {
  using C = compute_t<T>;
  using E = norm_elem<C>;
  __shared__ typename cub::BlockReduce<C, Block>::TempStorage temp;
  __shared__ C shared;
  std::int64_t const r = blockIdx.x;
  T const* gr = dy + r * cols;
  T const* xr = x + r * cols;
  T* dr = dx + r * cols;
  C const rs = rstd[r];
  C s = C(0);
  for (std::int64_t j = threadIdx.x; j < cols; j += Block)
    s += E::rms_dnn(static_cast<C>(w[j]), static_cast<C>(gr[j]), static_cast<C>(xr[j]), rs);
  C const m = E::mean(norm_detail::block_sum<Block>(s, temp, shared), cols);
  for (std::int64_t j = threadIdx.x; j < cols; j += Block)
    dr[j] = static_cast<T>(
        E::rms_dx(static_cast<C>(w[j]), static_cast<C>(gr[j]), static_cast<C>(xr[j]), rs, m));
}

//! RMSNorm's weight gradient term of row r, column j (column_detail::column_sums).
template <class T>
struct rms_norm_weight_term {
  T const* dy;
  T const* x;
  compute_t<T> const* rstd;
  std::int64_t cols;
  __device__ void operator()(std::int64_t r, std::int64_t j, compute_t<T> (&acc)[1]) const {
    using C = compute_t<T>;
    acc[0] += norm_elem<C>::rms_dw(static_cast<C>(dy[r * cols + j]),
                                   static_cast<C>(x[r * cols + j]), rstd[r]);
  }
};

// ---- launches (asynchronous on `stream`; every pointer is device memory, rows contiguous) ------

//! LayerNorm forward of x [rows, cols]: y [rows, cols], mean and rstd [rows] (compute type);
//! bias may be null (no bias). eps > 0.
template <class T>
void layer_norm_forward(cudaStream_t stream, T const* x, T const* weight, T const* bias, T* y,
                        compute_t<T>* mean, compute_t<T>* rstd, std::int64_t rows,
                        std::int64_t cols, double eps = 1e-5) {
  norm_detail::check_rows(rows, cols);
  nn::detail::check_eps<T>(eps);
  if (rows == 0) return;
  layer_norm_forward_kernel<norm_block, T><<<static_cast<unsigned>(rows), norm_block, 0, stream>>>(
      x, weight, bias, y, mean, rstd, cols, static_cast<compute_t<T>>(eps));
  WEFT_CUDA_TRY(cudaGetLastError());
}

//! LayerNorm input gradient: dx [rows, cols] (overwritten) from dy, x, weight and the saved
//! mean and rstd.
template <class T>
void layer_norm_backward_input(cudaStream_t stream, T const* dy, T const* x, T const* weight,
                               compute_t<T> const* mean, compute_t<T> const* rstd, T* dx,
                               std::int64_t rows, std::int64_t cols) {
  norm_detail::check_rows(rows, cols);
  if (rows == 0) return;
  layer_norm_backward_input_kernel<norm_block, T>
      <<<static_cast<unsigned>(rows), norm_block, 0, stream>>>(dy, x, weight, mean, rstd, dx, cols);
  WEFT_CUDA_TRY(cudaGetLastError());
}

//! dweight += Σ_rows n̂·dy, dbias += Σ_rows dy (ACCUMULATE); dbias may be null (no bias).
template <class T>
void layer_norm_backward_weight(cudaStream_t stream, T const* dy, T const* x,
                                compute_t<T> const* mean, compute_t<T> const* rstd, T* dweight,
                                T* dbias, std::int64_t rows, std::int64_t cols) {
  norm_detail::check_rows(rows, cols);
  column_detail::column_sums<2, T>(stream, layer_norm_weight_terms<T>{dy, x, mean, rstd, cols},
                                   column_detail::outputs<T, 2>{{dweight, dbias}}, rows, cols);
}

//! RMSNorm forward of x [rows, cols]: y [rows, cols], rstd [rows] (compute type). eps > 0.
template <class T>
void rms_norm_forward(cudaStream_t stream, T const* x, T const* weight, T* y, compute_t<T>* rstd,
                      std::int64_t rows, std::int64_t cols, double eps = 1e-6) {
  norm_detail::check_rows(rows, cols);
  nn::detail::check_eps<T>(eps);
  if (rows == 0) return;
  rms_norm_forward_kernel<norm_block, T><<<static_cast<unsigned>(rows), norm_block, 0, stream>>>(
      x, weight, y, rstd, cols, static_cast<compute_t<T>>(eps));
  WEFT_CUDA_TRY(cudaGetLastError());
}

//! RMSNorm input gradient: dx [rows, cols] (overwritten) from dy, x, weight and the saved rstd.
template <class T>
void rms_norm_backward_input(cudaStream_t stream, T const* dy, T const* x, T const* weight,
                             compute_t<T> const* rstd, T* dx, std::int64_t rows,
                             std::int64_t cols) {
  norm_detail::check_rows(rows, cols);
  if (rows == 0) return;
  rms_norm_backward_input_kernel<norm_block, T>
      <<<static_cast<unsigned>(rows), norm_block, 0, stream>>>(dy, x, weight, rstd, dx, cols);
  WEFT_CUDA_TRY(cudaGetLastError());
}

//! dweight += Σ_rows x·rstd·dy (ACCUMULATES).
template <class T>
void rms_norm_backward_weight(cudaStream_t stream, T const* dy, T const* x,
                              compute_t<T> const* rstd, T* dweight, std::int64_t rows,
                              std::int64_t cols) {
  norm_detail::check_rows(rows, cols);
  column_detail::column_sums<1, T>(stream, rms_norm_weight_term<T>{dy, x, rstd, cols},
                                   column_detail::outputs<T, 1>{{dweight}}, rows, cols);
}

}  // namespace weft::nn::kernels
