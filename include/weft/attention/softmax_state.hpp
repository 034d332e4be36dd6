// weft/attention/softmax_state.hpp — the per-row softmax state of flash attention (running max and
// sum) and the log-sum-exp merge of partial attention results (O, L), as WEFT_HD code shared by
// the CPU kernels and any CUDA kernel. Empty rows are (O = 0, L = -inf) and merge as the identity.
#pragma once

#include <weft/core/config.hpp>

#include <cuda/std/bit>
#include <cuda/std/cmath>
#include <cuda/std/limits>

#include <cstdint>

namespace weft::attention {

//! exp(x) for x <= 0 in f32 without libm, branch-free so that loops over a tile vectorise: x =
//! n·ln2 + r with |r| <= ln2/2 (Cody-Waite, two-part ln2), e^r by a degree-6 polynomial (Taylor,
//! relative error < 2e-7 on that interval), 2^n built in the exponent bits. x < -87 (including
//! -inf, a masked score) gives exactly 0; the result is within 2 ulp of expf elsewhere.
WEFT_HD inline float exp_nonpositive(float x) noexcept {
  bool const underflow = !(x >= -87.0f);  // also catches -inf
  float const xc = underflow ? -87.0f : (x > 0.0f ? 0.0f : x);
  // Round to nearest by adding and removing 1.5·2^23 (exact for |value| < 2^22; no libm call, so
  // the loop still vectorises on plain SSE2).
  float const n = (xc * 1.44269504088896341f + 12582912.0f) - 12582912.0f;
  float const r = (xc - n * 0.693145751953125f) - n * 1.42860682030941723e-6f;
  float p = 1.0f / 720.0f;
  p = p * r + 1.0f / 120.0f;
  p = p * r + 1.0f / 24.0f;
  p = p * r + 1.0f / 6.0f;
  p = p * r + 0.5f;
  p = p * r + 1.0f;
  p = p * r + 1.0f;
  auto const bits = static_cast<std::uint32_t>(static_cast<std::int32_t>(n) + 127) << 23;
  float const e = p * cuda::std::bit_cast<float>(bits);
  return underflow ? 0.0f : e;
}
//! The f64 path keeps libm: f64 inputs are the accuracy reference, not the fast path.
WEFT_HD inline double exp_nonpositive(double x) noexcept { return cuda::std::exp(x); }

//! The value that marks an empty row (nothing attended): L = -inf, O = 0.
template <class Acc>
WEFT_HD constexpr Acc empty_lse() noexcept {
  return -cuda::std::numeric_limits<Acc>::infinity();
}

//! sigmoid(x) without overflow for either sign (exp of a non-positive number only).
template <class Acc>
WEFT_HD inline Acc stable_sigmoid(Acc x) noexcept {
  if (x >= Acc(0)) return Acc(1) / (Acc(1) + cuda::std::exp(-x));
  Acc const e = cuda::std::exp(x);
  return e / (Acc(1) + e);
}

//! log(exp(a) + exp(b)) = max(a, b) + log1p(exp(-|a - b|)); -inf if both are -inf (where the
//! naive a - b would be NaN). This is `a - logsigmoid(a - b)` of ring-flash-attention.
template <class Acc>
WEFT_HD inline Acc log_add_exp(Acc a, Acc b) noexcept {
  Acc const ninf = empty_lse<Acc>();
  if (a == ninf) return b;
  if (b == ninf) return a;
  Acc const hi = a > b ? a : b;
  Acc const lo = a > b ? b : a;
  return hi + cuda::std::log1p(cuda::std::exp(lo - hi));
}

//! Merges a block result (ob, lb) into the accumulated (o, l) over `n` columns:
//!   o <- o - sigmoid(lb - l) * (o - ob),   l <- log(exp(l) + exp(lb)).
//! The sigmoid form never forms exp(l) or exp(lb), so |l - lb| = 1e4 is harmless. A block with
//! lb = -inf is the identity; an empty accumulator (l = -inf) takes the block as it is; two empty
//! rows stay (0, -inf). `BlockT` may be narrower than `Acc` (a bf16 block output).
struct lse_merge {
  template <class Acc, class BlockT>
  WEFT_HD void operator()(Acc* o, Acc& l, BlockT const* ob, Acc lb, std::int64_t n) const noexcept {
    Acc const ninf = empty_lse<Acc>();
    if (lb == ninf) return;
    if (l == ninf) {
      for (std::int64_t c = 0; c < n; ++c) o[c] = static_cast<Acc>(ob[c]);
      l = lb;
      return;
    }
    Acc const w = stable_sigmoid<Acc>(lb - l);
    for (std::int64_t c = 0; c < n; ++c) o[c] -= w * (o[c] - static_cast<Acc>(ob[c]));
    l = log_add_exp<Acc>(l, lb);
  }
};

//! The running state of one query row in the online softmax (FlashAttention-2 §1.2): the max `m`
//! of the scores seen so far and the sum `l` of exp(score - m). The un-normalised output row lives
//! with the caller, which rescales it by the factor `rescale` returns.
template <class Acc>
struct softmax_row_state {
  Acc m = empty_lse<Acc>();
  Acc l = Acc(0);

  //! Moves the max to max(m, tile_max) and returns exp(m_old - m_new), the factor the caller
  //! multiplies its accumulated output and `l` by. Guarded: while the row is still empty (both
  //! maxima -inf) the factor is 1 and the max stays -inf, so no exp(-inf - -inf) = NaN appears.
  WEFT_HD Acc rescale(Acc tile_max) noexcept {
    Acc const m_new = tile_max > m ? tile_max : m;
    if (m_new == empty_lse<Acc>()) return Acc(1);
    Acc const alpha = (m == empty_lse<Acc>()) ? Acc(0) : cuda::std::exp(m - m_new);
    m = m_new;
    l *= alpha;
    return alpha;
  }

  //! exp(score - m) for an unmasked score after rescale; 0 for a masked (-inf) score.
  WEFT_HD Acc weight(Acc score) const noexcept {
    return score == empty_lse<Acc>() ? Acc(0) : cuda::std::exp(score - m);
  }

  //! L = m + log(l); -inf for an empty row.
  [[nodiscard]] WEFT_HD Acc lse() const noexcept {
    return (l > Acc(0) && m != empty_lse<Acc>()) ? m + cuda::std::log(l) : empty_lse<Acc>();
  }
  //! 1 / l, the final normalisation of the output row; 0 for an empty row (so O = 0).
  [[nodiscard]] WEFT_HD Acc inv_sum() const noexcept { return l > Acc(0) ? Acc(1) / l : Acc(0); }
};

//! P_ij = exp(S_ij - L_i) in the backward; 0 for masked scores and for empty rows (L_i = -inf).
template <class Acc>
WEFT_HD inline Acc recompute_probability(Acc score, Acc lse) noexcept {
  if (score == empty_lse<Acc>() || lse == empty_lse<Acc>()) return Acc(0);
  return cuda::std::exp(score - lse);
}

}  // namespace weft::attention
