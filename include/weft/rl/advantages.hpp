// weft/rl/advantages.hpp — advantage estimators (no gradients flow through them): GRPO group
// normalisation with and without std (Dr. GRPO), RLOO, OPO, REINFORCE++ and its baseline form,
// ReMax, GAE with returns, and masked whitening. Groups come from group ids or a fixed size.
#pragma once

#include <weft/core/config.hpp>
#include <weft/core/error.hpp>
#include <weft/rl/token_layout.hpp>

#include <cuda/std/cmath>

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
      WEFT_EXPECTS_SHAPE(n % size_ == 0, "scores",
                         ::weft::detail::concat("a multiple of group size ", size_, " items"), n);
      for (index_t i = 0; i < n; ++i) out[static_cast<std::size_t>(i)] = i / size_;
      groups = n / size_;
      return out;
    }
    WEFT_EXPECTS_SHAPE(static_cast<index_t>(ids_.size()) == n, "group_ids", n, ids_.size());
    std::unordered_map<std::int64_t, index_t> dense;
    for (index_t i = 0; i < n; ++i) {
      auto const [it, inserted] =
          dense.try_emplace(ids_[static_cast<std::size_t>(i)], static_cast<index_t>(dense.size()));
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

//! A group's mean and unbiased std from its sums (the CPU statistics and the CUDA kernels).
struct group_moments_fn {
  //! Σr / count.
  WEFT_HD double mean(double sum, index_t count) const noexcept {
    return sum / static_cast<double>(count);
  }
  //! sqrt(Σ(r − mean)² / (count − 1)), 0 for fewer than two responses.
  WEFT_HD double stddev(double sum_sq_dev, index_t count) const noexcept {
    return count > 1 ? ::cuda::std::sqrt(sum_sq_dev / static_cast<double>(count - 1)) : 0.0;
  }
};

//! GRPO's advantage of one response from its group's statistics (see grpo_advantages).
struct grpo_element_fn {
  bool norm_by_std;
  double eps;
  singleton_group singleton;
  WEFT_HD double operator()(double r, double mean, double stddev, index_t count,
                            bool constant) const noexcept {
    double a = 0;
    if (count == 1) {
      a = singleton == singleton_group::zero ? 0.0 : (norm_by_std ? r / (1.0 + eps) : r);
    } else if (!constant) {
      a = r - mean;
      if (norm_by_std) a /= stddev + eps;
    }
    return a;
  }
};

//! RLOO's advantage of one response from its group's statistics (see rloo_advantages).
struct rloo_element_fn {
  singleton_group singleton;
  WEFT_HD double operator()(double r, double mean, index_t count, bool constant) const noexcept {
    double const n = static_cast<double>(count);
    return count == 1 ? (singleton == singleton_group::zero ? 0.0 : r)
           : constant ? 0.0
                      : n / (n - 1) * (r - mean);
  }
};

struct group_stats {
  std::vector<double> mean, std;  // std: unbiased (Bessel), 0 for singletons
  std::vector<index_t> count;
  std::vector<index_t> group_of;
  std::vector<char> constant;  // every score of the group is equal (zero variance, exactly)
};

template <class T>
[[nodiscard]] group_stats compute_group_stats(std::span<T const> scores,
                                              group_layout const& groups) {
  group_stats s;
  index_t g = 0;
  s.group_of = groups.assign(static_cast<index_t>(scores.size()), g);
  s.mean.assign(static_cast<std::size_t>(g), 0.0);
  s.std.assign(static_cast<std::size_t>(g), 0.0);
  s.count.assign(static_cast<std::size_t>(g), 0);
  s.constant.assign(static_cast<std::size_t>(g), 1);
  std::vector<double> first(static_cast<std::size_t>(g), 0.0);
  for (std::size_t i = 0; i < scores.size(); ++i) {
    auto const k = static_cast<std::size_t>(s.group_of[i]);
    double const r = static_cast<double>(scores[i]);
    if (s.count[k] == 0)
      first[k] = r;
    else if (!(r == first[k]))
      s.constant[k] = 0;  // NaN scores are never constant
    s.mean[k] += r;
    s.count[k] += 1;
  }
  group_moments_fn const mom{};
  for (std::size_t k = 0; k < s.mean.size(); ++k) s.mean[k] = mom.mean(s.mean[k], s.count[k]);
  for (std::size_t i = 0; i < scores.size(); ++i) {
    auto const k = static_cast<std::size_t>(s.group_of[i]);
    double const d = static_cast<double>(scores[i]) - s.mean[k];
    s.std[k] += d * d;
  }
  for (std::size_t k = 0; k < s.std.size(); ++k) s.std[k] = mom.stddev(s.std[k], s.count[k]);
  return s;
}

struct grpo_options {
  bool norm_by_std = true;  // false: Dr. GRPO (A = R - mean)
  double eps = 1e-6;        // verl 1e-6, TRL 1e-4, OpenRLHF 1e-9
  singleton_group singleton = singleton_group::zero;
};

namespace detail {
template <class T>
void grpo_advantages_impl(std::span<T const> scores, group_layout const& groups, std::span<T> out,
                          grpo_options const& opt = {}) {
  WEFT_EXPECTS_SHAPE(out.size() == scores.size(), "out", scores.size(), out.size());
  WEFT_EXPECTS(opt.eps >= 0, "eps", ">= 0", opt.eps);
  auto const s = compute_group_stats(scores, groups);
  grpo_element_fn const fn{opt.norm_by_std, opt.eps, opt.singleton};
  for (std::size_t i = 0; i < scores.size(); ++i) {
    auto const k = static_cast<std::size_t>(s.group_of[i]);
    out[i] = static_cast<T>(
        fn(static_cast<double>(scores[i]), s.mean[k], s.std[k], s.count[k], s.constant[k] != 0));
  }
}
}  // namespace detail

//! GRPO: A_i = (R_i - mean_g) / (std_g + eps) with the unbiased std (torch.std); a zero-variance
//! group (all scores equal) gives exactly 0 whatever eps, 0 included (the rounded mean of equal
//! scores need not equal them, so R - mean is not tested but skipped). With norm_by_std = false,
//! Dr. GRPO's A_i = R_i - mean_g.
template <FlatArray SR, MutableFlatArray OR>
void grpo_advantages(SR&& scores, group_layout const& groups, OR&& out,
                     grpo_options const& opt = {}) {
  detail::grpo_advantages_impl(as_flat_const(scores, "scores"), groups, as_flat(out, "out"), opt);
}

namespace detail {
template <class T>
void dr_grpo_advantages_impl(std::span<T const> scores, group_layout const& groups,
                             std::span<T> out, singleton_group singleton = singleton_group::zero) {
  grpo_advantages(scores, groups, out, grpo_options{false, 0.0, singleton});
}
}  // namespace detail

//! Dr. GRPO (arXiv 2503.20783): A_i = R_i - mean_g.
template <FlatArray SR, MutableFlatArray OR>
void dr_grpo_advantages(SR&& scores, group_layout const& groups, OR&& out,
                        singleton_group singleton = singleton_group::zero) {
  detail::dr_grpo_advantages_impl(as_flat_const(scores, "scores"), groups, as_flat(out, "out"),
                                  singleton);
}

namespace detail {
template <class T>
void rloo_advantages_impl(std::span<T const> scores, group_layout const& groups, std::span<T> out,
                          singleton_group singleton = singleton_group::zero) {
  WEFT_EXPECTS_SHAPE(out.size() == scores.size(), "out", scores.size(), out.size());
  auto const s = compute_group_stats(scores, groups);
  rloo_element_fn const fn{singleton};
  for (std::size_t i = 0; i < scores.size(); ++i) {
    auto const k = static_cast<std::size_t>(s.group_of[i]);
    out[i] = static_cast<T>(
        fn(static_cast<double>(scores[i]), s.mean[k], s.count[k], s.constant[k] != 0));
  }
}
}  // namespace detail

//! RLOO: A_i = R_i - mean_{j != i} R_j = n/(n-1) (R_i - mean_g).
template <FlatArray SR, MutableFlatArray OR>
void rloo_advantages(SR&& scores, group_layout const& groups, OR&& out,
                     singleton_group singleton = singleton_group::zero) {
  detail::rloo_advantages_impl(as_flat_const(scores, "scores"), groups, as_flat(out, "out"),
                               singleton);
}

namespace detail {
template <class T, class L>
void opo_advantages_impl(std::span<T const> scores, std::span<L const> lengths,
                         group_layout const& groups, std::span<T> out,
                         singleton_group singleton = singleton_group::zero) {
  WEFT_EXPECTS_SHAPE(out.size() == scores.size(), "out", scores.size(), out.size());
  WEFT_EXPECTS_SHAPE(lengths.size() == scores.size(), "lengths", scores.size(), lengths.size());
  index_t g = 0;
  auto const group_of = groups.assign(static_cast<index_t>(scores.size()), g);
  std::vector<double> num(static_cast<std::size_t>(g), 0.0), den(static_cast<std::size_t>(g), 0.0);
  std::vector<index_t> count(static_cast<std::size_t>(g), 0);
  for (std::size_t i = 0; i < scores.size(); ++i) {
    auto const k = static_cast<std::size_t>(group_of[i]);
    num[k] += static_cast<double>(lengths[i]) * static_cast<double>(scores[i]);
    den[k] += static_cast<double>(lengths[i]);
    count[k] += 1;
  }
  for (std::size_t i = 0; i < scores.size(); ++i) {
    auto const k = static_cast<std::size_t>(group_of[i]);
    double const r = static_cast<double>(scores[i]);
    if (count[k] == 1) {
      out[i] = static_cast<T>(singleton == singleton_group::zero ? 0.0 : r);
      continue;
    }
    double const b = den[k] > 0 ? num[k] / den[k] : 0.0;
    out[i] = static_cast<T>(r - b);
  }
}
}  // namespace detail

//! OPO (arXiv 2505.23585): length-weighted baseline b_g = sum L_i R_i / sum L_i, A_i = R_i - b_g.
//! A singleton group follows `singleton` like the other estimators: zero (its own baseline) or
//! keep_score (verl: baseline 0, A = R).
template <FlatArray SR, FlatArray LR, MutableFlatArray OR>
void opo_advantages(SR&& scores, LR&& lengths, group_layout const& groups, OR&& out,
                    singleton_group singleton = singleton_group::zero) {
  detail::opo_advantages_impl(as_flat_const(scores, "scores"), as_flat_const(lengths, "lengths"),
                              groups, as_flat(out, "out"), singleton);
}

namespace detail {
template <class T, class M>
void sequence_scores_impl(token_layout const& layout, std::span<T const> token_rewards,
                          std::span<M const> mask, std::span<T> out) {
  detail::expect_tokens(token_rewards, layout, "token_rewards");
  detail::expect_tokens(mask, layout, "mask");
  detail::expect_rows(out, layout, "out");
  for (index_t i = 0; i < layout.rows(); ++i) {
    double s = 0;
    for (index_t t = layout.row_begin(i); t < layout.row_end(i); ++t)
      if (detail::valid(mask[static_cast<std::size_t>(t)]))
        s += static_cast<double>(token_rewards[static_cast<std::size_t>(t)]);
    out[static_cast<std::size_t>(i)] = static_cast<T>(s);
  }
}
}  // namespace detail

//! R_i = sum of the row's valid token rewards (the outcome reward sits on its last valid token).
template <FlatArray RR, FlatArray MR, MutableFlatArray OR>
void sequence_scores(token_layout const& layout, RR&& token_rewards, MR&& mask, OR&& out) {
  detail::sequence_scores_impl(layout, as_flat_const(token_rewards, "token_rewards"),
                               as_flat_const(mask, "mask"), as_flat(out, "out"));
}

namespace detail {
template <class T, class M>
void broadcast_to_tokens_impl(token_layout const& layout, std::span<T const> row_values,
                              std::span<M const> mask, std::span<T> out) {
  detail::expect_rows(row_values, layout, "row_values");
  detail::expect_tokens(mask, layout, "mask");
  detail::expect_tokens(out, layout, "out");
  for (index_t i = 0; i < layout.rows(); ++i)
    for (index_t t = layout.row_begin(i); t < layout.row_end(i); ++t) {
      auto const k = static_cast<std::size_t>(t);
      out[k] = detail::valid(mask[k]) ? row_values[static_cast<std::size_t>(i)] : T(0);
    }
}
}  // namespace detail

//! out_t = row_values_i * m_t: a per-sequence advantage on every valid token, 0 elsewhere.
template <FlatArray RR, FlatArray MR, MutableFlatArray OR>
void broadcast_to_tokens(token_layout const& layout, RR&& row_values, MR&& mask, OR&& out) {
  detail::broadcast_to_tokens_impl(layout, as_flat_const(row_values, "row_values"),
                                   as_flat_const(mask, "mask"), as_flat(out, "out"));
}

//! Sums over valid tokens for whitening; they add across micro-batches and ranks, so a
//! data-parallel caller all-reduces {count, sum, sum_sq} and passes the total to masked_whiten.
struct whiten_stats {
  double count = 0;
  double sum = 0;
  double sum_sq = 0;
  [[nodiscard]] WEFT_HD double mean() const noexcept { return count > 0 ? sum / count : 0.0; }
  //! Unbiased (Bessel) variance; 0 with fewer than two valid tokens.
  [[nodiscard]] WEFT_HD double variance() const noexcept {
    if (count < 2) return 0.0;
    double const v = (sum_sq - sum * sum / count) / (count - 1);
    return v > 0 ? v : 0.0;
  }
};

namespace detail {
template <class T, class M>
[[nodiscard]] whiten_stats whiten_statistics_impl(std::span<T const> values,
                                                  std::span<M const> mask) {
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
}  // namespace detail

template <FlatArray VR, FlatArray MR>
[[nodiscard]] whiten_stats whiten_statistics(VR&& values, MR&& mask) {
  return detail::whiten_statistics_impl(as_flat_const(values, "values"),
                                        as_flat_const(mask, "mask"));
}

namespace detail {
//! The whitening of one token (the CPU loop and the CUDA kernel): (v − mean)·inv, plus the mean
//! again without shift_mean, and 0 where masked. inv = 1 / sqrt(variance + eps).
struct whiten_fn {
  double mean, inv;
  bool shift_mean;
  WEFT_HD whiten_fn(whiten_stats const& s, bool shift, double eps) noexcept
      : mean(s.mean()), inv(1.0 / ::cuda::std::sqrt(s.variance() + eps)), shift_mean(shift) {}
  template <class T>
  WEFT_HD T operator()(T value, bool valid) const noexcept {
    double const v = (static_cast<double>(value) - mean) * inv + (shift_mean ? 0.0 : mean);
    return valid ? static_cast<T>(v) : T(0);
  }
};

//! The raw Σv² of the two-pass statistics: the centred Σ(v − mean)² re-expressed as
//! whiten_stats::variance reads it.
WEFT_HD inline double raw_sum_sq(double centred, double sum, double count) noexcept {
  return centred + sum * sum / (count > 0 ? count : 1.0);
}

template <class T, class M>
void masked_whiten_impl(std::span<T const> values, std::span<M const> mask, std::span<T> out,
                        whiten_stats const& stats, bool shift_mean = true, double eps = 1e-8) {
  WEFT_EXPECTS_SHAPE(out.size() == values.size(), "out", values.size(), out.size());
  WEFT_EXPECTS_SHAPE(mask.size() == values.size(), "mask", values.size(), mask.size());
  whiten_fn const fn(stats, shift_mean, eps);
  for (std::size_t k = 0; k < values.size(); ++k) out[k] = fn(values[k], detail::valid(mask[k]));
}
}  // namespace detail

//! masked_whiten with statistics supplied by the caller (e.g. all-reduced over ranks).
template <FlatArray VR, FlatArray MR, MutableFlatArray OR>
void masked_whiten(VR&& values, MR&& mask, OR&& out, whiten_stats const& stats,
                   bool shift_mean = true, double eps = 1e-8) {
  detail::masked_whiten_impl(as_flat_const(values, "values"), as_flat_const(mask, "mask"),
                             as_flat(out, "out"), stats, shift_mean, eps);
}

namespace detail {
template <class T, class M>
void masked_whiten_own_impl(std::span<T const> values, std::span<M const> mask, std::span<T> out,
                            bool shift_mean = true, double eps = 1e-8) {
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
  s.sum_sq = raw_sum_sq(ss, s.sum, s.count);
  masked_whiten(values, mask, out, s, shift_mean, eps);
}
}  // namespace detail

//! verl's masked_whiten: (v - mean) / sqrt(var + 1e-8) over valid tokens with the unbiased
//! variance (fewer than 2 valid tokens: variance 0), then multiplied by the mask, so masked tokens
//! are exactly 0 (the RF++-baseline bug fixed in verl PR #1527). shift_mean = false adds the mean
//! back. In place is allowed (out may alias values). Two passes, so the variance is exact-ish.
template <FlatArray VR, FlatArray MR, MutableFlatArray OR>
void masked_whiten(VR&& values, MR&& mask, OR&& out, bool shift_mean = true, double eps = 1e-8) {
  detail::masked_whiten_own_impl(as_flat_const(values, "values"), as_flat_const(mask, "mask"),
                                 as_flat(out, "out"), shift_mean, eps);
}

namespace detail {
// The per-row recurrences over tokens [begin, end), last token first: the CPU loops run them row
// after row (the CUDA kernels run their scan form below).

//! discounted_returns of one row.
template <class T, class M>
WEFT_HD void discounted_returns_row(index_t begin, index_t end, T const* token_rewards,
                                    M const* mask, double gamma, T* out) noexcept {
  double run = 0;
  for (index_t t = end; t-- > begin;) {
    run = static_cast<double>(token_rewards[t]) + gamma * run;
    out[t] = static_cast<T>(run);
    run *= valid(mask[t]) ? 1.0 : 0.0;
  }
}

//! remax_advantages of one row with greedy baseline b.
template <class T, class M>
WEFT_HD void remax_row(index_t begin, index_t end, T const* token_rewards, double b, M const* mask,
                       T* advantages, T* returns) noexcept {
  double run = 0;
  for (index_t t = end; t-- > begin;) {
    bool const v = valid(mask[t]);
    run += v ? static_cast<double>(token_rewards[t]) : 0.0;
    returns[t] = v ? static_cast<T>(run) : T(0);
    advantages[t] = v ? static_cast<T>(run - b) : T(0);
  }
}

//! gae_advantages of one row, before whitening.
template <class T, class M>
WEFT_HD void gae_row(index_t begin, index_t end, T const* token_rewards, T const* values,
                     M const* mask, double gamma, double lambda, T* advantages,
                     T* returns) noexcept {
  double next_value = 0, last = 0;
  for (index_t t = end; t-- > begin;) {
    if (!valid(mask[t])) {
      advantages[t] = T(0);
      returns[t] = T(0);
      continue;
    }
    double const v = static_cast<double>(values[t]);
    double const delta = static_cast<double>(token_rewards[t]) + gamma * next_value - v;
    last = delta + gamma * lambda * last;
    next_value = v;
    advantages[t] = static_cast<T>(last);
    returns[t] = static_cast<T>(last + v);
  }
}

// The same recurrences as reverse scans, the form rl/cuda/returns.cuh runs a row in parallel
// with (a block per row, tiles from the row's end, each tile one block-wide scan). A row's state
// moves right to left by x -> a·x + b (affine_map); composing the maps of later tokens first is
// associative, so any grouping of a row's tokens gives the sequential state up to rounding (and
// the sequential grouping gives it bit for bit: the same products and sums in the same order).
// The scan's elements and outputs below are the row functions' arithmetic; the CPU loops above
// stay the reference and tests/rl/advantages.test.cpp checks this form against them.

//! x -> a·x + b: the state of a right-to-left recurrence before a token (the later tokens' state
//! x) mapped to its state after it. {1, 0} is the identity.
struct affine_map {
  double a = 1.0;
  double b = 0.0;
};

//! The later tokens' map, then this token's: a reverse scan's operator (associative).
struct affine_then {
  WEFT_HD affine_map operator()(affine_map const& later, affine_map const& here) const noexcept {
    return {here.a * later.a, here.a * later.b + here.b};
  }
};

//! The value of the nearest valid token (valid = 0: none yet); {0, 0} is the identity.
struct nearest_valid {
  int valid = 0;
  double value = 0.0;
};

//! The later tokens' nearest valid value, unless this token is valid: a reverse scan's operator.
struct nearer_valid {
  WEFT_HD nearest_valid operator()(nearest_valid const& later,
                                   nearest_valid const& here) const noexcept {
    return here.valid != 0 ? here : later;
  }
};

//! discounted_returns_row as a reverse scan: the state after token t is s_t = m_t·G_t (the
//! running return, reset after a masked token), G_t = r_t + γ·s_{t+1} is written at every token.
template <class T, class M>
struct discounted_scan {
  T const* token_rewards;
  M const* mask;
  double gamma;
  T* out;
  //! A masked token's state is 0·G_t = 0·s_{t+1} + 0·r_t: NaN when either is not finite, as
  //! the loop's `run *= 0` (so a non-finite masked reward reaches the earlier tokens in both).
  WEFT_HD affine_map element(index_t t) const noexcept {
    double const r = static_cast<double>(token_rewards[t]);
    return valid(mask[t]) ? affine_map{gamma, r} : affine_map{0.0, 0.0 * r};
  }
  //! `later`: s_{t+1} (the exclusive scan's state).
  WEFT_HD void write(index_t t, double later) const noexcept {
    out[t] = static_cast<T>(static_cast<double>(token_rewards[t]) + gamma * later);
  }
};

//! remax_row as a reverse scan: the state after token t is Σ_{s >= t} r_s·m_s.
template <class T, class M>
struct remax_scan {
  T const* token_rewards;
  M const* mask;
  T* advantages;
  T* returns;
  WEFT_HD affine_map element(index_t t) const noexcept {
    return {1.0, valid(mask[t]) ? static_cast<double>(token_rewards[t]) : 0.0};
  }
  //! `run`: the state after t (the inclusive scan's); `b` the row's baseline.
  WEFT_HD void write(index_t t, double run, double b) const noexcept {
    bool const v = valid(mask[t]);
    returns[t] = v ? static_cast<T>(run) : T(0);
    advantages[t] = v ? static_cast<T>(run - b) : T(0);
  }
};

//! gae_row as two reverse scans: V_next of token t is the value of the nearest valid token after
//! it (0 if none: the exclusive nearer_valid scan), then A_t = δ_t + γλ·A_{t+1} over the valid
//! tokens (masked ones are the identity; the inclusive affine scan).
template <class T, class M>
struct gae_scan {
  T const* token_rewards;
  T const* values;
  M const* mask;
  double gamma;
  double lambda;
  T* advantages;
  T* returns;
  WEFT_HD nearest_valid value_element(index_t t) const noexcept {
    bool const v = valid(mask[t]);
    return {v ? 1 : 0, v ? static_cast<double>(values[t]) : 0.0};  // masked values are not read
  }
  //! `next`: the exclusive nearer_valid scan's state at t (V_next where next.valid, else 0).
  WEFT_HD affine_map element(index_t t, nearest_valid next) const noexcept {
    if (!valid(mask[t])) return {};
    double const next_value = next.valid != 0 ? next.value : 0.0;
    double const v = static_cast<double>(values[t]);
    double const delta = static_cast<double>(token_rewards[t]) + gamma * next_value - v;
    return {gamma * lambda, delta};
  }
  //! `last`: A_t, the inclusive scan's state.
  WEFT_HD void write(index_t t, double last) const noexcept {
    if (!valid(mask[t])) {
      advantages[t] = T(0);
      returns[t] = T(0);
      return;
    }
    double const v = static_cast<double>(values[t]);  // before the stores: advantages may alias it
    advantages[t] = static_cast<T>(last);
    returns[t] = static_cast<T>(last + v);
  }
};

template <class T, class M>
void discounted_returns_impl(token_layout const& layout, std::span<T const> token_rewards,
                             std::span<M const> mask, double gamma, std::span<T> out) {
  detail::expect_tokens(token_rewards, layout, "token_rewards");
  detail::expect_tokens(mask, layout, "mask");
  detail::expect_tokens(out, layout, "out");
  for (index_t i = 0; i < layout.rows(); ++i)
    discounted_returns_row(layout.row_begin(i), layout.row_end(i), token_rewards.data(),
                           mask.data(), gamma, out.data());
}
}  // namespace detail

//! REINFORCE++ returns G_t = r_t + gamma G_{t+1} per row, where the running return is reset
//! (multiplied by m_t) after each token, so a masked tail does not leak into earlier tokens.
template <FlatArray RR, FlatArray MR, MutableFlatArray OR>
void discounted_returns(token_layout const& layout, RR&& token_rewards, MR&& mask, double gamma,
                        OR&& out) {
  detail::discounted_returns_impl(layout, as_flat_const(token_rewards, "token_rewards"),
                                  as_flat_const(mask, "mask"), gamma, as_flat(out, "out"));
}

namespace detail {
template <class T, class M>
void reinforce_pp_advantages_impl(token_layout const& layout, std::span<T const> token_rewards,
                                  std::span<M const> mask, double gamma, std::span<T> out) {
  discounted_returns(layout, token_rewards, mask, gamma, out);
  masked_whiten(std::span<T const>(out.data(), out.size()), mask, out);
}
}  // namespace detail

//! REINFORCE++ (arXiv 2501.03262): whiten(discounted returns) over the batch's valid tokens.
template <FlatArray RR, FlatArray MR, MutableFlatArray OR>
void reinforce_pp_advantages(token_layout const& layout, RR&& token_rewards, MR&& mask,
                             double gamma, OR&& out) {
  detail::reinforce_pp_advantages_impl(layout, as_flat_const(token_rewards, "token_rewards"),
                                       as_flat_const(mask, "mask"), gamma, as_flat(out, "out"));
}

namespace detail {
template <class T, class M>
void reinforce_pp_baseline_advantages_impl(token_layout const& layout, std::span<T const> scores,
                                           group_layout const& groups, std::span<M const> mask,
                                           std::span<T> out,
                                           singleton_group singleton = singleton_group::zero) {
  detail::expect_rows(scores, layout, "scores");
  std::vector<T> centred(scores.size());
  dr_grpo_advantages(scores, groups, std::span<T>(centred), singleton);
  broadcast_to_tokens(layout, std::span<T const>(centred), mask, out);
  masked_whiten(std::span<T const>(out.data(), out.size()), mask, out);
}
}  // namespace detail

//! REINFORCE++ with baseline: (R_i - mean_g) on every valid token, whitened over the batch, masked.
//! A singleton group gives 0 before whitening by default, R with keep_score (verl).
template <FlatArray SR, FlatArray MR, MutableFlatArray OR>
void reinforce_pp_baseline_advantages(token_layout const& layout, SR&& scores,
                                      group_layout const& groups, MR&& mask, OR&& out,
                                      singleton_group singleton = singleton_group::zero) {
  detail::reinforce_pp_baseline_advantages_impl(layout, as_flat_const(scores, "scores"), groups,
                                                as_flat_const(mask, "mask"), as_flat(out, "out"),
                                                singleton);
}

namespace detail {
template <class T, class M>
void remax_advantages_impl(token_layout const& layout, std::span<T const> token_rewards,
                           std::span<T const> baselines, std::span<M const> mask,
                           std::span<T> advantages, std::span<T> returns) {
  detail::expect_tokens(token_rewards, layout, "token_rewards");
  detail::expect_rows(baselines, layout, "baselines");
  detail::expect_tokens(mask, layout, "mask");
  detail::expect_tokens(advantages, layout, "advantages");
  detail::expect_tokens(returns, layout, "returns");
  for (index_t i = 0; i < layout.rows(); ++i)
    remax_row(layout.row_begin(i), layout.row_end(i), token_rewards.data(),
              static_cast<double>(baselines[static_cast<std::size_t>(i)]), mask.data(),
              advantages.data(), returns.data());
}
}  // namespace detail

//! ReMax (arXiv 2310.10505): returns_t = sum_{s >= t} r_s m_s, A_t = (returns_t - b_i) m_t with b_i
//! the reward of the greedy rollout of row i.
template <FlatArray RR, FlatArray BR, FlatArray MR, MutableFlatArray AR, MutableFlatArray OR>
void remax_advantages(token_layout const& layout, RR&& token_rewards, BR&& baselines, MR&& mask,
                      AR&& advantages, OR&& returns) {
  detail::remax_advantages_impl(layout, as_flat_const(token_rewards, "token_rewards"),
                                as_flat_const(baselines, "baselines"), as_flat_const(mask, "mask"),
                                as_flat(advantages, "advantages"), as_flat(returns, "returns"));
}

struct gae_options {
  double gamma = 1.0;
  double lambda = 1.0;
  bool whiten = true;
};

namespace detail {
template <class T, class M>
void gae_advantages_impl(token_layout const& layout, std::span<T const> token_rewards,
                         std::span<T const> values, std::span<M const> mask,
                         std::span<T> advantages, std::span<T> returns,
                         gae_options const& opt = {}) {
  detail::expect_tokens(token_rewards, layout, "token_rewards");
  detail::expect_tokens(values, layout, "values");
  detail::expect_tokens(mask, layout, "mask");
  detail::expect_tokens(advantages, layout, "advantages");
  detail::expect_tokens(returns, layout, "returns");
  for (index_t i = 0; i < layout.rows(); ++i)
    gae_row(layout.row_begin(i), layout.row_end(i), token_rewards.data(), values.data(),
            mask.data(), opt.gamma, opt.lambda, advantages.data(), returns.data());
  if (opt.whiten)
    masked_whiten(std::span<T const>(advantages.data(), advantages.size()), mask, advantages);
}
}  // namespace detail

//! GAE: delta_t = r_t + gamma V_next - V_t, A_t = delta_t + gamma lambda A_next, returns = A + V,
//! where "next" skips masked (observation) tokens (verl PR #2337, multi-turn). Advantages are
//! then whitened over valid tokens (options.whiten). Masked positions of both outputs are 0, so
//! values at masked positions never affect any output.
template <FlatArray RR, FlatArray VR, FlatArray MR, MutableFlatArray AR, MutableFlatArray OR>
void gae_advantages(token_layout const& layout, RR&& token_rewards, VR&& values, MR&& mask,
                    AR&& advantages, OR&& returns, gae_options const& opt = {}) {
  detail::gae_advantages_impl(layout, as_flat_const(token_rewards, "token_rewards"),
                              as_flat_const(values, "values"), as_flat_const(mask, "mask"),
                              as_flat(advantages, "advantages"), as_flat(returns, "returns"), opt);
}

}  // namespace weft::rl
