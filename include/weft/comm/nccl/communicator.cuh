// weft/comm/nccl/communicator.cuh — the NCCL backend, weft::comm::nccl::communicator: a
// StreamCommunicator over NCCL 2.28 for buffers in CUDA memory (one GPU per rank). Link weft::nccl;
// its logic lives in communicator.hpp (no kernels) so the CPU tests can drive it through a mock.
#pragma once

#if !defined(__CUDACC__)
#  error "weft/comm/nccl/communicator.cuh needs nvcc (compile this translation unit as CUDA)"
#endif

#include <weft/core/config.hpp>

#if WEFT_HAS_NCCL
#  include <weft/comm/nccl/api.hpp>
#  include <weft/comm/nccl/communicator.hpp>

namespace weft::comm::nccl {

//! View of `count` elements of T at device pointer `p` on `device`, for the type-erased calls.
template <class T>
  requires Element<std::remove_const_t<T>>
[[nodiscard]] buffer_view device_view(T* p, std::size_t count, int device) noexcept {
  return {const_cast<std::remove_const_t<T>*>(p), count, dtype_of<std::remove_const_t<T>>,
          memory_kind::cuda, device};
}

static_assert(StreamCommunicator<communicator>, "nccl::communicator must model StreamCommunicator");

}  // namespace weft::comm::nccl

#endif  // WEFT_HAS_NCCL
