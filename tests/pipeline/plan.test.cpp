// Tests for weft/pipeline/plan/compare.hpp (host-only, range-v3): the comparison table for the
// paper's 256k-vocabulary configuration and for the unit model. Skipped in the nvcc twin, as
// range-v3 does not parse under nvcc.
#if !defined(__CUDACC__)

#include <weft/pipeline/plan/compare.hpp>

#include <doctest/doctest.h>

#include <string>

using namespace weft::pipeline;

TEST_CASE("plan: comparing every schedule for the paper's 256k-vocabulary model") {
  plan::config c;  // 8 ranks, m = 128, v = 2, 32 layers, h 3072, ffn 12288, s 2048, V 256k
  auto const rows = plan::compare(c);
  REQUIRE(rows.size() == plan::all_kinds().size());
  for (auto const& r : rows) {
    CAPTURE(r.name);
    CAPTURE(r.error);
    REQUIRE(r.sim.has_value());
  }
  auto by = [&](plan::kind k) -> plan::row const& {
    for (auto const& r : rows)
      if (r.which == k) return r;
    FAIL("no row for ", plan::to_string(k));
    return rows.front();
  };
  auto const& one = *by(plan::kind::one_f_one_b).sim;
  auto const& redis = *by(plan::kind::redistribution).sim;
  auto const& vp1 = *by(plan::kind::vocab_one_barrier).sim;
  CHECK(by(plan::kind::one_f_one_b).throughput == doctest::Approx(1.0));
  CHECK(by(plan::kind::vocab_one_barrier).throughput > by(plan::kind::redistribution).throughput);
  CHECK(redis.makespan / vp1.makespan == doctest::Approx(1.30).epsilon(0.02));
  CHECK(ranges::max(vp1.peak_memory_bytes) < ranges::max(one.peak_memory_bytes));
  // Peak activations p-r+1 for the 1-barrier schedule, p-r+2 for the 2-barrier one.
  CHECK(vp1.peak_in_flight.front() == 9);
  CHECK(by(plan::kind::vocab_two_barrier).sim->peak_in_flight.front() == 10);
  // The V schedules of controllable memory: V-Min holds less than V-Half, which holds less than
  // ZBV (2p chunk-microbatches), and each is slower than the one holding more.
  auto const& zbv = *by(plan::kind::zero_bubble_v).sim;
  auto const& half = *by(plan::kind::v_half).sim;
  auto const& vmin = *by(plan::kind::v_min).sim;
  CHECK(ranges::max(zbv.peak_in_flight) == 16);
  CHECK(ranges::max(half.peak_in_flight) < ranges::max(zbv.peak_in_flight));
  CHECK(ranges::max(vmin.peak_in_flight) < ranges::max(half.peak_in_flight));
  CHECK(ranges::max(half.peak_activation_bytes) < ranges::max(zbv.peak_activation_bytes));
  CHECK(zbv.makespan <= half.makespan);
  CHECK(half.makespan <= vmin.makespan);
  auto const table = plan::markdown_table(rows);
  CHECK(table.find("| VP 1F1B, 1 barrier |") != std::string::npos);
  CHECK(table.find("| ZBV |") != std::string::npos);
  CHECK(table.find("| ZB-H2 |") != std::string::npos);
  CHECK(table.find("| V-Half |") != std::string::npos);
  CHECK(table.find("| V-Min |") != std::string::npos);
  CHECK(table.find("| DualPipeV |") != std::string::npos);
}

TEST_CASE("plan: the fastest schedule within a memory budget (32k vocabulary)") {
  plan::config c;  // the same model with a 32k vocabulary: the output layer no longer dominates
  c.shape.vocab = 32000;
  auto const rows = plan::compare(c);
  auto name_within = [&](double gb) {
    auto const* r = plan::fastest_within(rows, gb * 1e9);
    return r == nullptr ? std::string("none") : r->name;
  };
  auto max_gb = [&](plan::kind k) {
    for (auto const& r : rows)
      if (r.which == k) {
        CAPTURE(r.error);
        REQUIRE(r.sim.has_value());
        return ranges::max(r.sim->peak_memory_bytes) / 1e9;
      }
    FAIL("no row for ", plan::to_string(k));
    return 0.0;
  };
  // Peak memory: V-Min < V-Half < VP 1 barrier < 1F1B < ZBV; makespan: VP < ZBV < V-Half < V-Min.
  double const vmin = max_gb(plan::kind::v_min), vhalf = max_gb(plan::kind::v_half);
  double const vp = max_gb(plan::kind::vocab_one_barrier), one = max_gb(plan::kind::one_f_one_b);
  REQUIRE(vmin < vhalf);
  REQUIRE(vhalf < vp);
  REQUIRE(vp < one);
  CHECK(name_within(1000) == "VP 1F1B, 1 barrier");
  CHECK(name_within(vp) == "VP 1F1B, 1 barrier");
  CHECK(name_within((vhalf + vp) / 2) == "V-Half");  // 1F1B and ZBV do not fit either
  CHECK(name_within((vmin + vhalf) / 2) == "V-Min");
  CHECK(name_within(vmin * 0.99) == "none");
  CHECK_THROWS_WITH_AS(plan::fastest_within(rows, 0.0),
                       doctest::Contains("argument `max_bytes`: expected > 0, actual 0"),
                       weft::invalid_argument_error);
}

TEST_CASE("plan: configurations a generator rejects are reported, not thrown") {
  plan::config c;
  c.p = 4;
  c.m = 9;  // interleaved with g = p = 4 leaves a remainder of 1 < p
  c.shape.layers = 16;
  auto const rows = plan::compare(c, {plan::kind::one_f_one_b, plan::kind::interleaved});
  CHECK(rows[0].sim.has_value());
  CHECK_FALSE(rows[1].sim.has_value());
  CHECK(rows[1].error.find("m % group") != std::string::npos);
  CHECK(plan::markdown_table(rows).find("rejected: argument `m % group`") != std::string::npos);
}

#endif  // !__CUDACC__
