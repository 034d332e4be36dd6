// weft/nn/rope.hpp — rotary position embedding in the rotate-half (GPT-NeoX, Megatron, HF LLaMA)
// form over packed rows x [T, H·D]: each head's pair (i, i + D/2) turns by pos·base^(−2i/D). The
// positions are given per row, so packed documents restart at 0; the backward is the inverse turn.
//
// Angles are formed in the compute type (as HF's f32 inv_freq): f32 results are within
// 1e-5 · max|reference| of f64 for positions up to a few hundred (the angle's rounding grows with
// it).
#pragma once

#include <weft/core/config.hpp>
#include <weft/core/error.hpp>
#include <weft/core/math.hpp>
#include <weft/core/tensor/view.hpp>
#include <weft/nn/activation.hpp>
#include <weft/nn/detail/args.hpp>

#include <cuda/std/cmath>

#include <cmath>
#include <concepts>
#include <cstddef>
#include <span>

namespace weft::nn {

//! The angle of pair i (0 ≤ i < D/2) of a head of width D at position pos: pos·base^(−2i/D).
template <class C>
struct rope_angle_fn {
  C base;
  index_t head_dim;
  WEFT_HD C operator()(index_t pos, index_t i) const noexcept {
    C const inv_freq = ::cuda::std::pow(base, -C(2) * static_cast<C>(i) / static_cast<C>(head_dim));
    return static_cast<C>(pos) * inv_freq;
  }
};

//! Turns the pair (x1, x2) by the angle whose cosine and sine are c and s; `inverse` turns back.
struct rope_rotate_fn {
  template <class C>
  WEFT_HD void operator()(C x1, C x2, C c, C s, bool inverse, C& y1, C& y2) const noexcept {
    if (inverse) s = -s;
    y1 = x1 * c - x2 * s;
    y2 = x2 * c + x1 * s;
  }
};

namespace detail {
template <class X, class Y, class I>
void rope_impl(X const& xv, std::span<I const> positions, index_t head_dim, Y const& yv,
               double base, bool inverse, char const* x_name, char const* y_name) {
  using T = value_t<Y>;
  using C = compute_t<T>;
  check_elementwise(yv, y_name, xv, x_name);
  index_t const t = ext(xv, 0), w = ext(xv, 1);
  WEFT_EXPECTS(head_dim > 0 && head_dim % 2 == 0, "head_dim", "an even width > 0", head_dim);
  WEFT_EXPECTS_SHAPE(w % head_dim == 0, x_name,
                     ::weft::detail::concat("[", t, ", H·", head_dim, "] (whole heads)"),
                     shape_string(xv));
  WEFT_EXPECTS_SHAPE(static_cast<index_t>(positions.size()) == t, "positions",
                     ::weft::detail::concat(t, " elements (one per row)"), positions.size());
  WEFT_EXPECTS(std::isfinite(base) && base > 1, "base", "a finite value > 1", base);
  for (std::size_t k = 0; k < positions.size(); ++k)
    WEFT_EXPECTS(positions[k] >= 0, ::weft::detail::concat("positions[", k, "]"), ">= 0",
                 static_cast<long long>(positions[k]));
  check_same_or_apart(yv, y_name, xv, x_name);
  rope_angle_fn<C> const angle{static_cast<C>(base), head_dim};
  index_t const half = head_dim / 2;
  for (index_t r = 0; r < t; ++r) {
    auto const pos = static_cast<index_t>(positions[static_cast<std::size_t>(r)]);
    for (index_t i = 0; i < half; ++i) {
      C const a = angle(pos, i);
      C const c = ::cuda::std::cos(a), s = ::cuda::std::sin(a);
      for (index_t h0 = 0; h0 < w; h0 += head_dim) {
        C y1, y2;
        rope_rotate_fn{}(static_cast<C>(at(xv, r, h0 + i)),
                         static_cast<C>(at(xv, r, h0 + i + half)), c, s, inverse, y1, y2);
        at(yv, r, h0 + i) = static_cast<T>(y1);
        at(yv, r, h0 + i + half) = static_cast<T>(y2);
      }
    }
  }
}
}  // namespace detail

//! y = RoPE(x) (overwrites y; y may be x). x, y [T, H·head_dim]; positions [T] (≥ 0, int32 or
//! int64); base 10000 as GPT-NeoX and LLaMA. Throws before writing anything.
template <class X, std::integral I, class Y>
requires HostArg<X, 2> && HostArg<Y, 2>
void rope_forward(X&& x, std::span<I const> positions, index_t head_dim, Y&& y,
                  double base = 10000.0) {
  detail::rope_impl(detail::arg_view(x), positions, head_dim, detail::arg_view(y), base, false, "x",
                    "y");
}

//! dx = RoPE⁻¹(dy): the rotation is orthogonal, so its gradient is the inverse turn (overwrites
//! dx; dx may be dy).
template <class G, std::integral I, class D>
requires HostArg<G, 2> && HostArg<D, 2>
void rope_backward(G&& dy, std::span<I const> positions, index_t head_dim, D&& dx,
                   double base = 10000.0) {
  detail::rope_impl(detail::arg_view(dy), positions, head_dim, detail::arg_view(dx), base, true,
                    "dy", "dx");
}

}  // namespace weft::nn
