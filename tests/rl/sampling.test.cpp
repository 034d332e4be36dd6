// Tests of weft/rl/sampling.hpp: greedy takes the first largest logit; sampling is the inverse CDF
// of softmax(z / tau) at the coin (edge coins by detail::sample_row, frequencies over 200000
// keyed coins within 5 sigma of the probabilities); log-prob and entropy equal
// rl::log_prob_forward's (an independent, streamed implementation) at any temperature; -inf logits
// are never drawn and add nothing to the entropy; a draw depends only on its row and coin, not on
// the batch; bad input is refused naming the value, before anything is written.
#include "support/checks.hpp"
#include <weft/rl/logprobs.hpp>
#include <weft/rl/sampling.hpp>

#include "sampling_testing.hpp"

#include <weft/core/dtype.hpp>
#include <weft/core/error.hpp>
#include <weft/core/random.hpp>

#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <random>
#include <span>
#include <string>
#include <vector>

namespace {
namespace rl = weft::rl;
using weft::index_t;
using weft::test::inf;

// softmax(z / tau) in long double, the reference probabilities.
std::vector<long double> probabilities(std::vector<double> const& z, double tau) {
  long double mx = -inf, sum = 0;
  for (double v : z) mx = std::max(mx, static_cast<long double>(v) / tau);
  std::vector<long double> p;
  for (double v : z) {
    p.push_back(std::exp(static_cast<long double>(v) / tau - mx));
    sum += p.back();
  }
  for (auto& x : p) x /= sum;
  return p;
}
}  // namespace

TEST_CASE("sample_tokens: greedy takes the first largest logit, with its log-prob and entropy") {
  std::vector<double> const z{1.0, 3.0, 3.0, -inf, 0.5};
  std::vector<std::uint64_t> const coins{7};
  std::vector<rl::token_sample> out(1);
  weft::rng const gen(1);
  rl::sample_tokens(z, 5, gen, coins, out, rl::sample_options{1.0, true});
  CHECK(out[0].token == 1);
  auto const p = probabilities(z, 1.0);
  long double h = 0;
  for (auto x : p)
    if (x > 0) h -= x * std::log(x);
  CHECK(out[0].logp == doctest::Approx(static_cast<double>(std::log(p[1]))).epsilon(1e-14));
  CHECK(out[0].entropy == doctest::Approx(static_cast<double>(h)).epsilon(1e-14));
  CHECK(std::isfinite(out[0].entropy));  // the -inf logit adds nothing (not 0 * -inf)
}

TEST_CASE("sample_row: the inverse CDF at the edges and at the boundaries") {
  std::vector<double> const z{-inf, std::log(0.25), std::log(0.5), -inf, std::log(0.25)};
  auto const draw = [&](double coin) {
    return rl::detail::sample_row(z.data(), 5, 1.0, coin, false);
  };
  CHECK(draw(0.0).token == 1);  // the first token with mass, never a -inf one
  CHECK(draw(0.2499).token == 1);
  CHECK(draw(0.2501).token == 2);
  CHECK(draw(0.7499).token == 2);
  CHECK(draw(0.7501).token == 4);
  CHECK(draw(0.9999999999).token == 4);
  CHECK(draw(0.3).logp == doctest::Approx(std::log(0.5)).epsilon(1e-14));
  // The largest coin below 1 draws the last token with mass, not the -inf one after it.
  std::vector<double> const tail{std::log(0.25), std::log(0.5), std::log(0.25), -inf};
  CHECK(rl::detail::sample_row(tail.data(), 4, 1.0, std::nextafter(1.0, 0.0), false).token == 2);
  // A one-token vocabulary always draws it, with log-prob 0 and entropy 0.
  double const one = 2.5;
  auto const s = rl::detail::sample_row(&one, 1, 1.0, 0.99, false);
  CHECK(s.token == 0);
  CHECK(s.logp == 0.0);
  CHECK(s.entropy == 0.0);
}

TEST_CASE("sample_tokens: frequencies over keyed coins follow softmax(z / tau)") {
  for (double tau : {1.0, 0.7, 2.0}) {
    CAPTURE(tau);
    std::vector<double> const z{0.3, -1.2, 2.0, 0.0, 1.1};
    index_t const rows = 200000;
    std::vector<double> logits;
    std::vector<std::uint64_t> coins;
    for (index_t r = 0; r < rows; ++r) {
      logits.insert(logits.end(), z.begin(), z.end());
      coins.push_back(static_cast<std::uint64_t>(r) * 3 + 11);
    }
    std::vector<rl::token_sample> out(static_cast<std::size_t>(rows));
    rl::sample_tokens(logits, 5, weft::rng(42, 9), coins, out, rl::sample_options{tau, false});
    std::vector<double> count(5, 0.0);
    for (auto const& s : out) count[static_cast<std::size_t>(s.token)] += 1;
    auto const p = probabilities(z, tau);
    for (std::size_t v = 0; v < 5; ++v) {
      double const expect = static_cast<double>(p[v]) * rows;
      double const sigma = std::sqrt(expect * (1 - static_cast<double>(p[v])));
      INFO("token " << v << ": " << count[v] << " draws, expected " << expect);
      CHECK(std::abs(count[v] - expect) <= 5 * sigma);
    }
  }
}

TEST_CASE("sample_tokens: log-prob and entropy equal log_prob_forward's at the temperature") {
  std::mt19937_64 rng(5);
  std::normal_distribution<double> n(0.0, 3.0);
  index_t const rows = 64, vocab = 1000;
  std::vector<double> logits(static_cast<std::size_t>(rows * vocab));
  for (auto& x : logits) x = n(rng);
  logits[5] = -inf;  // never drawn, no entropy
  std::vector<std::uint64_t> coins(static_cast<std::size_t>(rows));
  for (index_t r = 0; r < rows; ++r) coins[static_cast<std::size_t>(r)] = 1000 + r;
  for (double tau : {1.0, 0.6, 1.7}) {
    for (bool greedy : {false, true}) {
      CAPTURE(tau);
      CAPTURE(greedy);
      std::vector<rl::token_sample> out(static_cast<std::size_t>(rows));
      rl::sample_tokens(logits, vocab, weft::rng(3), coins, out, rl::sample_options{tau, greedy});
      std::vector<std::int64_t> targets;
      for (auto const& s : out) targets.push_back(s.token);
      std::vector<double> logp(static_cast<std::size_t>(rows)), ent(logp.size());
      rl::logprob_options lo;
      lo.temperature = tau;
      rl::log_prob_forward(logits, vocab, targets, lo, logp, ent);
      for (index_t r = 0; r < rows; ++r) {
        auto const k = static_cast<std::size_t>(r);
        if (r == 0) CHECK(out[k].token != 5);  // row 0's -inf logit is not drawn
        CHECK(out[k].logp == doctest::Approx(logp[k]).epsilon(1e-12));
        CHECK(out[k].entropy == doctest::Approx(ent[k]).epsilon(1e-12));
        if (greedy) {
          double best = -inf;
          for (index_t v = 0; v < vocab; ++v) best = std::max(best, logits[k * vocab + v]);
          CHECK(logits[k * vocab + static_cast<std::size_t>(out[k].token)] == best);
        }
      }
    }
  }
}

TEST_CASE("sample_tokens: a draw depends on its row and coin only; f32 and bf16 logits") {
  std::mt19937_64 rng(8);
  std::uniform_real_distribution<float> u(-4.0f, 4.0f);
  index_t const rows = 50, vocab = 37;
  std::vector<float> logits(static_cast<std::size_t>(rows * vocab));
  for (auto& x : logits) x = u(rng);
  std::vector<std::uint64_t> coins(static_cast<std::size_t>(rows));
  for (index_t r = 0; r < rows; ++r) coins[static_cast<std::size_t>(r)] = 77 * r;
  weft::rng const gen(2024, 1);
  std::vector<rl::token_sample> all(static_cast<std::size_t>(rows));
  rl::sample_tokens(logits, vocab, gen, coins, all);
  for (index_t r = rows; r-- > 0;) {  // one row at a time, in another order
    std::vector<rl::token_sample> one(1);
    rl::sample_tokens(std::span<float const>(logits.data() + r * vocab, vocab), vocab, gen,
                      std::span<std::uint64_t const>(&coins[static_cast<std::size_t>(r)], 1), one);
    CHECK(one[0].token == all[static_cast<std::size_t>(r)].token);
    CHECK(one[0].logp == all[static_cast<std::size_t>(r)].logp);
    CHECK(one[0].entropy == all[static_cast<std::size_t>(r)].entropy);
  }
  // bf16 logits: the draw of their exact values widened to f32.
  std::vector<weft::bf16> half(logits.size());
  std::vector<float> widened(logits.size());
  for (std::size_t k = 0; k < logits.size(); ++k) {
    half[k] = weft::bf16(logits[k]);
    widened[k] = static_cast<float>(half[k]);
  }
  std::vector<rl::token_sample> a(static_cast<std::size_t>(rows)), b(a.size());
  rl::sample_tokens(half, vocab, gen, coins, a);
  rl::sample_tokens(widened, vocab, gen, coins, b);
  for (std::size_t k = 0; k < a.size(); ++k) {
    CHECK(a[k].token == b[k].token);
    CHECK(a[k].logp == b[k].logp);
  }
}

TEST_CASE("sample_tokens: bad input is refused naming the value, before anything is written") {
  weft::rng const gen(1);
  std::vector<std::uint64_t> const coins{1, 2};
  std::vector<rl::token_sample> out(2, rl::token_sample{-5, -5.0, -5.0});
  auto const refused = [&](std::vector<double> const& z, index_t vocab, std::string const& name,
                           rl::sample_options o = {}) {
    std::string msg;
    try {
      rl::sample_tokens(z, vocab, gen, coins, out, o);
    } catch (weft::invalid_argument_error const& e) {
      msg = e.what();
    }
    INFO(msg);
    CHECK(msg.find(name) != std::string::npos);
    CHECK(out[0].token == -5);  // nothing written
    CHECK(out[1].token == -5);
  };
  refused({0, 1, 2, std::nan(""), 4, 5}, 3, "logits[1, 0]");
  refused({0, 1, 2, 3, inf, 5}, 3, "logits[1, 1]");
  refused({0, 1, 2, -inf, -inf, -inf}, 3, "logits row 1");
  refused({0, 1, 2, 3, 4}, 3, "logits");
  refused({}, 0, "vocab");
  refused({0, 1, 2, 3, 4, 5}, 3, "temperature", rl::sample_options{0.0, false});
  refused({0, 1, 2, 3, 4, 5}, 3, "temperature", rl::sample_options{-1.0, false});
  refused({0, 1, 2, 3, 4, 5}, 3, "temperature", rl::sample_options{inf, false});
  // What the arithmetic sees is z / tau: finite logits that overflow it are refused too.
  refused({0, 1, 2, 1e308, 0, 0}, 3, "logits[1, 0] / temperature", rl::sample_options{0.1, false});
  refused({0, 1, 2, -1e300, -1e300, -1e300}, 3, "logits row 1 / temperature",
          rl::sample_options{1e-10, false});
  std::vector<rl::token_sample> short_out(1);
  CHECK_THROWS_AS(rl::sample_tokens(std::vector<double>{0, 1, 2, 3}, 2, gen, coins, short_out),
                  weft::shape_error);
}

// detail::sample_row_split: the draw as rl/cuda/sampling.cuh's block-per-row kernel splits it
// among its threads, run on the host in the kernel's order, against sample_row.
namespace {

template <class T>
void split_against_row(index_t vocab, index_t workers, index_t items, std::uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<double> n(0.0, 2.0);
  std::vector<T> z(static_cast<std::size_t>(vocab));
  for (auto& x : z) x = static_cast<T>(n(rng));
  if (vocab > 4) z[static_cast<std::size_t>(vocab / 3)] = static_cast<T>(-inf);
  std::uniform_real_distribution<double> coin(0.0, 1.0);
  int moved = 0, draws = 0;
  for (double tau : {1.0, 0.6})
    for (int k = 0; k < 24; ++k) {
      bool const greedy = k == 0;
      double const c = k == 1 ? 0.0 : k == 2 ? std::nextafter(1.0, 0.0) : coin(rng);
      auto const want = rl::detail::sample_row(z.data(), vocab, 1.0 / tau, c, greedy);
      auto const got =
          rl::detail::sample_row_split(z.data(), vocab, 1.0 / tau, c, greedy, workers, items);
      CAPTURE(vocab);
      CAPTURE(workers);
      CAPTURE(items);
      CAPTURE(tau);
      CAPTURE(c);
      ++draws;
      CHECK(rl::detail::logit_as_double(z[static_cast<std::size_t>(got.token)]) > -inf);
      if (got.token != want.token) {
        // Only a coin within rounding of a CDF boundary may draw a neighbour; never greedy.
        ++moved;
        CHECK(!greedy);
        CHECK(weft::test::boundary_distance(z.data(), vocab, 1.0 / tau, c) <= 1e-13);
        continue;
      }
      CHECK(got.logp == doctest::Approx(want.logp).epsilon(1e-12).scale(1.0));
      CHECK(got.entropy == doctest::Approx(want.entropy).epsilon(1e-12).scale(1.0));
    }
  CHECK(moved <= 1 + draws / 50);
}

}  // namespace

TEST_CASE("sample_row_split: the kernel's split draws sample_row's tokens, log-probs, entropies") {
  std::uint64_t seed = 1;
  for (index_t vocab : {1, 2, 7, 255, 256, 257, 2047, 2048, 2049, 3000, 40000})
    for (index_t workers : {1, 3, 32, 256})
      for (index_t items : {1, 2, 8}) {
        // The long rows at two splits only (the sizes that cross tiles are the short ones).
        if (vocab >= 3000 && !((workers == 3 && items == 2) || (workers == 256 && items == 8)))
          continue;
        split_against_row<double>(vocab, workers, items, ++seed);
        split_against_row<float>(vocab, workers, items, ++seed);
        split_against_row<weft::bf16>(vocab, workers, items, ++seed);
      }
}

TEST_CASE("sample_row_split: the edges, ties across workers, the fallback past every sum") {
  std::vector<double> const z{-inf, std::log(0.25), std::log(0.5), -inf, std::log(0.25)};
  std::vector<double> const tail{std::log(0.25), std::log(0.5), std::log(0.25), -inf, -inf};
  // Largest 5 first at token 1, again at 3 and 6: in other workers than token 1 for most splits.
  std::vector<double> const ties{0.0, 5.0, 1.0, 5.0, -inf, 2.0, 5.0, 4.0};
  for (index_t workers = 1; workers <= 9; ++workers)
    for (index_t items = 1; items <= 4; ++items) {
      CAPTURE(workers);
      CAPTURE(items);
      auto const draw = [&](std::vector<double> const& row, double coin, bool greedy = false) {
        return rl::detail::sample_row_split(row.data(), static_cast<index_t>(row.size()), 1.0, coin,
                                            greedy, workers, items);
      };
      CHECK(draw(z, 0.0).token == 1);  // the first token with mass, never a -inf one
      CHECK(draw(z, 0.2499).token == 1);
      CHECK(draw(z, 0.2501).token == 2);
      CHECK(draw(z, 0.7499).token == 2);
      CHECK(draw(z, 0.7501).token == 4);
      CHECK(draw(z, 0.9999999999).token == 4);
      CHECK(draw(z, 0.3).logp == doctest::Approx(std::log(0.5)).epsilon(1e-14));
      auto const e = draw(z, 0.3);
      CHECK(e.entropy == doctest::Approx(1.5 * std::log(2.0)).epsilon(1e-14));
      CHECK(draw(tail, std::nextafter(1.0, 0.0)).token == 2);
      // A u past every running sum (no coin gives one, rounding may): the last token with mass,
      // as sample_row, not the last token (a -inf one here).
      CHECK(draw(tail, 2.0).token == 2);
      CHECK(rl::detail::sample_row(tail.data(), 5, 1.0, 2.0, false).token == 2);
      CHECK(draw(ties, 0.0, true).token == 1);
      CHECK(draw(ties, 0.0, true).logp ==
            doctest::Approx(rl::detail::sample_row(ties.data(), 8, 1.0, 0.0, true).logp)
                .epsilon(1e-14));
      double const one = 2.5;
      auto const s = rl::detail::sample_row_split(&one, 1, 1.0, 0.99, false, workers, items);
      CHECK(s.token == 0);
      CHECK(s.logp == 0.0);
      CHECK(s.entropy == 0.0);
    }
  // No workers or no items a tile: refused (items 0 would never advance the search).
  CHECK_THROWS_AS(rl::detail::sample_row_split(z.data(), 5, 1.0, 0.5, false, 0, 2),
                  weft::invalid_argument_error);
  CHECK_THROWS_AS(rl::detail::sample_row_split(z.data(), 5, 1.0, 0.5, false, 4, 0),
                  weft::invalid_argument_error);
  // A worker whose start is already past u (the block's scan rounds differently from a thread's
  // running sum) draws its first token with mass, not a -inf one before it.
  std::vector<double> const lead{-inf, 0.0, 0.0};
  CHECK(rl::detail::span_search(lead.data(), 0, 3, 1.0, 0.0, 1.0, 0.5) == 1);
  CHECK(rl::detail::span_search(lead.data(), 0, 3, 1.0, 0.0, 0.0, 1.5) == 2);
  CHECK(rl::detail::span_search(lead.data(), 0, 3, 1.0, 0.0, 0.0, 2.0) == -1);
}

TEST_CASE("sample_row_split: the workers' peaks and masses combine alike in any order") {
  // cub combines the threads' values in a tree, sample_row_split in worker order: the combines
  // must not depend on the order, ties of the largest logit across workers included.
  std::mt19937_64 rng(11);
  std::uniform_int_distribution<int> level(0, 3);
  for (index_t workers : {2, 5, 8, 32}) {
    for (int trial = 0; trial < 50; ++trial) {
      index_t const vocab = 3 * workers + trial % 7;
      std::vector<double> z(static_cast<std::size_t>(vocab));
      for (auto& x : z) x = level(rng) == 0 ? -inf : static_cast<double>(level(rng));  // many ties
      std::vector<rl::detail::row_peak> peaks;
      std::vector<rl::detail::row_mass> masses;
      for (index_t w = 0; w < workers; ++w)
        peaks.push_back(rl::detail::peak_of(z.data(), vocab, 1.0, w, workers));
      rl::detail::row_peak seq;
      for (auto const& p : peaks) seq = rl::detail::combine_peaks(seq, p);
      for (index_t w = 0; w < workers; ++w)
        masses.push_back(rl::detail::mass_of(z.data(), vocab, 1.0, seq.mx, w, workers));
      // Reversed, and a pairwise tree as a block reduction's.
      rl::detail::row_peak rev;
      for (auto it = peaks.rbegin(); it != peaks.rend(); ++it)
        rev = rl::detail::combine_peaks(*it, rev);
      auto tree = peaks;
      auto tree_m = masses;
      while (tree.size() > 1) {
        std::vector<rl::detail::row_peak> next;
        std::vector<rl::detail::row_mass> next_m;
        for (std::size_t i = 0; i < tree.size(); i += 2) {
          next.push_back(i + 1 < tree.size() ? rl::detail::combine_peaks(tree[i + 1], tree[i])
                                             : tree[i]);
          next_m.push_back(i + 1 < tree.size()
                               ? rl::detail::combine_masses(tree_m[i + 1], tree_m[i])
                               : tree_m[i]);
        }
        tree = next;
        tree_m = next_m;
      }
      index_t first = 0;
      for (index_t v = 1; v < vocab; ++v)
        if (z[static_cast<std::size_t>(v)] > z[static_cast<std::size_t>(first)]) first = v;
      index_t last = -1;
      for (index_t v = 0; v < vocab; ++v)
        if (z[static_cast<std::size_t>(v)] > -inf) last = v;
      CAPTURE(workers);
      CAPTURE(trial);
      CHECK(seq.arg == first);
      CHECK(rev.arg == first);
      CHECK(tree[0].arg == first);
      CHECK(rev.mx == seq.mx);
      CHECK(tree[0].mx == seq.mx);
      CHECK(tree_m[0].last == last);
    }
  }
}
