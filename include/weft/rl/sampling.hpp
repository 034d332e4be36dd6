// weft/rl/sampling.hpp — one next token per row of logits [rows, V], by inverse-CDF sampling of
// softmax(z / tau) with a keyed coin (rng::uniform_double at the row's counter), or greedily, with
// the sampler's log-prob and entropy: the rollout step of an RL trainer whose samples must not
// depend on the layout (the coin of a sample is a pure function of its key, not of which rank or
// batch drew it). detail::sample_row is WEFT_HD: rl/cuda/sampling.cuh runs it one thread per row.
#pragma once

#include <weft/core/config.hpp>
#include <weft/core/error.hpp>
#include <weft/core/math.hpp>
#include <weft/core/random.hpp>
#include <weft/rl/token_layout.hpp>

#include <cuda/std/cmath>

#include <cmath>
#include <cstdint>
#include <limits>
#include <span>

namespace weft::rl {

//! A row's draw: the token, its log-probability and the distribution's entropy, both under
//! softmax(z / tau) in double.
struct token_sample {
  std::int32_t token = 0;
  double logp = 0.0;
  double entropy = 0.0;
};

//! temperature tau divides the logits (multiplied by 1/tau, as logprob_options); greedy takes the
//! first largest logit (logp and entropy still at tau).
struct sample_options {
  double temperature = 1.0;
  bool greedy = false;
};

namespace detail {

template <class T>
WEFT_HD double logit_as_double(T z) noexcept {
  return static_cast<double>(static_cast<compute_t<T>>(z));  // exact for every element type
}

//! One row: m = max_v x_v with x_v = z_v · inv_tau, S = Σ_v e^{x_v − m} in token order,
//! lse = m + log S; greedy: the first v with the largest z_v; else the first v whose running sum
//! Σ_{w <= v} e^{x_w − m} exceeds coin · S (V − 1 if rounding leaves none); logp = x_tok − lse,
//! entropy = −Σ p_v log p_v over p_v != 0. The row needs a finite maximum of x (sample_tokens
//! checks it on the host; for such a row the CUDA kernel gives NaN log-prob and entropy). With
//! inv_tau = 1 this is, operation for operation, the reference trainer's sampler before it moved
//! here.
template <class T>
WEFT_HD token_sample sample_row(T const* z, index_t vocab, double inv_tau, double coin,
                                bool greedy) noexcept {
  auto const x = [&](index_t v) { return logit_as_double(z[v]) * inv_tau; };
  double mx = neg_inf<double>();
  for (index_t v = 0; v < vocab; ++v) mx = mx < x(v) ? x(v) : mx;
  double sum = 0;
  for (index_t v = 0; v < vocab; ++v) sum += ::cuda::std::exp(x(v) - mx);
  double const lse = mx + ::cuda::std::log(sum);
  index_t tok = 0;
  if (greedy) {
    for (index_t v = 1; v < vocab; ++v)
      if (logit_as_double(z[v]) > logit_as_double(z[tok])) tok = v;
  } else {
    double const u = coin * sum;
    double cum = 0;
    tok = vocab - 1;
    for (index_t v = 0; v < vocab; ++v) {
      cum += ::cuda::std::exp(x(v) - mx);
      if (u < cum) {
        tok = v;
        break;
      }
    }
  }
  double h = 0;
  for (index_t v = 0; v < vocab; ++v) {
    double const lp = x(v) - lse;
    double const p = ::cuda::std::exp(lp);
    if (p != 0) h -= p * lp;  // skips the zero terms only: a NaN row stays NaN
  }
  return {static_cast<std::int32_t>(tok), x(tok) - lse, h};
}

//! The checks of the host and device entry points: vocab in [1, 2^31 − 1], temperature > 0 and
//! finite with a finite inverse.
inline double sampling_inverse_temperature(index_t vocab, sample_options const& opt) {
  WEFT_EXPECTS(vocab >= 1 && vocab <= std::numeric_limits<std::int32_t>::max(), "vocab",
               "in [1, 2^31 - 1]", vocab);
  WEFT_EXPECTS(
      opt.temperature > 0 && std::isfinite(opt.temperature) && std::isfinite(1.0 / opt.temperature),
      "temperature", "> 0 and finite, with a finite inverse", opt.temperature);
  return 1.0 / opt.temperature;
}

template <class T>
void sample_tokens_impl(std::span<T const> logits, index_t vocab, rng const& gen,
                        std::span<std::uint64_t const> coins, std::span<token_sample> out,
                        sample_options const& opt) {
  double const inv_tau = sampling_inverse_temperature(vocab, opt);
  auto const rows = static_cast<index_t>(coins.size());
  WEFT_EXPECTS_SHAPE(static_cast<index_t>(logits.size()) == rows * vocab, "logits",
                     ::weft::detail::concat(rows, " rows (one per coin) x ", vocab, " = ",
                                            rows * vocab, " elements"),
                     logits.size());
  WEFT_EXPECTS_SHAPE(out.size() == coins.size(), "out",
                     ::weft::detail::concat(rows, " (one per row)"), out.size());
  // The checks see what the arithmetic sees, z / tau: a large logit at a small temperature may
  // overflow it.
  for (index_t r = 0; r < rows; ++r) {
    T const* z = logits.data() + r * vocab;
    bool finite = false;
    for (index_t v = 0; v < vocab; ++v) {
      double const x = logit_as_double(z[v]) * inv_tau;
      WEFT_EXPECTS(!std::isnan(x) && x != std::numeric_limits<double>::infinity(),
                   ::weft::detail::concat("logits[", r, ", ", v, "] / temperature"),
                   "a number below +inf", x);
      finite = finite || std::isfinite(x);
    }
    WEFT_EXPECTS(finite, ::weft::detail::concat("logits row ", r, " / temperature"),
                 "a finite value", "every value -inf");
  }
  for (index_t r = 0; r < rows; ++r) {
    auto const k = static_cast<std::size_t>(r);
    out[k] = sample_row(logits.data() + r * vocab, vocab, inv_tau,
                        opt.greedy ? 0.0 : gen.uniform_double(coins[k]), opt.greedy);
  }
}

}  // namespace detail

//! out[r] = a draw from row r of `logits` ([rows, vocab] row-major, rows = coins.size()): the
//! first token whose cumulative probability under softmax(z / tau) exceeds
//! gen.uniform_double(coins[r]), or with opt.greedy the first largest logit; with its log-prob and
//! the row's entropy (detail::sample_row). Rows of any finite logits (-inf allowed, not NaN or
//! +inf; a row needs one finite logit): invalid_argument_error naming the row otherwise, before
//! anything is written. T: float, double, bf16 or f16.
template <FlatArray LR, FlatArray CR, MutableFlatArray OR>
void sample_tokens(LR&& logits, index_t vocab, rng const& gen, CR&& coins, OR&& out,
                   sample_options const& opt = {}) {
  detail::sample_tokens_impl(as_flat_const(logits, "logits"), vocab, gen,
                             as_flat_const(coins, "coins"), as_flat(out, "out"), opt);
}

}  // namespace weft::rl
