// weft/nn/activation.hpp — elementwise activations with closed-form backward: GELU in its tanh
// form (GPT-2's and llm.c's, 0.044715) and SwiGLU, y = silu(a)·b (LLaMA's gated MLP). The
// per-element math is WEFT_HD functors; the host entry points run them over rank-2 views.
//
// Tolerance, as the tests check it: f32 within 1e-6 · max|reference| of f64 (weft::tanh_fn's 4.4
// ulp, or one rounding of the sigmoid, per element). Outputs may be the input itself (same view),
// never a shifted overlap.
#pragma once

#include <weft/core/config.hpp>
#include <weft/core/dtype.hpp>
#include <weft/core/error.hpp>
#include <weft/core/math.hpp>
#include <weft/core/simd.hpp>
#include <weft/core/tensor/view.hpp>
#include <weft/nn/detail/args.hpp>

#include <cuda/std/cmath>

#include <type_traits>

namespace weft::nn {

//! gelu(x) = ½x(1 + tanh(√(2/π)(x + 0.044715x³))).
struct gelu_fn {
  template <class C>
  WEFT_HD WEFT_FORCEINLINE C operator()(C x) const noexcept {
    C const k = C(0.79788456080286535588);  // sqrt(2/pi)
    C const u = k * (x + C(0.044715) * x * x * x);
    return C(0.5) * x * (C(1) + tanh_fn{}(u));
  }
};

//! d gelu / dx = ½(1 + t) + ½x(1 − t²)·√(2/π)(1 + 3·0.044715x²), t = tanh(√(2/π)(x + 0.044715x³)).
struct gelu_grad_fn {
  template <class C>
  WEFT_HD WEFT_FORCEINLINE C operator()(C x) const noexcept {
    C const k = C(0.79788456080286535588);
    C const t = tanh_fn{}(k * (x + C(0.044715) * x * x * x));
    C const sech2 = C(1) - t * t;
    // Past |x| = 1e4 tanh has saturated (sech² = 0) in float and double alike, so clamping x in
    // the derivative's second term changes nothing but keeps x² finite (0·inf would be NaN).
    C const hi = select(x > C(1e4), C(1e4), x);
    C const xs = select(hi < C(-1e4), C(-1e4), hi);
    C const tail = xs * sech2 * k * (C(1) + C(3) * C(0.044715) * xs * xs);
    return C(0.5) * (C(1) + t) + C(0.5) * tail;
  }
};

//! silu(a)·b with silu(a) = a·σ(a) (σ never overflows: stable_sigmoid).
struct swiglu_fn {
  template <class C>
  WEFT_HD C operator()(C a, C b) const noexcept {
    return a * stable_sigmoid(a) * b;
  }
};

//! ∂/∂a and ∂/∂b of silu(a)·b times dy: da = dy·b·σ(a)(1 + a(1 − σ(a))), db = dy·a·σ(a).
struct swiglu_grad_fn {
  template <class C>
  WEFT_HD void operator()(C a, C b, C dy, C& da, C& db) const noexcept {
    C const s = stable_sigmoid(a);
    da = dy * b * s * (C(1) + a * (C(1) - s));
    db = dy * a * s;
  }
};

namespace detail {

// Same shape, same element type; an output may be an input exactly (elementwise, same index), but
// no other overlap.
template <class Out, class In>
void check_elementwise(Out const& out, char const* out_name, In const& in, char const* in_name) {
  static_assert(std::is_same_v<value_t<Out>, value_t<In>>,
                "weft::nn: elementwise arguments must hold the same element type");
  static_assert(is_nn_element_v<value_t<Out>>,
                "weft::nn: elements must be float, double, weft::bf16 or weft::f16");
  WEFT_EXPECTS_SHAPE(ext(out, 0) == ext(in, 0) && ext(out, 1) == ext(in, 1), out_name,
                     ::weft::detail::concat(shape_string(in), " (", in_name, "'s shape)"),
                     shape_string(out));
}
template <class Out, class In>
void check_same_or_apart(Out const& out, char const* out_name, In const& in, char const* in_name) {
  bool const same =
      static_cast<void const*>(out.data_handle()) == static_cast<void const*>(in.data_handle()) &&
      (out.size() <= 1 || (out.stride(0) == in.stride(0) && out.stride(1) == in.stride(1)));
  if (!same) check_no_overlap(out, out_name, in, in_name);
}

// Row by row, each row in blocks of 16 (core/simd.hpp's for_each_blocked), so that GCC's -O2
// vectoriser takes the elementwise loops.
template <class F>
void for_each_index(index_t n, index_t c, F&& f) {
  for (index_t i = 0; i < n; ++i)
    ::weft::detail::for_each_blocked(0, c, [&](index_t j) WEFT_LAMBDA_INLINE { f(i, j); });
}

// Whether a view's rows are contiguous (unit column stride), so they can be walked by pointer.
template <class V>
bool unit_rows(V const& v) {
  return v.stride(1) == 1;
}

// GELU over one contiguous float row (y may be x, dx may be dy): blocks of 16 that GCC vectorises,
// compiled again for AVX2+FMA and AVX-512 and picked at run time like flash attention's row loops
// (core/simd.hpp); the ISAs differ only by FMA contraction, within a few ulp of each other.
WEFT_FORCEINLINE void gelu_forward_row_body(float const* x, float* y, index_t n) noexcept {
  ::weft::detail::for_each_blocked(0, n,
                                   [&](index_t j) WEFT_LAMBDA_INLINE { y[j] = gelu_fn{}(x[j]); });
}
WEFT_FORCEINLINE void gelu_backward_row_body(float const* x, float const* dy, float* dx,
                                             index_t n) noexcept {
  ::weft::detail::for_each_blocked(
      0, n, [&](index_t j) WEFT_LAMBDA_INLINE { dx[j] = gelu_grad_fn{}(x[j]) * dy[j]; });
}
#if WEFT_MULTIVERSION
WEFT_TARGET_AVX2 inline void gelu_forward_row_avx2(float const* x, float* y, index_t n) noexcept {
  gelu_forward_row_body(x, y, n);
}
WEFT_TARGET_AVX512 inline void gelu_forward_row_avx512(float const* x, float* y,
                                                       index_t n) noexcept {
  gelu_forward_row_body(x, y, n);
}
WEFT_TARGET_AVX2 inline void gelu_backward_row_avx2(float const* x, float const* dy, float* dx,
                                                    index_t n) noexcept {
  gelu_backward_row_body(x, dy, dx, n);
}
WEFT_TARGET_AVX512 inline void gelu_backward_row_avx512(float const* x, float const* dy, float* dx,
                                                        index_t n) noexcept {
  gelu_backward_row_body(x, dy, dx, n);
}
#endif
inline void gelu_forward_row(float const* x, float* y, index_t n) noexcept {
#if WEFT_MULTIVERSION
  switch (::weft::detail::host_simd_level()) {
    case ::weft::detail::simd_level::avx512: return gelu_forward_row_avx512(x, y, n);
    case ::weft::detail::simd_level::avx2: return gelu_forward_row_avx2(x, y, n);
    case ::weft::detail::simd_level::base: break;
  }
#endif
  gelu_forward_row_body(x, y, n);
}
inline void gelu_backward_row(float const* x, float const* dy, float* dx, index_t n) noexcept {
#if WEFT_MULTIVERSION
  switch (::weft::detail::host_simd_level()) {
    case ::weft::detail::simd_level::avx512: return gelu_backward_row_avx512(x, dy, dx, n);
    case ::weft::detail::simd_level::avx2: return gelu_backward_row_avx2(x, dy, dx, n);
    case ::weft::detail::simd_level::base: break;
  }
#endif
  gelu_backward_row_body(x, dy, dx, n);
}

}  // namespace detail

//! y = gelu(x) elementwise (tanh form). x, y [N, H]; y may be x.
template <class X, class Y>
requires HostArg<X, 2> && HostArg<Y, 2>
void gelu_forward(X&& x, Y&& y) {
  auto const xv = detail::arg_view(x);
  auto const yv = detail::arg_view(y);
  detail::check_elementwise(yv, "y", xv, "x");
  detail::check_same_or_apart(yv, "y", xv, "x");
  using T = detail::value_t<decltype(yv)>;
  using C = compute_t<T>;
  index_t const n = detail::ext(xv, 0), c = detail::ext(xv, 1);
  if (detail::unit_rows(xv) && detail::unit_rows(yv)) {  // raw rows: the loop vectorises
    for (index_t i = 0; i < n && c > 0; ++i) {
      auto const* xr = &detail::at(xv, i, 0);
      auto* yr = &detail::at(yv, i, 0);
      if constexpr (std::is_same_v<T, float>) {
        detail::gelu_forward_row(xr, yr, c);
      } else {
        ::weft::detail::for_each_blocked(0, c, [&](index_t j) WEFT_LAMBDA_INLINE {
          yr[j] = static_cast<T>(gelu_fn{}(static_cast<C>(xr[j])));
        });
      }
    }
    return;
  }
  detail::for_each_index(n, c, [&](index_t i, index_t j) WEFT_LAMBDA_INLINE {
    detail::at(yv, i, j) = static_cast<T>(gelu_fn{}(static_cast<C>(detail::at(xv, i, j))));
  });
}

//! dx = gelu'(x)·dy (overwrites dx), from the forward's input x. dx may be dy.
template <class X, class G, class D>
requires HostArg<X, 2> && HostArg<G, 2> && HostArg<D, 2>
void gelu_backward(X&& x, G&& dy, D&& dx) {
  auto const xv = detail::arg_view(x);
  auto const gv = detail::arg_view(dy);
  auto const dv = detail::arg_view(dx);
  detail::check_elementwise(gv, "dy", xv, "x");
  detail::check_elementwise(dv, "dx", xv, "x");
  detail::check_same_or_apart(dv, "dx", xv, "x");
  detail::check_same_or_apart(dv, "dx", gv, "dy");
  using T = detail::value_t<decltype(dv)>;
  using C = compute_t<T>;
  index_t const n = detail::ext(xv, 0), c = detail::ext(xv, 1);
  if (detail::unit_rows(xv) && detail::unit_rows(gv) && detail::unit_rows(dv)) {
    for (index_t i = 0; i < n && c > 0; ++i) {
      auto const* xr = &detail::at(xv, i, 0);
      auto const* gr = &detail::at(gv, i, 0);
      auto* dr = &detail::at(dv, i, 0);
      if constexpr (std::is_same_v<T, float>) {
        detail::gelu_backward_row(xr, gr, dr, c);
      } else {
        ::weft::detail::for_each_blocked(0, c, [&](index_t j) WEFT_LAMBDA_INLINE {
          dr[j] = static_cast<T>(gelu_grad_fn{}(static_cast<C>(xr[j])) * static_cast<C>(gr[j]));
        });
      }
    }
    return;
  }
  detail::for_each_index(n, c, [&](index_t i, index_t j) WEFT_LAMBDA_INLINE {
    C const g = gelu_grad_fn{}(static_cast<C>(detail::at(xv, i, j)));
    detail::at(dv, i, j) = static_cast<T>(g * static_cast<C>(detail::at(gv, i, j)));
  });
}

//! y = silu(a)·b elementwise. a, b, y [N, H] (a and b are the two halves of the gate projection);
//! y may be a or b.
template <class A, class B, class Y>
requires HostArg<A, 2> && HostArg<B, 2> && HostArg<Y, 2>
void swiglu_forward(A&& a, B&& b, Y&& y) {
  auto const av = detail::arg_view(a);
  auto const bv = detail::arg_view(b);
  auto const yv = detail::arg_view(y);
  detail::check_elementwise(bv, "b", av, "a");
  detail::check_elementwise(yv, "y", av, "a");
  detail::check_same_or_apart(yv, "y", av, "a");
  detail::check_same_or_apart(yv, "y", bv, "b");
  using T = detail::value_t<decltype(yv)>;
  using C = compute_t<T>;
  detail::for_each_index(
      detail::ext(av, 0), detail::ext(av, 1), [&](index_t i, index_t j) WEFT_LAMBDA_INLINE {
        detail::at(yv, i, j) = static_cast<T>(swiglu_fn{}(static_cast<C>(detail::at(av, i, j)),
                                                          static_cast<C>(detail::at(bv, i, j))));
      });
}

//! da, db from dy (overwrite), from the forward's inputs a and b. da and db must not overlap a, b
//! or dy except exactly (da may be dy).
template <class A, class B, class G, class DA, class DB>
requires HostArg<A, 2> && HostArg<B, 2> && HostArg<G, 2> && HostArg<DA, 2> && HostArg<DB, 2>
void swiglu_backward(A&& a, B&& b, G&& dy, DA&& da, DB&& db) {
  auto const av = detail::arg_view(a);
  auto const bv = detail::arg_view(b);
  auto const gv = detail::arg_view(dy);
  auto const dav = detail::arg_view(da);
  auto const dbv = detail::arg_view(db);
  detail::check_elementwise(bv, "b", av, "a");
  detail::check_elementwise(gv, "dy", av, "a");
  detail::check_elementwise(dav, "da", av, "a");
  detail::check_elementwise(dbv, "db", av, "a");
  detail::check_no_overlap(dav, "da", dbv, "db");
  detail::check_same_or_apart(dav, "da", av, "a");
  detail::check_same_or_apart(dav, "da", bv, "b");
  detail::check_same_or_apart(dav, "da", gv, "dy");
  detail::check_same_or_apart(dbv, "db", av, "a");
  detail::check_same_or_apart(dbv, "db", bv, "b");
  detail::check_same_or_apart(dbv, "db", gv, "dy");
  using T = detail::value_t<decltype(dav)>;
  using C = compute_t<T>;
  detail::for_each_index(
      detail::ext(av, 0), detail::ext(av, 1), [&](index_t i, index_t j) WEFT_LAMBDA_INLINE {
        C ga = C(0), gb = C(0);
        swiglu_grad_fn{}(static_cast<C>(detail::at(av, i, j)), static_cast<C>(detail::at(bv, i, j)),
                         static_cast<C>(detail::at(gv, i, j)), ga, gb);
        detail::at(dav, i, j) = static_cast<T>(ga);
        detail::at(dbv, i, j) = static_cast<T>(gb);
      });
}

}  // namespace weft::nn
