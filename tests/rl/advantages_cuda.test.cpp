// CUDA twins of the advantage and KL tests: GRPO / Dr. GRPO / RLOO over segment groups (odd
// sizes, singletons, empty groups, constant groups) and fixed groups (weft/rl/cuda/advantages.cuh),
// GAE, discounted returns, REINFORCE++, ReMax and masked whitening over padded and packed rows
// (weft/rl/cuda/returns.cuh; rows up to 70001 tokens, the row scans' tile-to-tile carry), and the
// KL estimators' per-token values, gradients and loss term (weft/rl/cuda/kl.cuh) against the CPU
// path. The host build compiles nothing here.
//
// Tolerances (relative to max(|cpu|, 1)): statistics are summed in double on both sides, in a tree
// on the GPU and serially on the CPU, so f64 outputs agree within 1e-12 and f32 outputs (one
// rounding of a double) within 1e-6. KL: exp comes from CUDA's libdevice instead of libm (a few
// ulp), 1e-6 for f32 and 1e-12 for f64.
#include <weft/rl/advantages.hpp>
#include <weft/rl/kl.hpp>

#include <weft/core/config.hpp>

#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <memory>
#include <random>
#include <span>
#include <string>
#include <vector>

#if defined(__CUDACC__) && WEFT_HAS_CUDA_RUNTIME
#include <weft/rl/cuda/advantages.cuh>
#include <weft/rl/cuda/kl.cuh>
#include <weft/rl/cuda/returns.cuh>

#include "support/cuda_buffer.hpp"

#include <cuda_runtime_api.h>

namespace {
using weft::rl::group_layout;
using weft::rl::kl_kind;
using weft::rl::singleton_group;
namespace rk = weft::rl::kernels;

using weft::test::have_cuda_device;
template <class T>
using dbuf = weft::test::device_buffer<T>;

// Worst |gpu − cpu| / max(|cpu|, 1) (equal infinities agree; a NaN on one side only fails),
// reported with its index on failure.
template <class T>
void expect_close(std::string const& what, std::vector<T> const& gpu, std::vector<T> const& cpu,
                  double tol) {
  REQUIRE(gpu.size() == cpu.size());
  double worst = 0;
  std::size_t at = 0;
  for (std::size_t i = 0; i < gpu.size(); ++i) {
    auto const g = static_cast<double>(gpu[i]), c = static_cast<double>(cpu[i]);
    double e = 0;
    if (std::isnan(g) || std::isnan(c))
      e = std::isnan(g) && std::isnan(c) ? 0.0 : INFINITY;
    else if (std::isinf(g) || std::isinf(c))
      e = g == c ? 0.0 : INFINITY;
    else
      e = std::abs(g - c) / std::max(std::abs(c), 1.0);
    if (e > worst) {
      worst = e;
      at = i;
    }
  }
  if (worst > tol)
    MESSAGE(what << ": error " << worst << " > " << tol << " at element " << at << " of "
                 << gpu.size() << ": gpu " << static_cast<double>(gpu[at]) << " cpu "
                 << static_cast<double>(cpu[at]));
  CHECK(worst <= tol);
}

// Scores for groups of the given sizes: random, with a constant group and binary rewards mixed in.
template <class T>
std::vector<T> grouped_scores(std::vector<std::int64_t> const& sizes, std::uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<double> u(-2.0, 3.0);
  std::vector<T> s;
  for (std::size_t g = 0; g < sizes.size(); ++g)
    for (std::int64_t i = 0; i < sizes[g]; ++i)
      s.push_back(g % 5 == 1   ? T(0.7)                                      // constant group
                  : g % 5 == 2 ? static_cast<T>(rng() % 2 == 0 ? 0.0 : 1.0)  // binary rewards
                               : static_cast<T>(u(rng)));
  return s;
}

template <class T>
void advantages_against_cpu(std::vector<std::int64_t> const& sizes, std::uint64_t seed) {
  double const tol = sizeof(T) == 4 ? 1e-6 : 1e-12;
  auto const scores = grouped_scores<T>(sizes, seed);
  std::vector<std::int64_t> offsets{0}, ids;
  for (std::size_t g = 0; g < sizes.size(); ++g) {
    offsets.push_back(offsets.back() + sizes[g]);
    for (std::int64_t i = 0; i < sizes[g]; ++i) ids.push_back(static_cast<std::int64_t>(g) * 7 + 3);
  }
  auto const n = static_cast<std::int64_t>(scores.size());
  auto const groups = static_cast<std::int64_t>(sizes.size());
  std::string const tag = std::string(sizeof(T) == 4 ? "f32" : "f64") + " n=" + std::to_string(n) +
                          " groups=" + std::to_string(groups);
  dbuf<T> ds(scores), dout(std::vector<T>(scores.size(), T(-9)));
  dbuf<std::int64_t> doff(offsets);
  auto const layout = group_layout::by_id(std::span<std::int64_t const>(ids));
  std::vector<T> cpu(scores.size());
  for (auto single : {singleton_group::zero, singleton_group::keep_score}) {
    std::string const st = single == singleton_group::zero ? " singleton=zero" : " singleton=keep";
    for (bool by_std : {true, false}) {
      weft::rl::grpo_options const opt{by_std, by_std ? 1e-6 : 0.0, single};
      weft::rl::grpo_advantages(std::span<T const>(scores), layout, std::span<T>(cpu), opt);
      rk::grpo_advantages<T>(nullptr, ds.p, n, doff.p, groups, dout.p, opt);
      WEFT_CUDA_TRY(cudaDeviceSynchronize());
      expect_close(tag + (by_std ? " GRPO" : " Dr. GRPO") + st, dout.host(), cpu, tol);
    }
    weft::rl::rloo_advantages(std::span<T const>(scores), layout, std::span<T>(cpu), single);
    rk::rloo_advantages<T>(nullptr, ds.p, n, doff.p, groups, dout.p, single);
    WEFT_CUDA_TRY(cudaDeviceSynchronize());
    expect_close(tag + " RLOO" + st, dout.host(), cpu, tol);
  }
}

}  // namespace

TEST_CASE("rl/cuda: GRPO, Dr. GRPO and RLOO over segment groups give the CPU's advantages") {
  if (!have_cuda_device()) return;
  // Odd sizes, singletons and empty groups (first, middle, last).
  std::vector<std::int64_t> const mixed = {0, 4, 1, 0, 7, 3, 5, 2, 1, 16, 0};
  advantages_against_cpu<double>(mixed, 1);
  advantages_against_cpu<float>(mixed, 1);
  std::vector<std::int64_t> many;
  std::mt19937_64 rng(5);
  for (int g = 0; g < 20011; ++g) many.push_back(static_cast<std::int64_t>(rng() % 17));
  advantages_against_cpu<double>(many, 2);
  advantages_against_cpu<float>(many, 2);
  advantages_against_cpu<float>({}, 3);  // nothing at all
}

namespace {
template <class T>
void fixed_groups_against_cpu(double tol) {
  for (std::int64_t gsize : {1, 4, 5, 64}) {
    CAPTURE(gsize);
    CAPTURE(sizeof(T));
    std::vector<std::int64_t> sizes(37, gsize);
    auto const scores = grouped_scores<T>(sizes, 9);
    auto const n = static_cast<std::int64_t>(scores.size());
    std::vector<T> cpu(scores.size());
    dbuf<T> ds(scores), dout(cpu);
    weft::rl::grpo_advantages(std::span<T const>(scores), group_layout::fixed(gsize),
                              std::span<T>(cpu));
    rk::grpo_advantages<T>(nullptr, ds.p, n, gsize, dout.p);
    WEFT_CUDA_TRY(cudaDeviceSynchronize());
    expect_close("fixed GRPO", dout.host(), cpu, tol);
    weft::rl::rloo_advantages(std::span<T const>(scores), group_layout::fixed(gsize),
                              std::span<T>(cpu));
    rk::rloo_advantages<T>(nullptr, ds.p, n, gsize, dout.p);
    WEFT_CUDA_TRY(cudaDeviceSynchronize());
    expect_close("fixed RLOO", dout.host(), cpu, tol);
  }
}
}  // namespace

TEST_CASE("rl/cuda: fixed-size groups equal group_layout::fixed on the CPU (f32 and f64)") {
  if (!have_cuda_device()) return;
  fixed_groups_against_cpu<float>(1e-6);
  fixed_groups_against_cpu<double>(1e-12);
}

namespace {
template <class T>
void kl_against_cpu(std::size_t n) {
  double const tol = sizeof(T) == 4 ? 1e-6 : 1e-12;
  std::mt19937_64 rng(n);
  std::uniform_real_distribution<double> u(-6.0, 0.0);
  std::vector<T> lp(n), ref(n), w(n);
  std::vector<std::uint8_t> mask(n);
  T const ninf = -std::numeric_limits<T>::infinity();
  for (std::size_t k = 0; k < n; ++k) {
    lp[k] = static_cast<T>(u(rng));
    ref[k] = static_cast<T>(u(rng));
    w[k] = static_cast<T>(1.0 / static_cast<double>(n) * (1 + k % 3));
    mask[k] = k % 7 == 3 ? 0 : 1;                     // masked tokens
    if (k % 11 == 5) ref[k] = static_cast<T>(-40.0);  // x > 20: k3's clamps
    if (k % 13 == 6) lp[k] = static_cast<T>(-45.0);   // x < -20
    if (k % 17 == 8) lp[k] = ref[k] = ninf;           // both -inf: no x
  }
  std::string const tag = std::string(sizeof(T) == 4 ? "f32" : "f64") + " n=" + std::to_string(n);
  dbuf<T> dlp(lp), dref(ref), dw(w), dval(lp), dgrad(lp);
  dbuf<std::uint8_t> dmask(mask);
  for (kl_kind kind :
       {kl_kind::k1, kl_kind::abs, kl_kind::k2, kl_kind::k3, kl_kind::k1_plus, kl_kind::k3_plus}) {
    std::string const kt = tag + " " + std::string(weft::rl::to_string(kind));
    std::vector<T> val(n), grad(n);
    weft::rl::kl_penalty(kind, std::span<T const>(lp), std::span<T const>(ref),
                         std::span<std::uint8_t const>(mask), std::span<T>(val),
                         std::span<T>(grad));
    rk::kl_penalty<T, std::uint8_t>(nullptr, kind, dlp.p, dref.p, dmask.p, dval.p, dgrad.p,
                                    static_cast<std::int64_t>(n));
    WEFT_CUDA_TRY(cudaDeviceSynchronize());
    expect_close(kt + " value", dval.host(), val, tol);
    expect_close(kt + " grad", dgrad.host(), grad, tol);
    // Values alone (grad null, as kl.cuh allows): the same values.
    dbuf<T> dval_only(lp);
    rk::kl_penalty<T, std::uint8_t>(nullptr, kind, dlp.p, dref.p, dmask.p, dval_only.p,
                                    static_cast<T*>(nullptr), static_cast<std::int64_t>(n));
    WEFT_CUDA_TRY(cudaDeviceSynchronize());
    expect_close(kt + " value (no gradient)", dval_only.host(), val, tol);
    // The loss term: dlogp starts at 0.5 everywhere and gains coef·w·k' on valid tokens.
    std::vector<T> dl(n, T(0.5));
    double const coef = 0.1;
    double const want = weft::rl::kl_loss(
        kind, coef, std::span<T const>(lp), std::span<T const>(ref),
        std::span<std::uint8_t const>(mask), std::span<T const>(w), std::span<T>(dl));
    dbuf<T> ddl(std::vector<T>(n, T(0.5)));
    dbuf<double> dloss(std::vector<double>(1, -1.0));
    rk::kl_loss<T, std::uint8_t>(nullptr, kind, coef, dlp.p, dref.p, dmask.p, dw.p, ddl.p,
                                 static_cast<std::int64_t>(n), dloss.p);
    WEFT_CUDA_TRY(cudaDeviceSynchronize());
    double const got = dloss.host()[0];
    INFO(kt << " loss gpu " << got << " cpu " << want);
    CHECK(std::abs(got - want) <= tol * std::max(std::abs(want), 1.0));
    expect_close(kt + " dlogp", ddl.host(), dl, tol);
  }
}
}  // namespace

TEST_CASE("rl/cuda: KL estimators' values, gradients and loss term follow the CPU") {
  if (!have_cuda_device()) return;
  for (std::size_t n : {std::size_t{1}, std::size_t{1037}, std::size_t{100003}}) {
    kl_against_cpu<float>(n);
    kl_against_cpu<double>(n);
  }
  kl_against_cpu<float>(0);
}

TEST_CASE("rl/cuda: bad group sizes and eps throw before any launch") {
  float* none = nullptr;
  CHECK_THROWS_AS(rk::grpo_advantages<float>(nullptr, none, 10, std::int64_t{4}, none),
                  weft::invalid_argument_error);
  CHECK_THROWS_AS(rk::grpo_advantages<float>(nullptr, none, 8, std::int64_t{0}, none),
                  weft::invalid_argument_error);
  weft::rl::grpo_options bad;
  bad.eps = -1;
  CHECK_THROWS_AS(rk::grpo_advantages<float>(nullptr, none, 8, std::int64_t{4}, none, bad),
                  weft::invalid_argument_error);
}

namespace {
// A token batch: padded [rows, cols] or packed rows of the given lengths; rewards and values
// random, a mask with padded tails, a multi-turn gap in every third row and an all-masked row;
// at masked positions NaN values (which no output may read) and rewards of 5 (discounted returns
// write their running sum there and reset after; the others ignore them).
template <class T>
struct token_batch {
  weft::rl::token_layout layout;
  std::vector<std::int64_t> offsets{0};
  std::vector<T> rewards, values, baselines;
  std::vector<std::uint8_t> mask;
  rk::device_rows rows;
  std::unique_ptr<dbuf<std::int64_t>> doff;

  token_batch(std::vector<std::int64_t> const& lengths, std::int64_t padded_cols,
              std::uint64_t seed) {
    std::mt19937_64 rng(seed);
    std::uniform_real_distribution<double> u(-1.0, 2.0);
    for (auto l : lengths) offsets.push_back(offsets.back() + l);
    auto const n_rows = static_cast<std::int64_t>(lengths.size());
    if (padded_cols > 0)
      layout = weft::rl::token_layout::padded(n_rows, padded_cols);
    else
      layout = weft::rl::token_layout::packed(offsets);
    T const nan = std::numeric_limits<T>::quiet_NaN();
    for (std::int64_t i = 0; i < n_rows; ++i) {
      auto const len = layout.row_end(i) - layout.row_begin(i);
      auto const valid_len = padded_cols > 0 ? std::min<std::int64_t>(lengths[i], len) : len;
      for (std::int64_t t = 0; t < len; ++t) {
        bool ok = t < valid_len && i % 11 != 7;  // tail, all-masked row
        if (i % 3 == 1 && t >= valid_len / 3 && t < valid_len / 2) ok = false;  // an observation
        mask.push_back(ok ? 1 : 0);
        rewards.push_back(ok ? static_cast<T>(t + 1 == valid_len ? 3 * u(rng) : 0.1 * u(rng))
                             : T(5));
        values.push_back(ok ? static_cast<T>(u(rng)) : nan);
      }
      baselines.push_back(static_cast<T>(u(rng)));
    }
    if (padded_cols > 0) {
      rows = rk::device_rows::padded(n_rows, padded_cols);
    } else {
      doff = std::make_unique<dbuf<std::int64_t>>(offsets);
      rows = rk::device_rows::packed(doff->p, n_rows, offsets.back());
    }
  }
};

template <class T>
void returns_against_cpu(token_batch<T> const& b, std::string const& tag) {
  double const tol = sizeof(T) == 4 ? 1e-6 : 1e-12;
  using weft::rl::gae_options;
  auto const n = b.mask.size();
  REQUIRE(static_cast<std::int64_t>(n) == b.layout.tokens());
  REQUIRE(b.rows.tokens == b.layout.tokens());
  dbuf<T> dr(b.rewards), dv(b.values), db(b.baselines), da(std::vector<T>(n, T(-9))),
      dt(std::vector<T>(n, T(-9)));
  dbuf<std::uint8_t> dm(b.mask);
  std::vector<T> adv(n), ret(n);
  auto const cs = [](std::vector<T> const& v) { return std::span<T const>(v); };
  auto const ms = std::span<std::uint8_t const>(b.mask);
  for (gae_options opt : {gae_options{1.0, 1.0, false}, gae_options{0.99, 0.95, true},
                          gae_options{0.9, 0.8, false}, gae_options{1.0, 0.5, true}}) {
    std::string const ot = tag + " GAE gamma " + std::to_string(opt.gamma) + " lambda " +
                           std::to_string(opt.lambda) + (opt.whiten ? " whitened" : "");
    weft::rl::gae_advantages(b.layout, cs(b.rewards), cs(b.values), ms, std::span<T>(adv),
                             std::span<T>(ret), opt);
    rk::gae_advantages<T>(nullptr, b.rows, dr.p, dv.p, dm.p, da.p, dt.p, opt);
    WEFT_CUDA_TRY(cudaDeviceSynchronize());
    expect_close(ot + " advantages", da.host(), adv, tol);
    expect_close(ot + " returns", dt.host(), ret, tol);
  }
  for (double gamma : {1.0, 0.97}) {
    std::string const gt = tag + " gamma " + std::to_string(gamma);
    weft::rl::discounted_returns(b.layout, cs(b.rewards), ms, gamma, std::span<T>(ret));
    rk::discounted_returns<T>(nullptr, b.rows, dr.p, dm.p, gamma, dt.p);
    WEFT_CUDA_TRY(cudaDeviceSynchronize());
    expect_close(gt + " discounted returns", dt.host(), ret, tol);
    weft::rl::reinforce_pp_advantages(b.layout, cs(b.rewards), ms, gamma, std::span<T>(adv));
    rk::reinforce_pp_advantages<T>(nullptr, b.rows, dr.p, dm.p, gamma, da.p);
    WEFT_CUDA_TRY(cudaDeviceSynchronize());
    expect_close(gt + " REINFORCE++", da.host(), adv, tol);
  }
  weft::rl::remax_advantages(b.layout, cs(b.rewards), cs(b.baselines), ms, std::span<T>(adv),
                             std::span<T>(ret));
  rk::remax_advantages<T>(nullptr, b.rows, dr.p, db.p, dm.p, da.p, dt.p);
  WEFT_CUDA_TRY(cudaDeviceSynchronize());
  expect_close(tag + " ReMax advantages", da.host(), adv, tol);
  expect_close(tag + " ReMax returns", dt.host(), ret, tol);
}

template <class T>
void returns_grid() {
  std::string const p = sizeof(T) == 4 ? "f32" : "f64";
  std::vector<std::int64_t> const lengths = {0, 5, 1, 0, 64, 17, 300, 2, 9, 33, 128, 7};
  returns_against_cpu(token_batch<T>(lengths, 0, 1), p + " packed");
  returns_against_cpu(token_batch<T>(lengths, 300, 2), p + " padded 12 x 300");
  std::vector<std::int64_t> many;
  std::mt19937_64 rng(3);
  for (int i = 0; i < 1000; ++i) many.push_back(static_cast<std::int64_t>(rng() % 130));
  returns_against_cpu(token_batch<T>(many, 0, 4), p + " packed 1000 rows");
  returns_against_cpu(token_batch<T>(many, 129, 5), p + " padded 1000 x 129");
  returns_against_cpu(token_batch<T>({}, 4, 6), p + " no rows");
  // Rows of many 512-token tiles (the kernels' carry from tile to tile), a tile plus one token.
  returns_against_cpu(token_batch<T>({70001, 513, 5000, 512, 1}, 0, 7), p + " packed long rows");
  returns_against_cpu(token_batch<T>({20000, 19000, 1025}, 20000, 8), p + " padded 3 x 20000");
}
}  // namespace

TEST_CASE(
    "rl/cuda: GAE, discounted returns, REINFORCE++ and ReMax give the CPU's, padded and "
    "packed") {
  if (!have_cuda_device()) return;
  returns_grid<double>();
  returns_grid<float>();
}

namespace {
// Masked whitening of T values (f32: the statistics and each token's arithmetic in double, as
// the CPU's, then one rounding).
template <class T>
void whiten_against_cpu(double tol) {
  for (std::size_t n :
       {std::size_t{0}, std::size_t{1}, std::size_t{2}, std::size_t{1037}, std::size_t{100003}}) {
    CAPTURE(n);
    std::mt19937_64 rng(n + 17);
    std::uniform_real_distribution<double> u(-3.0, 5.0);
    std::vector<T> v(n);
    std::vector<std::uint8_t> m(n);
    for (std::size_t k = 0; k < n; ++k) {
      m[k] = k % 5 == 3 ? 0 : 1;
      v[k] = m[k] ? static_cast<T>(100.0 + u(rng))  // mean far from 0
                  : std::numeric_limits<T>::quiet_NaN();
    }
    dbuf<T> dv(v), dout(std::vector<T>(n, T(-9)));
    dbuf<std::uint8_t> dm(m);
    std::vector<T> want(n);
    for (bool shift : {true, false}) {
      weft::rl::masked_whiten(std::span<T const>(v), std::span<std::uint8_t const>(m),
                              std::span<T>(want), shift);
      rk::masked_whiten<T, std::uint8_t>(nullptr, dv.p, dm.p, static_cast<std::int64_t>(n), dout.p,
                                         shift);
      WEFT_CUDA_TRY(cudaDeviceSynchronize());
      expect_close(std::string("own statistics") + (shift ? "" : ", mean kept"), dout.host(), want,
                   tol);
    }
    // Statistics of two halves (as two ranks), added on the host, whiten each half.
    std::size_t const h = n / 2;
    dbuf<weft::rl::whiten_stats> ds(std::size_t{2});
    rk::whiten_statistics<T, std::uint8_t>(nullptr, dv.p, dm.p, static_cast<std::int64_t>(h), ds.p);
    rk::whiten_statistics<T, std::uint8_t>(nullptr, dv.p + h, dm.p + h,
                                           static_cast<std::int64_t>(n - h), ds.p + 1);
    WEFT_CUDA_TRY(cudaDeviceSynchronize());
    auto const parts = ds.host();
    auto const cpu_a = weft::rl::whiten_statistics(std::span<T const>(v.data(), h),
                                                   std::span<std::uint8_t const>(m.data(), h));
    // Sums in double on both sides (of the same T values): a tree against a serial sum.
    CHECK(parts[0].count == cpu_a.count);
    CHECK(std::abs(parts[0].sum - cpu_a.sum) <= 1e-12 * std::max(1.0, std::abs(cpu_a.sum)));
    CHECK(std::abs(parts[0].sum_sq - cpu_a.sum_sq) <= 1e-12 * std::max(1.0, cpu_a.sum_sq));
    weft::rl::whiten_stats total;
    total.count = parts[0].count + parts[1].count;
    total.sum = parts[0].sum + parts[1].sum;
    total.sum_sq = parts[0].sum_sq + parts[1].sum_sq;
    dbuf<weft::rl::whiten_stats> dt(std::vector<weft::rl::whiten_stats>{total});
    weft::rl::masked_whiten(std::span<T const>(v), std::span<std::uint8_t const>(m),
                            std::span<T>(want), total);
    rk::masked_whiten<T, std::uint8_t>(nullptr, dv.p, dm.p, static_cast<std::int64_t>(n), dout.p,
                                       static_cast<weft::rl::whiten_stats const*>(dt.p));
    WEFT_CUDA_TRY(cudaDeviceSynchronize());
    expect_close("supplied statistics", dout.host(), want, tol);
  }
}
}  // namespace

TEST_CASE(
    "rl/cuda: masked whitening with its own and with supplied statistics follows the CPU (f64 "
    "and f32)") {
  if (!have_cuda_device()) return;
  whiten_against_cpu<double>(1e-12);
  whiten_against_cpu<float>(1e-6);
}

TEST_CASE("rl/cuda: bad rows, token counts and eps throw before any launch") {
  CHECK_THROWS_AS((void)rk::device_rows::padded(-1, 4), weft::invalid_argument_error);
  CHECK_THROWS_AS((void)rk::device_rows::padded(3, -4), weft::invalid_argument_error);
  CHECK_THROWS_AS((void)rk::device_rows::padded(std::int64_t{1} << 40, std::int64_t{1} << 40),
                  weft::invalid_argument_error);
  CHECK_THROWS_AS((void)rk::device_rows::packed(nullptr, 2, 10), weft::invalid_argument_error);
  CHECK_THROWS_AS((void)rk::device_rows::packed(nullptr, 0, -1), weft::invalid_argument_error);
  float* none = nullptr;
  std::uint8_t* no_mask = nullptr;
  CHECK_THROWS_AS(rk::masked_whiten<float>(nullptr, none, no_mask, -1, none),
                  weft::invalid_argument_error);
  CHECK_THROWS_AS(rk::masked_whiten<float>(nullptr, none, no_mask, 4, none, true, -1.0),
                  weft::invalid_argument_error);
  rk::device_rows bad;
  bad.rows = -3;
  CHECK_THROWS_AS(rk::gae_advantages<float>(nullptr, bad, none, none, no_mask, none, none),
                  weft::invalid_argument_error);
}
#endif  // __CUDACC__ && WEFT_HAS_CUDA_RUNTIME
