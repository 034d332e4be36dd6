// CUDA twin of sampling.test.cpp: rl::kernels::sample_tokens (weft/rl/cuda/sampling.cuh, a block
// per row) against rl::sample_tokens on the CPU over f64, f32 and bf16 logits, vocabularies of 1,
// 7, 3000 and 2049 (a search tile and one token for bf16) and of Qwen 2.5 (151936, fewer rows),
// temperatures 1 and 0.6, sampled and greedy; every third row starts with 300 -inf logits (the
// first threads of a tile hold no mass). The kernel runs rl::detail::sample_row split among its
// threads (the CPU tests hold the split against sample_row) in double with the same Philox coins,
// so the draws are the same except where a coin lies within rounding of a CDF boundary (the
// kernel's sums run in another order, and the device's exp differs from libm's by an ulp or so):
// such a row may draw the neighbouring token, and only there (the test measures the coin's distance
// to the nearest boundary, which must be below 1e-12 of the row's sum). No row draws a -inf logit.
// Log-prob and entropy of the rows that drew the same token agree within 1e-12 of max(|cpu|, 1).
// The host checks run without a device.
#include <weft/rl/sampling.hpp>

#include "sampling_testing.hpp"

#include <weft/core/config.hpp>
#include <weft/core/dtype.hpp>
#include <weft/core/error.hpp>
#include <weft/core/random.hpp>

#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <random>
#include <span>
#include <string>
#include <vector>

#if defined(__CUDACC__) && WEFT_HAS_CUDA_RUNTIME
#include <weft/rl/cuda/sampling.cuh>

#include "support/cuda_buffer.hpp"

#include <cuda_runtime_api.h>

namespace {
namespace rl = weft::rl;
using weft::index_t;
using weft::test::have_cuda_device;
template <class T>
using dbuf = weft::test::device_buffer<T>;

template <class T>
void against_cpu(index_t rows, index_t vocab, double tau, bool greedy, std::string const& what) {
  std::mt19937_64 rng(static_cast<std::uint64_t>(rows * 31 + vocab));
  std::normal_distribution<double> n(0.0, 2.0);
  std::vector<T> logits(static_cast<std::size_t>(rows * vocab));
  for (auto& x : logits) x = static_cast<T>(n(rng));
  for (index_t r = 0; r < rows; r += 3)
    for (index_t v = 0; v < std::min<index_t>(300, vocab - 1); ++v)
      logits[static_cast<std::size_t>(r * vocab + v)] = static_cast<T>(-INFINITY);
  std::vector<std::uint64_t> coins(static_cast<std::size_t>(rows));
  for (index_t r = 0; r < rows; ++r) coins[static_cast<std::size_t>(r)] = 5 * r + 3;
  weft::rng const gen(99, 4);
  rl::sample_options const opt{tau, greedy};
  std::vector<rl::token_sample> want(static_cast<std::size_t>(rows));
  rl::sample_tokens(logits, vocab, gen, coins, want, opt);
  dbuf<T> dl(logits);
  dbuf<std::uint64_t> dc(coins);
  dbuf<rl::token_sample> dout(static_cast<std::size_t>(rows));
  rl::kernels::sample_tokens<T>(nullptr, dl.p, rows, vocab, gen, dc.p, dout.p, opt);
  WEFT_CUDA_TRY(cudaDeviceSynchronize());
  auto const got = dout.host();
  int moved = 0;
  double worst = 0, nearest = 0;
  for (index_t r = 0; r < rows; ++r) {
    auto const k = static_cast<std::size_t>(r);
    REQUIRE(got[k].token >= 0);
    REQUIRE(got[k].token < vocab);
    CHECK_MESSAGE(std::isfinite(rl::detail::logit_as_double(
                      logits[static_cast<std::size_t>(r * vocab + got[k].token)])),
                  what << ": row " << r << " drew the -inf logit " << got[k].token);
    if (got[k].token != want[k].token) {
      ++moved;
      double const d = weft::test::boundary_distance(logits.data() + r * vocab, vocab, 1.0 / tau,
                                                     gen.uniform_double(coins[k]));
      nearest = std::max(nearest, d);
      CHECK_MESSAGE(!greedy, what << ": greedy row " << r << " drew " << got[k].token << ", not "
                                  << want[k].token);
      continue;
    }
    worst = std::max(worst,
                     std::abs(got[k].logp - want[k].logp) / std::max(std::abs(want[k].logp), 1.0));
    worst = std::max(worst, std::abs(got[k].entropy - want[k].entropy) /
                                std::max(std::abs(want[k].entropy), 1.0));
  }
  INFO(what << ": " << moved << " of " << rows << " rows drew a neighbour (coin within " << nearest
            << " of a boundary); worst log-prob/entropy difference " << worst);
  CHECK(nearest <= 1e-12);
  CHECK(moved <= 1 + rows / 100);
  CHECK(worst <= 1e-12);
}

}  // namespace

TEST_CASE("rl/cuda: sample_tokens draws the CPU's tokens, log-probs and entropies") {
  if (!have_cuda_device()) return;
  for (index_t vocab : {index_t{1}, index_t{7}, index_t{3000}, index_t{2049}, index_t{151936}})
    for (double tau : {1.0, 0.6})
      for (bool greedy : {false, true}) {
        std::string const what = "vocab " + std::to_string(vocab) + ", tau " + std::to_string(tau) +
                                 (greedy ? ", greedy" : "");
        index_t const rows = vocab > 10000 ? 40 : 2000;
        against_cpu<double>(rows, vocab, tau, greedy, "f64 " + what);
        against_cpu<float>(rows, vocab, tau, greedy, "f32 " + what);
        against_cpu<weft::bf16>(rows / 4 + 1, vocab, tau, greedy, "bf16 " + what);
      }
}

TEST_CASE("rl/cuda: sample_tokens without coins when greedy; a NaN row gives NaN statistics") {
  if (!have_cuda_device()) return;
  std::vector<double> const z{0.5, 2.0, 2.0, -1.0, std::nan(""), 1.0, 0.0, 0.0};
  dbuf<double> dl(z);
  dbuf<rl::token_sample> dout(std::size_t{2});
  weft::rng const gen(3);
  rl::kernels::sample_tokens<double>(nullptr, dl.p, 2, 4, gen, nullptr, dout.p,
                                     rl::sample_options{1.0, true});
  WEFT_CUDA_TRY(cudaDeviceSynchronize());
  auto const got = dout.host();
  std::vector<rl::token_sample> want(1);
  rl::sample_tokens(std::span<double const>(z.data(), 4), 4, gen, std::vector<std::uint64_t>{0},
                    want, rl::sample_options{1.0, true});
  CHECK(got[0].token == 1);  // the first of the two largest
  CHECK(got[0].logp == doctest::Approx(want[0].logp).epsilon(1e-12));
  CHECK(got[0].entropy == doctest::Approx(want[0].entropy).epsilon(1e-12));
  CHECK(std::isnan(got[1].logp));  // the row the host would refuse
  CHECK(std::isnan(got[1].entropy));
}

TEST_CASE("rl/cuda: sample_tokens greedy takes the first largest across the block's warps") {
  if (!have_cuda_device()) return;
  // Row 0: the largest at 40 (thread 40, warp 1) and 700 (thread 188, warp 5). Row 1: at 250
  // (thread 250, warp 7) and 260 (thread 4, warp 0): the first is the later thread's.
  weft::index_t const vocab = 1000;
  std::vector<float> z(2 * static_cast<std::size_t>(vocab), 0.0f);
  z[40] = z[700] = 3.0f;
  z[static_cast<std::size_t>(vocab) + 250] = z[static_cast<std::size_t>(vocab) + 260] = 3.0f;
  dbuf<float> dl(z);
  dbuf<rl::token_sample> dout(std::size_t{2});
  weft::rng const gen(5);
  rl::kernels::sample_tokens<float>(nullptr, dl.p, 2, vocab, gen, nullptr, dout.p,
                                    rl::sample_options{1.0, true});
  WEFT_CUDA_TRY(cudaDeviceSynchronize());
  auto const got = dout.host();
  CHECK(got[0].token == 40);
  CHECK(got[1].token == 250);
}

TEST_CASE("rl/cuda: sample_tokens checks vocab, temperature and rows before the launch") {
  weft::rng const gen(1);
  float const* none = nullptr;
  std::uint64_t const* no_coins = nullptr;
  rl::token_sample* no_out = nullptr;
  CHECK_THROWS_AS(rl::kernels::sample_tokens<float>(nullptr, none, 4, 0, gen, no_coins, no_out),
                  weft::invalid_argument_error);
  CHECK_THROWS_AS(rl::kernels::sample_tokens<float>(nullptr, none, 4, 3, gen, no_coins, no_out,
                                                    rl::sample_options{0.0, false}),
                  weft::invalid_argument_error);
  CHECK_THROWS_AS(rl::kernels::sample_tokens<float>(nullptr, none, -1, 3, gen, no_coins, no_out),
                  weft::invalid_argument_error);
  CHECK_THROWS_AS(rl::kernels::sample_tokens<float>(nullptr, none, 4, 3, gen, no_coins, no_out),
                  weft::invalid_argument_error);                                  // null pointers
  rl::kernels::sample_tokens<float>(nullptr, none, 0, 3, gen, no_coins, no_out);  // no rows: no-op
}

#endif
