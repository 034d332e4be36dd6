// weft/nn/cuda/rope.cuh — CUDA kernel for rotary position embedding (rotate-half form) over packed
// rows x [T, H·D]: one thread per (row, pair, head) forms the angle with nn::rope_angle_fn and
// turns the pair with nn::rope_rotate_fn, the CPU path's functors (the backward turns back).
#pragma once

#if !defined(__CUDACC__)
#error "weft/nn/cuda/rope.cuh holds CUDA kernels: include it only from .cu files compiled by nvcc"
#endif

#include <weft/core/config.hpp>
#include <weft/core/cuda/for_each.cuh>
#include <weft/core/dtype.hpp>
#include <weft/core/error.hpp>
#include <weft/nn/rope.hpp>

#include <cuda/std/cmath>
#include <cuda_runtime_api.h>

#include <cmath>
#include <concepts>
#include <cstdint>

namespace weft::nn::kernels {

//! Element e = (r·heads + h)·half + i: the pair (i, i + half) of head h of row r.
template <class I, class T>
struct rope_op {
  T const* x;
  T* y;
  I const* positions;
  std::int64_t width, heads, half;
  rope_angle_fn<compute_t<T>> angle;
  bool inverse;
  WEFT_HD void operator()(std::int64_t e) const noexcept {
    using C = compute_t<T>;
    std::int64_t const i = e % half, rh = e / half;
    std::int64_t const h = rh % heads, r = rh / heads;
    C const a = angle(static_cast<index_t>(positions[r]), static_cast<index_t>(i));
    C const c = ::cuda::std::cos(a), s = ::cuda::std::sin(a);
    std::int64_t const o = r * width + h * 2 * half + i;
    C y1, y2;
    rope_rotate_fn{}(static_cast<C>(x[o]), static_cast<C>(x[o + half]), c, s, inverse, y1, y2);
    y[o] = static_cast<T>(y1);
    y[o + half] = static_cast<T>(y2);
  }
};

namespace rope_detail {
template <class I, class T>
void launch(cudaStream_t stream, T const* x, I const* positions, std::int64_t rows,
            std::int64_t width, std::int64_t head_dim, T* y, double base, bool inverse) {
  using C = compute_t<T>;
  WEFT_EXPECTS(rows >= 0, "rows", ">= 0", rows);
  WEFT_EXPECTS(head_dim > 0 && head_dim % 2 == 0, "head_dim", "an even width > 0", head_dim);
  WEFT_EXPECTS(width >= 0 && width % head_dim == 0, "width", "a multiple of head_dim (whole heads)",
               width);
  WEFT_EXPECTS(std::isfinite(base) && base > 1, "base", "a finite value > 1", base);
  std::int64_t const heads = width / head_dim, half = head_dim / 2;
  if (rows == 0 || heads == 0) return;
  ::weft::detail::launch_for_each_index(
      stream, rows * heads * half,
      rope_op<I, T>{x, y, positions, width, heads, half,
                    rope_angle_fn<C>{static_cast<C>(base), static_cast<index_t>(head_dim)},
                    inverse});
}
}  // namespace rope_detail

//! y = RoPE(x) (y may be x). x, y [rows, width] contiguous, width = H·head_dim; positions [rows]
//! on the device (>= 0: device data the host cannot check). Asynchronous on `stream`.
template <std::integral I, class T>
void rope_forward(cudaStream_t stream, T const* x, I const* positions, std::int64_t rows,
                  std::int64_t width, std::int64_t head_dim, T* y, double base = 10000.0) {
  rope_detail::launch(stream, x, positions, rows, width, head_dim, y, base, false);
}

//! dx = RoPE⁻¹(dy) (dx may be dy).
template <std::integral I, class T>
void rope_backward(cudaStream_t stream, T const* dy, I const* positions, std::int64_t rows,
                   std::int64_t width, std::int64_t head_dim, T* dx, double base = 10000.0) {
  rope_detail::launch(stream, dy, positions, rows, width, head_dim, dx, base, true);
}

}  // namespace weft::nn::kernels
