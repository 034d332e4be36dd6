// weft/core/memory.hpp — memory spaces (where bytes live) and the few raw operations weft needs
// on them: aligned allocation, release and byte copies between spaces. Tensors and executors
// carry a memory space in their type so that host and device pointers cannot be mixed up. The set
// is open: a user's space brings its own allocation (AllocatingSpace) and then works in
// make_tensor.
#pragma once

#include <weft/core/config.hpp>
#include <weft/core/error.hpp>

#include <concepts>
#include <cstddef>
#include <cstring>
#include <new>
#include <string_view>
#include <type_traits>

#if WEFT_HAS_CUDA_RUNTIME
#include <cuda_runtime_api.h>
#endif

namespace weft {

//! Ordinary host memory (pageable, 64-byte aligned when weft allocates it).
struct host_space {
  static constexpr std::string_view name = "host";
  //! Host code may dereference pointers into this space.
  static constexpr bool host_accessible = true;
  friend constexpr bool operator==(host_space, host_space) noexcept = default;
};

//! CUDA device global memory (cudaMalloc). Host code must not dereference it.
struct cuda_space {
  static constexpr std::string_view name = "cuda";
  static constexpr bool host_accessible = false;
  friend constexpr bool operator==(cuda_space, cuda_space) noexcept = default;
};

//! MemorySpace: a stateless tag naming where a pointer points.
//!  - `S::name` is a short printable name ("host", "cuda");
//!  - `S::host_accessible` is true iff host code may read and write through such pointers.
//! Semantics: two views with the same space type may be handed to the same executor; a view's
//! space never changes. Tags are empty and regular so that they cost nothing inside accessors.
template <class S>
concept MemorySpace = std::regular<S> && std::is_empty_v<S> && requires {
  { S::name } -> std::convertible_to<std::string_view>;
  { S::host_accessible } -> std::convertible_to<bool>;
};

static_assert(MemorySpace<host_space>);
static_assert(MemorySpace<cuda_space>);

//! AllocatingSpace: a MemorySpace that allocates for itself, so allocate_bytes, deallocate_bytes
//! and weft::tensor / make_tensor work in it. This is how a user adds a space (pinned host memory,
//! a pool, managed memory): give the tag two static members,
//!   static void* allocate(std::size_t bytes);              // bytes > 0; throws on failure
//!   static void deallocate(void* p, std::size_t bytes) noexcept;  // p from allocate(bytes)
//! Semantics: allocate returns memory aligned for every Element type (at least 16 bytes; weft's
//! host SIMD loops prefer host_alignment) that stays valid until deallocate; deallocate never
//! throws. host_space and cuda_space are allocated by weft itself and need no such members.
template <class S>
concept AllocatingSpace = MemorySpace<S> && requires(std::size_t bytes, void* p) {
  { S::allocate(bytes) } -> std::same_as<void*>;
  { S::deallocate(p, bytes) }
  noexcept;
};

//! Alignment of every host allocation weft makes: one cache line, and enough for any SIMD load.
inline constexpr std::size_t host_alignment = 64;

namespace detail {
// False, but only once the arguments are known: lets a static_assert fire on instantiation.
template <class...>
inline constexpr bool false_for = false;
}  // namespace detail

//! Allocates `bytes` bytes in `Space`; returns nullptr for zero bytes. Host memory is 64-byte
//! aligned; CUDA memory comes from cudaMalloc (256-byte aligned). Throws std::bad_alloc (host) or
//! weft::backend_error (CUDA) on failure.
//! cuda_space needs the CUDA runtime: without WEFT_HAS_CUDA_RUNTIME (link weft::cuda) the call
//! does not compile, rather than failing at run time on a machine that could never succeed.
//! Any other space allocates through its own `allocate` (AllocatingSpace).
template <MemorySpace Space>
[[nodiscard]] void* allocate_bytes(Space, std::size_t bytes) {
  if (bytes == 0) return nullptr;
  if constexpr (AllocatingSpace<Space>) {
    return Space::allocate(bytes);
  } else if constexpr (std::is_same_v<Space, host_space>) {
    return ::operator new (bytes, std::align_val_t{host_alignment});
  } else if constexpr (std::is_same_v<Space, cuda_space>) {
#if WEFT_HAS_CUDA_RUNTIME
    void* p = nullptr;
    WEFT_CUDA_TRY(cudaMalloc(&p, bytes));
    return p;
#else
    static_assert(detail::false_for<Space>,
                  "weft: allocating cuda_space memory needs the CUDA runtime; link weft::cuda "
                  "(it defines WEFT_HAS_CUDA_RUNTIME=1)");
    return nullptr;
#endif
  } else {
    static_assert(detail::false_for<Space>,
                  "weft: allocate_bytes: this memory space does not allocate; give it static "
                  "allocate(bytes) and deallocate(p, bytes) members (AllocatingSpace, see "
                  "docs/extending.md)");
    return nullptr;
  }
}

//! Releases memory from allocate_bytes(Space, bytes). Never throws: a failing cudaFree during
//! cleanup (typically a sticky error from an earlier kernel) is left for the next checked call.
template <MemorySpace Space>
void deallocate_bytes(Space, void* p, std::size_t bytes) noexcept {
  if (p == nullptr) return;
  if constexpr (AllocatingSpace<Space>) {
    Space::deallocate(p, bytes);
  } else if constexpr (std::is_same_v<Space, host_space>) {
    // Unsized: clang only declares sized deallocation with -fsized-deallocation.
    (void)bytes;
    ::operator delete (p, std::align_val_t{host_alignment});
  } else if constexpr (std::is_same_v<Space, cuda_space>) {
#if WEFT_HAS_CUDA_RUNTIME
    (void)bytes;
    (void)cudaFree(p);
#else
    static_assert(detail::false_for<Space>,
                  "weft: releasing cuda_space memory needs the CUDA runtime; link weft::cuda "
                  "(it defines WEFT_HAS_CUDA_RUNTIME=1)");
#endif
  } else {
    static_assert(detail::false_for<Space>,
                  "weft: deallocate_bytes: this memory space does not allocate; give it static "
                  "allocate(bytes) and deallocate(p, bytes) members (AllocatingSpace, see "
                  "docs/extending.md)");
  }
}

//! Copies `bytes` bytes from `src` (in SrcSpace) to `dst` (in DstSpace): memcpy between host
//! buffers, a synchronous cudaMemcpy when either side is device memory. The ranges must not
//! overlap. Any copy touching cuda_space needs WEFT_HAS_CUDA_RUNTIME (a compile-time error
//! otherwise). A user space that is not host-accessible is copied as CUDA memory (cudaMemcpy).
template <MemorySpace DstSpace, MemorySpace SrcSpace>
void copy_bytes(DstSpace, void* dst, SrcSpace, void const* src, std::size_t bytes) {
  if (bytes == 0) return;
  WEFT_EXPECTS(dst != nullptr, "dst", "a non-null pointer", "nullptr");
  WEFT_EXPECTS(src != nullptr, "src", "a non-null pointer", "nullptr");
  if constexpr (DstSpace::host_accessible && SrcSpace::host_accessible) {
    std::memcpy(dst, src, bytes);
  } else {
#if WEFT_HAS_CUDA_RUNTIME
    constexpr cudaMemcpyKind kind = DstSpace::host_accessible   ? cudaMemcpyDeviceToHost
                                    : SrcSpace::host_accessible ? cudaMemcpyHostToDevice
                                                                : cudaMemcpyDeviceToDevice;
    WEFT_CUDA_TRY(cudaMemcpy(dst, src, bytes, kind));
#else
    static_assert(detail::false_for<DstSpace, SrcSpace>,
                  "weft: copying to or from cuda_space memory needs the CUDA runtime; link "
                  "weft::cuda (it defines WEFT_HAS_CUDA_RUNTIME=1)");
#endif
  }
}

}  // namespace weft
