// weft/nn/cuda/activation.cuh — CUDA kernels for GELU (tanh form) and SwiGLU forward/backward over
// contiguous buffers: a grid-stride loop (core/cuda/for_each.cuh) calling the CPU path's WEFT_HD
// functors (gelu_fn, gelu_grad_fn, swiglu_fn, swiglu_grad_fn) in the compute type.
#pragma once

#if !defined(__CUDACC__)
#error \
    "weft/nn/cuda/activation.cuh holds CUDA kernels: include it only from .cu files compiled by nvcc"
#endif

#include <weft/core/config.hpp>
#include <weft/core/cuda/for_each.cuh>
#include <weft/core/dtype.hpp>
#include <weft/core/error.hpp>
#include <weft/nn/activation.hpp>

#include <cuda_runtime_api.h>

#include <cstdint>

namespace weft::nn::kernels {

//! y[i] = gelu(x[i]).
template <class T>
struct gelu_forward_op {
  T const* x;
  T* y;
  WEFT_HD void operator()(std::int64_t i) const noexcept {
    y[i] = static_cast<T>(gelu_fn{}(static_cast<compute_t<T>>(x[i])));
  }
};

//! dx[i] = gelu'(x[i])·dy[i].
template <class T>
struct gelu_backward_op {
  T const* x;
  T const* dy;
  T* dx;
  WEFT_HD void operator()(std::int64_t i) const noexcept {
    using C = compute_t<T>;
    dx[i] = static_cast<T>(gelu_grad_fn{}(static_cast<C>(x[i])) * static_cast<C>(dy[i]));
  }
};

//! y[i] = silu(a[i])·b[i].
template <class T>
struct swiglu_forward_op {
  T const* a;
  T const* b;
  T* y;
  WEFT_HD void operator()(std::int64_t i) const noexcept {
    using C = compute_t<T>;
    y[i] = static_cast<T>(swiglu_fn{}(static_cast<C>(a[i]), static_cast<C>(b[i])));
  }
};

//! da[i], db[i] from dy[i].
template <class T>
struct swiglu_backward_op {
  T const* a;
  T const* b;
  T const* dy;
  T* da;
  T* db;
  WEFT_HD void operator()(std::int64_t i) const noexcept {
    using C = compute_t<T>;
    C ga = C(0), gb = C(0);
    swiglu_grad_fn{}(static_cast<C>(a[i]), static_cast<C>(b[i]), static_cast<C>(dy[i]), ga, gb);
    da[i] = static_cast<T>(ga);
    db[i] = static_cast<T>(gb);
  }
};

// ---- launches (asynchronous on `stream`; every pointer is device memory of n elements) --------
// As on the CPU, an output may be its input exactly (y = x, dx = dy, da = dy), never a shifted
// overlap; da and db must not overlap.

//! y = gelu(x) elementwise.
template <class T>
void gelu_forward(cudaStream_t stream, T const* x, T* y, std::int64_t n) {
  WEFT_EXPECTS(n >= 0, "n", ">= 0", n);
  ::weft::detail::launch_for_each_index(stream, n, gelu_forward_op<T>{x, y});
}

//! dx = gelu'(x)·dy (overwrites dx).
template <class T>
void gelu_backward(cudaStream_t stream, T const* x, T const* dy, T* dx, std::int64_t n) {
  WEFT_EXPECTS(n >= 0, "n", ">= 0", n);
  ::weft::detail::launch_for_each_index(stream, n, gelu_backward_op<T>{x, dy, dx});
}

//! y = silu(a)·b elementwise.
template <class T>
void swiglu_forward(cudaStream_t stream, T const* a, T const* b, T* y, std::int64_t n) {
  WEFT_EXPECTS(n >= 0, "n", ">= 0", n);
  ::weft::detail::launch_for_each_index(stream, n, swiglu_forward_op<T>{a, b, y});
}

//! da, db (overwritten) from dy and the forward's a and b.
template <class T>
void swiglu_backward(cudaStream_t stream, T const* a, T const* b, T const* dy, T* da, T* db,
                     std::int64_t n) {
  WEFT_EXPECTS(n >= 0, "n", ">= 0", n);
  WEFT_EXPECTS(n == 0 || da != db, "da", "a buffer apart from db", "db's pointer");
  ::weft::detail::launch_for_each_index(stream, n, swiglu_backward_op<T>{a, b, dy, da, db});
}

}  // namespace weft::nn::kernels
