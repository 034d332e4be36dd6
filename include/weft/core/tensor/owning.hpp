// weft/core/tensor/owning.hpp — the owning half of weft's tensor vocabulary: the move-only,
// row-major `tensor<T, Rank, Space>` and make_tensor. Its views are those of tensor/view.hpp.
#pragma once

#include <weft/core/config.hpp>
#include <weft/core/error.hpp>        // WEFT_EXPECTS_SHAPE
#include <weft/core/memory.hpp>       // allocate_bytes, deallocate_bytes
#include <weft/core/tensor/view.hpp>  // tensor_view, index_t, dextents

#include <cuda/std/mdspan>

#include <array>
#include <concepts>
#include <cstddef>
#include <limits>
#include <type_traits>
#include <utility>

namespace weft {

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
  operator view_type() & noexcept { return view(); }             // NOLINT: implicit on purpose
  operator const_view_type() const& noexcept { return view(); }  // NOLINT: implicit on purpose
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

}  // namespace weft
