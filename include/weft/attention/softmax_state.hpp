// weft/attention/softmax_state.hpp — the per-row output state of flash attention (running max and
// sum beside the caller's un-normalised output row) and the log-sum-exp merge of partial attention
// results (O, L), as WEFT_HD code shared by the CPU kernels and any CUDA kernel. The element math
// (exp_fn, stable_sigmoid, log_add_exp, the online-softmax rescale and finish) is weft's, in
// weft/core/math.hpp. Empty rows are (O = 0, L = -inf) and merge as the identity.
#pragma once

#include <weft/core/config.hpp>
#include <weft/core/math.hpp>

#include <cstdint>

namespace weft::attention {

//! The value that marks an empty row (nothing attended): L = -inf, O = 0.
template <class Acc>
WEFT_HD constexpr Acc empty_lse() noexcept {
  return neg_inf<Acc>();
}

//! Merges a block result (ob, lb) into the accumulated (o, l) over `n` columns:
//!   o <- o - sigmoid(lb - l) * (o - ob),   l <- log(exp(l) + exp(lb)).
//! The sigmoid form never forms exp(l) or exp(lb), so |l - lb| = 1e4 is harmless. A block with
//! lb = -inf is the identity; an empty accumulator (l = -inf) takes the block as it is; two empty
//! rows stay (0, -inf). `BlockT` may be narrower than `Acc` (a bf16 block output).
struct lse_merge {
  template <class Acc, class BlockT>
  WEFT_HD void operator()(Acc* o, Acc& l, BlockT const* ob, Acc lb, index_t n) const noexcept {
    Acc const ninf = empty_lse<Acc>();
    if (lb == ninf) return;
    if (l == ninf) {
      for (index_t c = 0; c < n; ++c) o[c] = static_cast<Acc>(ob[c]);
      l = lb;
      return;
    }
    Acc const w = stable_sigmoid<Acc>(lb - l);
    for (index_t c = 0; c < n; ++c) o[c] -= w * (o[c] - static_cast<Acc>(ob[c]));
    l = log_add_exp<Acc>(l, lb);
  }
};

//! The running state of one query row in the online softmax (T. Dao, "FlashAttention-2: Faster
//! Attention with Better Parallelism and Work Partitioning", arXiv 2307.08691, Algorithm 1): the
//! max `m` of the scores seen so far and the sum `l` of exp(score - m), i.e. weft's online-softmax
//! statistics without the entropy term. The un-normalised output row lives with the caller, which
//! rescales it by the factor `rescale` returns.
template <class Acc>
struct softmax_row_state {
  Acc m = empty_lse<Acc>();
  Acc l = Acc(0);

  //! Moves the max to max(m, tile_max) and returns exp(m_old - m_new), the factor the caller
  //! multiplies its accumulated output and `l` by. Guarded: while the row is still empty (both
  //! maxima -inf) the factor is 1 and the max stays -inf, so no exp(-inf - -inf) = NaN appears.
  WEFT_HD Acc rescale(Acc tile_max) noexcept {
    Acc const m_new = tile_max > m ? tile_max : m;
    Acc const alpha = softmax_rescale(m, m_new);
    m = m_new;
    l *= alpha;
    return alpha;
  }

  //! exp(score - m) for an unmasked score after rescale; 0 for a masked (-inf) score.
  WEFT_HD Acc weight(Acc score) const noexcept {
    return score == empty_lse<Acc>() ? Acc(0) : exp_fn{}(score - m);
  }

  //! L = m + log(l); -inf for an empty row.
  [[nodiscard]] WEFT_HD Acc lse() const noexcept {
    return softmax_finish{}.lse(softmax_stats<Acc>{m, l, Acc(0)});
  }
  //! 1 / l, the final normalisation of the output row; 0 for an empty row (so O = 0).
  [[nodiscard]] WEFT_HD Acc inv_sum() const noexcept { return l > Acc(0) ? Acc(1) / l : Acc(0); }
};

//! P_ij = exp(S_ij - L_i) in the backward; 0 for masked scores and for empty rows (L_i = -inf).
template <class Acc>
WEFT_HD inline Acc recompute_probability(Acc score, Acc lse) noexcept {
  if (score == empty_lse<Acc>() || lse == empty_lse<Acc>()) return Acc(0);
  return exp_fn{}(score - lse);
}

}  // namespace weft::attention
