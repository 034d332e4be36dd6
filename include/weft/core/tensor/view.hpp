// weft/core/tensor/view.hpp — the non-owning half of weft's tensor vocabulary: space_accessor,
// index_t, tensor_view and strided_view (cuda::std::mdspan whose accessor carries the memory
// space), the Tensor concepts, shape_string and is_contiguous, and the index helpers the
// sub-views and algorithms share. Include this alone to take or pass views without paying for
// the owning tensor, the sub-views, the algorithms or the printer.
#pragma once

#include <weft/core/config.hpp>  // WEFT_HD
#include <weft/core/memory.hpp>  // MemorySpace, host_space, cuda_space

#include <cuda/std/array>   // index_array
#include <cuda/std/mdspan>  // the views

#include <array>
#include <concepts>
#include <cstddef>
#include <cstdint>
#include <string>
#include <type_traits>

namespace weft {

// ---- views ----------------------------------------------------------------------------------

//! mdspan AccessorPolicy over raw pointers that records in its type which memory space the
//! pointer belongs to. Access is a plain `p[i]` (as cuda::std::default_accessor); the space tag
//! only drives overload resolution and concepts, so views cost exactly a pointer plus a mapping.
template <class T, MemorySpace Space>
struct space_accessor {
  using offset_policy = space_accessor;
  using element_type = T;
  using reference = T&;
  using data_handle_type = T*;
  using memory_space = Space;

  constexpr space_accessor() noexcept = default;

  //! float -> float const within one space; never across spaces. Implicit, as
  //! default_accessor's, so that mdspan<T> converts to mdspan<T const>.
  template <class U>
  requires std::is_convertible_v<U (*)[], T (*)[]> WEFT_HD constexpr space_accessor(
      space_accessor<U, Space>) noexcept {}  // NOLINT

  WEFT_HD constexpr reference access(data_handle_type p, std::size_t i) const noexcept {
    return p[i];
  }
  WEFT_HD constexpr data_handle_type offset(data_handle_type p, std::size_t i) const noexcept {
    return p + i;
  }
};

//! Index type of every weft view: signed (differences and -1 sentinels stay meaningful) and
//! 64-bit (vocabulary-sized logits overflow 32 bits).
using index_t = std::int64_t;

template <std::size_t Rank>
using dextents = ::cuda::std::dextents<index_t, Rank>;

//! Row-major contiguous view (C order): the layout of every owning tensor.
template <class T, std::size_t Rank, MemorySpace Space = host_space>
using tensor_view =
    ::cuda::std::mdspan<T, dextents<Rank>, ::cuda::std::layout_right, space_accessor<T, Space>>;

//! View with arbitrary positive strides: what slicing, selecting and transposing return.
template <class T, std::size_t Rank, MemorySpace Space = host_space>
using strided_view =
    ::cuda::std::mdspan<T, dextents<Rank>, ::cuda::std::layout_stride, space_accessor<T, Space>>;

// ---- concepts -------------------------------------------------------------------------------

namespace detail {
template <class X>
struct memory_space_of {
  using type = typename X::memory_space;
};
template <class X>
requires requires { typename X::accessor_type::memory_space; }
struct memory_space_of<X> {
  using type = typename X::accessor_type::memory_space;
};
}  // namespace detail

//! The memory space of a view (its accessor's), an owning tensor or an executor.
template <class X>
using memory_space_t = typename detail::memory_space_of<std::remove_cvref_t<X>>::type;

//! Tensor: a non-owning, cheap-to-copy, rank-N view of elements in one memory space.
//! Syntactic requirements (every cuda::std::mdspan with a space_accessor meets them):
//!  - member types element_type, value_type, extents_type, layout_type, mapping_type,
//!    accessor_type, and accessor_type::memory_space which is a MemorySpace;
//!  - data_handle_type is element_type* (weft copies and launches on raw pointers);
//!  - static rank(); extent(r), stride(r) and size() return integers; data_handle(); mapping();
//!  - the layout is always strided (element (i...) lives at data_handle() + sum i_k * stride(k)).
//! Semantic requirements: copying a Tensor copies the reference, not the elements; extents are
//! non-negative; strides are positive. Owning tensors are not Tensors (they are move-only); pass
//! `t.view()`.
template <class V>
concept Tensor = std::copyable<V> && requires(V const& v, std::size_t r) {
  typename V::element_type;
  typename V::value_type;
  typename V::extents_type;
  typename V::layout_type;
  typename V::mapping_type;
  typename V::accessor_type;
  typename V::accessor_type::memory_space;
  requires MemorySpace<typename V::accessor_type::memory_space>;
  requires std::same_as<typename V::data_handle_type, typename V::element_type*>;
  { V::rank() } -> std::convertible_to<std::size_t>;
  { v.extent(r) } -> std::integral;
  { v.stride(r) } -> std::integral;
  { v.size() } -> std::integral;
  { v.data_handle() } -> std::convertible_to<typename V::element_type*>;
  v.mapping();
  requires V::is_always_strided();
};

//! A Tensor whose elements live in `Space`; host-only functions take TensorIn<host_space>, and
//! functions that take an executor E take TensorIn<memory_space_t<E>>.
template <class V, class Space>
concept TensorIn = Tensor<V> && std::same_as<memory_space_t<V>, Space>;

//! A Tensor whose layout is statically row-major contiguous (layout_right). Strided views may
//! still be contiguous at run time: see is_contiguous(v) and as_contiguous(v).
template <class V>
concept ContiguousTensor =
    Tensor<V> && std::same_as<typename V::layout_type, ::cuda::std::layout_right>;

//! A Tensor whose elements may be written.
template <class V>
concept MutableTensor = Tensor<V> && !std::is_const_v<typename V::element_type>;

static_assert(Tensor<tensor_view<float, 2>>);
static_assert(Tensor<strided_view<float const, 3, cuda_space>>);
static_assert(TensorIn<tensor_view<float, 0>, host_space>);
static_assert(ContiguousTensor<tensor_view<int, 1, cuda_space>>);
static_assert(!Tensor<::cuda::std::mdspan<float, dextents<1>>>);  // no memory space: not a Tensor

// ---- small helpers --------------------------------------------------------------------------

namespace detail {

template <std::size_t R>
using index_array = ::cuda::std::array<index_t, R>;

template <Tensor V>
index_array<V::rank()> extents_of(V const& v) {
  index_array<V::rank()> e{};
  if constexpr (V::rank() > 0)
    for (std::size_t k = 0; k != V::rank(); ++k) e[k] = static_cast<index_t>(v.extent(k));
  return e;
}

template <Tensor V>
index_array<V::rank()> strides_of(V const& v) {
  index_array<V::rank()> s{};
  if constexpr (V::rank() > 0)  // layout_right's stride() does not exist at rank 0
    for (std::size_t k = 0; k != V::rank(); ++k) s[k] = static_cast<index_t>(v.stride(k));
  return s;
}

template <class Array>
std::string array_string(Array const& a) {
  std::string out = "[";
  for (std::size_t k = 0; k != a.size(); ++k) {
    if (k != 0) out += ", ";
    out += std::to_string(static_cast<long long>(a[k]));
  }
  out += ']';
  return out;
}

template <std::size_t R>
std::array<index_t, R> to_std_array(index_array<R> const& a) {
  std::array<index_t, R> out{};
  for (std::size_t k = 0; k != R; ++k) out[k] = a[k];
  return out;
}

template <class T, std::size_t R, class Space>
strided_view<T, R, Space> make_strided(T* p, index_array<R> const& ext, index_array<R> const& str) {
  using mapping = typename ::cuda::std::layout_stride::template mapping<dextents<R>>;
  return strided_view<T, R, Space>(p, mapping(dextents<R>(ext), str));
}

// Empty slices keep the base pointer: offsetting it could point past the allocation.
template <class T>
T* advance(T* p, index_t elements, bool nonempty) {
  return nonempty ? p + elements : p;
}

}  // namespace detail

//! "[2, 3, 4]": the extents of a view, for messages.
template <Tensor V>
[[nodiscard]] std::string shape_string(V const& v) {
  return detail::array_string(detail::extents_of(v));
}

//! True iff the view is row-major contiguous: element (i...) sits at offset
//! sum i_k * prod_{j>k} extent(j). Dimensions of extent 1 may have any stride; empty views are
//! contiguous. Statically true for layout_right.
template <Tensor V>
[[nodiscard]] constexpr bool is_contiguous(V const& v) noexcept {
  if constexpr (ContiguousTensor<V> || V::rank() == 0) {
    return true;
  } else {
    if (v.size() == 0) return true;
    index_t expected = 1;
    for (std::size_t k = V::rank(); k-- > 0;) {
      auto const e = static_cast<index_t>(v.extent(k));
      if (e != 1 && static_cast<index_t>(v.stride(k)) != expected) return false;
      expected *= e;
    }
    return true;
  }
}

// ---- element loops shared by the algorithms --------------------------------------------------

namespace detail {

// Calls f(offset_a, offset_b) for every multi-index in row-major order, where the offsets are
// the index dotted with the strides sa and sb. The innermost dimension is a plain loop.
template <std::size_t R, class F>
void for_each_offset_pair(index_array<R> const& ext, index_array<R> const& sa,
                          index_array<R> const& sb, F&& f) {
  if constexpr (R == 0) {
    f(index_t{0}, index_t{0});
  } else {
    for (std::size_t k = 0; k != R; ++k)
      if (ext[k] == 0) return;
    index_array<R> idx{};
    index_t const inner = ext[R - 1];
    for (;;) {
      index_t oa = 0;
      index_t ob = 0;
      for (std::size_t k = 0; k + 1 < R; ++k) {
        oa += idx[k] * sa[k];
        ob += idx[k] * sb[k];
      }
      for (index_t i = 0; i < inner; ++i) f(oa + i * sa[R - 1], ob + i * sb[R - 1]);
      // Advance the outer multi-index (dimensions 0 .. R-2) like an odometer.
      std::size_t k = R - 1;
      for (;;) {
        if (k == 0) return;
        --k;
        if (++idx[k] < ext[k]) break;
        idx[k] = 0;
      }
    }
  }
}

// Row-major linear index -> element offset of a strided view; the same code on host and device.
template <std::size_t R>
struct strided_offset {
  index_array<R> extents;
  index_array<R> strides;
  WEFT_HD constexpr index_t operator()(index_t i) const noexcept {
    index_t offset = 0;
    for (std::size_t k = R; k-- > 0;) {
      index_t const q = i / extents[k];
      offset += (i - q * extents[k]) * strides[k];
      i = q;
    }
    return offset;
  }
};

template <Tensor V>
strided_offset<V::rank()> offsets_of(V const& v) {
  return {extents_of(v), strides_of(v)};
}

}  // namespace detail

}  // namespace weft
