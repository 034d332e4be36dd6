// weft/core/math.hpp — the one home of weft's element and row math (DESIGN "One source of math"):
// the compute type of an element type, the index type, a branch-free select, weft's vectorisable
// exp, log_add_exp and a stable sigmoid, and the online-softmax statistics with their merge. All
// WEFT_HD named functors or functions over cuda::std, so CPU loops and CUDA kernels run the same
// code; attention (flash tiles, ring merges) and rl (streamed log-probs) both use them.
#pragma once

#include <weft/core/config.hpp>

#include <cuda/std/bit>
#include <cuda/std/cmath>
#include <cuda/std/cstdint>
#include <cuda/std/limits>
#include <cuda/std/type_traits>

#include <cstdint>

namespace weft {

//! The signed index type of every extent, offset and element count (tensor.hpp declares the same
//! alias; a typedef may be repeated with the same type).
using index_t = std::int64_t;

//! The arithmetic type for elements of type T: f64 for f64, f32 for everything else (f32, and the
//! half types bf16/f16, which are widened to f32 and rounded back once). The one spelling of
//! "compute in f32, or f64 for f64" used by attention's accumulators, rl's logits and random fills.
template <class T>
struct compute_type {
  using type = float;
};
template <>
struct compute_type<double> {
  using type = double;
};
template <class T>
using compute_t = typename compute_type<::cuda::std::remove_cv_t<T>>::type;

//! Branch-free select on the bit patterns: GCC turns nested `c ? a : b` on floats into control
//! flow it will not vectorise (under the default -ftrapping-math); masks and ands it vectorises.
template <class T>
WEFT_HD WEFT_FORCEINLINE constexpr T select(bool c, T a, T b) noexcept {
  static_assert(sizeof(T) == 4 || sizeof(T) == 8, "weft: select works on 4- and 8-byte values");
  using U = ::cuda::std::conditional_t<sizeof(T) == 4, std::uint32_t, std::uint64_t>;
  U const m = U(0) - static_cast<U>(c);
  return ::cuda::std::bit_cast<T>((::cuda::std::bit_cast<U>(a) & m) |
                                  (::cuda::std::bit_cast<U>(b) & ~m));
}

//! e^x, weft's own: a branch-free Cody-Waite reduction and polynomial that compilers vectorise
//! (libm's exp does not vectorise without -ffast-math, which weft forbids), with IEEE handling of
//! -inf (+0), +inf and overflow (+inf) and NaN (NaN).
//!  - float: the Cephes expf minimax polynomial; relative error below 2 ulp on [-87.3, 88.7].
//!    Results below 2^-126 flush to +0 (softmax terms that small never change a float sum).
//!  - double: a degree-13 Taylor polynomial; relative error below 1e-15 on [-708.39, 709.78].
struct exp_fn {
  WEFT_HD WEFT_FORCEINLINE constexpr float operator()(float x) const noexcept {
    constexpr float log2e = 1.44269504088896341f;
    constexpr float ln2_hi = 0.693359375f;  // exact in 9 bits: n*ln2_hi is exact
    constexpr float ln2_lo = -2.12194440e-4f;
    constexpr float round_magic = 12582912.0f;  // 1.5 * 2^23: adding it rounds to an integer
    // Clamped below to where results leave the normal range (flushed to +0 at the end). Above
    // 88.7228394 the result overflows; clamping to 89 (n = 128, r > 0, so y > 1) makes the
    // product below overflow to +inf by itself. A NaN passes both compares and propagates through
    // the arithmetic. Three selects instead of six keep the loops that call this fast; the results
    // equal a version with explicit +inf and NaN selects bit for bit on every non-NaN float.
    bool const below = x < -87.3365448f;
    bool const above = x > 89.0f;
    float const xc = select(below, -87.3365448f, select(above, 89.0f, x));
    float const t = xc * log2e + round_magic;
    float const n = t - round_magic;  // round-to-nearest(x * log2e), no fast-math folding
    auto const ni = static_cast<std::int32_t>(::cuda::std::bit_cast<std::uint32_t>(t) -
                                              ::cuda::std::bit_cast<std::uint32_t>(round_magic));
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
    float const s1 = ::cuda::std::bit_cast<float>(static_cast<std::uint32_t>(n1 + 127) << 23);
    float const s2 = ::cuda::std::bit_cast<float>(static_cast<std::uint32_t>(ni - n1 + 127) << 23);
    float const v = (y * s1) * s2;
    return select(below, 0.0f, v);
  }

  WEFT_HD WEFT_FORCEINLINE constexpr double operator()(double x) const noexcept {
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
    auto const ni = static_cast<std::int64_t>(::cuda::std::bit_cast<std::uint64_t>(t) -
                                              ::cuda::std::bit_cast<std::uint64_t>(round_magic));
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
    double const s1 = ::cuda::std::bit_cast<double>(static_cast<std::uint64_t>(n1 + 1023) << 52);
    double const s2 =
        ::cuda::std::bit_cast<double>(static_cast<std::uint64_t>(ni - n1 + 1023) << 52);
    double const v = (y * s1) * s2;
    return select(
        nan, x,
        select(above, ::cuda::std::bit_cast<double>(0x7ff0000000000000ull), select(below, 0.0, v)));
  }
};

inline constexpr exp_fn fast_exp{};

//! tanh, weft's own for float: branch-free (select) so that loops over it vectorise, which libm's
//! tanhf does not (GELU took 40 % of a small GPT's training step through it).
//!  - |x| < 2^-12: x itself (tanh(x) rounds to x there);
//!  - |x| < 0.625: an odd degree-13 over even degree-6 rational minimax fit (Eigen's
//!    generic_fast_tanh_float coefficients, MPL-2.0), within 4.4 ulp;
//!  - |x| >= 0.625: 1 − 2/(e^{2|x|} + 1) through exp_fn, within 2 ulp; exactly 1 from |x| ≈ 9.1
//!    on (e^{2|x|} overflows to +inf past 44.4, giving 1 − 0);
//!  - sign restored by bits (tanh(−0) = −0); NaN gives NaN.
//! Both branches are computed and selected, so a loop over it has no control flow.
//! double: cuda::std::tanh (the checking path stays libm's).
struct tanh_fn {
  WEFT_HD WEFT_FORCEINLINE constexpr float operator()(float x) const noexcept {
    std::uint32_t const sign = ::cuda::std::bit_cast<std::uint32_t>(x) & 0x80000000u;
    float const a = ::cuda::std::bit_cast<float>(::cuda::std::bit_cast<std::uint32_t>(x) ^ sign);
    float const c = select(a < 0.625f, a, 0.625f);  // the rational's argument, in its range
    float const x2 = c * c;
    float p = -2.76076847742355e-16f;
    p = p * x2 + 2.00018790482477e-13f;
    p = p * x2 + -8.60467152213735e-11f;
    p = p * x2 + 5.12229709037114e-08f;
    p = p * x2 + 1.48572235717979e-05f;
    p = p * x2 + 6.37261928875436e-04f;
    p = p * x2 + 4.89352455891786e-03f;
    p = p * c;
    float q = 1.19825839466702e-06f;
    q = q * x2 + 1.18534705686654e-04f;
    q = q * x2 + 2.26843463243900e-03f;
    q = q * x2 + 4.89352518554385e-03f;
    float const small = p / q;
    float const large = 1.0f - 2.0f / (exp_fn{}(2.0f * a) + 1.0f);
    // Below 2^-12, tanh(x) = x·(1 − x²/3 + ...) rounds to x; the rational's numerator would also
    // go subnormal there (p·c < 2^-126) and lose bits.
    float const t = select(a < 0.000244140625f, a, select(a < 0.625f, small, large));
    return ::cuda::std::bit_cast<float>(::cuda::std::bit_cast<std::uint32_t>(t) | sign);
  }
  WEFT_HD WEFT_FORCEINLINE double operator()(double x) const noexcept {
    return ::cuda::std::tanh(x);
  }
};

//! -inf in C: the log-sum-exp of an empty set, and the max of an empty online-softmax state.
template <class C>
WEFT_HD constexpr C neg_inf() noexcept {
  return -::cuda::std::numeric_limits<C>::infinity();
}

//! sigmoid(x) = 1 / (1 + e^-x) without overflow for either sign (exp of a non-positive number
//! only). NaN stays NaN.
template <class C>
WEFT_HD inline C stable_sigmoid(C x) noexcept {
  if (x >= C(0)) return C(1) / (C(1) + exp_fn{}(-x));
  C const e = exp_fn{}(x);
  return e / (C(1) + e);
}

//! log(e^a + e^b) = max(a, b) + log1p(e^-|a - b|), which never forms e^a or e^b, so |a - b| =
//! 1e4 is harmless; -inf if both are -inf (where the naive a - b would be NaN), the other operand
//! if one is -inf. Commutative, and associative up to rounding. This is `a - logsigmoid(a - b)`
//! of ring-flash-attention (zhuzilin/ring-flash-attention, ring_flash_attn/utils.py).
template <class C>
WEFT_HD inline C log_add_exp(C a, C b) noexcept {
  if (a == neg_inf<C>()) return b;
  if (b == neg_inf<C>()) return a;
  C const hi = a > b ? a : b;
  C const lo = a > b ? b : a;
  return hi + ::cuda::std::log1p(exp_fn{}(lo - hi));
}

// ---- online softmax ------------------------------------------------------------------------
// Milakov and Gimelshein, "Online normalizer calculation for softmax" (arXiv:1805.02867): a set
// of values is summarised by its max and the sum of e^{x - max}; two summaries merge exactly by
// moving both sums onto the larger max. Flash attention's per-row state, rl's streamed log-probs
// and the vocabulary-parallel shards all reduce to this.

//! Statistics of a set of values x, relative to their max: sum = sum_v e^{x_v - max} and
//! ent = sum_v e^{x_v - max} (x_v - max). Then lse = max + log(sum) and the entropy of softmax(x)
//! is log(sum) - ent / sum (ent is carried for rl's entropy; attention leaves it 0). An empty set
//! (or all -inf) has sum 0 and max -inf. A set holding a NaN or +inf is poisoned: sum and ent are
//! NaN, every merge keeps it so, and finish gives NaN.
template <class C>
struct softmax_stats {
  C max = neg_inf<C>();
  C sum = C(0);
  C ent = C(0);
};

//! The factor e^{m_old - m_new} that moves a sum of e^{x - m_old} onto a max m_new >= m_old:
//! 0 for an empty state (m_old = -inf, m_new finite) and 1 while both are -inf, so no
//! exp(-inf - -inf) = NaN appears.
template <class C>
WEFT_HD inline C softmax_rescale(C m_old, C m_new) noexcept {
  if (m_new == neg_inf<C>()) return C(1);
  if (m_old == neg_inf<C>()) return C(0);
  return exp_fn{}(m_old - m_new);
}

//! Merges two statistics exactly (commutative; associative up to rounding). The empty state is
//! the identity; a poisoned (NaN) state absorbs everything.
struct softmax_merge {
  template <class C>
  WEFT_HD softmax_stats<C> operator()(softmax_stats<C> a, softmax_stats<C> b) const noexcept {
    if (a.sum != a.sum) return a;  // poisoned (NaN) stays poisoned
    if (b.sum != b.sum) return b;
    if (!(a.sum > C(0))) return b;
    if (!(b.sum > C(0))) return a;
    C const m = a.max > b.max ? a.max : b.max;
    C const da = a.max - m;
    C const db = b.max - m;
    C const ea = ::cuda::std::exp(da);
    C const eb = ::cuda::std::exp(db);
    // sum_v e^{x-m}(x-m) = e^{M_a-m} (ent_a + (M_a - m) sum_a), likewise for b.
    return {m, ea * a.sum + eb * b.sum, ea * (a.ent + da * a.sum) + eb * (b.ent + db * b.sum)};
  }
};

//! Adds one value x to running statistics (a per-thread loop, as in a CUDA kernel; CPU paths
//! reduce whole chunks instead, which vectorises). -inf adds nothing; an empty state takes x;
//! NaN or +inf poisons the state.
struct softmax_push {
  template <class C>
  WEFT_HD softmax_stats<C> operator()(softmax_stats<C> s, C x) const noexcept {
    constexpr C inf = ::cuda::std::numeric_limits<C>::infinity();
    if (s.sum != s.sum) return s;
    if (x != x || x == inf) {
      C const nan = ::cuda::std::numeric_limits<C>::quiet_NaN();
      return {nan, nan, nan};
    }
    if (!(x > -inf)) return s;
    if (!(s.sum > C(0))) return {x, C(1), C(0)};
    if (x > s.max) {
      C const d = s.max - x;
      C const e = exp_fn{}(d);
      return {x, e * s.sum + C(1), e * (s.ent + d * s.sum)};
    }
    C const d = x - s.max;
    C const e = exp_fn{}(d);
    return {s.max, s.sum + e, s.ent + e * d};
  }
};

//! max(a, b) that propagates NaN (unlike fmax): one max.NaN instruction for float on sm_80 and up.
template <class C>
WEFT_HD inline C max_nan(C a, C b) noexcept {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  if constexpr (sizeof(C) == 4) {
    C y;
    asm("max.NaN.f32 %0, %1, %2;" : "=f"(y) : "f"(a), "f"(b));
    return y;
  }
#endif
  if (a != a) return a;
  if (b != b) return b;
  return a > b ? a : b;
}

//! Adds K values at once to running statistics, value j being x_j = raw_j · unit · back (natural
//! units), for a kernel's inner loop (softmax_push's rules for each value: -inf adds nothing, NaN
//! or +inf poisons). unit > 0 scales a raw value into the base of `exp_u` (log2 e · 1/τ with exp_u
//! = 2^d on a GPU's special-function unit, 1/τ with exp_fn), back = 1 / that base's log2 e factor
//! (ln 2, or 1). Per value: one NaN-propagating max of the raw values, then d = raw · unit −
//! max · unit by one FMA, e = exp_u(d) and the sum and entropy terms; poison and an all -inf
//! chunk are tested once per chunk, and the chunk is merged by softmax_merge.
template <int K, class C, class ExpU>
WEFT_HD softmax_stats<C> softmax_push_chunk(softmax_stats<C> s, C const (&raw)[K], C unit, C back,
                                            ExpU exp_u) noexcept {
  constexpr C inf = ::cuda::std::numeric_limits<C>::infinity();
  C m = -inf;
  WEFT_UNROLL
  for (int j = 0; j < K; ++j) m = max_nan(m, raw[j]);
  C const mu = m * unit;  // NaN for a NaN value; +inf for +inf (or a max that overflows)
  if (mu != mu || mu == inf) {
    C const nan = ::cuda::std::numeric_limits<C>::quiet_NaN();
    return {nan, nan, nan};
  }
  if (mu == -inf) return s;  // every value -inf (or below the range once scaled)
  C sum = C(0), ent = C(0);
  WEFT_UNROLL
  for (int j = 0; j < K; ++j) {
    // A -inf value gives d = lowest: e = 0 and e · d = 0 (not 0 · -inf).
    C const d = ::cuda::std::fmax(::cuda::std::fma(raw[j], unit, -mu),
                                  ::cuda::std::numeric_limits<C>::lowest());
    C const e = exp_u(d);
    sum += e;
    ent += e * d;
  }
  return softmax_merge{}(s, softmax_stats<C>{mu * back, sum, ent * back});
}

//! log-sum-exp and entropy from statistics. Empty or all -inf: lse -inf, entropy 0; poisoned
//! (a NaN or +inf value): both NaN.
struct softmax_finish {
  template <class C>
  WEFT_HD C lse(softmax_stats<C> s) const noexcept {
    if (s.sum != s.sum) return s.sum;
    return s.sum > C(0) ? s.max + ::cuda::std::log(s.sum) : neg_inf<C>();
  }
  template <class C>
  WEFT_HD C entropy(softmax_stats<C> s) const noexcept {
    if (s.sum != s.sum) return s.sum;
    return s.sum > C(0) ? ::cuda::std::log(s.sum) - s.ent / s.sum : C(0);
  }
};

}  // namespace weft
