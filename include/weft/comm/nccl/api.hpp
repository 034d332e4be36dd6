// weft/comm/nccl/api.hpp — the function table through which the NCCL backend makes every NCCL and
// CUDA runtime call: `linked_api()` points at the real libraries; tests substitute a mock that
// simulates a world of ranks on host memory. Needs WEFT_HAS_NCCL (link weft::nccl).
#pragma once

#include <weft/core/config.hpp>

#if WEFT_HAS_NCCL
#include <cuda_runtime_api.h>
#include <nccl.h>

namespace weft::comm::nccl {

//! Plain function pointers (no context argument) so the linked table is a constant and a mock can
//! stand in for both libraries at once. Each member is named after the call it replaces.
struct nccl_api {
  // NCCL: lifecycle
  ncclResult_t (*get_version)(int* version) = nullptr;
  ncclResult_t (*get_unique_id)(ncclUniqueId* id) = nullptr;
  ncclResult_t (*comm_init_rank_config)(ncclComm_t* comm, int nranks, ncclUniqueId id, int rank,
                                        ncclConfig_t* config) = nullptr;
  ncclResult_t (*comm_split)(ncclComm_t comm, int color, int key, ncclComm_t* newcomm,
                             ncclConfig_t* config) = nullptr;
  ncclResult_t (*comm_finalize)(ncclComm_t comm) = nullptr;
  ncclResult_t (*comm_destroy)(ncclComm_t comm) = nullptr;
  ncclResult_t (*comm_abort)(ncclComm_t comm) = nullptr;
  ncclResult_t (*comm_get_async_error)(ncclComm_t comm, ncclResult_t* async_error) = nullptr;
  ncclResult_t (*comm_count)(ncclComm_t comm, int* count) = nullptr;
  ncclResult_t (*comm_user_rank)(ncclComm_t comm, int* rank) = nullptr;
  ncclResult_t (*comm_cu_device)(ncclComm_t comm, int* device) = nullptr;
  char const* (*get_error_string)(ncclResult_t result) = nullptr;
  char const* (*get_last_error)(ncclComm_t comm) = nullptr;
  // NCCL: reduction ops
  ncclResult_t (*red_op_create_pre_mul_sum)(ncclRedOp_t* op, void* scalar, ncclDataType_t type,
                                            ncclScalarResidence_t residence,
                                            ncclComm_t comm) = nullptr;
  ncclResult_t (*red_op_destroy)(ncclRedOp_t op, ncclComm_t comm) = nullptr;
  // NCCL: collectives and point-to-point (all enqueue on a stream)
  ncclResult_t (*all_reduce)(void const* send, void* recv, std::size_t count, ncclDataType_t type,
                             ncclRedOp_t op, ncclComm_t comm, cudaStream_t stream) = nullptr;
  ncclResult_t (*broadcast)(void const* send, void* recv, std::size_t count, ncclDataType_t type,
                            int root, ncclComm_t comm, cudaStream_t stream) = nullptr;
  ncclResult_t (*reduce)(void const* send, void* recv, std::size_t count, ncclDataType_t type,
                         ncclRedOp_t op, int root, ncclComm_t comm, cudaStream_t stream) = nullptr;
  ncclResult_t (*all_gather)(void const* send, void* recv, std::size_t send_count,
                             ncclDataType_t type, ncclComm_t comm, cudaStream_t stream) = nullptr;
  ncclResult_t (*reduce_scatter)(void const* send, void* recv, std::size_t recv_count,
                                 ncclDataType_t type, ncclRedOp_t op, ncclComm_t comm,
                                 cudaStream_t stream) = nullptr;
  ncclResult_t (*all_to_all)(void const* send, void* recv, std::size_t count, ncclDataType_t type,
                             ncclComm_t comm, cudaStream_t stream) = nullptr;
  ncclResult_t (*gather)(void const* send, void* recv, std::size_t count, ncclDataType_t type,
                         int root, ncclComm_t comm, cudaStream_t stream) = nullptr;
  ncclResult_t (*scatter)(void const* send, void* recv, std::size_t count, ncclDataType_t type,
                          int root, ncclComm_t comm, cudaStream_t stream) = nullptr;
  ncclResult_t (*send)(void const* send, std::size_t count, ncclDataType_t type, int peer,
                       ncclComm_t comm, cudaStream_t stream) = nullptr;
  ncclResult_t (*recv)(void* recv, std::size_t count, ncclDataType_t type, int peer,
                       ncclComm_t comm, cudaStream_t stream) = nullptr;
  ncclResult_t (*group_start)() = nullptr;
  ncclResult_t (*group_end)() = nullptr;
  // CUDA runtime: events for completion, device scratch for barrier and fingerprints
  cudaError_t (*event_create_with_flags)(cudaEvent_t* event, unsigned flags) = nullptr;
  cudaError_t (*event_record)(cudaEvent_t event, cudaStream_t stream) = nullptr;
  cudaError_t (*event_query)(cudaEvent_t event) = nullptr;
  cudaError_t (*event_destroy)(cudaEvent_t event) = nullptr;
  cudaError_t (*stream_wait_event)(cudaStream_t stream, cudaEvent_t event,
                                   unsigned flags) = nullptr;
  cudaError_t (*get_device)(int* device) = nullptr;
  cudaError_t (*set_device)(int device) = nullptr;
  cudaError_t (*malloc)(void** ptr, std::size_t bytes) = nullptr;
  cudaError_t (*free)(void* ptr) = nullptr;
  cudaError_t (*memcpy_async)(void* dst, void const* src, std::size_t bytes, cudaMemcpyKind kind,
                              cudaStream_t stream) = nullptr;
  char const* (*cuda_error_name)(cudaError_t code) = nullptr;
};

namespace detail {
// cudaMalloc and cudaMemcpyAsync are templates/overloads in the runtime headers; these pin the
// C entry points so their addresses can sit in a table.
inline cudaError_t linked_malloc(void** p, std::size_t n) { return ::cudaMalloc(p, n); }
inline cudaError_t linked_memcpy_async(void* d, void const* s, std::size_t n, cudaMemcpyKind k,
                                       cudaStream_t st) {
  return ::cudaMemcpyAsync(d, s, n, k, st);
}
inline cudaError_t linked_stream_wait_event(cudaStream_t s, cudaEvent_t e, unsigned f) {
  return ::cudaStreamWaitEvent(s, e, f);
}
}  // namespace detail

//! The table that calls the real libnccl and libcudart.
inline nccl_api const& linked_api() noexcept {
  static nccl_api const api{
      .get_version = &::ncclGetVersion,
      .get_unique_id = &::ncclGetUniqueId,
      .comm_init_rank_config = &::ncclCommInitRankConfig,
      .comm_split = &::ncclCommSplit,
      .comm_finalize = &::ncclCommFinalize,
      .comm_destroy = &::ncclCommDestroy,
      .comm_abort = &::ncclCommAbort,
      .comm_get_async_error = &::ncclCommGetAsyncError,
      .comm_count = &::ncclCommCount,
      .comm_user_rank = &::ncclCommUserRank,
      .comm_cu_device = &::ncclCommCuDevice,
      .get_error_string = &::ncclGetErrorString,
      .get_last_error = &::ncclGetLastError,
      .red_op_create_pre_mul_sum = &::ncclRedOpCreatePreMulSum,
      .red_op_destroy = &::ncclRedOpDestroy,
      .all_reduce = &::ncclAllReduce,
      .broadcast = &::ncclBroadcast,
      .reduce = &::ncclReduce,
      .all_gather = &::ncclAllGather,
      .reduce_scatter = &::ncclReduceScatter,
      .all_to_all = &::ncclAlltoAll,
      .gather = &::ncclGather,
      .scatter = &::ncclScatter,
      .send = &::ncclSend,
      .recv = &::ncclRecv,
      .group_start = &::ncclGroupStart,
      .group_end = &::ncclGroupEnd,
      .event_create_with_flags = &::cudaEventCreateWithFlags,
      .event_record = &::cudaEventRecord,
      .event_query = &::cudaEventQuery,
      .event_destroy = &::cudaEventDestroy,
      .stream_wait_event = &detail::linked_stream_wait_event,
      .get_device = &::cudaGetDevice,
      .set_device = &::cudaSetDevice,
      .malloc = &detail::linked_malloc,
      .free = &::cudaFree,
      .memcpy_async = &detail::linked_memcpy_async,
      .cuda_error_name = &::cudaGetErrorName,
  };
  return api;
}

}  // namespace weft::comm::nccl

#endif  // WEFT_HAS_NCCL
