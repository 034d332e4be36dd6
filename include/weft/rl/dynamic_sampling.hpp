// weft/rl/dynamic_sampling.hpp — the DAPO recipe's pieces beyond the loss (Yu et al., "DAPO: An
// Open-Source LLM Reinforcement Learning System at Scale", arXiv 2503.14476): overlong reward
// shaping (soft punishment, Eq. 13) and overlong filtering, the dynamic-sampling batch builder that
// drops zero-variance groups and sizes the next generation request, and rl_config with its presets.
#pragma once

#include <weft/core/config.hpp>
#include <weft/core/error.hpp>
#include <weft/rl/advantages.hpp>
#include <weft/rl/aggregation.hpp>
#include <weft/rl/kl.hpp>
#include <weft/rl/token_layout.hpp>
#include <weft/rl/policy_loss.hpp>

#include <algorithm>
#include <cmath>
#include <concepts>
#include <cstdint>
#include <limits>
#include <span>
#include <unordered_map>
#include <vector>

namespace weft::rl {

//! DAPO's soft overlong punishment (Eq. 13), added to the correctness reward:
//!   0                                   if |y| <= L_max - L_cache
//!   ((L_max - L_cache) - |y|) / L_cache if L_max - L_cache < |y| <= L_max
//!   -1                                  if |y| > L_max
//! all times penalty_factor. verl's reward manager does not cap at -1 beyond L_max (its responses
//! cannot be longer); OpenRLHF caps like Eq. 13, which weft follows.
struct overlong_shaping {
  index_t max_length = 20480;
  index_t cache_length = 4096;
  double penalty_factor = 1.0;

  void validate() const {
    WEFT_EXPECTS(cache_length > 0 && cache_length <= max_length, "cache_length",
                 ::weft::detail::concat("in (0, max_length = ", max_length, "]"), cache_length);
    WEFT_EXPECTS(penalty_factor >= 0, "penalty_factor", ">= 0", penalty_factor);
  }
  [[nodiscard]] double penalty(index_t length) const {
    validate();
    index_t const expected = max_length - cache_length;
    if (length <= expected) return 0.0;
    if (length > max_length) return -penalty_factor;
    return static_cast<double>(expected - length) / static_cast<double>(cache_length) *
           penalty_factor;
  }
  //! rewards[i] += penalty(lengths[i]).
  template <FlatArray LR, MutableFlatArray RR>
  void apply(LR&& lengths_in, RR&& rewards_in) const {
    auto const lengths = as_flat_const(lengths_in, "lengths");
    auto const rewards = as_flat(rewards_in, "rewards");
    using T = flat_value_t<RR>;
    WEFT_EXPECTS_SHAPE(rewards.size() == lengths.size(), "rewards", lengths.size(), rewards.size());
    for (std::size_t i = 0; i < lengths.size(); ++i)
      rewards[i] = static_cast<T>(static_cast<double>(rewards[i]) +
                                  penalty(static_cast<index_t>(lengths[i])));
  }
};

namespace detail {
template <class B, class M>
void mask_truncated_impl(token_layout const& layout, std::span<B const> truncated,
                         std::span<M> mask) {
  detail::expect_rows(truncated, layout, "truncated");
  detail::expect_tokens(mask, layout, "mask");
  for (index_t i = 0; i < layout.rows(); ++i)
    if (truncated[static_cast<std::size_t>(i)] != B{})
      for (index_t t = layout.row_begin(i); t < layout.row_end(i); ++t)
        mask[static_cast<std::size_t>(t)] = M{};
}
}  // namespace detail

//! Overlong filtering (DAPO, arXiv 2503.14476, section 3.4; TRL `mask_truncated_completions`):
//! zeroes the loss mask of every row whose response was truncated (truncated[i] != 0), so it
//! contributes no gradient.
template <FlatArray BR, MutableFlatArray MR>
void mask_truncated(token_layout const& layout, BR&& truncated, MR&& mask) {
  detail::mask_truncated_impl(layout, as_flat_const(truncated, "truncated"), as_flat(mask, "mask"));
}

struct dynamic_sampling_options {
  index_t target_groups = 512;  // prompts (groups) per training batch
  index_t max_rounds = 10;      // generation rounds before giving up; <= 0: unlimited
  index_t first_request = 0;    // prompts to request in round 1 (0: target_groups)
  double margin = 1.1;          // over-request factor on top of the observed keep rate
  index_t max_request = 0;      // cap on one request (0: none)
};

//! One kept response: the round it came from and its index among that round's responses.
struct kept_sample {
  index_t round;
  index_t index;
  friend bool operator==(kept_sample const&, kept_sample const&) = default;
};

//! DAPO dynamic sampling (verl recipe `filter_groups`): each generation round hands in its
//! responses' group ids and filter metric (accuracy, say); groups whose metric has population
//! std 0 are dropped (they have zero advantage, hence zero gradient), singleton groups are kept,
//! and kept groups accumulate in arrival order until target_groups; the surplus of the last round
//! is dropped. Unlike verl's recipe, which regenerates a whole batch to replace a few dropped
//! groups, next_request() sizes the next round from the keep rate observed so far.
class dynamic_sampler {
 public:
  explicit dynamic_sampler(dynamic_sampling_options opt) : opt_(opt) {
    WEFT_EXPECTS(opt_.target_groups >= 1, "target_groups", ">= 1", opt_.target_groups);
    WEFT_EXPECTS(opt_.margin >= 1, "margin", ">= 1", opt_.margin);
    WEFT_EXPECTS(opt_.first_request >= 0, "first_request", ">= 0", opt_.first_request);
    WEFT_EXPECTS(opt_.max_request >= 0, "max_request", ">= 0", opt_.max_request);
  }

  //! Adds one generation round; returns how many of its groups were kept (before truncation).
  //! Throws invalid_argument_error once max_rounds rounds have not filled the batch.
  template <FlatArray GR, FlatArray MR>
  requires std::same_as<flat_value_t<GR>, std::int64_t> index_t add_round(GR&& group_ids_in,
                                                                          MR&& metric_in) {
    std::span<std::int64_t const> const group_ids = as_flat_const(group_ids_in, "group_ids");
    auto const metric = as_flat_const(metric_in, "metric");
    WEFT_EXPECTS_SHAPE(metric.size() == group_ids.size(), "metric", group_ids.size(),
                       metric.size());
    WEFT_EXPECTS(!full(), "dynamic_sampler", "not yet full (call reset() after taking the batch)",
                 "full");
    index_t groups = 0;
    auto const group_of =
        group_layout::by_id(group_ids).assign(static_cast<index_t>(group_ids.size()), groups);
    std::vector<double> lo(static_cast<std::size_t>(groups),
                           std::numeric_limits<double>::infinity());
    std::vector<double> hi(static_cast<std::size_t>(groups),
                           -std::numeric_limits<double>::infinity());
    std::vector<index_t> count(static_cast<std::size_t>(groups), 0);
    for (std::size_t i = 0; i < group_ids.size(); ++i) {
      auto const g = static_cast<std::size_t>(group_of[i]);
      double const m = static_cast<double>(metric[i]);
      lo[g] = std::min(lo[g], m);
      hi[g] = std::max(hi[g], m);
      count[g] += 1;
    }
    // Population std > 0 <=> not all equal; exact comparison, so no epsilon decides it.
    std::vector<index_t> slot(static_cast<std::size_t>(groups), -1);
    index_t kept_now = 0;
    for (index_t g = 0; g < groups; ++g) {
      auto const k = static_cast<std::size_t>(g);
      if (count[k] == 1 || hi[k] > lo[k]) {
        ++kept_now;
        if (kept_groups_ < opt_.target_groups) slot[k] = kept_groups_++;
      }
    }
    for (std::size_t i = 0; i < group_ids.size(); ++i)
      if (slot[static_cast<std::size_t>(group_of[i])] >= 0)
        selected_.push_back({rounds_, static_cast<index_t>(i)});
    ++rounds_;
    seen_groups_ += groups;
    kept_seen_ += kept_now;
    if (!full() && opt_.max_rounds > 0 && rounds_ >= opt_.max_rounds) {
      WEFT_THROW(invalid_argument_error, "weft::rl::dynamic_sampler: ", kept_groups_, " of ",
                 opt_.target_groups,
                 " groups with non-zero reward variance after max_rounds = ", opt_.max_rounds,
                 " generation rounds (the data may be too easy or too hard for the policy)");
    }
    return kept_now;
  }

  [[nodiscard]] bool full() const noexcept { return kept_groups_ >= opt_.target_groups; }
  [[nodiscard]] index_t rounds() const noexcept { return rounds_; }
  [[nodiscard]] index_t kept_groups() const noexcept { return kept_groups_; }
  [[nodiscard]] index_t seen_groups() const noexcept { return seen_groups_; }
  //! Fraction of generated groups that had non-zero variance (1 before any round).
  [[nodiscard]] double keep_rate() const noexcept {
    return seen_groups_ > 0 ? static_cast<double>(kept_seen_) / static_cast<double>(seen_groups_)
                            : 1.0;
  }
  //! Responses of the batch, group by group in arrival order: feed these to advantages and loss.
  [[nodiscard]] std::vector<kept_sample> const& selected() const noexcept { return selected_; }

  //! Prompts to request in the next round: ceil(missing / keep_rate * margin), at least the
  //! number missing, at most max_request; the first round asks for first_request (or the target).
  //! When nothing was kept yet, asks for as many as the previous requests did.
  [[nodiscard]] index_t next_request() const noexcept {
    index_t const missing = opt_.target_groups - kept_groups_;
    if (missing <= 0) return 0;
    index_t want = 0;
    if (seen_groups_ == 0) {
      want = opt_.first_request > 0 ? opt_.first_request : opt_.target_groups;
    } else if (kept_seen_ == 0) {
      want = std::max(seen_groups_ / rounds_, missing);
    } else {
      want =
          static_cast<index_t>(std::ceil(static_cast<double>(missing) / keep_rate() * opt_.margin));
    }
    want = std::max(want, missing);
    if (opt_.max_request > 0) want = std::min(want, opt_.max_request);
    return want;
  }

  void reset() noexcept {
    rounds_ = kept_groups_ = seen_groups_ = kept_seen_ = 0;
    selected_.clear();
  }

 private:
  dynamic_sampling_options opt_;
  index_t rounds_ = 0;
  index_t kept_groups_ = 0;
  index_t seen_groups_ = 0;
  index_t kept_seen_ = 0;
  std::vector<kept_sample> selected_;
};

enum class advantage_kind : unsigned char {
  grpo,
  rloo,
  opo,
  reinforce_pp,
  reinforce_pp_baseline,
  remax,
  gae
};

struct advantage_config {
  advantage_kind kind = advantage_kind::grpo;
  bool norm_by_std = true;  // grpo: false = Dr. GRPO
  double eps = 1e-6;
  double gamma = 1.0;
  double lambda = 1.0;
  singleton_group singleton = singleton_group::zero;
};

//! KL-in-loss and KL-in-reward are separate switches (verl PR #644: KL was applied in the reward
//! while the user had only disabled the KL loss).
struct kl_config {
  bool use_kl_loss = false;
  double kl_loss_coef = 0.001;
  kl_kind kl_loss_kind = kl_kind::k3;
  bool use_kl_in_reward = false;
  double kl_reward_coef = 0.001;
  kl_kind kl_reward_kind = kl_kind::k1;
};

struct dynamic_sampling_config {
  bool enable = false;
  index_t max_rounds = 10;
};

struct overlong_config {
  bool soft_punishment = false;
  index_t buffer_length = 4096;
  double penalty_factor = 1.0;
  bool filter_truncated = false;
};

//! Everything that distinguishes PPO / GRPO / DAPO / Dr. GRPO in one aggregate (like verl's
//! config). A trainer reads it; weft's functions take the pieces.
struct rl_config {
  policy_loss_config policy{};
  loss_agg aggregation = loss_agg::token_mean;
  advantage_config advantage{};
  kl_config kl{};
  double entropy_coeff = 0.0;
  double value_clip = 0.5;  // critic only (gae)
  index_t max_response_length = 1024;
  index_t group_size = 8;
  dynamic_sampling_config dynamic_sampling{};
  overlong_config overlong{};

  //! The constant length of dr_grpo_norm / verl_token_sum_norm (verl's loss_scale_factor default
  //! is the padded response length, i.e. max_response_length).
  [[nodiscard]] double norm_length() const noexcept {
    return static_cast<double>(max_response_length);
  }
  [[nodiscard]] overlong_shaping shaping() const noexcept {
    return {max_response_length, overlong.buffer_length, overlong.penalty_factor};
  }

  void validate() const {
    policy.validate();
    WEFT_EXPECTS(max_response_length >= 1, "max_response_length", ">= 1", max_response_length);
    WEFT_EXPECTS(group_size >= 1, "group_size", ">= 1", group_size);
    WEFT_EXPECTS(entropy_coeff >= 0, "entropy_coeff", ">= 0", entropy_coeff);
    if (overlong.soft_punishment) shaping().validate();
    if (dynamic_sampling.enable)
      WEFT_EXPECTS(group_size >= 2, "group_size",
                   ">= 2 with dynamic sampling (groups of one are never filtered)", group_size);
  }

  //! GRPO as in DeepSeekMath and verl's docs: symmetric clip 0.2, dual clip 3, per-sequence
  //! token mean, std-normalised group advantages, k3 KL loss 0.001.
  static rl_config grpo() {
    rl_config c;
    c.policy.clip_low = c.policy.clip_high = 0.2;
    c.policy.dual_clip = 3.0;
    c.aggregation = loss_agg::seq_mean_token_mean;
    c.kl.use_kl_loss = true;
    c.kl.kl_loss_coef = 0.001;
    c.kl.kl_loss_kind = kl_kind::k3;
    return c;
  }
  //! DAPO (arXiv 2503.14476 and verl's run_dapo_qwen2.5_32b.sh): clip-higher 0.2 / 0.28, dual
  //! clip 10, token-level loss, no KL, dynamic sampling (10 rounds), soft overlong punishment
  //! with a 4096-token cache of a 20480-token budget, G = 16.
  static rl_config dapo() {
    rl_config c;
    c.policy.clip_low = 0.2;
    c.policy.clip_high = 0.28;
    c.policy.dual_clip = 10.0;
    c.aggregation = loss_agg::token_mean;
    c.max_response_length = 20480;
    c.group_size = 16;
    c.dynamic_sampling = {true, 10};
    c.overlong = {true, 4096, 1.0, false};
    return c;
  }
  //! Dr. GRPO (arXiv 2503.20783): no std normalisation, the paper's constant-length norm
  //! m / (B L_max) (dr_grpo_norm; verl's recipe config names seq-mean-token-sum-norm, which is
  //! verl_token_sum_norm, the same up to the constant factor B), no KL.
  static rl_config dr_grpo() {
    rl_config c = grpo();
    c.kl.use_kl_loss = false;
    c.advantage.norm_by_std = false;
    c.aggregation = loss_agg::dr_grpo_norm;
    return c;
  }
  //! PPO with a critic: GAE (gamma = lambda = 1), symmetric clip 0.2, dual clip 3, token mean,
  //! clipped value loss 0.5 (verl defaults).
  static rl_config ppo() {
    rl_config c;
    c.policy.clip_low = c.policy.clip_high = 0.2;
    c.policy.dual_clip = 3.0;
    c.advantage.kind = advantage_kind::gae;
    c.group_size = 1;
    return c;
  }
};

}  // namespace weft::rl
