// weft/comm/threads/detail/kernels.hpp — the loops the threads backend runs over peers' buffers:
// a blocked, rank-ordered reduction of n inputs into one output (the fold of comm/reference.hpp,
// so results are bitwise equal to the serial reference) and the balanced partition of a range.
#pragma once

#include <weft/comm/concepts.hpp>
#include <weft/comm/reference.hpp>
#include <weft/core/config.hpp>
#include <weft/core/dtype.hpp>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <span>
#include <type_traits>
#include <vector>

// Non-temporal stores where the target has them, except under ASan or TSan, which do not see
// them (an overrun or a race there would go unreported): those builds check a memcpy of the same
// bytes instead.
#if defined(__has_feature)
#if __has_feature(address_sanitizer) || __has_feature(thread_sanitizer)
#define WEFT_THREADS_SANITIZED 1
#endif
#endif
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
#define WEFT_THREADS_SANITIZED 1
#endif
#if defined(__SSE2__) && !defined(WEFT_THREADS_SANITIZED)
#define WEFT_THREADS_STREAM_STORES 1
#include <emmintrin.h>
#endif

namespace weft::comm::threads::detail {

//! Copies `bytes` from src to dst with non-temporal stores where the target has them (x86 SSE2;
//! elsewhere, and under ASan or TSan, std::memcpy): the destination's lines are neither read for
//! ownership nor kept in cache, so a copy of S bytes into memory no core holds moves 2S through
//! DRAM instead of 3S. The stores are weakly ordered: stream_fence() before another thread may
//! read dst.
inline void stream_copy(std::byte* dst, std::byte const* src, std::size_t bytes) noexcept {
#if defined(WEFT_THREADS_STREAM_STORES)
  auto const misaligned = reinterpret_cast<std::uintptr_t>(dst) & 15u;
  std::size_t const head = misaligned == 0 ? 0 : std::min<std::size_t>(bytes, 16 - misaligned);
  std::memcpy(dst, src, head);
  dst += head;
  src += head;
  bytes -= head;
  for (; bytes >= 64; bytes -= 64, dst += 64, src += 64) {
    auto const* s = reinterpret_cast<__m128i const*>(src);
    __m128i const a = _mm_loadu_si128(s), b = _mm_loadu_si128(s + 1), c = _mm_loadu_si128(s + 2),
                  d = _mm_loadu_si128(s + 3);
    auto* t = reinterpret_cast<__m128i*>(dst);
    _mm_stream_si128(t, a);
    _mm_stream_si128(t + 1, b);
    _mm_stream_si128(t + 2, c);
    _mm_stream_si128(t + 3, d);
  }
  for (; bytes >= 16; bytes -= 16, dst += 16, src += 16)
    _mm_stream_si128(reinterpret_cast<__m128i*>(dst),
                     _mm_loadu_si128(reinterpret_cast<__m128i const*>(src)));
  std::memcpy(dst, src, bytes);
#else
  std::memcpy(dst, src, bytes);
#endif
}

//! Orders this thread's earlier non-temporal stores before its later stores (the barrier that
//! publishes them).
inline void stream_fence() noexcept {
#if defined(WEFT_THREADS_STREAM_STORES)
  _mm_sfence();
#endif
}

// One block: every loop has trip count `len`; with a compile-time len (full blocks) the loops
// vectorise even under GCC's -O2 cost model, which refuses loops that need a scalar epilogue.
// The finished block goes to every output in `outs` (one, or one per rank for a pushed
// all-gather), from a staging block that is still in L1, by non-temporal stores where `stream`.
template <Element T, reduce_kind Kind, class Len>
WEFT_FORCEINLINE void reduce_block(T* const* outs, int n_out, T const* const* ins,
                                   accumulator_t<T> const* scales, int n, std::size_t base, Len len,
                                   accumulator_t<T>* acc, T* staged, bool stream) noexcept {
  using R = reducer<T, Kind>;
  using A = accumulator_t<T>;
  auto const m = static_cast<std::size_t>(len);
  {
    T const* in = ins[0] + base;
    A const s = scales[0];
    for (std::size_t j = 0; j < m; ++j) acc[j] = R::load(in[j], s);
  }
  for (int r = 1; r < n; ++r) {
    T const* in = ins[r] + base;
    A const s = scales[r];
    for (std::size_t j = 0; j < m; ++j) acc[j] = R::combine(acc[j], R::load(in[j], s));
  }
  if (n_out == 1) {
    T* o = outs[0] + base;
    for (std::size_t j = 0; j < m; ++j) o[j] = R::finish(acc[j], n);
    return;
  }
  for (std::size_t j = 0; j < m; ++j) staged[j] = R::finish(acc[j], n);
  if (stream) {
    for (int k = 0; k < n_out; ++k)
      stream_copy(reinterpret_cast<std::byte*>(outs[k] + base),
                  reinterpret_cast<std::byte const*>(staged), m * sizeof(T));
    return;
  }
  for (int k = 0; k < n_out; ++k) std::memcpy(outs[k] + base, staged, m * sizeof(T));
}

//! outs[k][i] = fold over r = 0..n-1 of ins[r][i] for i < count and every k < n_out. Works
//! block by block with the accumulators on the stack so that each pass over one rank's input is
//! a simple vectorisable loop; an output may alias any input element-for-element (a block is
//! read fully before it is written). With several outputs and `stream`, the blocks are written
//! by non-temporal stores (stream_copy), fenced before the return.
template <Element T, reduce_kind Kind>
void reduce_range(T* const* outs, int n_out, T const* const* ins, accumulator_t<T> const* scales,
                  int n, std::size_t count, bool stream = false) noexcept {
  constexpr std::size_t block = 512;
  alignas(64) accumulator_t<T> acc[block];
  alignas(64) T staged[block];
  stream = stream && n_out > 1;
  std::size_t base = 0;
  for (; base + block <= count; base += block)
    reduce_block<T, Kind>(outs, n_out, ins, scales, n, base,
                          std::integral_constant<std::size_t, block>{}, acc, staged, stream);
  if (base < count)
    reduce_block<T, Kind>(outs, n_out, ins, scales, n, base, count - base, acc, staged, stream);
  if (stream) stream_fence();
}

template <Element T, reduce_kind Kind>
void reduce_range(T* out, T const* const* ins, accumulator_t<T> const* scales, int n,
                  std::size_t count) noexcept {
  reduce_range<T, Kind>(&out, 1, ins, scales, n, count);
}

//! Type-erased front of reduce_range: `ins[r]` and `outs[k]` point at elements of `type`;
//! `scalars[r]` is rank r's premul scalar; `stream`: several outputs are written by non-temporal
//! stores. Up to 64 ranks use no allocation.
inline void reduce_bytes(dtype type, reduce_kind kind, std::byte* const* outs, int n_out,
                         std::byte const* const* ins, double const* scalars, int n,
                         std::size_t count, bool stream = false) {
  if (count == 0) return;
  weft::dispatch(type, [&](auto tag) {
    using T = typename decltype(tag)::type;
    using A = accumulator_t<T>;
    constexpr int stack_ranks = 64;
    T const* in_stack[stack_ranks];
    T* out_stack[stack_ranks];
    A scale_stack[stack_ranks];
    std::vector<T const*> in_heap;
    std::vector<T*> out_heap;
    std::vector<A> scale_heap;
    T const** in_ptr = in_stack;
    T** out_ptr = out_stack;
    A* scale_ptr = scale_stack;
    if (n > stack_ranks || n_out > stack_ranks) {
      in_heap.resize(static_cast<std::size_t>(n));
      out_heap.resize(static_cast<std::size_t>(n_out));
      scale_heap.resize(static_cast<std::size_t>(n));
      in_ptr = in_heap.data();
      out_ptr = out_heap.data();
      scale_ptr = scale_heap.data();
    }
    for (int r = 0; r < n; ++r) {
      in_ptr[r] = reinterpret_cast<T const*>(ins[r]);
      scale_ptr[r] = scale_of<T>(reduce_op{kind, scalars[r]});
    }
    for (int k = 0; k < n_out; ++k) out_ptr[k] = reinterpret_cast<T*>(outs[k]);
    dispatch_reduce_kind(kind, [&](auto k) {
      reduce_range<T, decltype(k)::value>(out_ptr, n_out, in_ptr, scale_ptr, n, count, stream);
    });
  });
}

inline void reduce_bytes(dtype type, reduce_kind kind, std::byte* out, std::byte const* const* ins,
                         double const* scalars, int n, std::size_t count) {
  reduce_bytes(type, kind, &out, 1, ins, scalars, n, count);
}

//! Rank r's share of `count` elements split over n ranks: the first count % n ranks get one more.
struct range {
  std::size_t offset = 0;
  std::size_t count = 0;
};

constexpr range balanced_part(std::size_t count, int n, int r) noexcept {
  auto const un = static_cast<std::size_t>(n);
  auto const ur = static_cast<std::size_t>(r);
  std::size_t const base = count / un;
  std::size_t const extra = count % un;
  return {ur * base + std::min(ur, extra), base + (ur < extra ? 1u : 0u)};
}

}  // namespace weft::comm::threads::detail
