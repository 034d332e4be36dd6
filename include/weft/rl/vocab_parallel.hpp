// weft/rl/vocab_parallel.hpp — token log-probs and entropy from logits sharded over the
// vocabulary across a communicator's ranks (each holds V/p columns): only per-token statistics
// cross ranks (a max, then sum / entropy term / target logit: 16 bytes per token in f32).
#pragma once

#include <weft/comm/concepts.hpp>
#include <weft/core/config.hpp>
#include <weft/core/dtype.hpp>
#include <weft/core/error.hpp>
#include <weft/rl/layout.hpp>
#include <weft/rl/logprobs.hpp>

#include <cmath>
#include <cstdint>
#include <limits>
#include <span>
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
    WEFT_EXPECTS(rank >= 0 && rank < parts, "rank", ::weft::detail::concat("in [0, ", parts, ")"), rank);
    index_t const base = vocab / parts;
    index_t const extra = vocab % parts;
    index_t const r = rank;
    return {r * base + (r < extra ? r : extra), base + (r < extra ? 1 : 0), vocab};
  }
  void validate() const {
    WEFT_EXPECTS(vocab >= 1, "shard.vocab", ">= 1", vocab);
    WEFT_EXPECTS(begin >= 0 && size >= 0 && begin + size <= vocab, "shard",
                 ::weft::detail::concat("columns inside [0, ", vocab, ")"),
                 ::weft::detail::concat("[", begin, ", ", begin + size, ")"));
  }
};

//! Forward over vocabulary-sharded logits: `local_logits` is [tokens, shard.size] row-major
//! (already the rank's columns), `targets` are global ids (the same on every rank). Collective:
//! every rank of `tp` calls it with the same tokens. Two all_reduces: max of the row maxima
//! (one value per token), then the sum of (rescaled sum, rescaled entropy term, target logit),
//! three per token; in f32 for f32/bf16/f16 logits (16 bytes per token), f64 for f64 logits.
//! Results equal log_prob_forward on the gathered logits up to summation order.
template <comm::Communicator C, class L, class I, class T>
void vocab_parallel_log_prob_forward(C& tp, std::span<L const> local_logits, vocab_shard const& shard,
                                     std::span<I const> targets, logprob_options const& opt, std::span<T> logp,
                                     std::span<T> entropy, std::span<T> lse = {}) {
  using W = std::conditional_t<std::is_same_v<L, double>, double, float>;  // wire type
  using CT = logit_compute_t<L>;
  shard.validate();
  WEFT_EXPECTS(opt.temperature > 0 && std::isfinite(opt.temperature), "temperature", "> 0 and finite",
               opt.temperature);
  auto const n = targets.size();
  WEFT_EXPECTS_SHAPE(static_cast<index_t>(local_logits.size()) == static_cast<index_t>(n) * shard.size,
                     "local_logits", ::weft::detail::concat("tokens * shard.size = ", n, " * ", shard.size, " elements"),
                     local_logits.size());
  WEFT_EXPECTS_SHAPE(logp.size() == n, "logp", n, logp.size());
  WEFT_EXPECTS_SHAPE(entropy.size() == n, "entropy", n, entropy.size());
  if (!lse.empty()) WEFT_EXPECTS_SHAPE(lse.size() == n, "lse", n, lse.size());
  detail::check_targets(targets, shard.vocab, opt);

  CT const inv_tau = static_cast<CT>(1.0 / opt.temperature);
  std::vector<softmax_stats<double>> local(n);
  std::vector<W> maxima(n), global_max(n);
  for (std::size_t k = 0; k < n; ++k) {
    if (static_cast<std::int64_t>(targets[k]) == opt.ignore_index || shard.size == 0) {
      maxima[k] = -std::numeric_limits<W>::infinity();
      continue;
    }
    local[k] = detail::row_stats(local_logits.data() + static_cast<index_t>(k) * shard.size, shard.size, inv_tau);
    maxima[k] = static_cast<W>(local[k].max);
  }
  tp.all_reduce(comm::host_view(std::span<W>(maxima)), comm::host_view(std::span<W>(global_max)),
                comm::reduce_kind::max, {})
      .wait();
  std::vector<W> part(3 * n), total(3 * n);
  for (std::size_t k = 0; k < n; ++k) {
    auto const o = static_cast<std::int64_t>(targets[k]);
    W s = 0, t = 0, zo = 0;
    double const m = static_cast<double>(global_max[k]);
    if (o != opt.ignore_index && local[k].sum > 0) {
      double const d = local[k].max - m;  // <= 0 (the local max was rounded to W for the max)
      double const e = std::exp(d);
      s = static_cast<W>(e * local[k].sum);
      t = static_cast<W>(e * (local[k].ent + d * local[k].sum));
    }
    if (o != opt.ignore_index && o >= shard.begin && o < shard.begin + shard.size)
      zo = static_cast<W>(detail::load_logit<CT>(local_logits.data() + static_cast<index_t>(k) * shard.size,
                                                 o - shard.begin, inv_tau));
    part[3 * k] = s;
    part[3 * k + 1] = t;
    part[3 * k + 2] = zo;
  }
  tp.all_reduce(comm::host_view(std::span<W>(part)), comm::host_view(std::span<W>(total)), comm::reduce_kind::sum, {})
      .wait();
  for (std::size_t k = 0; k < n; ++k) {
    if (static_cast<std::int64_t>(targets[k]) == opt.ignore_index) {
      logp[k] = entropy[k] = T(0);
      if (!lse.empty()) lse[k] = T(0);
      continue;
    }
    softmax_stats<double> const g{static_cast<double>(global_max[k]), static_cast<double>(total[3 * k]),
                                  static_cast<double>(total[3 * k + 1])};
    double const l = softmax_finish{}.lse(g);
    logp[k] = static_cast<T>(l > -std::numeric_limits<double>::infinity() ? static_cast<double>(total[3 * k + 2]) - l : l);
    entropy[k] = static_cast<T>(softmax_finish{}.entropy(g));
    if (!lse.empty()) lse[k] = static_cast<T>(l);
  }
}

//! Backward of the sharded forward: the rank's dlogits columns from the global lse and entropy
//! (which every rank got from the forward). No communication at all.
template <class L, class I, class T, class D>
void vocab_parallel_log_prob_backward(std::span<L const> local_logits, vocab_shard const& shard,
                                      std::span<I const> targets, logprob_options const& opt, std::span<T const> lse,
                                      std::span<T const> entropy, std::span<T const> d_logp,
                                      std::span<T const> d_entropy, std::span<D> local_dlogits) {
  shard.validate();
  auto const n = targets.size();
  WEFT_EXPECTS_SHAPE(static_cast<index_t>(local_logits.size()) == static_cast<index_t>(n) * shard.size,
                     "local_logits", ::weft::detail::concat("tokens * shard.size = ", n, " * ", shard.size, " elements"),
                     local_logits.size());
  WEFT_EXPECTS_SHAPE(local_dlogits.size() == local_logits.size(), "local_dlogits", local_logits.size(),
                     local_dlogits.size());
  WEFT_EXPECTS_SHAPE(lse.size() == n, "lse", n, lse.size());
  WEFT_EXPECTS_SHAPE(entropy.size() == n, "entropy", n, entropy.size());
  if (!d_logp.empty()) WEFT_EXPECTS_SHAPE(d_logp.size() == n, "d_logp", n, d_logp.size());
  if (!d_entropy.empty()) WEFT_EXPECTS_SHAPE(d_entropy.size() == n, "d_entropy", n, d_entropy.size());
  detail::check_targets(targets, shard.vocab, opt);
  using CT = logit_compute_t<L>;
  CT const inv_tau = static_cast<CT>(1.0 / opt.temperature);
  for (std::size_t k = 0; k < n; ++k) {
    auto const o = static_cast<std::int64_t>(targets[k]);
    bool const ignored = o == opt.ignore_index;
    double const gl = ignored || d_logp.empty() ? 0.0 : static_cast<double>(d_logp[k]);
    double const ge = ignored || d_entropy.empty() ? 0.0 : static_cast<double>(d_entropy[k]);
    index_t const local_target = !ignored && o >= shard.begin && o < shard.begin + shard.size ? o - shard.begin : -1;
    detail::row_backward(local_logits.data() + static_cast<index_t>(k) * shard.size, shard.size, inv_tau,
                         static_cast<double>(lse[k]), static_cast<double>(entropy[k]), gl, ge, local_target,
                         local_dlogits.data() + static_cast<index_t>(k) * shard.size);
  }
}

}  // namespace weft::rl
