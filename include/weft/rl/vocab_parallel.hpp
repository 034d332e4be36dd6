// weft/rl/vocab_parallel.hpp — token log-probs and entropy from logits sharded over the
// vocabulary across a communicator's ranks (each holds V/p columns): only per-token statistics
// cross ranks (a max, then sum / entropy term / target logit: 16 bytes per token in f32).
#pragma once

#include <weft/comm/collectives.hpp>
#include <weft/comm/concepts.hpp>
#include <weft/core/memory.hpp>
#include <weft/core/config.hpp>
#include <weft/core/dtype.hpp>
#include <weft/core/error.hpp>
#include <weft/rl/token_layout.hpp>
#include <weft/rl/logprobs.hpp>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <span>
#include <string>
#include <utility>
#include <vector>

namespace weft::rl {

//! Columns [begin, begin + size) of a vocabulary of `vocab` entries, held by one rank.
struct vocab_shard {
  index_t begin = 0;
  index_t size = 0;
  index_t vocab = 0;

  //! The even split of Megatron's vocabulary-parallel embedding: the first vocab % parts ranks
  //! hold one column more. A rank may hold nothing when vocab < parts.
  static vocab_shard even(index_t vocab, int parts, int rank) {
    WEFT_EXPECTS(vocab >= 1, "vocab", ">= 1", vocab);
    WEFT_EXPECTS(parts >= 1, "parts", ">= 1", parts);
    WEFT_EXPECTS(rank >= 0 && rank < parts, "rank", ::weft::detail::concat("in [0, ", parts, ")"),
                 rank);
    index_t const base = vocab / parts;
    index_t const extra = vocab % parts;
    index_t const r = rank;
    return {r * base + (r < extra ? r : extra), base + (r < extra ? 1 : 0), vocab};
  }
  //! Largest vocabulary: the forward exchanges shard bounds as two 24-bit halves, exact in f32.
  static constexpr index_t max_vocab = index_t{1} << 48;

  void validate() const {
    WEFT_EXPECTS(vocab >= 1 && vocab <= max_vocab, "shard.vocab",
                 ::weft::detail::concat("in [1, 2^48]"), vocab);
    WEFT_EXPECTS(begin >= 0 && size >= 0 && begin <= vocab && size <= vocab - begin, "shard",
                 ::weft::detail::concat("columns inside [0, ", vocab, ")"),
                 ::weft::detail::concat("begin ", begin, ", size ", size));
  }
};

namespace detail {

//! Every rank's shard, exchanged inside the forward's max all_reduce: rank r writes
//! (begin, end, vocab) as 24-bit halves into slots [6r, 6r + 6), the others -1, so the max is
//! the gathered table. 24 bytes per rank in f32.
inline constexpr std::size_t shard_slots = 6;

template <class W>
void put_shard(W* table, int rank, vocab_shard const& sh) {
  index_t const v[3] = {sh.begin, sh.begin + sh.size, sh.vocab};
  for (std::size_t j = 0; j < 3; ++j) {
    table[shard_slots * static_cast<std::size_t>(rank) + 2 * j] = static_cast<W>(v[j] >> 24);
    table[shard_slots * static_cast<std::size_t>(rank) + 2 * j + 1] =
        static_cast<W>(v[j] & 0xFFFFFF);
  }
}

//! Throws invalid_argument_error (on every rank alike: all hold the same table) unless the
//! ranks' shards agree on the vocabulary and tile [0, vocab) without gap or overlap.
template <class W>
void check_shard_tiling(W const* table, int ranks) {
  struct bounds {
    index_t begin, end, vocab;
    int rank;
  };
  std::vector<bounds> b(static_cast<std::size_t>(ranks));
  auto get = [&](int r, std::size_t j) {
    auto const at = shard_slots * static_cast<std::size_t>(r) + 2 * j;
    return (static_cast<index_t>(table[at]) << 24) + static_cast<index_t>(table[at + 1]);
  };
  std::string all;
  for (int r = 0; r < ranks; ++r) {
    b[static_cast<std::size_t>(r)] = {get(r, 0), get(r, 1), get(r, 2), r};
    all += ::weft::detail::concat(r == 0 ? "" : ", ", "rank ", r, ": [", get(r, 0), ", ", get(r, 1),
                                  ") of ", get(r, 2));
  }
  index_t const vocab = b[0].vocab;
  bool ok = true;
  for (auto const& x : b) ok = ok && x.vocab == vocab;
  std::sort(b.begin(), b.end(), [](bounds const& x, bounds const& y) {
    return x.begin != y.begin ? x.begin < y.begin : x.end < y.end;
  });
  index_t covered = 0;
  for (auto const& x : b) {
    ok = ok && x.begin == covered;  // a gap (begin > covered) or an overlap (begin < covered)
    covered = x.end;
  }
  ok = ok && covered == vocab;
  WEFT_EXPECTS(ok, "shard",
               "shards of all ranks that agree on the vocabulary and tile [0, vocab) exactly", all);
}

}  // namespace detail

namespace detail {
template <comm::CollectiveIn<host_space> C, class L, class I, class T>
void vocab_parallel_log_prob_forward_impl(C& tp, std::span<L const> local_logits,
                                          vocab_shard const& shard, std::span<I const> targets,
                                          logprob_options const& opt, std::span<T> logp,
                                          std::span<T> entropy, std::span<T> lse = {}) {
  using W = compute_t<L>;  // wire type: the compute type travels, so ranks merge exact statistics
  using CT = compute_t<L>;
  shard.validate();
  CT const inv_tau = detail::inverse_temperature<L>(opt.temperature);
  auto const n = targets.size();
  WEFT_EXPECTS_SHAPE(
      static_cast<index_t>(local_logits.size()) ==
          detail::checked_elements(n, shard.size, "local_logits"),
      "local_logits",
      ::weft::detail::concat("tokens * shard.size = ", n, " * ", shard.size, " elements"),
      local_logits.size());
  WEFT_EXPECTS_SHAPE(logp.size() == n, "logp", n, logp.size());
  WEFT_EXPECTS_SHAPE(entropy.size() == n, "entropy", n, entropy.size());
  if (!lse.empty()) WEFT_EXPECTS_SHAPE(lse.size() == n, "lse", n, lse.size());

  std::vector<softmax_stats<double>> local(n);
  auto const ranks = static_cast<std::size_t>(tp.size());
  std::vector<W> maxima(n + detail::shard_slots * ranks, W(-1)), global_max(maxima.size());
  for (std::size_t k = 0; k < n; ++k) {
    if (static_cast<std::int64_t>(targets[k]) == opt.ignore_index || shard.size == 0) {
      maxima[k] = -std::numeric_limits<W>::infinity();
      continue;
    }
    local[k] = detail::row_stats(local_logits.data() + static_cast<index_t>(k) * shard.size,
                                 shard.size, inv_tau);
    // A poisoned row (NaN or +inf logit) takes no part in the max; its NaN sum poisons the total.
    maxima[k] = local[k].sum != local[k].sum ? -std::numeric_limits<W>::infinity()
                                             : static_cast<W>(local[k].max);
  }
  detail::put_shard(maxima.data() + n, tp.rank(), shard);
  comm::all_reduce(tp, std::as_const(maxima), global_max, comm::reduce_kind::max).wait();
  detail::check_shard_tiling(global_max.data() + n, tp.size());
  // Targets are checked against the vocabulary every rank now agrees on, so all ranks throw alike.
  detail::check_targets(targets, shard.vocab, opt);
  std::vector<W> part(3 * n), total(3 * n);
  for (std::size_t k = 0; k < n; ++k) {
    auto const o = static_cast<std::int64_t>(targets[k]);
    W s = 0, t = 0, zo = 0;
    double const m = static_cast<double>(global_max[k]);
    if (o != opt.ignore_index && local[k].sum != local[k].sum) {
      s = t = std::numeric_limits<W>::quiet_NaN();
    } else if (o != opt.ignore_index && local[k].sum > 0) {
      double const d = local[k].max - m;  // <= 0 (the local max was rounded to W for the max)
      double const e = std::exp(d);
      s = static_cast<W>(e * local[k].sum);
      t = static_cast<W>(e * (local[k].ent + d * local[k].sum));
    }
    if (o != opt.ignore_index && o >= shard.begin && o < shard.begin + shard.size)
      zo = static_cast<W>(detail::load_logit<CT>(
          local_logits.data() + static_cast<index_t>(k) * shard.size, o - shard.begin, inv_tau));
    part[3 * k] = s;
    part[3 * k + 1] = t;
    part[3 * k + 2] = zo;
  }
  comm::all_reduce(tp, std::as_const(part), total, comm::reduce_kind::sum).wait();
  for (std::size_t k = 0; k < n; ++k) {
    if (static_cast<std::int64_t>(targets[k]) == opt.ignore_index) {
      logp[k] = entropy[k] = T(0);
      if (!lse.empty()) lse[k] = T(0);
      continue;
    }
    softmax_stats<double> const g{static_cast<double>(global_max[k]),
                                  static_cast<double>(total[3 * k]),
                                  static_cast<double>(total[3 * k + 1])};
    double const l = softmax_finish{}.lse(g);
    logp[k] = static_cast<T>(l > -std::numeric_limits<double>::infinity()
                                 ? static_cast<double>(total[3 * k + 2]) - l
                                 : l);
    entropy[k] = static_cast<T>(softmax_finish{}.entropy(g));
    if (!lse.empty()) lse[k] = static_cast<T>(l);
  }
}
}  // namespace detail

//! Forward over vocabulary-sharded logits: `local_logits` is [tokens, shard.size] row-major
//! (already the rank's columns), `targets` are global ids (the same on every rank). Collective:
//! every rank of `tp` calls it with the same tokens. Two all_reduces: max of the row maxima
//! (one value per token), then the sum of (rescaled sum, rescaled entropy term, target logit),
//! three per token; in f32 for f32/bf16/f16 logits (16 bytes per token), f64 for f64 logits.
//! Results equal log_prob_forward on the gathered logits up to summation order. The first
//! all_reduce also carries every rank's shard (24 bytes per rank), and every rank throws
//! invalid_argument_error before writing anything unless the shards agree on the vocabulary and
//! tile [0, vocab) (a gap, an overlap or a disagreement would give wrong log-probs silently).
//! A NaN or +inf logit on any rank makes its token's outputs NaN on every rank.
template <comm::CollectiveIn<host_space> C, FlatArray LR, FlatArray IR, MutableFlatArray PR,
          MutableFlatArray ER, MutableFlatArray SR = std::span<flat_value_t<PR>>>
void vocab_parallel_log_prob_forward(C& tp, LR&& local_logits, vocab_shard const& shard,
                                     IR&& targets, logprob_options const& opt, PR&& logp,
                                     ER&& entropy, SR&& lse = SR{}) {
  detail::vocab_parallel_log_prob_forward_impl(
      tp, as_flat_const(local_logits, "local_logits"), shard, as_flat_const(targets, "targets"),
      opt, as_flat(logp, "logp"), as_flat(entropy, "entropy"), as_flat(lse, "lse"));
}

namespace detail {
template <class L, class I, class T, class D>
void vocab_parallel_log_prob_backward_impl(std::span<L const> local_logits,
                                           vocab_shard const& shard, std::span<I const> targets,
                                           logprob_options const& opt, std::span<T const> lse,
                                           std::span<T const> entropy, std::span<T const> d_logp,
                                           std::span<T const> d_entropy,
                                           std::span<D> local_dlogits) {
  shard.validate();
  auto const n = targets.size();
  WEFT_EXPECTS_SHAPE(
      static_cast<index_t>(local_logits.size()) ==
          detail::checked_elements(n, shard.size, "local_logits"),
      "local_logits",
      ::weft::detail::concat("tokens * shard.size = ", n, " * ", shard.size, " elements"),
      local_logits.size());
  WEFT_EXPECTS_SHAPE(local_dlogits.size() == local_logits.size(), "local_dlogits",
                     local_logits.size(), local_dlogits.size());
  WEFT_EXPECTS_SHAPE(lse.size() == n, "lse", n, lse.size());
  WEFT_EXPECTS_SHAPE(entropy.size() == n, "entropy", n, entropy.size());
  if (!d_logp.empty()) WEFT_EXPECTS_SHAPE(d_logp.size() == n, "d_logp", n, d_logp.size());
  if (!d_entropy.empty())
    WEFT_EXPECTS_SHAPE(d_entropy.size() == n, "d_entropy", n, d_entropy.size());
  detail::check_targets(targets, shard.vocab, opt);
  using CT = compute_t<L>;
  CT const inv_tau = detail::inverse_temperature<L>(opt.temperature);
  for (std::size_t k = 0; k < n; ++k) {
    auto const o = static_cast<std::int64_t>(targets[k]);
    bool const ignored = o == opt.ignore_index;
    double const gl = ignored || d_logp.empty() ? 0.0 : static_cast<double>(d_logp[k]);
    double const ge = ignored || d_entropy.empty() ? 0.0 : static_cast<double>(d_entropy[k]);
    index_t const local_target =
        !ignored && o >= shard.begin && o < shard.begin + shard.size ? o - shard.begin : -1;
    detail::row_backward(local_logits.data() + static_cast<index_t>(k) * shard.size, shard.size,
                         inv_tau, static_cast<double>(lse[k]), static_cast<double>(entropy[k]), gl,
                         ge, local_target,
                         local_dlogits.data() + static_cast<index_t>(k) * shard.size);
  }
}
}  // namespace detail

//! Backward of the sharded forward: the rank's dlogits columns from the global lse and entropy
//! (which every rank got from the forward). No communication at all, so the shard is trusted as
//! the forward (which checked the tiling) saw it.
template <FlatArray LR, FlatArray IR, FlatArray SR, FlatArray HR,
          FlatArray GR = std::span<flat_value_t<SR> const>,
          FlatArray GER = std::span<flat_value_t<SR> const>,
          MutableFlatArray DR = std::span<flat_value_t<LR>>>
void vocab_parallel_log_prob_backward(LR&& local_logits, vocab_shard const& shard, IR&& targets,
                                      logprob_options const& opt, SR&& lse, HR&& entropy,
                                      GR&& d_logp, GER&& d_entropy, DR&& local_dlogits) {
  detail::vocab_parallel_log_prob_backward_impl(
      as_flat_const(local_logits, "local_logits"), shard, as_flat_const(targets, "targets"), opt,
      as_flat_const(lse, "lse"), as_flat_const(entropy, "entropy"), as_flat_const(d_logp, "d_logp"),
      as_flat_const(d_entropy, "d_entropy"), as_flat(local_dlogits, "local_dlogits"));
}

}  // namespace weft::rl
