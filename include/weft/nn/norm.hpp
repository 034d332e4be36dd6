// weft/nn/norm.hpp — LayerNorm and RMSNorm over the last dimension of x [N, C], with llm.c's
// backward split: the input gradient (overwrites dx) and the weight/bias gradients (ACCUMULATE).
// The forward saves each row's mean and rstd (compute type: f32 for f32/bf16/f16, f64 for f64).
//
// Statistics are two-pass (mean, then Σ(x − mean)²), so a row far from 0 keeps its variance; a
// zero-variance row gives rstd = 1/sqrt(eps) and n̂ = 0, finite. Tolerance, as the tests check it:
// f32 results are within 1e-5 · max|reference| of f64 for rows of a few hundred elements.
#pragma once

#include <weft/core/config.hpp>
#include <weft/core/dtype.hpp>
#include <weft/core/error.hpp>
#include <weft/core/math.hpp>
#include <weft/core/tensor/view.hpp>
#include <weft/nn/detail/args.hpp>
#include <weft/nn/detail/rows.hpp>

#include <cuda/std/cmath>

#include <cmath>
#include <type_traits>

namespace weft::nn {

// ---- row math (WEFT_HD: the CUDA path runs the same functors per row)
// ----------------------------

//! The per-element pieces of the row functors below, shared with the CUDA kernels
//! (nn/cuda/norm.cuh), which reduce a row's sums in a block and then apply the same pieces.
template <class C>
struct norm_elem {
  //! Σ/n, 0 for an empty row (LayerNorm's mean from Σx).
  static WEFT_HD C mean(C sum, index_t n) noexcept {
    return n > 0 ? sum / static_cast<C>(n) : C(0);
  }
  //! 1/sqrt(Σ/n + eps): LayerNorm's rstd from Σ(x − mean)², RMSNorm's from Σx².
  static WEFT_HD C rstd(C sum_sq, index_t n, C eps) noexcept {
    C const ms = n > 0 ? sum_sq / static_cast<C>(n) : C(0);
    return C(1) / ::cuda::std::sqrt(ms + eps);
  }
  //! 1/n, 0 for an empty row.
  static WEFT_HD C inv_count(index_t n) noexcept { return n > 0 ? C(1) / static_cast<C>(n) : C(0); }
  //! LayerNorm's (x − mean)·rstd·w (the bias is added by the caller).
  static WEFT_HD C ln_y(C x, C mean, C rstd, C w) noexcept { return (x - mean) * rstd * w; }
  //! LayerNorm backward's dn·n̂ with dn = w·dy, n̂ = (x − mean)·rstd.
  static WEFT_HD C ln_dnn(C dn, C x, C mean, C rstd) noexcept { return dn * (x - mean) * rstd; }
  //! LayerNorm's dx = rstd·(dn − mean(dn) − n̂·mean(dn·n̂)).
  static WEFT_HD C ln_dx(C dn, C x, C mean, C rstd, C m_dn, C m_dnn) noexcept {
    C const nh = (x - mean) * rstd;
    return rstd * (dn - m_dn - nh * m_dnn);
  }
  //! LayerNorm's weight-gradient term n̂·dy, n̂ = (x − mean)·rstd.
  static WEFT_HD C ln_dw(C dy, C x, C mean, C rstd) noexcept { return ((x - mean) * rstd) * dy; }
  //! RMSNorm's weight-gradient term x·rstd·dy.
  static WEFT_HD C rms_dw(C dy, C x, C rstd) noexcept { return x * rstd * dy; }
  //! RMSNorm's x·rstd·w.
  static WEFT_HD C rms_y(C x, C rstd, C w) noexcept { return x * rstd * w; }
  //! RMSNorm backward's w·dy·x·rstd (dn·n̂).
  static WEFT_HD C rms_dnn(C w, C dy, C x, C rstd) noexcept { return w * dy * x * rstd; }
  //! RMSNorm's dx = rstd·(w·dy − x·rstd·m), m = mean(dn·n̂).
  static WEFT_HD C rms_dx(C w, C dy, C x, C rstd, C m) noexcept {
    C const dn = w * dy;
    return rstd * (dn - x * rstd * m);
  }
};

//! LayerNorm of one row of n elements: y = (x − mean)·rstd·w + b with rstd = 1/sqrt(var + eps);
//! stores mean and rstd. `has_bias` false: b is not read.
template <class C>
struct layer_norm_row_forward {
  C eps;
  template <class X, class W, class B, class Y>
  WEFT_HD void operator()(detail::strided_row<X> x, detail::strided_row<W> w,
                          detail::strided_row<B> b, bool has_bias, detail::strided_row<Y> y,
                          index_t n, C& mean_out, C& rstd_out) const noexcept {
    using E = norm_elem<C>;
    C sum = C(0);
    for (index_t j = 0; j < n; ++j) sum += static_cast<C>(x[j]);
    C const mean = E::mean(sum, n);
    C var = C(0);
    for (index_t j = 0; j < n; ++j) {
      C const d = static_cast<C>(x[j]) - mean;
      var += d * d;
    }
    C const rstd = E::rstd(var, n, eps);
    for (index_t j = 0; j < n; ++j) {
      C v = E::ln_y(static_cast<C>(x[j]), mean, rstd, static_cast<C>(w[j]));
      if (has_bias) v += static_cast<C>(b[j]);
      y[j] = static_cast<std::remove_cv_t<Y>>(v);
    }
    mean_out = mean;
    rstd_out = rstd;
  }
};

//! LayerNorm's input gradient for one row (llm.c): dn = w·dy, n̂ = (x − mean)·rstd,
//! dx = rstd·(dn − mean(dn) − n̂·mean(dn·n̂)). Overwrites dx.
template <class C>
struct layer_norm_row_backward {
  template <class G, class X, class W, class D>
  WEFT_HD void operator()(detail::strided_row<G> dy, detail::strided_row<X> x,
                          detail::strided_row<W> w, C mean, C rstd, detail::strided_row<D> dx,
                          index_t n) const noexcept {
    using E = norm_elem<C>;
    C s_dn = C(0), s_dnn = C(0);
    for (index_t j = 0; j < n; ++j) {
      C const dn = static_cast<C>(w[j]) * static_cast<C>(dy[j]);
      s_dn += dn;
      s_dnn += E::ln_dnn(dn, static_cast<C>(x[j]), mean, rstd);
    }
    C const inv_n = E::inv_count(n);
    C const m_dn = s_dn * inv_n, m_dnn = s_dnn * inv_n;
    for (index_t j = 0; j < n; ++j) {
      C const dn = static_cast<C>(w[j]) * static_cast<C>(dy[j]);
      dx[j] = static_cast<std::remove_cv_t<D>>(
          E::ln_dx(dn, static_cast<C>(x[j]), mean, rstd, m_dn, m_dnn));
    }
  }
};

//! RMSNorm of one row: y = x·rstd·w with rstd = 1/sqrt(mean(x²) + eps); stores rstd.
template <class C>
struct rms_norm_row_forward {
  C eps;
  template <class X, class W, class Y>
  WEFT_HD void operator()(detail::strided_row<X> x, detail::strided_row<W> w,
                          detail::strided_row<Y> y, index_t n, C& rstd_out) const noexcept {
    using E = norm_elem<C>;
    C ss = C(0);
    for (index_t j = 0; j < n; ++j) ss += static_cast<C>(x[j]) * static_cast<C>(x[j]);
    C const rstd = E::rstd(ss, n, eps);
    for (index_t j = 0; j < n; ++j)
      y[j] = static_cast<std::remove_cv_t<Y>>(
          E::rms_y(static_cast<C>(x[j]), rstd, static_cast<C>(w[j])));
    rstd_out = rstd;
  }
};

//! RMSNorm's input gradient for one row: dn = w·dy, n̂ = x·rstd, dx = rstd·(dn − n̂·mean(dn·n̂)).
template <class C>
struct rms_norm_row_backward {
  template <class G, class X, class W, class D>
  WEFT_HD void operator()(detail::strided_row<G> dy, detail::strided_row<X> x,
                          detail::strided_row<W> w, C rstd, detail::strided_row<D> dx,
                          index_t n) const noexcept {
    using E = norm_elem<C>;
    C s = C(0);
    for (index_t j = 0; j < n; ++j)
      s += E::rms_dnn(static_cast<C>(w[j]), static_cast<C>(dy[j]), static_cast<C>(x[j]), rstd);
    C const m = E::mean(s, n);
    for (index_t j = 0; j < n; ++j)
      dx[j] = static_cast<std::remove_cv_t<D>>(
          E::rms_dx(static_cast<C>(w[j]), static_cast<C>(dy[j]), static_cast<C>(x[j]), rstd, m));
  }
};

namespace detail {

template <class T>
void check_eps(double eps) {
  WEFT_EXPECTS(std::isfinite(eps) && eps > 0 && static_cast<compute_t<T>>(eps) > 0, "eps",
               "a finite value > 0 (representable in the compute type)", eps);
}

// x [N, C] and the per-row views every norm entry point shares; returns {N, C}.
template <class X, class W, class Y, class S>
std::pair<index_t, index_t> check_norm(X const& x, W const& w, Y const& y, char const* y_name,
                                       S const& stat, char const* stat_name) {
  static_assert(std::is_same_v<value_t<X>, value_t<W>> && std::is_same_v<value_t<X>, value_t<Y>>,
                "weft::nn norm: x, weight and the output must hold the same element type");
  static_assert(is_nn_element_v<value_t<X>>,
                "weft::nn norm: elements must be float, double, weft::bf16 or weft::f16");
  static_assert(
      std::is_same_v<value_t<S>, compute_t<value_t<X>>>,
      "weft::nn norm: mean and rstd hold the compute type (double for double, else float)");
  index_t const n = ext(x, 0), c = ext(x, 1);
  WEFT_EXPECTS_SHAPE(ext(w, 0) == c, "weight", dims(c) + " (x.extent(1))", shape_string(w));
  WEFT_EXPECTS_SHAPE(ext(y, 0) == n && ext(y, 1) == c, y_name, dims(n, c) + " (x's shape)",
                     shape_string(y));
  WEFT_EXPECTS_SHAPE(ext(stat, 0) == n, stat_name, dims(n) + " (x.extent(0))", shape_string(stat));
  return {n, c};
}

}  // namespace detail

// ---- LayerNorm ----------------------------------------------------------------------------------

//! y = LayerNorm(x)·weight + bias per row; saves mean [N] and rstd [N] for the backward. x, y
//! [N, C]; weight [C]; bias [C] or extent 0 (no_bias<T>()). eps > 0 (torch's default 1e-5).
template <class X, class W, class B, class Y, class M, class R>
requires HostArg<X, 2> && HostArg<W, 1> && HostArg<B, 1> && HostArg<Y, 2> && HostArg<M, 1> &&
    HostArg<R, 1>
void layer_norm_forward(X&& x, W&& weight, B&& bias, Y&& y, M&& mean, R&& rstd, double eps = 1e-5) {
  auto const xv = detail::arg_view(x);
  auto const wv = detail::arg_view(weight);
  auto const bv = detail::arg_view(bias);
  auto const yv = detail::arg_view(y);
  auto const mv = detail::arg_view(mean);
  auto const rv = detail::arg_view(rstd);
  using T = detail::value_t<decltype(xv)>;
  using C = compute_t<T>;
  auto const [n, c] = detail::check_norm(xv, wv, yv, "y", mv, "mean");
  bool const has_bias = detail::ext(bv, 0) != 0;
  WEFT_EXPECTS_SHAPE(!has_bias || detail::ext(bv, 0) == c, "bias",
                     detail::dims(c) + " (x.extent(1)) or [0] (no bias)", shape_string(bv));
  WEFT_EXPECTS_SHAPE(detail::ext(rv, 0) == n, "rstd", detail::dims(n) + " (x.extent(0))",
                     shape_string(rv));
  detail::check_eps<T>(eps);
  detail::check_no_overlap(yv, "y", xv, "x");
  detail::check_no_overlap(yv, "y", wv, "weight");
  detail::check_no_overlap(yv, "y", bv, "bias");
  layer_norm_row_forward<C> const f{static_cast<C>(eps)};
  for (index_t i = 0; i < n; ++i)
    f(detail::row_of(xv, i), detail::as_row(wv), detail::as_row(bv), has_bias,
      detail::row_of(yv, i), c, detail::at(mv, i), detail::at(rv, i));
}

//! dx = ∂L/∂x from dy and the forward's saved mean and rstd (overwrites dx).
template <class G, class X, class W, class M, class R, class D>
requires HostArg<G, 2> && HostArg<X, 2> && HostArg<W, 1> && HostArg<M, 1> && HostArg<R, 1> &&
    HostArg<D, 2>
void layer_norm_backward_input(G&& dy, X&& x, W&& weight, M&& mean, R&& rstd, D&& dx) {
  auto const gv = detail::arg_view(dy);
  auto const xv = detail::arg_view(x);
  auto const wv = detail::arg_view(weight);
  auto const mv = detail::arg_view(mean);
  auto const rv = detail::arg_view(rstd);
  auto const dv = detail::arg_view(dx);
  using C = compute_t<detail::value_t<decltype(xv)>>;
  static_assert(std::is_same_v<detail::value_t<decltype(gv)>, detail::value_t<decltype(xv)>>,
                "weft::nn::layer_norm_backward_input: dy and x must hold the same element type");
  auto const [n, c] = detail::check_norm(xv, wv, dv, "dx", mv, "mean");
  WEFT_EXPECTS_SHAPE(detail::ext(gv, 0) == n && detail::ext(gv, 1) == c, "dy",
                     detail::dims(n, c) + " (x's shape)", shape_string(gv));
  WEFT_EXPECTS_SHAPE(detail::ext(rv, 0) == n, "rstd", detail::dims(n) + " (x.extent(0))",
                     shape_string(rv));
  detail::check_no_overlap(dv, "dx", gv, "dy");
  detail::check_no_overlap(dv, "dx", xv, "x");
  layer_norm_row_backward<C> const f{};
  for (index_t i = 0; i < n; ++i)
    f(detail::row_of(gv, i), detail::row_of(xv, i), detail::as_row(wv),
      static_cast<C>(detail::at(mv, i)), static_cast<C>(detail::at(rv, i)), detail::row_of(dv, i),
      c);
}

//! dweight += Σ_rows n̂·dy and dbias += Σ_rows dy (ACCUMULATE; rows summed in order). dbias may
//! have extent 0 (no_bias_grad<T>()).
template <class G, class X, class M, class R, class DW, class DB>
requires HostArg<G, 2> && HostArg<X, 2> && HostArg<M, 1> && HostArg<R, 1> && HostArg<DW, 1> &&
    HostArg<DB, 1>
void layer_norm_backward_weight(G&& dy, X&& x, M&& mean, R&& rstd, DW&& dweight, DB&& dbias) {
  auto const gv = detail::arg_view(dy);
  auto const xv = detail::arg_view(x);
  auto const mv = detail::arg_view(mean);
  auto const rv = detail::arg_view(rstd);
  auto const dwv = detail::arg_view(dweight);
  auto const dbv = detail::arg_view(dbias);
  using T = detail::value_t<decltype(xv)>;
  using C = compute_t<T>;
  static_assert(std::is_same_v<detail::value_t<decltype(dbv)>, T>,
                "weft::nn::layer_norm_backward_weight: dbias must hold x's element type");
  auto const [n, c] = detail::check_norm(xv, dwv, gv, "dy", mv, "mean");
  WEFT_EXPECTS_SHAPE(detail::ext(rv, 0) == n, "rstd", detail::dims(n) + " (x.extent(0))",
                     shape_string(rv));
  bool const has_bias = detail::ext(dbv, 0) != 0;
  WEFT_EXPECTS_SHAPE(!has_bias || detail::ext(dbv, 0) == c, "dbias",
                     detail::dims(c) + " (x.extent(1)) or [0] (no bias)", shape_string(dbv));
  detail::check_no_overlap(dbv, "dbias", dwv, "dweight");
  for (index_t j = 0; j < c; ++j) {
    C aw = static_cast<C>(detail::at(dwv, j));
    C ab = has_bias ? static_cast<C>(detail::at(dbv, j)) : C(0);
    for (index_t i = 0; i < n; ++i) {
      C const g = static_cast<C>(detail::at(gv, i, j));
      aw +=
          norm_elem<C>::ln_dw(g, static_cast<C>(detail::at(xv, i, j)),
                              static_cast<C>(detail::at(mv, i)), static_cast<C>(detail::at(rv, i)));
      ab += g;
    }
    detail::at(dwv, j) = static_cast<T>(aw);
    if (has_bias) detail::at(dbv, j) = static_cast<T>(ab);
  }
}

// ---- RMSNorm ------------------------------------------------------------------------------------

//! y = x·rstd·weight per row with rstd = 1/sqrt(mean(x²) + eps); saves rstd [N].
template <class X, class W, class Y, class R>
requires HostArg<X, 2> && HostArg<W, 1> && HostArg<Y, 2> && HostArg<R, 1>
void rms_norm_forward(X&& x, W&& weight, Y&& y, R&& rstd, double eps = 1e-6) {
  auto const xv = detail::arg_view(x);
  auto const wv = detail::arg_view(weight);
  auto const yv = detail::arg_view(y);
  auto const rv = detail::arg_view(rstd);
  using T = detail::value_t<decltype(xv)>;
  using C = compute_t<T>;
  auto const [n, c] = detail::check_norm(xv, wv, yv, "y", rv, "rstd");
  detail::check_eps<T>(eps);
  detail::check_no_overlap(yv, "y", xv, "x");
  detail::check_no_overlap(yv, "y", wv, "weight");
  rms_norm_row_forward<C> const f{static_cast<C>(eps)};
  for (index_t i = 0; i < n; ++i)
    f(detail::row_of(xv, i), detail::as_row(wv), detail::row_of(yv, i), c, detail::at(rv, i));
}

//! dx = ∂L/∂x from dy and the saved rstd (overwrites dx).
template <class G, class X, class W, class R, class D>
requires HostArg<G, 2> && HostArg<X, 2> && HostArg<W, 1> && HostArg<R, 1> && HostArg<D, 2>
void rms_norm_backward_input(G&& dy, X&& x, W&& weight, R&& rstd, D&& dx) {
  auto const gv = detail::arg_view(dy);
  auto const xv = detail::arg_view(x);
  auto const wv = detail::arg_view(weight);
  auto const rv = detail::arg_view(rstd);
  auto const dv = detail::arg_view(dx);
  using C = compute_t<detail::value_t<decltype(xv)>>;
  static_assert(std::is_same_v<detail::value_t<decltype(gv)>, detail::value_t<decltype(xv)>>,
                "weft::nn::rms_norm_backward_input: dy and x must hold the same element type");
  auto const [n, c] = detail::check_norm(xv, wv, dv, "dx", rv, "rstd");
  WEFT_EXPECTS_SHAPE(detail::ext(gv, 0) == n && detail::ext(gv, 1) == c, "dy",
                     detail::dims(n, c) + " (x's shape)", shape_string(gv));
  detail::check_no_overlap(dv, "dx", gv, "dy");
  detail::check_no_overlap(dv, "dx", xv, "x");
  rms_norm_row_backward<C> const f{};
  for (index_t i = 0; i < n; ++i)
    f(detail::row_of(gv, i), detail::row_of(xv, i), detail::as_row(wv),
      static_cast<C>(detail::at(rv, i)), detail::row_of(dv, i), c);
}

//! dweight += Σ_rows x·rstd·dy (ACCUMULATES; rows summed in order).
template <class G, class X, class R, class DW>
requires HostArg<G, 2> && HostArg<X, 2> && HostArg<R, 1> && HostArg<DW, 1>
void rms_norm_backward_weight(G&& dy, X&& x, R&& rstd, DW&& dweight) {
  auto const gv = detail::arg_view(dy);
  auto const xv = detail::arg_view(x);
  auto const rv = detail::arg_view(rstd);
  auto const dwv = detail::arg_view(dweight);
  using T = detail::value_t<decltype(xv)>;
  using C = compute_t<T>;
  auto const [n, c] = detail::check_norm(xv, dwv, gv, "dy", rv, "rstd");
  for (index_t j = 0; j < c; ++j) {
    C aw = static_cast<C>(detail::at(dwv, j));
    for (index_t i = 0; i < n; ++i)
      aw += norm_elem<C>::rms_dw(static_cast<C>(detail::at(gv, i, j)),
                                 static_cast<C>(detail::at(xv, i, j)),
                                 static_cast<C>(detail::at(rv, i)));
    detail::at(dwv, j) = static_cast<T>(aw);
  }
}

}  // namespace weft::nn
