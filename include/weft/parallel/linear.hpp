// weft/parallel/linear.hpp — Megatron's column- and row-parallel linear layers over a
// tensor-parallel group, with and without sequence parallelism, as forward / backward_input /
// backward_weight functions over nn::linear's local GEMMs; and the tp SUM of the gradients of
// sequence-parallel replicated parameters (norm weights).
#pragma once

#include <weft/comm/collectives.hpp>
#include <weft/comm/concepts.hpp>
#include <weft/core/error.hpp>
#include <weft/core/memory.hpp>
#include <weft/core/tensor/view.hpp>
#include <weft/nn/linear.hpp>
#include <weft/optim/param.hpp>
#include <weft/parallel/detail/tp_matrix.hpp>
#include <weft/parallel/mappings.hpp>

#include <algorithm>
#include <concepts>
#include <cstddef>
#include <ranges>
#include <span>
#include <type_traits>
#include <vector>

namespace weft::parallel {

// Layout (Megatron's, torch's): activations are [tokens, hidden] row-major, weights [out, in].
//
//   column_parallel  Y = X Aᵀ + b, A split by output rows: rank r holds w [out/tp, in] and its
//                    bias slice [out/tp]; its output is Y's columns [N, out/tp].
//   row_parallel     A split by input columns: rank r holds w [out, in/tp] and reads X's columns
//                    [N, in/tp] (a column-parallel output); the partial products are summed over
//                    tp, then the bias [out], which is NOT split, is added once, after the sum.
//
// Without sequence parallelism every rank holds all N tokens:
//   column: forward f (identity) then the GEMM; backward_input: the GEMM then f's all-reduce.
//   row:    forward the GEMM then g (all-reduce); backward_input: g's identity then the GEMM.
// An MLP (column -> elementwise -> row) so costs one SUM all-reduce forward and one backward.
// With sequence parallelism (the *_sp functions) the activations outside the pair are token
// slices [N/tp, H]: column gathers them before its GEMM (all-gather dim 0; backward
// reduce-scatter), row reduce-scatters its partial sums (backward all-gather). Same volume as
// the all-reduce they replace, and norms between layers run on N/tp tokens.
//
// backward_weight never communicates and ACCUMULATES (dw += dyᵀ x, db += Σ dy, nn's rule) from
// the GEMM's own operands: under SP the gathered input (column) or gathered output gradient
// (row), which the forward / backward_input hand back through an output argument so that the
// weight pass needs no second gather. All functions are collective over `tp` where they
// communicate, and check every shape before communicating or writing (shape_error naming the
// argument, expected and actual shape).

namespace detail {

template <class X>
using arg_value_t = std::remove_const_t<typename std::remove_cvref_t<X>::element_type>;

template <class X>
index_t extent_of(X const& x, std::size_t r) {
  return static_cast<index_t>(x.extent(r));
}

// The shapes of one local GEMM y [rows, w.out] = x [rows, w.in] · wᵀ (+ bias [w.out]), checked
// before anything is communicated (nn checks again, locally, when it runs).
template <class W, class B>
void expect_gemm(W const& w, B const& bias, index_t in_cols, index_t out_rows, index_t out_cols,
                 index_t y_rows, char const* in_name, char const* out_name) {
  WEFT_EXPECTS_SHAPE(extent_of(w, 1) == in_cols, "w",
                     ::weft::detail::concat("[", extent_of(w, 0), ", ", in_cols,
                                            "] (extent(1) = ", in_name, ".extent(1))"),
                     ::weft::detail::concat("[", extent_of(w, 0), ", ", extent_of(w, 1), "]"));
  WEFT_EXPECTS_SHAPE(out_rows == y_rows && out_cols == extent_of(w, 0), out_name,
                     ::weft::detail::concat("[", y_rows, ", ", extent_of(w, 0), "]"),
                     ::weft::detail::concat("[", out_rows, ", ", out_cols, "]"));
  WEFT_EXPECTS_SHAPE(extent_of(bias, 0) == 0 || extent_of(bias, 0) == extent_of(w, 0), "bias",
                     ::weft::detail::concat("[", extent_of(w, 0), "] or [0] (no bias)"),
                     ::weft::detail::concat("[", extent_of(bias, 0), "]"));
}

template <class T, class B>
void add_bias(tensor_view<T, 2> y, B const& bias) {
  auto const n = extent_of(bias, 0);
  if (n == 0) return;
  for (index_t i = 0; i < y.extent(0); ++i)
    for (index_t j = 0; j < n; ++j)
      y(i, j) += static_cast<T>(bias.data_handle()[bias.mapping()(j)]);
}

template <class B>
auto bias_view(B& b) {
  if constexpr (Tensor<std::remove_cv_t<B>>) {
    return b;
  } else {
    return b.view();
  }
}

}  // namespace detail

// ---- column-parallel ----------------------------------------------------------------------------

//! Column-parallel forward without SP: y [N, out/tp] = x [N, in] · wᵀ + bias, with w [out/tp, in]
//! and bias [out/tp] (or extent 0). x is replicated over tp; f's forward is the identity, so
//! nothing is communicated. Overwrites y.
template <comm::Group C, class X, class W, class B, class Y>
requires nn::HostArg<X, 2> && nn::HostArg<W, 2> && nn::HostArg<B, 1> && nn::HostArg<Y, 2>
void column_parallel_forward(C& tp, X&& x, W&& w, B&& bias, Y&& y) {
  copy_to_tp_forward(tp, x);
  nn::linear_forward(x, w, bias, y);
}

//! Column-parallel forward with SP: x_local [N/tp, in] (this rank's tokens) is all-gathered into
//! x_total [N, in] (gather_from_sp), then y [N, out/tp] = x_total · wᵀ + bias. Keep x_total for
//! backward_weight.
template <comm::CollectiveIn<host_space> C, class X, class W, class B, class XT, class Y>
requires HostMatrix<X> && nn::HostArg<W, 2> && nn::HostArg<B, 1> && MutableHostMatrix<XT> &&
    nn::HostArg<Y, 2> && std::same_as<matrix_value_t<X>, matrix_value_t<XT>>
void column_parallel_forward_sp(C& tp, X&& x_local, W&& w, B&& bias, XT&& x_total, Y&& y) {
  auto const xt = detail::as_matrix(x_total, "x_total");
  detail::expect_split(xt, detail::as_const_matrix(x_local, "x_local"), tp.size(), 0, "x_total",
                       "x_local");
  detail::expect_gemm(w, detail::bias_view(bias), detail::extent_of(x_local, 1),
                      detail::extent_of(y, 0), detail::extent_of(y, 1), xt.extent(0), "x_local",
                      "y");
  gather_from_sp_forward(tp, x_local, xt);
  nn::linear_forward(tensor_view<matrix_value_t<X> const, 2>(xt), w, bias, y);
}

//! Column-parallel input gradient without SP: dx [N, in] = SUM over tp of dy [N, out/tp] · w
//! (the GEMM, then f's backward: one SUM all-reduce). Overwrites dx.
template <comm::CollectiveIn<host_space> C, class G, class W, class DX>
requires nn::HostArg<G, 2> && nn::HostArg<W, 2> && MutableHostMatrix<DX>
void column_parallel_backward_input(C& tp, G&& dy, W&& w, DX&& dx) {
  auto const dxv = detail::as_matrix(dx, "dx");
  nn::linear_backward_input(dy, w, dxv);
  copy_to_tp_backward(tp, dxv);
}

//! Column-parallel input gradient with SP: dx_local [N/tp, in] = this rank's rows of the SUM over
//! tp of dy [N, out/tp] · w (the GEMM into a [N, in] scratch, then gather_from_sp's backward: one
//! reduce-scatter). Overwrites dx_local.
template <comm::CollectiveIn<host_space> C, class G, class W, class DX>
requires nn::HostArg<G, 2> && nn::HostArg<W, 2> && MutableHostMatrix<DX>
void column_parallel_backward_input_sp(C& tp, G&& dy, W&& w, DX&& dx_local) {
  using T = matrix_value_t<DX>;
  auto const dxl = detail::as_matrix(dx_local, "dx_local");
  index_t const n = detail::extent_of(dy, 0), in = detail::extent_of(w, 1);
  detail::expect_divisible(n, tp.size(), "dy", "extent(0)");
  detail::expect_extents(dxl, n / tp.size(), in, "dx_local");
  std::vector<T> full(static_cast<std::size_t>(n * in));
  tensor_view<T, 2> const fv(full.data(), n, in);
  nn::linear_backward_input(dy, w, fv);
  gather_from_sp_backward(tp, tensor_view<T const, 2>(fv), dxl);
}

//! Column-parallel weight gradient (with or without SP): dw [out/tp, in] += dyᵀ · x and
//! dbias [out/tp] += Σ_tokens dy, where x is the GEMM's input [N, in] (x, or x_total under SP).
//! No communication. ACCUMULATES.
template <class G, class X, class DW, class DB>
requires nn::HostArg<G, 2> && nn::HostArg<X, 2> && nn::HostArg<DW, 2> && nn::HostArg<DB, 1>
void column_parallel_backward_weight(G&& dy, X&& x, DW&& dw, DB&& dbias) {
  nn::linear_backward_weight(dy, x, dw, dbias);
}

// ---- row-parallel -------------------------------------------------------------------------------

//! Row-parallel forward without SP: y [N, out] = SUM over tp of x [N, in/tp] · wᵀ, then + bias
//! [out] (replicated, added once after the sum), with w [out, in/tp]. One SUM all-reduce (g).
//! Overwrites y.
template <comm::CollectiveIn<host_space> C, class X, class W, class B, class Y>
requires nn::HostArg<X, 2> && nn::HostArg<W, 2> && nn::HostArg<B, 1> && MutableHostMatrix<Y>
void row_parallel_forward(C& tp, X&& x, W&& w, B&& bias, Y&& y) {
  using T = matrix_value_t<Y>;
  auto const yv = detail::as_matrix(y, "y");
  auto const bv = detail::bias_view(bias);
  detail::expect_gemm(w, bv, detail::extent_of(x, 1), yv.extent(0), yv.extent(1),
                      detail::extent_of(x, 0), "x", "y");
  nn::linear_forward(x, w, nn::no_bias<T>(), yv);
  reduce_from_tp_forward(tp, yv);
  detail::add_bias(yv, bv);
}

//! Row-parallel forward with SP: y_local [N/tp, out] = this rank's rows of the SUM over tp of
//! x [N, in/tp] · wᵀ (reduce_scatter_to_sp: one reduce-scatter), then + bias [out]. Overwrites
//! y_local.
template <comm::CollectiveIn<host_space> C, class X, class W, class B, class Y>
requires nn::HostArg<X, 2> && nn::HostArg<W, 2> && nn::HostArg<B, 1> && MutableHostMatrix<Y>
void row_parallel_forward_sp(C& tp, X&& x, W&& w, B&& bias, Y&& y_local) {
  using T = matrix_value_t<Y>;
  auto const yv = detail::as_matrix(y_local, "y_local");
  auto const bv = detail::bias_view(bias);
  index_t const n = detail::extent_of(x, 0), out = detail::extent_of(w, 0);
  detail::expect_divisible(n, tp.size(), "x", "extent(0)");
  detail::expect_gemm(w, bv, detail::extent_of(x, 1), yv.extent(0), yv.extent(1), n / tp.size(),
                      "x", "y_local");
  std::vector<T> partial(static_cast<std::size_t>(n * out));
  tensor_view<T, 2> const pv(partial.data(), n, out);
  nn::linear_forward(x, w, nn::no_bias<T>(), pv);
  reduce_scatter_to_sp_forward(tp, tensor_view<T const, 2>(pv), yv);
  detail::add_bias(yv, bv);
}

//! Row-parallel input gradient without SP: dx [N, in/tp] = dy [N, out] · w. g's backward is the
//! identity (dy is replicated), so nothing is communicated. Overwrites dx.
template <comm::Group C, class G, class W, class DX>
requires nn::HostArg<G, 2> && nn::HostArg<W, 2> && nn::HostArg<DX, 2>
void row_parallel_backward_input(C& tp, G&& dy, W&& w, DX&& dx) {
  reduce_from_tp_backward(tp, dy);
  nn::linear_backward_input(dy, w, dx);
}

//! Row-parallel input gradient with SP: dy_local [N/tp, out] is all-gathered into dy_total
//! [N, out] (reduce_scatter_to_sp's backward), then dx [N, in/tp] = dy_total · w. Keep dy_total
//! for backward_weight. Overwrites dy_total and dx.
template <comm::CollectiveIn<host_space> C, class G, class W, class GT, class DX>
requires HostMatrix<G> && nn::HostArg<W, 2> && MutableHostMatrix<GT> && nn::HostArg<DX, 2> &&
    std::same_as<matrix_value_t<G>, matrix_value_t<GT>>
void row_parallel_backward_input_sp(C& tp, G&& dy_local, W&& w, GT&& dy_total, DX&& dx) {
  auto const gt = detail::as_matrix(dy_total, "dy_total");
  detail::expect_split(gt, detail::as_const_matrix(dy_local, "dy_local"), tp.size(), 0, "dy_total",
                       "dy_local");
  WEFT_EXPECTS_SHAPE(detail::extent_of(w, 0) == gt.extent(1), "w",
                     ::weft::detail::concat("extent(0) = dy_local.extent(1) = ", gt.extent(1)),
                     ::weft::detail::concat("extent(0) = ", detail::extent_of(w, 0)));
  WEFT_EXPECTS_SHAPE(
      detail::extent_of(dx, 0) == gt.extent(0) &&
          detail::extent_of(dx, 1) == detail::extent_of(w, 1),
      "dx", ::weft::detail::concat("[", gt.extent(0), ", ", detail::extent_of(w, 1), "]"),
      ::weft::detail::concat("[", detail::extent_of(dx, 0), ", ", detail::extent_of(dx, 1), "]"));
  reduce_scatter_to_sp_backward(tp, dy_local, gt);
  nn::linear_backward_input(tensor_view<matrix_value_t<G> const, 2>(gt), w, dx);
}

//! Row-parallel weight gradient (with or without SP): dw [out, in/tp] += dyᵀ · x and
//! dbias [out] += Σ_tokens dy, where dy is the GEMM's output gradient [N, out] (dy, or dy_total
//! under SP). As dy covers all N tokens on every rank, dbias is the whole bias gradient on every
//! rank, SP or not: the row bias needs no sequence_parallel_grad flag here (Megatron computes it
//! from the token slice and flags it). No communication. ACCUMULATES.
template <class G, class X, class DW, class DB>
requires nn::HostArg<G, 2> && nn::HostArg<X, 2> && nn::HostArg<DW, 2> && nn::HostArg<DB, 1>
void row_parallel_backward_weight(G&& dy, X&& x, DW&& dw, DB&& dbias) {
  nn::linear_backward_weight(dy, x, dw, dbias);
}

// ---- sequence-parallel replicated parameters
// ------------------------------------------------------

//! Sums over tp, in place, the gradients of every parameter flagged
//! optim::param_info::sequence_parallel_grad: parameters replicated over tp but applied to each
//! rank's token slice under SP (norm weights and biases between the layers), whose gradients are
//! therefore partial per rank (Megatron's _allreduce_non_tensor_model_parallel_grads; without it
//! the replicas drift apart: Megatron-LM#1446). `grads` is the flat gradient buffer `params`
//! describes (sizes checked: shape_error). The flagged ranges travel in one SUM all-reduce; none
//! when nothing is flagged or tp.size() == 1. Collective over `tp`: call it once per step after
//! the last backward, before the gradient norm and the optimizer.
template <comm::CollectiveIn<host_space> C, class T>
requires Element<T>
void sum_sequence_parallel_grads(C& tp, std::span<optim::param_info const> params,
                                 std::span<T> grads) {
  optim::detail::expect_buffer_matches(params, grads.size(), "grads");
  std::size_t flagged = 0;
  for (auto const& p : params) flagged += p.sequence_parallel_grad ? p.count : 0;
  if (flagged == 0 || tp.size() == 1) return;
  std::vector<T> packed;
  packed.reserve(flagged);
  std::size_t at = 0;
  for (auto const& p : params) {
    if (p.sequence_parallel_grad)
      packed.insert(packed.end(), grads.begin() + at, grads.begin() + at + p.count);
    at += p.count;
  }
  comm::all_reduce(tp, packed, comm::reduce_kind::sum).wait();
  at = 0;
  std::size_t from = 0;
  for (auto const& p : params) {
    if (p.sequence_parallel_grad) {
      std::copy_n(packed.begin() + static_cast<std::ptrdiff_t>(from), p.count, grads.begin() + at);
      from += p.count;
    }
    at += p.count;
  }
}

//! sum_sequence_parallel_grads over a vector or any contiguous range of gradients.
template <comm::CollectiveIn<host_space> C, class R>
requires std::ranges::contiguous_range<R> && std::ranges::sized_range<R> &&
    (!std::is_const_v<std::remove_reference_t<std::ranges::range_reference_t<
         R>>>)void sum_sequence_parallel_grads(C& tp, std::span<optim::param_info const> params,
                                               R&& grads) {
  sum_sequence_parallel_grads(
      tp, params,
      std::span<std::ranges::range_value_t<R>>(std::ranges::data(grads), std::ranges::size(grads)));
}

}  // namespace weft::parallel
