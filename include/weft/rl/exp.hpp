// weft/rl/exp.hpp — weft's own exponential for the streaming softmax loops: a branch-free
// Cody-Waite reduction and polynomial that compilers vectorise (libm's exp does not vectorise
// without -ffast-math, which weft forbids), with IEEE-correct handling of -inf, +inf and NaN.
#pragma once

#include <weft/core/config.hpp>

#include <cuda/std/bit>
#include <cuda/std/cstdint>
#include <cuda/std/type_traits>

#include <cstdint>

namespace weft::rl {

// Branch-free select on the bit patterns: GCC turns nested `c ? a : b` on floats into control
// flow it will not vectorise (under the default -ftrapping-math); masks and ands it vectorises.
template <class T>
WEFT_HD WEFT_FORCEINLINE constexpr T select(bool c, T a, T b) noexcept {
  using U = cuda::std::conditional_t<sizeof(T) == 4, std::uint32_t, std::uint64_t>;
  U const m = U(0) - static_cast<U>(c);
  return cuda::std::bit_cast<T>((cuda::std::bit_cast<U>(a) & m) | (cuda::std::bit_cast<U>(b) & ~m));
}

//! e^x for float, relative error below 2 ulp on [-87.3, 88.7]. Results below 2^-126 flush to
//! +0 (softmax terms that small never change a float sum); x > 88.72 gives +inf, -inf gives
//! +0, NaN stays NaN. Every step is a select or arithmetic, so loops over arrays vectorise.
struct exp_fn {
  WEFT_HD constexpr float operator()(float x) const noexcept {
    constexpr float log2e = 1.44269504088896341f;
    constexpr float ln2_hi = 0.693359375f;       // exact in 9 bits: n*ln2_hi is exact
    constexpr float ln2_lo = -2.12194440e-4f;
    constexpr float round_magic = 12582912.0f;   // 1.5 * 2^23: adding it rounds to an integer
    bool const below = x < -87.3365448f;
    bool const above = x > 88.7228394f;
    bool const nan = x != x;
    float const xc = select(below, -87.3365448f, select(above, 88.7228394f, select(nan, 0.0f, x)));
    float const t = xc * log2e + round_magic;
    float const n = t - round_magic;  // round-to-nearest(x * log2e), no fast-math folding
    std::int32_t const ni = static_cast<std::int32_t>(cuda::std::bit_cast<std::uint32_t>(t) -
                                                      cuda::std::bit_cast<std::uint32_t>(round_magic));
    float const r = (xc - n * ln2_hi) - n * ln2_lo;
    // Cephes expf minimax polynomial on [-ln2/2, ln2/2].
    float p = 1.9875691500e-4f;
    p = p * r + 1.3981999507e-3f;
    p = p * r + 8.3334519073e-3f;
    p = p * r + 4.1665795894e-2f;
    p = p * r + 1.6666665459e-1f;
    p = p * r + 5.0000001201e-1f;
    float const y = p * r * r + r + 1.0f;
    // n reaches 128 just below the overflow point, so 2^n is applied as two halves.
    std::int32_t const n1 = ni >> 1;
    float const s1 = cuda::std::bit_cast<float>(static_cast<std::uint32_t>(n1 + 127) << 23);
    float const s2 = cuda::std::bit_cast<float>(static_cast<std::uint32_t>(ni - n1 + 127) << 23);
    float const v = (y * s1) * s2;
    return select(nan, x, select(above, cuda::std::bit_cast<float>(0x7f800000u), select(below, 0.0f, v)));
  }

  //! e^x for double, relative error below 1e-15 on [-708.39, 709.78]; the same guards.
  WEFT_HD constexpr double operator()(double x) const noexcept {
    constexpr double log2e = 1.4426950408889634074;
    constexpr double ln2_hi = 6.93147180369123816490e-01;  // 32 significant bits
    constexpr double ln2_lo = 1.90821492927058770002e-10;
    constexpr double round_magic = 6755399441055744.0;  // 1.5 * 2^52
    constexpr double lo = -708.3964185322641;
    constexpr double hi = 709.782712893384;
    bool const below = x < lo;
    bool const above = x > hi;
    bool const nan = x != x;
    double const xc = select(below, lo, select(above, hi, select(nan, 0.0, x)));
    double const t = xc * log2e + round_magic;
    double const n = t - round_magic;
    std::int64_t const ni = static_cast<std::int64_t>(cuda::std::bit_cast<std::uint64_t>(t) -
                                                      cuda::std::bit_cast<std::uint64_t>(round_magic));
    double const r = (xc - n * ln2_hi) - n * ln2_lo;
    // Taylor series to degree 13 on |r| <= ln2/2: truncation error below 2e-17.
    double p = 1.0 / 6227020800.0;
    p = p * r + 1.0 / 479001600.0;
    p = p * r + 1.0 / 39916800.0;
    p = p * r + 1.0 / 3628800.0;
    p = p * r + 1.0 / 362880.0;
    p = p * r + 1.0 / 40320.0;
    p = p * r + 1.0 / 5040.0;
    p = p * r + 1.0 / 720.0;
    p = p * r + 1.0 / 120.0;
    p = p * r + 1.0 / 24.0;
    p = p * r + 1.0 / 6.0;
    p = p * r + 0.5;
    double const y = (p * r) * r + r + 1.0;
    std::int64_t const n1 = ni >> 1;
    double const s1 = cuda::std::bit_cast<double>(static_cast<std::uint64_t>(n1 + 1023) << 52);
    double const s2 = cuda::std::bit_cast<double>(static_cast<std::uint64_t>(ni - n1 + 1023) << 52);
    double const v = (y * s1) * s2;
    return select(nan, x, select(above, cuda::std::bit_cast<double>(0x7ff0000000000000ull), select(below, 0.0, v)));
  }
};

inline constexpr exp_fn fast_exp{};

namespace detail {

//! Which vector ISA the host loops run with. The streaming loops are compute-bound under the
//! baseline x86-64 target (SSE2, 4 lanes), so they are compiled again for AVX2+FMA and AVX-512
//! and picked at run time (function multiversioning by hand: one always-inline body, wrappers
//! with `target` attributes, a dispatch on __builtin_cpu_supports). Results differ from the
//! SSE2 build only by FMA contraction, far inside exp_fn's 2 ulp.
enum class simd_level : int { base = 0, avx2 = 1, avx512 = 2 };

}  // namespace detail

}  // namespace weft::rl

// Host-only: nvcc's front end and non-x86 targets get the plain loops. WEFT_RL_NO_MULTIVERSION
// forces them everywhere (e.g. to compare against the baseline build).
#if defined(__x86_64__) && !defined(__CUDACC__) && (defined(__GNUC__) || defined(__clang__)) && \
    !defined(WEFT_RL_NO_MULTIVERSION)
#  define WEFT_RL_MULTIVERSION 1
#  define WEFT_RL_TARGET_AVX2 __attribute__((target("avx2,fma")))
#  if defined(__clang__)
#    define WEFT_RL_TARGET_AVX512 __attribute__((target("avx512f,avx512vl,avx512bw,avx512dq,avx2,fma")))
#  else  // GCC's generic tuning would otherwise keep 256-bit vectors under AVX-512
#    define WEFT_RL_TARGET_AVX512 \
      __attribute__((target("avx512f,avx512vl,avx512bw,avx512dq,avx2,fma,prefer-vector-width=512")))
#  endif
#else
#  define WEFT_RL_MULTIVERSION 0
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

namespace weft::rl {

}  // namespace weft::rl
