// Tests of weft/rl/policy_loss.hpp and weft/rl/aggregation.hpp: golden vectors of the reference
// note (§12 items 1-12), gradients against central finite differences in f64, the exact-zero
// gradient sets, aggregation weights, micro-batch invariance and packed == padded.
#include <weft/rl/aggregation.hpp>
#include <weft/rl/policy_loss.hpp>

#include <doctest/doctest.h>

#include <cmath>
#include <cstdint>
#include <limits>
#include <random>
#include <vector>

namespace {

using weft::index_t;
using weft::rl::loss_agg;
using weft::rl::policy_loss_config;
using weft::rl::policy_loss_kind;
using weft::rl::token_layout;
using u8 = std::uint8_t;

struct batch {
  token_layout layout;
  std::vector<double> logp, old_logp, adv, w, isw;
  std::vector<u8> mask;
  weft::rl::policy_inputs<double, u8> inputs() const {
    namespace arg = weft::rl::arg;
    return {arg::new_logp{logp}, arg::old_logp{old_logp}, arg::advantages{adv},
            arg::mask{mask},     arg::weights{w},         arg::rollout_is_weights{isw}};
  }
};

double loss_of(policy_loss_config const& cfg, batch const& b) {
  std::vector<double> g(b.logp.size());
  return weft::rl::policy_loss(cfg, b.layout, b.inputs(), std::span<double>(g)).loss;
}

std::vector<double> grad_of(policy_loss_config const& cfg, batch const& b,
                            weft::rl::policy_loss_result* r = nullptr) {
  std::vector<double> g(b.logp.size());
  auto res = weft::rl::policy_loss(cfg, b.layout, b.inputs(), std::span<double>(g));
  if (r) *r = res;
  return g;
}

// B rows of T tokens, random log-probs, log-ratios in [-span, span], advantages constant per row
// (outcome rewards) or per token, a random mask with at least one valid token per row, token-mean
// weights.
batch random_batch(std::uint64_t seed, index_t B, index_t T, double span, bool per_token_adv,
                   loss_agg agg = loss_agg::token_mean) {
  std::mt19937_64 gen(seed);
  std::uniform_real_distribution<double> u(0, 1);
  std::normal_distribution<double> nrm(0, 1);
  batch b;
  b.layout = token_layout::padded(B, T);
  auto const n = static_cast<std::size_t>(B * T);
  b.logp.resize(n);
  b.old_logp.resize(n);
  b.adv.resize(n);
  b.mask.resize(n);
  b.w.resize(n);
  for (index_t i = 0; i < B; ++i) {
    double const a_row = nrm(gen);
    for (index_t t = 0; t < T; ++t) {
      auto const k = static_cast<std::size_t>(i * T + t);
      b.old_logp[k] = -3.0 * u(gen) - 0.01;
      b.logp[k] = b.old_logp[k] + span * (2 * u(gen) - 1);
      b.adv[k] = per_token_adv ? nrm(gen) : a_row;
      b.mask[k] = (t == 0 || u(gen) < 0.75) ? 1 : 0;
    }
  }
  auto const counts = weft::rl::count_tokens(b.layout, std::span<u8 const>(b.mask));
  weft::rl::aggregation_weights(agg, b.layout, std::span<u8 const>(b.mask), counts,
                                std::span<double>(b.w), double(T));
  return b;
}

bool near_kink(double r, policy_loss_config const& c) {
  double const tol = 1e-4;
  return std::abs(r - (1 - c.clip_low)) < tol || std::abs(r - (1 + c.clip_high)) < tol ||
         std::abs(r - c.dual_clip) < tol;
}

// Central differences of the loss w.r.t. each log-prob, compared with the analytic gradient.
void check_fd(policy_loss_config const& cfg, batch b, bool skip_kinks = true) {
  auto const g = grad_of(cfg, b);
  double const h = 1e-6;
  int checked = 0;
  for (std::size_t k = 0; k < b.logp.size(); ++k) {
    double const r = std::exp(b.logp[k] - b.old_logp[k]);
    if (skip_kinks && near_kink(r, cfg)) continue;
    double const x = b.logp[k];
    b.logp[k] = x + h;
    double const lp = loss_of(cfg, b);
    b.logp[k] = x - h;
    double const lm = loss_of(cfg, b);
    b.logp[k] = x;
    double const fd = (lp - lm) / (2 * h);
    double const scale = std::max(std::abs(g[k]), 1e-3 * b.w[k] + 1e-12);
    INFO("token ", k, " analytic ", g[k], " fd ", fd);
    CHECK(std::abs(fd - g[k]) / scale < 1e-6);
    ++checked;
  }
  CHECK(checked > 0);
}

}  // namespace

TEST_CASE("ppo clip reproduces the SkyRL / NeMo-RL dual-clip vector") {
  policy_loss_config cfg;
  cfg.clip_low = 0.2;
  cfg.clip_high = 0.2;
  cfg.dual_clip = 3.0;
  batch b;
  b.layout = token_layout::padded(1, 3);
  b.adv = {1, -1, -4};
  b.old_logp = {-1, -1, -3};
  b.logp = {-1.69315, -1.0, -0.69741};
  b.mask = {1, 1, 1};
  b.w = {1, 1, 1};
  weft::rl::ppo_clip_token<double> const tok{0.2, 0.2, 3.0, 20.0};
  double const expected_loss[3] = {-0.5, 1.0, 12.0};
  double const expected_grad[3] = {-0.5, 1.0, 0.0};
  for (std::size_t k = 0; k < 3; ++k) {
    auto const p = tok(b.logp[k], b.old_logp[k], b.adv[k]);
    CHECK(p.loss == doctest::Approx(expected_loss[k]).epsilon(1e-4));
    CHECK(p.grad == doctest::Approx(expected_grad[k]).epsilon(1e-4));
  }
  weft::rl::policy_loss_result res;
  auto const g = grad_of(cfg, b, &res);
  CHECK(res.loss == doctest::Approx(12.5).epsilon(1e-4));
  CHECK(g[0] == doctest::Approx(-0.5).epsilon(1e-4));
  CHECK(g[1] == doctest::Approx(1.0).epsilon(1e-4));
  CHECK(g[2] == 0.0);
  CHECK(res.metrics.tokens == 3);
  CHECK(res.metrics.dual_clipped == 1);
  CHECK(res.metrics.clipped_low == 0);
  CHECK(res.metrics.clipped_high == 0);
  CHECK(res.metrics.ratio_max == doctest::Approx(10.0).epsilon(1e-4));
  CHECK(res.metrics.ratio_min == doctest::Approx(0.5).epsilon(1e-4));

  SUBCASE("CISPO on the same data is -2.9930") {
    cfg.kind = policy_loss_kind::cispo;
    auto const gc = grad_of(cfg, b, &res);
    CHECK(res.loss == doctest::Approx(-2.9930).epsilon(1e-4));
    // -A * clip(r): never zero.
    CHECK(gc[0] == doctest::Approx(-1 * 0.8));
    CHECK(gc[1] == doctest::Approx(1.0));
    CHECK(gc[2] == doctest::Approx(4 * 1.2));
  }
}

TEST_CASE("policy-loss gradients match central finite differences in f64") {
  for (std::uint64_t seed = 1; seed <= 3; ++seed) {
    CAPTURE(seed);
    policy_loss_config cfg;
    SUBCASE("ppo clip, decoupled, dual clip") {
      check_fd(cfg, random_batch(seed, 4, 9, 1.6, true));
    }
    SUBCASE("ppo clip with rollout IS weights and seq-mean-token-mean") {
      auto b = random_batch(seed, 4, 9, 1.6, true, loss_agg::seq_mean_token_mean);
      std::mt19937_64 gen(seed + 100);
      std::uniform_real_distribution<double> u(0.2, 2.0);
      b.isw.resize(b.logp.size());
      for (auto& x : b.isw) x = u(gen);
      check_fd(cfg, b);
    }
    SUBCASE("gspo, per-token advantages and seq-mean-token-sum weights") {
      cfg.kind = policy_loss_kind::gspo;
      cfg.clip_low = 0.05;
      cfg.clip_high = 0.08;
      auto b = random_batch(seed, 5, 7, 0.3, true, loss_agg::seq_mean_token_sum);
      auto const g = grad_of(cfg, b);
      double const h = 1e-6;
      for (std::size_t k = 0; k < b.logp.size(); ++k) {
        double const x = b.logp[k];
        b.logp[k] = x + h;
        double const lp = loss_of(cfg, b);
        b.logp[k] = x - h;
        double const lm = loss_of(cfg, b);
        b.logp[k] = x;
        double const fd = (lp - lm) / (2 * h);
        CHECK(std::abs(fd - g[k]) <= 1e-6 * std::max(std::abs(g[k]), 1e-4));
      }
    }
    SUBCASE("reinforce") {
      cfg.kind = policy_loss_kind::reinforce;
      check_fd(cfg, random_batch(seed, 3, 8, 1.0, true));
    }
  }
}

TEST_CASE("ppo clip gradient is -A r k and exactly zero on the documented token sets") {
  policy_loss_config cfg;  // 0.2 / 0.28, c = 3
  auto b = random_batch(7, 6, 40, 3.0, true);
  // Plant the special cases.
  b.adv[0] = 0.0;  // A = 0
  b.old_logp[1] = -30;
  b.logp[1] = -5;
  b.mask[1] = 1;  // |delta| > 20
  b.mask[2] = 0;
  b.logp[2] = std::numeric_limits<double>::quiet_NaN();  // masked NaN
  weft::rl::policy_loss_result res;
  auto const g = grad_of(cfg, b, &res);
  CHECK(g[0] == 0.0);
  CHECK(g[1] == 0.0);
  CHECK(g[2] == 0.0);
  CHECK(std::isfinite(res.loss));
  CHECK(res.metrics.log_ratio_clamped >= 1);
  int zero_high = 0, zero_low = 0, zero_dual = 0, kept = 0;
  for (std::size_t k = 3; k < b.logp.size(); ++k) {
    if (!b.mask[k]) {
      CHECK(g[k] == 0.0);
      continue;
    }
    double const r = std::exp(b.logp[k] - b.old_logp[k]);
    double const A = b.adv[k];
    bool const zero = (A > 0 && r > 1.28) || (A < 0 && r < 0.8) || (A < 0 && r > 3.0);
    if (zero) {
      CHECK(g[k] == 0.0);
      zero_high += A > 0;
      zero_low += A < 0 && r < 0.8;
      zero_dual += A < 0 && r > 3.0;
    } else {
      CHECK(g[k] == doctest::Approx(-A * r * b.w[k]).epsilon(1e-12));
      ++kept;
    }
  }
  CHECK(zero_high > 0);
  CHECK(zero_low > 0);
  CHECK(zero_dual > 0);
  CHECK(kept > 0);
  // The metrics count exactly these sets (token 1, clamped at delta = 25, is A-dependent).
  CHECK(res.metrics.clipped_high + res.metrics.clipped_low + res.metrics.dual_clipped >=
        zero_high + zero_low + zero_dual);
}

TEST_CASE(
    "boundary convention: closed intervals pass the full gradient at 1-eps_low, 1+eps_high, c") {
  // Bounds taken from the very ratios exp(log(.)) produces, so r lands exactly on each boundary.
  weft::rl::ppo_clip_token<double> const t2{
      1.0 - std::exp(std::log(0.75)), std::exp(std::log(1.5)) - 1.0, std::exp(std::log(4.0)), 20.0};
  auto const hi2 = t2(std::log(1.5), 0.0, 2.0);
  auto const lo2 = t2(std::log(0.75), 0.0, -2.0);
  auto const c2 = t2(std::log(4.0), 0.0, -2.0);
  CHECK(hi2.grad == doctest::Approx(-2.0 * hi2.ratio));
  CHECK(lo2.grad == doctest::Approx(2.0 * lo2.ratio));
  CHECK(c2.grad == doctest::Approx(2.0 * c2.ratio));
  CHECK(hi2.flags == 0u);
  CHECK(lo2.flags == 0u);
  CHECK(c2.flags == 0u);
}

TEST_CASE("on-policy: value -sum w A and gradient -w A") {
  policy_loss_config cfg;
  auto b = random_batch(11, 5, 12, 0.0, true);
  b.old_logp = b.logp;
  weft::rl::policy_loss_result res;
  auto const g = grad_of(cfg, b, &res);
  double v = 0;
  for (std::size_t k = 0; k < g.size(); ++k) {
    if (!b.mask[k]) {
      CHECK(g[k] == 0.0);
      continue;
    }
    v += -b.w[k] * b.adv[k];
    CHECK(g[k] == doctest::Approx(-b.w[k] * b.adv[k]).epsilon(1e-15));
  }
  CHECK(res.loss == doctest::Approx(v).epsilon(1e-12));
  CHECK(res.metrics.approx_kl() == 0.0);
  CHECK(res.metrics.ratio_mean() == 1.0);
}

TEST_CASE("eps_high > eps_low only changes tokens with A > 0 and r in (1+eps_low, 1+eps_high]") {
  auto b = random_batch(13, 6, 30, 0.5, true);
  policy_loss_config sym;
  sym.clip_low = sym.clip_high = 0.2;
  policy_loss_config dec;  // 0.2 / 0.28
  auto const gs = grad_of(sym, b);
  auto const gd = grad_of(dec, b);
  int changed = 0;
  for (std::size_t k = 0; k < gs.size(); ++k) {
    double const r = std::exp(b.logp[k] - b.old_logp[k]);
    bool const in_band = b.mask[k] && b.adv[k] > 0 && r > 1.2 && r <= 1.28;
    if (in_band) {
      CHECK(gs[k] == 0.0);
      CHECK(gd[k] != 0.0);
      ++changed;
    } else {
      CHECK(gs[k] == gd[k]);
    }
  }
  CHECK(changed > 0);
}

TEST_CASE("clip metrics count the crafted sets; dual clip applies to A < 0 only") {
  policy_loss_config cfg;  // 0.2/0.28, c=3
  batch b;
  b.layout = token_layout::padded(1, 6);
  // r:             2.0   0.5   5.0   1.0   0.5   5.0
  // A:             +1    -1    -1    +1    +1    +1
  b.logp = {std::log(2.0), std::log(0.5), std::log(5.0), 0, std::log(0.5), std::log(5.0)};
  b.old_logp = {0, 0, 0, 0, 0, 0};
  b.adv = {1, -1, -1, 1, 1, 1};
  b.mask = {1, 1, 1, 1, 1, 1};
  b.w = {1, 1, 1, 1, 1, 1};
  weft::rl::policy_loss_result res;
  auto const g = grad_of(cfg, b, &res);
  CHECK(res.metrics.clipped_high == 2);  // tokens 0 and 5
  CHECK(res.metrics.clipped_low == 1);   // token 1
  CHECK(res.metrics.dual_clipped == 1);  // token 2; token 5 has A > 0: no dual clip
  CHECK(res.metrics.clip_frac() == doctest::Approx(0.5));
  CHECK(res.metrics.approx_kl() ==
        doctest::Approx(-(std::log(2.0) + 2 * std::log(0.5) + 2 * std::log(5.0)) / 6));
  CHECK(g[5] == 0.0);
  CHECK(res.loss == doctest::Approx(-1.28 + 0.8 + 3.0 - 1.0 - 0.5 - 1.28));

  policy_loss_config bad;
  bad.dual_clip = 1.0;
  CHECK_THROWS_AS(loss_of(bad, b), weft::invalid_argument_error);
  bad.dual_clip = 0.5;
  CHECK_THROWS_AS(loss_of(bad, b), weft::invalid_argument_error);
  policy_loss_config off;
  off.dual_clip = std::numeric_limits<double>::infinity();
  auto const g_off = grad_of(off, b, &res);
  CHECK(res.metrics.dual_clipped == 0);
  CHECK(g_off[2] == doctest::Approx(5.0));  // OpenRLHF without dual clip: full -A r
}

TEST_CASE("gspo: sequence ratio exp(mean delta), gradient -A s / (L B) or 0 for the row") {
  policy_loss_config cfg;
  cfg.kind = policy_loss_kind::gspo;
  cfg.clip_low = 3e-4;
  cfg.clip_high = 4e-4;
  batch b;
  b.layout = token_layout::padded(2, 3);
  b.old_logp = {-1, -1, -1, -1, -1, -1};
  b.logp = {-1.0001, -0.9999, -1.0, -0.5, -1.0, -1.0};  // row 0: s = 1; row 1: s = exp(0.25)
  b.adv = {2, 2, 2, 1, 1, 1};
  b.mask = {1, 1, 1, 1, 1, 0};
  b.w.resize(6);
  auto const counts = weft::rl::count_tokens(b.layout, std::span<u8 const>(b.mask));
  weft::rl::aggregation_weights(loss_agg::seq_mean_token_mean, b.layout,
                                std::span<u8 const>(b.mask), counts, std::span<double>(b.w));
  weft::rl::policy_loss_result res;
  auto const g = grad_of(cfg, b, &res);
  for (int k = 0; k < 3; ++k) CHECK(g[k] == doctest::Approx(-2.0 * 1.0 / (3 * 2)).epsilon(1e-9));
  for (int k = 3; k < 6; ++k) CHECK(g[k] == 0.0);  // row 1 clipped (A > 0, s > 1 + eps_high)
  CHECK(res.metrics.clipped_high == 2);
  CHECK(res.metrics.ratio_max == doctest::Approx(std::exp(0.25)));
}

TEST_CASE("rollout IS weights multiply the per-token loss and gradient") {
  policy_loss_config cfg;
  auto b = random_batch(17, 3, 10, 0.4, true);
  auto const g0 = grad_of(cfg, b);
  double const l0 = loss_of(cfg, b);
  b.isw.assign(b.logp.size(), 0.5);
  auto const g1 = grad_of(cfg, b);
  CHECK(loss_of(cfg, b) == doctest::Approx(0.5 * l0).epsilon(1e-14));
  for (std::size_t k = 0; k < g0.size(); ++k)
    CHECK(g1[k] == doctest::Approx(0.5 * g0[k]).epsilon(1e-14));
}

TEST_CASE("aggregation modes on the OpenRLHF matrix") {
  auto const layout = token_layout::padded(3, 3);
  std::vector<double> const loss = {1, 2, 0, 3, 4, 5, 7, 0, 0};
  std::vector<u8> const mask = {1, 1, 0, 1, 1, 1, 1, 0, 0};
  auto const counts = weft::rl::count_tokens(layout, std::span<u8 const>(mask));
  CHECK(counts.tokens == 6);
  CHECK(counts.sequences == 3);
  std::vector<double> w(9);
  auto value = [&](loss_agg mode, double lmax = 0) {
    weft::rl::aggregation_weights(mode, layout, std::span<u8 const>(mask), counts,
                                  std::span<double>(w), lmax);
    return weft::rl::weighted_sum(std::span<double const>(loss), std::span<double const>(w));
  };
  CHECK(value(loss_agg::token_mean) == doctest::Approx(22.0 / 6));
  CHECK(value(loss_agg::seq_mean_token_mean) == doctest::Approx((1.5 + 4 + 7) / 3));
  CHECK(value(loss_agg::seq_mean_token_sum) == doctest::Approx((3.0 + 12 + 7) / 3));
  CHECK(value(loss_agg::dr_grpo_norm, 3) == doctest::Approx(22.0 / 9));
  CHECK_THROWS_AS(value(loss_agg::dr_grpo_norm, 0), weft::invalid_argument_error);

  SUBCASE("all-masked rows are excluded from the sequence count (OpenRLHF test 3)") {
    auto const l2 = token_layout::padded(2, 2);
    std::vector<double> const v = {1, 3, 5, 7};
    std::vector<u8> const m = {1, 1, 0, 0};
    auto const c = weft::rl::count_tokens(l2, std::span<u8 const>(m));
    CHECK(c.sequences == 1);
    std::vector<double> w2(4);
    weft::rl::aggregation_weights(loss_agg::seq_mean_token_mean, l2, std::span<u8 const>(m), c,
                                  std::span<double>(w2));
    CHECK(weft::rl::weighted_sum(std::span<double const>(v), std::span<double const>(w2)) ==
          doctest::Approx(2.0));
  }
  SUBCASE("all-masked batch: zero weights, zero loss, no NaN") {
    std::vector<u8> const none(9, 0);
    auto const c = weft::rl::count_tokens(layout, std::span<u8 const>(none));
    for (auto mode :
         {loss_agg::token_mean, loss_agg::seq_mean_token_mean, loss_agg::seq_mean_token_sum}) {
      weft::rl::aggregation_weights(mode, layout, std::span<u8 const>(none), c,
                                    std::span<double>(w));
      for (double x : w) CHECK(x == 0.0);
    }
    batch b = random_batch(3, 3, 3, 0.5, true);
    b.mask.assign(9, 0);
    b.w.assign(9, 0.0);
    weft::rl::policy_loss_result res;
    auto const g = grad_of(policy_loss_config{}, b, &res);
    CHECK(res.loss == 0.0);
    CHECK(res.metrics.clip_frac() == 0.0);
    for (double x : g) CHECK(x == 0.0);
  }
}

TEST_CASE(
    "micro-batch invariance: any row partition with global counts gives the whole-batch loss and "
    "gradient") {
  for (auto mode :
       {loss_agg::token_mean, loss_agg::seq_mean_token_mean, loss_agg::seq_mean_token_sum,
        loss_agg::dr_grpo_norm, loss_agg::verl_token_sum_norm}) {
    CAPTURE(weft::rl::to_string(mode));
    for (auto kind :
         {policy_loss_kind::ppo_clip, policy_loss_kind::gspo, policy_loss_kind::cispo}) {
      policy_loss_config cfg;
      cfg.kind = kind;
      auto const whole = random_batch(23, 7, 11, 0.4, false, mode);
      weft::rl::policy_loss_result rw;
      auto const gw = grad_of(cfg, whole, &rw);
      // Split into micro-batches of 3, 1 and 3 rows (uneven token counts); weights recomputed per
      // micro-batch from the mini-batch's global counts.
      auto const global = weft::rl::count_tokens(whole.layout, std::span<u8 const>(whole.mask));
      index_t const T = 11;
      double loss = 0;
      weft::rl::policy_metrics m;
      std::vector<double> g;
      index_t row = 0;
      for (index_t rows : {3, 1, 3}) {
        batch mb;
        mb.layout = token_layout::padded(rows, T);
        auto const b0 = static_cast<std::size_t>(row * T),
                   e0 = static_cast<std::size_t>((row + rows) * T);
        mb.logp.assign(whole.logp.begin() + b0, whole.logp.begin() + e0);
        mb.old_logp.assign(whole.old_logp.begin() + b0, whole.old_logp.begin() + e0);
        mb.adv.assign(whole.adv.begin() + b0, whole.adv.begin() + e0);
        mb.mask.assign(whole.mask.begin() + b0, whole.mask.begin() + e0);
        mb.w.resize(mb.logp.size());
        weft::rl::aggregation_weights(mode, mb.layout, std::span<u8 const>(mb.mask), global,
                                      std::span<double>(mb.w), double(T));
        weft::rl::policy_loss_result r;
        auto const gm = grad_of(cfg, mb, &r);
        loss += r.loss;
        m += r.metrics;
        g.insert(g.end(), gm.begin(), gm.end());
        row += rows;
      }
      CHECK(loss == doctest::Approx(rw.loss).epsilon(1e-12));
      CHECK(m.tokens == rw.metrics.tokens);
      CHECK(m.clipped_high == rw.metrics.clipped_high);
      CHECK(m.neg_log_ratio_sum == doctest::Approx(rw.metrics.neg_log_ratio_sum).epsilon(1e-12));
      for (std::size_t k = 0; k < g.size(); ++k)
        CHECK(g[k] == doctest::Approx(gw[k]).epsilon(1e-12));
    }
  }
}

TEST_CASE("the per-micro-batch token mean (mean of means) differs: the bug global counts avoid") {
  // OpenRLHF test 7: (S0/N0 + S1/N1)/2 != (S0+S1)/(N0+N1) for uneven token counts.
  double const s0 = 3, n0 = 2, s1 = 20, n1 = 5;
  CHECK((s0 / n0 + s1 / n1) / 2 != doctest::Approx((s0 + s1) / (n0 + n1)));
}

TEST_CASE("packed cu_seqlens inputs give the padded losses and gradients") {
  for (auto kind : {policy_loss_kind::ppo_clip, policy_loss_kind::gspo, policy_loss_kind::cispo,
                    policy_loss_kind::reinforce}) {
    policy_loss_config cfg;
    cfg.kind = kind;
    index_t const B = 5, T = 9;
    auto padded = random_batch(31, B, T, 0.5, false, loss_agg::seq_mean_token_mean);
    // Right-padded rows: valid prefix of random length.
    std::mt19937_64 gen(5);
    std::vector<std::int64_t> cu = {0};
    for (index_t i = 0; i < B; ++i) {
      index_t const len = 1 + static_cast<index_t>(gen() % T);
      for (index_t t = 0; t < T; ++t)
        padded.mask[static_cast<std::size_t>(i * T + t)] = t < len ? 1 : 0;
      cu.push_back(cu.back() + len);
    }
    auto const gcount = weft::rl::count_tokens(padded.layout, std::span<u8 const>(padded.mask));
    weft::rl::aggregation_weights(loss_agg::seq_mean_token_mean, padded.layout,
                                  std::span<u8 const>(padded.mask), gcount,
                                  std::span<double>(padded.w));
    batch packed;
    packed.layout = token_layout::packed(std::span<std::int64_t const>(cu));
    for (index_t i = 0; i < B; ++i)
      for (index_t t = 0; t < T; ++t) {
        auto const k = static_cast<std::size_t>(i * T + t);
        if (!padded.mask[k]) continue;
        packed.logp.push_back(padded.logp[k]);
        packed.old_logp.push_back(padded.old_logp[k]);
        packed.adv.push_back(padded.adv[k]);
        packed.mask.push_back(1);
      }
    packed.w.resize(packed.logp.size());
    auto const pcount = weft::rl::count_tokens(packed.layout, std::span<u8 const>(packed.mask));
    CHECK(pcount == gcount);
    weft::rl::aggregation_weights(loss_agg::seq_mean_token_mean, packed.layout,
                                  std::span<u8 const>(packed.mask), pcount,
                                  std::span<double>(packed.w));
    weft::rl::policy_loss_result rp, rq;
    auto const gp = grad_of(cfg, padded, &rp);
    auto const gq = grad_of(cfg, packed, &rq);
    CHECK(rq.loss == rp.loss);
    std::size_t j = 0;
    for (std::size_t k = 0; k < gp.size(); ++k) {
      if (!padded.mask[k]) continue;
      CHECK(gq[j++] == gp[k]);
    }
  }
}

TEST_CASE("bad shapes throw shape_error naming the argument") {
  auto b = random_batch(1, 2, 4, 0.1, true);
  b.adv.pop_back();
  try {
    (void)loss_of(policy_loss_config{}, b);
    FAIL("expected a throw");
  } catch (weft::shape_error const& e) {
    CHECK(std::string(e.what()).find("advantages") != std::string::npos);
  }
  std::vector<std::int64_t> bad_cu = {0, 3, 2};
  CHECK_THROWS_AS(token_layout::packed(std::span<std::int64_t const>(bad_cu)), weft::shape_error);
  std::vector<std::int64_t> bad_cu2 = {1, 3};
  CHECK_THROWS_AS(token_layout::packed(std::span<std::int64_t const>(bad_cu2)), weft::shape_error);
}

TEST_CASE(
    "tensor views: flat() accepts contiguous host views and rejects strided ones; padded_layout "
    "from [B, T]") {
  auto logp = weft::make_tensor<double>(2, 3);
  auto view = logp.view();
  auto const s = weft::rl::flat(view, "logp");
  CHECK(s.size() == 6);
  CHECK(s.data() == logp.data());
  auto const layout = weft::rl::padded_layout(view);
  CHECK(layout.rows() == 2);
  CHECK(layout.tokens() == 6);
  auto const t = weft::transpose(view);
  try {
    (void)weft::rl::flat(t, "old_logp");
    FAIL("expected a throw");
  } catch (weft::shape_error const& e) {
    CHECK(std::string(e.what()).find("old_logp") != std::string::npos);
  }
}

#if defined(__CUDACC__) && WEFT_HAS_CUDA_RUNTIME
#include <weft/rl/cuda/policy_loss.cuh>

#include "support/cuda_buffer.hpp"

#include <cuda_runtime_api.h>

#include <algorithm>
#include <random>

namespace {
// The kernel against the CPU path in T (float or double) on 8 rows of 33 tokens (log-ratios in
// [-1.5, 1.5], per-token advantages, masked tokens, token-mean weights): ppo_clip with dual clip
// 3, cispo and reinforce (also without old log-probs), each without and with rollout IS weights.
// Each token's loss_tok is the CPU loss with that token's weight alone (the loss is
// sum_t w_t isw_t loss_t), and dlogp the CPU gradient, element by element; masked tokens 0.
template <class T>
void check_policy_tokens_kernel() {
  auto const b = random_batch(41, 8, 33, 1.5, true);
  std::size_t const n = b.logp.size();
  auto cast = [](std::vector<double> const& v) { return std::vector<T>(v.begin(), v.end()); };
  std::vector<T> const lp = cast(b.logp), ol = cast(b.old_logp), ad = cast(b.adv), w = cast(b.w);
  std::vector<T> isw(n);
  std::mt19937_64 gen(43);
  std::uniform_real_distribution<double> u(0.2, 1.8);
  for (auto& x : isw) x = static_cast<T>(u(gen));
  using weft::test::device_buffer;
  device_buffer<T> const d_lp(lp), d_ol(ol), d_ad(ad), d_w(w), d_isw(isw);
  device_buffer<u8> const d_mk(b.mask);
  device_buffer<T> d_lt(std::vector<T>(n, T(7))), d_dl(std::vector<T>(n, T(7)));
  double const rel = sizeof(T) == 4 ? 1e-5 : 1e-12;
  struct variant {
    policy_loss_kind kind;
    bool old;
  };
  for (variant const v :
       {variant{policy_loss_kind::ppo_clip, true}, variant{policy_loss_kind::cispo, true},
        variant{policy_loss_kind::reinforce, true}, variant{policy_loss_kind::reinforce, false}})
    for (bool const with_isw : {false, true}) {
      policy_loss_kind const kind = v.kind;
      bool const old = v.old;
      CAPTURE(weft::rl::to_string(kind));
      CAPTURE(old);
      CAPTURE(with_isw);
      policy_loss_config cfg;
      cfg.kind = kind;
      if (kind == policy_loss_kind::ppo_clip) cfg.dual_clip = 3.0;
      std::vector<T> const none;
      auto cpu = [&](std::vector<T> const& weights, std::vector<T>& g) {
        namespace arg = weft::rl::arg;
        weft::rl::policy_inputs<T, u8> const in{
            arg::new_logp{lp},        arg::old_logp<T>{old ? ol : none},
            arg::advantages{ad},      arg::mask{b.mask},
            arg::weights<T>{weights}, arg::rollout_is_weights<T>{with_isw ? isw : none}};
        return weft::rl::policy_loss(cfg, b.layout, in, std::span<T>(g)).loss;
      };
      std::vector<T> g(n), scratch(n), one(n, T(0));
      double const total = cpu(w, g);
      T const* const none_p = nullptr;
      weft::rl::kernels::policy_loss_tokens(nullptr, cfg, static_cast<std::int64_t>(n), d_lp.p,
                                            old ? d_ol.p : none_p, d_ad.p, d_mk.p, d_w.p,
                                            with_isw ? d_isw.p : none_p, d_lt.p, d_dl.p);
      WEFT_CUDA_TRY(cudaDeviceSynchronize());
      auto const loss_tok = d_lt.host(), grad = d_dl.host();
      double loss_max = 0, grad_max = 0, sum = 0;
      std::vector<double> want(n);
      for (std::size_t k = 0; k < n; ++k) {
        one[k] = w[k];
        want[k] = cpu(one, scratch);
        one[k] = T(0);
        loss_max = std::max(loss_max, std::abs(want[k]));
        grad_max = std::max(grad_max, std::abs(double(g[k])));
        sum += double(loss_tok[k]);
      }
      REQUIRE(loss_max > 0);
      REQUIRE(grad_max > 0);
      std::size_t bad_loss = 0, bad_grad = 0, masked_nonzero = 0;
      for (std::size_t k = 0; k < n; ++k) {
        if (b.mask[k] == 0) {
          masked_nonzero += (loss_tok[k] != T(0) || grad[k] != T(0)) ? 1 : 0;
          continue;
        }
        if (!(std::abs(double(loss_tok[k]) - want[k]) <= rel * loss_max)) ++bad_loss;
        if (!(std::abs(double(grad[k]) - double(g[k])) <= rel * grad_max)) ++bad_grad;
      }
      CHECK(bad_loss == 0);
      CHECK(bad_grad == 0);
      CHECK(masked_nonzero == 0);
      CHECK(std::abs(sum - total) <= rel * double(n) * loss_max);
    }
}
}  // namespace

TEST_CASE(
    "CUDA per-token policy loss equals the host loss and gradient (f32 and f64, IS weights)") {
  if (!weft::test::have_cuda_device()) return;
  check_policy_tokens_kernel<double>();
  check_policy_tokens_kernel<float>();
}
#endif
