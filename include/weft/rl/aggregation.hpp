// weft/rl/aggregation.hpp — loss aggregation modes (token-mean, seq-mean-token-mean,
// seq-mean-token-sum, Dr. GRPO's norm and verl's seq-mean-token-sum-norm) expressed as per-token
// weights computed once per mini-batch from global counts, so any split gives the same gradient.
#pragma once

#include <weft/comm/collectives.hpp>
#include <weft/comm/concepts.hpp>
#include <weft/core/memory.hpp>
#include <weft/core/config.hpp>
#include <weft/core/error.hpp>
#include <weft/rl/token_layout.hpp>

#include <array>
#include <cmath>
#include <span>
#include <string_view>
#include <utility>

namespace weft::rl {

//! How per-token losses combine into the mini-batch loss L = sum_t w_t * loss_t.
//! - token_mean:          w = m / N              (DAPO Eq. 12; verl's default `token-mean`)
//! - seq_mean_token_mean: w = m / (B * L_i)      (original GRPO, GSPO, SAPO)
//! - seq_mean_token_sum:  w = m / B              (REINFORCE)
//! - dr_grpo_norm:        w = m / (B * L_norm)   (Dr. GRPO paper, TRL `dr_grpo`; L_norm constant)
//! - verl_token_sum_norm: w = m / L_norm         (what verl's `seq-mean-token-sum-norm` computes:
//!                                                no division by B; verl's L_norm is
//!                                                `loss_scale_factor`, by default the padded
//!                                                length)
//! N = valid tokens and B = rows with at least one valid token, both over the whole optimizer-step
//! mini-batch on every data-parallel rank; L_i = valid tokens of row i. The two constant-length
//! modes differ by the factor B, which is why neither is called seq_mean_token_sum_norm here.
enum class loss_agg : unsigned char {
  token_mean,
  seq_mean_token_mean,
  seq_mean_token_sum,
  dr_grpo_norm,
  verl_token_sum_norm,
};

constexpr std::string_view to_string(loss_agg a) noexcept {
  switch (a) {
    case loss_agg::token_mean: return "token-mean";
    case loss_agg::seq_mean_token_mean: return "seq-mean-token-mean";
    case loss_agg::seq_mean_token_sum: return "seq-mean-token-sum";
    case loss_agg::dr_grpo_norm: return "dr-grpo-norm";
    case loss_agg::verl_token_sum_norm: return "verl-token-sum-norm";
  }
  return "unknown";
}

//! The mode a verl `loss_agg_mode` string means (`seq-mean-token-sum-norm` is
//! verl_token_sum_norm, not dr_grpo_norm). Throws invalid_argument_error for other strings.
inline loss_agg loss_agg_from_verl(std::string_view verl_mode) {
  if (verl_mode == "token-mean") return loss_agg::token_mean;
  if (verl_mode == "seq-mean-token-mean") return loss_agg::seq_mean_token_mean;
  if (verl_mode == "seq-mean-token-sum") return loss_agg::seq_mean_token_sum;
  if (verl_mode == "seq-mean-token-sum-norm") return loss_agg::verl_token_sum_norm;
  WEFT_EXPECTS(false, "verl_mode",
               "token-mean, seq-mean-token-mean, seq-mean-token-sum or seq-mean-token-sum-norm",
               verl_mode);
  return loss_agg::token_mean;
}

//! Valid tokens and non-empty rows. Plain sums, so the counts of micro-batches and ranks add up.
struct batch_counts {
  double tokens = 0;
  double sequences = 0;

  batch_counts& operator+=(batch_counts const& o) noexcept {
    tokens += o.tokens;
    sequences += o.sequences;
    return *this;
  }
  friend batch_counts operator+(batch_counts a, batch_counts const& b) noexcept { return a += b; }
  friend bool operator==(batch_counts const&, batch_counts const&) = default;
};

namespace detail {
template <class M>
[[nodiscard]] batch_counts count_tokens_impl(token_layout const& layout, std::span<M const> mask) {
  detail::expect_tokens(mask, layout, "mask");
  batch_counts c;
  for (index_t i = 0; i < layout.rows(); ++i) {
    index_t n = 0;
    for (index_t t = layout.row_begin(i); t < layout.row_end(i); ++t)
      n += detail::valid(mask[static_cast<std::size_t>(t)]) ? 1 : 0;
    c.tokens += static_cast<double>(n);
    c.sequences += n > 0 ? 1.0 : 0.0;
  }
  return c;
}
}  // namespace detail

//! The counts of one batch (or micro-batch, or shard) under `mask` (nonzero = valid token).
template <FlatArray MR>
[[nodiscard]] batch_counts count_tokens(token_layout const& layout, MR&& mask) {
  return detail::count_tokens_impl(layout, as_flat_const(mask, "mask"));
}

//! Sums `local` over the ranks of a data-parallel communicator (one all_reduce of 16 bytes).
template <comm::CollectiveIn<host_space> C>
[[nodiscard]] batch_counts all_reduce_counts(C& dp, batch_counts local) {
  std::array<double, 2> in{local.tokens, local.sequences};
  std::array<double, 2> out{};
  comm::all_reduce(dp, std::as_const(in), out, comm::reduce_kind::sum).wait();
  return {out[0], out[1]};
}

namespace detail {
template <class T, class M>
void aggregation_weights_impl(loss_agg mode, token_layout const& layout, std::span<M const> mask,
                              batch_counts global, std::span<T> weights, double norm_length = 0) {
  detail::expect_tokens(mask, layout, "mask");
  detail::expect_tokens(weights, layout, "weights");
  WEFT_EXPECTS(global.tokens >= 0 && global.sequences >= 0 && std::isfinite(global.tokens) &&
                   std::isfinite(global.sequences),
               "global", "finite non-negative counts",
               ::weft::detail::concat(global.tokens, " tokens, ", global.sequences, " sequences"));
  if (mode == loss_agg::dr_grpo_norm || mode == loss_agg::verl_token_sum_norm) {
    WEFT_EXPECTS(norm_length > 0 && std::isfinite(norm_length), "norm_length",
                 ::weft::detail::concat("a positive constant length for ", to_string(mode)),
                 norm_length);
  }
  batch_counts const local = count_tokens(layout, mask);
  WEFT_EXPECTS(
      global.tokens >= local.tokens && global.sequences >= local.sequences, "global",
      ::weft::detail::concat("counts of the whole mini-batch, at least this batch's ", local.tokens,
                             " valid tokens in ", local.sequences, " non-empty rows"),
      ::weft::detail::concat(global.tokens, " tokens, ", global.sequences, " sequences"));
  for (index_t i = 0; i < layout.rows(); ++i) {
    index_t const b = layout.row_begin(i);
    index_t const e = layout.row_end(i);
    index_t n = 0;
    for (index_t t = b; t < e; ++t) n += detail::valid(mask[static_cast<std::size_t>(t)]) ? 1 : 0;
    double w = 0;
    switch (mode) {
      case loss_agg::token_mean: w = global.tokens > 0 ? 1.0 / global.tokens : 0.0; break;
      case loss_agg::seq_mean_token_mean:
        w = global.sequences > 0 && n > 0 ? 1.0 / (global.sequences * static_cast<double>(n)) : 0.0;
        break;
      case loss_agg::seq_mean_token_sum:
        w = global.sequences > 0 ? 1.0 / global.sequences : 0.0;
        break;
      case loss_agg::dr_grpo_norm:
        w = global.sequences > 0 ? 1.0 / (global.sequences * norm_length) : 0.0;
        break;
      case loss_agg::verl_token_sum_norm: w = 1.0 / norm_length; break;
    }
    for (index_t t = b; t < e; ++t) {
      auto const k = static_cast<std::size_t>(t);
      weights[k] = detail::valid(mask[k]) ? static_cast<T>(w) : T{0};
    }
  }
}
}  // namespace detail

//! Writes the per-token weights w of `mode` for this batch's tokens, given the counts of the
//! whole mini-batch (`global`, e.g. count_tokens summed over micro-batches, or all_reduce_counts).
//! Masked tokens get exactly 0. `norm_length` is the constant L_norm (required, > 0, for
//! dr_grpo_norm and verl_token_sum_norm; ignored otherwise). An empty batch (no valid tokens
//! anywhere) gives all-zero weights, so its loss is 0, not NaN. Global counts smaller than this
//! batch's own (a count of the wrong batch, or a local one passed for a global one) throw
//! invalid_argument_error before anything is written: they would zero or inflate valid weights.
template <FlatArray MR, MutableFlatArray WR>
void aggregation_weights(loss_agg mode, token_layout const& layout, MR&& mask, batch_counts global,
                         WR&& weights, double norm_length = 0) {
  detail::aggregation_weights_impl(mode, layout, as_flat_const(mask, "mask"), global,
                                   as_flat(weights, "weights"), norm_length);
}

namespace detail {
template <class T, class W>
[[nodiscard]] double weighted_sum_impl(std::span<T const> values, std::span<W const> weights) {
  WEFT_EXPECTS_SHAPE(values.size() == weights.size(), "weights", values.size(), weights.size());
  double s = 0;
  for (std::size_t k = 0; k < values.size(); ++k)
    if (weights[k] != W{0}) s += static_cast<double>(weights[k]) * static_cast<double>(values[k]);
  return s;
}
}  // namespace detail

//! sum_t w_t * values_t in double, in token order: the aggregated value of any per-token
//! quantity (entropy, KL) under weights from aggregation_weights.
template <FlatArray VR, FlatArray WR>
[[nodiscard]] double weighted_sum(VR&& values, WR&& weights) {
  return detail::weighted_sum_impl(as_flat_const(values, "values"),
                                   as_flat_const(weights, "weights"));
}

}  // namespace weft::rl
