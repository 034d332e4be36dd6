// weft/comm/nccl/device_view.hpp — the type-erased view of a device pointer that the NCCL
// communicator's calls take (host code: it only describes the memory, it never touches it).
#pragma once

#include <weft/comm/concepts.hpp>
#include <weft/core/dtype.hpp>

#include <cstddef>
#include <type_traits>

namespace weft::comm::nccl {

//! View of `count` elements of T at device pointer `p` on `device`, for the type-erased calls.
template <class T>
requires Element<std::remove_const_t<T>>
[[nodiscard]] buffer_view device_view(T* p, std::size_t count, int device) noexcept {
  return {const_cast<std::remove_const_t<T>*>(p), count, dtype_of<std::remove_const_t<T>>,
          memory_kind::cuda, device};
}

}  // namespace weft::comm::nccl
