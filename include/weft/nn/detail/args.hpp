// weft/nn/detail/args.hpp — what nn's entry points accept for a tensor argument (a host view, or an
// lvalue owning weft::tensor, as attention/args.hpp), element access through a view's mapping, the
// shape checks that name argument, expected and actual, and the overlap check for outputs.
#pragma once

#include <weft/core/dtype.hpp>
#include <weft/core/error.hpp>
#include <weft/core/math.hpp>
#include <weft/core/tensor/owning.hpp>
#include <weft/core/tensor/view.hpp>

#include <cstddef>
#include <cstdint>
#include <string>
#include <type_traits>
#include <utility>

namespace weft::nn {

namespace detail {
template <class X>
struct is_owning_host_tensor : std::false_type {};
template <class T, std::size_t R>
struct is_owning_host_tensor<::weft::tensor<T, R, host_space>> : std::true_type {};

template <class X>
struct rank_of {
  static constexpr std::size_t value = std::remove_cvref_t<X>::rank();
};
template <class T, std::size_t R>
struct rank_of<::weft::tensor<T, R, host_space>> {
  static constexpr std::size_t value = R;
};
}  // namespace detail

//! A tensor argument of rank `Rank` of an nn entry point: a host Tensor view (any strides), or an
//! lvalue owning host weft::tensor, whose view() is used (an rvalue tensor would die with the
//! call, so it does not bind). Outputs must have non-const elements.
template <class X, std::size_t Rank>
concept HostArg = (TensorIn<std::remove_cvref_t<X>, host_space> ||
                   (std::is_lvalue_reference_v<X> &&
                    detail::is_owning_host_tensor<std::remove_cvref_t<X>>::value)) &&
                  detail::rank_of<std::remove_cvref_t<X>>::value == Rank;

namespace detail {

//! The view an argument stands for: the view itself, or an owning tensor's view() (const elements
//! for a const tensor).
template <class X>
auto arg_view(X& x) {
  if constexpr (Tensor<std::remove_cv_t<X>>)
    return x;
  else
    return x.view();
}

template <class V>
using value_t = std::remove_const_t<typename V::element_type>;

//! The element types nn layers store: f32, f64, bf16, f16 (arithmetic in compute_t).
template <class T>
inline constexpr bool is_nn_element_v = std::is_same_v<T, float> || std::is_same_v<T, double> ||
                                        std::is_same_v<T, bf16> || std::is_same_v<T, f16>;

//! Element (i) / (i, j) by the view's mapping, so strided views work as contiguous ones.
template <class V>
decltype(auto) at(V const& v, index_t i) {
  return v.data_handle()[v.mapping()(i)];
}
template <class V>
decltype(auto) at(V const& v, index_t i, index_t j) {
  return v.data_handle()[v.mapping()(i, j)];
}

template <class V>
index_t ext(V const& v, std::size_t r) {
  return static_cast<index_t>(v.extent(r));
}

//! "[a, b]" for the messages of the shape checks.
inline std::string dims(index_t a) { return ::weft::detail::concat("[", a, "]"); }
inline std::string dims(index_t a, index_t b) {
  return ::weft::detail::concat("[", a, ", ", b, "]");
}

//! Byte range from a view's first to one past its last element; {0, 0} when empty.
template <class V>
std::pair<std::uintptr_t, std::uintptr_t> byte_hull(V const& v) {
  if (v.size() == 0) return {0, 0};
  index_t last = 0;
  for (std::size_t r = 0; r != V::rank(); ++r)
    last += (ext(v, r) - 1) * static_cast<index_t>(v.stride(r));
  auto const base = reinterpret_cast<std::uintptr_t>(v.data_handle());
  constexpr auto elem = sizeof(typename V::element_type);
  return {base, base + static_cast<std::uintptr_t>(last + 1) * elem};
}

//! Throws invalid_argument_error if output `out` may share memory with input `in`: the layers read
//! inputs while writing outputs. Compares address hulls, so two views interleaved in one buffer
//! are refused too (pass separate buffers).
template <class O, class I>
void check_no_overlap(O const& out, char const* out_name, I const& in, char const* in_name) {
  auto const a = byte_hull(out);
  auto const b = byte_hull(in);
  bool const overlap =
      a.first < a.second && b.first < b.second && a.first < b.second && b.first < a.second;
  WEFT_EXPECTS(!overlap, out_name, ::weft::detail::concat("memory separate from `", in_name, "`"),
               ::weft::detail::concat("a view that overlaps `", in_name, "`"));
}

}  // namespace detail
}  // namespace weft::nn
