// Schedule files and the simulator on hostile input (issue 9, items 13 and 14): the parsers are
// total and bounded by the input's size, validate/simulate/lower size nothing by unchecked header
// values, numbers near INT_MAX do not overflow, every failure is a schedule_error; the fuzzers'
// corpus and regressions replay here; the unit model gives the vocabulary passes a cost.
#include "pipeline/fuzz/check_input.hpp"
#include "pipeline/note_costs.hpp"

#include <weft/pipeline/cost_model.hpp>
#include <weft/pipeline/render.hpp>
#include <weft/pipeline/schedules/one_f_one_b.hpp>
#include <weft/pipeline/schedules/vocab.hpp>

#include <doctest/doctest.h>

#include <filesystem>
#include <fstream>
#include <iterator>
#include <regex>
#include <string>
#include <vector>

using namespace weft::pipeline;

namespace {

std::string const header1 =
    "weft-schedule ranks=1 stages=1 microbatches=1 placement=loop vocab=none\n";

std::vector<std::filesystem::path> files_under(std::filesystem::path const& dir) {
  std::vector<std::filesystem::path> out;
  if (!std::filesystem::exists(dir)) return out;
  for (auto const& e : std::filesystem::recursive_directory_iterator(dir))
    if (e.is_regular_file()) out.push_back(e.path());
  return out;
}

std::string read_bytes(std::filesystem::path const& p) {
  std::ifstream in(p, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

}  // namespace

TEST_CASE("hardening: a header asking for 2^31 ranks is rejected before anything is sized by it") {
  // 95 bytes that made the old parser build a schedule of INT_MAX rank programs (51 GB).
  std::string const text =
      "weft-schedule ranks=2147483647 stages=2147483647 microbatches=1 placement=loop "
      "vocab=none\n0:";
  CHECK_THROWS_WITH_AS(parse_schedule(text), doctest::Contains("rank lines"), weft::schedule_error);
}

TEST_CASE(
    "hardening: validate, simulate and lower size their index by the actions, not the header") {
  // 10 bytes of CSV: one forward of microbatch 99999999 implies 10^8 microbatches; the old
  // index asked for 13 x 10^8 slots.
  auto const csv = parse_csv("0F99999999");
  CHECK(csv.num_microbatches() == 100000000);
  CHECK_FALSE(check(csv).ok);
  CHECK(check(csv).issue.rule == "completeness");
  CHECK_THROWS_AS(validate(csv), weft::schedule_error);
  CHECK_THROWS_AS((void)simulate(csv), weft::schedule_error);
  CHECK_THROWS_AS((void)lower(csv), weft::schedule_error);
  // The text form: a header of 10^9 stages over one action.
  auto const big = parse_schedule(
      "weft-schedule ranks=1 stages=1000000000 microbatches=1000 placement=loop vocab=none\n0: "
      "0F0\n");
  CHECK_THROWS_WITH_AS(validate(big), doctest::Contains("stages x microbatches"),
                       weft::schedule_error);
  CHECK_THROWS_AS((void)simulate(big), weft::schedule_error);
  CHECK_THROWS_AS((void)lower(big), weft::schedule_error);
}

TEST_CASE("hardening: indices near INT_MAX neither overflow nor pass") {
  // A stage of INT_MAX: stage + 1 (the peer of a send) overflowed; now the schedule parses, and
  // validate names the stage.
  auto const s = parse_schedule(header1 + "0: 2147483647SEND_F0\n");
  CHECK_THROWS_WITH_AS(validate(s), doctest::Contains("stage outside"), weft::schedule_error);
  // CSV inference: max_stage + 1 + ranks - 1 and max_mb + 1 overflowed int.
  CHECK_THROWS_AS((void)parse_csv("2147483647F0"), weft::schedule_error);
  CHECK_THROWS_AS((void)parse_csv("0F2147483647"), weft::schedule_error);
  // Past INT_MAX the number is not an index at all.
  CHECK_THROWS_AS((void)parse_schedule(header1 + "0: 2147483648F0\n"), weft::schedule_error);
}

TEST_CASE(
    "hardening: simulate on an invalid parsed schedule throws schedule_error, never out_of_range") {
  auto const s = parse_schedule(header1 + "0: 5F0 5B0\n");  // stage 5 of a 1-stage schedule
  CHECK_THROWS_WITH_AS((void)simulate(s), doctest::Contains("simulate: invalid schedule"),
                       weft::schedule_error);
  CHECK_THROWS_AS((void)simulate(s, unit_costs(s)), weft::schedule_error);
  CHECK_THROWS_AS((void)lower(s), weft::schedule_error);
  // Stage 1 of a 1-stage schedule runs after 0F0: the old simulator looked its cost up with
  // vector::at and threw std::out_of_range.
  auto const t = parse_schedule(header1 + "0: 0F0 1F0\n");
  CHECK_THROWS_WITH_AS((void)simulate(t), doctest::Contains("rule `mapping`"),
                       weft::schedule_error);
  CHECK_THROWS_AS((void)simulate(t, note_costs(t)), weft::schedule_error);
  // Microbatch 1 of a 1-microbatch schedule: the old simulator timed it without a word.
  auto const u = parse_schedule(header1 + "0: 0F0 0B0 0F1\n");
  CHECK_THROWS_AS((void)simulate(u), weft::schedule_error);
  CHECK_THROWS_AS((void)lower(u), weft::schedule_error);
}

TEST_CASE("hardening: CSV enum overrides are checked, so the round trip holds") {
  csv_options bad;
  bad.placement_override = 7;
  CHECK_THROWS_WITH_AS((void)parse_csv("0F0,0B0", bad), doctest::Contains("placement_override"),
                       weft::schedule_error);
  bad = {};
  bad.vocab_override = 3;
  CHECK_THROWS_WITH_AS((void)parse_csv("0F0,0B0", bad), doctest::Contains("vocab_override"),
                       weft::schedule_error);
  bad.vocab_override = -2;
  CHECK_THROWS_AS((void)parse_csv("0F0,0B0", bad), weft::schedule_error);
  // Every schedule weft generates survives CSV and text round trips.
  for (auto const& g : {one_f_one_b(4, 8), vocab_one_f_one_b(4, 8, vocab_variant::two_barrier)}) {
    csv_options same;
    same.stages = g.num_stages();
    same.microbatches = g.num_microbatches();
    same.placement_override = static_cast<int>(g.style());
    same.vocab_override = static_cast<int>(g.vocab());
    CHECK(parse_csv(to_csv(g), same) == g);
    CHECK(parse_schedule(to_text(g)) == g);
  }
}

TEST_CASE("hardening: schedule::push and actions with a bad rank throw schedule_error") {
  schedule s(2, 2, 1);
  CHECK_THROWS_WITH_AS(s.push(2, s.make(op::forward, 0, 0)), doctest::Contains("rank"),
                       weft::schedule_error);
  CHECK_THROWS_AS(s.push(-1, s.make(op::forward, 0, 0)), weft::schedule_error);
  CHECK_THROWS_AS((void)std::as_const(s).actions(5), weft::schedule_error);
  CHECK(s.total_actions() == 0);  // nothing half-written
}

TEST_CASE(
    "hardening: every fuzz corpus and regression input gives a schedule or a schedule_error") {
  auto const root = std::filesystem::path(__FILE__).parent_path() / "fuzz";
  auto const inputs = files_under(root / "regressions");
  auto const corpus = files_under(root / "corpus");
  REQUIRE(!corpus.empty());
  for (auto const* set : {&inputs, &corpus})
    for (auto const& f : *set) {
      CAPTURE(f.string());
      auto const bytes = read_bytes(f);
      CHECK_NOTHROW(weft_fuzz::check_text(bytes));
      CHECK_NOTHROW(weft_fuzz::check_csv(bytes));
    }
  MESSAGE(inputs.size() << " regression inputs, " << corpus.size() << " corpus inputs replayed");
}

TEST_CASE(
    "hardening: unit costs give the vocabulary passes and the output layer a cost (item 14)") {
  int const p = 4, m = 16;
  auto const base = one_f_one_b(p, m);
  auto const vp = vocab_one_f_one_b(p, m, vocab_variant::one_barrier);
  auto const vc = unit_costs(vp);
  CHECK(vc.vocab_forward == doctest::Approx(2.0 / p));   // the output layer's F + I over p ranks
  CHECK(vc.vocab_backward == doctest::Approx(1.0 / p));  // its W
  auto const v2 = unit_costs(vocab_one_f_one_b(p, m, vocab_variant::two_barrier));
  CHECK(v2.vocab_forward == doctest::Approx(1.0 / p));
  CHECK(v2.vocab_backward == doctest::Approx(2.0 / p));
  auto const bc = unit_costs(base);
  CHECK(bc.forward.back() == doctest::Approx(2.0));  // the last stage runs the output layer too
  CHECK(bc.forward.front() == doctest::Approx(1.0));
  // Same output layer in both: balancing it beats leaving it on the last stage.
  auto const t_base = simulate(base).makespan;
  auto const t_vp = simulate(vp).makespan;
  MESSAGE("unit model, p=4 m=16: 1F1B " << t_base << ", vocabulary-balanced (1 barrier) " << t_vp);
  CHECK(t_vp < t_base);
  // The S and T passes take time, so the drawing shows them.
  auto const sim = simulate(vp);
  int seen = 0;
  for (int r = 0; r < p; ++r) {
    auto const& prog = vp.actions(r);
    for (std::size_t i = 0; i < prog.size(); ++i)
      if (is_vocab_compute(prog[i].kind) &&
          (prog[i].kind == op::vocab_forward || prog[i].kind == op::vocab_backward)) {
        auto const& t = sim.times[static_cast<std::size_t>(r)][i];
        CHECK(t.finish - t.start > 0.0);
        ++seen;
      }
  }
  CHECK(seen == 2 * p * m);
  // Every S and T box of the drawing spans time and is wider than the 0.5 px a zero-length box
  // gets.
  auto const svg = render_svg(vp, sim);
  std::regex const box(R"re(width="([0-9.eE+-]+)"[^\n]*<title>\d+[ST]\d+ \[([^,]+), ([^\]]+)\])re");
  int boxes = 0;
  for (auto it = std::sregex_iterator(svg.begin(), svg.end(), box); it != std::sregex_iterator();
       ++it) {
    CAPTURE((*it)[0].str());
    CHECK(std::stod((*it)[1].str()) > 0.5);
    CHECK(std::stod((*it)[3].str()) > std::stod((*it)[2].str()));
    ++boxes;
  }
  CHECK(boxes == 2 * p * m);
  CHECK_THROWS_AS((void)unit_costs(base, 1, 1, 1, -1.0), weft::schedule_error);
}

TEST_CASE("hardening: unit_costs is sized only by what the schedule's actions can index") {
  // 95 bytes asking for a billion stages: the cost model would be four vectors of 8 GB each.
  auto const s = parse_schedule(
      "weft-schedule ranks=1 stages=1000000000 microbatches=1 placement=loop vocab=none\n0: 0F0\n");
  CHECK_THROWS_WITH_AS((void)unit_costs(s), doctest::Contains("rule `completeness`"),
                       weft::schedule_error);
  // A schedule whose stages × microbatches its actions cover is costed as before.
  auto const ok = parse_schedule(header1 + "0: 0F0 0B0\n");
  auto const c = unit_costs(ok);
  CHECK(c.forward.size() == 1);
}
