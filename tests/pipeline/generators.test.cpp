// Tests for the GPipe, 1F1B and interleaved 1F1B generators and the simulator's unit cost model:
// golden makespans and per-rank peaks under unit costs (makespan (m+p-1)(F+B) for GPipe and
// 1F1B, Narayanan et al., SC'21, arXiv:2104.04473), the closed-form bubbles
// over the (p, m, v) grid, Megatron's configuration rules, and the formula failing for the
// configurations those rules reject.
#include <weft/pipeline/schedules/gpipe.hpp>
#include <weft/pipeline/schedules/interleaved.hpp>
#include <weft/pipeline/schedules/one_f_one_b.hpp>
#include <weft/pipeline/simulate.hpp>
#include <weft/pipeline/text.hpp>
#include <weft/pipeline/validate.hpp>

#include "pipeline/note_costs.hpp"

#include <doctest/doctest.h>

#include <algorithm>
#include <string>
#include <vector>

using namespace weft::pipeline;

namespace {

struct golden {
  char const* name;
  schedule s;
  double makespan;
  double bubble;
  std::vector<int> peaks;
};

std::vector<int> descending(int from, int to, int step) {
  std::vector<int> v;
  for (int x = from; x >= to; x -= step) v.push_back(x);
  return v;
}

// The microbatch counts of the grid: p, 2p, 4p and some that are not multiples of p.
std::vector<int> grid_m(int p) {
  std::vector<int> ms = {p, 2 * p, 4 * p, p + 1, 2 * p + 1, 3 * p - 1};
  std::sort(ms.begin(), ms.end());
  ms.erase(std::unique(ms.begin(), ms.end()), ms.end());
  return ms;
}

}  // namespace

TEST_CASE("generators: golden unit-cost makespans and peaks (note §2.1)") {
  std::vector<golden> const table = {
      {"GPipe p4 m8", gpipe(4, 8), 33.0, 0.375, {8, 8, 8, 8}},
      {"1F1B p4 m8", one_f_one_b(4, 8), 33.0, 0.375, {4, 3, 2, 1}},
      {"interleaved p4 m8 v2", interleaved_one_f_one_b(4, 8, 2), 28.5, 0.1875, {11, 9, 7, 5}},
      {"interleaved p4 m8 v4", interleaved_one_f_one_b(4, 8, 4), 26.25, 0.09375, {19, 17, 15, 13}},
      {"1F1B p4 m16", one_f_one_b(4, 16), 57.0, 0.1875, {4, 3, 2, 1}},
      {"1F1B p8 m32", one_f_one_b(8, 32), 117.0, 0.21875, descending(8, 1, 1)},
      {"interleaved p8 m32 v2", interleaved_one_f_one_b(8, 32, 2), 106.5, 0.109375,
       descending(23, 9, 2)},
      {"interleaved p4 m10 v2 g5",
       interleaved_one_f_one_b(4, 10, 2, {5, false}),
       34.5,
       0.15,
       {12, 10, 8, 6}},
  };
  for (auto const& g : table) {
    CAPTURE(g.name);
    auto const sim = simulate_note(g.s);
    CHECK(sim.makespan == doctest::Approx(g.makespan).epsilon(1e-12));
    CHECK(sim.bubble_fraction == doctest::Approx(g.bubble).epsilon(1e-12));
    CHECK(sim.bubble_rate == doctest::Approx(g.bubble / (1 + g.bubble)).epsilon(1e-12));
    CHECK(sim.peak_in_flight == g.peaks);
  }
}

TEST_CASE("generators: GPipe and 1F1B makespan is (m+p-1)(F+B) over the grid") {
  for (int p : {2, 3, 4, 8})
    for (int m : grid_m(p)) {
      CAPTURE(p);
      CAPTURE(m);
      // Non-unit costs too: F = 1.5, B = 2.5 (I = 1, W = 1.5).
      for (auto [f, i, w] : {std::tuple{1.0, 1.0, 1.0}, std::tuple{1.5, 1.0, 1.5}}) {
        double const want = (m + p - 1) * (f + i + w);
        auto const g = gpipe(p, m);
        CHECK(simulate(g, note_costs(g, f, i, w)).makespan == doctest::Approx(want));
        auto const s = one_f_one_b(p, m);
        auto const sim = simulate(s, note_costs(s, f, i, w));
        CHECK(sim.makespan == doctest::Approx(want));
        for (int r = 0; r < p; ++r)
          CHECK(sim.peak_in_flight[static_cast<std::size_t>(r)] == std::min(p - r, m));
        for (int r = 0; r < p; ++r)
          CHECK(simulate_note(g).peak_in_flight[static_cast<std::size_t>(r)] == m);
      }
    }
}

TEST_CASE("generators: interleaved makespan is m(F+B) + (p-1)(F+B)/v for every legal group") {
  int legal = 0;
  for (int p : {2, 3, 4, 8})
    for (int m : grid_m(p))
      for (int v : {1, 2, 4})
        for (int g = p; g <= m; ++g) {
          if (m % g != 0 && m % g < p) continue;  // Megatron rejects these
          CAPTURE(p);
          CAPTURE(m);
          CAPTURE(v);
          CAPTURE(g);
          auto const s = interleaved_one_f_one_b(p, m, v, {g, false});
          auto const sim = simulate_note(s);
          CHECK(sim.makespan == doctest::Approx(3.0 * m + 3.0 * (p - 1) / v));
          CHECK(sim.bubble_fraction == doctest::Approx(double(p - 1) / (v * m)));
          if (v > 1)
            for (int r = 0; r < p; ++r)
              CHECK(sim.peak_in_flight[static_cast<std::size_t>(r)] ==
                    std::min(2 * (p - r - 1) + (v - 1) * g + 1, m * v));
          ++legal;
        }
  CHECK(legal > 100);
  // Rank 0 holds p + (p-1)/v stage-microbatches at g = p: 5.5 for p=4, v=2 (11 chunks of 1/2).
  CHECK(simulate_note(interleaved_one_f_one_b(4, 8, 2)).peak_activation_bytes[0] ==
        doctest::Approx(5.5));
  CHECK(simulate_note(interleaved_one_f_one_b(4, 8, 4)).peak_activation_bytes[0] ==
        doctest::Approx(4.75));
}

TEST_CASE("generators: configurations Megatron and PyTorch reject are rejected") {
  CHECK_THROWS_WITH_AS(one_f_one_b(4, 3),
                       doctest::Contains("argument `m`: expected >= p (4), actual 3"),
                       weft::schedule_error);
  CHECK_THROWS_WITH_AS(interleaved_one_f_one_b(4, 8, 2, {3, false}),
                       doctest::Contains("argument `group`: expected >= p (4), actual 3"),
                       weft::schedule_error);
  CHECK_THROWS_WITH_AS(interleaved_one_f_one_b(4, 8, 2, {9, false}),
                       doctest::Contains("argument `group`: expected <= m (8), actual 9"),
                       weft::schedule_error);
  CHECK_THROWS_WITH_AS(interleaved_one_f_one_b(4, 9, 2), doctest::Contains("argument `m % group`"),
                       weft::schedule_error);
  CHECK_THROWS_WITH_AS(interleaved_one_f_one_b(4, 9, 2), doctest::Contains("actual 1"),
                       weft::schedule_error);
  CHECK_THROWS_AS(interleaved_one_f_one_b(8, 16, 2, {9, false}), weft::schedule_error);
  CHECK_THROWS_AS(interleaved_one_f_one_b(4, 8, 0), weft::schedule_error);
  CHECK_THROWS_AS(gpipe(0, 8), weft::schedule_error);
  CHECK_THROWS_AS(gpipe(4, 0), weft::schedule_error);
  // Every remainder in (0, p) is rejected, the others are accepted.
  for (int m = 4; m <= 12; ++m)
    for (int g = 4; g <= m; ++g) {
      bool const ok = m % g == 0 || m % g >= 4;
      CAPTURE(m);
      CAPTURE(g);
      if (ok)
        CHECK_NOTHROW(interleaved_one_f_one_b(4, m, 2, {g, false}));
      else
        CHECK_THROWS_AS(interleaved_one_f_one_b(4, m, 2, {g, false}), weft::schedule_error);
    }
}

TEST_CASE("generators: interleaved_group_for gives the least legal group, and it runs") {
  int searched = 0;
  for (int p = 1; p <= 12; ++p)
    for (int m = 1; m <= 60; ++m) {
      CAPTURE(p);
      CAPTURE(m);
      if (m < p) {
        CHECK_THROWS_WITH_AS(static_cast<void>(interleaved_group_for(p, m)),
                             doctest::Contains("argument `m`"), weft::schedule_error);
        // Below p, the default group unchecked: every forward is warmup, and it runs.
        interleaved_options u;
        u.unchecked = true;
        CHECK(check(interleaved_one_f_one_b(p, m, 2, u)).ok);
        continue;
      }
      int const g = interleaved_group_for(p, m);
      auto const legal = [&](int k) { return m % k == 0 || m % k >= p; };
      CHECK(g >= p);
      CHECK(g <= m);
      CHECK(legal(g));
      for (int k = p; k < g; ++k) CHECK_FALSE(legal(k));
      if (m % p == 0) CHECK(g == p);
      // Accepted as checked, valid, and with the formula's makespan.
      auto const s = interleaved_one_f_one_b(p, m, 2, {g, false});
      CHECK(check(s).ok);
      CHECK(simulate_note(s).makespan == doctest::Approx(3.0 * m + 3.0 * (p - 1) / 2));
      ++searched;
    }
  CHECK(searched == 12 * 60 - 66);
  // What the default group unchecked would have run instead: p 5, m 7 cannot progress.
  interleaved_options u;
  u.unchecked = true;
  CHECK_FALSE(check(interleaved_one_f_one_b(5, 7, 2, u)).ok);
  CHECK(interleaved_group_for(5, 7) == 7);
  CHECK(interleaved_group_for(4, 9) == 5);
  CHECK(interleaved_group_for(4, 8) == 4);
  CHECK_THROWS_AS(static_cast<void>(interleaved_group_for(0, 3)), weft::schedule_error);
}

TEST_CASE("generators: built unchecked, rejected configurations break the formula") {
  // p=4, m=9, g=4: remainder 1 < p. The note's simulation gives 37.0; the formula 31.5.
  auto const s = interleaved_one_f_one_b(4, 9, 2, {4, true});
  auto const sim = simulate_note(s);
  double const formula = 3.0 * 9 + 3.0 * 3 / 2;
  CHECK(formula == doctest::Approx(31.5));
  CHECK(sim.makespan == doctest::Approx(37.0));
  CHECK(sim.makespan > formula + 1);
  // p=8, m=16, g=9: remainder 7 < p: 59.5 against 55.5.
  auto const t = simulate_note(interleaved_one_f_one_b(8, 16, 2, {9, true}));
  CHECK(t.makespan == doctest::Approx(59.5));
  CHECK(t.bubble_fraction == doctest::Approx(0.2395833333));
  // A group smaller than p does not even run: the validator's replay finds the deadlock.
  auto const stuck = check(interleaved_one_f_one_b(4, 5, 2, {1, true}));
  CHECK_FALSE(stuck.ok);
  CHECK(stuck.issue.rule == "deadlock");
  CHECK_THROWS_AS(simulate_note(interleaved_one_f_one_b(4, 5, 2, {1, true})), weft::schedule_error);
  // 1F1B with m < p still runs (it is the m = p schedule with fewer microbatches) when unchecked.
  CHECK(simulate_note(one_f_one_b(4, 2, {true})).makespan == doctest::Approx((2 + 3) * 3.0));
}

TEST_CASE("generators: every generated schedule round-trips through text and CSV") {
  for (int p : {2, 3, 4})
    for (int m : grid_m(p)) {
      std::vector<schedule> all = {gpipe(p, m), one_f_one_b(p, m)};
      if (m % p == 0) all.push_back(interleaved_one_f_one_b(p, m, 2));
      all.push_back(interleaved_one_f_one_b(p, m, 4, {m, false}));
      for (auto const& s : all) {
        CHECK(parse_schedule(to_text(s)) == s);
        CHECK(parse_csv(to_csv(s)) == s);
      }
    }
}
