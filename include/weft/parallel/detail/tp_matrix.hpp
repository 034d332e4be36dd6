// weft/parallel/detail/tp_matrix.hpp — HostMatrix, what the tensor-parallel layers take for an
// activation or a weight (a rank-2 host view, or an lvalue owning host tensor), and the helpers
// that turn one into a row-major tensor_view and check shapes with messages naming the argument.
#pragma once

#include <weft/core/error.hpp>
#include <weft/core/memory.hpp>
#include <weft/core/tensor/owning.hpp>
#include <weft/core/tensor/view.hpp>

#include <cstddef>
#include <type_traits>

namespace weft::parallel {

namespace detail {

template <class X>
struct matrix_traits {};

template <class V>
requires(TensorIn<V, host_space>&& V::rank() == 2) struct matrix_traits<V> {
  using element_type = typename V::element_type;  // const for a view of const
};

// A const view is still a view (its elements' constness is in its type).
template <class V>
requires(TensorIn<V, host_space>&& V::rank() == 2) struct matrix_traits<V const>
    : matrix_traits<V> {
};

template <class T>
struct matrix_traits<tensor<T, 2, host_space>> {
  using element_type = T;
};

template <class T>
struct matrix_traits<tensor<T, 2, host_space> const> {
  using element_type = T const;
};

template <class X>
inline constexpr bool is_owning_matrix_v = false;
template <class T>
inline constexpr bool is_owning_matrix_v<tensor<T, 2, host_space>> = true;

}  // namespace detail

//! HostMatrix: a [rows, cols] operand of the tensor-parallel layers: a rank-2 Tensor view in
//! host_space (row-major contiguous at run time, checked), or an owning host tensor<T, 2> passed
//! as an lvalue (a temporary owning tensor would be destroyed with what was written into it).
template <class X>
concept HostMatrix = requires {
  typename detail::matrix_traits<std::remove_reference_t<X>>::element_type;
}
&&(std::is_lvalue_reference_v<X> || !detail::is_owning_matrix_v<std::remove_cvref_t<X>>);

//! The element type a HostMatrix exposes, without const.
template <HostMatrix X>
using matrix_value_t =
    std::remove_const_t<typename detail::matrix_traits<std::remove_reference_t<X>>::element_type>;

//! A HostMatrix whose elements may be written (an output).
template <class X>
concept MutableHostMatrix = HostMatrix<X> &&
    !std::is_const_v<typename detail::matrix_traits<std::remove_reference_t<X>>::element_type>;

namespace detail {

//! The row-major view of a HostMatrix; throws shape_error naming `name` unless it is contiguous.
template <class X>
[[nodiscard]] auto as_matrix(X& x, char const* name) {
  using E = typename matrix_traits<std::remove_const_t<X>>::element_type;
  // A const owning tensor has const elements; a const view's elements are the view's own.
  using EC = std::conditional_t<std::is_const_v<X> && is_owning_matrix_v<std::remove_const_t<X>>,
                                E const, E>;
  if constexpr (is_owning_matrix_v<std::remove_const_t<X>>) {
    (void)name;
    return tensor_view<EC, 2>(x.data(), x.extent(0), x.extent(1));
  } else {
    WEFT_EXPECTS_SHAPE(
        is_contiguous(x), name, "a row-major contiguous view",
        ::weft::detail::concat("extents ", shape_string(x), " with strides ",
                               ::weft::detail::array_string(::weft::detail::strides_of(x))));
    return tensor_view<EC, 2>(x.data_handle(), static_cast<index_t>(x.extent(0)),
                              static_cast<index_t>(x.extent(1)));
  }
}

template <class X>
[[nodiscard]] auto as_const_matrix(X const& x, char const* name) {
  auto v = as_matrix(x, name);
  using E = std::remove_const_t<typename decltype(v)::element_type>;
  return tensor_view<E const, 2>(v);
}

//! Throws shape_error unless `m` is [rows, cols]; the message names `name` and both shapes.
template <class V>
void expect_extents(V const& m, index_t rows, index_t cols, char const* name) {
  WEFT_EXPECTS_SHAPE(m.extent(0) == rows && m.extent(1) == cols, name,
                     ::weft::detail::concat("[", rows, ", ", cols, "]"),
                     ::weft::detail::concat("[", m.extent(0), ", ", m.extent(1), "]"));
}

//! Throws shape_error unless `extent` (dimension `what` of argument `name`) divides into `parts`.
inline void expect_divisible(index_t extent, int parts, char const* name, char const* what) {
  WEFT_EXPECTS_SHAPE(
      parts >= 1 && extent % parts == 0, name,
      ::weft::detail::concat(what, " a multiple of the tensor-parallel size ", parts),
      ::weft::detail::concat(what, " ", extent));
}

}  // namespace detail

}  // namespace weft::parallel
