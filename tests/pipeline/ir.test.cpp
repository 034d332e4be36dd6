// Tests for weft/pipeline/action.hpp, schedule.hpp and text.hpp: the action text form, the stage
// mappings, and exact text/CSV round trips (every generator's schedules are round-tripped in
// generators.test.cpp and lowering.test.cpp too).
#include <weft/pipeline/action.hpp>
#include <weft/pipeline/schedule.hpp>
#include <weft/pipeline/schedules/gpipe.hpp>
#include <weft/pipeline/schedules/interleaved.hpp>
#include <weft/pipeline/schedules/one_f_one_b.hpp>
#include <weft/pipeline/text.hpp>

#include <doctest/doctest.h>

#include <string>
#include <vector>

using namespace weft::pipeline;

TEST_CASE("ir: action text follows PyTorch's letters plus S, T, IF, IB and collective tags") {
  schedule s(4, 8, 8, placement::v);
  CHECK(to_string(s.make(op::forward, 2, 0)) == "2F0");
  CHECK(to_string(s.make(op::backward_input, 1, 1)) == "1I1");
  CHECK(to_string(s.make(op::backward_weight, 0, 3)) == "0W3");
  CHECK(to_string(s.make(op::backward, 0, 3)) == "0B3");
  CHECK(to_string(s.make(op::recv_forward, 3, 1)) == "3RECV_F1");
  CHECK(to_string(s.make(op::send_backward, 5, 12)) == "5SEND_B12");
  CHECK(to_string(s.make(op::vocab_forward, 2, 0)) == "2S0");
  CHECK(to_string(s.make(op::vocab_backward, 2, 7)) == "2T7");
  CHECK(to_string(s.make(op::input_forward, 0, 3)) == "0IF3");
  CHECK(to_string(s.make(op::input_backward, 0, 3)) == "0IB3");
  CHECK(to_string(schedule::make_collective(collective_kind::c0, 5)) == "*C0:5");
  CHECK(to_string(schedule::make_collective(collective_kind::broadcast_output, 8)) == "*BX:8");

  // Every token parses back to the same op, stage and microbatch.
  for (std::string t : {"2F0", "1I1", "0W3", "0B3", "3RECV_F1", "3SEND_F1", "2RECV_B0", "2SEND_B0",
                        "2S0", "2T7", "0IF3", "0IB3", "*C0:5", "*C1:0", "*BX:8", "*RE:2", "*BE:11"})
    CHECK(to_string(parse_action(t)) == t);
  auto a = parse_action("13RECV_B27");
  CHECK(a.kind == op::recv_backward);
  CHECK(a.stage == 13);
  CHECK(a.microbatch == 27);
}

TEST_CASE("ir: malformed action text throws a schedule_error naming the text") {
  for (std::string t :
       {"", "F0", "2F", "2X0", "2F-1", "*C2:1", "*C0", "*C0:x", "2SEND_X1", "2f0"}) {
    CAPTURE(t);
    CHECK_THROWS_AS(parse_action(t), weft::schedule_error);
  }
  CHECK_THROWS_WITH_AS(parse_action("2Q0"), doctest::Contains("actual `2Q0`"),
                       weft::schedule_error);
}

TEST_CASE("ir: derived fields come from the stage mapping") {
  schedule loop(4, 8, 4, placement::loop);
  schedule vee(4, 8, 4, placement::v);
  std::vector<int> want_v = {0, 1, 2, 3, 3, 2, 1, 0};
  for (int st = 0; st < 8; ++st) {
    CHECK(loop.stage_to_rank(st) == st % 4);
    CHECK(vee.stage_to_rank(st) == want_v[static_cast<std::size_t>(st)]);
  }
  // PyTorch's "v" repeats for 4 chunks: 0..3, 3..0, 0..3, 3..0.
  schedule v4(4, 16, 4, placement::v);
  CHECK(v4.stage_to_rank(9) == 1);
  CHECK(v4.stage_to_rank(12) == 3);
  auto send = vee.make(op::send_forward, 3, 2);  // stage 3 -> 4, both on rank 3
  CHECK(send.peer == 3);
  CHECK(send.chunk == 0);
  auto recv = vee.make(op::recv_backward, 5, 2);  // grad from stage 6 on rank 1
  CHECK(recv.peer == 1);
  CHECK(recv.chunk == 1);
  CHECK(loop.make(op::recv_forward, 4, 0).peer == 3);
  // stage_at inverts the mapping: every (rank, chunk) names the stage that maps back to it.
  for (auto const* s : {&loop, &vee, &v4})
    for (int r = 0; r < s->num_ranks(); ++r)
      for (int k = 0; k < s->num_chunks(); ++k) {
        int const st = s->stage_at(r, k);
        CHECK(s->stage_to_rank(st) == r);
        CHECK(s->chunk_of(st) == k);
      }
  CHECK(vee.stage_at(0, 1) == 7);
  CHECK(v4.stage_at(1, 2) == 9);
  CHECK_THROWS_WITH_AS((void)vee.stage_at(0, 2),
                       doctest::Contains("argument `chunk`: expected in [0, 2), actual 2"),
                       weft::schedule_error);
  CHECK_THROWS_AS((void)vee.stage_at(4, 0), weft::schedule_error);
}

TEST_CASE("ir: schedule construction checks its sizes") {
  CHECK_THROWS_AS(schedule(0, 4, 4), weft::schedule_error);
  CHECK_THROWS_WITH_AS(schedule(4, 6, 4), doctest::Contains("actual 6"), weft::schedule_error);
  CHECK_THROWS_AS(schedule(4, 4, 0), weft::schedule_error);
}

TEST_CASE("ir: text and CSV round-trip exactly, including derived fields") {
  auto check = [](schedule const& s) {
    auto const text = to_text(s);
    CHECK(parse_schedule(text) == s);
    CHECK(to_text(parse_schedule(text)) == text);
    CHECK(parse_csv(to_csv(s)) == s);
  };
  check(gpipe(3, 5));
  check(one_f_one_b(4, 8));
  check(interleaved_one_f_one_b(4, 8, 2));
  check(interleaved_one_f_one_b(2, 6, 4, {3, false}));

  // A hand-written V-shaped schedule with vocabulary passes and collectives.
  schedule v(2, 4, 1, placement::v, vocab_variant::two_barrier);
  for (auto t : {"0IF0", "*RE:0", "0F0", "0SEND_F0", "3RECV_F0", "3F0", "3B0", "*BX:0", "0S0",
                 "*C0:0", "*BX:1", "0T0", "*C1:0"}) {
    auto a = parse_action(t);
    v.resolve(a);
    v.push(0, a);
  }
  check(v);
  auto const back = parse_csv(to_csv(v));
  CHECK(back.style() == placement::v);
  CHECK(back.vocab() == vocab_variant::two_barrier);
  CHECK(back.actions(0)[3].peer == 1);
  CHECK(back.actions(0)[4].peer == 1);
}

TEST_CASE("ir: reads PyTorch-style CSV with idle cells and infers the mapping") {
  // Two ranks, four stages in a loop, as PyTorch's interleaved dumps look (empty cells = idle).
  std::string const csv =
      "0F0,0F1,2F0,,2F1,2B0,0B0,2B1,0B1\n"
      ",1F0,1F1,3F0,3B0,3F1,3B1,1B0,1B1\n";
  auto s = parse_csv(csv);
  CHECK(s.num_ranks() == 2);
  CHECK(s.num_stages() == 4);
  CHECK(s.num_microbatches() == 2);
  CHECK(s.style() == placement::loop);
  CHECK(s.actions(0).size() == 8);
  CHECK(s.actions(1).front() == s.make(op::forward, 1, 0));
  // A schedule whose stages fit neither mapping is rejected.
  CHECK_THROWS_AS(parse_csv("0F0,1F0\n2F0\n"), weft::schedule_error);
  CHECK_THROWS_AS(parse_schedule("ranks=2"), weft::schedule_error);
  CHECK_THROWS_AS(
      parse_schedule(
          "weft-schedule ranks=2 stages=2 microbatches=1 placement=loop vocab=none\n0: 0F0\n"),
      weft::schedule_error);
}
