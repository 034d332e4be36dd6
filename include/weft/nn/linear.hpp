// weft/nn/linear.hpp — the affine layer y = x·wᵀ + b in torch/Megatron layout (w is [out, in]) with
// llm.c's split backward: one function for the input gradient, one that ACCUMULATES the weight and
// bias gradients (so microbatches add up; zero them with the parameter store's zero_grad).
//
// Elements: f32 and f64 (blas::gemm sgemm/dgemm when WEFT_HAS_BLAS, a fixed-order loop otherwise),
// bf16 and f16 storage with f32 arithmetic (operands widened, each output rounded once). Any host
// rank-2 view is accepted; strided ones are packed. Tolerance, as the tests check it: f32 results
// are within 1e-5 · max|reference| of the f64 ones for inner extents up to a few hundred.
#pragma once

#include <weft/core/blas.hpp>
#include <weft/core/dtype.hpp>
#include <weft/core/error.hpp>
#include <weft/core/math.hpp>
#include <weft/core/tensor/view.hpp>
#include <weft/nn/detail/args.hpp>
#include <weft/nn/detail/gemm.hpp>

#include <type_traits>
#include <vector>

namespace weft::nn {

//! The rank-1 view with extent 0 that stands for "no bias" in linear_forward and
//! linear_backward_weight.
template <class T>
[[nodiscard]] tensor_view<T const, 1> no_bias() noexcept {
  return tensor_view<T const, 1>(static_cast<T const*>(nullptr), index_t{0});
}
//! The writable extent-0 view that stands for "no bias gradient" in linear_backward_weight.
template <class T>
[[nodiscard]] tensor_view<T, 1> no_bias_grad() noexcept {
  return tensor_view<T, 1>(static_cast<T*>(nullptr), index_t{0});
}

namespace detail {

template <class First, class... V>
inline constexpr bool all_same_value_v = (std::is_same_v<value_t<First>, value_t<V>> && ...);

template <class Y, class... In>
void check_linear_types() {
  static_assert(all_same_value_v<Y, In...>,
                "weft::nn::linear: every argument must hold the same element type");
  static_assert(is_nn_element_v<value_t<Y>>,
                "weft::nn::linear: elements must be float, double, weft::bf16 or weft::f16");
  static_assert(!std::is_const_v<typename Y::element_type>,
                "weft::nn::linear: the output must have non-const elements");
}

template <class X, class W, class B, class Y>
void linear_forward_impl(X const& x, W const& w, B const& bias, Y const& y, bool use_blas) {
  check_linear_types<Y, X, W, B>();
  using C = compute_t<value_t<Y>>;
  index_t const n = ext(x, 0), in = ext(x, 1), out = ext(w, 0);
  WEFT_EXPECTS_SHAPE(ext(w, 1) == in, "w", dims(out, in) + " ([out, in], in = x.extent(1))",
                     shape_string(w));
  bool const has_bias = ext(bias, 0) != 0;
  WEFT_EXPECTS_SHAPE(!has_bias || ext(bias, 0) == out, "bias",
                     dims(out) + " (w.extent(0)) or [0] (no bias)", shape_string(bias));
  WEFT_EXPECTS_SHAPE(ext(y, 0) == n && ext(y, 1) == out, "y",
                     dims(n, out) + " ([x.extent(0), w.extent(0)])", shape_string(y));
  check_no_overlap(y, "y", x, "x");
  check_no_overlap(y, "y", w, "w");
  check_no_overlap(y, "y", bias, "bias");
  std::vector<C> sx, sw;
  auto const xa = as_operand<C>(x, sx);
  auto const wa = as_operand<C>(w, sw);
  gemm_into(
      op::none, op::transpose, in, xa, wa, y,
      [&](index_t, index_t j) { return has_bias ? static_cast<C>(at(bias, j)) : C(0); }, use_blas);
}

template <class G, class W, class DX>
void linear_backward_input_impl(G const& dy, W const& w, DX const& dx, bool use_blas) {
  check_linear_types<DX, G, W>();
  using C = compute_t<value_t<DX>>;
  index_t const n = ext(dy, 0), out = ext(dy, 1), in = ext(w, 1);
  WEFT_EXPECTS_SHAPE(ext(w, 0) == out, "w", dims(out, in) + " ([out, in], out = dy.extent(1))",
                     shape_string(w));
  WEFT_EXPECTS_SHAPE(ext(dx, 0) == n && ext(dx, 1) == in, "dx",
                     dims(n, in) + " ([dy.extent(0), w.extent(1)])", shape_string(dx));
  check_no_overlap(dx, "dx", dy, "dy");
  check_no_overlap(dx, "dx", w, "w");
  std::vector<C> sg, sw;
  auto const ga = as_operand<C>(dy, sg);
  auto const wa = as_operand<C>(w, sw);
  gemm_into(
      op::none, op::none, out, ga, wa, dx, [](index_t, index_t) { return C(0); }, use_blas);
}

template <class G, class X, class DW, class DB>
void linear_backward_weight_impl(G const& dy, X const& x, DW const& dw, DB const& dbias,
                                 bool use_blas) {
  check_linear_types<DW, G, X, DB>();
  static_assert(!std::is_const_v<typename DB::element_type>,
                "weft::nn::linear_backward_weight: dbias must have non-const elements");
  using C = compute_t<value_t<DW>>;
  index_t const n = ext(dy, 0), out = ext(dy, 1), in = ext(x, 1);
  WEFT_EXPECTS_SHAPE(ext(x, 0) == n, "x", dims(n, in) + " (x.extent(0) = dy.extent(0))",
                     shape_string(x));
  WEFT_EXPECTS_SHAPE(ext(dw, 0) == out && ext(dw, 1) == in, "dw",
                     dims(out, in) + " ([dy.extent(1), x.extent(1)])", shape_string(dw));
  bool const has_bias = ext(dbias, 0) != 0;
  WEFT_EXPECTS_SHAPE(!has_bias || ext(dbias, 0) == out, "dbias",
                     dims(out) + " (dy.extent(1)) or [0] (no bias)", shape_string(dbias));
  check_no_overlap(dw, "dw", dy, "dy");
  check_no_overlap(dw, "dw", x, "x");
  check_no_overlap(dbias, "dbias", dy, "dy");
  check_no_overlap(dbias, "dbias", x, "x");
  check_no_overlap(dbias, "dbias", dw, "dw");
  std::vector<C> sg, sx;
  auto const ga = as_operand<C>(dy, sg);
  auto const xa = as_operand<C>(x, sx);
  gemm_into(
      op::transpose, op::none, n, ga, xa, dw,
      [&](index_t i, index_t j) { return static_cast<C>(at(dw, i, j)); }, use_blas);
  if (!has_bias) return;
  // Column sums in row order, one rounding into dbias per column.
  for (index_t j = 0; j < out; ++j) {
    C acc = static_cast<C>(at(dbias, j));
    for (index_t r = 0; r < n; ++r) acc += static_cast<C>(at(dy, r, j));
    at(dbias, j) = static_cast<value_t<DB>>(acc);
  }
}

}  // namespace detail

//! y = x·wᵀ + bias (overwrites y). x [N, in], w [out, in], bias [out] or extent 0 (no_bias<T>()),
//! y [N, out]. Throws shape_error (naming the argument, expected and actual shape) and
//! invalid_argument_error (y overlapping an input) before writing anything.
template <class X, class W, class B, class Y>
requires HostArg<X, 2> && HostArg<W, 2> && HostArg<B, 1> && HostArg<Y, 2>
void linear_forward(X&& x, W&& w, B&& bias, Y&& y) {
  detail::linear_forward_impl(detail::arg_view(x), detail::arg_view(w), detail::arg_view(bias),
                              detail::arg_view(y), blas::enabled);
}

//! dx = dy·w (overwrites dx). dy [N, out], w [out, in], dx [N, in].
template <class G, class W, class DX>
requires HostArg<G, 2> && HostArg<W, 2> && HostArg<DX, 2>
void linear_backward_input(G&& dy, W&& w, DX&& dx) {
  detail::linear_backward_input_impl(detail::arg_view(dy), detail::arg_view(w),
                                     detail::arg_view(dx), blas::enabled);
}

//! dw += dyᵀ·x and dbias += the column sums of dy (ACCUMULATE, as llm.c, for gradient
//! accumulation). dy [N, out], x [N, in], dw [out, in], dbias [out] or extent 0 (no bias).
template <class G, class X, class DW, class DB>
requires HostArg<G, 2> && HostArg<X, 2> && HostArg<DW, 2> && HostArg<DB, 1>
void linear_backward_weight(G&& dy, X&& x, DW&& dw, DB&& dbias) {
  detail::linear_backward_weight_impl(detail::arg_view(dy), detail::arg_view(x),
                                      detail::arg_view(dw), detail::arg_view(dbias), blas::enabled);
}

}  // namespace weft::nn
