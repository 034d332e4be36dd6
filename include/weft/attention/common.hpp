// weft/attention/common.hpp — what every attention entry point shares: the options (scale, causal
// alignment, threads), the mask rule, the LSE type per input type, and the checked conversion of
// caller views ([batch, seq, heads, dim], dim contiguous) to raw strides.
#pragma once

#include <weft/core/config.hpp>
#include <weft/core/dtype.hpp>
#include <weft/core/error.hpp>
#include <weft/core/exec.hpp>
#include <weft/core/math.hpp>
#include <weft/core/tensor.hpp>

#include <cmath>
#include <cstdint>
#include <string>
#include <type_traits>

namespace weft::attention {

//! How a causal mask lines up when the query and key lengths differ. `top_left`: query i sees keys
//! j <= i (PyTorch's CPU kernel). `bottom_right`: j <= i + Sk - Sq (flash-attn >= 2.1; what a query
//! chunk against a longer KV prefix needs). With Sq == Sk both are the usual causal mask.
enum class causal_mode : std::uint8_t { none, top_left, bottom_right };

//! Options of every attention call. `scale` 0 means 1/sqrt(dim); otherwise finite and positive.
//! `num_threads` is read only by the entry points that take no executor: they run on
//! exec::host{num_threads} (n > 1: an OpenMP team of n, ignored without OpenMP; below 1: 1).
//! Inside thread ranks keep 1. The entry points that take an executor ignore it.
struct attention_options {
  double scale = 0.0;
  causal_mode causal = causal_mode::none;
  int num_threads = 1;
};

//! The host executor the executor-less entry points run on: exec::host{opt.num_threads}, with
//! values below 1 meaning 1 (as before executors, where only n > 1 started a team).
[[nodiscard]] inline exec::host host_executor(attention_options const& opt) noexcept {
  return exec::host{opt.num_threads > 1 ? opt.num_threads : 1};
}

//! Executors attention runs on: its tiles read and write host memory.
template <class E>
concept HostExecutor = Executor<E> && std::same_as<typename E::memory_space, host_space>;

//! Type of the per-row log-sum-exp for input type T (f32, or f64 for f64 inputs); the kernels
//! accumulate in the same type, weft::compute_t<T>.
template <class T>
using lse_t = compute_t<T>;

//! The mask as one rule: key j is visible from query i iff !causal or j <= i + offset. Top-left is
//! offset 0, bottom-right Sk - Sq; ring steps use other offsets (stripe: -1).
struct mask_rule {
  bool causal = false;
  std::int64_t offset = 0;
  WEFT_HD constexpr bool visible(std::int64_t i, std::int64_t j) const noexcept {
    return !causal || j <= i + offset;
  }
  //! One past the last visible key of row i, clamped to [0, sk].
  WEFT_HD constexpr std::int64_t key_end(std::int64_t i, std::int64_t sk) const noexcept {
    if (!causal) return sk;
    std::int64_t const e = i + offset + 1;
    return e < 0 ? 0 : (e > sk ? sk : e);
  }
};

inline mask_rule make_mask(causal_mode c, std::int64_t sq, std::int64_t sk) noexcept {
  switch (c) {
    case causal_mode::none: return {false, 0};
    case causal_mode::top_left: return {true, 0};
    case causal_mode::bottom_right: return {true, sk - sq};
  }
  return {false, 0};
}

//! The softmax scale an entry point uses: `scale` when it is a finite positive number, 1/sqrt(dim)
//! when it is 0 (the default). A NaN, infinite or negative scale, or a head dimension below 1, is
//! an invalid_argument_error: silently replacing it (as a NaN once was) or multiplying scores by
//! +inf (every row then looked as if it saw no key) hides the caller's bug.
inline double resolve_scale(double scale, std::int64_t dim) {
  WEFT_EXPECTS(dim >= 1, "q", "a head dimension of at least 1", dim);
  WEFT_EXPECTS(scale == 0.0 || (scale > 0.0 && std::isfinite(scale)), "opt.scale",
               "0 (meaning 1/sqrt(head dim)) or a finite positive number", scale);
  return scale > 0.0 ? scale : 1.0 / std::sqrt(static_cast<double>(dim));
}

namespace detail {

//! Raw form of a [batch, seq, heads, dim] tensor whose dim is contiguous.
template <class T>
struct bshd {
  T* data = nullptr;
  std::int64_t b = 0, s = 0, h = 0, d = 0;
  std::int64_t sb = 0, ss = 0, sh = 0;
  T* row(std::int64_t bi, std::int64_t si, std::int64_t hi) const noexcept {
    return data + bi * sb + si * ss + hi * sh;
  }
};

//! Raw form of a [batch, heads, seq] LSE tensor.
template <class T>
struct bhs {
  T* data = nullptr;
  std::int64_t b = 0, h = 0, s = 0;
  std::int64_t sb = 0, sh = 0, ss = 0;
  T& at(std::int64_t bi, std::int64_t hi, std::int64_t si) const noexcept {
    return data[bi * sb + hi * sh + si * ss];
  }
};

//! The same views with const elements.
template <class T>
bshd<T const> as_const(bshd<T> const& t) noexcept {
  return {t.data, t.b, t.s, t.h, t.d, t.sb, t.ss, t.sh};
}
template <class T>
bhs<T const> as_const(bhs<T> const& t) noexcept {
  return {t.data, t.b, t.h, t.s, t.sb, t.sh, t.ss};
}

template <class T>
bshd<T> contiguous_bshd(T* p, std::int64_t b, std::int64_t s, std::int64_t h,
                        std::int64_t d) noexcept {
  return {p, b, s, h, d, s * h * d, h * d, d};
}
template <class T>
bhs<T> contiguous_bhs(T* p, std::int64_t b, std::int64_t h, std::int64_t s) noexcept {
  return {p, b, h, s, h * s, s, 1};
}

template <class V>
using view_elem_t = typename V::element_type;

template <Tensor V>
auto as_bshd(V const& v, char const* name) {
  static_assert(V::rank() == 4, "weft: attention tensors are [batch, seq, heads, dim] (rank 4)");
  using T = view_elem_t<V>;
  WEFT_EXPECTS_SHAPE(v.extent(3) == 0 || v.stride(3) == 1, name, "dim stride 1",
                     static_cast<std::int64_t>(v.stride(3)));
  return bshd<T>{v.data_handle(),
                 static_cast<std::int64_t>(v.extent(0)),
                 static_cast<std::int64_t>(v.extent(1)),
                 static_cast<std::int64_t>(v.extent(2)),
                 static_cast<std::int64_t>(v.extent(3)),
                 static_cast<std::int64_t>(v.stride(0)),
                 static_cast<std::int64_t>(v.stride(1)),
                 static_cast<std::int64_t>(v.stride(2))};
}

template <Tensor V>
auto as_bhs(V const& v) {
  static_assert(V::rank() == 3, "weft: attention LSE tensors are [batch, heads, seq] (rank 3)");
  using T = view_elem_t<V>;
  return bhs<T>{v.data_handle(),
                static_cast<std::int64_t>(v.extent(0)),
                static_cast<std::int64_t>(v.extent(1)),
                static_cast<std::int64_t>(v.extent(2)),
                static_cast<std::int64_t>(v.stride(0)),
                static_cast<std::int64_t>(v.stride(1)),
                static_cast<std::int64_t>(v.stride(2))};
}

inline std::string shape_string(std::int64_t a, std::int64_t b, std::int64_t c, std::int64_t d) {
  return ::weft::detail::concat("[", a, ", ", b, ", ", c, ", ", d, "]");
}
inline std::string shape_string(std::int64_t a, std::int64_t b, std::int64_t c) {
  return ::weft::detail::concat("[", a, ", ", b, ", ", c, "]");
}

//! Checks q [B, Sq, Hq, D], k and v [B, Sk, Hkv, D] with Hq % Hkv == 0.
template <class Q, class K, class V>
void check_qkv(bshd<Q> const& q, bshd<K> const& k, bshd<V> const& v) {
  WEFT_EXPECTS_SHAPE(k.b == q.b && k.d == q.d, "k", shape_string(q.b, k.s, k.h, q.d),
                     shape_string(k.b, k.s, k.h, k.d));
  WEFT_EXPECTS_SHAPE(v.b == k.b && v.s == k.s && v.h == k.h && v.d == k.d, "v",
                     shape_string(k.b, k.s, k.h, k.d), shape_string(v.b, v.s, v.h, v.d));
  WEFT_EXPECTS_SHAPE(k.h > 0 && q.h % k.h == 0, "k",
                     ::weft::detail::concat("a head count dividing q's ", q.h, " heads"), k.h);
}

template <class A, class B>
void check_same_shape(bshd<A> const& want, bshd<B> const& got, char const* name) {
  WEFT_EXPECTS_SHAPE(want.b == got.b && want.s == got.s && want.h == got.h && want.d == got.d, name,
                     shape_string(want.b, want.s, want.h, want.d),
                     shape_string(got.b, got.s, got.h, got.d));
}

template <class A, class L>
void check_lse_shape(bshd<A> const& q, bhs<L> const& l, char const* name) {
  WEFT_EXPECTS_SHAPE(l.b == q.b && l.h == q.h && l.s == q.s, name, shape_string(q.b, q.h, q.s),
                     shape_string(l.b, l.h, l.s));
}

//! Throws invalid_argument_error naming `name` and the first index unless every element of `t` is
//! finite. q and k are scanned at entry (O(S·D), beside the O(S²·D) attention): an infinite or
//! NaN score would otherwise make its row look as if it saw no key (O = 0, lse = -inf). A
//! non-finite v propagates into o as NaN or inf, which is visible, so v is not scanned.
template <class T>
void check_finite(bshd<T> const& t, char const* name) {
  using C = compute_t<T>;
  for (std::int64_t bi = 0; bi < t.b; ++bi)
    for (std::int64_t si = 0; si < t.s; ++si)
      for (std::int64_t hi = 0; hi < t.h; ++hi) {
        T const* row = t.row(bi, si, hi);
        bool ok = true;
        for (std::int64_t di = 0; di < t.d; ++di) {
          C const x = static_cast<C>(row[di]);
          ok = ok & (x - x == C(0));  // false for inf and NaN; branch-free so it vectorises
        }
        if (!ok)
          for (std::int64_t di = 0; di < t.d; ++di)
            WEFT_EXPECTS(std::isfinite(static_cast<double>(static_cast<C>(row[di]))), name,
                         "finite values",
                         ::weft::detail::concat(static_cast<double>(static_cast<C>(row[di])),
                                                " at [", bi, ", ", si, ", ", hi, ", ", di, "]"));
      }
}

//! The checks every forward entry point makes: q, k, v agree (GQA heads divide), o is q's shape,
//! lse is [B, H, S] of q, the head dimension is at least 1, q and k are finite.
template <class Q, class K, class V, class O, class L>
void check_forward_shapes(bshd<Q> const& q, bshd<K> const& k, bshd<V> const& v, bshd<O> const& o,
                          bhs<L> const& lse) {
  check_qkv(q, k, v);
  check_same_shape(q, o, "o");
  check_lse_shape(q, lse, "lse");
  WEFT_EXPECTS(q.d >= 1, "q", "a head dimension of at least 1", q.d);
  check_finite(q, "q");
  check_finite(k, "k");
}

//! The checks every backward entry point adds: dout and dq are q's shape, dk and dv are k's.
template <class Q, class K, class G, class DQ, class DK, class DV>
void check_gradient_shapes(bshd<Q> const& q, bshd<K> const& k, bshd<G> const& dout,
                           bshd<DQ> const& dq, bshd<DK> const& dk, bshd<DV> const& dv) {
  check_same_shape(q, dout, "dout");
  check_same_shape(q, dq, "dq");
  check_same_shape(k, dk, "dk");
  check_same_shape(k, dv, "dv");
}

}  // namespace detail
}  // namespace weft::attention
