// Multi-rank tests of weft/rl on threads-backend ranks: vocabulary-parallel log-probs, entropy
// and dlogits equal the unsharded ones for p = 1..8 (V not divisible by p, ranks with no
// columns), with at most 16 bytes of collective payload per token plus 24 per rank (the shard
// table that checks the tiling); data-parallel shards with
// micro-batches give the whole batch's loss and gradient on 1, 2 and 4 ranks.
#include <support/counting_communicator.hpp>
#include <support/run_ranks.hpp>
#include <weft/comm/threads/communicator.hpp>
#include <weft/rl/aggregation.hpp>
#include <weft/rl/logprobs.hpp>
#include <weft/rl/policy_loss.hpp>
#include <weft/rl/vocab_parallel.hpp>

#include <doctest/doctest.h>

#include <cmath>
#include <cstdint>
#include <limits>
#include <random>
#include <vector>

namespace {
using weft::index_t;
using u8 = std::uint8_t;

using weft::test::run_ranks;
using counting = weft::test::counting_communicator<weft::comm::threads::communicator>;

bool close(double a, double b, double rel) {
  return a == b || std::abs(a - b) <= rel * std::abs(b);
}
// Per-token statistics cross ranks in f32, so log(sum) carries an absolute error of about one
// f32 rounding (6e-8): for entropies and log-probs far below 1 in magnitude the comparison is
// absolute (1e-6), elsewhere relative.
bool close_stat(double a, double b) {
  return a == b || std::abs(a - b) <= 1e-6 * std::max(std::abs(b), 1.0);
}
}  // namespace

TEST_SUITE("threads") {
  TEST_CASE(
      "vocabulary-parallel log-probs, entropy and dlogits equal the unsharded ones for p = 1..8") {
    for (index_t V : {index_t{1001}, index_t{5}}) {
      std::size_t const n = 13;
      std::mt19937_64 gen(static_cast<std::uint64_t>(V));
      std::normal_distribution<float> nd(0.0f, 3.0f);
      std::vector<float> z(n * static_cast<std::size_t>(V));
      for (auto& x : z) x = nd(gen);
      z[3] = -std::numeric_limits<float>::infinity();
      std::vector<std::int64_t> tgt(n);
      for (std::size_t k = 0; k < n; ++k)
        tgt[k] = static_cast<std::int64_t>(gen() % static_cast<std::uint64_t>(V));
      tgt[4] = -100;
      std::vector<double> g(n), ge(n);
      for (std::size_t k = 0; k < n; ++k) {
        g[k] = nd(gen);
        ge[k] = 0.1 * nd(gen);
      }
      weft::rl::logprob_options const opt{0.9, -100};
      // f32 logits and dlogits; per-token outputs in f64, since an f32 lse alone is one rounding
      // (up to 5e-7 relative in p) away from exact, whichever way it was computed.
      std::vector<double> lp(n), h(n), lse(n);
      std::vector<float> dz(z.size());
      weft::rl::log_prob_forward(std::span<float const>(z), V, std::span<std::int64_t const>(tgt),
                                 opt, std::span<double>(lp), std::span<double>(h),
                                 std::span<double>(lse));
      weft::rl::log_prob_backward(std::span<float const>(z), V, std::span<std::int64_t const>(tgt),
                                  opt, std::span<double const>(lse), std::span<double const>(h),
                                  std::span<double const>(g), std::span<double const>(ge),
                                  std::span<float>(dz));
      double worst_lp = 0, worst_h = 0, worst_dz = 0;
      for (int p = 1; p <= 8; ++p) {
        CAPTURE(V);
        CAPTURE(p);
        std::vector<std::vector<double>> lps(static_cast<std::size_t>(p)), hs(lps);
        std::vector<std::vector<float>> dzs(static_cast<std::size_t>(p));
        std::vector<weft::rl::vocab_shard> shards(static_cast<std::size_t>(p));
        std::vector<std::size_t> bytes(static_cast<std::size_t>(p), 0),
            ops(static_cast<std::size_t>(p), 0);
        run_ranks(p, [&](weft::comm::threads::communicator& c) {
          counting tp(std::move(c));  // records every collective with its payload
          auto const r = static_cast<std::size_t>(tp.inner().rank());
          auto const sh = weft::rl::vocab_shard::even(V, p, tp.inner().rank());
          shards[r] = sh;
          std::vector<float> local(n * static_cast<std::size_t>(sh.size));
          for (std::size_t k = 0; k < n; ++k)
            for (index_t j = 0; j < sh.size; ++j)
              local[k * static_cast<std::size_t>(sh.size) + static_cast<std::size_t>(j)] =
                  z[k * static_cast<std::size_t>(V) + static_cast<std::size_t>(sh.begin + j)];
          std::vector<double> l(n), e(n), s(n);
          std::vector<float> d(local.size());
          weft::rl::vocab_parallel_log_prob_forward(
              tp, std::span<float const>(local), sh, std::span<std::int64_t const>(tgt), opt,
              std::span<double>(l), std::span<double>(e), std::span<double>(s));
          bytes[r] = tp.bytes_sent();
          ops[r] = tp.events().size();
          weft::rl::vocab_parallel_log_prob_backward(
              std::span<float const>(local), sh, std::span<std::int64_t const>(tgt), opt,
              std::span<double const>(s), std::span<double const>(e), std::span<double const>(g),
              std::span<double const>(ge), std::span<float>(d));
          lps[r] = l;
          hs[r] = e;
          dzs[r] = d;
        });
        for (std::size_t r = 0; r < static_cast<std::size_t>(p); ++r) {
          CHECK(bytes[r] <= 16 * n + 24 * static_cast<std::size_t>(p));
          CHECK(ops[r] == 2);
          for (std::size_t k = 0; k < n; ++k) {
            INFO("token ", k, " sharded ", lps[r][k], " whole ", lp[k]);
            CHECK(close_stat(lps[r][k], lp[k]));
            CHECK(close_stat(hs[r][k], h[k]));
            if (lp[k] != 0 && std::isfinite(lp[k]))
              worst_lp = std::max(worst_lp, std::abs(lps[r][k] - lp[k]) / std::abs(lp[k]));
            worst_h = std::max(worst_h, std::abs(hs[r][k] - h[k]) / std::max(std::abs(h[k]), 1.0));
          }
          auto const& sh = shards[r];
          // dlogits are compared relative to the row's largest entry: single entries are sums of
          // terms that can cancel (g + g_ent (log p + H) ~ 0), where elementwise error is
          // meaningless.
          for (std::size_t k = 0; k < n; ++k) {
            float row_max = 0;
            for (index_t v = 0; v < V; ++v)
              row_max = std::max(
                  row_max,
                  std::abs(dz[k * static_cast<std::size_t>(V) + static_cast<std::size_t>(v)]));
            for (index_t j = 0; j < sh.size; ++j) {
              float const got =
                  dzs[r][k * static_cast<std::size_t>(sh.size) + static_cast<std::size_t>(j)];
              float const want =
                  dz[k * static_cast<std::size_t>(V) + static_cast<std::size_t>(sh.begin + j)];
              CHECK(std::abs(got - want) <= 1e-6 * row_max);
              if (row_max > 0)
                worst_dz = std::max(worst_dz, double(std::abs(got - want)) / row_max);
            }
          }
        }
      }
      MESSAGE("V = ", V, ": worst over p = 1..8: log-prob rel ", worst_lp, ", entropy ", worst_h,
              ", dlogits (rel to row max) ", worst_dz);
    }
  }

  TEST_CASE(
      "data-parallel shards and micro-batches on 1, 2 and 4 ranks give the whole-batch loss and "
      "gradient") {
    index_t const B = 12, T = 10;
    std::mt19937_64 gen(99);
    std::uniform_real_distribution<double> u(0, 1);
    std::normal_distribution<double> nd(0, 1);
    auto const n = static_cast<std::size_t>(B * T);
    std::vector<double> logp(n), old(n), adv(n);
    std::vector<u8> mask(n);
    for (index_t i = 0; i < B; ++i) {
      double const a = nd(gen);
      index_t const len =
          1 + static_cast<index_t>(gen() % static_cast<std::uint64_t>(T));  // uneven token counts
      for (index_t t = 0; t < T; ++t) {
        auto const k = static_cast<std::size_t>(i * T + t);
        old[k] = -2 * u(gen) - 0.05;
        logp[k] = old[k] + 0.6 * (2 * u(gen) - 1);
        adv[k] = a;
        mask[k] = t < len ? 1 : 0;
      }
    }
    auto const whole_layout = weft::rl::token_layout::padded(B, T);
    for (auto mode : {weft::rl::loss_agg::token_mean, weft::rl::loss_agg::seq_mean_token_mean,
                      weft::rl::loss_agg::seq_mean_token_sum, weft::rl::loss_agg::dr_grpo_norm,
                      weft::rl::loss_agg::verl_token_sum_norm}) {
      for (auto kind : {weft::rl::policy_loss_kind::ppo_clip, weft::rl::policy_loss_kind::gspo}) {
        weft::rl::policy_loss_config cfg;
        cfg.kind = kind;
        std::vector<double> w(n), gw(n);
        auto const counts = weft::rl::count_tokens(whole_layout, std::span<u8 const>(mask));
        weft::rl::aggregation_weights(mode, whole_layout, std::span<u8 const>(mask), counts,
                                      std::span<double>(w), double(T));
        auto const whole =
            weft::rl::policy_loss(cfg, whole_layout,
                                  weft::rl::policy_inputs<double, u8>{
                                      weft::rl::arg::new_logp{logp}, weft::rl::arg::old_logp{old},
                                      weft::rl::arg::advantages{adv}, weft::rl::arg::mask{mask},
                                      weft::rl::arg::weights{w}},
                                  std::span<double>(gw));
        // Row splits per rank count (uneven), each rank's rows in micro-batches of at most 2 rows.
        std::vector<std::vector<index_t>> const splits = {{12}, {5, 7}, {1, 5, 2, 4}};
        for (auto const& split : splits) {
          int const p = static_cast<int>(split.size());
          CAPTURE(p);
          std::vector<double> g(n, std::nan(""));
          std::vector<double> losses(static_cast<std::size_t>(p));
          run_ranks(p, [&](weft::comm::threads::communicator& dp) {
            index_t row0 = 0;
            for (int r = 0; r < dp.rank(); ++r) row0 += split[static_cast<std::size_t>(r)];
            index_t const rows = split[static_cast<std::size_t>(dp.rank())];
            auto const b0 = static_cast<std::size_t>(row0 * T);
            auto const len = static_cast<std::size_t>(rows * T);
            auto const local_layout = weft::rl::token_layout::padded(rows, T);
            auto const local =
                weft::rl::count_tokens(local_layout, std::span<u8 const>(mask).subspan(b0, len));
            auto const global = weft::rl::all_reduce_counts(dp, local);
            double loss = 0;
            for (index_t m0 = 0; m0 < rows; m0 += 2) {
              index_t const mr = std::min<index_t>(2, rows - m0);
              auto const o = b0 + static_cast<std::size_t>(m0 * T);
              auto const ml = static_cast<std::size_t>(mr * T);
              auto const lay = weft::rl::token_layout::padded(mr, T);
              std::vector<double> mw(ml);
              weft::rl::aggregation_weights(mode, lay, std::span<u8 const>(mask).subspan(o, ml),
                                            global, std::span<double>(mw), double(T));
              weft::rl::policy_inputs<double, u8> in{
                  weft::rl::arg::new_logp{std::span<double const>(logp).subspan(o, ml)},
                  weft::rl::arg::old_logp{std::span<double const>(old).subspan(o, ml)},
                  weft::rl::arg::advantages{std::span<double const>(adv).subspan(o, ml)},
                  weft::rl::arg::mask{std::span<u8 const>(mask).subspan(o, ml)},
                  weft::rl::arg::weights{mw}};
              loss += weft::rl::policy_loss(cfg, lay, in, std::span<double>(g).subspan(o, ml)).loss;
            }
            double total = 0;
            dp.all_reduce(weft::comm::host_view(std::span<double>(&loss, 1)),
                          weft::comm::host_view(std::span<double>(&total, 1)),
                          weft::comm::reduce_kind::sum, {})
                .wait();
            losses[static_cast<std::size_t>(dp.rank())] = total;
          });
          for (double l : losses) CHECK(close(l, whole.loss, 1e-12));
          for (std::size_t k = 0; k < n; ++k) CHECK(close(g[k], gw[k], 1e-12));
        }
      }
    }
  }
}  // TEST_SUITE
