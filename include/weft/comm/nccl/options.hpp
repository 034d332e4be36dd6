// weft/comm/nccl/options.hpp — the settings of an NCCL-backend communicator (inherited by split)
// and the mapping of weft's dtypes and reduce kinds to NCCL's. Needs WEFT_HAS_NCCL (link
// weft::nccl).
#pragma once

#include <weft/comm/nccl/api.hpp>

#if WEFT_HAS_NCCL
#include <weft/comm/concepts.hpp>
#include <weft/core/config.hpp>
#include <weft/core/dtype.hpp>
#include <weft/core/error.hpp>

#include <chrono>
#include <cstddef>

namespace weft::comm::nccl {

//! Per-communicator settings; split() children inherit them.
struct options {
  //! Deadline of every operation (init, split, each collective, finalize) unless op_options says
  //! otherwise. When it passes, the communicator is aborted (ncclCommAbort) and timeout_error
  //! thrown.
  std::chrono::milliseconds timeout{std::chrono::minutes(5)};
  std::size_t history_size = 64;
  //! Debug mode: before each collective, an extra 8-word all_gather compares every rank's
  //! fingerprint (op, dtype, count, root, reduction, seq) and throws mismatch_error on a
  //! difference, where NCCL itself would hang or corrupt memory. Costs one small collective per
  //! call.
  bool check_fingerprints = WEFT_DEBUG != 0;
  //! Sleep between polls of cudaEventQuery / ncclCommGetAsyncError (never pure spinning).
  std::chrono::microseconds poll_interval{100};
  //! The function table; nullptr means linked_api(). Tests pass a mock.
  nccl_api const* api = nullptr;
};

//! weft dtype -> NCCL datatype.
constexpr ncclDataType_t to_nccl(dtype d) {
  switch (d) {
    case dtype::f32: return ncclFloat32;
    case dtype::f64: return ncclFloat64;
    case dtype::bf16: return ncclBfloat16;
    case dtype::f16: return ncclFloat16;
    case dtype::i32: return ncclInt32;
    case dtype::i64: return ncclInt64;
    case dtype::u8: return ncclUint8;
  }
  WEFT_THROW(invalid_argument_error,
             "argument `type`: expected one of f32, f64, bf16, f16, i32, i64, u8, actual ", d);
}

//! Built-in reduce kinds -> ncclRedOp_t. premul_sum has no built-in value: the communicator creates
//! one with ncclRedOpCreatePreMulSum per call and destroys it once enqueued.
constexpr ncclRedOp_t to_nccl(reduce_kind k) {
  switch (k) {
    case reduce_kind::sum: return ncclSum;
    case reduce_kind::prod: return ncclProd;
    case reduce_kind::min: return ncclMin;
    case reduce_kind::max: return ncclMax;
    case reduce_kind::avg: return ncclAvg;
    case reduce_kind::premul_sum: break;
  }
  WEFT_THROW(invalid_argument_error,
             "argument `op.kind`: expected sum, prod, min, max or avg (premul_sum "
             "needs a communicator), actual ",
             to_string(k));
}

}  // namespace weft::comm::nccl

#endif  // WEFT_HAS_NCCL
