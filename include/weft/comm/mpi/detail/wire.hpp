// weft/comm/mpi/detail/wire.hpp — how weft's elements and reductions travel through MPI: the
// datatype that moves each dtype, the wire element and MPI_Op of each (dtype, reduction) pair
// (16-bit floats accumulate in f32, integer sums wrap, min/max propagate NaN), error texts, and
// the graveyard that keeps buffers an abandoned request may still write.
#pragma once

#if !WEFT_HAS_MPI
#error \
    "weft/comm/mpi/detail/wire.hpp needs MPI: link the CMake target weft::mpi (it defines WEFT_HAS_MPI=1 and adds MPI's include path and libraries)"
#endif

#include <weft/comm/concepts.hpp>
#include <weft/comm/reference.hpp>
#include <weft/core/dtype.hpp>
#include <weft/core/error.hpp>

#include <mpi.h>

#include <atomic>
#include <chrono>
#include <memory>
#include <string>
#include <string_view>
#include <thread>
#include <type_traits>
#include <vector>

namespace weft::comm::mpi::detail {

using clock = std::chrono::steady_clock;

// User p2p and the internal point-to-point paths (chunked fallbacks) use distinct tags on the
// same MPI communicator: both are below the 32767 every MPI implementation must allow.
inline constexpr int user_tag = 30000;
inline constexpr int internal_tag = 30001;

inline std::string mpi_error_text(int code) {
  char text[MPI_MAX_ERROR_STRING] = {};
  int len = 0;
  if (MPI_Error_string(code, text, &len) != MPI_SUCCESS) len = 0;
  int cls = 0;
  if (MPI_Error_class(code, &cls) != MPI_SUCCESS) cls = code;
  return weft::detail::concat(std::string_view(text, static_cast<std::size_t>(len)),
                              " (MPI error class ", cls, ")");
}

// Buffers an MPI request may still write after its communicator died (a timed-out collective
// cannot be cancelled): kept alive for the rest of the process rather than freed under MPI.
inline void bury(std::vector<std::shared_ptr<void>>&& keep) {
  static auto* graveyard = new std::vector<std::shared_ptr<void>>();  // never freed, on purpose
  static std::atomic_flag lock = ATOMIC_FLAG_INIT;
  while (lock.test_and_set(std::memory_order_acquire)) std::this_thread::yield();
  for (auto& k : keep) graveyard->push_back(std::move(k));
  lock.clear(std::memory_order_release);
}

// ---- element types on the wire ---------------------------------------------------------------

// The 16-bit floats travel as 2-byte words (Open MPI 4.1 has no fp16/bf16 datatype).
inline MPI_Datatype half_word_type() {
  static MPI_Datatype t = [] {
    MPI_Datatype d = MPI_DATATYPE_NULL;
    WEFT_MPI_TRY(MPI_Type_contiguous(2, MPI_BYTE, &d));
    WEFT_MPI_TRY(MPI_Type_commit(&d));
    return d;
  }();
  return t;
}

//! The MPI datatype that moves elements of `t` (no arithmetic implied).
inline MPI_Datatype move_type(dtype t) {
  switch (t) {
    case dtype::f32: return MPI_FLOAT;
    case dtype::f64: return MPI_DOUBLE;
    case dtype::bf16:
    case dtype::f16: return half_word_type();
    case dtype::i32: return MPI_INT32_T;
    case dtype::i64: return MPI_INT64_T;
    case dtype::u8: return MPI_UINT8_T;
  }
  weft::detail::throw_bad_dtype(t);
}

// User op: inout[i] = combine(in[i], inout[i]) with weft's semantics (NaN-propagating min/max;
// 16-bit floats compared as f32 and stored back exactly).
template <class W, reduce_kind K>
void user_combine(void* in, void* inout, int* len, MPI_Datatype*) {
  using R = reducer<W, K>;
  auto const* a = static_cast<W const*>(in);
  auto* b = static_cast<W*>(inout);
  for (int i = 0; i < *len; ++i) {
    if constexpr (std::is_same_v<W, u8>) {
      b[i] = R::combine(a[i], b[i]);  // wrapping (combine works on the unsigned type)
    } else if constexpr (std::is_same_v<W, bf16> || std::is_same_v<W, f16>) {
      // min/max only: the f32 result is one of the two inputs, so the rounding is exact.
      b[i] = W(R::combine(static_cast<float>(a[i]), static_cast<float>(b[i])));
    } else {
      b[i] = R::combine(a[i], b[i]);
    }
  }
}

template <class W, reduce_kind K>
MPI_Op user_op() {
  static MPI_Op op = [] {
    MPI_Op o = MPI_OP_NULL;
    WEFT_MPI_TRY(MPI_Op_create(&user_combine<W, K>, 1, &o));
    return o;
  }();
  return op;
}

//! How a reduction of element type T travels: the wire element W (the accumulator for sums and
//! products, so bf16/f16 accumulate in f32 and round once at the end), its datatype and op.
template <Element T, reduce_kind K>
struct wire {
  static constexpr bool extremum = K == reduce_kind::min || K == reduce_kind::max;
  // min/max are exact in the element type, so 16-bit floats travel as themselves.
  using type = std::conditional_t<extremum, T, accumulator_t<T>>;
  static MPI_Datatype datatype() {
    if constexpr (std::is_same_v<type, float>) {
      return MPI_FLOAT;
    } else if constexpr (std::is_same_v<type, double>) {
      return MPI_DOUBLE;
    } else if constexpr (std::is_same_v<type, bf16> || std::is_same_v<type, f16>) {
      return half_word_type();
    } else if constexpr (!extremum) {
      // Integer sums and products wrap (two's complement): computed on the unsigned type, where
      // MPI's C arithmetic is defined.
      if constexpr (sizeof(type) == 4)
        return MPI_UINT32_T;
      else if constexpr (sizeof(type) == 8)
        return MPI_UINT64_T;
      else
        return MPI_UINT8_T;
    } else {
      if constexpr (std::is_same_v<type, i32>)
        return MPI_INT32_T;
      else if constexpr (std::is_same_v<type, i64>)
        return MPI_INT64_T;
      else
        return MPI_UINT8_T;
    }
  }
  static MPI_Op op() {
    if constexpr (std::is_same_v<type, u8> && !extremum) {
      // Open MPI 4.1's AVX component saturates 8-bit sums (255 + 1 == 255); weft wraps.
      return user_op < u8, K == reduce_kind::prod ? reduce_kind::prod : reduce_kind::sum > ();
    } else if constexpr (K == reduce_kind::prod) {
      return MPI_PROD;
    } else if constexpr (extremum) {
      if constexpr (std::is_integral_v<type>)
        return K == reduce_kind::min ? MPI_MIN : MPI_MAX;
      else
        return user_op<type, K>();
    } else {
      return MPI_SUM;  // sum, avg (divided afterwards), premul_sum (scaled before)
    }
  }
  // The input must be converted (or scaled) into a wire buffer first.
  static constexpr bool staged_in = !std::is_same_v<type, T> || K == reduce_kind::premul_sum;
  // The result must be converted (or divided) from the wire afterwards.
  static constexpr bool staged_out = !std::is_same_v<type, T>;
  static constexpr bool finish = !std::is_same_v<type, T> || K == reduce_kind::avg;
};

}  // namespace weft::comm::mpi::detail
