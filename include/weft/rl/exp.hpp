// weft/rl/exp.hpp — rl's vectorised streaming loops: weft's exponential (exp_fn and select, which
// now live in weft/core/math.hpp and are included from here) and the run-time choice of vector ISA
// (SSE2, AVX2+FMA, AVX-512) that the log-prob and policy-loss loops are compiled for.
#pragma once

#include <weft/core/config.hpp>
#include <weft/core/math.hpp>

#include <cstdint>

namespace weft::rl::detail {

//! Which vector ISA the host loops run with. The streaming loops are compute-bound under the
//! baseline x86-64 target (SSE2, 4 lanes), so they are compiled again for AVX2+FMA and AVX-512
//! and picked at run time (function multiversioning by hand: one always-inline body, wrappers
//! with `target` attributes, a dispatch on __builtin_cpu_supports). Results differ from the
//! SSE2 build only by FMA contraction, far inside weft::exp_fn's 2 ulp.
enum class simd_level : int { base = 0, avx2 = 1, avx512 = 2 };

}  // namespace weft::rl::detail

// Host-only: nvcc's front end and non-x86 targets get the plain loops. WEFT_RL_NO_MULTIVERSION
// forces them everywhere (e.g. to compare against the baseline build).
#if defined(__x86_64__) && !defined(__CUDACC__) && (defined(__GNUC__) || defined(__clang__)) && \
    !defined(WEFT_RL_NO_MULTIVERSION)
#define WEFT_RL_MULTIVERSION 1
#define WEFT_RL_TARGET_AVX2 __attribute__((target("avx2,fma")))
#if defined(__clang__)
#define WEFT_RL_TARGET_AVX512 __attribute__((target("avx512f,avx512vl,avx512bw,avx512dq,avx2,fma")))
#else  // GCC's generic tuning would otherwise keep 256-bit vectors under AVX-512
#define WEFT_RL_TARGET_AVX512 \
  __attribute__((target("avx512f,avx512vl,avx512bw,avx512dq,avx2,fma,prefer-vector-width=512")))
#endif
#else
#define WEFT_RL_MULTIVERSION 0
#endif

namespace weft::rl::detail {

//! The best level this CPU supports, detected once.
inline simd_level host_simd_level() noexcept {
#if WEFT_RL_MULTIVERSION
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

}  // namespace weft::rl::detail
