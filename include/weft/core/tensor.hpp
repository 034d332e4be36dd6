// weft/core/tensor.hpp — weft's tensor vocabulary: non-owning views (cuda::std::mdspan whose
// accessor carries the memory space), the owning `tensor<T, Rank, Space>`, the Tensor concepts,
// sub-views (slice, select, subview, transpose, reshape), copies between spaces and a printer.
#pragma once

#include <weft/core/config.hpp>
#include <weft/core/dtype.hpp>
#include <weft/core/error.hpp>
#include <weft/core/memory.hpp>

#include <cuda/std/array>
#include <cuda/std/mdspan>

#include <array>
#include <charconv>
#include <concepts>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <limits>
#include <ostream>
#include <string>
#include <string_view>
#include <tuple>
#include <type_traits>
#include <utility>
#include <vector>

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
    requires std::is_convertible_v<U (*)[], T (*)[]>
  WEFT_HD constexpr space_accessor(space_accessor<U, Space>) noexcept {}  // NOLINT

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

//! A Tensor whose elements are `Elem` (const or not).
template <class V, class Elem>
concept TensorOf = Tensor<V> && std::same_as<typename V::value_type, Elem>;

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

// ---- owning tensor --------------------------------------------------------------------------

//! Owning, move-only, row-major contiguous N-D array in `Space`. Host storage is 64-byte
//! aligned; CUDA storage comes from cudaMalloc. Contents start uninitialised: fill or copy into
//! it before reading. Get a Tensor with view() (or by implicit conversion of an lvalue).
template <class T, std::size_t Rank, MemorySpace Space = host_space>
class tensor {
  static_assert(std::is_object_v<T> && !std::is_const_v<T> && !std::is_volatile_v<T>,
                "weft: tensor<T>: T must be a non-const, non-volatile object type (a const view "
                "comes from view() const)");
  static_assert(std::is_trivially_copyable_v<T> && std::is_trivially_destructible_v<T>,
                "weft: tensor<T>: T must be trivially copyable (elements are moved with "
                "memcpy/cudaMemcpy and never constructed)");

 public:
  using element_type = T;
  using value_type = T;
  using index_type = index_t;
  using size_type = std::size_t;
  using extents_type = dextents<Rank>;
  using memory_space = Space;
  using view_type = tensor_view<T, Rank, Space>;
  using const_view_type = tensor_view<T const, Rank, Space>;

  //! An empty tensor (every extent 0, no storage).
  tensor() = default;

  //! Allocates storage for `extents` (uninitialised). Throws shape_error for a negative extent
  //! or a size that overflows.
  explicit tensor(std::array<index_t, Rank> const& extents) : extents_(checked(extents)) {
    data_ = static_cast<T*>(allocate_bytes(Space{}, size_bytes()));
  }

  tensor(tensor const&) = delete;
  tensor& operator=(tensor const&) = delete;
  tensor(tensor&& other) noexcept
      : data_(std::exchange(other.data_, nullptr)), extents_(std::exchange(other.extents_, {})) {}
  tensor& operator=(tensor&& other) noexcept {
    if (this != &other) {
      release();
      data_ = std::exchange(other.data_, nullptr);
      extents_ = std::exchange(other.extents_, {});
    }
    return *this;
  }
  ~tensor() { release(); }

  [[nodiscard]] view_type view() noexcept { return view_type(data_, extents_); }
  [[nodiscard]] const_view_type view() const noexcept { return const_view_type(data_, extents_); }
  operator view_type() & noexcept { return view(); }               // NOLINT: implicit on purpose
  operator const_view_type() const& noexcept { return view(); }    // NOLINT: implicit on purpose
  // A view of a temporary tensor would dangle at the end of the declaration.
  operator view_type() && = delete;
  operator const_view_type() const&& = delete;

  [[nodiscard]] T* data() noexcept { return data_; }
  [[nodiscard]] T const* data() const noexcept { return data_; }
  [[nodiscard]] static constexpr std::size_t rank() noexcept { return Rank; }
  [[nodiscard]] index_t extent(std::size_t r) const noexcept { return extents_.extent(r); }
  [[nodiscard]] extents_type const& extents() const noexcept { return extents_; }
  [[nodiscard]] std::size_t size() const noexcept {
    std::size_t n = 1;
    for (std::size_t k = 0; k != Rank; ++k) n *= static_cast<std::size_t>(extents_.extent(k));
    return n;
  }
  [[nodiscard]] std::size_t size_bytes() const noexcept { return size() * sizeof(T); }
  [[nodiscard]] bool empty() const noexcept { return size() == 0; }

 private:
  static extents_type checked(std::array<index_t, Rank> const& e) {
    std::size_t count = 1;
    constexpr auto max_count =
        static_cast<std::size_t>(std::numeric_limits<index_t>::max()) / sizeof(T);
    for (std::size_t k = 0; k != Rank; ++k) {
      WEFT_EXPECTS_SHAPE(e[k] >= 0, detail::concat("extents[", k, "]"), ">= 0", e[k]);
      auto const ek = static_cast<std::size_t>(e[k]);
      WEFT_EXPECTS_SHAPE(
          ek == 0 || count <= max_count / ek, "extents",
          detail::concat("at most ", max_count, " elements of ", sizeof(T), " bytes"),
          detail::array_string(e));
      count *= ek;
    }
    detail::index_array<Rank> ce{};
    for (std::size_t k = 0; k != Rank; ++k) ce[k] = e[k];
    return extents_type(ce);
  }

  void release() noexcept {
    deallocate_bytes(Space{}, data_, size_bytes());
    data_ = nullptr;
  }

  T* data_ = nullptr;
  extents_type extents_{};
};

//! make_tensor<float>(2, 3) -> host tensor<float, 2>; make_tensor<float, cuda_space>(n) for
//! device memory. Contents are uninitialised. Negative extents throw shape_error naming the
//! dimension.
template <class T, MemorySpace Space = host_space, std::integral... I>
[[nodiscard]] tensor<T, sizeof...(I), Space> make_tensor(I... extents) {
  return tensor<T, sizeof...(I), Space>(
      std::array<index_t, sizeof...(I)>{static_cast<index_t>(extents)...});
}

//! make_tensor<float>(std::array{2, 3}).
template <class T, MemorySpace Space = host_space, std::integral I, std::size_t Rank>
[[nodiscard]] tensor<T, Rank, Space> make_tensor(std::array<I, Rank> const& extents) {
  std::array<index_t, Rank> e{};
  for (std::size_t k = 0; k != Rank; ++k) e[k] = static_cast<index_t>(extents[k]);
  return tensor<T, Rank, Space>(e);
}

//! make_tensor<float>(other_view.extents()): a tensor shaped like another.
template <class T, MemorySpace Space = host_space, class IndexType, std::size_t... Ext>
[[nodiscard]] tensor<T, sizeof...(Ext), Space> make_tensor(
    ::cuda::std::extents<IndexType, Ext...> const& extents) {
  std::array<index_t, sizeof...(Ext)> e{};
  for (std::size_t k = 0; k != sizeof...(Ext); ++k) e[k] = static_cast<index_t>(extents.extent(k));
  return tensor<T, sizeof...(Ext), Space>(e);
}

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
  requires(V::rank() >= 1)
[[nodiscard]] auto slice(V const& v, int dim, index_t begin, index_t end) {
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
  requires(V::rank() >= 1)
[[nodiscard]] auto select(V const& v, int dim, index_t index) {
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
  requires(V::rank() >= 1)
[[nodiscard]] auto transpose(V const& v, int d0, int d1) {
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
  requires(V::rank() == 2)
[[nodiscard]] auto transpose(V const& v) {
  return transpose(v, 0, 1);
}

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
struct is_pair_slice<std::tuple<A, B>>
    : std::bool_constant<std::integral<A> && std::integral<B>> {};
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
    using std::get;
    using ::cuda::std::get;
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
  requires(sizeof...(S) == V::rank())
[[nodiscard]] auto subview(V const& v, S const&... slices) {
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
  requires(sizeof...(I) >= 1)
[[nodiscard]] auto reshape(V const& v, I... extents) {
  return reshape(v, std::array<index_t, sizeof...(I)>{static_cast<index_t>(extents)...});
}

//! The rank-1 contiguous view of all elements; throws shape_error unless is_contiguous(v).
template <Tensor V>
[[nodiscard]] auto flatten(V const& v) {
  return reshape(v, std::array<index_t, 1>{static_cast<index_t>(v.size())});
}

// ---- element loops, copy and fill -----------------------------------------------------------

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

template <Tensor Dst, Tensor Src>
void check_same_extents(Dst const& dst, Src const& src) {
  bool same = true;
  for (std::size_t k = 0; k != Dst::rank(); ++k)
    same = same && static_cast<index_t>(dst.extent(k)) == static_cast<index_t>(src.extent(k));
  WEFT_EXPECTS_SHAPE(same, "src", concat("extents ", shape_string(dst), " (those of `dst`)"),
                     shape_string(src));
}

template <Tensor Dst, Tensor Src>
void host_strided_copy(Dst const& dst, Src const& src) {
  auto* const d = dst.data_handle();
  auto const* const s = src.data_handle();
  for_each_offset_pair<Dst::rank()>(extents_of(dst), strides_of(dst), strides_of(src),
                                    [&](index_t od, index_t os) { d[od] = s[os]; });
}

//! The bytes [first, last) that a view's elements lie in (negative strides included); empty for a
//! view with no elements. Addresses as integers: comparing pointers into unrelated objects is
//! unspecified, and unsigned arithmetic wraps where a negative stride reaches below the handle.
template <Tensor V>
std::pair<std::uintptr_t, std::uintptr_t> byte_span(V const& v) {
  using T = typename V::value_type;
  auto const ext = extents_of(v);
  auto const str = strides_of(v);
  index_t lo = 0, hi = 0;
  for (std::size_t k = 0; k != V::rank(); ++k) {
    if (ext[k] == 0) return {0, 0};
    index_t const reach = (ext[k] - 1) * str[k];
    (reach < 0 ? lo : hi) += reach;
  }
  auto const base = reinterpret_cast<std::uintptr_t>(v.data_handle());
  return {base + static_cast<std::uintptr_t>(lo) * sizeof(T),
          base + static_cast<std::uintptr_t>(hi + 1) * sizeof(T)};
}

//! Whether the byte ranges of two views intersect (a conservative test: interleaved views that
//! share no element still count, and are then copied through a snapshot, which is also correct).
template <Tensor A, Tensor B>
bool spans_overlap(A const& a, B const& b) {
  auto const [a0, a1] = byte_span(a);
  auto const [b0, b1] = byte_span(b);
  return a0 < a1 && b0 < b1 && a0 < b1 && b0 < a1;
}

}  // namespace detail

//! Copies src's elements into dst (same rank, same extents, same value type), across memory
//! spaces: one memcpy/cudaMemcpy when both are contiguous, an element loop between strided host
//! views, a host staging buffer when a strided host view meets a contiguous device view. A
//! strided device view throws error(errc::unsupported): use copy(exec, dst, src) from exec.hpp.
//! Shapes are checked first (shape_error); on any error nothing has been written.
//! Overlapping host views are copied as if all of src were read before dst is written (memmove
//! for two contiguous views, a snapshot of src otherwise), so an in-place shift or transpose is
//! well defined. Overlapping device views throw invalid_argument_error before anything is written.
template <Tensor Dst, Tensor Src>
  requires MutableTensor<Dst> && std::same_as<typename Dst::value_type, typename Src::value_type> &&
           (Dst::rank() == Src::rank())
void copy(Dst const& dst, Src const& src) {
  using T = typename Dst::value_type;
  using dst_space = memory_space_t<Dst>;
  using src_space = memory_space_t<Src>;
  detail::check_same_extents(dst, src);
  if (dst.size() == 0) return;
  bool const dst_c = is_contiguous(dst);
  bool const src_c = is_contiguous(src);
  if constexpr (dst_space::host_accessible && src_space::host_accessible) {
    if (detail::spans_overlap(dst, src)) {
      if (dst_c && src_c) {
        std::memmove(dst.data_handle(), src.data_handle(), dst.size() * sizeof(T));
      } else {
        tensor<T, Dst::rank(), host_space> snapshot(detail::to_std_array(detail::extents_of(dst)));
        detail::host_strided_copy(snapshot.view(), src);
        detail::host_strided_copy(dst, snapshot.view());
      }
      return;
    }
  } else if constexpr (std::same_as<dst_space, src_space>) {
    WEFT_EXPECTS(!detail::spans_overlap(dst, src), "dst",
                 "a device view that does not overlap `src` (copy through a separate buffer)",
                 "overlapping byte ranges");
  }
  if (dst_c && src_c) {
    copy_bytes(dst_space{}, dst.data_handle(), src_space{}, src.data_handle(),
               dst.size() * sizeof(T));
  } else if constexpr (dst_space::host_accessible && src_space::host_accessible) {
    detail::host_strided_copy(dst, src);
  } else {
    bool const device_side_contiguous =
        (dst_space::host_accessible || dst_c) && (src_space::host_accessible || src_c);
    if (!device_side_contiguous)
      throw error(errc::unsupported,
                  detail::concat("weft::copy: a non-contiguous view in device memory (dst strides ",
                                 detail::array_string(detail::strides_of(dst)), ", src strides ",
                                 detail::array_string(detail::strides_of(src)),
                                 ") needs a kernel; use weft::copy(exec, dst, src) from "
                                 "<weft/core/exec.hpp> in a .cu translation unit"),
                  source_location::current());
    tensor<T, Dst::rank(), host_space> staging(detail::to_std_array(detail::extents_of(dst)));
    if constexpr (dst_space::host_accessible) {
      copy_bytes(host_space{}, staging.data(), src_space{}, src.data_handle(),
                 staging.size_bytes());
      detail::host_strided_copy(dst, staging.view());
    } else {
      detail::host_strided_copy(staging.view(), src);
      copy_bytes(dst_space{}, dst.data_handle(), host_space{}, staging.data(),
                 staging.size_bytes());
    }
  }
}

//! Sets every element of a host view to `value`.
template <TensorIn<host_space> V>
  requires MutableTensor<V>
void fill(V const& v, typename V::value_type const& value) {
  auto* const p = v.data_handle();
  auto const str = detail::strides_of(v);
  detail::for_each_offset_pair<V::rank()>(detail::extents_of(v), str, str,
                                          [&](index_t o, index_t) { p[o] = value; });
}

// ---- printing -------------------------------------------------------------------------------

//! Printer settings, as numpy's: tensors with more than `threshold` elements show only the first
//! and last `edge_items` entries of each dimension, with "..." between.
struct print_options {
  index_t threshold = 1000;
  index_t edge_items = 3;
};

namespace detail {

template <class T>
constexpr std::string_view element_name() {
  using U = std::remove_cv_t<T>;
  if constexpr (Element<U>) return name(dtype_of<U>);  // f32, f64, bf16, f16, i32, i64, u8
  else if constexpr (std::is_same_v<U, bool>) return "bool";
  else if constexpr (std::is_integral_v<U> && std::is_signed_v<U>) {
    if constexpr (sizeof(U) == 1) return "i8";
    else if constexpr (sizeof(U) == 2) return "i16";
    else if constexpr (sizeof(U) == 4) return "i32";
    else return "i64";
  } else if constexpr (std::is_integral_v<U>) {
    if constexpr (sizeof(U) == 1) return "u8";
    else if constexpr (sizeof(U) == 2) return "u16";
    else if constexpr (sizeof(U) == 4) return "u32";
    else return "u64";
  } else {
    return "?";
  }
}

template <class T>
std::string format_element(T const& x) {
  char buf[64];
  if constexpr (std::is_same_v<T, bool>) {
    return x ? "true" : "false";
  } else if constexpr (std::is_integral_v<T>) {
    auto const r = std::is_signed_v<T>
                       ? std::to_chars(buf, buf + sizeof buf, static_cast<long long>(x))
                       : std::to_chars(buf, buf + sizeof buf, static_cast<unsigned long long>(x));
    return std::string(buf, r.ptr);
  } else if constexpr (std::is_floating_point_v<T>) {
    // Shortest text that reads back to the same value: 0.1f prints "0.1", 3.0 prints "3".
    auto const r = std::to_chars(buf, buf + sizeof buf, x);
    return std::string(buf, r.ptr);
  } else if constexpr (requires { static_cast<float>(x); }) {
    // bf16, f16 and other storage types print the float they decode to.
    auto const r = std::to_chars(buf, buf + sizeof buf, static_cast<float>(x));
    return std::string(buf, r.ptr);
  } else {
    return "?";
  }
}

template <class V>
std::string header(V const& v) {
  return concat("tensor<", element_name<typename V::value_type>(), ">", shape_string(v), " ",
                memory_space_t<V>::name);
}

// Host-accessible views only. Two passes over the same order: format the shown elements (to pad
// them to one width), then emit brackets and separators numpy-style.
template <class V>
std::string format_host(V const& v, print_options const& opt) {
  constexpr std::size_t R = V::rank();
  if (R > 0 && v.size() == 0) return "[]";  // numpy prints any empty array so
  auto const ext = extents_of(v);
  auto const str = strides_of(v);
  bool const summarise = static_cast<index_t>(v.size()) > opt.threshold;
  std::array<std::vector<index_t>, R> shown{};  // -1 stands for "..."
  for (std::size_t k = 0; k != R; ++k) {
    index_t const edge = opt.edge_items < 0 ? 0 : opt.edge_items;
    if (summarise && ext[k] > 2 * edge) {
      for (index_t i = 0; i < edge; ++i) shown[k].push_back(i);
      shown[k].push_back(-1);
      for (index_t i = ext[k] - edge; i < ext[k]; ++i) shown[k].push_back(i);
    } else {
      for (index_t i = 0; i < ext[k]; ++i) shown[k].push_back(i);
    }
  }
  auto const* const p = v.data_handle();
  std::vector<std::string> items;
  auto collect = [&](auto&& self, std::size_t depth, index_t offset) -> void {
    if (depth == R) {
      items.push_back(format_element(static_cast<typename V::value_type>(p[offset])));
      return;
    }
    for (index_t i : shown[depth])
      if (i >= 0) self(self, depth + 1, offset + i * str[depth]);
  };
  collect(collect, 0, 0);
  std::size_t width = 0;
  for (auto const& s : items) width = s.size() > width ? s.size() : width;

  std::string out;
  std::size_t next = 0;
  auto emit = [&](auto&& self, std::size_t depth) -> void {
    if (depth == R) {
      out.append(width - items[next].size(), ' ');
      out += items[next++];
      return;
    }
    out += '[';
    bool first = true;
    for (index_t i : shown[depth]) {
      if (!first) {
        if (depth + 1 == R) {
          out += ", ";
        } else {
          out += ',';
          out.append(R - 1 - depth, '\n');
          out.append(depth + 1, ' ');
        }
      }
      first = false;
      if (i < 0) {
        out += "...";
      } else {
        self(self, depth + 1);
      }
    }
    out += ']';
  };
  emit(emit, 0);
  return out;
}

}  // namespace detail

//! "tensor<f32>[2, 3] host\n[[1, 2, 3],\n [4, 5, 6]]": element type, extents, memory space, then
//! the values numpy-style (right-aligned to a common width; large tensors summarised with ...).
//! Device views are copied to the host first when they are contiguous and the CUDA runtime is
//! available; otherwise only the header is printed.
template <Tensor V>
[[nodiscard]] std::string to_string(V const& v, print_options const& options = {}) {
  std::string out = detail::header(v);
  out += '\n';
  if constexpr (memory_space_t<V>::host_accessible) {
    out += detail::format_host(v, options);
  } else {
#if WEFT_HAS_CUDA_RUNTIME
    if (is_contiguous(v)) {
      auto staging = make_tensor<typename V::value_type>(v.extents());
      weft::copy(staging.view(), v);
      out += detail::format_host(staging.view(), options);
      return out;
    }
    out += "<non-contiguous view in ";
    out += memory_space_t<V>::name;
    out += " memory: copy it to the host to print its values>";
#else
    out += "<";
    out += memory_space_t<V>::name;
    out += " memory: printing its values needs the CUDA runtime (weft::cuda)>";
#endif
  }
  return out;
}

//! Streams to_string(v). Found by ADL through the view's weft::space_accessor.
template <Tensor V>
std::ostream& operator<<(std::ostream& os, V const& v) {
  return os << to_string(v);
}

template <class T, std::size_t Rank, MemorySpace Space>
[[nodiscard]] std::string to_string(tensor<T, Rank, Space> const& t,
                                    print_options const& options = {}) {
  return to_string(t.view(), options);
}

template <class T, std::size_t Rank, MemorySpace Space>
std::ostream& operator<<(std::ostream& os, tensor<T, Rank, Space> const& t) {
  return os << to_string(t.view());
}

}  // namespace weft
