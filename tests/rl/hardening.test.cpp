// Tests of issue 9 (hardening) for weft/rl: non-finite logits and log-probs, temperature range,
// zero-variance groups with eps = 0, verl's names (aggregation modes, singleton groups, metrics),
// vocabulary shards that do not tile, global counts smaller than the local ones, overflowing
// sizes. Each compares against an independent reference (a naive formula or the masked batch).
#include "support/checks.hpp"
#include <support/run_ranks.hpp>
#include <weft/comm/threads/communicator.hpp>
#include <weft/rl/rl.hpp>

#include <doctest/doctest.h>

#include <atomic>
#include <cmath>
#include <cstdint>
#include <limits>
#include <random>
#include <vector>

namespace {
using weft::index_t;
using weft::rl::logprob_options;
using weft::rl::loss_agg;
using weft::rl::policy_loss_config;
using weft::rl::policy_loss_kind;
using weft::rl::token_layout;
using u8 = std::uint8_t;
using weft::test::inf;

// Naive dlogits of one row in long double: (g (1[v=o] - p_v) - gH p_v (log p_v + H)) / tau, with
// the limit 0 where p_v = 0.
std::vector<long double> naive_dlogits(std::vector<double> const& z, std::int64_t o, double tau,
                                       double g, double gh) {
  long double mx = -INFINITY;
  for (double x : z) mx = std::max(mx, (long double)x / tau);
  long double s = 0;
  for (double x : z) s += std::exp((long double)x / tau - mx);
  long double const lse = mx + std::log(s);
  long double h = 0;
  for (double x : z)
    if (!std::isinf(x)) h -= std::exp((long double)x / tau - lse) * ((long double)x / tau - lse);
  std::vector<long double> d(z.size());
  for (std::size_t v = 0; v < z.size(); ++v) {
    long double const lp = (long double)z[v] / tau - lse;
    long double const p = std::isinf(z[v]) ? 0.0L : std::exp(lp);
    d[v] = (g * ((long double)(static_cast<std::int64_t>(v) == o) - p) -
            (p == 0 ? 0.0L : gh * p * (lp + h))) /
           tau;
  }
  return d;
}

template <class L>
void check_neg_inf_gradient() {
  index_t const V = 7;
  std::vector<double> const zd = {1.0, -inf, 0.5, -inf, -2.0, 3.0, -inf};
  std::vector<L> z;
  for (double x : zd) z.push_back(static_cast<L>(x));
  std::vector<std::int64_t> const tgt = {2};
  logprob_options const opt{0.7, -100};
  // |dL/dH| > 1 is what overflowed lowest * g_ent into inf, then 0 * inf = NaN.
  for (double gh : {5.0, -3.0, 1e30}) {
    CAPTURE(gh);
    std::vector<L> lp(1), h(1), lse(1), dz(z.size(), L(7)), dzf(z.size(), L(7));
    std::vector<L> const g = {L(2)}, ge = {static_cast<L>(gh)};
    weft::rl::log_prob_forward(std::span<L const>(z), V, std::span<std::int64_t const>(tgt), opt,
                               std::span<L>(lp), std::span<L>(h), std::span<L>(lse));
    weft::rl::log_prob_backward(std::span<L const>(z), V, std::span<std::int64_t const>(tgt), opt,
                                std::span<L const>(lse), std::span<L const>(h),
                                std::span<L const>(g), std::span<L const>(ge), std::span<L>(dz));
    weft::rl::log_prob_fused(
        std::span<L const>(z), V, std::span<std::int64_t const>(tgt), opt, std::span<L>(lp),
        std::span<L>(h),
        [&](index_t, L, L) {
          return weft::rl::logprob_grads{2.0, gh};
        },
        std::span<L>(dzf));
    auto const want = naive_dlogits(zd, 2, 0.7, 2.0, gh);
    long double row_max = 0;
    for (auto x : want) row_max = std::max(row_max, std::abs(x));
    for (std::size_t v = 0; v < z.size(); ++v) {
      CAPTURE(v);
      if (std::isinf(zd[v])) {
        CHECK(dz[v] == L(0));
        CHECK(dzf[v] == L(0));
      } else {
        long double const tol = (sizeof(L) == 4 ? 1e-5L : 1e-12L) * row_max;
        CHECK(std::abs((long double)dz[v] - want[v]) <= tol);
        CHECK(std::abs((long double)dzf[v] - want[v]) <= tol);
      }
    }
  }
}

// Policy inputs of a small batch with one token whose new and old log-probs are both -inf.
struct small_batch {
  token_layout layout = token_layout::padded(2, 4);
  std::vector<double> logp = {-0.5, -inf, -1.2, -0.3, -0.9, -0.1, -2.0, -0.7};
  std::vector<double> old = {-0.6, -inf, -1.0, -0.35, -0.8, -0.2, -1.7, -0.75};
  std::vector<double> adv = {1.0, 1.0, 1.0, 1.0, -0.5, -0.5, -0.5, -0.5};
  std::vector<u8> mask = {1, 1, 1, 1, 1, 1, 1, 0};
  std::vector<double> w = std::vector<double>(8, 1.0 / 7);

  weft::rl::policy_loss_result run(policy_loss_config const& cfg, std::vector<u8> const& m,
                                   std::vector<double>& g) const {
    g.assign(logp.size(), 9.0);
    return weft::rl::policy_loss(
        cfg, layout,
        weft::rl::policy_inputs<double, u8>{
            weft::rl::arg::new_logp{logp}, weft::rl::arg::old_logp{old},
            weft::rl::arg::advantages{adv}, weft::rl::arg::mask{m}, weft::rl::arg::weights{w}},
        g);
  }
};

}  // namespace

TEST_CASE(
    "issue 9.1: dlogits at -inf logits are exactly 0 for any finite upstream gradient (f32, f64, "
    "fused)") {
  check_neg_inf_gradient<float>();
  check_neg_inf_gradient<double>();
}

TEST_CASE(
    "issue 9.1: logit_grad, the functor the CUDA kernel runs, gives 0 at -inf with a large entropy "
    "gradient") {
  weft::rl::logit_grad<float> const fn{1.0f, 0.0f, 0.5f, 1.0f, 4.0f, 1.0f};
  CHECK(fn(-std::numeric_limits<float>::infinity()) == 0.0f);
  CHECK(std::isfinite(fn(0.0f)));
}

TEST_CASE(
    "issue 9.2: a token with new and old log-prob -inf is dropped: finite loss and gradient, as if "
    "masked") {
  small_batch b;
  std::vector<u8> masked = b.mask;
  masked[1] = 0;
  for (auto kind : {policy_loss_kind::ppo_clip, policy_loss_kind::gspo, policy_loss_kind::cispo,
                    policy_loss_kind::reinforce}) {
    CAPTURE(weft::rl::to_string(kind));
    policy_loss_config cfg;
    cfg.kind = kind;
    std::vector<double> g, gm;
    auto const r = b.run(cfg, b.mask, g);
    auto const rm = b.run(cfg, masked, gm);
    CHECK(std::isfinite(r.loss));
    CHECK(r.loss == doctest::Approx(rm.loss).epsilon(1e-15));
    for (std::size_t k = 0; k < g.size(); ++k) {
      CHECK(std::isfinite(g[k]));
      CHECK(g[k] == doctest::Approx(gm[k]).epsilon(1e-15));
    }
    CHECK(g[1] == 0.0);
    CHECK(r.metrics.tokens == rm.metrics.tokens);
    CHECK(r.metrics.ratio_sum == doctest::Approx(rm.metrics.ratio_sum));
    CHECK(std::isfinite(r.metrics.approx_kl()));
  }
  SUBCASE(
      "cispo and reinforce at l = -inf with a finite l_old: -A l is infinite, so the token is "
      "dropped") {
    b.old[1] = -3.0;
    for (auto kind : {policy_loss_kind::cispo, policy_loss_kind::reinforce}) {
      policy_loss_config cfg;
      cfg.kind = kind;
      std::vector<double> g, gm;
      auto const r = b.run(cfg, b.mask, g);
      auto const rm = b.run(cfg, masked, gm);
      CHECK(std::isfinite(r.loss));
      CHECK(r.loss == doctest::Approx(rm.loss).epsilon(1e-15));
      CHECK(g[1] == 0.0);
    }
  }
  SUBCASE("the CUDA kernel's functors return 0 loss and gradient for the dropped token") {
    auto const p =
        weft::rl::ppo_clip_token<float>{0.2f, 0.28f, 3.0f, 20.0f}(-INFINITY, -INFINITY, 1.0f);
    CHECK(p.loss == 0.0f);
    CHECK(p.grad == 0.0f);
    CHECK((p.flags & weft::rl::pg_dropped) != 0u);
    auto const c = weft::rl::cispo_token<float>{0.2f, 0.28f, 20.0f}(-INFINITY, -1.0f, 1.0f);
    CHECK(c.loss == 0.0f);
    CHECK(c.grad == 0.0f);
  }
}

TEST_CASE("issue 9.2: KL estimators at l = l_ref = -inf contribute 0 (k3 was NaN)") {
  std::vector<double> const lp = {-inf, -0.5}, ref = {-inf, -0.7};
  std::vector<u8> const m = {1, 1};
  std::vector<double> const w = {0.5, 0.5};
  for (auto kind :
       {weft::rl::kl_kind::k1, weft::rl::kl_kind::abs, weft::rl::kl_kind::k2, weft::rl::kl_kind::k3,
        weft::rl::kl_kind::k1_plus, weft::rl::kl_kind::k3_plus}) {
    CAPTURE(weft::rl::to_string(kind));
    auto const r = weft::rl::kl_token<double>{kind}(-inf, -inf);
    CHECK(r.value == 0.0);
    CHECK(r.grad == 0.0);
    std::vector<double> g(2, 0.0);
    double const l =
        weft::rl::kl_loss(kind, 1.0, std::span<double const>(lp), std::span<double const>(ref),
                          std::span<u8 const>(m), std::span<double const>(w), std::span<double>(g));
    auto const only = weft::rl::kl_token<double>{kind}(-0.5, -0.7);
    CHECK(l == doctest::Approx(0.5 * only.value));
    CHECK(g[0] == 0.0);
  }
  std::vector<double> g(2, 0.0);
  double const l = weft::rl::kl_is_corrected_loss(
      1.0, std::span<double const>(lp), std::span<double const>(lp), std::span<double const>(ref),
      std::span<u8 const>(m), std::span<double const>(w), std::span<double>(g));
  CHECK(std::isfinite(l));
  CHECK(g[0] == 0.0);
}

TEST_CASE(
    "issue 9.3: a NaN or +inf logit gives NaN log-prob, entropy and lse (not -inf, 0), and NaN "
    "dlogits") {
  index_t const V = 5;
  float const nan = std::numeric_limits<float>::quiet_NaN();
  float const pinf = std::numeric_limits<float>::infinity();
  // Row 0: +inf; row 1: NaN; row 2: NaN in the first place (wins or loses the max tree);
  // row 3: finite; row 4: all -inf (documented: logp -inf, H 0).
  std::vector<float> z = {0.f, pinf, 1.f, 2.f, 3.f, 0.f, 1.f, nan,   2.f,   3.f,   nan,   1.f,  2.f,
                          3.f, 4.f,  0.f, 1.f, 2.f, 3.f, 4.f, -pinf, -pinf, -pinf, -pinf, -pinf};
  std::vector<std::int64_t> const tgt = {0, 0, 1, 2, 3};
  std::vector<float> lp(5), h(5), lse(5);
  weft::rl::log_prob_forward(std::span<float const>(z), V, std::span<std::int64_t const>(tgt), {},
                             std::span<float>(lp), std::span<float>(h), std::span<float>(lse));
  for (std::size_t k = 0; k < 3; ++k) {
    CAPTURE(k);
    CHECK(std::isnan(lp[k]));
    CHECK(std::isnan(h[k]));
    CHECK(std::isnan(lse[k]));
  }
  CHECK(std::isfinite(lp[3]));
  CHECK(lp[4] == -pinf);
  CHECK(h[4] == 0.0f);
  std::vector<float> const g = {1, 1, 1, 1, 1}, zero = {0, 0, 1, 1, 1};
  std::vector<float> dz(z.size()), dz0(z.size());
  weft::rl::log_prob_backward(std::span<float const>(z), V, std::span<std::int64_t const>(tgt), {},
                              std::span<float const>(lse), std::span<float const>(h),
                              std::span<float const>(g), {}, std::span<float>(dz));
  for (index_t v = 0; v < V; ++v) CHECK(std::isnan(dz[static_cast<std::size_t>(v)]));
  // A zero upstream gradient still gives a zero row: the token does not enter the loss.
  weft::rl::log_prob_backward(std::span<float const>(z), V, std::span<std::int64_t const>(tgt), {},
                              std::span<float const>(lse), std::span<float const>(h),
                              std::span<float const>(zero), {}, std::span<float>(dz0));
  for (index_t v = 0; v < V; ++v) CHECK(dz0[static_cast<std::size_t>(v)] == 0.0f);
  // Large rows go through the chunked, saved-exponential fused path.
  index_t const big = 5000;
  std::vector<float> zb(static_cast<std::size_t>(2 * big), 0.5f);
  zb[4097] = pinf;
  zb[static_cast<std::size_t>(big) + 2] = nan;
  std::vector<std::int64_t> const tb = {3, 3};
  std::vector<float> lpb(2), hb(2), dzb(zb.size());
  weft::rl::log_prob_fused(
      std::span<float const>(zb), big, std::span<std::int64_t const>(tb), {}, std::span<float>(lpb),
      std::span<float>(hb),
      [](index_t, float, float) {
        return weft::rl::logprob_grads{1.0, 0.0};
      },
      std::span<float>(dzb));
  CHECK(std::isnan(lpb[0]));
  CHECK(std::isnan(lpb[1]));
  CHECK(std::isnan(dzb[0]));
  // The functors of the CUDA kernel poison the same way.
  weft::softmax_stats<float> s{};
  s = weft::softmax_push{}(s, 1.0f);
  auto const bad = weft::softmax_push{}(s, pinf);
  CHECK(std::isnan(weft::softmax_finish{}.lse(bad)));
  CHECK(std::isnan(weft::softmax_finish{}.lse(weft::softmax_merge{}(s, bad))));
  CHECK(std::isnan(weft::softmax_finish{}.lse(weft::softmax_merge{}(bad, s))));
  CHECK(std::isnan(weft::softmax_finish{}.lse(weft::softmax_push{}(bad, 2.0f))));
  CHECK(std::isnan(weft::softmax_finish{}.lse(weft::softmax_push{}(s, nan))));
}

TEST_CASE(
    "issue 9.3: a temperature whose inverse is not a finite normal of the compute type is "
    "rejected") {
  std::vector<float> z(4, 0.0f), lp(1), h(1);
  std::vector<std::int64_t> const t = {1};
  for (double tau : {1e-39, 1e-300, 1e300}) {
    CAPTURE(tau);
    CHECK_THROWS_AS(
        weft::rl::log_prob_forward(std::span<float const>(z), 4, std::span<std::int64_t const>(t),
                                   {tau, -100}, std::span<float>(lp), std::span<float>(h)),
        weft::invalid_argument_error);
  }
  // f64 logits compute in f64, where 1/1e-39 is fine.
  std::vector<double> zd = {0.0, 1e-40, 0.0, 0.0}, lpd(1), hd(1);
  weft::rl::log_prob_forward(std::span<double const>(zd), 4, std::span<std::int64_t const>(t),
                             {1e-39, -100}, std::span<double>(lpd), std::span<double>(hd));
  CHECK(lpd[0] == doctest::Approx(std::log(std::exp(0.1) / (3 + std::exp(0.1)))));
  CHECK_THROWS_AS(
      weft::rl::log_prob_forward(std::span<double const>(zd), 4, std::span<std::int64_t const>(t),
                                 {1e-320, -100}, std::span<double>(lpd), std::span<double>(hd)),
      weft::invalid_argument_error);
}

TEST_CASE("issue 9.4: GRPO with eps = 0 gives exactly 0 for a zero-variance group, not NaN") {
  std::vector<double> const r = {0.1, 0.1, 0.1, 1.0, 0.0, 0.3, 0.3};
  std::vector<std::int64_t> const ids = {0, 0, 0, 1, 1, 2, 2};
  auto const groups = weft::rl::group_layout::by_id(ids);
  for (double eps : {0.0, 1e-6}) {
    CAPTURE(eps);
    std::vector<double> a(r.size(), 7.0);
    weft::rl::grpo_advantages(std::span<double const>(r), groups, std::span<double>(a),
                              {true, eps});
    for (int i : {0, 1, 2, 5, 6}) CHECK(a[static_cast<std::size_t>(i)] == 0.0);
    double const sd = std::sqrt(0.5);  // unbiased std of {1, 0}
    CHECK(a[3] == doctest::Approx(0.5 / (sd + eps)));
    CHECK(a[4] == doctest::Approx(-0.5 / (sd + eps)));
  }
  std::vector<double> a(r.size(), 7.0);
  weft::rl::dr_grpo_advantages(std::span<double const>(r), groups, std::span<double>(a));
  CHECK(a[0] == 0.0);
  weft::rl::rloo_advantages(std::span<double const>(r), groups, std::span<double>(a));
  CHECK(a[1] == 0.0);
}

TEST_CASE(
    "issue 9.5: verl's seq-mean-token-sum-norm divides by the constant only; Dr. GRPO's also by "
    "B") {
  auto const layout = token_layout::padded(3, 3);
  std::vector<double> const loss = {1, 2, 0, 3, 4, 5, 7, 0, 0};
  std::vector<u8> const mask = {1, 1, 0, 1, 1, 1, 1, 0, 0};
  auto const counts = weft::rl::count_tokens(layout, std::span<u8 const>(mask));
  std::vector<double> w(9);
  // verl agg_loss: sum(seq_losses) / loss_scale_factor, the factor defaulting to the padded length
  // T.
  double verl = 0;
  for (std::size_t k = 0; k < 9; ++k) verl += mask[k] ? loss[k] : 0.0;
  verl /= 3.0;
  CHECK(weft::rl::loss_agg_from_verl("seq-mean-token-sum-norm") == loss_agg::verl_token_sum_norm);
  weft::rl::aggregation_weights(weft::rl::loss_agg_from_verl("seq-mean-token-sum-norm"), layout,
                                std::span<u8 const>(mask), counts, std::span<double>(w), 3.0);
  CHECK(weft::rl::weighted_sum(std::span<double const>(loss), std::span<double const>(w)) ==
        doctest::Approx(verl));
  weft::rl::aggregation_weights(loss_agg::dr_grpo_norm, layout, std::span<u8 const>(mask), counts,
                                std::span<double>(w), 3.0);
  CHECK(weft::rl::weighted_sum(std::span<double const>(loss), std::span<double const>(w)) ==
        doctest::Approx(verl / counts.sequences));
  CHECK(weft::rl::to_string(loss_agg::verl_token_sum_norm) !=
        weft::rl::to_string(loss_agg::dr_grpo_norm));
  CHECK(weft::rl::loss_agg_from_verl("token-mean") == loss_agg::token_mean);
  CHECK(weft::rl::loss_agg_from_verl("seq-mean-token-mean") == loss_agg::seq_mean_token_mean);
  CHECK(weft::rl::loss_agg_from_verl("seq-mean-token-sum") == loss_agg::seq_mean_token_sum);
  CHECK_THROWS_AS((void)weft::rl::loss_agg_from_verl("seq-mean-token-norm"),
                  weft::invalid_argument_error);
}

TEST_CASE(
    "issue 9.5: REINFORCE++-baseline and OPO take the singleton-group policy (verl: A = R before "
    "whitening)") {
  // Rows: a group of two and a singleton; one token per row except the singleton's two.
  std::vector<double> const scores = {1.0, 0.0, 2.0};
  std::vector<std::int64_t> const ids = {0, 0, 1};
  auto const layout = token_layout::packed(std::vector<int>{0, 1, 2, 4});
  std::vector<u8> const mask = {1, 1, 1, 1};
  auto whiten = [](std::vector<double> v) {  // verl masked_whiten over all (valid) tokens
    double mean = 0;
    for (double x : v) mean += x;
    mean /= double(v.size());
    double var = 0;
    for (double x : v) var += (x - mean) * (x - mean);
    var /= double(v.size() - 1);
    for (double& x : v) x = (x - mean) / std::sqrt(var + 1e-8);
    return v;
  };
  for (auto sg : {weft::rl::singleton_group::zero, weft::rl::singleton_group::keep_score}) {
    double const single = sg == weft::rl::singleton_group::zero ? 0.0 : 2.0;
    auto const want = whiten({0.5, -0.5, single, single});
    std::vector<double> out(4);
    weft::rl::reinforce_pp_baseline_advantages(
        layout, std::span<double const>(scores), weft::rl::group_layout::by_id(ids),
        std::span<u8 const>(mask), std::span<double>(out), sg);
    for (std::size_t k = 0; k < 4; ++k) CHECK(out[k] == doctest::Approx(want[k]));
    std::vector<double> const len = {3, 1, 2};
    std::vector<double> a(3);
    weft::rl::opo_advantages(std::span<double const>(scores), std::span<double const>(len),
                             weft::rl::group_layout::by_id(ids), std::span<double>(a), sg);
    double const b = (3 * 1.0 + 1 * 0.0) / 4;
    CHECK(a[0] == doctest::Approx(1.0 - b));
    CHECK(a[1] == doctest::Approx(0.0 - b));
    CHECK(a[2] == single);
  }
}

TEST_CASE(
    "issue 9.5: verl's pg_clipfrac, pg_clipfrac_lower and ppo_kl (clamped) and the unclamped "
    "ppo_kl") {
  std::mt19937_64 gen(9);
  std::normal_distribution<double> nd(0, 1);
  std::size_t const n = 400;
  std::vector<double> lp(n), old(n), adv(n), w(n, 1.0 / double(n));
  std::vector<u8> mask(n, 1);
  for (std::size_t k = 0; k < n; ++k) {
    lp[k] = -std::abs(nd(gen));
    old[k] = lp[k] - 0.6 * nd(gen);
    adv[k] = nd(gen);
  }
  old[5] = lp[5] + 30;  // beyond the +-20 clamp
  old[6] = lp[6] - 25;
  double const el = 0.2, eh = 0.28, c = 3.0;
  // verl compute_policy_loss_vanilla, line by line.
  double clipfrac = 0, lower = 0, ppo_kl = 0, raw = 0;
  for (std::size_t k = 0; k < n; ++k) {
    double const nak = std::clamp(lp[k] - old[k], -20.0, 20.0);
    double const r = std::exp(nak);
    double const l1 = -adv[k] * r, l2 = -adv[k] * std::clamp(r, 1 - el, 1 + eh);
    double const cl1 = std::max(l1, l2);
    clipfrac += l2 > l1;
    lower += (cl1 > -adv[k] * c) && adv[k] < 0;
    ppo_kl += -nak;
    raw += old[k] - lp[k];
  }
  std::vector<double> g(n);
  policy_loss_config cfg;
  auto const res = weft::rl::policy_loss(
      cfg, token_layout::padded(1, static_cast<index_t>(n)),
      weft::rl::policy_inputs<double, u8>{weft::rl::arg::new_logp{lp}, weft::rl::arg::old_logp{old},
                                          weft::rl::arg::advantages{adv}, weft::rl::arg::mask{mask},
                                          weft::rl::arg::weights{w}},
      g);
  CHECK(res.metrics.pg_clipfrac() == doctest::Approx(clipfrac / double(n)));
  CHECK(res.metrics.pg_clipfrac_lower() == doctest::Approx(lower / double(n)));
  CHECK(res.metrics.ppo_kl() == doctest::Approx(ppo_kl / double(n)));
  CHECK(res.metrics.approx_kl_unclamped() == doctest::Approx(raw / double(n)));
  CHECK(res.metrics.approx_kl_unclamped() != doctest::Approx(res.metrics.ppo_kl()));
}

TEST_SUITE("threads") {
  TEST_CASE(
      "issue 9.6: vocabulary shards that leave a gap, overlap or disagree on V throw on every "
      "rank") {
    index_t const V = 10;
    std::size_t const n = 3;
    std::vector<std::int64_t> const tgt = {0, 5, 9};
    using shard = weft::rl::vocab_shard;
    struct plan {
      char const* what;
      std::vector<shard> shards;
      bool ok;
    };
    std::vector<plan> const plans = {
        {"gap", {{0, 3, V}, {4, 2, V}, {6, 4, V}}, false},
        {"overlap", {{0, 4, V}, {3, 3, V}, {6, 4, V}}, false},
        {"vocab disagrees", {{0, 3, V}, {3, 3, V}, {6, 4, 11}}, false},
        {"short", {{0, 3, V}, {3, 3, V}, {6, 3, V}}, false},
        {"duplicate", {{0, 5, V}, {0, 5, V}, {5, 5, V}}, false},
        {"tiles in another rank order", {{6, 4, V}, {0, 3, V}, {3, 3, V}}, true},
        {"an empty shard", {{0, 6, V}, {6, 0, V}, {6, 4, V}}, true},
    };
    std::mt19937_64 gen(6);
    std::normal_distribution<float> nd(0, 2);
    std::vector<float> z(n * static_cast<std::size_t>(V));
    for (auto& x : z) x = nd(gen);
    std::vector<float> lp(n), h(n);
    weft::rl::log_prob_forward(std::span<float const>(z), V, std::span<std::int64_t const>(tgt), {},
                               std::span<float>(lp), std::span<float>(h));
    for (auto const& pl : plans) {
      CAPTURE(pl.what);
      std::atomic<int> threw{0};
      std::vector<std::vector<float>> got(3);
      weft::test::run_ranks(3, [&](weft::comm::threads::communicator& c) {
        auto const sh = pl.shards[static_cast<std::size_t>(c.rank())];
        std::vector<float> local(n * static_cast<std::size_t>(sh.size));
        for (std::size_t k = 0; k < n; ++k)
          for (index_t j = 0; j < sh.size; ++j)
            local[k * static_cast<std::size_t>(sh.size) + static_cast<std::size_t>(j)] =
                z[k * static_cast<std::size_t>(V) +
                  static_cast<std::size_t>(std::min(sh.begin + j, V - 1))];
        std::vector<float> l(n, 42.0f), e(n, 42.0f);
        try {
          weft::rl::vocab_parallel_log_prob_forward(c, std::span<float const>(local), sh,
                                                    std::span<std::int64_t const>(tgt), {},
                                                    std::span<float>(l), std::span<float>(e));
        } catch (weft::invalid_argument_error const&) {
          ++threw;
          for (float x : l) CHECK(x == 42.0f);  // nothing written
        }
        got[static_cast<std::size_t>(c.rank())] = l;
      });
      CHECK(threw.load() == (pl.ok ? 0 : 3));
      if (pl.ok)
        for (auto const& l : got)
          for (std::size_t k = 0; k < n; ++k) CHECK(l[k] == doctest::Approx(lp[k]).epsilon(1e-6));
    }
  }

  TEST_CASE(
      "issue 9.3: a NaN logit on one rank gives NaN outputs on every rank of the "
      "vocabulary-parallel forward") {
    index_t const V = 8;
    std::vector<std::int64_t> const tgt = {1, 6};
    std::vector<int> nan_count(2, 0);
    weft::test::run_ranks(2, [&](weft::comm::threads::communicator& c) {
      auto const sh = weft::rl::vocab_shard::even(V, 2, c.rank());
      std::vector<float> local(2 * static_cast<std::size_t>(sh.size), 0.25f);
      if (c.rank() == 1) local[0] = std::numeric_limits<float>::quiet_NaN();  // token 0 only
      std::vector<float> l(2), e(2);
      weft::rl::vocab_parallel_log_prob_forward(c, std::span<float const>(local), sh,
                                                std::span<std::int64_t const>(tgt), {},
                                                std::span<float>(l), std::span<float>(e));
      nan_count[static_cast<std::size_t>(c.rank())] =
          std::isnan(l[0]) + std::isnan(e[0]) + std::isnan(l[1]);
    });
    CHECK(nan_count[0] == 2);
    CHECK(nan_count[1] == 2);
  }
}  // TEST_SUITE

TEST_CASE("issue 9.8: aggregation_weights rejects global counts smaller than the batch's own") {
  auto const layout = token_layout::padded(2, 3);
  std::vector<u8> const mask = {1, 1, 0, 1, 0, 0};
  auto const local = weft::rl::count_tokens(layout, std::span<u8 const>(mask));
  std::vector<double> w(6, 5.0);
  for (auto mode :
       {loss_agg::token_mean, loss_agg::seq_mean_token_mean, loss_agg::seq_mean_token_sum,
        loss_agg::dr_grpo_norm, loss_agg::verl_token_sum_norm}) {
    CAPTURE(weft::rl::to_string(mode));
    w.assign(6, 5.0);
    for (auto bad : {weft::rl::batch_counts{0, 0}, weft::rl::batch_counts{2, 2},
                     weft::rl::batch_counts{3, 1}, weft::rl::batch_counts{inf, 2}}) {
      CHECK_THROWS_AS(weft::rl::aggregation_weights(mode, layout, std::span<u8 const>(mask), bad,
                                                    std::span<double>(w), 4.0),
                      weft::invalid_argument_error);
      for (double x : w) CHECK(x == 5.0);
    }
    weft::rl::aggregation_weights(mode, layout, std::span<u8 const>(mask),
                                  local + weft::rl::batch_counts{4, 1}, std::span<double>(w), 4.0);
    CHECK(w[0] > 0.0);
  }
}

TEST_CASE(
    "issue 9.10: tokens x vocab that overflows int64 is a shape_error, not a wrapped product") {
  std::vector<float> z;
  std::vector<std::int64_t> const tgt = {0, 0, 0, 0};
  std::vector<float> lp(4), h(4);
  index_t const huge = index_t{1} << 62;  // 4 * 2^62 wraps to 0 == z.size()
  CHECK_THROWS_AS(weft::rl::log_prob_forward(std::span<float const>(z), huge,
                                             std::span<std::int64_t const>(tgt), {},
                                             std::span<float>(lp), std::span<float>(h)),
                  weft::shape_error);
  CHECK_THROWS_AS((void)token_layout::padded(huge, 4), weft::shape_error);
  weft::rl::vocab_shard const bad{index_t{1} << 40, std::numeric_limits<index_t>::max(),
                                  index_t{1} << 41};
  CHECK_THROWS_AS(bad.validate(), weft::invalid_argument_error);  // begin + size overflowed
}

namespace {
namespace arg = weft::rl::arg;
template <class... A>
concept makes_inputs = requires(A&... a) {
  weft::rl::policy_inputs<double, u8>{a...};
};
using dvec = std::vector<double>;
// The named fields compile in their order; plain arrays, or new and old swapped (verl's order),
// do not.
static_assert(makes_inputs<arg::new_logp<double>, arg::old_logp<double>, arg::advantages<double>,
                           arg::mask<u8>, arg::weights<double>>);
static_assert(!makes_inputs<arg::old_logp<double>, arg::new_logp<double>, arg::advantages<double>,
                            arg::mask<u8>, arg::weights<double>>);
static_assert(!makes_inputs<dvec, dvec, dvec, std::vector<u8>, dvec>);
static_assert(!makes_inputs<arg::new_logp<double>, arg::old_logp<double>, arg::weights<double>,
                            arg::mask<u8>, arg::advantages<double>>);
static_assert(!std::is_convertible_v<dvec&, arg::new_logp<double>>);
static_assert(!std::is_constructible_v<arg::new_logp<double>, arg::old_logp<double>>);
static_assert(
    !std::is_constructible_v<arg::new_logp<double>, std::vector<float>&>);  // no silent f32 -> f64
static_assert(weft::rl::FlatArray<std::array<float, 3>&> &&
              weft::rl::FlatArray<std::span<float const>> &&
              weft::rl::FlatArray<weft::tensor_view<float, 2>> &&
              weft::rl::FlatArray<weft::tensor<float, 1>&>);
static_assert(!weft::rl::MutableFlatArray<std::vector<float> const&> &&
              !weft::rl::MutableFlatArray<std::span<float const>>);
}  // namespace

TEST_CASE(
    "issue 9.18: entry points take vectors, arrays, spans, weft views and tensors without "
    "std::span wrapping") {
  index_t const V = 3;
  std::vector<float> const z = {0.5f, -1.0f, 2.0f, 1.0f, 1.0f, -0.25f};
  std::array<std::int64_t, 2> const tgt = {0, 2};
  auto lp = weft::make_tensor<float>(2);
  auto h = weft::make_tensor<float>(2);
  std::vector<float> lse(2), lp_ref(2), h_ref(2);
  weft::rl::log_prob_forward(z, V, tgt, {}, lp, h.view(), lse);
  weft::rl::log_prob_forward(std::span<float const>(z), V, std::span<std::int64_t const>(tgt), {},
                             std::span<float>(lp_ref), std::span<float>(h_ref));
  for (std::size_t k = 0; k < 2; ++k) {
    CHECK(lp.data()[k] == lp_ref[k]);
    CHECK(h.data()[k] == h_ref[k]);
  }
  std::vector<float> dz(z.size());
  weft::rl::log_prob_backward(z, V, tgt, {}, lse, h, std::vector<float>{1.0f, -1.0f}, {}, dz);
  CHECK(dz[0] != 0.0f);
  // A non-contiguous view is a shape_error naming the argument.
  auto zt = weft::make_tensor<float>(3, 2);
  for (std::size_t k = 0; k < 6; ++k) zt.data()[k] = z[k];
  try {
    weft::rl::log_prob_forward(weft::transpose(zt.view()), V, tgt, {}, lp, h);
    FAIL("a transposed view was accepted");
  } catch (weft::shape_error const& e) {
    CHECK(std::string(e.what()).find("logits") != std::string::npos);
  }
  // Losses, aggregation, advantages and KL on plain containers.
  auto const layout = token_layout::padded(1, 4);
  std::vector<double> const l = {-0.5, -0.2, -1.0, -0.3}, old = {-0.4, -0.25, -1.1, -0.3};
  std::array<u8, 4> const m = {1, 1, 1, 0};
  std::vector<double> w(4), adv(4), g(4);
  weft::rl::aggregation_weights(loss_agg::token_mean, layout, m, weft::rl::count_tokens(layout, m),
                                w);
  std::array<double, 1> const score = {1.0}, rows = {0.7};
  std::array<double, 1> a{};
  weft::rl::grpo_advantages(score, weft::rl::group_layout::fixed(1), a);
  weft::rl::broadcast_to_tokens(layout, rows, m, adv);
  auto const r = weft::rl::policy_loss(
      policy_loss_config{}, layout,
      weft::rl::policy_inputs<double, u8>{arg::new_logp{l}, arg::old_logp{old},
                                          arg::advantages{adv}, arg::mask{m}, arg::weights{w}},
      g);
  CHECK(r.metrics.tokens == 3);
  double const kl = weft::rl::kl_loss(weft::rl::kl_kind::k3, 0.1, l, old, m, w, g);
  CHECK(std::isfinite(kl));
  std::vector<int> cu = {0, 2, 4};
  CHECK(token_layout::packed(cu).rows() == 2);
}
