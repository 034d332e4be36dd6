// weft/nn/cross_entropy.hpp — token cross-entropy from logits [T, V] with targets (a negative
// target is ignored: no loss, a zero gradient row), weighted per counted token (1 / count: the
// mean), and its fused softmax backward dlogits = weight·(softmax − onehot). The row math is rl's
// (rl/logprobs.hpp: streamed log-sum-exp and its gradient), not a second copy.
//
// Logits of 1e4 and -inf are safe (the log-sum-exp never forms e^x of a large x). Tolerance, as the
// tests check it: f32 loss and gradients within 1e-5 · max|reference| of f64.
#pragma once

#include <weft/core/error.hpp>
#include <weft/core/math.hpp>
#include <weft/core/tensor/view.hpp>
#include <weft/nn/detail/args.hpp>
#include <weft/rl/logprobs.hpp>

#include <concepts>
#include <cstddef>
#include <span>
#include <type_traits>
#include <vector>

namespace weft::nn {

//! The number of counted (non-negative) targets, and the weight that makes the loss their mean:
//! 1 / count, or 0 when none counts.
template <std::integral I>
[[nodiscard]] double mean_weight(std::span<I const> targets) noexcept {
  std::size_t n = 0;
  for (auto t : targets) n += t >= 0 ? 1 : 0;
  return n > 0 ? 1.0 / static_cast<double>(n) : 0.0;
}

namespace detail {
template <class L, class I, class S>
void check_ce(L const& lv, std::span<I const> targets, S const& sv) {
  static_assert(
      std::is_same_v<value_t<S>, compute_t<value_t<L>>>,
      "weft::nn cross_entropy: lse holds the compute type (double for double, else float)");
  auto const t = ext(lv, 0), v = ext(lv, 1);
  WEFT_EXPECTS_SHAPE(static_cast<index_t>(targets.size()) == t, "targets",
                     ::weft::detail::concat(t, " elements (logits.extent(0))"), targets.size());
  WEFT_EXPECTS_SHAPE(ext(sv, 0) == t, "lse", dims(t) + " (logits.extent(0))", shape_string(sv));
  for (std::size_t k = 0; k < targets.size(); ++k)
    WEFT_EXPECTS(targets[k] < v, ::weft::detail::concat("targets[", k, "]"),
                 ::weft::detail::concat("a class in [0, ", v, ") or negative (ignored)"),
                 static_cast<long long>(targets[k]));
}
// Row k of the logits as contiguous memory (the view's own when its columns are unit-strided).
template <class V>
auto const* contiguous_row(V const& v, index_t k, std::vector<value_t<V>>& buf) {
  index_t const n = ext(v, 1);
  if (n <= 1 || v.stride(1) == 1) return &at(v, k, 0);
  buf.resize(static_cast<std::size_t>(n));
  for (index_t j = 0; j < n; ++j) buf[static_cast<std::size_t>(j)] = at(v, k, j);
  return static_cast<value_t<V> const*>(buf.data());
}
}  // namespace detail

//! Returns Σ_t weight·(lse_t − logits[t, targets[t]]) over counted targets (weight = mean_weight:
//! the mean token cross-entropy), summed in f64 in token order; stores each row's log-sum-exp in
//! lse [T] for the backward (0 for ignored rows). Throws shape_error, and invalid_argument_error
//! naming targets[k] for a target ≥ V, before writing anything.
template <class L, std::integral I, class S>
requires HostArg<L, 2> && HostArg<S, 1>
double cross_entropy_forward(L&& logits, std::span<I const> targets, double weight, S&& lse) {
  auto const lv = detail::arg_view(logits);
  auto const sv = detail::arg_view(lse);
  using T = detail::value_t<decltype(lv)>;
  using C = compute_t<T>;
  detail::check_ce(lv, targets, sv);
  index_t const v = detail::ext(lv, 1);
  std::vector<T> buf;
  double loss = 0.0;
  for (std::size_t k = 0; k < targets.size(); ++k) {
    auto const row = static_cast<index_t>(k);
    if (targets[k] < 0 || v == 0) {
      detail::at(sv, row) = C(0);
      continue;
    }
    T const* z = detail::contiguous_row(lv, row, buf);
    double const l = softmax_finish{}.lse(rl::detail::row_stats(z, v, C(1)));
    detail::at(sv, row) = static_cast<C>(l);
    loss += weight * (l - static_cast<double>(static_cast<C>(z[targets[k]])));
  }
  return loss;
}

//! dlogits[t, :] = weight·(softmax(logits[t]) − onehot(targets[t])) from the forward's lse, 0 for
//! ignored rows (overwrites dlogits [T, V]).
template <class L, std::integral I, class S, class D>
requires HostArg<L, 2> && HostArg<S, 1> && HostArg<D, 2>
void cross_entropy_backward(L&& logits, std::span<I const> targets, double weight, S&& lse,
                            D&& dlogits) {
  auto const lv = detail::arg_view(logits);
  auto const sv = detail::arg_view(lse);
  auto const dv = detail::arg_view(dlogits);
  using T = detail::value_t<decltype(lv)>;
  using C = compute_t<T>;
  static_assert(std::is_same_v<detail::value_t<decltype(dv)>, T>,
                "weft::nn::cross_entropy_backward: dlogits must hold the logits' element type");
  detail::check_ce(lv, targets, sv);
  index_t const v = detail::ext(lv, 1);
  WEFT_EXPECTS_SHAPE(detail::ext(dv, 0) == detail::ext(lv, 0) && detail::ext(dv, 1) == v, "dlogits",
                     shape_string(lv) + " (the logits' shape)", shape_string(dv));
  detail::check_no_overlap(dv, "dlogits", lv, "logits");
  std::vector<T> buf, out(static_cast<std::size_t>(v));
  for (std::size_t k = 0; k < targets.size(); ++k) {
    auto const row = static_cast<index_t>(k);
    bool const ignored = targets[k] < 0;
    T const* z = detail::contiguous_row(lv, row, buf);
    // d(−weight·logp)/dz: rl's gradient of g_logp·logp with g_logp = −weight.
    rl::detail::row_backward(z, v, C(1), static_cast<double>(detail::at(sv, row)), 0.0,
                             ignored ? 0.0 : -weight, 0.0,
                             ignored ? index_t{-1} : static_cast<index_t>(targets[k]), out.data());
    for (index_t j = 0; j < v; ++j) detail::at(dv, row, j) = out[static_cast<std::size_t>(j)];
  }
}

}  // namespace weft::nn
