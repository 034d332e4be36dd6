// Tests for weft/pipeline/lower.hpp and validate.hpp: every generator's schedule lowers to a
// valid, deadlock-free program that simulates like its compute-only form and round-trips; and
// at p=4, m=8 every single adjacent swap and every single dropped action is judged by the
// validator exactly as the independent brute-force replay in reference_replay.hpp judges it.
#include "reference_replay.hpp"

#include <weft/pipeline/lower.hpp>
#include <weft/pipeline/schedules/controllable_memory.hpp>
#include <weft/pipeline/schedules/dualpipe.hpp>
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

#include <string>
#include <utility>
#include <vector>

using namespace weft::pipeline;
using weft_test::reference_valid;

namespace {

std::vector<std::pair<std::string, schedule>> generators_p4_m8() {
  return {
      {"gpipe", gpipe(4, 8)},
      {"1f1b", one_f_one_b(4, 8)},
      {"interleaved v2", interleaved_one_f_one_b(4, 8, 2)},
      {"interleaved v4", interleaved_one_f_one_b(4, 8, 4)},
      {"zb-h1", zero_bubble_h1(4, 8)},
      {"zb-h2", zero_bubble_h2(4, 8)},
      {"zbv", zero_bubble_v(4, 8)},
      {"v-half", v_half(4, 8)},
      {"v-min", v_min(4, 8)},
      {"dualpipe-v", dualpipe_v(4, 8)},
      {"vocab 1-barrier", vocab_one_f_one_b(4, 8, vocab_variant::one_barrier)},
      {"vocab 2-barrier", vocab_one_f_one_b(4, 8, vocab_variant::two_barrier)},
  };
}

// A lowered schedule without its point-to-point ops.
schedule without_p2p(schedule const& low) {
  schedule out(low.num_ranks(), low.num_stages(), low.num_microbatches(), low.style(), low.vocab());
  for (int r = 0; r < low.num_ranks(); ++r)
    for (auto const& a : low.actions(r))
      if (!is_p2p(a.kind)) out.push(r, a);
  return out;
}

}  // namespace

TEST_CASE("lowering: generated schedules lower to valid programs with the same timing") {
  for (int p : {2, 3, 4, 8})
    for (int m : {p, 2 * p + 1, 4 * p}) {
      std::vector<schedule> all = {gpipe(p, m), one_f_one_b(p, m),
                                   interleaved_one_f_one_b(p, m, 2, {m, false})};
      if (m % p == 0) all.push_back(interleaved_one_f_one_b(p, m, 4));
      all.push_back(zero_bubble_h2(p, m));
      if (m >= 2 * p) all.push_back(dualpipe_v(p, m));
      for (auto const& s : all) {
        CAPTURE(to_text(s));
        CHECK(check(s).ok);  // the compute-only form is valid too
        auto const low = lower(s);
        auto const verdict = check(low);
        CAPTURE(verdict.issue.message);
        CHECK(verdict.ok);
        CHECK(reference_valid(low));
        CHECK(simulate_note(low).makespan == doctest::Approx(simulate_note(s).makespan));
        CHECK(parse_schedule(to_text(low)) == low);
        CHECK(parse_csv(to_csv(low)) == low);
        CHECK(without_p2p(low) == s);  // the compute-only schedule, the messages removed
      }
    }
}

TEST_CASE("lowering for weft's executor: the vocabulary schedules run as designed") {
  // replay_model::executor(): receives posted up front, sends that never block. There the
  // vocabulary-balanced schedules keep the placement by time, which simulates exactly like the
  // compute-only form; the rendezvous lowering (the default) is slower, because that placement
  // breaks its rule that two ranks post their messages to each other in one order.
  auto const model = replay_model::executor();
  int slower = 0, cases = 0;
  for (auto variant : {vocab_variant::one_barrier, vocab_variant::two_barrier})
    for (int p : {2, 3, 4, 8})
      for (int m : {p, 2 * p + 1, 4 * p, 32}) {
        auto const s = vocab_one_f_one_b(p, m, variant);
        CAPTURE(to_text(s));
        auto const costs = unit_costs(s, 1.0, 1.0, 1.0, 0.0);
        auto const low = lower(s, model);
        auto const verdict = check(low, model);
        CAPTURE(verdict.issue.message);
        CHECK(verdict.ok);
        CHECK(check(low, {true, true}).ok);  // and with the collectives overlapped
        CHECK(reference_valid(low, true, false));
        CHECK(reference_valid(low, true, true));
        double const design = simulate(s, costs).makespan;
        CHECK(simulate(low, costs).makespan == doctest::Approx(design));
        double const rendezvous = simulate(lower(s), costs).makespan;
        CHECK(rendezvous >= design - 1e-9);
        slower += rendezvous > design * 1.05;
        ++cases;
        // The rendezvous rule refuses exactly the programs the default lowering would not keep.
        if (rendezvous > design + 1e-9) {
          auto const strict = check(low);
          CHECK_FALSE(strict.ok);
          CHECK(strict.issue.rule == "p2p-order");
          CHECK_FALSE(reference_valid(low));
        }
        CHECK(parse_schedule(to_text(low)) == low);
        CHECK(without_p2p(low) == s);
      }
  CHECK(slower > cases / 2);
  // The other generators: the same validity, and their lowering is the default's timing.
  for (auto const& entry : generators_p4_m8()) {
    CAPTURE(entry.first);
    auto const low = lower(entry.second, model);
    CHECK(check(low, model).ok);
    CHECK(simulate_note(low).makespan <= simulate_note(lower(entry.second)).makespan + 1e-9);
  }
}

TEST_CASE("lowering: the executor's replay models judge mutations like the reference (p=4, m=8)") {
  // Buffered point-to-point with blocking and with overlapped collectives: every adjacent swap
  // and every dropped action of each generator's executor lowering, against the reference
  // replay's queues (reference_replay.hpp).
  for (auto const& entry : generators_p4_m8()) {
    CAPTURE(entry.first);
    auto const low = lower(entry.second, replay_model::executor());
    for (bool overlapped : {false, true}) {
      CAPTURE(overlapped);
      replay_model const model{true, overlapped};
      REQUIRE(check(low, model).ok);
      REQUIRE(reference_valid(low, true, overlapped));
      int tried = 0, caught = 0;
      auto judge = [&](schedule const& m) {
        bool const mine = check(m, model).ok, ref = reference_valid(m, true, overlapped);
        ++tried;
        caught += !ref;
        CHECK(mine == ref);
      };
      for (int r = 0; r < low.num_ranks(); ++r) {
        auto const n = low.actions(r).size();
        for (std::size_t i = 0; i + 1 < n; ++i) {
          auto m = low;
          std::swap(m.actions(r)[i], m.actions(r)[i + 1]);
          CAPTURE(r);
          CAPTURE(i);
          judge(m);
        }
        for (std::size_t i = 0; i < n; ++i) {
          auto m = low;
          m.actions(r).erase(m.actions(r).begin() + static_cast<std::ptrdiff_t>(i));
          judge(m);
        }
      }
      CHECK(caught > 0);
      CHECK(caught < tried);
    }
  }
}

TEST_CASE("lowering: buffered messages need one order per direction, not across the two") {
  // Rank 0 sends both activations before it receives a gradient; rank 1 receives, computes and
  // sends back one microbatch at a time. The two ranks see the messages between them in different
  // orders across the two directions: under rendezvous a deadlock (rank 0 waits in its second
  // send, rank 1 in its first), which rule p2p-order refuses first; fine where sends are buffered.
  schedule x(2, 2, 2);
  for (int mb : {0, 1}) x.push(0, x.make(op::forward, 0, mb));
  x.push(0, x.make(op::send_forward, 0, 0));
  x.push(0, x.make(op::send_forward, 0, 1));
  x.push(0, x.make(op::recv_backward, 0, 0));
  x.push(0, x.make(op::recv_backward, 0, 1));
  for (int mb : {0, 1}) x.push(0, x.make(op::backward, 0, mb));
  for (int mb : {0, 1}) {
    x.push(1, x.make(op::recv_forward, 1, mb));
    x.push(1, x.make(op::forward, 1, mb));
    x.push(1, x.make(op::backward, 1, mb));
    x.push(1, x.make(op::send_backward, 1, mb));
  }
  auto const strict = check(x);
  CHECK_FALSE(strict.ok);
  CHECK(strict.issue.rule == "p2p-order");
  CHECK(check(x, replay_model::executor()).ok);
  CHECK(reference_valid(x, true, false));
  // Rank 1 receiving microbatch 1's activation first: a receiver that matches messages in order
  // would take microbatch 0's data for it, so every model refuses it.
  schedule y(2, 2, 2);
  y.actions(0) = x.actions(0);
  y.push(1, y.make(op::recv_forward, 1, 1));
  y.push(1, y.make(op::recv_forward, 1, 0));
  for (int mb : {0, 1}) {
    y.push(1, y.make(op::forward, 1, mb));
    y.push(1, y.make(op::backward, 1, mb));
    y.push(1, y.make(op::send_backward, 1, mb));
  }
  auto const buffered = check(y, replay_model::executor());
  CHECK_FALSE(buffered.ok);
  CHECK(buffered.issue.rule == "p2p-order");
  CHECK(buffered.issue.message.find("rank 0 sends its messages to rank 1 in another order than "
                                    "rank 1 receives them") != std::string::npos);
  CHECK_FALSE(reference_valid(y, true, false));
  CHECK_FALSE(check(y).ok);
}

TEST_CASE("lowering: exchanges follow the rank-parity rule") {
  // 1F1B steady state: rank 0 receives the gradient before it sends the next activation, rank 1
  // sends the gradient before it receives that activation (lower rank receives first).
  auto const low = lower(one_f_one_b(2, 4));
  auto const text = to_text(low);
  CHECK(text.find("0: 0F0 0SEND_F0 0F1 0RECV_B0 0SEND_F1 0B0") != std::string::npos);
  CHECK(text.find("1: 1RECV_F0 1F0 1B0 1SEND_B0 1RECV_F1 1F1") != std::string::npos);
  CHECK_THROWS_AS(lower(low), weft::schedule_error);
}

TEST_CASE("lowering: the validator names the rank, the action and the rule") {
  auto const good = lower(one_f_one_b(4, 8));
  {
    auto bad = good;  // swap two RECVs on rank 1 (the note's mutation): a pairing-order deadlock
    auto& prog = bad.actions(1);
    std::size_t a = 0, b = 0;
    for (std::size_t i = 0; i < prog.size(); ++i)
      if (is_recv(prog[i].kind)) {
        if (a == 0)
          a = i;
        else if (b == 0 && prog[i].kind == op::recv_forward)
          b = i;
      }
    std::swap(prog[a], prog[b]);
    auto const v = check(bad);
    CHECK_FALSE(v.ok);
    CHECK_FALSE(reference_valid(bad));
    CHECK(v.issue.rule != "");
    CHECK_THROWS_WITH_AS(validate(bad), doctest::Contains("rule `"), weft::schedule_error);
  }
  {
    auto bad = good;  // backward before its forward on rank 3
    auto& prog = bad.actions(3);
    prog.erase(prog.begin() + 1);  // 3F0
    auto const v = check(bad);
    CHECK(v.issue.rule == "completeness");
    CHECK_THROWS_WITH_AS(validate(bad), doctest::Contains("(stage 3, microbatch 0) has 0 forwards"),
                         weft::schedule_error);
  }
  {
    auto bad = good;  // FIFO: F1 before F0 on rank 0
    auto& prog = bad.actions(0);
    std::swap(prog[0], prog[2]);
    auto const v = check(bad);
    CHECK(v.issue.rule == "fifo");
    CHECK(v.issue.rank == 0);
    CHECK(v.issue.index == 2);
    CHECK_THROWS_WITH_AS(validate(bad), doctest::Contains("rank 0, action 2, rule `fifo`"),
                         weft::schedule_error);
  }
  {
    auto bad = good;  // SEND before its producer on rank 0
    auto& prog = bad.actions(0);
    std::swap(prog[0], prog[1]);
    auto const v = check(bad);
    CHECK(v.issue.rule == "dependency");
    CHECK(v.issue.index == 0);
  }
  {
    auto bad = good;  // a stage on the wrong rank
    bad.actions(0).front().stage = 1;
    CHECK(check(bad).issue.rule == "mapping");
  }
}

TEST_CASE("lowering: mutations are judged like the brute-force reference replay (p=4, m=8)") {
  for (auto const& entry : generators_p4_m8()) {
    auto const& name = entry.first;
    auto const& compute = entry.second;
    CAPTURE(name);
    auto const low = lower(compute);
    REQUIRE(check(low).ok);
    REQUIRE(reference_valid(low));
    int swaps = 0, drops = 0, caught = 0, agree = 0;
    for (int r = 0; r < low.num_ranks(); ++r) {
      auto const n = low.actions(r).size();
      for (std::size_t i = 0; i + 1 < n; ++i) {
        auto m = low;
        std::swap(m.actions(r)[i], m.actions(r)[i + 1]);
        bool const mine = check(m).ok, ref = reference_valid(m);
        agree += mine == ref;
        caught += !ref;
        ++swaps;
        if (mine != ref) {
          CAPTURE(r);
          CAPTURE(i);
          CAPTURE(to_string(low.actions(r)[i]));
          CAPTURE(to_string(low.actions(r)[i + 1]));
          CHECK(mine == ref);
        }
      }
      for (std::size_t i = 0; i < n; ++i) {
        auto m = low;
        m.actions(r).erase(m.actions(r).begin() + static_cast<std::ptrdiff_t>(i));
        bool const mine = check(m).ok, ref = reference_valid(m);
        agree += mine == ref;
        ++drops;
        CHECK_FALSE(ref);  // every action of a lowered schedule is needed
        if (mine != ref) {
          CAPTURE(r);
          CAPTURE(to_string(low.actions(r)[i]));
          CHECK(mine == ref);
        }
      }
    }
    CHECK(agree == swaps + drops);
    CHECK(caught > 0);
    CHECK(caught < swaps);  // some swaps are harmless, so the check is not vacuous either way
    MESSAGE(name << ": " << swaps << " swaps (" << caught << " invalid), " << drops << " drops");
  }
}

TEST_CASE("lowering: every generator's schedules round-trip through text and CSV, both forms") {
  int n = 0;
  for (int p : {2, 3, 4, 8})
    for (int m : {p, p + 1, 2 * p, 4 * p}) {
      std::vector<schedule> all = {gpipe(p, m),
                                   one_f_one_b(p, m),
                                   interleaved_one_f_one_b(p, m, 2, {m, false}),
                                   interleaved_one_f_one_b(p, m, 4, {m, false}),
                                   zero_bubble_h1(p, m),
                                   zero_bubble_h2(p, m),
                                   zero_bubble_v(p, m),
                                   v_half(p, m),
                                   v_min(p, m),
                                   vocab_one_f_one_b(p, m, vocab_variant::one_barrier),
                                   vocab_one_f_one_b(p, m, vocab_variant::two_barrier)};
      if (m >= 2 * p) all.push_back(dualpipe_v(p, m));
      for (auto const& s : all)
        for (auto const& form : {s, lower(s)}) {
          CHECK(parse_schedule(to_text(form)) == form);
          CHECK(parse_csv(to_csv(form)) == form);
          ++n;
        }
    }
  CHECK(n == 4 * 4 * 11 * 2 + 4 * 2 * 2);  // DualPipeV at m = 2p and 4p
}
