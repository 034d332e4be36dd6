// Tests for how simulate() times a lowered schedule (in program order, as the executor runs it:
// a message leaves where its SEND stands, a RECV holds its rank until the message arrives,
// collectives optionally block), and for lower()'s placement by time, which keeps interleaved
// 1F1B's SENDs from landing after later computes of the sender.
#include <weft/pipeline/cost_model.hpp>
#include <weft/pipeline/lower.hpp>
#include <weft/pipeline/schedules/gpipe.hpp>
#include <weft/pipeline/schedules/interleaved.hpp>
#include <weft/pipeline/schedules/one_f_one_b.hpp>
#include <weft/pipeline/schedules/vocab.hpp>
#include <weft/pipeline/schedules/zero_bubble.hpp>
#include <weft/pipeline/simulate.hpp>
#include <weft/pipeline/text.hpp>
#include <weft/pipeline/validate.hpp>

#include "pipeline/note_costs.hpp"

#include <doctest/doctest.h>

#include <algorithm>
#include <cstddef>
#include <utility>
#include <vector>

using namespace weft::pipeline;

namespace {

std::size_t position(schedule const& s, int rank, action const& a) {
  auto const& prog = s.actions(rank);
  return static_cast<std::size_t>(std::find(prog.begin(), prog.end(), a) - prog.begin());
}

}  // namespace

TEST_CASE("lowered timing: a SEND placed after a later compute delays its receiver") {
  // GPipe p = 2, m = 2, F = 1, B = 2: makespan 9. Moving 0SEND_F0 after 0F1 (still valid) makes
  // rank 1 start at 2 instead of 1, and everything after it one unit later: 10.
  auto const s = gpipe(2, 2);
  auto const low = lower(s);
  auto const costs = note_costs(s);
  CHECK(simulate(low, costs).makespan == doctest::Approx(9.0));
  auto late = low;
  auto const send = s.make(op::send_forward, 0, 0);
  auto const i = position(late, 0, send);
  REQUIRE(i + 1 < late.actions(0).size());
  REQUIRE(late.actions(0)[i + 1] == s.make(op::forward, 0, 1));
  std::swap(late.actions(0)[i], late.actions(0)[i + 1]);
  CHECK(check(late).ok);
  auto const sim = simulate(late, costs);
  CHECK(sim.makespan == doctest::Approx(10.0));
  // The SEND is the instant the message leaves: after 0F1.
  CHECK(sim.times[0][i + 1].start == doctest::Approx(2.0));
  // The compute-only form cannot see where the SEND is.
  CHECK(simulate(s, costs).makespan == doctest::Approx(9.0));
}

TEST_CASE("lowered timing: a RECV spans its rank's wait for the message") {
  // 1F1B p = 2, m = 1 with a transfer time of 0.5: rank 1's RECV_F0 waits from 0 until 1.5.
  auto const low = lower(one_f_one_b(2, 1, {true}));
  auto costs = note_costs(low);
  costs.p2p_latency = 0.5;
  auto const sim = simulate(low, costs);
  auto const r = position(low, 1, low.make(op::recv_forward, 1, 0));
  CHECK(sim.times[1][r].start == doctest::Approx(0.0));
  CHECK(sim.times[1][r].finish == doctest::Approx(1.5));
  CHECK(sim.makespan == doctest::Approx(6.0 + 2 * 0.5));
}

TEST_CASE("lowered timing: interleaved 1F1B lowers to a program that delays nothing") {
  // The lock-step replay alone sends late: at p = 4 its program simulates 31 / 28.5 (m = 8) and
  // 59 / 52.5 (m = 16) of the compute-only schedule, what the executor measured (+9-12 %). The
  // placement by time gives the compute-only makespan, for the unit model lower() plans with and
  // for the same ratios at another scale (F = I = W = 2 ms: the benchmark's sleeps).
  for (int m : {8, 16}) {
    CAPTURE(m);
    auto const s = interleaved_one_f_one_b(4, m, 2);
    auto const want = simulate_note(s).makespan;
    auto const replayed = detail::lower_by_replay(s);
    CHECK(simulate_note(replayed).makespan > want + 0.4);
    auto const low = lower(s);
    CHECK(check(low).ok);
    CHECK(simulate_note(low).makespan == doctest::Approx(want));
    auto const ms = note_costs(s, 2.0, 2.0, 2.0);
    CHECK(simulate(low, ms).makespan == doctest::Approx(simulate(s, ms).makespan));
    // Only the SEND/RECV positions differ: the compute order is the generator's.
    for (int r = 0; r < 4; ++r) {
      std::vector<action> compute;
      for (auto const& a : low.actions(r))
        if (!is_p2p(a.kind)) compute.push_back(a);
      CHECK(compute == s.actions(r));
    }
  }
}

TEST_CASE("lowered timing: lower() is never slower than the replay under the costs it plans for") {
  // Every generator at p = 4: lower(s, costs) is valid and simulates no slower than the replay
  // construction under `costs`; where the replay already delays nothing (GPipe, 1F1B, ZB-H1, ZBV)
  // it is the replay's program, unchanged.
  for (int m : {4, 8, 9}) {
    std::vector<schedule> const all = {gpipe(4, m),
                                       one_f_one_b(4, m),
                                       zero_bubble_h1(4, m),
                                       zero_bubble_v(4, m),
                                       interleaved_one_f_one_b(4, m, 2, {m, false}),
                                       vocab_one_f_one_b(4, m, vocab_variant::one_barrier),
                                       vocab_one_f_one_b(4, m, vocab_variant::two_barrier)};
    for (auto const& s : all) {
      CAPTURE(to_text(s));
      for (auto const& costs : {note_costs(s), unit_costs(s), note_costs(s, 3.0, 1.0, 1.0)}) {
        auto const low = lower(s, costs);
        auto const replayed = detail::lower_by_replay(s);
        CHECK(check(low).ok);
        double const got = simulate(low, costs).makespan;
        double const replay = simulate(replayed, costs).makespan;
        CHECK(got <= replay + 1e-9);
        CHECK(got >= simulate(s, costs).makespan - 1e-9);
        if (got == doctest::Approx(replay)) CHECK(low == replayed);
      }
    }
  }
}

TEST_CASE("lowered timing: blocking collectives hold every rank until they complete") {
  // The executor waits for each vocabulary collective on the rank's thread
  // (cost_model::collectives_block): every rank's collective interval ends when the collective
  // does, and the makespan can only grow against collectives on a stream of their own.
  auto const s = vocab_one_f_one_b(4, 8, vocab_variant::one_barrier);
  auto const low = lower(s);
  auto costs = unit_costs(low);
  costs.collective_latency = 0.125;
  auto const overlapped = simulate(low, costs);
  costs.collectives_block = true;
  auto const blocking = simulate(low, costs);
  CHECK(blocking.makespan >= overlapped.makespan - 1e-9);
  REQUIRE(blocking.collective_times.size() == blocking.collective_order.size());
  for (int r = 0; r < 4; ++r) {
    auto const& prog = low.actions(r);
    std::size_t k = 0;
    for (std::size_t i = 0; i < prog.size(); ++i) {
      if (prog[i].kind != op::collective) continue;
      CAPTURE(r);
      CAPTURE(i);
      auto const& t = blocking.times[static_cast<std::size_t>(r)][i];
      CHECK(t.finish == doctest::Approx(blocking.collective_times[k].finish));
      CHECK(t.start <= t.finish);
      ++k;
    }
  }
}
