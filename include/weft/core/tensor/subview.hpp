// weft/core/tensor/subview.hpp — views of views: as_strided, as_contiguous, slice, select,
// transpose, subview (cuda::std::submdspan's slices, with weft's checks), reshape and flatten.
// Each returns a view of the same elements; nothing is copied.
#pragma once

#include <weft/core/config.hpp>
#include <weft/core/error.hpp>        // WEFT_EXPECTS, WEFT_EXPECTS_SHAPE
#include <weft/core/tensor/view.hpp>  // Tensor, strided_view, detail::make_strided

#include <cuda/std/mdspan>  // full_extent_t, strided_slice
#include <cuda/std/tuple>
#include <cuda/std/utility>

#include <array>
#include <concepts>
#include <cstddef>
#include <limits>
#include <tuple>
#include <type_traits>
#include <utility>

namespace weft {

// ---- sub-views ------------------------------------------------------------------------------
// Return types are deduced (auto) so that a non-Tensor argument fails the Tensor constraint, with
// a diagnostic naming it, rather than a substitution in the return type (clang 14 substitutes the
// signature before checking constraints).

//! The same elements seen through a layout_stride view: strided_view<element_type, rank, space>.
template <Tensor V>
[[nodiscard]] auto as_strided(V const& v) {
  return detail::make_strided<typename V::element_type, V::rank(), memory_space_t<V>>(
      v.data_handle(), detail::extents_of(v), detail::strides_of(v));
}

//! A row-major contiguous view (tensor_view) of `v`'s elements; throws shape_error unless
//! is_contiguous(v).
template <Tensor V>
[[nodiscard]] auto as_contiguous(V const& v) {
  WEFT_EXPECTS_SHAPE(is_contiguous(v), "view", "a row-major contiguous view",
                     detail::concat("extents ", shape_string(v), " with strides ",
                                    detail::array_string(detail::strides_of(v))));
  return tensor_view<typename V::element_type, V::rank(), memory_space_t<V>>(
      v.data_handle(), dextents<V::rank()>(detail::extents_of(v)));
}

//! Elements [begin, end) along dimension `dim` as a strided_view; the rank is kept, so is every
//! other extent.
template <Tensor V>
requires(V::rank() >= 1) [[nodiscard]] auto slice(V const& v, int dim, index_t begin, index_t end) {
  constexpr int rank = static_cast<int>(V::rank());
  WEFT_EXPECTS(dim >= 0 && dim < rank, "dim", detail::concat("in [0, ", rank, ")"), dim);
  auto const n = static_cast<index_t>(v.extent(static_cast<std::size_t>(dim)));
  WEFT_EXPECTS(begin >= 0 && begin <= n, "begin", detail::concat("in [0, ", n, "]"), begin);
  WEFT_EXPECTS(end >= begin && end <= n, "end", detail::concat("in [", begin, ", ", n, "]"), end);
  auto ext = detail::extents_of(v);
  auto const str = detail::strides_of(v);
  ext[dim] = end - begin;
  bool const nonempty = begin < end && v.size() != 0;
  return detail::make_strided<typename V::element_type, V::rank(), memory_space_t<V>>(
      detail::advance(v.data_handle(), begin * str[dim], nonempty), ext, str);
}

//! The strided_view of rank - 1 at `index` along dimension `dim` (like t[:, index] for dim 1).
template <Tensor V>
requires(V::rank() >= 1) [[nodiscard]] auto select(V const& v, int dim, index_t index) {
  constexpr int rank = static_cast<int>(V::rank());
  WEFT_EXPECTS(dim >= 0 && dim < rank, "dim", detail::concat("in [0, ", rank, ")"), dim);
  auto const n = static_cast<index_t>(v.extent(static_cast<std::size_t>(dim)));
  WEFT_EXPECTS(index >= 0 && index < n, "index", detail::concat("in [0, ", n, ")"), index);
  auto const ext = detail::extents_of(v);
  auto const str = detail::strides_of(v);
  detail::index_array<V::rank() - 1> sub_ext{};
  detail::index_array<V::rank() - 1> sub_str{};
  for (int k = 0, j = 0; k < rank; ++k) {
    if (k == dim) continue;
    sub_ext[j] = ext[k];
    sub_str[j] = str[k];
    ++j;
  }
  return detail::make_strided<typename V::element_type, V::rank() - 1, memory_space_t<V>>(
      detail::advance(v.data_handle(), index * str[dim], v.size() != 0), sub_ext, sub_str);
}

//! Dimensions d0 and d1 swapped, as a strided_view (no data moves).
template <Tensor V>
requires(V::rank() >= 1) [[nodiscard]] auto transpose(V const& v, int d0, int d1) {
  constexpr int rank = static_cast<int>(V::rank());
  WEFT_EXPECTS(d0 >= 0 && d0 < rank, "d0", detail::concat("in [0, ", rank, ")"), d0);
  WEFT_EXPECTS(d1 >= 0 && d1 < rank, "d1", detail::concat("in [0, ", rank, ")"), d1);
  auto ext = detail::extents_of(v);
  auto str = detail::strides_of(v);
  std::swap(ext[d0], ext[d1]);
  std::swap(str[d0], str[d1]);
  return detail::make_strided<typename V::element_type, V::rank(), memory_space_t<V>>(
      v.data_handle(), ext, str);
}

//! The matrix transpose of a rank-2 view.
template <Tensor V>
requires(V::rank() == 2) [[nodiscard]] auto transpose(V const& v) { return transpose(v, 0, 1); }

//! `weft::all` in subview: the whole extent of that dimension.
inline constexpr ::cuda::std::full_extent_t all{};

namespace detail {

template <class S>
struct is_pair_slice : std::false_type {};
template <class A, class B>
struct is_pair_slice<std::pair<A, B>> : std::bool_constant<std::integral<A> && std::integral<B>> {};
template <class A, class B>
struct is_pair_slice<::cuda::std::pair<A, B>>
    : std::bool_constant<std::integral<A> && std::integral<B>> {};
template <class A, class B>
struct is_pair_slice<std::tuple<A, B>> : std::bool_constant<std::integral<A> && std::integral<B>> {
};
template <class A, class B>
struct is_pair_slice<::cuda::std::tuple<A, B>>
    : std::bool_constant<std::integral<A> && std::integral<B>> {};

template <class S>
struct is_strided_slice : std::false_type {};
template <class O, class E, class St>
struct is_strided_slice<::cuda::std::strided_slice<O, E, St>> : std::true_type {};

template <class S>
concept Slice = std::integral<S> || std::same_as<S, ::cuda::std::full_extent_t> ||
    is_pair_slice<S>::value || is_strided_slice<S>::value;

// One slice resolved against its dimension: the first index, how many indices it keeps, the
// step between them, and whether the dimension survives (an integer index drops it).
struct resolved_slice {
  index_t begin;
  index_t count;
  index_t step;
  bool keep;
};

template <class S>
resolved_slice resolve_slice(S const& s, std::size_t k, index_t n) {
  if constexpr (std::integral<S>) {
    auto const i = static_cast<index_t>(s);
    WEFT_EXPECTS(i >= 0 && i < n, concat("slices[", k, "]"), concat("an index in [0, ", n, ")"), i);
    return {i, 1, 1, false};
  } else if constexpr (std::same_as<S, ::cuda::std::full_extent_t>) {
    return {0, n, 1, true};
  } else if constexpr (is_pair_slice<S>::value) {
    using ::cuda::std::get;
    using std::get;
    auto const b = static_cast<index_t>(get<0>(s));
    auto const e = static_cast<index_t>(get<1>(s));
    WEFT_EXPECTS(b >= 0 && b <= e && e <= n, concat("slices[", k, "]"),
                 concat("a range {begin, end} with 0 <= begin <= end <= ", n),
                 concat("{", b, ", ", e, "}"));
    return {b, e - b, 1, true};
  } else {
    auto const off = static_cast<index_t>(s.offset);
    auto const ext = static_cast<index_t>(s.extent);
    auto const str = static_cast<index_t>(s.stride);
    WEFT_EXPECTS(off >= 0 && ext >= 0 && off + ext <= n && (ext == 0 || str > 0),
                 concat("slices[", k, "]"),
                 concat("a strided_slice with offset >= 0, extent >= 0, offset + extent <= ", n,
                        " and stride > 0"),
                 concat("{offset ", off, ", extent ", ext, ", stride ", str, "}"));
    // As submdspan: indices offset, offset + stride, ... below offset + extent.
    return {off, ext == 0 ? 0 : 1 + (ext - 1) / str, str > 0 ? str : 1, true};
  }
}

}  // namespace detail

//! A sub-view with one slice per dimension, as cuda::std::submdspan: an integer index (drops the
//! dimension), weft::all, a {begin, end} pair or tuple (std:: or cuda::std::), or a
//! cuda::std::strided_slice{offset, extent, stride}. Slices are bounds-checked
//! (invalid_argument_error naming `slices[k]`). The result is always a strided_view: CCCL
//! 3.0.1's submdspan gives layout_right views a wrong layout_right mapping for slices such as
//! (all, all, {1, 3}), so weft computes extents, strides and offset itself.
template <Tensor V, detail::Slice... S>
requires(sizeof...(S) == V::rank()) [[nodiscard]] auto subview(V const& v, S const&... slices) {
  constexpr std::size_t sub_rank = (std::size_t{0} + ... + (std::integral<S> ? 0u : 1u));
  auto const ext = detail::extents_of(v);
  auto const str = detail::strides_of(v);
  detail::index_array<sub_rank> sub_ext{};
  detail::index_array<sub_rank> sub_str{};
  index_t offset = 0;
  index_t count = 1;
  std::size_t k = 0;
  std::size_t j = 0;
  auto one = [&](auto const& s) {
    detail::resolved_slice const r = detail::resolve_slice(s, k, ext[k]);
    offset += r.begin * str[k];
    if (r.keep) {
      sub_ext[j] = r.count;
      sub_str[j] = r.step * str[k];
      count *= r.count;
      ++j;
    }
    ++k;
  };
  (one(slices), ...);
  return detail::make_strided<typename V::element_type, sub_rank, memory_space_t<V>>(
      detail::advance(v.data_handle(), offset, count > 0), sub_ext, sub_str);
}

//! A contiguous view (tensor_view) of the same elements with new extents; one extent may be -1
//! (inferred).
//! Throws shape_error if `v` is not contiguous or the element counts differ.
template <Tensor V, std::size_t NewRank>
[[nodiscard]] auto reshape(V const& v, std::array<index_t, NewRank> extents) {
  WEFT_EXPECTS_SHAPE(is_contiguous(v), "view", "a row-major contiguous view",
                     detail::concat("extents ", shape_string(v), " with strides ",
                                    detail::array_string(detail::strides_of(v))));
  auto const size = static_cast<index_t>(v.size());
  int inferred = -1;
  index_t known = 1;  // product of the given extents, saturated at index_t's maximum
  for (std::size_t k = 0; k != NewRank; ++k) {
    WEFT_EXPECTS_SHAPE(extents[k] >= -1, detail::concat("extents[", k, "]"),
                       ">= 0 (or -1 to infer)", extents[k]);
    if (extents[k] == -1) {
      WEFT_EXPECTS_SHAPE(inferred == -1, "extents", "at most one -1",
                         detail::array_string(extents));
      inferred = static_cast<int>(k);
    } else if (known != 0 && extents[k] > std::numeric_limits<index_t>::max() / known) {
      known = std::numeric_limits<index_t>::max();
    } else {
      known *= extents[k];
    }
  }
  if (inferred >= 0) {
    WEFT_EXPECTS_SHAPE(known > 0 && size % known == 0, "extents",
                       detail::concat("extents whose known product divides ", size,
                                      " (the view's size, extents ", shape_string(v), ")"),
                       detail::array_string(extents));
    extents[static_cast<std::size_t>(inferred)] = size / known;
    known = size;
  }
  WEFT_EXPECTS_SHAPE(known == size, "extents",
                     detail::concat(size, " elements (the view's extents ", shape_string(v), ")"),
                     detail::concat(known, " elements (", detail::array_string(extents), ")"));
  detail::index_array<NewRank> e{};
  for (std::size_t k = 0; k != NewRank; ++k) e[k] = extents[k];
  return tensor_view<typename V::element_type, NewRank, memory_space_t<V>>(v.data_handle(),
                                                                           dextents<NewRank>(e));
}

//! reshape(v, 4, -1, 2).
template <Tensor V, std::integral... I>
requires(sizeof...(I) >= 1) [[nodiscard]] auto reshape(V const& v, I... extents) {
  return reshape(v, std::array<index_t, sizeof...(I)>{static_cast<index_t>(extents)...});
}

//! The rank-1 contiguous view of all elements; throws shape_error unless is_contiguous(v).
template <Tensor V>
[[nodiscard]] auto flatten(V const& v) {
  return reshape(v, std::array<index_t, 1>{static_cast<index_t>(v.size())});
}

}  // namespace weft
