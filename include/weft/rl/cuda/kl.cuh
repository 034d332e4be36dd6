// weft/rl/cuda/kl.cuh — the KL estimators on the GPU: per-token values and gradients through the
// CPU path's WEFT_HD functor (rl::kl_token), masked tokens 0, and the KL loss term (the weighted
// masked sum, reduced in double with cub::DeviceReduce, and its gradient added into dlogp).
#pragma once

#if !defined(__CUDACC__)
#error "weft/rl/cuda/kl.cuh holds CUDA kernels: include it only from .cu files compiled by nvcc"
#endif

#include <weft/core/config.hpp>
#include <weft/core/error.hpp>
#include <weft/rl/kl.hpp>

#include <cub/device/device_reduce.cuh>
#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>

#if !WEFT_HAS_CUDA_RUNTIME
#error "weft/rl/cuda/kl.cuh needs WEFT_HAS_CUDA_RUNTIME=1 (link weft::cuda)"
#endif

namespace weft::rl::kernels {

//! value[k], grad[k] (grad may be null) = kl_token(logp[k], ref_logp[k]) on valid tokens (mask
//! not M{}, rl::detail::valid's test), 0 elsewhere.
template <class T, class M>
__global__ void kl_penalty_kernel(kl_token<T> fn, T const* __restrict__ logp,
                                  T const* __restrict__ ref_logp, M const* __restrict__ mask,
                                  T* __restrict__ value, T* __restrict__ grad, std::int64_t n) {
  std::int64_t const k = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (k >= n) return;
  bool const v = mask[k] != M{};
  auto const r = v ? fn(logp[k], ref_logp[k]) : kl_value<T>{T(0), T(0)};
  value[k] = r.value;
  if (grad != nullptr) grad[k] = r.grad;
}

//! contrib[k] = w·k(l, l_ref) in double and dlogp[k] += coef·w·k'(l) on valid tokens (contrib 0
//! elsewhere, dlogp untouched), as rl::kl_loss's loop.
template <class T, class M>
__global__ void kl_loss_kernel(kl_token<T> fn, T coef, T const* __restrict__ logp,
                               T const* __restrict__ ref_logp, M const* __restrict__ mask,
                               T const* __restrict__ weights, T* __restrict__ dlogp,
                               double* __restrict__ contrib, std::int64_t n) {
  std::int64_t const k = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (k >= n) return;
  if (!(mask[k] != M{})) {
    contrib[k] = 0.0;
    return;
  }
  auto const r = fn(logp[k], ref_logp[k]);
  contrib[k] = static_cast<double>(weights[k]) * static_cast<double>(r.value);
  dlogp[k] += coef * weights[k] * r.grad;
}

template <class D>
__global__ void kl_scale_kernel(D* out, D coef) {
  *out *= coef;
}

//! Per-token estimator values (and d/dl into grad unless it is null) for n tokens; masked tokens
//! 0. Device pointers; asynchronous on `stream`.
template <class T, class M>
void kl_penalty(cudaStream_t stream, kl_kind kind, T const* logp, T const* ref_logp, M const* mask,
                T* value, T* grad, std::int64_t n) {
  WEFT_EXPECTS(n >= 0, "n", ">= 0", n);
  if (n == 0) return;
  constexpr int block = 256;
  kl_penalty_kernel<T, M><<<static_cast<unsigned>((n + block - 1) / block), block, 0, stream>>>(
      kl_token<T>{kind}, logp, ref_logp, mask, value, grad, n);
  WEFT_CUDA_TRY(cudaGetLastError());
}

//! KL as a loss term (rl::kl_loss): *loss = coef·Σ_valid w·k(l, l_ref) (device double; the sum in
//! double over a fixed tree, within a few ulp of the CPU's serial sum), and dlogp += coef·w·k'(l)
//! on valid tokens. Asynchronous on `stream` (stream-ordered scratch).
template <class T, class M>
void kl_loss(cudaStream_t stream, kl_kind kind, double coef, T const* logp, T const* ref_logp,
             M const* mask, T const* weights, T* dlogp, std::int64_t n, double* loss) {
  WEFT_EXPECTS(n >= 0, "n", ">= 0", n);
  std::size_t temp_bytes = 0;
  WEFT_CUDA_TRY(cub::DeviceReduce::Sum(nullptr, temp_bytes, static_cast<double const*>(nullptr),
                                       loss, n, stream));
  std::size_t const contrib_bytes =
      (static_cast<std::size_t>(n) * sizeof(double) + 255) / 256 * 256;
  void* scratch = nullptr;
  WEFT_CUDA_TRY(cudaMallocAsync(&scratch, contrib_bytes + temp_bytes + 1, stream));
  auto* const contrib = static_cast<double*>(scratch);
  void* const temp = static_cast<unsigned char*>(scratch) + contrib_bytes;
  constexpr int block = 256;
  if (n > 0) {
    kl_loss_kernel<T, M><<<static_cast<unsigned>((n + block - 1) / block), block, 0, stream>>>(
        kl_token<T>{kind}, static_cast<T>(coef), logp, ref_logp, mask, weights, dlogp, contrib, n);
    WEFT_CUDA_TRY(cudaGetLastError());
  }
  WEFT_CUDA_TRY(cub::DeviceReduce::Sum(temp, temp_bytes, static_cast<double const*>(contrib), loss,
                                       n, stream));
  kl_scale_kernel<double><<<1, 1, 0, stream>>>(loss, coef);
  WEFT_CUDA_TRY(cudaGetLastError());
  WEFT_CUDA_TRY(cudaFreeAsync(scratch, stream));
}

}  // namespace weft::rl::kernels
