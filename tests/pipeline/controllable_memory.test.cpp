// tests/pipeline/controllable_memory.test.cpp — V-Half and V-Min (Qi et al., "Pipeline
// Parallelism with Controllable Memory", arXiv 2405.15362): the rank programs equal the paper's
// reference scheduler (sail-sg/zero-bubble-pipeline-parallelism, scheduler/zbv_greedy.py, run with
// F = B = W = 1 and no communication cost) action for action at four sizes covering both building
// blocks and both gap rules; over a grid of p and m the schedules are valid before and after
// lowering, round-trip through text and CSV, hold at most p + 2 (V-Half) and 2p/3 + 2 (V-Min,
// rounded up) chunk-microbatches on every rank against ZBV's 2p, and under F = I = W cost at most
// half (V-Half) and two thirds (V-Min) of 1F1B's bubble for m >= 2p, never less than ZBV's.
#include <weft/pipeline/lower.hpp>
#include <weft/pipeline/schedules/controllable_memory.hpp>
#include <weft/pipeline/schedules/one_f_one_b.hpp>
#include <weft/pipeline/schedules/zero_bubble.hpp>
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
std::string v_rank_text(schedule const& s, int r) {
  std::string out;
  for (auto const& a : s.actions(r)) out += (out.empty() ? "" : " ") + to_string(a);
  return out;
}

void check_programs(schedule const& s, std::vector<std::string> const& want) {
  REQUIRE(s.num_ranks() == static_cast<int>(want.size()));
  for (int r = 0; r < s.num_ranks(); ++r) {
    CAPTURE(r);
    CHECK(v_rank_text(s, r) == want[static_cast<std::size_t>(r)]);
  }
}
}  // namespace

TEST_CASE("controllable memory: V-Half and V-Min equal zbv_greedy.py's programs") {
  // Rank r holds stage r (chunk 0) and stage 2p-1-r (chunk 1); I and W are the reference's B and W.
  SUBCASE("V-Half, p = 4 (even: the block's 3-slot gap), m = 8") {
    auto const s = v_half(4, 8);
    CHECK(s.style() == placement::v);
    CHECK(s.num_stages() == 8);
    check_programs(
        s, {"0F0 0F1 0F2 0F3 0F4 7F0 7I0 7W0 7F1 7I1 7W1 7F2 0I0 7I2 7W2 7F3 0W0 0F5 0I1 7I3 7W3 "
            "7F4 0W1 0F6 0I2 7I4 7W4 7F5 0W2 0F7 0I3 7I5 7W5 7F6 7I6 7W6 0I4 0W3 0W4 7F7 7I7 0I5 "
            "7W7 0I6 0W5 0W6 0I7 0W7",
            "1F0 1F1 1F2 1F3 6F0 6F1 6I0 6W0 6F2 6I1 6W1 1I0 1W0 1F4 6F3 6I2 6W2 1I1 1W1 1F5 6F4 "
            "6I3 6W3 1I2 1W2 1F6 6F5 6I4 6W4 1I3 1F7 1W3 6F6 6I5 6W5 1I4 6I6 6W6 6F7 1W4 1I5 6I7 "
            "1I6 6W7 1W5 1W6 1I7 1W7",
            "2F0 2F1 2F2 5F0 5F1 5F2 5I0 5W0 2F3 5I1 2I0 5W1 2W0 5F3 2F4 2I1 5I2 5W2 5F4 2W1 2F5 "
            "2I2 5I3 5W3 5F5 2W2 2F6 2I3 5I4 5W4 5F6 2W3 2F7 2I4 5I5 5W5 5F7 5I6 2I5 5W6 2I6 5I7 "
            "5W7 2W4 2I7 2W5 2W6 2W7",
            "3F0 4F0 3F1 4F1 3F2 4F2 4I0 4W0 3I0 3W0 3F3 4F3 4I1 4W1 3I1 3W1 3F4 4F4 4I2 4W2 3I2 "
            "3W2 3F5 4F5 4I3 4W3 3I3 3F6 3W3 4F6 4I4 3I4 4W4 3F7 3W4 4F7 4I5 3I5 4I6 3I6 4W5 4W6 "
            "4I7 3I7 4W7 3W5 3W6 3W7"});
  }
  SUBCASE("V-Half, p = 3 (odd: no gap), m = 5") {
    check_programs(
        v_half(3, 5),
        {"0F0 0F1 0F2 5F0 5I0 5W0 5F1 5I1 5W1 0I0 0W0 0F3 5F2 5I2 5W2 0I1 0W1 0F4 5F3 5I3 5W3 "
         "0I2 0W2 5F4 5I4 0I3 5W4 0W3 0I4 0W4",
         "1F0 1F1 4F0 4F1 4I0 4W0 1F2 1I0 4I1 4W1 4F2 1W0 1F3 1I1 4I2 4W2 4F3 1W1 1F4 1I2 4I3 "
         "4W3 4F4 1W2 1I3 4I4 4W4 1W3 1I4 1W4",
         "2F0 3F0 2F1 3F1 3I0 3W0 2I0 2W0 2F2 3F2 3I1 3W1 2I1 2W1 2F3 3F3 3I2 2I2 3W2 2F4 2W2 "
         "3F4 3I3 2I3 3W3 2W3 3I4 2I4 3W4 2W4"});
  }
  SUBCASE("V-Min, p = 3 (a multiple of 3: the block's 2-slot gap), m = 6") {
    check_programs(
        v_min(3, 6),
        {"0F0 0F1 0F2 5F0 5I0 5W0 5F1 0I0 5I1 5W1 0W0 5F2 0F3 0I1 5I2 5W2 0W1 5F3 0F4 0I2 5I3 "
         "5W3 0W2 5F4 0F5 0I3 5I4 5W4 0W3 5F5 5I5 0I4 5W5 0W4 0I5 0W5",
         "1F0 1F1 4F0 4F1 4I0 4W0 1I0 1F2 1W0 4I1 4F2 4W1 1I1 1F3 1W1 4I2 4F3 4W2 1I2 1F4 1W2 "
         "4I3 4F4 4W3 1I3 1F5 1W3 4I4 4F5 4W4 1I4 4I5 4W5 1W4 1I5 1W5",
         "2F0 3F0 2F1 3F1 3I0 2I0 3W0 2W0 2F2 3F2 3I1 2I1 3W1 2W1 2F3 3F3 3I2 2I2 3W2 2W2 2F4 "
         "3F4 3I3 2I3 3W3 2W3 2F5 3F5 3I4 2I4 3W4 2W4 3I5 2I5 3W5 2W5"});
  }
  SUBCASE("V-Min, p = 2 (no gap), m = 4") {
    check_programs(v_min(2, 4), {"0F0 0F1 3F0 3I0 3W0 0I0 0W0 3F1 3I1 3W1 0F2 0I1 0W1 3F2 3I2 "
                                 "3W2 0F3 0I2 0W2 3F3 3I3 3W3 0I3 0W3",
                                 "1F0 2F0 2I0 1I0 1F1 2F1 2W0 1W0 2I1 1I1 1F2 2F2 2W1 1W1 2I2 "
                                 "1I2 1F3 2F3 2W2 1W2 2I3 1I3 2W3 1W3"});
  }
}

TEST_CASE("controllable memory: valid over the grid, within their memory, between ZBV and 1F1B") {
  for (int p : {1, 2, 3, 4, 5, 6, 7, 8})
    for (int m : {1, 2, p, 2 * p, 2 * p + 1, 3 * p, 4 * p + 1, 8 * p}) {
      CAPTURE(p);
      CAPTURE(m);
      auto const half = v_half(p, m);
      auto const min = v_min(p, m);
      auto const zbv = simulate_note(zero_bubble_v(p, m));
      generator_options unchecked;
      unchecked.unchecked = true;
      auto const base = simulate_note(one_f_one_b(p, m, unchecked));
      for (auto const* s : {&half, &min}) {
        bool const is_half = s == &half;
        CAPTURE(is_half);
        CHECK(s->style() == placement::v);
        CHECK(check(*s).ok);
        auto const low = lower(*s);
        auto const verdict = check(low);
        CAPTURE(verdict.issue.message);
        CHECK(verdict.ok);
        CHECK(parse_schedule(to_text(low)) == low);
        csv_options v_placement;  // one rank: a V and a loop look alike in a CSV
        v_placement.placement_override = static_cast<int>(placement::v);
        CHECK(parse_csv(to_csv(*s), p == 1 ? v_placement : csv_options{}) == *s);
        for (int r = 0; r < p; ++r) {  // every chunk-microbatch once as F, I and W
          int f = 0, i = 0, w = 0, b = 0;
          for (auto const& a : s->actions(r)) {
            f += a.kind == op::forward;
            i += a.kind == op::backward_input;
            w += a.kind == op::backward_weight;
            b += a.kind == op::backward;
          }
          CHECK(f == 2 * m);
          CHECK(i == 2 * m);
          CHECK(w == 2 * m);
          CHECK(b == 0);
        }
        auto const sim = simulate_note(*s);
        CHECK(simulate_note(low).makespan == doctest::Approx(sim.makespan));
        // Chunk-microbatches held (1F1B holds p stage-microbatches, 2p chunks; so does ZBV).
        int const cap = is_half ? p + 2 : (2 * p + 2) / 3 + 2;
        for (int r = 0; r < p; ++r) {
          auto const ri = static_cast<std::size_t>(r);
          CHECK(sim.busy[ri] == doctest::Approx(3.0 * m));
          CHECK(sim.peak_in_flight[ri] <= std::min(cap, 2 * m));
        }
        if (m >= 2 * p) {
          // The bubble (makespan beyond 3m): at most 1/2 (V-Half) or 2/3 (V-Min) of 1F1B's, at
          // least ZBV's; ZBV holds 2p on every rank.
          double const bubble = sim.makespan - 3.0 * m;
          double const base_bubble = base.makespan - 3.0 * m;
          CHECK(bubble <= (is_half ? 0.5 : 2.0 / 3.0) * base_bubble + 1e-9);
          CHECK(sim.makespan >= zbv.makespan - 1e-9);
          CHECK(*std::max_element(zbv.peak_in_flight.begin(), zbv.peak_in_flight.end()) == 2 * p);
        }
      }
    }
}

TEST_CASE("controllable memory: V-Half and V-Min refuse p < 1 and m < 1, naming the argument") {
  CHECK_THROWS_WITH_AS(v_half(0, 8), doctest::Contains("argument `p`: expected >= 1, actual 0"),
                       weft::schedule_error);
  CHECK_THROWS_WITH_AS(v_min(4, 0), doctest::Contains("argument `m`: expected >= 1, actual 0"),
                       weft::schedule_error);
  CHECK_NOTHROW(v_min(1, 1));
}
