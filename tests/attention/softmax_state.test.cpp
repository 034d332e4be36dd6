// Tests of the softmax state and the log-sum-exp merge: partitions of the keys merged in any order
// and grouping equal the full attention (against the fp64 reference), identity and -inf cases, and
// no overflow when the two LSEs are far apart.
#include <weft/attention/flash.hpp>
#include <weft/attention/reference.hpp>
#include <weft/attention/softmax_state.hpp>

#include "attention_testing.hpp"

#include <doctest/doctest.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <limits>
#include <string_view>
#include <utility>
#include <vector>

namespace wa = weft::attention;
using namespace attention_testing;

namespace {
constexpr double ninf = -std::numeric_limits<double>::infinity();

struct partial {
  owned<double, 4> o;
  owned<double, 3> l;
};

// Attention of q against keys [j0, j1) only (non-causal): one partial block result.
partial block(owned<double, 4> const& q, owned<double, 4> const& k, owned<double, 4> const& v,
              std::int64_t j0, std::int64_t j1) {
  auto const B = q.extent(0), S = q.extent(1), H = q.extent(2), D = q.extent(3);
  auto const Hk = k.extent(2);
  auto ks = make_owned<double>(B, j1 - j0, Hk, D);
  auto vs = make_owned<double>(B, j1 - j0, Hk, D);
  for (std::int64_t b = 0; b < B; ++b)
    for (std::int64_t j = j0; j < j1; ++j)
      for (std::int64_t h = 0; h < Hk; ++h)
        for (std::int64_t c = 0; c < D; ++c) {
          ks.view()(b, j - j0, h, c) = k.view()(b, j, h, c);
          vs.view()(b, j - j0, h, c) = v.view()(b, j, h, c);
        }
  partial p{make_owned<double>(B, S, H, D), make_owned<double>(B, H, S)};
  wa::flash_forward(q.view(), ks.view(), vs.view(), p.o.view(), p.l.view());
  return p;
}

// acc <- acc ⊕ blk, row by row through lse_merge.
void merge_into(partial& acc, partial const& blk) {
  auto const B = acc.o.extent(0), S = acc.o.extent(1), H = acc.o.extent(2), D = acc.o.extent(3);
  for (std::int64_t b = 0; b < B; ++b)
    for (std::int64_t h = 0; h < H; ++h)
      for (std::int64_t i = 0; i < S; ++i)
        wa::lse_merge{}(&acc.o.view()(b, i, h, 0), acc.l.view()(b, h, i), &blk.o.view()(b, i, h, 0),
                        blk.l.view()(b, h, i), D);
}

partial empty_like(std::int64_t B, std::int64_t S, std::int64_t H, std::int64_t D) {
  return {filled_tensor<double>(0.0, B, S, H, D), filled_tensor<double>(ninf, B, H, S)};
}
}  // namespace

TEST_CASE("lse_merge: K-partitions merged in any order and grouping equal the full result") {
  std::int64_t const B = 2, S = 9, H = 4, Hk = 2, D = 8, Sk = 23;
  auto q = random_tensor<double>(1, 1.0, B, S, H, D);
  auto k = random_tensor<double>(2, 1.0, B, Sk, Hk, D);
  auto v = random_tensor<double>(3, 1.0, B, Sk, Hk, D);
  auto o_ref = make_owned<double>(B, S, H, D);
  auto l_ref = make_owned<double>(B, H, S);
  wa::reference_forward(q.view(), k.view(), v.view(), o_ref.view(), l_ref.view());

  std::vector<std::int64_t> const cuts{0, 5, 6, 14, 23};
  std::vector<partial> parts;
  for (std::size_t p = 0; p + 1 < cuts.size(); ++p)
    parts.push_back(block(q, k, v, cuts[p], cuts[p + 1]));

  SUBCASE("left to right, from the empty state") {
    auto acc = empty_like(B, S, H, D);
    for (auto const& p : parts) merge_into(acc, p);
    CHECK(compare(acc.o, o_ref).max_abs < 1e-14);
    CHECK(compare(acc.l, l_ref).max_abs < 1e-14);
  }
  SUBCASE("reverse order") {
    auto acc = empty_like(B, S, H, D);
    for (auto it = parts.rbegin(); it != parts.rend(); ++it) merge_into(acc, *it);
    CHECK(compare(acc.o, o_ref).max_abs < 1e-14);
    CHECK(compare(acc.l, l_ref).max_abs < 1e-14);
  }
  SUBCASE("tree grouping ((0 1) (2 3))") {
    auto left = empty_like(B, S, H, D), right = empty_like(B, S, H, D);
    merge_into(left, parts[1]);
    merge_into(left, parts[0]);
    merge_into(right, parts[2]);
    merge_into(right, parts[3]);
    merge_into(right, left);
    CHECK(compare(right.o, o_ref).max_abs < 1e-14);
    CHECK(compare(right.l, l_ref).max_abs < 1e-14);
  }
}

TEST_CASE("lse_merge: identity and -inf cases never give NaN") {
  double o[3] = {1.0, -2.0, 3.0};
  double l = 0.5;
  double const empty_o[3] = {0.0, 0.0, 0.0};
  SUBCASE("merging (0, -inf) is the identity") {
    wa::lse_merge{}(o, l, empty_o, ninf, 3);
    CHECK(o[0] == 1.0);
    CHECK(o[1] == -2.0);
    CHECK(o[2] == 3.0);
    CHECK(l == 0.5);
  }
  SUBCASE("an empty accumulator takes the block") {
    double acc[3] = {0.0, 0.0, 0.0};
    double la = ninf;
    wa::lse_merge{}(acc, la, o, l, 3);
    CHECK(acc[1] == -2.0);
    CHECK(la == 0.5);
  }
  SUBCASE("two -inf inputs give (0, -inf)") {
    double acc[3] = {0.0, 0.0, 0.0};
    double la = ninf;
    wa::lse_merge{}(acc, la, empty_o, ninf, 3);
    CHECK(la == ninf);
    CHECK(acc[0] == 0.0);
    CHECK_FALSE(std::isnan(acc[2]));
  }
  SUBCASE("f32 accumulator with a bf16 block") {
    float acc[2] = {1.0f, 1.0f};
    float la = 0.0f;
    weft::bf16 const blk[2] = {weft::bf16(3.0f), weft::bf16(-1.0f)};
    wa::lse_merge{}(acc, la, blk, 0.0f, 2);  // equal weights: the mean
    CHECK(acc[0] == doctest::Approx(2.0f));
    CHECK(acc[1] == doctest::Approx(0.0f));
    CHECK(la == doctest::Approx(std::log(2.0f)));
  }
}

TEST_CASE("lse_merge: |L - Lb| = 1e4 does not overflow; sigmoid form equals the log1p form") {
  for (double const gap : {1e4, -1e4, 30.0, -30.0, 1e-3, 0.0, 700.0}) {
    CAPTURE(gap);
    double o[1] = {2.0};
    double l = 1.0;
    double const ob[1] = {-4.0};
    double const lb = 1.0 + gap;
    wa::lse_merge{}(o, l, ob, lb, 1);
    CHECK(std::isfinite(o[0]));
    CHECK(std::isfinite(l));
    // log1p form: L' = max + log1p(exp(-|L - Lb|)); O' = w_a O + w_b Ob with weights exp(L - L').
    double const hi = std::max(1.0, lb), lo = std::min(1.0, lb);
    double const lp = hi + std::log1p(std::exp(lo - hi));
    double const op = std::exp(1.0 - lp) * 2.0 + std::exp(lb - lp) * -4.0;
    CHECK(l == doctest::Approx(lp).epsilon(1e-15));
    CHECK(o[0] == doctest::Approx(op).epsilon(1e-12));
  }
  // f32 at the same gap
  float of[1] = {2.0f};
  float lf = 0.0f;
  float const obf[1] = {1.0f};
  wa::lse_merge{}(of, lf, obf, 1e4f, 1);
  CHECK(lf == 1e4f);
  CHECK(of[0] == 1.0f);
}

TEST_CASE("softmax_row_state: online updates equal the one-pass softmax; empty rows stay -inf") {
  std::vector<double> const scores{0.3, -1.0, 5.0, ninf, 2.5, -7.0, 4.0};
  wa::softmax_row_state<double> st;
  double weighted = 0;  // sum_j exp(s_j - m) * j, rescaled as the kernel does
  for (std::size_t t = 0; t < scores.size(); t += 2) {
    double mx = ninf;
    for (std::size_t j = t; j < std::min(t + 2, scores.size()); ++j) mx = std::max(mx, scores[j]);
    weighted *= st.rescale(mx);
    for (std::size_t j = t; j < std::min(t + 2, scores.size()); ++j) {
      double const p = st.weight(scores[j]);
      st.l += p;
      weighted += p * double(j);
    }
  }
  double sum = 0, ref_weighted = 0;
  for (std::size_t j = 0; j < scores.size(); ++j)
    if (scores[j] != ninf) {
      sum += std::exp(scores[j]);
      ref_weighted += std::exp(scores[j]) * double(j);
    }
  CHECK(st.lse() == doctest::Approx(std::log(sum)).epsilon(1e-15));
  CHECK(weighted * st.inv_sum() == doctest::Approx(ref_weighted / sum).epsilon(1e-14));

  wa::softmax_row_state<float> empty;
  CHECK(empty.rescale(-std::numeric_limits<float>::infinity()) == 1.0f);
  CHECK(empty.weight(-std::numeric_limits<float>::infinity()) == 0.0f);
  CHECK(empty.lse() == -std::numeric_limits<float>::infinity());
  CHECK(empty.inv_sum() == 0.0f);
  CHECK(wa::recompute_probability(1.0f, -std::numeric_limits<float>::infinity()) == 0.0f);
}

TEST_CASE(
    "exp_shifted (weft::exp_fn over a score row: blocks of eight, scalar tail) is within 2 ulp of "
    "libm on every ISA level; -inf gives 0") {
  namespace ad = weft::attention::detail;
  std::vector<float> xs;
  for (int i = 0; i <= 200000; ++i) xs.push_back(-90.0f * float(i) / 200000.0f);
  xs.push_back(-std::numeric_limits<float>::infinity());
  xs.push_back(-0.0f);
  xs.push_back(1e-7f);  // rounding noise above the max: exp_fn gives e^(1e-7), not a clamped 1
  while (xs.size() % 8 != 3) xs.push_back(-1.5f);  // leave a scalar tail too
  auto const n = std::int64_t(xs.size());
  // The baseline build of the row loop, and every wider ISA it is compiled for (they differ from
  // it only by FMA contraction of the polynomial).
  std::vector<std::pair<char const*, std::vector<float>>> runs;
  runs.emplace_back("baseline", xs);
  ad::exp_shifted_body(runs.back().second.data(), n, 0.0f);
  runs.emplace_back("dispatched", xs);
  ad::exp_shifted(runs.back().second.data(), n, 0.0f);
#if WEFT_MULTIVERSION
  if (weft::detail::host_simd_level() >= weft::detail::simd_level::avx2) {
    runs.emplace_back("avx2", xs);
    ad::exp_shifted_avx2(runs.back().second.data(), n, 0.0f);
  }
  if (weft::detail::host_simd_level() >= weft::detail::simd_level::avx512) {
    runs.emplace_back("avx512", xs);
    ad::exp_shifted_avx512(runs.back().second.data(), n, 0.0f);
  }
#endif
  for (auto const& run : runs) {
    // Not a structured binding: INFO's lambda cannot capture one before clang 16.
    char const* const what = run.first;
    auto const& ys = run.second;
    INFO(what);
    int worst = 0;
    for (std::size_t i = 0; i < xs.size(); ++i) {
      float const x = xs[i];
      float const want = static_cast<float>(std::exp(static_cast<double>(x)));
      float const scalar = weft::exp_fn{}(x);
      CAPTURE(x);
      if (want < std::numeric_limits<float>::min()) {  // exp_fn flushes results below 2^-126 to 0
        CHECK(scalar == 0.0f);
        CHECK(ys[i] == 0.0f);
        continue;
      }
      auto ulps = [&](float a, float b) {
        return std::abs(int(std::bit_cast<std::int32_t>(a)) - int(std::bit_cast<std::int32_t>(b)));
      };
      worst = std::max({worst, ulps(scalar, want), ulps(ys[i], want)});
      // The baseline's vectorised blocks do exactly the scalar steps; wider ISAs may contract.
      if (std::string_view(what) == "baseline")
        CHECK(ys[i] == scalar);
      else
        CHECK(ulps(ys[i], scalar) <= 1);
    }
    CHECK(worst <= 2);
  }
  std::vector<double> yd = {-std::numeric_limits<double>::infinity(), -1.0, 0.0};
  weft::attention::detail::exp_shifted(yd.data(), std::int64_t(yd.size()), 0.0);
  CHECK(yd[0] == 0.0);
  CHECK(yd[1] == doctest::Approx(std::exp(-1.0)).epsilon(1e-15));
  CHECK(yd[2] == 1.0);
}
