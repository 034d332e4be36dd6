// weft/rl/logprobs.hpp — token log-probs and entropy from logits [tokens, V], fused and streamed
// over the vocabulary with an online log-sum-exp (no [tokens, V] softmax buffer), and their
// backward into dlogits. f32, bf16, f16 or f64 logits; temperature; ignored targets; -inf logits.
#pragma once

#include <weft/core/config.hpp>
#include <weft/core/dtype.hpp>
#include <weft/core/error.hpp>
#include <weft/core/math.hpp>
#include <weft/core/simd.hpp>
#include <weft/rl/exp.hpp>
#include <weft/rl/token_layout.hpp>

#include <cuda/std/cmath>
#include <cuda/std/limits>

#include <cmath>
#include <cstdint>
#include <limits>
#include <span>
#include <string_view>
#include <type_traits>
#include <vector>

namespace weft::rl {

//! Temperature tau divides the logits (verl divides by the rollout temperature so that training
//! log-probs match sampling); weft multiplies by 1/tau, which differs by at most one rounding.
//! Tokens whose target equals ignore_index (prompt tokens, padding) get log-prob 0, entropy 0
//! and a zero dlogits row, and are not computed at all.
struct logprob_options {
  double temperature = 1.0;
  std::int64_t ignore_index = -100;
};

// The online-softmax statistics (softmax_stats, softmax_merge, softmax_push, softmax_finish) and
// exp_fn are weft's, in weft/core/math.hpp; rl code names them unqualified.

//! One logit's share of the backward: d/dx_v of (g_logp * logp + g_ent * H) without the target's
//! indicator term, i.e. -p_v (g_logp + g_ent (log p_v + H)) with p_v = e^{x_v - lse}. Where p_v
//! is 0 (a -inf logit, or a probability below the smallest normal) the result is exactly 0, the
//! limit of p log p: clamping log p alone is not enough, since g_ent * lowest overflows to inf
//! once |g_ent| > 1 and 0 * inf is NaN. `Exp` computes p_v (the CPU path's exp_fn; the CUDA kernel
//! passes the SFU's exponential for float).
template <class C, class Exp = exp_fn>
struct logit_grad {
  C lse;     // lse = lse + lse_lo to twice C's precision: rounding the lse alone to f32 would
  C lse_lo;  // move every p_v by up to 5e-7 relative
  C entropy;
  C g_logp;
  C g_ent;
  C inv_tau;

  WEFT_HD WEFT_FORCEINLINE C operator()(C x) const noexcept {
    C d = (x - lse) - lse_lo;
    d = select(d < cuda::std::numeric_limits<C>::lowest(), cuda::std::numeric_limits<C>::lowest(),
               d);
    C const p = Exp{}(d);
    C const g = -p * (g_logp + g_ent * (d + entropy)) * inv_tau;
    return select(p == C(0), C(0), g);
  }
};

namespace detail {

inline constexpr index_t logit_lanes = 16;
inline constexpr index_t logit_chunk = 2048;

template <class C, class L>
WEFT_FORCEINLINE C load_logit(L const* z, index_t j, C inv_tau) {
  return static_cast<C>(static_cast<compute_t<L>>(z[j])) * inv_tau;
}

template <class L>
WEFT_FORCEINLINE void prefetch(L const* p) {
#if defined(__GNUC__) || defined(__clang__)
  __builtin_prefetch(p, 0, 3);
#else
  (void)p;
#endif
}

//! Statistics of logits z[0, n) / tau: chunks of logit_chunk values, each reduced by pairwise
//! trees down to logit_lanes partial sums (a fixed order, so results are deterministic and every
//! pass is a map that vectorises without reassociation), merged in double across chunks.
//! With `saved_exp` non-null (the fused sweep) it also keeps each logit's e^{x - m_c} in
//! saved_exp[0, n) and each chunk's max m_c in chunk_max (-inf for an all -inf chunk), so the
//! backward needs no second exponential per logit.
template <class L>
WEFT_FORCEINLINE softmax_stats<double> row_stats_impl(L const* z, index_t n, compute_t<L> inv_tau,
                                                      compute_t<L>* saved_exp = nullptr,
                                                      double* chunk_max = nullptr) {
  using C = compute_t<L>;
  constexpr index_t W = logit_lanes;
  constexpr C lowest = cuda::std::numeric_limits<C>::lowest();
  softmax_stats<double> acc;
  alignas(64) C buf[logit_chunk];
  alignas(64) C tbuf[logit_chunk];
  for (index_t c0 = 0; c0 < n; c0 += logit_chunk) {
    index_t const len = n - c0 < logit_chunk ? n - c0 : logit_chunk;
    weft::detail::for_each_blocked(
        0, len, [&](index_t j) WEFT_LAMBDA_INLINE { buf[j] = load_logit<C>(z, c0 + j, inv_tau); });
    // The chunk's max as a pairwise tree over a power-of-two scratch padded with -inf: every
    // level is a pure map, which vectorises (a running max is a reduction GCC will not
    // vectorise for floats without -ffast-math).
    index_t width = W;
    while (width < len) width *= 2;
    index_t const half = width / 2;
    for (index_t j = len; j < width; ++j) buf[j] = -cuda::std::numeric_limits<C>::infinity();
    weft::detail::for_each_blocked(0, half, [&](index_t j) WEFT_LAMBDA_INLINE {
      tbuf[j] = select(buf[j + half] > buf[j], buf[j + half], buf[j]);
    });
    for (index_t h = half / 2; h >= 1; h /= 2)
      weft::detail::for_each_blocked(0, h, [&](index_t j) WEFT_LAMBDA_INLINE {
        tbuf[j] = select(tbuf[j + h] > tbuf[j], tbuf[j + h], tbuf[j]);
      });
    C const m = tbuf[0];
    // A NaN logit may or may not win the max (compares with NaN are false): a NaN max is a
    // poisoned chunk. A NaN elsewhere, or a +inf max, makes the exponentials below NaN.
    if (m != m) {
      if (saved_exp != nullptr) {
        for (index_t j = 0; j < len; ++j) saved_exp[c0 + j] = m;
        chunk_max[c0 / logit_chunk] = static_cast<double>(m);
      }
      acc =
          softmax_merge{}(acc, softmax_stats<double>{0.0, std::numeric_limits<double>::quiet_NaN(),
                                                     std::numeric_limits<double>::quiet_NaN()});
      continue;
    }
    if (!(m > -cuda::std::numeric_limits<C>::infinity())) {  // all -inf: adds nothing
      if (saved_exp != nullptr) {
        for (index_t j = 0; j < len; ++j) saved_exp[c0 + j] = C(0);
        chunk_max[c0 / logit_chunk] = -cuda::std::numeric_limits<double>::infinity();
      }
      continue;
    }
    // A pure map over the chunk: the exponentials and entropy terms. The loop is compute-bound
    // while the load loop above waits on memory, so the next chunk is prefetched in slices
    // interleaved with it (the hardware prefetcher alone leaves DRAM idle here).
    index_t const next = n - (c0 + len) < logit_chunk ? n - (c0 + len) : logit_chunk;
    constexpr index_t slice = 256;
    constexpr index_t line = 64 / static_cast<index_t>(sizeof(L));
    for (index_t s0 = 0; s0 < len; s0 += slice) {
      index_t const s1 = len - s0 < slice ? len : s0 + slice;
      if (next > 0) {
        index_t const p1 = s0 + slice < next ? s0 + slice : next;
        for (index_t j = s0; j < p1; j += line) prefetch(z + c0 + len + j);
      }
      weft::detail::for_each_blocked(s0, s1, [&](index_t j) WEFT_LAMBDA_INLINE {
        C d = buf[j] - m;
        d = select(d < lowest, lowest, d);
        C const e = exp_fn{}(d);
        buf[j] = e;
        tbuf[j] = e * d;
      });
    }
    if (saved_exp != nullptr) {
      weft::detail::for_each_blocked(
          0, len, [&](index_t j) WEFT_LAMBDA_INLINE { saved_exp[c0 + j] = buf[j]; });
      chunk_max[c0 / logit_chunk] = static_cast<double>(m);
    }
    // Pairwise tree sums over the padded chunk: pure maps again (vectorise), fixed order, and
    // more accurate than a running sum.
    for (index_t j = len; j < width; ++j) buf[j] = tbuf[j] = C(0);
    for (index_t h = width / 2; h >= W; h /= 2)
      weft::detail::for_each_blocked(0, h, [&](index_t j) WEFT_LAMBDA_INLINE {
        buf[j] += buf[j + h];
        tbuf[j] += tbuf[j + h];
      });
    double ss = 0, tt = 0;
    for (index_t l = 0; l < W; ++l) {
      ss += static_cast<double>(buf[l]);
      tt += static_cast<double>(tbuf[l]);
    }
    // A +inf logit gives inf - inf = NaN exponentials, a NaN one NaN: either poisons ss.
    if (ss != ss || tt != tt) ss = tt = std::numeric_limits<double>::quiet_NaN();
    acc = softmax_merge{}(acc, softmax_stats<double>{static_cast<double>(m), ss, tt});
  }
  return acc;
}

//! dz[0, n) for one row (or shard) given the row's lse and entropy; `target` is the column of
//! the target within z, or -1 if it lies elsewhere. Writes every element once.
template <class L, class D>
WEFT_FORCEINLINE void row_backward_impl(L const* z, index_t n, compute_t<L> inv_tau, double lse,
                                        double entropy, double g_logp, double g_ent, index_t target,
                                        D* dz) {
  using C = compute_t<L>;
  if (lse == -cuda::std::numeric_limits<double>::infinity() || !(g_logp != 0.0 || g_ent != 0.0)) {
    for (index_t j = 0; j < n; ++j) dz[j] = static_cast<D>(C(0));
    return;
  }
  C const lse_hi = static_cast<C>(lse);
  logit_grad<C> const fn{lse_hi,
                         static_cast<C>(lse - static_cast<double>(lse_hi)),
                         static_cast<C>(entropy),
                         static_cast<C>(g_logp),
                         static_cast<C>(g_ent),
                         inv_tau};
  weft::detail::for_each_blocked(0, n, [&](index_t j) WEFT_LAMBDA_INLINE {
    dz[j] = static_cast<D>(fn(load_logit<C>(z, j, inv_tau)));
  });
  if (target >= 0) {  // add the indicator term before the one rounding to D
    dz[target] =
        static_cast<D>(fn(load_logit<C>(z, target, inv_tau)) + static_cast<C>(g_logp) * inv_tau);
  }
}

//! row_backward from the forward's saved e^{x - m_c}: p_v = e^{x_v - m_c} e^{m_c - lse}, one
//! exponential per chunk instead of one per logit. Same formula and guards as logit_grad.
template <class L, class D>
WEFT_FORCEINLINE void row_backward_saved_impl(L const* z, index_t n, compute_t<L> inv_tau,
                                              double lse, double entropy, double g_logp,
                                              double g_ent, index_t target,
                                              compute_t<L> const* saved_exp,
                                              double const* chunk_max, D* dz) {
  using C = compute_t<L>;
  if (lse == -cuda::std::numeric_limits<double>::infinity() || !(g_logp != 0.0 || g_ent != 0.0)) {
    for (index_t j = 0; j < n; ++j) dz[j] = static_cast<D>(C(0));
    return;
  }
  constexpr C lowest = cuda::std::numeric_limits<C>::lowest();
  C const lse_hi = static_cast<C>(lse);
  C const lse_lo = static_cast<C>(lse - static_cast<double>(lse_hi));
  C const h = static_cast<C>(entropy);
  C const gl = static_cast<C>(g_logp);
  C const ge = static_cast<C>(g_ent);
  auto grad = [&](C x, C e, C f) WEFT_LAMBDA_INLINE {
    C d = (x - lse_hi) - lse_lo;
    d = select(d < lowest, lowest, d);
    C const p = e * f;
    C const g = -p * (gl + ge * (d + h)) * inv_tau;
    return select(p == C(0), C(0), g);  // as logit_grad: p = 0 contributes exactly 0
  };
  for (index_t c0 = 0; c0 < n; c0 += logit_chunk) {
    index_t const len = n - c0 < logit_chunk ? n - c0 : logit_chunk;
    double const mc = chunk_max[c0 / logit_chunk];
    C const f = mc == -cuda::std::numeric_limits<double>::infinity()
                    ? C(0)
                    : static_cast<C>(std::exp(mc - lse));
    weft::detail::for_each_blocked(c0, c0 + len, [&](index_t j) WEFT_LAMBDA_INLINE {
      dz[j] = static_cast<D>(grad(load_logit<C>(z, j, inv_tau), saved_exp[j], f));
    });
    if (target >= c0 && target < c0 + len)  // the indicator term, before the one rounding to D
      dz[target] = static_cast<D>(grad(load_logit<C>(z, target, inv_tau), saved_exp[target], f) +
                                  gl * inv_tau);
  }
}

#if WEFT_RL_MULTIVERSION
// The same bodies compiled for AVX2+FMA and AVX-512 (see simd_level in exp.hpp).
template <class L>
WEFT_RL_TARGET_AVX2 softmax_stats<double> row_stats_avx2(L const* z, index_t n,
                                                         compute_t<L> inv_tau) {
  return row_stats_impl(z, n, inv_tau);
}
template <class L>
WEFT_RL_TARGET_AVX512 softmax_stats<double> row_stats_avx512(L const* z, index_t n,
                                                             compute_t<L> inv_tau) {
  return row_stats_impl(z, n, inv_tau);
}
template <class L, class D>
WEFT_RL_TARGET_AVX2 void row_backward_avx2(L const* z, index_t n, compute_t<L> inv_tau, double lse,
                                           double entropy, double g_logp, double g_ent,
                                           index_t target, D* dz) {
  row_backward_impl(z, n, inv_tau, lse, entropy, g_logp, g_ent, target, dz);
}
template <class L, class D>
WEFT_RL_TARGET_AVX512 void row_backward_avx512(L const* z, index_t n, compute_t<L> inv_tau,
                                               double lse, double entropy, double g_logp,
                                               double g_ent, index_t target, D* dz) {
  row_backward_impl(z, n, inv_tau, lse, entropy, g_logp, g_ent, target, dz);
}
template <class L>
WEFT_RL_TARGET_AVX2 softmax_stats<double> row_stats_saved_avx2(L const* z, index_t n,
                                                               compute_t<L> inv_tau,
                                                               compute_t<L>* e, double* cm) {
  return row_stats_impl(z, n, inv_tau, e, cm);
}
template <class L>
WEFT_RL_TARGET_AVX512 softmax_stats<double> row_stats_saved_avx512(L const* z, index_t n,
                                                                   compute_t<L> inv_tau,
                                                                   compute_t<L>* e, double* cm) {
  return row_stats_impl(z, n, inv_tau, e, cm);
}
template <class L, class D>
WEFT_RL_TARGET_AVX2 void row_backward_saved_avx2(L const* z, index_t n, compute_t<L> inv_tau,
                                                 double lse, double entropy, double g_logp,
                                                 double g_ent, index_t target,
                                                 compute_t<L> const* e, double const* cm, D* dz) {
  row_backward_saved_impl(z, n, inv_tau, lse, entropy, g_logp, g_ent, target, e, cm, dz);
}
template <class L, class D>
WEFT_RL_TARGET_AVX512 void row_backward_saved_avx512(L const* z, index_t n, compute_t<L> inv_tau,
                                                     double lse, double entropy, double g_logp,
                                                     double g_ent, index_t target,
                                                     compute_t<L> const* e, double const* cm,
                                                     D* dz) {
  row_backward_saved_impl(z, n, inv_tau, lse, entropy, g_logp, g_ent, target, e, cm, dz);
}
#endif

template <class L>
softmax_stats<double> row_stats_saved(L const* z, index_t n, compute_t<L> inv_tau, compute_t<L>* e,
                                      double* cm) {
#if WEFT_RL_MULTIVERSION
  switch (host_simd_level()) {
    case simd_level::avx512: return row_stats_saved_avx512(z, n, inv_tau, e, cm);
    case simd_level::avx2: return row_stats_saved_avx2(z, n, inv_tau, e, cm);
    case simd_level::base: break;
  }
#endif
  return row_stats_impl(z, n, inv_tau, e, cm);
}

template <class L, class D>
void row_backward_saved(L const* z, index_t n, compute_t<L> inv_tau, double lse, double entropy,
                        double g_logp, double g_ent, index_t target, compute_t<L> const* e,
                        double const* cm, D* dz) {
#if WEFT_RL_MULTIVERSION
  switch (host_simd_level()) {
    case simd_level::avx512:
      return row_backward_saved_avx512(z, n, inv_tau, lse, entropy, g_logp, g_ent, target, e, cm,
                                       dz);
    case simd_level::avx2:
      return row_backward_saved_avx2(z, n, inv_tau, lse, entropy, g_logp, g_ent, target, e, cm, dz);
    case simd_level::base: break;
  }
#endif
  row_backward_saved_impl(z, n, inv_tau, lse, entropy, g_logp, g_ent, target, e, cm, dz);
}

template <class L>
softmax_stats<double> row_stats(L const* z, index_t n, compute_t<L> inv_tau) {
#if WEFT_RL_MULTIVERSION
  switch (host_simd_level()) {
    case simd_level::avx512: return row_stats_avx512(z, n, inv_tau);
    case simd_level::avx2: return row_stats_avx2(z, n, inv_tau);
    case simd_level::base: break;
  }
#endif
  return row_stats_impl(z, n, inv_tau);
}

template <class L, class D>
void row_backward(L const* z, index_t n, compute_t<L> inv_tau, double lse, double entropy,
                  double g_logp, double g_ent, index_t target, D* dz) {
#if WEFT_RL_MULTIVERSION
  switch (host_simd_level()) {
    case simd_level::avx512:
      return row_backward_avx512(z, n, inv_tau, lse, entropy, g_logp, g_ent, target, dz);
    case simd_level::avx2:
      return row_backward_avx2(z, n, inv_tau, lse, entropy, g_logp, g_ent, target, dz);
    case simd_level::base: break;
  }
#endif
  row_backward_impl(z, n, inv_tau, lse, entropy, g_logp, g_ent, target, dz);
}

//! 1/temperature in the compute type of L logits, checked: the temperature must be positive and
//! finite and its inverse a finite, non-zero value of that type (1e-39 overflows f32's 1/tau,
//! 1e300 rounds it to 0), since every logit is multiplied by it.
template <class L>
compute_t<L> inverse_temperature(double temperature) {
  using C = compute_t<L>;
  WEFT_EXPECTS(temperature > 0 && std::isfinite(temperature), "temperature", "> 0 and finite",
               temperature);
  double const inv = 1.0 / temperature;
  WEFT_EXPECTS(inv <= static_cast<double>(std::numeric_limits<C>::max()) &&
                   inv >= static_cast<double>(std::numeric_limits<C>::min()),
               "temperature",
               ::weft::detail::concat(
                   "a value whose inverse is a finite normal ", sizeof(C) == 4 ? "f32" : "f64",
                   " (about [", 1.0 / static_cast<double>(std::numeric_limits<C>::max()), ", ",
                   1.0 / static_cast<double>(std::numeric_limits<C>::min()), "])"),
               temperature);
  return static_cast<C>(inv);
}

template <class L, class I>
void check_logprob_args(std::span<L const> logits, index_t vocab, std::span<I const> targets,
                        logprob_options const& opt) {
  WEFT_EXPECTS(vocab >= 1, "vocab", ">= 1", vocab);
  (void)inverse_temperature<L>(opt.temperature);
  WEFT_EXPECTS_SHAPE(
      static_cast<index_t>(logits.size()) == checked_elements(targets.size(), vocab, "logits"),
      "logits",
      ::weft::detail::concat("tokens * vocab = ", targets.size(), " * ", vocab, " elements"),
      logits.size());
}

template <class I>
void check_targets(std::span<I const> targets, index_t vocab, logprob_options const& opt) {
  for (std::size_t k = 0; k < targets.size(); ++k) {
    auto const o = static_cast<std::int64_t>(targets[k]);
    if (o == opt.ignore_index) continue;
    WEFT_EXPECTS(
        o >= 0 && o < vocab, "targets",
        ::weft::detail::concat("ids in [0, ", vocab, ") or ignore_index ", opt.ignore_index),
        ::weft::detail::concat(o, " at token ", k));
  }
}

}  // namespace detail

namespace detail {
template <class L, class I, class T>
void log_prob_forward_impl(std::span<L const> logits, index_t vocab, std::span<I const> targets,
                           logprob_options const& opt, std::span<T> logp, std::span<T> entropy,
                           std::span<T> lse = {}) {
  detail::check_logprob_args(logits, vocab, targets, opt);
  WEFT_EXPECTS_SHAPE(logp.size() == targets.size(), "logp", targets.size(), logp.size());
  WEFT_EXPECTS_SHAPE(entropy.size() == targets.size(), "entropy", targets.size(), entropy.size());
  if (!lse.empty())
    WEFT_EXPECTS_SHAPE(lse.size() == targets.size(), "lse", targets.size(), lse.size());
  detail::check_targets(targets, vocab, opt);
  using C = compute_t<L>;
  C const inv_tau = detail::inverse_temperature<L>(opt.temperature);
  for (std::size_t k = 0; k < targets.size(); ++k) {
    auto const o = static_cast<std::int64_t>(targets[k]);
    if (o == opt.ignore_index) {
      logp[k] = entropy[k] = T(0);
      if (!lse.empty()) lse[k] = T(0);
      continue;
    }
    L const* z = logits.data() + static_cast<index_t>(k) * vocab;
    auto const s = detail::row_stats(z, vocab, inv_tau);
    double const l = softmax_finish{}.lse(s);
    double const x = static_cast<double>(detail::load_logit<C>(z, o, inv_tau));
    // An all -inf row has no distribution: log-prob -inf (not -inf - -inf = NaN), entropy 0.
    logp[k] = static_cast<T>(l > -std::numeric_limits<double>::infinity() ? x - l : l);
    entropy[k] = static_cast<T>(softmax_finish{}.entropy(s));
    if (!lse.empty()) lse[k] = static_cast<T>(l);
  }
}
}  // namespace detail

//! Forward: for every token t, logp[t] = log softmax(z_t / tau)[target_t] and entropy[t] = H of
//! that distribution; `lse` (optional, empty = not wanted) receives log-sum-exp(z_t / tau) for
//! the backward. `logits` is [tokens, vocab] row-major. Reads the logits once.
template <FlatArray LR, FlatArray IR, MutableFlatArray PR, MutableFlatArray ER,
          MutableFlatArray SR = std::span<flat_value_t<PR>>>
void log_prob_forward(LR&& logits, index_t vocab, IR&& targets, logprob_options const& opt,
                      PR&& logp, ER&& entropy, SR&& lse = SR{}) {
  detail::log_prob_forward_impl(as_flat_const(logits, "logits"), vocab,
                                as_flat_const(targets, "targets"), opt, as_flat(logp, "logp"),
                                as_flat(entropy, "entropy"), as_flat(lse, "lse"));
}

namespace detail {
template <class L, class I, class T, class D>
void log_prob_backward_impl(std::span<L const> logits, index_t vocab, std::span<I const> targets,
                            logprob_options const& opt, std::span<T const> lse,
                            std::span<T const> entropy, std::span<T const> d_logp,
                            std::span<T const> d_entropy, std::span<D> dlogits) {
  detail::check_logprob_args(logits, vocab, targets, opt);
  WEFT_EXPECTS_SHAPE(lse.size() == targets.size(), "lse", targets.size(), lse.size());
  WEFT_EXPECTS_SHAPE(entropy.size() == targets.size(), "entropy", targets.size(), entropy.size());
  if (!d_logp.empty())
    WEFT_EXPECTS_SHAPE(d_logp.size() == targets.size(), "d_logp", targets.size(), d_logp.size());
  if (!d_entropy.empty())
    WEFT_EXPECTS_SHAPE(d_entropy.size() == targets.size(), "d_entropy", targets.size(),
                       d_entropy.size());
  WEFT_EXPECTS_SHAPE(dlogits.size() == logits.size(), "dlogits", logits.size(), dlogits.size());
  detail::check_targets(targets, vocab, opt);
  using C = compute_t<L>;
  C const inv_tau = detail::inverse_temperature<L>(opt.temperature);
  for (std::size_t k = 0; k < targets.size(); ++k) {
    auto const o = static_cast<std::int64_t>(targets[k]);
    L const* z = logits.data() + static_cast<index_t>(k) * vocab;
    D* dz = dlogits.data() + static_cast<index_t>(k) * vocab;
    bool const ignored = o == opt.ignore_index;
    double const gl = ignored || d_logp.empty() ? 0.0 : static_cast<double>(d_logp[k]);
    double const ge = ignored || d_entropy.empty() ? 0.0 : static_cast<double>(d_entropy[k]);
    detail::row_backward(z, vocab, inv_tau, static_cast<double>(lse[k]),
                         static_cast<double>(entropy[k]), gl, ge, ignored ? index_t{-1} : o, dz);
  }
}
}  // namespace detail

//! Backward: dlogits[t, v] = (g_logp[t] (1[v = o_t] - p_v) - g_ent[t] p_v (log p_v + H_t)) / tau
//! from the forward's lse and entropy. Either upstream may be empty (= zero). Reads the logits
//! once and writes dlogits once; ignored tokens get a zero row.
template <FlatArray LR, FlatArray IR, FlatArray SR, FlatArray HR,
          FlatArray GR = std::span<flat_value_t<SR> const>,
          FlatArray GER = std::span<flat_value_t<SR> const>,
          MutableFlatArray DR = std::span<flat_value_t<LR>>>
void log_prob_backward(LR&& logits, index_t vocab, IR&& targets, logprob_options const& opt,
                       SR&& lse, HR&& entropy, GR&& d_logp, GER&& d_entropy, DR&& dlogits) {
  detail::log_prob_backward_impl(
      as_flat_const(logits, "logits"), vocab, as_flat_const(targets, "targets"), opt,
      as_flat_const(lse, "lse"), as_flat_const(entropy, "entropy"), as_flat_const(d_logp, "d_logp"),
      as_flat_const(d_entropy, "d_entropy"), as_flat(dlogits, "dlogits"));
}

//! Upstream gradients of one token, returned by the callback of log_prob_fused.
struct logprob_grads {
  double d_logp = 0;
  double d_entropy = 0;
};

namespace detail {
template <class L, class I, class T, class D, class GradFn>
void log_prob_fused_impl(std::span<L const> logits, index_t vocab, std::span<I const> targets,
                         logprob_options const& opt, std::span<T> logp, std::span<T> entropy,
                         GradFn&& grad_fn, std::span<D> dlogits) {
  detail::check_logprob_args(logits, vocab, targets, opt);
  WEFT_EXPECTS_SHAPE(logp.size() == targets.size(), "logp", targets.size(), logp.size());
  WEFT_EXPECTS_SHAPE(entropy.size() == targets.size(), "entropy", targets.size(), entropy.size());
  WEFT_EXPECTS_SHAPE(dlogits.size() == logits.size(), "dlogits", logits.size(), dlogits.size());
  detail::check_targets(targets, vocab, opt);
  using C = compute_t<L>;
  C const inv_tau = detail::inverse_temperature<L>(opt.temperature);
  // One row's e^{x - m_c} (V values, in cache for the backward) and chunk maxima.
  constexpr bool save = std::is_same_v<C, float>;
  std::vector<C> saved_exp(save ? static_cast<std::size_t>(vocab) : 0);
  std::vector<double> chunk_max(
      save ? static_cast<std::size_t>((vocab + detail::logit_chunk - 1) / detail::logit_chunk) : 0);
  for (std::size_t k = 0; k < targets.size(); ++k) {
    auto const o = static_cast<std::int64_t>(targets[k]);
    L const* z = logits.data() + static_cast<index_t>(k) * vocab;
    D* dz = dlogits.data() + static_cast<index_t>(k) * vocab;
    if (o == opt.ignore_index) {
      logp[k] = entropy[k] = T(0);
      detail::row_backward(z, vocab, inv_tau, 0.0, 0.0, 0.0, 0.0, -1, dz);
      continue;
    }
    // f32 compute keeps the forward's exponentials for the backward (one exp per logit instead
    // of two; dlogits then differ from log_prob_backward's by a few ulp of p). f64 recomputes,
    // so its fused result has the same bits as forward then backward.
    auto const s =
        save ? detail::row_stats_saved(z, vocab, inv_tau, saved_exp.data(), chunk_max.data())
             : detail::row_stats(z, vocab, inv_tau);
    double const l = softmax_finish{}.lse(s);
    double const h = softmax_finish{}.entropy(s);
    double const lp = l > -std::numeric_limits<double>::infinity()
                          ? static_cast<double>(detail::load_logit<C>(z, o, inv_tau)) - l
                          : l;
    logp[k] = static_cast<T>(lp);
    entropy[k] = static_cast<T>(h);
    logprob_grads const g = grad_fn(static_cast<index_t>(k), static_cast<T>(lp), static_cast<T>(h));
    if (save)
      detail::row_backward_saved(z, vocab, inv_tau, l, h, g.d_logp, g.d_entropy, o,
                                 saved_exp.data(), chunk_max.data(), dz);
    else
      detail::row_backward(z, vocab, inv_tau, l, h, g.d_logp, g.d_entropy, o, dz);
  }
}
}  // namespace detail

//! Forward and backward in one sweep: per token, the row statistics, then
//! `grad_fn(token, logp, entropy) -> logprob_grads` (the per-token loss gradient, e.g. from a
//! ppo_clip_token), then the row's dlogits while the row is still in cache: the logits come from
//! memory once and dlogits go to memory once. Needs the loss to be per-token given its weights.
template <FlatArray LR, FlatArray IR, MutableFlatArray PR, MutableFlatArray ER, class GradFn,
          MutableFlatArray DR>
void log_prob_fused(LR&& logits, index_t vocab, IR&& targets, logprob_options const& opt, PR&& logp,
                    ER&& entropy, GradFn&& grad_fn, DR&& dlogits) {
  detail::log_prob_fused_impl(as_flat_const(logits, "logits"), vocab,
                              as_flat_const(targets, "targets"), opt, as_flat(logp, "logp"),
                              as_flat(entropy, "entropy"), std::forward<GradFn>(grad_fn),
                              as_flat(dlogits, "dlogits"));
}

}  // namespace weft::rl
