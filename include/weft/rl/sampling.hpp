// weft/rl/sampling.hpp — one next token per row of logits [rows, V], by inverse-CDF sampling of
// softmax(z / tau) with a keyed coin (rng::uniform_double at the row's counter), or greedily, with
// the sampler's log-prob and entropy: the rollout step of an RL trainer whose samples must not
// depend on the layout (the coin of a sample is a pure function of its key, not of which rank or
// batch drew it). The CPU runs detail::sample_row; rl/cuda/sampling.cuh's block-per-row kernel runs
// the same draw split among its threads (detail::sample_row_split is that split on the host).
#pragma once

#include <weft/core/config.hpp>
#include <weft/core/error.hpp>
#include <weft/core/math.hpp>
#include <weft/core/random.hpp>
#include <weft/rl/token_layout.hpp>

#include <cuda/std/cmath>

#include <algorithm>
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
//! Σ_{w <= v} e^{x_w − m} exceeds coin · S (the last token with mass if rounding leaves none); logp
//! = x_tok − lse, entropy = −Σ p_v log p_v over p_v != 0. The row needs a finite maximum of x
//! (sample_tokens checks it on the host; for such a row the CUDA kernel gives NaN log-prob and
//! entropy). With inv_tau = 1 this is, operation for operation, the reference trainer's sampler
//! before it moved here.
template <class T>
WEFT_HD token_sample sample_row(T const* z, index_t vocab, double inv_tau, double coin,
                                bool greedy) noexcept {
  auto const x = [&](index_t v) { return logit_as_double(z[v]) * inv_tau; };
  double mx = neg_inf<double>();
  for (index_t v = 0; v < vocab; ++v) mx = mx < x(v) ? x(v) : mx;
  double sum = 0;
  index_t last = vocab - 1;  // the last token with mass
  for (index_t v = 0; v < vocab; ++v) {
    double const e = ::cuda::std::exp(x(v) - mx);
    sum += e;
    if (e != 0) last = v;
  }
  double const lse = mx + ::cuda::std::log(sum);
  index_t tok = 0;
  if (greedy) {
    for (index_t v = 1; v < vocab; ++v)
      if (logit_as_double(z[v]) > logit_as_double(z[tok])) tok = v;
  } else {
    double const u = coin * sum;
    double cum = 0;
    tok = last;  // where rounding leaves u past every running sum
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

// sample_row split among `workers` (the threads of rl/cuda/sampling.cuh's block-per-row kernel)
// with the same result up to the order of its sums.
//  - Peak and mass: worker w reads tokens w, w + workers, ... (peak_of, mass_of); the row's are the
//    workers' combined in any order (combine_peaks, combine_masses: max, first largest z, sums).
//  - Search: the row in tiles of workers · items tokens, worker w of a tile on tokens
//    [tile + w·items, tile + (w+1)·items); each sums its tokens in order (span_mass), an exclusive
//    scan of those sums after the earlier tiles' total gives its start, and it draws the first of
//    its tokens with mass at which start + its running sum exceeds u = coin · S (span_search); the
//    row's draw is the smallest such token of the first tile that has one. None (rounding may put
//    u past every running sum): the last token with mass, never a -inf one, as sample_row.
//  - Log-prob x_tok − lse with lse = m + log S; entropy log S − Σ_v e_v (x_v − m) / S over the
//    tokens with e_v = e^{x_v − m} != 0, which is −Σ p_v log p_v (split_sample).
// sample_row_split runs it on the host in the kernel's order: the specification the CPU tests
// hold against sample_row.

//! A worker's (or the row's) largest x = z · inv_tau (NaN skipped, as sample_row) and first largest
//! z with its token (arg -1: no token seen).
struct row_peak {
  double mx = neg_inf<double>();
  double z = neg_inf<double>();
  index_t arg = -1;
};

//! Two workers' peaks as one: the larger x; the larger z, or of equal ones the smaller token.
WEFT_HD inline row_peak combine_peaks(row_peak const& a, row_peak const& b) noexcept {
  row_peak r;
  r.mx = a.mx < b.mx ? b.mx : a.mx;
  bool const take_b = b.arg >= 0 && (a.arg < 0 || b.z > a.z || (b.z == a.z && b.arg < a.arg));
  r.z = take_b ? b.z : a.z;
  r.arg = take_b ? b.arg : a.arg;
  return r;
}

//! Σ e_v (s) and Σ e_v (x_v − m) over e_v != 0 (t) with e_v = e^{x_v − m}, and the last token with
//! e_v != 0 (-1: none), of a worker's tokens or the row's.
struct row_mass {
  double s = 0;
  double t = 0;
  index_t last = -1;
};

WEFT_HD inline row_mass combine_masses(row_mass const& a, row_mass const& b) noexcept {
  return {a.s + b.s, a.t + b.t, a.last < b.last ? b.last : a.last};
}

//! cub's operators over the two.
struct peak_combiner {
  WEFT_HD row_peak operator()(row_peak const& a, row_peak const& b) const noexcept {
    return combine_peaks(a, b);
  }
};
struct mass_combiner {
  WEFT_HD row_mass operator()(row_mass const& a, row_mass const& b) const noexcept {
    return combine_masses(a, b);
  }
};

//! The peak of tokens first, first + stride, ... < vocab.
template <class T>
WEFT_HD row_peak peak_of(T const* z, index_t vocab, double inv_tau, index_t first,
                         index_t stride) noexcept {
  row_peak p;
  for (index_t v = first; v < vocab; v += stride) {
    double const zv = logit_as_double(z[v]);
    double const x = zv * inv_tau;
    p.mx = p.mx < x ? x : p.mx;
    if (p.arg < 0 || zv > p.z) {
      p.z = zv;
      p.arg = v;
    }
  }
  return p;
}

//! The mass of tokens first, first + stride, ... < vocab under the row's largest x, mx.
template <class T>
WEFT_HD row_mass mass_of(T const* z, index_t vocab, double inv_tau, double mx, index_t first,
                         index_t stride) noexcept {
  row_mass m;
  for (index_t v = first; v < vocab; v += stride) {
    double const d = logit_as_double(z[v]) * inv_tau - mx;
    double const e = ::cuda::std::exp(d);
    m.s += e;
    if (e != 0) {  // skips the zero terms only (not 0 · -inf): a NaN row stays NaN
      m.t += e * d;
      m.last = v;
    }
  }
  return m;
}

//! Σ e_v over tokens [begin, end), in token order.
template <class T>
WEFT_HD double span_mass(T const* z, index_t begin, index_t end, double inv_tau,
                         double mx) noexcept {
  double s = 0;
  for (index_t v = begin; v < end; ++v) s += ::cuda::std::exp(logit_as_double(z[v]) * inv_tau - mx);
  return s;
}

//! The first token v of [begin, end) with e_v != 0 at which start + Σ_{begin <= w <= v} e_w
//! exceeds u; -1 if none.
template <class T>
WEFT_HD index_t span_search(T const* z, index_t begin, index_t end, double inv_tau, double mx,
                            double start, double u) noexcept {
  double cum = start;
  for (index_t v = begin; v < end; ++v) {
    double const e = ::cuda::std::exp(logit_as_double(z[v]) * inv_tau - mx);
    cum += e;
    if (e != 0 && u < cum) return v;
  }
  return -1;
}

//! The draw of token `tok` from a row of peak mx and mass (s, t).
template <class T>
WEFT_HD token_sample split_sample(T const* z, index_t tok, double inv_tau, double mx,
                                  row_mass const& mass) noexcept {
  double const log_s = ::cuda::std::log(mass.s);
  return {static_cast<std::int32_t>(tok), logit_as_double(z[tok]) * inv_tau - (mx + log_s),
          log_s - mass.t / mass.s};
}

//! sample_row by the split above, on the host, in the order of rl/cuda/sampling.cuh's kernel with
//! `workers` threads of `items` tokens a tile (each >= 1, else invalid_argument_error).
template <class T>
token_sample sample_row_split(T const* z, index_t vocab, double inv_tau, double coin, bool greedy,
                              index_t workers, index_t items) {
  WEFT_EXPECTS(workers >= 1, "workers", ">= 1", workers);
  WEFT_EXPECTS(items >= 1, "items", ">= 1", items);
  row_peak peak;
  for (index_t w = 0; w < workers; ++w)
    peak = combine_peaks(peak, peak_of(z, vocab, inv_tau, w, workers));
  row_mass mass;
  for (index_t w = 0; w < workers; ++w)
    mass = combine_masses(mass, mass_of(z, vocab, inv_tau, peak.mx, w, workers));
  index_t tok = peak.arg;
  if (!greedy) {
    double const u = coin * mass.s;
    index_t found = -1;
    double acc = 0;
    for (index_t tile = 0; tile < vocab && found < 0; tile += workers * items) {
      double prefix = 0;
      for (index_t w = 0; w < workers; ++w) {
        index_t const b = std::min(tile + w * items, vocab), e = std::min(b + items, vocab);
        double const local = span_mass(z, b, e, inv_tau, peak.mx);
        index_t const hit = span_search(z, b, e, inv_tau, peak.mx, acc + prefix, u);
        if (hit >= 0 && found < 0) found = hit;  // the workers' tokens ascend with w
        prefix += local;
      }
      acc += prefix;
    }
    tok = found >= 0 ? found : mass.last;
  }
  return split_sample(z, tok, inv_tau, peak.mx, mass);
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
