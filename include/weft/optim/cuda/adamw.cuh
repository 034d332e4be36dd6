// weft/optim/cuda/adamw.cuh — fused AdamW over one contiguous device parameter buffer (the CPU
// path's WEFT_HD per-element update, optim::detail::adamw_element, with the same scalars), and
// the global gradient norm's sum of squares with cub::DeviceReduce plus clipping by it.
#pragma once

#if !defined(__CUDACC__)
#error \
    "weft/optim/cuda/adamw.cuh holds CUDA kernels: include it only from .cu files compiled by nvcc"
#endif

#include <weft/core/config.hpp>
#include <weft/core/cuda/for_each.cuh>
#include <weft/core/error.hpp>
#include <weft/optim/adamw.hpp>
#include <weft/optim/clip.hpp>
#include <weft/optim/param.hpp>

#include <cub/device/device_reduce.cuh>
#include <cuda/std/functional>
#include <cuda_runtime_api.h>

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <span>
#include <type_traits>

#if !WEFT_HAS_CUDA_RUNTIME
#error "weft/optim/cuda/adamw.cuh needs WEFT_HAS_CUDA_RUNTIME=1 (link weft::cuda)"
#endif

namespace weft::optim::kernels {

//! One AdamW step on every element (grid-stride): the CPU path's adamw_element.
template <class T, bool SmallWeight>
__global__ void adamw_kernel(T* __restrict__ p, T const* __restrict__ g, T* __restrict__ m,
                             T* __restrict__ v, std::int64_t n,
                             optim::detail::adamw_element<T, SmallWeight> f) {
  std::int64_t const step = static_cast<std::int64_t>(gridDim.x) * blockDim.x;
  for (std::int64_t i = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += step) {
    T pi = p[i], mi = m[i], vi = v[i];
    f(pi, g[i], mi, vi);
    p[i] = pi;
    m[i] = mi;
    v[i] = vi;
  }
}

namespace adamw_detail {

template <class T, bool SmallWeight>
void launch_adamw(cudaStream_t stream, T* p, T const* g, T* m, T* v, std::int64_t n,
                  optim::detail::adamw_scalars<T> const& s) {
  if (n <= 0) return;
  constexpr int block = 256;
  constexpr std::int64_t max_blocks = std::int64_t{1} << 16;
  std::int64_t const wanted = (n + block - 1) / block;
  auto const blocks = static_cast<unsigned>(wanted < max_blocks ? wanted : max_blocks);
  adamw_kernel<T, SmallWeight><<<blocks, block, 0, stream>>>(
      p, g, m, v, n, optim::detail::adamw_element<T, SmallWeight>{s});
  WEFT_CUDA_TRY(cudaGetLastError());
}

//! x·x in double, the CPU norm's per-element term.
template <class T>
struct square_as_double {
  WEFT_HD double operator()(T x) const noexcept {
    auto const d = static_cast<double>(x);
    return d * d;
  }
};

//! g[i] *= f.
template <class T>
struct scale_op {
  T* g;
  T f;
  WEFT_HD void operator()(std::int64_t i) const noexcept { g[i] *= f; }
};

}  // namespace adamw_detail

//! One AdamW step (step count `step` >= 1, the value torch's state["step"] has after its
//! increment; learning rate lr >= 0) over the device buffers params, grads, m and v, laid out as
//! `layout` (param_info counts in buffer order; `decay` false skips weight decay), each element
//! updated exactly as optim::adamw<T>::step updates it. T is float or double. Asynchronous on
//! `stream`. Throws invalid_argument_error before any launch for bad options, lr or step.
template <class T>
void adamw_step(cudaStream_t stream, std::span<param_info const> layout, T* params, T const* grads,
                T* m, T* v, adamw_options const& options, std::int64_t step, double lr) {
  static_assert(std::is_same_v<T, float> || std::is_same_v<T, double>,
                "weft::optim::kernels::adamw_step: T must be float or double");
  validate(options);
  WEFT_EXPECTS(lr >= 0.0, "lr", ">= 0", lr);
  WEFT_EXPECTS(step >= 1, "step", ">= 1 (the count after this step's increment)", step);
  auto s = optim::detail::make_adamw_scalars<T>(options, step, lr);
  T const decay = s.decay;
  std::size_t offset = 0;
  for (auto const& p : layout) {
    if (p.count == 0) continue;
    s.decay = p.decay ? decay : T(1);
    auto const n = static_cast<std::int64_t>(p.count);
    if (s.w1_small)
      adamw_detail::launch_adamw<T, true>(stream, params + offset, grads + offset, m + offset,
                                          v + offset, n, s);
    else
      adamw_detail::launch_adamw<T, false>(stream, params + offset, grads + offset, m + offset,
                                           v + offset, n, s);
    offset += p.count;
  }
}

//! adamw_step over `n` elements that all decay.
template <class T>
void adamw_step(cudaStream_t stream, T* params, T const* grads, T* m, T* v, std::int64_t n,
                adamw_options const& options, std::int64_t step, double lr) {
  WEFT_EXPECTS(n >= 0, "n", ">= 0", n);
  param_info const one{static_cast<std::size_t>(n)};
  adamw_step(stream, std::span<param_info const>(&one, 1), params, grads, m, v, options, step, lr);
}

//! Bytes of device scratch grad_norm_squared needs for n elements.
template <class T>
std::size_t grad_norm_squared_temp_bytes(std::int64_t n) {
  WEFT_EXPECTS(n >= 0, "n", ">= 0", n);
  std::size_t bytes = 0;
  WEFT_CUDA_TRY(cub::DeviceReduce::TransformReduce(
      nullptr, bytes, static_cast<T const*>(nullptr), static_cast<double*>(nullptr), n,
      ::cuda::std::plus<double>{}, adamw_detail::square_as_double<T>{}, 0.0));
  return bytes;
}

//! *out = Σ g[i]² over n device elements, in double (cub::DeviceReduce: a fixed tree, so the same
//! on every run on one GPU; within a few ulp of the CPU's serial double sum). `temp` holds
//! grad_norm_squared_temp_bytes<T>(n) bytes. Asynchronous on `stream`; out is device memory.
template <class T>
void grad_norm_squared(cudaStream_t stream, T const* grads, std::int64_t n, double* out, void* temp,
                       std::size_t temp_bytes) {
  WEFT_EXPECTS(n >= 0, "n", ">= 0", n);
  std::size_t const need = grad_norm_squared_temp_bytes<T>(n);
  WEFT_EXPECTS(temp_bytes >= need, "temp_bytes", need, temp_bytes);
  WEFT_CUDA_TRY(cub::DeviceReduce::TransformReduce(
      temp, temp_bytes, grads, out, n, ::cuda::std::plus<double>{},
      adamw_detail::square_as_double<T>{}, 0.0, stream));
}

//! g[i] *= factor over n device elements (asynchronous on `stream`).
template <class T>
void scale_grads(cudaStream_t stream, T* grads, std::int64_t n, T factor) {
  WEFT_EXPECTS(n >= 0, "n", ">= 0", n);
  ::weft::detail::launch_for_each_index(stream, n, adamw_detail::scale_op<T>{grads, factor});
}

//! torch's clip_grad_norm_ over one device buffer: the 2-norm (grad_norm_squared, then sqrt on the
//! host), then g *= clip_coefficient(norm, max_norm) rounded once to T. Synchronises `stream` to
//! read the norm; returns it. max_norm >= 0, checked first.
template <class T>
double clip_grad_norm(cudaStream_t stream, T* grads, std::int64_t n, double max_norm, void* temp,
                      std::size_t temp_bytes, double* norm_sq) {
  WEFT_EXPECTS(max_norm >= 0.0, "max_norm", ">= 0", max_norm);
  grad_norm_squared(stream, static_cast<T const*>(grads), n, norm_sq, temp, temp_bytes);
  double host = 0.0;
  WEFT_CUDA_TRY(cudaMemcpyAsync(&host, norm_sq, sizeof(double), cudaMemcpyDeviceToHost, stream));
  WEFT_CUDA_TRY(cudaStreamSynchronize(stream));
  double const norm = std::sqrt(host);
  scale_grads(stream, grads, n, static_cast<T>(clip_coefficient(norm, max_norm)));
  return norm;
}

}  // namespace weft::optim::kernels
