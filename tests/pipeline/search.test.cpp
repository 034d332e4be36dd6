// Tests for weft/pipeline/search/: on a grid (p = 2..8, m in {p, 2p, 4p}; uniform, non-uniform
// and heavy-last-stage costs; memory limits from half of 1F1B's to none) the searched schedule
// validates, fits its memory limit, simulates to the makespan it reports, is never slower than
// the best hand-written schedule (GPipe, 1F1B, ZB-H1) that fits, never beats a simple lower bound,
// and is strictly faster on named non-uniform cases. A searched schedule run by the executor on
// thread ranks gives the loss and gradients of sequential accumulation bit for bit. Bad inputs
// throw naming the argument. With WEFT_WRITE_SEARCH_FIGURES=<dir> the SVGs of docs/pipeline.md
// are written there. Under a sanitizer the two grids stop at p = 5, and the default build runs
// them to p = 8: under clang's ASan the whole grids took 105 s, to p = 5 22 s.
#include <weft/comm/threads/world.hpp>
#include <weft/pipeline/executor.hpp>
#include <weft/pipeline/lower.hpp>
#include <weft/pipeline/render.hpp>
#include <weft/pipeline/schedules/vocab.hpp>
#include <weft/pipeline/search/search.hpp>
#include <weft/pipeline/simulate.hpp>
#include <weft/pipeline/validate.hpp>

#include "pipeline/executor_model.hpp"
#include "support/checks.hpp"
#include "support/run_ranks.hpp"

#include <doctest/doctest.h>

#include <algorithm>
#include <bit>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <fstream>
#include <limits>
#include <string>
#include <vector>

namespace pl = weft::pipeline;
namespace ps = weft::pipeline::search;

namespace {

constexpr int max_grid_p = weft::test::under_sanitizer ? 5 : 8;

enum class costs_kind { uniform, non_uniform, heavy_last };

std::string name_of(costs_kind k) {
  return k == costs_kind::uniform
             ? "uniform"
             : (k == costs_kind::non_uniform ? "non-uniform" : "heavy last stage");
}

// One activation byte per stage-microbatch, no parameters: memory limits are in-flight counts.
// Non-uniform: F, I and W vary per stage independently (0.6..1.6, 0.7..1.6, 0.3..1.1), as with
// uneven layer splits and attention/MLP mixes; heavy last stage: uniform stages plus an output
// layer of 3 stage-equivalents on the last one (a large vocabulary without vocabulary
// parallelism). Both with a p2p latency of a quarter of a forward.
pl::cost_model grid_costs(int p, costs_kind kind) {
  pl::cost_model c;
  for (int r = 0; r < p; ++r) {
    double f = 1, i = 1, w = 1;
    if (kind == costs_kind::non_uniform) {
      f = 0.6 + 0.1 * ((r * 5 + 2) % 11);
      i = 0.7 + 0.15 * ((r * 3 + 1) % 7);
      w = 0.3 + 0.1 * ((r * 7 + 3) % 9);
    }
    if (kind == costs_kind::heavy_last && r == p - 1) {
      f += 3;
      i += 3;
      w += 3;
    }
    c.forward.push_back(f);
    c.backward_input.push_back(i);
    c.backward_weight.push_back(w);
    c.activation_bytes.push_back(1.0);
    c.parameter_bytes.push_back(0.0);
  }
  c.p2p_latency = kind == costs_kind::uniform ? 0.0 : 0.25;
  return c;
}

// The best hand-written schedule that fits, timed here independently of the search.
double best_hand(int p, int m, pl::cost_model const& c, std::vector<double> const& limit) {
  double best = std::numeric_limits<double>::infinity();
  for (auto const& [name, s] : ps::hand_schedules(p, m)) {
    auto const sim = pl::simulate(s, c);
    if (ps::fits_memory(sim, limit)) best = std::min(best, sim.makespan);
  }
  return best;
}

// No schedule beats this: rank r cannot start before the forwards of the stages before it (and
// their transfers) and then has all of its own work to do.
double lower_bound(int p, int m, pl::cost_model const& c) {
  double lb = 0, head = 0;
  for (int r = 0; r < p; ++r) {
    auto const i = static_cast<std::size_t>(r);
    lb = std::max(lb, head + m * (c.forward[i] + c.backward_input[i] + c.backward_weight[i]));
    head += c.forward[i] + c.p2p_time();
  }
  return lb;
}

std::vector<double> limit_of(int p, int in_flight) {
  return in_flight <= 0 ? std::vector<double>{}
                        : std::vector<double>(static_cast<std::size_t>(p), in_flight);
}

void check_result(int p, int m, pl::cost_model const& c, ps::search_options const& o,
                  ps::search_result const& res) {
  pl::validate(res.best);
  CHECK(res.best.num_ranks() == p);
  CHECK(res.best.num_microbatches() == m);
  CHECK_FALSE(res.best.has_p2p());
  auto const sim = pl::simulate(res.best, c);
  CHECK(sim.makespan == doctest::Approx(res.makespan));
  CHECK(ps::fits_memory(sim, o.memory_limit));
  CHECK(res.peak_memory == sim.peak_memory_bytes);
  CHECK(res.makespan >= lower_bound(p, m, c) * (1 - 1e-12));
  double const hand = best_hand(p, m, c, o.memory_limit);
  if (hand == std::numeric_limits<double>::infinity())
    CHECK(res.best_hand.empty());
  else
    CHECK(res.best_hand_makespan == doctest::Approx(hand));
  CHECK(res.makespan <= hand * (1 + 1e-12));
}

}  // namespace

TEST_CASE("search: never slower than the best fitting hand schedule, always valid (grid)") {
  int searched = 0, faster = 0, without_hand = 0;
  for (int p = 2; p <= max_grid_p; ++p)
    for (int m : {p, 2 * p, 4 * p})
      for (auto kind : {costs_kind::uniform, costs_kind::non_uniform, costs_kind::heavy_last})
        // In-flight limits: half of 1F1B's rank 0 (no hand schedule fits), 1F1B's / ZB-H1's p,
        // ZB-H2's 2p - 1, none.
        for (int limit : {(p + 1) / 2, p, 2 * p - 1, 0}) {
          CAPTURE(p);
          CAPTURE(m);
          CAPTURE(name_of(kind));
          CAPTURE(limit);
          auto const c = grid_costs(p, kind);
          ps::search_options o;
          o.memory_limit = limit_of(p, limit);
          auto const res = ps::search_schedule(p, m, c, o);
          check_result(p, m, c, o, res);
          ++searched;
          if (res.best_hand.empty())
            ++without_hand;
          else if (res.makespan < res.best_hand_makespan * (1 - 1e-9))
            ++faster;
        }
  MESSAGE("searched ", searched, ", strictly faster than every fitting hand schedule in ", faster,
          ", no hand schedule fits in ", without_hand);
  CHECK(searched == (max_grid_p - 1) * 3 * 3 * 4);
  CHECK(faster > 0);
  CHECK(without_hand > 0);
}

TEST_CASE("search: strictly faster where the hand schedules leave bubbles (named cases)") {
  struct named {
    int p, m, limit;
    double min_gain;  // fraction of the best hand makespan saved, at least
  };
  // Non-uniform stage costs with a p2p latency: ZB-H1 (the best hand schedule in each) leaves
  // bubbles that the searched schedules fill.
  for (named const& nc : {named{4, 8, 7, 0.02}, named{8, 16, 15, 0.02}, named{8, 32, 15, 0.02},
                          named{8, 32, 0, 0.05}, named{4, 4, 4, 0.01}}) {
    // Variables, not a structured binding: CAPTURE's lambda cannot capture one before clang 16.
    int const p = nc.p, m = nc.m, limit = nc.limit;
    double const min_gain = nc.min_gain;
    CAPTURE(p);
    CAPTURE(m);
    CAPTURE(limit);
    auto const c = grid_costs(p, costs_kind::non_uniform);
    ps::search_options o;
    o.memory_limit = limit_of(p, limit);
    auto const res = ps::search_schedule(p, m, c, o);
    check_result(p, m, c, o, res);
    REQUIRE_FALSE(res.best_hand.empty());
    double const gain = 1 - res.makespan / res.best_hand_makespan;
    MESSAGE("p=", p, " m=", m, " limit=", limit, ": ", res.best_hand, " ", res.best_hand_makespan,
            " -> ", res.makespan, " (", res.method, "), ", 100 * gain, "% less");
    CHECK(gain >= min_gain);
  }
}

namespace {

// Vocabulary-parallel costs: the grid's stages plus an output layer of E stage-equivalents sharded
// over the p ranks as the one-barrier schedule runs it (S = E(F + I)/p, T = E W/p, unit_costs'
// split; E = 1, and 6.25 for a 256k vocabulary at h = 3072), input lookups IF = IB = 0.05 and a
// collective latency of 0.1; activations of one byte per stage-microbatch and 1/p per S-to-T
// vocabulary pass. The bar: vocab_one_f_one_b with one and two barriers, default and planned.
pl::cost_model vocab_costs(int p, costs_kind kind, double E) {
  auto c = grid_costs(p, kind);
  double const P = p;
  c.vocab_forward = E * 2.0 / P;
  c.vocab_backward = E / P;
  c.input_forward = c.input_backward = 0.05;
  c.collective_latency = 0.1;
  c.vocab_activation_bytes = 1.0 / P;
  return c;
}

double best_vocab_hand(int p, int m, pl::cost_model const& c, std::vector<double> const& limit) {
  double best = std::numeric_limits<double>::infinity();
  for (auto v : {pl::vocab_variant::one_barrier, pl::vocab_variant::two_barrier})
    for (bool planned : {false, true}) {
      auto const s = planned ? pl::vocab_one_f_one_b(p, m, v, {pl::plan_costs(c), false})
                             : pl::vocab_one_f_one_b(p, m, v);
      auto const sim = pl::simulate(s, c);
      if (ps::fits_memory(sim, limit)) best = std::min(best, sim.makespan);
    }
  return best;
}

}  // namespace

TEST_CASE("search: vocabulary passes: never slower than vocabulary 1F1B, faster when uneven") {
  int searched = 0, faster = 0, faster_non_uniform = 0, non_uniform = 0;
  double gain_sum = 0, gain_max = 0;
  for (int p = 2; p <= max_grid_p; ++p)
    for (int m : {p, 2 * p, 4 * p})
      for (auto kind : {costs_kind::uniform, costs_kind::non_uniform})
        for (double E : {1.0, 6.25})
          for (int limit : {p + 1, 0}) {  // the one-barrier schedule's rank-0 peak, none
            CAPTURE(p);
            CAPTURE(m);
            CAPTURE(name_of(kind));
            CAPTURE(E);
            CAPTURE(limit);
            auto const c = vocab_costs(p, kind, E);
            ps::search_options o;
            if (limit > 0)
              o.memory_limit.assign(static_cast<std::size_t>(p), limit * (1.0 + 1.0 / p) + 1e-9);
            auto const res = ps::search_schedule(p, m, c, o);
            pl::validate(res.best);
            CHECK(res.best.vocab() != pl::vocab_variant::none);
            auto const sim = pl::simulate(res.best, c);
            CHECK(sim.makespan == doctest::Approx(res.makespan));
            CHECK(ps::fits_memory(sim, o.memory_limit));
            double const hand = best_vocab_hand(p, m, c, o.memory_limit);
            CHECK(res.best_hand_makespan == doctest::Approx(hand));
            CHECK(res.makespan <= hand * (1 + 1e-12));
            ++searched;
            double const gain =
                hand < std::numeric_limits<double>::infinity() ? 1.0 - res.makespan / hand : 0.0;
            if (gain > 1e-9) ++faster;
            if (kind == costs_kind::non_uniform) {
              ++non_uniform;
              if (gain > 1e-9) ++faster_non_uniform;
              gain_sum += gain;
              gain_max = std::max(gain_max, gain);
            }
          }
  MESSAGE("vocabulary search: ", searched, " searches, strictly faster than vocabulary 1F1B in ",
          faster, " (non-uniform: ", faster_non_uniform, " of ", non_uniform, ", mean gain ",
          100 * gain_sum / non_uniform, " %, max ", 100 * gain_max, " %)");
  CHECK(searched == (max_grid_p - 1) * 3 * 2 * 2 * 2);
  CHECK(faster_non_uniform > non_uniform / 2);
}

TEST_CASE("search: each generator alone gives valid schedules; the local search only improves") {
  auto const c = grid_costs(6, costs_kind::non_uniform);
  ps::search_options base;
  base.memory_limit = limit_of(6, 6);
  for (int which = 0; which < 3; ++which) {
    auto o = base;
    o.hand_seeds = which == 0;
    o.list = which == 1;
    o.repetend_window = which == 2 ? 2 : 0;
    o.local_search_evaluations = 0;
    auto const plain = ps::search_schedule(6, 12, c, o);
    pl::validate(plain.best);
    CHECK(ps::fits_memory(pl::simulate(plain.best, c), o.memory_limit));
    o.local_search_evaluations = 2000;
    auto const local = ps::search_schedule(6, 12, c, o);
    pl::validate(local.best);
    CHECK(local.makespan <= plain.makespan);
    CHECK(local.evaluations <= 2000);
  }
  // Repetend FIW with warm-up p-r-1 and lag 0 is 1F1B with each B split into I then W.
  auto const one = ps::repetend_schedule(4, 8, ps::repetend{"FIW"});
  pl::validate(one);
  auto split = pl::one_f_one_b(4, 8);
  for (int r = 0; r < 4; ++r) {
    std::vector<pl::action> prog;
    for (auto const& a : split.actions(r)) {
      if (a.kind != pl::op::backward) {
        prog.push_back(a);
        continue;
      }
      prog.push_back(split.make(pl::op::backward_input, a.stage, a.microbatch));
      prog.push_back(split.make(pl::op::backward_weight, a.stage, a.microbatch));
    }
    split.actions(r) = prog;
  }
  CHECK(one == split);
  CHECK(ps::repetend_patterns(1).size() == 6);
  CHECK(ps::repetend_patterns(2).size() == 90);
}

TEST_CASE("search: a searched schedule runs on the executor like sequential accumulation") {
  using namespace weft::test::pipeline_model;
  namespace comm = weft::comm;
  int const p = 4, m = 8;
  auto const c = grid_costs(p, costs_kind::non_uniform);
  ps::search_options o;
  o.memory_limit = limit_of(p, p);
  auto const res = ps::search_schedule(p, m, c, o);
  // Not one of the hand-written orders: the search found its own.
  for (auto const& [name, s] : ps::hand_schedules(p, m)) CHECK_FALSE(res.best == s);
  auto const lowered = pl::lower(res.best);
  pl::validate(lowered);
  data_set const data(m);
  pl::step_options opt;
  for (int i = 0; i < m; ++i) opt.tokens.push_back(static_cast<std::size_t>(rows_of(i) * head_out));
  auto const weights = pl::loss_weights(opt, m);
  std::vector<pl::step_result> results(static_cast<std::size_t>(p));
  std::vector<std::vector<layer>> grads(static_cast<std::size_t>(p));
  weft::test::run_ranks(p, [&](comm::threads::communicator& comm_) {
    mlp_stage stage(lowered, comm_.rank(), data);
    auto const r = static_cast<std::size_t>(comm_.rank());
    results[r] = pl::run_step(lowered, stage, comm_, opt);
    REQUIRE(stage.chunks_.size() == 1);
    REQUIRE(stage.chunks_[0].stage == comm_.rank());
    grads[r] = std::move(stage.chunks_[0].layers);
  });
  auto const ref = sequential_reference(p, m, weights, data);
  auto const& last = results[static_cast<std::size_t>(p - 1)];
  REQUIRE(last.has_loss);
  CHECK(std::bit_cast<std::uint64_t>(last.loss) == std::bit_cast<std::uint64_t>(ref.loss));
  auto const sim = pl::simulate(lowered);
  for (int r = 0; r < p; ++r) {
    auto const ri = static_cast<std::size_t>(r);
    CHECK(results[ri].metrics.slots.at(0) == sim.peak_in_flight[ri]);
    auto const& got = grads[ri];
    auto const& want = ref.stages[ri];
    REQUIRE(got.size() == want.size());
    for (std::size_t l = 0; l < got.size(); ++l) {
      CAPTURE(r);
      CAPTURE(l);
      CHECK(same_bits(got[l].gw, want[l].gw));
      CHECK(same_bits(got[l].gb, want[l].gb));
    }
  }
}

TEST_CASE("search: bad inputs throw naming the argument, the expected and the actual value") {
  auto const c = grid_costs(4, costs_kind::uniform);
  auto throws_with = [](auto&& call, std::string const& what) {
    try {
      call();
      FAIL("no exception; expected one naming ", what);
    } catch (weft::invalid_argument_error const& e) {
      std::string const msg = e.what();
      CAPTURE(msg);
      CHECK(msg.find(what) != std::string::npos);
      CHECK(msg.find("expected") != std::string::npos);
      CHECK(msg.find("actual") != std::string::npos);
    }
  };
  throws_with([&] { (void)ps::search_schedule(0, 4, c); }, "`p`");
  throws_with([&] { (void)ps::search_schedule(4, 0, c); }, "`m`");
  throws_with([&] { (void)ps::search_schedule(5, 8, c); }, "costs.forward.size()");
  auto short_w = c;
  short_w.backward_weight.pop_back();
  throws_with([&] { (void)ps::search_schedule(4, 8, short_w); }, "costs.backward_weight.size()");
  auto zero_f = c;
  zero_f.forward[2] = 0;
  throws_with([&] { (void)ps::search_schedule(4, 8, zero_f); }, "costs.forward[2]");
  ps::search_options o;
  o.memory_limit = {4, 4, 0.5, 4};  // rank 2 cannot hold one microbatch
  throws_with([&] { (void)ps::search_schedule(4, 8, c, o); }, "options.memory_limit[2]");
  o.memory_limit = {4, 4};
  throws_with([&] { (void)ps::search_schedule(4, 8, c, o); }, "options.memory_limit.size()");
  auto vocab = c;
  vocab.vocab_forward = -0.5;
  throws_with([&] { (void)ps::search_schedule(4, 8, vocab); }, "costs.vocab_forward");
  vocab.vocab_forward = 0.5;
  throws_with([&] { (void)ps::search_schedule(4, 3, vocab); }, "`m`");
  auto vocab1 = grid_costs(1, costs_kind::uniform);
  vocab1.vocab_forward = 0.5;
  throws_with([&] { (void)ps::search_schedule(1, 4, vocab1); }, "`p`");
  // The limit of one microbatch per rank is the least any schedule needs, and it is searched.
  o.memory_limit = limit_of(4, 1);
  auto const res = ps::search_schedule(4, 8, c, o);
  pl::validate(res.best);
  for (int peak : res.sim.peak_in_flight) CHECK(peak == 1);
}

TEST_CASE("search: the drawing of a searched schedule; figures for the docs on request") {
  auto const c = grid_costs(4, costs_kind::non_uniform);
  ps::search_options o;
  o.memory_limit = limit_of(4, 4);
  auto const res = ps::search_schedule(4, 8, c, o);
  auto const svg = pl::render_svg(res.best, res.sim, {"searched"});
  CHECK(svg.find("<svg") != std::string::npos);
  char const* dir = std::getenv("WEFT_WRITE_SEARCH_FIGURES");
  if (dir == nullptr) return;
  // docs/figures/pipeline_search_*.svg: ZB-H1 and the searched schedule on the same costs.
  auto const c8 = grid_costs(8, costs_kind::non_uniform);
  ps::search_options o8;
  o8.memory_limit = limit_of(8, 15);
  auto const found = ps::search_schedule(8, 16, c8, o8);
  auto const zb = pl::zero_bubble_h1(8, 16);
  std::ofstream(std::string(dir) + "/pipeline_search_zb_h1.svg")
      << pl::render_svg(zb, pl::simulate(zb, c8), {"ZB-H1, non-uniform stages"});
  std::ofstream(std::string(dir) + "/pipeline_search_found.svg")
      << pl::render_svg(found.best, found.sim, {"searched: " + found.method});
}
