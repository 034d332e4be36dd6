// Tests for weft/pipeline/schedules/dualpipe.hpp: DualPipeV's programs equal PyTorch's regression
// artifact for ScheduleDualPipeV (test/distributed/pipelining/artifacts/dualpipev_4rank_10mb.csv,
// its overlapped F/B pairs written as the forward then the backward); over a grid of p and m the
// schedule is valid before and after lowering, holds 2p+1 chunk-microbatches on every rank (the
// DualPipe README's PP + 1) and, under F = I = W, idles (p-1)/2 per rank like ZBV; m < 2p is
// refused. PyTorch's overlapped-pair CSV cells parse.
#include <weft/pipeline/lower.hpp>
#include <weft/pipeline/schedules/dualpipe.hpp>
#include <weft/pipeline/schedules/zero_bubble.hpp>
#include <weft/pipeline/simulate.hpp>
#include <weft/pipeline/text.hpp>
#include <weft/pipeline/validate.hpp>

#include "pipeline/note_costs.hpp"

#include <doctest/doctest.h>

#include <string>
#include <vector>

using namespace weft::pipeline;

namespace {
std::string rank_text(schedule const& s, int r) {
  std::string out;
  for (auto const& a : s.actions(r)) out += (out.empty() ? "" : " ") + to_string(a);
  return out;
}
}  // namespace

TEST_CASE("dualpipe: DualPipeV p=4, m=10 is PyTorch's dualpipev_4rank_10mb order") {
  auto const s = dualpipe_v(4, 10);
  CHECK(s.style() == placement::v);
  CHECK(s.num_stages() == 8);
  // Rank r holds stages r and 7-r; the pairs (aFx;bBy) of the artifact are "aFx bBy" here.
  std::vector<std::string> const want = {
      "0F0 0F1 0F2 0F3 0F4 0F5 0F6 7F0 7I0 7W0 7F1 7I1 7W1 7F2 7I2 7W2 7F3 0F7 7B3 7F4 0B0 0F8 "
      "7B4 7F5 0B1 0F9 7B5 7F6 0B2 7B6 7F7 0B3 7B7 7F8 0B4 7B8 7F9 0B5 7B9 0I6 0W6 0I7 0W7 0I8 "
      "0W8 0I9 0W9",
      "1F0 1F1 1F2 1F3 1F4 6F0 1F5 6F1 6I0 6W0 6F2 6I1 6W1 6F3 1F6 6B2 6F4 1B0 1F7 6B3 6F5 1B1 "
      "1F8 6B4 6F6 1B2 1F9 6B5 6F7 1B3 6B6 6F8 1B4 6B7 6F9 1B5 6B8 1B6 6I9 1I7 6W9 1I8 1W7 1I9 "
      "1W8 1W9",
      "2F0 2F1 2F2 5F0 2F3 5F1 2F4 5F2 5I0 5W0 5F3 2F5 5B1 5F4 2B0 2F6 5B2 5F5 2B1 2F7 5B3 5F6 "
      "2B2 2F8 5B4 5F7 2B3 2F9 5B5 5F8 2B4 5B6 5F9 2B5 5B7 2B6 5B8 2I7 5I9 2I8 2W7 2I9 5W9 2W8 "
      "2W9",
      "3F0 4F0 3F1 4F1 3F2 4F2 3F3 4F3 3F4 4B0 4F4 3B0 3F5 4B1 4F5 3B1 3F6 4B2 4F6 3B2 3F7 4B3 "
      "4F7 3B3 3F8 4B4 4F8 3B4 3F9 4B5 4F9 3B5 4B6 3B6 4B7 3B7 4I8 3I8 4I9 3I9 4W8 3W8 4W9 3W9"};
  for (int r = 0; r < 4; ++r) {
    CAPTURE(r);
    CHECK(rank_text(s, r) == want[static_cast<std::size_t>(r)]);
  }
}

TEST_CASE("dualpipe: DualPipeV is valid over the grid, holds 2p+1 and idles (p-1)/2 per rank") {
  for (int p : {1, 2, 3, 4, 5, 8})
    for (int m : {2 * p, 2 * p + 1, 3 * p, 4 * p + 1, 6 * p}) {
      CAPTURE(p);
      CAPTURE(m);
      auto const s = dualpipe_v(p, m);
      CHECK(check(s).ok);
      auto const low = lower(s);
      auto const verdict = check(low);
      CAPTURE(verdict.issue.message);
      CHECK(verdict.ok);
      CHECK(parse_schedule(to_text(low)) == low);
      // A CSV says no placement: with one rank a V and a loop put every stage on rank 0 alike,
      // and the parser infers `loop`, so that case names it.
      csv_options v_placement;
      v_placement.placement_override = static_cast<int>(placement::v);
      CHECK(parse_csv(to_csv(s), p == 1 ? v_placement : csv_options{}) == s);
      // Every (stage, microbatch) has one forward and either one full backward or an I and a W;
      // both forms occur on every rank with p >= 2 (split at both ends, full in the middle).
      for (int r = 0; r < p; ++r) {
        int f = 0, b = 0, i = 0, w = 0;
        for (auto const& a : s.actions(r)) {
          f += a.kind == op::forward;
          b += a.kind == op::backward;
          i += a.kind == op::backward_input;
          w += a.kind == op::backward_weight;
        }
        CHECK(f == 2 * m);
        CHECK(i == w);
        CHECK(b + i == 2 * m);
        CHECK(i > 0);
        CHECK(b > 0);
      }
      // Unit costs, chunks half a stage: no idle time but the (p-1) x chunk-F start offset.
      auto const sim = simulate_note(s);
      CHECK(sim.makespan == doctest::Approx(3.0 * m + 0.5 * (p - 1)));
      for (int r = 0; r < p; ++r) {
        auto const ri = static_cast<std::size_t>(r);
        CHECK(sim.busy[ri] == doctest::Approx(3.0 * m));
        CHECK(sim.peak_in_flight[ri] == 2 * p + 1);
      }
      CHECK(simulate_note(low).makespan == doctest::Approx(sim.makespan));
      // ZBV (the same V, everything split) at the same size: the same makespan, one chunk less.
      auto const zbv = simulate_note(zero_bubble_v(p, m));
      CHECK(zbv.makespan == doctest::Approx(sim.makespan));
      CHECK(zbv.peak_in_flight.front() == 2 * p);
    }
}

TEST_CASE("dualpipe: PyTorch's overlapped F/B cells read as the forward then the backward") {
  // Rank 3's row of the p = 4, m = 10 artifact, cut after its first pairs, with the other rows
  // empty (PyTorch's CSVs have a row per rank).
  auto const s = parse_csv(
      "\n\n\n3F0,4F0,3F1,4F1,3F2,4F2,3F3,4F3,3F4,4B0,(4F4;3B0)OVERLAP_F_B,\"(3F5;4B1)OVERLAP_F_"
      "B\"");
  CHECK(s.style() == placement::v);
  CHECK(rank_text(s, 3) == "3F0 4F0 3F1 4F1 3F2 4F2 3F3 4F3 3F4 4B0 4F4 3B0 3F5 4B1");
  CHECK(parse_csv("0F0,(0F1;0I0)OVERLAP_F_B").actions(0).size() == 3);
  for (char const* bad : {"(0F1;0B0)", "(0F1)OVERLAP_F_B", "(0B0;0F1)OVERLAP_F_B",
                          "(0F1;0W0)OVERLAP_F_B", "(;)OVERLAP_F_B", "(0F1;0B0)OVERLAP_F_"}) {
    CAPTURE(bad);
    CHECK_THROWS_AS(parse_csv(bad), weft::schedule_error);
  }
  CHECK_THROWS_WITH_AS(parse_csv("(0B0;0F1)OVERLAP_F_B"),
                       doctest::Contains("a forward and a backward (B or I), actual "
                                         "`(0B0;0F1)OVERLAP_F_B`"),
                       weft::schedule_error);
}

TEST_CASE("dualpipe: DualPipeV refuses m < 2p and p < 1, naming the argument") {
  CHECK_THROWS_WITH_AS(dualpipe_v(4, 7),
                       doctest::Contains("argument `m`: expected >= 2p (8), actual 7"),
                       weft::schedule_error);
  CHECK_THROWS_WITH_AS(dualpipe_v(0, 8), doctest::Contains("argument `p`: expected >= 1, actual 0"),
                       weft::schedule_error);
  CHECK_NOTHROW(dualpipe_v(4, 8));
}
