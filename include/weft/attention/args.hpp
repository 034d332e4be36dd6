// weft/attention/args.hpp — what the CPU attention entry points accept for a tensor argument (a
// host view, or an owning weft::tensor as the collectives take), and the check that no output
// shares memory with another argument.
#pragma once

#include <weft/attention/common.hpp>
#include <weft/core/error.hpp>
#include <weft/core/tensor.hpp>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <initializer_list>
#include <type_traits>
#include <utility>
#include <vector>

namespace weft::attention {

namespace detail {
template <class X>
struct is_owning_host_tensor : std::false_type {};
template <class T, std::size_t R>
struct is_owning_host_tensor<::weft::tensor<T, R, host_space>> : std::true_type {};
}  // namespace detail

//! A tensor argument of a CPU attention entry point: a host Tensor view, or an owning host
//! weft::tensor, whose view() is used. An output passed as an owning tensor must be a non-const
//! lvalue (a const tensor gives a read-only view, which does not compile as an output).
template <class X>
concept HostTensorArg = TensorIn<std::remove_cvref_t<X>, host_space> ||
    detail::is_owning_host_tensor<std::remove_cvref_t<X>>::value;

namespace detail {

//! The view an argument stands for: the view itself, or an owning tensor's view() (const
//! elements for a const tensor).
template <class X>
auto arg_view(X& x) {
  if constexpr (Tensor<std::remove_cv_t<X>>)
    return x;
  else
    return x.view();
}

using byte_range = std::pair<std::uintptr_t, std::uintptr_t>;

template <class T>
void append_ranges(std::vector<byte_range>& out, bshd<T> const& t) {
  for (std::int64_t b = 0; b < t.b; ++b)
    for (std::int64_t s = 0; s < t.s; ++s)
      for (std::int64_t h = 0; h < t.h; ++h) {
        auto const p = reinterpret_cast<std::uintptr_t>(t.row(b, s, h));
        out.emplace_back(p, p + static_cast<std::uintptr_t>(t.d) * sizeof(T));
      }
}
template <class T>
void append_ranges(std::vector<byte_range>& out, bhs<T> const& t) {
  for (std::int64_t b = 0; b < t.b; ++b)
    for (std::int64_t h = 0; h < t.h; ++h)
      for (std::int64_t s = 0; s < t.s; ++s) {
        auto const p = reinterpret_cast<std::uintptr_t>(&t.at(b, h, s));
        out.emplace_back(p, p + sizeof(T));
      }
}
//! The byte range from a view's lowest to its highest element (strides of either sign).
inline byte_range hull_of(std::uintptr_t base, std::size_t elem, std::int64_t last_bytes,
                          std::initializer_list<std::pair<std::int64_t, std::int64_t>> ext_stride) {
  std::int64_t lo = 0, hi = 0;
  for (auto const& [e, st] : ext_stride) {
    if (e == 0) return {0, 0};
    std::int64_t const reach = (e - 1) * st;
    (reach < 0 ? lo : hi) += reach;
  }
  return {base + static_cast<std::uintptr_t>(lo) * elem,
          base + static_cast<std::uintptr_t>(hi) * elem + static_cast<std::uintptr_t>(last_bytes)};
}
template <class T>
byte_range hull(bshd<T> const& t) {
  if (t.d == 0) return {0, 0};
  return hull_of(reinterpret_cast<std::uintptr_t>(t.data), sizeof(T),
                 t.d * static_cast<std::int64_t>(sizeof(T)),
                 {{t.b, t.sb}, {t.s, t.ss}, {t.h, t.sh}});
}
template <class T>
byte_range hull(bhs<T> const& t) {
  return hull_of(reinterpret_cast<std::uintptr_t>(t.data), sizeof(T),
                 static_cast<std::int64_t>(sizeof(T)), {{t.b, t.sb}, {t.h, t.sh}, {t.s, t.ss}});
}

//! Whether two raw views share a byte. Exact, element rows against element rows, so disjoint
//! views interleaved in one buffer (q and o as two slots of a packed tensor) pass; the sort only
//! runs when their address hulls intersect, which separately allocated tensors never do.
template <class A, class B>
bool share_memory(A const& a, B const& b) {
  auto const ha = hull(a), hb = hull(b);
  if (!(ha.first < ha.second && hb.first < hb.second && ha.first < hb.second &&
        hb.first < ha.second))
    return false;
  std::vector<byte_range> ra, rb;
  append_ranges(ra, a);
  append_ranges(rb, b);
  std::sort(ra.begin(), ra.end());
  std::sort(rb.begin(), rb.end());
  // Sweep by start: a range meets one of the other set that started earlier iff that set's
  // furthest end so far lies past its start.
  std::uintptr_t end_a = 0, end_b = 0;
  std::size_t i = 0, j = 0;
  while (i < ra.size() || j < rb.size()) {
    if (j == rb.size() || (i < ra.size() && ra[i].first <= rb[j].first)) {
      if (ra[i].first < end_b) return true;
      end_a = std::max(end_a, ra[i].second);
      ++i;
    } else {
      if (rb[j].first < end_a) return true;
      end_b = std::max(end_b, rb[j].second);
      ++j;
    }
  }
  return false;
}

//! Throws if output `out` (named `out_name`) shares memory with argument `in` (`in_name`): the
//! kernels read their inputs tile by tile while writing outputs, so an alias gives silent garbage.
template <class A, class B>
void check_no_alias(A const& out, char const* out_name, B const& in, char const* in_name) {
  WEFT_EXPECTS(!share_memory(out, in), out_name,
               ::weft::detail::concat("memory separate from `", in_name, "`"),
               ::weft::detail::concat("a view that overlaps `", in_name, "`"));
}

//! A forward's outputs o and lse may share memory with no input, nor with each other.
template <class Q, class K, class V, class O, class L>
void check_forward_aliases(bshd<Q> const& q, bshd<K> const& k, bshd<V> const& v, bshd<O> const& o,
                           bhs<L> const& lse) {
  check_no_alias(o, "o", q, "q");
  check_no_alias(o, "o", k, "k");
  check_no_alias(o, "o", v, "v");
  check_no_alias(lse, "lse", q, "q");
  check_no_alias(lse, "lse", k, "k");
  check_no_alias(lse, "lse", v, "v");
  check_no_alias(lse, "lse", o, "o");
}

//! A backward's outputs dq, dk, dv may share memory with no input (q, k, v, o, lse, dout), nor
//! with each other: they are zeroed before the inputs are read.
template <class Q, class K, class V, class O, class L, class G, class DQ, class DK, class DV>
void check_backward_aliases(bshd<Q> const& q, bshd<K> const& k, bshd<V> const& v, bshd<O> const& o,
                            bhs<L> const& lse, bshd<G> const& dout, bshd<DQ> const& dq,
                            bshd<DK> const& dk, bshd<DV> const& dv) {
  auto const against_inputs = [&](auto const& out, char const* name) {
    check_no_alias(out, name, q, "q");
    check_no_alias(out, name, k, "k");
    check_no_alias(out, name, v, "v");
    check_no_alias(out, name, o, "o");
    check_no_alias(out, name, lse, "lse");
    check_no_alias(out, name, dout, "dout");
  };
  against_inputs(dq, "dq");
  against_inputs(dk, "dk");
  against_inputs(dv, "dv");
  check_no_alias(dk, "dk", dq, "dq");
  check_no_alias(dv, "dv", dq, "dq");
  check_no_alias(dv, "dv", dk, "dk");
}

}  // namespace detail
}  // namespace weft::attention
