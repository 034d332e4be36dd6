// weft/core/simd.hpp — the run-time choice of vector ISA for weft's host loops (SSE2, AVX2+FMA,
// AVX-512): the streaming loops of rl (log-probs, policy losses) and attention's tile rows are
// compute-bound under the baseline x86-64 target, so they are compiled again for the wider ISAs
// and picked once per process (function multiversioning by hand, see below).
#pragma once

#include <weft/core/config.hpp>
#include <weft/core/math.hpp>  // index_t

namespace weft::detail {

//! Which vector ISA the host loops run with. A multiversioned loop is one always-inline body,
//! wrappers with WEFT_TARGET_AVX2 / WEFT_TARGET_AVX512 attributes, and a switch on
//! host_simd_level(). Results differ from the SSE2 build only by FMA contraction (within the
//! error bounds the callers document); on one machine every call takes the same path, so results
//! stay bitwise reproducible run after run.
enum class simd_level : int { base = 0, avx2 = 1, avx512 = 2 };

}  // namespace weft::detail

// Host-only: nvcc's front end and non-x86 targets get the plain loops. WEFT_NO_MULTIVERSION (or
// the older WEFT_RL_NO_MULTIVERSION) forces them everywhere, e.g. to compare with the baseline.
#if defined(__x86_64__) && !defined(__CUDACC__) && (defined(__GNUC__) || defined(__clang__)) && \
    !defined(WEFT_NO_MULTIVERSION) && !defined(WEFT_RL_NO_MULTIVERSION)
#define WEFT_MULTIVERSION 1
#define WEFT_TARGET_AVX2 __attribute__((target("avx2,fma")))
#if defined(__clang__)
#define WEFT_TARGET_AVX512 __attribute__((target("avx512f,avx512vl,avx512bw,avx512dq,avx2,fma")))
#else  // GCC's generic tuning would otherwise keep 256-bit vectors under AVX-512
#define WEFT_TARGET_AVX512 \
  __attribute__((target("avx512f,avx512vl,avx512bw,avx512dq,avx2,fma,prefer-vector-width=512")))
#endif
#else
#define WEFT_MULTIVERSION 0
#endif

namespace weft::detail {

//! The best level this CPU supports, detected once.
inline simd_level host_simd_level() noexcept {
#if WEFT_MULTIVERSION
  static simd_level const level = [] {
    __builtin_cpu_init();
    if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512vl") &&
        __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512dq"))
      return simd_level::avx512;
    if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) return simd_level::avx2;
    return simd_level::base;
  }();
  return level;
#else
  return simd_level::base;
#endif
}

//! Runs f(j) for j in [first, last): blocks of B with a fixed-length inner loop, then a scalar
//! tail. GCC's -O2 vectoriser (the "very cheap" cost model) refuses any loop that would need a
//! scalar epilogue or a run-time alias check, i.e. every loop of unknown trip count; an inner loop
//! of B iterations (a multiple of every vector width) it takes. `f` must not carry anything from
//! one j to another (each iteration's writes are read by no other iteration: WEFT_IVDEP).
template <index_t B = 16, class F>
WEFT_FORCEINLINE void for_each_blocked(index_t first, index_t last, F&& f) {
  index_t j = first;
  for (; j + B <= last; j += B) {
    WEFT_IVDEP
    for (index_t t = 0; t < B; ++t) f(j + t);
  }
  for (; j < last; ++j) f(j);
}

}  // namespace weft::detail
