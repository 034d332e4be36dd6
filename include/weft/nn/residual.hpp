// weft/nn/residual.hpp — the residual connection y = x + f(x) in nn's uniform form: the forward
// add, and the backward at the fork, where the skip's gradient dy meets the branch's gradient.
// Elementwise over rank-2 views; an output may be one of its inputs (the same view).
#pragma once

#include <weft/core/tensor/view.hpp>
#include <weft/nn/activation.hpp>
#include <weft/nn/detail/args.hpp>

namespace weft::nn {

//! y = a + b elementwise (overwrites y; y may be a or b). a, b, y [N, C].
template <class A, class B, class Y>
requires HostArg<A, 2> && HostArg<B, 2> && HostArg<Y, 2>
void residual_forward(A&& a, B&& b, Y&& y) {
  auto const av = detail::arg_view(a);
  auto const bv = detail::arg_view(b);
  auto const yv = detail::arg_view(y);
  detail::check_elementwise(bv, "b", av, "a");
  detail::check_elementwise(yv, "y", av, "a");
  detail::check_same_or_apart(yv, "y", av, "a");
  detail::check_same_or_apart(yv, "y", bv, "b");
  using T = detail::value_t<decltype(yv)>;
  using C = compute_t<T>;
  detail::for_each_index(detail::ext(av, 0), detail::ext(av, 1), [&](index_t i, index_t j) {
    detail::at(yv, i, j) =
        static_cast<T>(static_cast<C>(detail::at(av, i, j)) + static_cast<C>(detail::at(bv, i, j)));
  });
}

//! The gradient at the fork x of y = x + f(x): dx = dy (through the skip) + dbranch (∂L/∂x
//! through f), overwriting dx; dx may be dy or dbranch. For y = a + b alone, ∂L/∂a = ∂L/∂b = dy:
//! pass dy on, nothing to compute.
template <class G, class B, class D>
requires HostArg<G, 2> && HostArg<B, 2> && HostArg<D, 2>
void residual_backward(G&& dy, B&& dbranch, D&& dx) {
  auto const gv = detail::arg_view(dy);
  auto const bv = detail::arg_view(dbranch);
  auto const dv = detail::arg_view(dx);
  detail::check_elementwise(bv, "dbranch", gv, "dy");
  detail::check_elementwise(dv, "dx", gv, "dy");
  detail::check_same_or_apart(dv, "dx", gv, "dy");
  detail::check_same_or_apart(dv, "dx", bv, "dbranch");
  using T = detail::value_t<decltype(dv)>;
  using C = compute_t<T>;
  detail::for_each_index(detail::ext(gv, 0), detail::ext(gv, 1), [&](index_t i, index_t j) {
    detail::at(dv, i, j) =
        static_cast<T>(static_cast<C>(detail::at(gv, i, j)) + static_cast<C>(detail::at(bv, i, j)));
  });
}

}  // namespace weft::nn
