// Tests of weft/rl/dynamic_sampling.hpp: soft overlong punishment points (§12 item 21), overlong
// filtering, the dynamic-sampling builder (item 22: zero-variance groups dropped, singletons kept,
// rounds until full, surplus truncated, error after max rounds, next-request sizing) and the
// presets.
#include <weft/rl/dynamic_sampling.hpp>

#include <doctest/doctest.h>

#include <cstdint>
#include <vector>

using weft::index_t;

TEST_CASE("soft overlong punishment: Eq. 13 points") {
  weft::rl::overlong_shaping const s{20480, 4096, 1.0};
  CHECK(s.penalty(16000) == 0.0);
  CHECK(s.penalty(16384) == 0.0);
  CHECK(s.penalty(18432) == doctest::Approx(-0.5));
  CHECK(s.penalty(20480) == doctest::Approx(-1.0));
  CHECK(s.penalty(30000) == doctest::Approx(-1.0));
  // TRL docstring: 90 tokens with max 100 / cache 20 -> -0.5.
  CHECK(weft::rl::overlong_shaping{100, 20, 1.0}.penalty(90) == doctest::Approx(-0.5));
  std::vector<double> r = {1.0, -1.0};
  std::vector<int> const len = {100, 18432};
  s.apply(std::span<int const>(len), std::span<double>(r));
  CHECK(r[0] == 1.0);
  CHECK(r[1] == doctest::Approx(-1.5));
  CHECK_THROWS_AS((void)(weft::rl::overlong_shaping{100, 0, 1.0}.penalty(5)),
                  weft::invalid_argument_error);
  CHECK_THROWS_AS((void)(weft::rl::overlong_shaping{100, 200, 1.0}.penalty(5)),
                  weft::invalid_argument_error);
}

TEST_CASE("overlong filtering masks truncated rows") {
  auto const layout = weft::rl::token_layout::padded(3, 2);
  std::vector<std::uint8_t> mask = {1, 1, 1, 0, 1, 1};
  std::vector<bool> const tr_b = {false, true, false};
  std::vector<std::uint8_t> const truncated = {0, 1, 1};
  weft::rl::mask_truncated(layout, std::span<std::uint8_t const>(truncated),
                           std::span<std::uint8_t>(mask));
  CHECK(mask == std::vector<std::uint8_t>{1, 1, 0, 0, 0, 0});
  (void)tr_b;
}

TEST_CASE("dynamic sampling: filter, accumulate, truncate, count rounds, throw after max rounds") {
  weft::rl::dynamic_sampler ds({3, 3, 0, 1.0, 0});
  CHECK(ds.next_request() == 3);
  // Round 0: 4 groups of 2 (ids 10..13): all-correct, mixed, all-wrong, mixed.
  std::vector<std::int64_t> const ids0 = {10, 10, 11, 11, 12, 12, 13, 13};
  std::vector<double> const acc0 = {1, 1, 1, 0, 0, 0, 0, 1};
  CHECK(ds.add_round(std::span<std::int64_t const>(ids0), std::span<double const>(acc0)) == 2);
  CHECK(!ds.full());
  CHECK(ds.kept_groups() == 2);
  CHECK(ds.keep_rate() == doctest::Approx(0.5));
  CHECK(ds.next_request() == 2);  // one missing / 0.5
  // Round 1: a singleton (kept, as verl), then two mixed groups: only one fits, surplus dropped.
  std::vector<std::int64_t> const ids1 = {5, 6, 6, 7, 7};
  std::vector<double> const acc1 = {1, 0, 1, 1, 0};
  CHECK(ds.add_round(std::span<std::int64_t const>(ids1), std::span<double const>(acc1)) == 3);
  CHECK(ds.full());
  CHECK(ds.rounds() == 2);
  CHECK(ds.next_request() == 0);
  std::vector<weft::rl::kept_sample> const expected = {{0, 2}, {0, 3}, {0, 6}, {0, 7}, {1, 0}};
  CHECK(ds.selected() == expected);
  CHECK_THROWS_AS(ds.add_round(std::span<std::int64_t const>(ids1), std::span<double const>(acc1)),
                  weft::invalid_argument_error);
  ds.reset();
  CHECK(ds.selected().empty());

  // All groups degenerate: throws at the max_rounds-th round, not before.
  weft::rl::dynamic_sampler hard({2, 3, 4, 1.1, 0});
  std::vector<std::int64_t> const ids = {1, 1, 2, 2};
  std::vector<double> const zeros = {0, 0, 0, 0};
  CHECK(hard.add_round(std::span<std::int64_t const>(ids), std::span<double const>(zeros)) == 0);
  CHECK(hard.next_request() == 2);  // nothing kept yet: repeat the previous request size
  CHECK(hard.add_round(std::span<std::int64_t const>(ids), std::span<double const>(zeros)) == 0);
  CHECK_THROWS_AS(
      hard.add_round(std::span<std::int64_t const>(ids), std::span<double const>(zeros)),
      weft::invalid_argument_error);
  // max_rounds <= 0: unlimited.
  weft::rl::dynamic_sampler unlimited({1, 0, 0, 1.0, 0});
  for (int i = 0; i < 50; ++i)
    CHECK(unlimited.add_round(std::span<std::int64_t const>(ids), std::span<double const>(zeros)) ==
          0);
  CHECK(unlimited.rounds() == 50);
}

TEST_CASE(
    "next_request sizes rounds from the keep rate: fewer samples than regenerating whole batches") {
  // A task where a fraction q of prompts have mixed outcomes. verl's recipe requests the full
  // batch each round; weft requests missing / q * margin. Count prompts generated to fill a batch.
  index_t const target = 64;
  double const q = 0.4;
  auto simulate = [&](bool adaptive) {
    weft::rl::dynamic_sampler ds({target, 0, target, 1.1, 0});
    index_t generated = 0;
    std::int64_t next_id = 0;
    std::uint64_t state = 12345;
    while (!ds.full()) {
      index_t const n = adaptive ? ds.next_request() : target;
      std::vector<std::int64_t> ids;
      std::vector<double> acc;
      for (index_t p = 0; p < n; ++p) {
        state = state * 6364136223846793005ull + 1442695040888963407ull;
        bool const mixed = static_cast<double>(state >> 11) / 9007199254740992.0 < q;
        ids.push_back(next_id);
        ids.push_back(next_id);
        acc.push_back(1.0);
        acc.push_back(mixed ? 0.0 : 1.0);
        ++next_id;
      }
      generated += n;
      ds.add_round(std::span<std::int64_t const>(ids), std::span<double const>(acc));
    }
    return generated;
  };
  index_t const fixed = simulate(false), adaptive = simulate(true);
  MESSAGE("prompts generated to fill ", target, " groups at keep rate ", q, ": whole-batch rounds ",
          fixed, ", keep-rate sized rounds ", adaptive);
  CHECK(adaptive < fixed);
}

TEST_CASE("presets compose the published defaults") {
  auto const d = weft::rl::rl_config::dapo();
  d.validate();
  CHECK(d.policy.clip_low == 0.2);
  CHECK(d.policy.clip_high == 0.28);
  CHECK(d.policy.dual_clip == 10.0);
  CHECK(d.aggregation == weft::rl::loss_agg::token_mean);
  CHECK(!d.kl.use_kl_loss);
  CHECK(!d.kl.use_kl_in_reward);
  CHECK(d.dynamic_sampling.enable);
  CHECK(d.overlong.soft_punishment);
  CHECK(d.shaping().penalty(18432) == doctest::Approx(-0.5));
  auto const g = weft::rl::rl_config::grpo();
  g.validate();
  CHECK(g.policy.clip_high == 0.2);
  CHECK(g.kl.use_kl_loss);
  CHECK(g.kl.kl_loss_kind == weft::rl::kl_kind::k3);
  CHECK(g.aggregation == weft::rl::loss_agg::seq_mean_token_mean);
  auto const dr = weft::rl::rl_config::dr_grpo();
  dr.validate();
  CHECK(!dr.advantage.norm_by_std);
  CHECK(dr.aggregation == weft::rl::loss_agg::dr_grpo_norm);
  CHECK(dr.norm_length() == 1024.0);
  auto const p = weft::rl::rl_config::ppo();
  p.validate();
  CHECK(p.advantage.kind == weft::rl::advantage_kind::gae);
  CHECK(p.value_clip == 0.5);
  auto bad = d;
  bad.policy.dual_clip = 0.9;
  CHECK_THROWS_AS(bad.validate(), weft::invalid_argument_error);
}
