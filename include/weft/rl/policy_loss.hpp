// weft/rl/policy_loss.hpp — policy-gradient losses over per-token log-probs with their
// hand-written gradients: PPO clip with decoupled eps_low/eps_high and dual clip (verl `vanilla`,
// DAPO clip-higher), GSPO, CISPO and REINFORCE; optional rollout IS weights; metrics as sums.
#pragma once

#include <weft/comm/collectives.hpp>
#include <weft/comm/concepts.hpp>
#include <weft/core/memory.hpp>
#include <weft/core/config.hpp>
#include <weft/core/error.hpp>
#include <weft/core/simd.hpp>
#include <weft/rl/exp.hpp>
#include <weft/rl/token_layout.hpp>
#include <weft/rl/named_arrays.hpp>

#include <cuda/std/cmath>
#include <cuda/std/limits>

#include <algorithm>
#include <array>
#include <cmath>
#include <concepts>
#include <cstdint>
#include <limits>
#include <span>
#include <string_view>
#include <utility>
#include <vector>

namespace weft::rl {

//! Which per-token objective. All are minimised; A is the (detached) advantage, l the new
//! log-prob, l_old the behaviour log-prob, r = exp(clamp(l - l_old, +-log_ratio_clamp)).
//! - ppo_clip:  -A*min(r, 1+eps_high) for A > 0; -A*min(max(r, 1-eps_low), c) for A < 0 (dual clip)
//! - gspo:      the same clip (no dual clip) on the sequence ratio s_i = exp(mean_t (l - l_old))
//! - cispo:     -sg(clip(r, 1-eps_low, 1+eps_high)) * A * l   (no token ever dropped)
//! - reinforce: -A * l   (l_old unused; verl's `reinforce` / `gpg`)
enum class policy_loss_kind : unsigned char { ppo_clip, gspo, cispo, reinforce };

constexpr std::string_view to_string(policy_loss_kind k) noexcept {
  switch (k) {
    case policy_loss_kind::ppo_clip: return "ppo_clip";
    case policy_loss_kind::gspo: return "gspo";
    case policy_loss_kind::cispo: return "cispo";
    case policy_loss_kind::reinforce: return "reinforce";
  }
  return "unknown";
}

//! Defaults are DAPO's (clip-higher 0.2 / 0.28) with verl's dual clip c = 3 and log-ratio clamp
//! 20. Set dual_clip to +infinity to switch the dual clip off (OpenRLHF and TRL defaults);
//! clip_low = +infinity gives CISPO TRL's upper-only cap.
struct policy_loss_config {
  policy_loss_kind kind = policy_loss_kind::ppo_clip;
  double clip_low = 0.2;
  double clip_high = 0.28;
  double dual_clip = 3.0;
  double log_ratio_clamp = 20.0;  // verl PR #1779; gspo clamps the sequence log-ratio at +10
  double gspo_log_ratio_max = 10.0;

  void validate() const {
    WEFT_EXPECTS(clip_low >= 0, "clip_low", ">= 0", clip_low);
    WEFT_EXPECTS(clip_high >= 0, "clip_high", ">= 0", clip_high);
    // Dual clip caps -A*r at -A*c for A < 0; with c <= 1 it would cut below the PPO clip itself.
    WEFT_EXPECTS(dual_clip > 1, "dual_clip", "> 1 (use +infinity to disable)", dual_clip);
    WEFT_EXPECTS(log_ratio_clamp > 0, "log_ratio_clamp", "> 0", log_ratio_clamp);
    WEFT_EXPECTS(gspo_log_ratio_max > 0, "gspo_log_ratio_max", "> 0", gspo_log_ratio_max);
  }
};

//! Metrics as sums and counts over valid tokens, so they add exactly across micro-batches and
//! all-reduce across data-parallel ranks (sums(): one sum all_reduce; extrema: one max).
//! clipped_high: A>0 & r>1+eps_high; clipped_low: A<0 & r<1-eps_low (for cispo: r outside the
//! interval whatever A); dual_clipped: A<0 & r>c. These are exactly the token sets whose gradient
//! the clip kills (verl pg_clipfrac = low+high, pg_clipfrac_lower = dual). neg_log_ratio_sum is
//! sum(l_old - l) of the clamped log-ratio (verl's `ppo_kl` for vanilla PPO and CISPO, which
//! clamp before their metric), neg_log_ratio_raw_sum the same before the clamp (OpenRLHF's; +inf
//! if some token has l = -inf and a finite l_old). GSPO clamps no token's log-ratio, so there the
//! two are equal, as verl's gspo `ppo_kl` is unclamped. Dropped tokens (see policy_loss) are not
//! counted at all.
struct policy_metrics {
  double tokens = 0;
  double clipped_low = 0;
  double clipped_high = 0;
  double dual_clipped = 0;
  double log_ratio_clamped = 0;
  double neg_log_ratio_sum = 0;
  double ratio_sum = 0;
  double ratio_sq_sum = 0;
  double neg_log_ratio_raw_sum = 0;
  double ratio_min = std::numeric_limits<double>::infinity();
  double ratio_max = -std::numeric_limits<double>::infinity();

  static constexpr std::size_t num_sums = 9;
  [[nodiscard]] std::array<double, num_sums> sums() const noexcept {
    return {tokens,       clipped_low,       clipped_high,
            dual_clipped, log_ratio_clamped, neg_log_ratio_sum,
            ratio_sum,    ratio_sq_sum,      neg_log_ratio_raw_sum};
  }
  void set_sums(std::array<double, num_sums> const& s) noexcept {
    tokens = s[0];
    clipped_low = s[1];
    clipped_high = s[2];
    dual_clipped = s[3];
    log_ratio_clamped = s[4];
    neg_log_ratio_sum = s[5];
    ratio_sum = s[6];
    ratio_sq_sum = s[7];
    neg_log_ratio_raw_sum = s[8];
  }
  policy_metrics& operator+=(policy_metrics const& o) noexcept {
    auto a = sums();
    auto const b = o.sums();
    for (std::size_t k = 0; k < num_sums; ++k) a[k] += b[k];
    set_sums(a);
    ratio_min = std::min(ratio_min, o.ratio_min);
    ratio_max = std::max(ratio_max, o.ratio_max);
    return *this;
  }

  [[nodiscard]] double frac(double count) const noexcept {
    return tokens > 0 ? count / tokens : 0.0;
  }
  [[nodiscard]] double clip_frac_low() const noexcept { return frac(clipped_low); }
  [[nodiscard]] double clip_frac_high() const noexcept { return frac(clipped_high); }
  [[nodiscard]] double clip_frac() const noexcept { return frac(clipped_low + clipped_high); }
  [[nodiscard]] double dual_clip_frac() const noexcept { return frac(dual_clipped); }
  //! Mean of l_old - l over the clamped log-ratio (verl `ppo_kl` of vanilla / cispo).
  [[nodiscard]] double approx_kl() const noexcept { return frac(neg_log_ratio_sum); }
  //! Mean of l_old - l before the clamp (OpenRLHF's `ppo_kl`; verl's for gspo, where it equals
  //! approx_kl()).
  [[nodiscard]] double approx_kl_unclamped() const noexcept { return frac(neg_log_ratio_raw_sum); }
  //! verl's metric names, for logging side by side with verl runs.
  [[nodiscard]] double pg_clipfrac() const noexcept { return clip_frac(); }
  [[nodiscard]] double pg_clipfrac_lower() const noexcept { return dual_clip_frac(); }
  [[nodiscard]] double ppo_kl() const noexcept { return approx_kl(); }
  [[nodiscard]] double ratio_mean() const noexcept { return frac(ratio_sum); }
  [[nodiscard]] double ratio_std() const noexcept {
    if (tokens <= 0) return 0.0;
    double const m = ratio_sum / tokens;
    double const v = ratio_sq_sum / tokens - m * m;
    return v > 0 ? std::sqrt(v) : 0.0;
  }
};

//! Sums the metrics of every rank of `dp` (two all_reduces: the sums, then both extrema as a max).
template <comm::CollectiveIn<host_space> C>
[[nodiscard]] policy_metrics all_reduce_metrics(C& dp, policy_metrics const& local) {
  auto in = local.sums();
  std::array<double, policy_metrics::num_sums> out{};
  comm::all_reduce(dp, std::as_const(in), out, comm::reduce_kind::sum).wait();
  std::array<double, 2> ein{local.ratio_max, -local.ratio_min};
  std::array<double, 2> eout{};
  comm::all_reduce(dp, std::as_const(ein), eout, comm::reduce_kind::max).wait();
  policy_metrics m;
  m.set_sums(out);
  m.ratio_max = eout[0];
  m.ratio_min = -eout[1];
  return m;
}

//! What one token contributes: loss value, d loss / d l, the ratio, and flag bits.
template <class T>
struct pg_token {
  T loss;
  T grad;
  T ratio;
  T neg_log_ratio;      // l_old - l after clamping
  unsigned flags;       // pg_flag bits
  T neg_log_ratio_raw;  // l_old - l before clamping
};

//! pg_dropped: the token's loss has no finite value (l = l_old = -inf: the log-ratio is
//! undefined; l = -inf in cispo / reinforce: -A l is infinite); its loss and gradient are 0 and
//! policy_loss leaves it out of the metrics, as if masked.
enum pg_flag : unsigned {
  pg_clipped_low = 1u,
  pg_clipped_high = 2u,
  pg_dual_clipped = 4u,
  pg_log_ratio_clamped = 8u,
  pg_dropped = 32u,  // 16 is the policy loop's valid bit
};

//! PPO clip with decoupled bounds and dual clip, per token (decoupled bounds: DAPO,
//! arXiv:2503.14476 §3.1; dual clip: Ye et al., arXiv:1912.09729). The
//! gradient is -A*r*k with k = 1 on the closed intervals A>0 & r <= 1+eps_high and
//! A<0 & 1-eps_low <= r <= c, else 0 (also where |l - l_old| exceeds the clamp: the clamp's
//! backward is 0 there). At exact ties this passes the full gradient, where torch.minimum would
//! pass half at r = c; the tie set has measure zero.
template <class T>
struct ppo_clip_token {
  T eps_low;
  T eps_high;
  T dual_clip;
  T log_ratio_clamp;

  // Branch-free (selects, weft's exp_fn) so the CPU loop over tokens vectorises.
  WEFT_HD WEFT_FORCEINLINE pg_token<T> operator()(T logp, T old_logp, T adv) const noexcept {
    constexpr T ninf = -cuda::std::numeric_limits<T>::infinity();
    bool const drop = (logp == ninf) & (old_logp == ninf);  // -inf - -inf would be NaN
    T const delta = select(drop, T(0), logp - old_logp);
    bool const above = delta > log_ratio_clamp;
    bool const below = delta < -log_ratio_clamp;
    bool const clamped = above | below;
    T const dc = select(above, log_ratio_clamp, select(below, -log_ratio_clamp, delta));
    T const r = exp_fn{}(dc);
    T const lo = T(1) - eps_low;
    T const hi = T(1) + eps_high;
    bool const pos = adv > T(0);
    bool const neg = adv < T(0);
    bool const clip_high = pos & (r > hi);
    bool const clip_low = neg & (r < lo);
    bool const dual = neg & (r > dual_clip);
    T const rc = select(clip_high, hi, select(clip_low, lo, select(dual, dual_clip, r)));
    bool const keep = (pos | neg) & !(clip_high | clip_low | dual) & !clamped & !drop;
    unsigned const flags =
        (clamped ? unsigned(pg_log_ratio_clamped) : 0u) |
        (clip_high ? unsigned(pg_clipped_high) : 0u) | (clip_low ? unsigned(pg_clipped_low) : 0u) |
        (dual ? unsigned(pg_dual_clipped) : 0u) | (drop ? unsigned(pg_dropped) : 0u);
    return {select((pos | neg) & !drop, -adv * rc, T(0)),
            select(keep, -adv * r, T(0)),
            r,
            -dc,
            flags,
            -delta};
  }
};

//! CISPO per token: value -clip(r)*A*l, gradient -clip(r)*A (the clipped ratio is detached).
template <class T>
struct cispo_token {
  T eps_low;
  T eps_high;
  T log_ratio_clamp;

  WEFT_HD WEFT_FORCEINLINE pg_token<T> operator()(T logp, T old_logp, T adv) const noexcept {
    bool const drop = logp == -cuda::std::numeric_limits<T>::infinity();  // -A l infinite
    T const delta = select(drop, T(0), logp - old_logp);
    bool const above = delta > log_ratio_clamp;
    bool const below = delta < -log_ratio_clamp;
    T const dc = select(above, log_ratio_clamp, select(below, -log_ratio_clamp, delta));
    T const r = exp_fn{}(dc);
    T const lo = T(1) - eps_low;
    T const hi = T(1) + eps_high;
    bool const rlow = r < lo;
    bool const rhigh = r > hi;
    T const rc = select(rlow, lo, select(rhigh, hi, r));
    unsigned const flags = ((above | below) ? unsigned(pg_log_ratio_clamped) : 0u) |
                           (rlow ? unsigned(pg_clipped_low) : 0u) |
                           (rhigh ? unsigned(pg_clipped_high) : 0u) |
                           (drop ? unsigned(pg_dropped) : 0u);
    return {
        select(drop, T(0), -rc * adv * logp), select(drop, T(0), -rc * adv), r, -dc, flags, -delta};
  }
};

//! REINFORCE / GPG per token: value -A*l, gradient -A.
template <class T>
struct reinforce_token {
  WEFT_HD WEFT_FORCEINLINE pg_token<T> operator()(T logp, T old_logp, T adv) const noexcept {
    bool const drop = logp == -cuda::std::numeric_limits<T>::infinity();
    T const dc = select(drop, T(0), logp - old_logp);
    return {select(drop, T(0), -adv * logp),
            select(drop, T(0), -adv),
            exp_fn{}(dc),
            -dc,
            drop ? unsigned(pg_dropped) : 0u,
            -dc};
  }
};

//! The sequence-level clip of GSPO for one token with sequence ratio s: value and d value / d s.
template <class T>
struct gspo_token {
  T eps_low;
  T eps_high;

  WEFT_HD pg_token<T> operator()(T s, T adv) const noexcept {
    T const lo = T(1) - eps_low;
    T const hi = T(1) + eps_high;
    pg_token<T> out{T(0), T(0), s, T(0), 0u, T(0)};
    if (adv > T(0)) {
      bool const clip = s > hi;
      out.loss = -adv * (clip ? hi : s);
      out.grad = clip ? T(0) : -adv;  // d loss / d s
      out.flags = clip ? unsigned(pg_clipped_high) : 0u;
    } else if (adv < T(0)) {
      bool const clip = s < lo;
      out.loss = -adv * (clip ? lo : s);
      out.grad = clip ? T(0) : -adv;
      out.flags = clip ? unsigned(pg_clipped_low) : 0u;
    }
    return out;
  }
};

//! Inputs of policy_loss: per-token arrays in the order of a token_layout, each wrapped in its
//! arg:: name (new log-prob before old, unlike verl's argument order; the names make a swap a
//! compile error).
template <class T, class M>
struct policy_inputs {
  arg::new_logp<T> logp;
  arg::old_logp<T> old_logp;
  arg::advantages<T> advantages;
  arg::mask<M> mask;
  arg::weights<T> weights;
  arg::rollout_is_weights<T> rollout_is_weights = {};
};

struct policy_loss_result {
  double loss = 0;  // sum_t w_t * isw_t * loss_t over this batch's valid tokens
  policy_metrics metrics;
};

namespace detail {
inline void add_metrics(policy_metrics& m, double ratio, double neg_log_ratio, unsigned flags) {
  m.tokens += 1;
  m.clipped_low += (flags & pg_clipped_low) ? 1 : 0;
  m.clipped_high += (flags & pg_clipped_high) ? 1 : 0;
  m.dual_clipped += (flags & pg_dual_clipped) ? 1 : 0;
  m.log_ratio_clamped += (flags & pg_log_ratio_clamped) ? 1 : 0;
  m.neg_log_ratio_sum += neg_log_ratio;
  m.ratio_sum += ratio;
  m.ratio_sq_sum += ratio * ratio;
  m.ratio_min = std::min(m.ratio_min, ratio);
  m.ratio_max = std::max(m.ratio_max, ratio);
}
}  // namespace detail

namespace detail {

inline constexpr index_t token_block = 512;
inline constexpr index_t metric_lanes = 8;

template <bool HasIsw, class T, class M, class Fn>
WEFT_FORCEINLINE void policy_token_loop_impl(Fn const& fn_ref, policy_inputs<T, M> const& in,
                                             std::span<T> dlogp, policy_loss_result& res) {
  Fn const fn = fn_ref;
  constexpr index_t W = metric_lanes;
  constexpr T inf = std::numeric_limits<T>::infinity();
  index_t const n = static_cast<index_t>(in.logp.size());
  T const* lp = in.logp.data();
  T const* old = in.old_logp.empty() ? lp : in.old_logp.data();
  T const* adv = in.advantages.data();
  M const* mask = in.mask.data();
  T const* w = in.weights.data();
  T const* isw = HasIsw ? in.rollout_is_weights.data() : nullptr;
  T* dl = dlogp.data();
  double acc_loss[W] = {}, acc_tok[W] = {}, acc_lo[W] = {}, acc_hi[W] = {}, acc_dual[W] = {},
         acc_clamp[W] = {}, acc_nlr[W] = {}, acc_r[W] = {}, acc_r2[W] = {}, acc_raw[W] = {};
  T rmin[W], rmax[W];
  for (index_t l = 0; l < W; ++l) rmin[l] = inf, rmax[l] = -inf;
  constexpr index_t tree_lanes = 16;
  alignas(64) T b_r2[token_block];
  alignas(64) T b_loss[token_block], b_r[token_block], b_nlr[token_block], b_rmin[token_block],
      b_rmax[token_block], b_raw[token_block];
  alignas(64) std::uint32_t b_flags[token_block + 16];
  alignas(64) T s_lp[token_block], s_old[token_block], s_adv[token_block], s_w[token_block],
      s_isw[HasIsw ? token_block : 1], s_dl[token_block];
  alignas(64) M s_m[token_block];
  constexpr index_t CW = 16;                // lanes of the integer counts
  constexpr std::uint32_t valid_bit = 16u;  // beside the pg_flag bits
  // The loss terms of valid tokens, compacted: the loss's lanes are keyed by the count of valid
  // tokens before it, not by position, so padded and packed layouts of the same tokens give
  // bit-identical losses (masked positions would otherwise shift tokens between lanes).
  alignas(64) T c_loss[token_block + W];
  index_t cn = 0;
  for (index_t t0 = 0; t0 < n; t0 += token_block) {
    index_t const len = n - t0 < token_block ? n - t0 : token_block;
    // The per-token pass runs over exactly token_block tokens (a tail block is staged, padded
    // with masked tokens), so its trip count is a compile-time multiple of every vector width:
    // GCC's -O2 cost model ("very cheap") vectorises no loop that would need a scalar epilogue.
    bool const tail = len < token_block;
    T const* blp = lp + t0;
    T const* bold = old + t0;
    T const* badv = adv + t0;
    T const* bw = w + t0;
    M const* bm = mask + t0;
    T const* bisw = HasIsw ? isw + t0 : nullptr;
    T* bdl = dl + t0;
    if (tail) {
      for (index_t j = 0; j < token_block; ++j) {
        bool const in_range = j < len;
        s_lp[j] = in_range ? blp[j] : T(0);
        s_old[j] = in_range ? bold[j] : T(0);
        s_adv[j] = in_range ? badv[j] : T(0);
        s_w[j] = in_range ? bw[j] : T(0);
        s_m[j] = in_range ? bm[j] : M{};
        if constexpr (HasIsw) s_isw[j] = in_range ? bisw[j] : T(0);
      }
      blp = s_lp, bold = s_old, badv = s_adv, bw = s_w, bm = s_m, bdl = s_dl;
      if constexpr (HasIsw) bisw = s_isw;
    }
    WEFT_IVDEP
    for (index_t j = 0; j < token_block; ++j) {
      // Compared as T: a byte mask beside float compares otherwise stops GCC's vectoriser.
      bool v;
      if constexpr (std::is_arithmetic_v<M>)
        v = static_cast<T>(bm[j]) != T(0);
      else
        v = valid(bm[j]);
      pg_token<T> const p = fn(blp[j], bold[j], badv[j]);
      v = v & ((p.flags & pg_dropped) == 0u);  // dropped tokens count nowhere, as if masked
      T scale = bw[j];
      if constexpr (HasIsw) scale *= bisw[j];
      bdl[j] = select(v, scale * p.grad, T(0));
      b_loss[j] = select(v, scale * p.loss, T(0));
      b_r[j] = select(v, p.ratio, T(0));
      b_r2[j] = select(v, p.ratio * p.ratio, T(0));
      b_nlr[j] = select(v, p.neg_log_ratio, T(0));
      b_raw[j] = select(v, p.neg_log_ratio_raw, T(0));
      b_rmin[j] = select(v, p.ratio, inf);
      b_rmax[j] = select(v, p.ratio, -inf);
      b_flags[j] = v ? (p.flags | valid_bit) : 0u;
    }
    if (tail)
      for (index_t j = 0; j < len; ++j) dl[t0 + j] = s_dl[j];
    for (index_t j = 0; j < len; ++j) {
      c_loss[cn] = b_loss[j];
      cn += static_cast<index_t>(b_flags[j] >> 4);
    }
    index_t const full = cn / W * W;
    for (index_t j = 0; j < full; j += W)
      for (index_t l = 0; l < W; ++l) acc_loss[l] += static_cast<double>(c_loss[j + l]);
    for (index_t j = full; j < cn; ++j) c_loss[j - full] = c_loss[j];
    cn -= full;
    // Counts as integers per block (exact, cheap), then into the double totals.
    std::uint32_t n_tok[CW] = {}, n_lo[CW] = {}, n_hi[CW] = {}, n_dual[CW] = {}, n_clamp[CW] = {};
    // The per-token pass wrote all token_block entries; past len they are masked (flags 0, sums
    // 0, extrema +-inf), so the counts and trees run over the whole block.
    for (index_t j = 0; j < token_block; j += CW)
      for (index_t l = 0; l < CW; ++l) {
        std::uint32_t const f = b_flags[j + l];
        n_lo[l] += f & 1u;
        n_hi[l] += (f >> 1) & 1u;
        n_dual[l] += (f >> 2) & 1u;
        n_clamp[l] += (f >> 3) & 1u;
        n_tok[l] += f >> 4;
      }
    for (index_t l = 0; l < CW; ++l) {
      acc_tok[l % W] += n_tok[l];
      acc_lo[l % W] += n_lo[l];
      acc_hi[l % W] += n_hi[l];
      acc_dual[l % W] += n_dual[l];
      acc_clamp[l % W] += n_clamp[l];
    }
    // Ratio sums and extrema: pairwise trees over the (padded) block down to tree_lanes values,
    // every level a map (vectorises; a running min/max or double sum over lanes does not).
    for (index_t h = token_block / 2; h >= tree_lanes; h /= 2)
      weft::detail::for_each_blocked(0, h, [&](index_t j) WEFT_LAMBDA_INLINE {
        b_r[j] += b_r[j + h];
        b_r2[j] += b_r2[j + h];
        b_nlr[j] += b_nlr[j + h];
        b_raw[j] += b_raw[j + h];
        b_rmin[j] = select(b_rmin[j + h] < b_rmin[j], b_rmin[j + h], b_rmin[j]);
        b_rmax[j] = select(b_rmax[j + h] > b_rmax[j], b_rmax[j + h], b_rmax[j]);
      });
    for (index_t l = 0; l < tree_lanes; ++l) {
      acc_r[0] += static_cast<double>(b_r[l]);
      acc_r2[0] += static_cast<double>(b_r2[l]);
      acc_nlr[0] += static_cast<double>(b_nlr[l]);
      acc_raw[0] += static_cast<double>(b_raw[l]);
      rmin[0] = b_rmin[l] < rmin[0] ? b_rmin[l] : rmin[0];
      rmax[0] = b_rmax[l] > rmax[0] ? b_rmax[l] : rmax[0];
    }
  }
  for (index_t j = 0; j < cn; ++j) acc_loss[j] += static_cast<double>(c_loss[j]);
  policy_metrics& m = res.metrics;
  for (index_t l = 0; l < W; ++l) {
    res.loss += acc_loss[l];
    m.tokens += acc_tok[l];
    m.clipped_low += acc_lo[l];
    m.clipped_high += acc_hi[l];
    m.dual_clipped += acc_dual[l];
    m.log_ratio_clamped += acc_clamp[l];
    m.neg_log_ratio_sum += acc_nlr[l];
    m.neg_log_ratio_raw_sum += acc_raw[l];
    m.ratio_sum += acc_r[l];
    m.ratio_sq_sum += acc_r2[l];
    m.ratio_min = std::min(m.ratio_min, static_cast<double>(rmin[l]));
    m.ratio_max = std::max(m.ratio_max, static_cast<double>(rmax[l]));
  }
}

#if WEFT_RL_MULTIVERSION
template <bool HasIsw, class T, class M, class Fn>
WEFT_RL_TARGET_AVX2 void policy_token_loop_avx2(Fn const& fn, policy_inputs<T, M> const& in,
                                                std::span<T> dlogp, policy_loss_result& res) {
  policy_token_loop_impl<HasIsw>(fn, in, dlogp, res);
}
template <bool HasIsw, class T, class M, class Fn>
WEFT_RL_TARGET_AVX512 void policy_token_loop_avx512(Fn const& fn, policy_inputs<T, M> const& in,
                                                    std::span<T> dlogp, policy_loss_result& res) {
  policy_token_loop_impl<HasIsw>(fn, in, dlogp, res);
}
#endif

//! Adds the per-token loss, metrics and gradient of `fn` over all tokens to `res` / `dlogp`.
template <bool HasIsw, class T, class M, class Fn>
void policy_token_loop(Fn const& fn, policy_inputs<T, M> const& in, std::span<T> dlogp,
                       policy_loss_result& res) {
#if WEFT_RL_MULTIVERSION
  switch (host_simd_level()) {
    case simd_level::avx512: return policy_token_loop_avx512<HasIsw>(fn, in, dlogp, res);
    case simd_level::avx2: return policy_token_loop_avx2<HasIsw>(fn, in, dlogp, res);
    case simd_level::base: break;
  }
#endif
  policy_token_loop_impl<HasIsw>(fn, in, dlogp, res);
}

}  // namespace detail

namespace detail {
template <class T, class M>
policy_loss_result policy_loss_impl(policy_loss_config const& cfg, token_layout const& layout,
                                    policy_inputs<T, M> const& in, std::span<T> dlogp) {
  static_assert(std::is_floating_point_v<T>, "weft::rl::policy_loss: T must be float or double");
  cfg.validate();
  detail::expect_tokens(in.logp, layout, "logp");
  if (cfg.kind == policy_loss_kind::reinforce)
    detail::expect_tokens_or_empty(in.old_logp, layout, "old_logp");
  else
    detail::expect_tokens(in.old_logp, layout, "old_logp");
  detail::expect_tokens(in.advantages, layout, "advantages");
  detail::expect_tokens(in.mask, layout, "mask");
  detail::expect_tokens(in.weights, layout, "weights");
  detail::expect_tokens_or_empty(in.rollout_is_weights, layout, "rollout_is_weights");
  detail::expect_tokens(dlogp, layout, "dlogp");

  bool const has_isw = !in.rollout_is_weights.empty();
  policy_loss_result res;
  T const eps_l = static_cast<T>(cfg.clip_low);
  T const eps_h = static_cast<T>(cfg.clip_high);
  T const clamp = static_cast<T>(cfg.log_ratio_clamp);

  // Masked tokens never reach the sums or the gradient: their values are computed and selected
  // away (not multiplied by 0), so NaN padding cannot leak. Blocks of token_block tokens: one
  // branch-free pass of per-token math (vectorises), then the sums in double over metric_lanes
  // fixed lanes (a map per lane, so it vectorises without reassociation; the order is fixed).
  auto per_token = [&](auto const& fn) {
    if (has_isw)
      detail::policy_token_loop<true>(fn, in, dlogp, res);
    else
      detail::policy_token_loop<false>(fn, in, dlogp, res);
  };

  switch (cfg.kind) {
    case policy_loss_kind::ppo_clip:
      per_token(ppo_clip_token<T>{eps_l, eps_h, static_cast<T>(cfg.dual_clip), clamp});
      break;
    case policy_loss_kind::cispo: per_token(cispo_token<T>{eps_l, eps_h, clamp}); break;
    case policy_loss_kind::reinforce: per_token(reinforce_token<T>{}); break;
    case policy_loss_kind::gspo: {
      // s_i = exp(min(mean_t (l - l_old), 10)); L = sum_t w_t isw_t f(s_i, A_t);
      // dL/dl_u = m_u * s_i / L_i * sum_t w_t isw_t f'(s_i, A_t)  (0 if the clamp is active).
      // With weights constant in the row (token-mean, seq-mean-*) and one advantage per row this
      // is verl's GSPO-token gradient -A s_i w; unlike verl's stop-gradient form it is the true
      // derivative for any weights, which the finite-difference tests check.
      // Branch-free per token (masked tokens add exactly +0 to the running sums, so the sums,
      // and with them packed vs padded results, keep the order of the valid tokens). The ratio
      // and the clip decisions are per row, so the metrics are counts per row.
      T const smax = static_cast<T>(cfg.gspo_log_ratio_max);
      T const lo = T(1) - eps_l;
      T const hi = T(1) + eps_h;
      T const* lp = in.logp.data();
      T const* old = in.old_logp.data();
      T const* adv = in.advantages.data();
      T const* w = in.weights.data();
      auto const* mask = in.mask.data();
      policy_metrics& m = res.metrics;
      // A token with l = l_old = -inf is dropped (its log-ratio is undefined): it counts as masked.
      constexpr T ninf = -std::numeric_limits<T>::infinity();
      auto live = [&](index_t t) {
        return detail::valid(mask[t]) && !(lp[t] == ninf && old[t] == ninf);
      };
      for (index_t i = 0; i < layout.rows(); ++i) {
        index_t const b = layout.row_begin(i);
        index_t const e = layout.row_end(i);
        T sum_delta = 0;
        double nlr = 0;
        index_t n = 0;
        for (index_t t = b; t < e; ++t) {
          bool const v = live(t);
          T const d = v ? lp[t] - old[t] : T(0);
          sum_delta += select(v, d, T(0));
          nlr += select(v, static_cast<double>(-d), 0.0);
          n += v ? 1 : 0;
        }
        if (n == 0) {
          for (index_t t = b; t < e; ++t) dlogp[static_cast<std::size_t>(t)] = T(0);
          continue;
        }
        T const mean_delta = sum_delta / static_cast<T>(n);
        bool const clamped = mean_delta > smax;
        T const s = std::exp(clamped ? smax : mean_delta);
        bool const clip_hi = s > hi;
        bool const clip_lo = s < lo;
        T const sp = clip_hi ? hi : s;  // the clipped ratio for A > 0, for A < 0
        T const sn = clip_lo ? lo : s;
        T const gp = clip_hi ? T(0) : T(1);  // d f / d s / (-A)
        T const gn = clip_lo ? T(0) : T(1);
        T dsum = 0;
        index_t npos = 0, nneg = 0;
        for (index_t t = b; t < e; ++t) {
          bool const v = live(t);
          T const a = adv[t];
          bool const pos = a > T(0);
          bool const neg = a < T(0);
          T scale = w[t];
          if (has_isw) scale *= in.rollout_is_weights[static_cast<std::size_t>(t)];
          T const loss_t = -a * select(pos, sp, select(neg, sn, T(0)));
          T const grad_t = -a * select(pos, gp, select(neg, gn, T(0)));
          res.loss += select(v, static_cast<double>(scale) * static_cast<double>(loss_t), 0.0);
          dsum += select(v, scale * grad_t, T(0));
          npos += (v & pos) ? 1 : 0;
          nneg += (v & neg) ? 1 : 0;
        }
        double const sd = static_cast<double>(s);
        double const nd = static_cast<double>(n);
        m.tokens += nd;
        m.clipped_high += clip_hi ? static_cast<double>(npos) : 0.0;
        m.clipped_low += clip_lo ? static_cast<double>(nneg) : 0.0;
        m.log_ratio_clamped += clamped ? nd : 0.0;
        m.neg_log_ratio_sum += nlr;
        m.neg_log_ratio_raw_sum += nlr;
        m.ratio_sum += nd * sd;
        m.ratio_sq_sum += nd * sd * sd;
        m.ratio_min = std::min(m.ratio_min, sd);
        m.ratio_max = std::max(m.ratio_max, sd);
        T const g = clamped ? T(0) : dsum * s / static_cast<T>(n);
        for (index_t t = b; t < e; ++t)
          dlogp[static_cast<std::size_t>(t)] = select(live(t), g, T(0));
      }
      break;
    }
  }
  return res;
}
}  // namespace detail

//! Computes the loss sum_t w_t * isw_t * loss_t and writes dlogp_t = w_t * isw_t * d loss_t / d l_t
//! (exactly 0 on masked tokens, whose inputs are never read, so NaN padding cannot leak).
//! Because w carries the global normalisation, the loss and gradient of a micro-batch or shard
//! are plain partial sums of the whole mini-batch's. GSPO needs whole rows in one call.
template <class T, class M, MutableFlatArray DR>
policy_loss_result policy_loss(policy_loss_config const& cfg, token_layout const& layout,
                               policy_inputs<T, M> const& in, DR&& dlogp) {
  return detail::policy_loss_impl(cfg, layout, in, as_flat(dlogp, "dlogp"));
}

}  // namespace weft::rl
