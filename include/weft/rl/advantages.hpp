// weft/rl/advantages.hpp — advantage estimators (no gradients flow through them): GRPO group
// normalisation with and without std (Dr. GRPO), RLOO, OPO, REINFORCE++ and its baseline form,
// ReMax, GAE with returns, and masked whitening. Groups come from group ids or a fixed size.
#pragma once

#include <weft/core/config.hpp>
#include <weft/core/error.hpp>
#include <weft/rl/layout.hpp>

#include <cmath>
#include <cstdint>
#include <span>
#include <unordered_map>
#include <vector>

namespace weft::rl {

//! Which responses share a prompt. `by_id`: equal ids form a group (any order, any sizes);
//! `fixed(G)`: consecutive runs of G responses (verl's repeat-interleave layout).
class group_layout {
 public:
  static group_layout fixed(index_t group_size) {
    WEFT_EXPECTS(group_size >= 1, "group_size", ">= 1", group_size);
    group_layout g;
    g.size_ = group_size;
    return g;
  }
  static group_layout by_id(std::span<std::int64_t const> ids) {
    group_layout g;
    g.ids_ = ids;
    return g;
  }

  //! Dense group index (0..groups-1, in order of first appearance) of each of n items.
  [[nodiscard]] std::vector<index_t> assign(index_t n, index_t& groups) const {
    std::vector<index_t> out(static_cast<std::size_t>(n));
    if (size_ > 0) {
      WEFT_EXPECTS_SHAPE(n % size_ == 0, "scores", ::weft::detail::concat("a multiple of group size ", size_, " items"), n);
      for (index_t i = 0; i < n; ++i) out[static_cast<std::size_t>(i)] = i / size_;
      groups = n / size_;
      return out;
    }
    WEFT_EXPECTS_SHAPE(static_cast<index_t>(ids_.size()) == n, "group_ids", n, ids_.size());
    std::unordered_map<std::int64_t, index_t> dense;
    for (index_t i = 0; i < n; ++i) {
      auto const [it, inserted] = dense.try_emplace(ids_[static_cast<std::size_t>(i)], static_cast<index_t>(dense.size()));
      out[static_cast<std::size_t>(i)] = it->second;
    }
    groups = static_cast<index_t>(dense.size());
    return out;
  }

 private:
  index_t size_ = 0;
  std::span<std::int64_t const> ids_;
};

//! What a group of one response gets. verl's grpo gives A = R/(1+eps) (mean 0, std 1) and its
//! rloo A = R while rloo_vectorized gives 0; weft defaults to 0 (no baseline exists).
enum class singleton_group : unsigned char { zero, keep_score };

struct group_stats {
  std::vector<double> mean, std;  // std: unbiased (Bessel), 0 for singletons
  std::vector<index_t> count;
  std::vector<index_t> group_of;
};

template <class T>
[[nodiscard]] group_stats compute_group_stats(std::span<T const> scores, group_layout const& groups) {
  group_stats s;
  index_t g = 0;
  s.group_of = groups.assign(static_cast<index_t>(scores.size()), g);
  s.mean.assign(static_cast<std::size_t>(g), 0.0);
  s.std.assign(static_cast<std::size_t>(g), 0.0);
  s.count.assign(static_cast<std::size_t>(g), 0);
  for (std::size_t i = 0; i < scores.size(); ++i) {
    auto const k = static_cast<std::size_t>(s.group_of[i]);
    s.mean[k] += static_cast<double>(scores[i]);
    s.count[k] += 1;
  }
  for (std::size_t k = 0; k < s.mean.size(); ++k) s.mean[k] /= static_cast<double>(s.count[k]);
  for (std::size_t i = 0; i < scores.size(); ++i) {
    auto const k = static_cast<std::size_t>(s.group_of[i]);
    double const d = static_cast<double>(scores[i]) - s.mean[k];
    s.std[k] += d * d;
  }
  for (std::size_t k = 0; k < s.std.size(); ++k)
    s.std[k] = s.count[k] > 1 ? std::sqrt(s.std[k] / static_cast<double>(s.count[k] - 1)) : 0.0;
  return s;
}

struct grpo_options {
  bool norm_by_std = true;     // false: Dr. GRPO (A = R - mean)
  double eps = 1e-6;           // verl 1e-6, TRL 1e-4, OpenRLHF 1e-9
  singleton_group singleton = singleton_group::zero;
};

//! GRPO: A_i = (R_i - mean_g) / (std_g + eps) with the unbiased std (torch.std); a zero-variance
//! group gives exactly 0. With norm_by_std = false, Dr. GRPO's A_i = R_i - mean_g.
template <class T>
void grpo_advantages(std::span<T const> scores, group_layout const& groups, std::span<T> out,
                     grpo_options const& opt = {}) {
  WEFT_EXPECTS_SHAPE(out.size() == scores.size(), "out", scores.size(), out.size());
  WEFT_EXPECTS(opt.eps >= 0, "eps", ">= 0", opt.eps);
  auto const s = compute_group_stats(scores, groups);
  for (std::size_t i = 0; i < scores.size(); ++i) {
    auto const k = static_cast<std::size_t>(s.group_of[i]);
    double const r = static_cast<double>(scores[i]);
    double a = 0;
    if (s.count[k] == 1) {
      a = opt.singleton == singleton_group::zero ? 0.0 : (opt.norm_by_std ? r / (1.0 + opt.eps) : r);
    } else {
      a = r - s.mean[k];
      if (opt.norm_by_std) a /= s.std[k] + opt.eps;
    }
    out[i] = static_cast<T>(a);
  }
}

//! Dr. GRPO (arXiv 2503.20783): A_i = R_i - mean_g.
template <class T>
void dr_grpo_advantages(std::span<T const> scores, group_layout const& groups, std::span<T> out,
                        singleton_group singleton = singleton_group::zero) {
  grpo_advantages(scores, groups, out, grpo_options{false, 0.0, singleton});
}

//! RLOO: A_i = R_i - mean_{j != i} R_j = n/(n-1) (R_i - mean_g).
template <class T>
void rloo_advantages(std::span<T const> scores, group_layout const& groups, std::span<T> out,
                     singleton_group singleton = singleton_group::zero) {
  WEFT_EXPECTS_SHAPE(out.size() == scores.size(), "out", scores.size(), out.size());
  auto const s = compute_group_stats(scores, groups);
  for (std::size_t i = 0; i < scores.size(); ++i) {
    auto const k = static_cast<std::size_t>(s.group_of[i]);
    double const n = static_cast<double>(s.count[k]);
    double const r = static_cast<double>(scores[i]);
    out[i] = static_cast<T>(s.count[k] == 1 ? (singleton == singleton_group::zero ? 0.0 : r)
                                           : n / (n - 1) * (r - s.mean[k]));
  }
}

//! OPO (arXiv 2505.23585): length-weighted baseline b_g = sum L_i R_i / sum L_i, A_i = R_i - b_g.
template <class T, class L>
void opo_advantages(std::span<T const> scores, std::span<L const> lengths, group_layout const& groups,
                    std::span<T> out) {
  WEFT_EXPECTS_SHAPE(out.size() == scores.size(), "out", scores.size(), out.size());
  WEFT_EXPECTS_SHAPE(lengths.size() == scores.size(), "lengths", scores.size(), lengths.size());
  index_t g = 0;
  auto const group_of = groups.assign(static_cast<index_t>(scores.size()), g);
  std::vector<double> num(static_cast<std::size_t>(g), 0.0), den(static_cast<std::size_t>(g), 0.0);
  for (std::size_t i = 0; i < scores.size(); ++i) {
    auto const k = static_cast<std::size_t>(group_of[i]);
    num[k] += static_cast<double>(lengths[i]) * static_cast<double>(scores[i]);
    den[k] += static_cast<double>(lengths[i]);
  }
  for (std::size_t i = 0; i < scores.size(); ++i) {
    auto const k = static_cast<std::size_t>(group_of[i]);
    double const b = den[k] > 0 ? num[k] / den[k] : 0.0;
    out[i] = static_cast<T>(static_cast<double>(scores[i]) - b);
  }
}

//! R_i = sum of the row's valid token rewards (the outcome reward sits on its last valid token).
template <class T, class M>
void sequence_scores(token_layout const& layout, std::span<T const> token_rewards, std::span<M const> mask,
                     std::span<T> out) {
  detail::expect_tokens(token_rewards, layout, "token_rewards");
  detail::expect_tokens(mask, layout, "mask");
  detail::expect_rows(out, layout, "out");
  for (index_t i = 0; i < layout.rows(); ++i) {
    double s = 0;
    for (index_t t = layout.row_begin(i); t < layout.row_end(i); ++t)
      if (detail::valid(mask[static_cast<std::size_t>(t)])) s += static_cast<double>(token_rewards[static_cast<std::size_t>(t)]);
    out[static_cast<std::size_t>(i)] = static_cast<T>(s);
  }
}

//! out_t = row_values_i * m_t: a per-sequence advantage on every valid token, 0 elsewhere.
template <class T, class M>
void broadcast_to_tokens(token_layout const& layout, std::span<T const> row_values, std::span<M const> mask,
                         std::span<T> out) {
  detail::expect_rows(row_values, layout, "row_values");
  detail::expect_tokens(mask, layout, "mask");
  detail::expect_tokens(out, layout, "out");
  for (index_t i = 0; i < layout.rows(); ++i)
    for (index_t t = layout.row_begin(i); t < layout.row_end(i); ++t) {
      auto const k = static_cast<std::size_t>(t);
      out[k] = detail::valid(mask[k]) ? row_values[static_cast<std::size_t>(i)] : T(0);
    }
}

//! Sums over valid tokens for whitening; they add across micro-batches and ranks, so a
//! data-parallel caller all-reduces {count, sum, sum_sq} and passes the total to masked_whiten.
struct whiten_stats {
  double count = 0;
  double sum = 0;
  double sum_sq = 0;
  [[nodiscard]] double mean() const noexcept { return count > 0 ? sum / count : 0.0; }
  //! Unbiased (Bessel) variance; 0 with fewer than two valid tokens.
  [[nodiscard]] double variance() const noexcept {
    if (count < 2) return 0.0;
    double const v = (sum_sq - sum * sum / count) / (count - 1);
    return v > 0 ? v : 0.0;
  }
};

template <class T, class M>
[[nodiscard]] whiten_stats whiten_statistics(std::span<T const> values, std::span<M const> mask) {
  WEFT_EXPECTS_SHAPE(mask.size() == values.size(), "mask", values.size(), mask.size());
  whiten_stats s;
  for (std::size_t k = 0; k < values.size(); ++k)
    if (detail::valid(mask[k])) {
      double const v = static_cast<double>(values[k]);
      s.count += 1;
      s.sum += v;
      s.sum_sq += v * v;
    }
  return s;
}

//! masked_whiten with statistics supplied by the caller (e.g. all-reduced over ranks).
template <class T, class M>
void masked_whiten(std::span<T const> values, std::span<M const> mask, std::span<T> out, whiten_stats const& stats,
                   bool shift_mean = true, double eps = 1e-8) {
  WEFT_EXPECTS_SHAPE(out.size() == values.size(), "out", values.size(), out.size());
  WEFT_EXPECTS_SHAPE(mask.size() == values.size(), "mask", values.size(), mask.size());
  double const mean = stats.mean();
  double const inv = 1.0 / std::sqrt(stats.variance() + eps);
  for (std::size_t k = 0; k < values.size(); ++k) {
    double const v = (static_cast<double>(values[k]) - mean) * inv + (shift_mean ? 0.0 : mean);
    out[k] = detail::valid(mask[k]) ? static_cast<T>(v) : T(0);
  }
}

//! verl's masked_whiten: (v - mean) / sqrt(var + 1e-8) over valid tokens with the unbiased
//! variance (fewer than 2 valid tokens: variance 0), then multiplied by the mask, so masked tokens
//! are exactly 0 (the RF++-baseline bug fixed in verl PR #1527). shift_mean = false adds the mean
//! back. In place is allowed (out may alias values). Two passes, so the variance is exact-ish.
template <class T, class M>
void masked_whiten(std::span<T const> values, std::span<M const> mask, std::span<T> out, bool shift_mean = true,
                   double eps = 1e-8) {
  WEFT_EXPECTS_SHAPE(mask.size() == values.size(), "mask", values.size(), mask.size());
  whiten_stats s = whiten_statistics(values, mask);
  double const mean = s.mean();
  double ss = 0;
  for (std::size_t k = 0; k < values.size(); ++k)
    if (detail::valid(mask[k])) {
      double const d = static_cast<double>(values[k]) - mean;
      ss += d * d;
    }
  // Re-express the centred sum of squares in the raw form the other overload reads.
  s.sum_sq = ss + s.sum * s.sum / (s.count > 0 ? s.count : 1.0);
  masked_whiten(values, mask, out, s, shift_mean, eps);
}

//! REINFORCE++ returns G_t = r_t + gamma G_{t+1} per row, where the running return is reset
//! (multiplied by m_t) after each token, so a masked tail does not leak into earlier tokens.
template <class T, class M>
void discounted_returns(token_layout const& layout, std::span<T const> token_rewards, std::span<M const> mask,
                        double gamma, std::span<T> out) {
  detail::expect_tokens(token_rewards, layout, "token_rewards");
  detail::expect_tokens(mask, layout, "mask");
  detail::expect_tokens(out, layout, "out");
  for (index_t i = 0; i < layout.rows(); ++i) {
    double run = 0;
    for (index_t t = layout.row_end(i); t-- > layout.row_begin(i);) {
      auto const k = static_cast<std::size_t>(t);
      run = static_cast<double>(token_rewards[k]) + gamma * run;
      out[k] = static_cast<T>(run);
      run *= detail::valid(mask[k]) ? 1.0 : 0.0;
    }
  }
}

//! REINFORCE++ (arXiv 2501.03262): whiten(discounted returns) over the batch's valid tokens.
template <class T, class M>
void reinforce_pp_advantages(token_layout const& layout, std::span<T const> token_rewards, std::span<M const> mask,
                             double gamma, std::span<T> out) {
  discounted_returns(layout, token_rewards, mask, gamma, out);
  masked_whiten(std::span<T const>(out.data(), out.size()), mask, out);
}

//! REINFORCE++ with baseline: (R_i - mean_g) on every valid token, whitened over the batch, masked.
template <class T, class M>
void reinforce_pp_baseline_advantages(token_layout const& layout, std::span<T const> scores, group_layout const& groups,
                                      std::span<M const> mask, std::span<T> out) {
  detail::expect_rows(scores, layout, "scores");
  std::vector<T> centred(scores.size());
  dr_grpo_advantages(scores, groups, std::span<T>(centred), singleton_group::zero);
  broadcast_to_tokens(layout, std::span<T const>(centred), mask, out);
  masked_whiten(std::span<T const>(out.data(), out.size()), mask, out);
}

//! ReMax (arXiv 2310.10505): returns_t = sum_{s >= t} r_s m_s, A_t = (returns_t - b_i) m_t with b_i
//! the reward of the greedy rollout of row i.
template <class T, class M>
void remax_advantages(token_layout const& layout, std::span<T const> token_rewards, std::span<T const> baselines,
                      std::span<M const> mask, std::span<T> advantages, std::span<T> returns) {
  detail::expect_tokens(token_rewards, layout, "token_rewards");
  detail::expect_rows(baselines, layout, "baselines");
  detail::expect_tokens(mask, layout, "mask");
  detail::expect_tokens(advantages, layout, "advantages");
  detail::expect_tokens(returns, layout, "returns");
  for (index_t i = 0; i < layout.rows(); ++i) {
    double run = 0;
    for (index_t t = layout.row_end(i); t-- > layout.row_begin(i);) {
      auto const k = static_cast<std::size_t>(t);
      bool const v = detail::valid(mask[k]);
      run += v ? static_cast<double>(token_rewards[k]) : 0.0;
      returns[k] = v ? static_cast<T>(run) : T(0);
      advantages[k] = v ? static_cast<T>(run - static_cast<double>(baselines[static_cast<std::size_t>(i)])) : T(0);
    }
  }
}

struct gae_options {
  double gamma = 1.0;
  double lambda = 1.0;
  bool whiten = true;
};

//! GAE: delta_t = r_t + gamma V_next - V_t, A_t = delta_t + gamma lambda A_next, returns = A + V,
//! where "next" skips masked (observation) tokens (verl PR #2337, multi-turn). Advantages are
//! then whitened over valid tokens (options.whiten). Masked positions of both outputs are 0, so
//! values at masked positions never affect any output.
template <class T, class M>
void gae_advantages(token_layout const& layout, std::span<T const> token_rewards, std::span<T const> values,
                    std::span<M const> mask, std::span<T> advantages, std::span<T> returns, gae_options const& opt = {}) {
  detail::expect_tokens(token_rewards, layout, "token_rewards");
  detail::expect_tokens(values, layout, "values");
  detail::expect_tokens(mask, layout, "mask");
  detail::expect_tokens(advantages, layout, "advantages");
  detail::expect_tokens(returns, layout, "returns");
  for (index_t i = 0; i < layout.rows(); ++i) {
    double next_value = 0, last = 0;
    for (index_t t = layout.row_end(i); t-- > layout.row_begin(i);) {
      auto const k = static_cast<std::size_t>(t);
      if (!detail::valid(mask[k])) {
        advantages[k] = T(0);
        returns[k] = T(0);
        continue;
      }
      double const v = static_cast<double>(values[k]);
      double const delta = static_cast<double>(token_rewards[k]) + opt.gamma * next_value - v;
      last = delta + opt.gamma * opt.lambda * last;
      next_value = v;
      advantages[k] = static_cast<T>(last);
      returns[k] = static_cast<T>(last + v);
    }
  }
  if (opt.whiten) masked_whiten(std::span<T const>(advantages.data(), advantages.size()), mask, advantages);
}

}  // namespace weft::rl
