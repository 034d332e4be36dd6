// weft/pipeline/plan/compare.hpp — host-only planning: builds every schedule for one
// configuration (p, m, v, model shape, costs), simulates each under the default cost model and
// returns a comparison table (makespan, bubble, throughput, peak activations and memory per
// rank). Uses range-v3, so nothing reachable from weft/weft.hpp includes this file.
#pragma once

#if defined(__CUDACC__)
#error \
    "weft/pipeline/plan/: host-only planning code (range-v3 0.12 does not parse under nvcc); include it from a host translation unit"
#endif

#include <weft/core/error.hpp>
#include <weft/pipeline/cost_model.hpp>
#include <weft/pipeline/lower.hpp>
#include <weft/pipeline/schedule.hpp>
#include <weft/pipeline/schedules/controllable_memory.hpp>
#include <weft/pipeline/schedules/dualpipe.hpp>
#include <weft/pipeline/schedules/gpipe.hpp>
#include <weft/pipeline/schedules/one_f_one_b.hpp>
#include <weft/pipeline/schedules/interleaved.hpp>
#include <weft/pipeline/schedules/vocab.hpp>
#include <weft/pipeline/schedules/zero_bubble.hpp>
#include <weft/pipeline/simulate.hpp>
#include <weft/pipeline/validate.hpp>

#include <range/v3/algorithm/max.hpp>
#include <range/v3/range/conversion.hpp>
#include <range/v3/view/transform.hpp>

#include <cstdio>
#include <optional>
#include <string>
#include <vector>

namespace weft::pipeline::plan {

//! The schedules the planner compares.
enum class kind : std::uint8_t {
  gpipe,
  one_f_one_b,
  redistribution,  //!< 1F1B with the VP paper's layer-redistribution baseline partition
  interleaved,
  zero_bubble_h1,
  zero_bubble_h2,
  zero_bubble_v,
  v_half,
  v_min,
  dualpipe_v,
  vocab_one_barrier,
  vocab_two_barrier,
};

inline std::string to_string(kind k) {
  switch (k) {
    case kind::gpipe: return "GPipe";
    case kind::one_f_one_b: return "1F1B";
    case kind::redistribution: return "1F1B + layer redistribution";
    case kind::interleaved: return "interleaved 1F1B";
    case kind::zero_bubble_h1: return "ZB-H1";
    case kind::zero_bubble_h2: return "ZB-H2";
    case kind::zero_bubble_v: return "ZBV";
    case kind::v_half: return "V-Half";
    case kind::v_min: return "V-Min";
    case kind::dualpipe_v: return "DualPipeV";
    case kind::vocab_one_barrier: return "VP 1F1B, 1 barrier";
    case kind::vocab_two_barrier: return "VP 1F1B, 2 barriers";
  }
  return "?";
}

inline std::vector<kind> all_kinds() {
  return {
      kind::gpipe,          kind::one_f_one_b,    kind::redistribution,    kind::interleaved,
      kind::zero_bubble_h1, kind::zero_bubble_h2, kind::zero_bubble_v,     kind::v_half,
      kind::v_min,          kind::dualpipe_v,     kind::vocab_one_barrier, kind::vocab_two_barrier};
}

//! One comparison: p ranks, m microbatches, v chunks for the interleaved schedule, the model and
//! the cost knobs; `last_stage_layers` is K of the redistribution baseline.
struct config {
  int p = 8;
  int m = 128;
  int v = 2;
  model_shape shape{};
  cost_options costs{};
  int last_stage_layers = 0;
};

struct row {
  kind which = kind::one_f_one_b;
  std::string name;
  std::string error;  //!< why the schedule could not be built for this configuration, or empty
  std::optional<schedule> sched;
  std::optional<cost_model> costs;
  std::optional<simulation> sim;
  double throughput = 0;  //!< relative to plain 1F1B (1F1B's makespan / this makespan)
};

namespace detail {

inline std::vector<int> layers_for(kind k, schedule const& s, config const& c) {
  if (k == kind::redistribution)
    return partition_redistribute(c.shape.layers, s.num_stages(), c.last_stage_layers);
  return partition_uniform(c.shape.layers, s.num_stages());
}

inline schedule build(kind k, config const& c) {
  auto vocab_schedule = [&](vocab_variant variant) {
    schedule const shape_only(c.p, c.p, c.m, placement::loop, variant);
    auto const costs =
        make_cost_model(shape_only, c.shape, partition_uniform(c.shape.layers, c.p), c.costs);
    return vocab_one_f_one_b(c.p, c.m, variant, {plan_costs(costs), false});
  };
  switch (k) {
    case kind::gpipe: return gpipe(c.p, c.m);
    case kind::one_f_one_b:
    case kind::redistribution: return one_f_one_b(c.p, c.m);
    case kind::interleaved: return interleaved_one_f_one_b(c.p, c.m, c.v);
    case kind::zero_bubble_h1: return zero_bubble_h1(c.p, c.m);
    case kind::zero_bubble_h2: return zero_bubble_h2(c.p, c.m);
    case kind::zero_bubble_v: return zero_bubble_v(c.p, c.m);
    case kind::v_half: return v_half(c.p, c.m);
    case kind::v_min: return v_min(c.p, c.m);
    case kind::dualpipe_v: return dualpipe_v(c.p, c.m);
    case kind::vocab_one_barrier: return vocab_schedule(vocab_variant::one_barrier);
    case kind::vocab_two_barrier: return vocab_schedule(vocab_variant::two_barrier);
  }
  return one_f_one_b(c.p, c.m);
}

inline row make_row(kind k, config const& c) {
  row out;
  out.which = k;
  out.name = to_string(k);
  try {
    auto s = build(k, c);
    validate(s);
    auto costs = make_cost_model(s, c.shape, layers_for(k, s, c), c.costs);
    out.sim = simulate(s, costs);
    out.sched = std::move(s);
    out.costs = std::move(costs);
  } catch (weft::error const& e) {
    out.error = e.message();
  }
  return out;
}

}  // namespace detail

//! Builds, validates and simulates every schedule in `kinds` for `c`. Schedules whose rules reject
//! `c` come back with `error` set instead of a simulation.
inline std::vector<row> compare(config const& c, std::vector<kind> const& kinds = all_kinds()) {
  auto rows = kinds | ranges::views::transform([&](kind k) { return detail::make_row(k, c); }) |
              ranges::to<std::vector>();
  auto const baseline = detail::make_row(kind::one_f_one_b, c);
  double const base = baseline.sim ? baseline.sim->makespan : 0.0;
  for (auto& r : rows)
    if (r.sim && r.sim->makespan > 0) r.throughput = base / r.sim->makespan;
  return rows;
}

//! The fastest schedule of `rows` (least makespan; the first on a tie) whose peak memory is at
//! most `max_bytes` on every rank, or nullptr when none of them fits: the choice the V schedules
//! of controllable memory exist for (V-Half or V-Min where ZBV and 1F1B do not fit).
inline row const* fastest_within(std::vector<row> const& rows, double max_bytes) {
  WEFT_EXPECTS(max_bytes > 0, "max_bytes", "> 0", max_bytes);
  row const* best = nullptr;
  for (auto const& r : rows) {
    if (!r.sim || r.sim->peak_memory_bytes.empty()) continue;
    if (ranges::max(r.sim->peak_memory_bytes) > max_bytes) continue;
    if (best == nullptr || r.sim->makespan < best->sim->makespan) best = &r;
  }
  return best;
}

//! The table as Markdown: schedule, makespan, bubble, throughput vs 1F1B, peak in-flight
//! activations per rank (stage-microbatches), peak memory per rank (GB) and its maximum.
inline std::string markdown_table(std::vector<row> const& rows) {
  auto fmt = [](double x, int digits) {
    char buf[64];
    std::snprintf(buf, sizeof buf, "%.*f", digits, x);
    return std::string(buf);
  };
  auto join = [](auto const& items) {
    std::string s;
    for (auto const& x : items) s += (s.empty() ? "" : " ") + x;
    return s;
  };
  std::string out =
      "| schedule | makespan | bubble | throughput vs 1F1B | peak activations per rank | peak "
      "memory per rank (GB) | max memory (GB) |\n"
      "|---|---|---|---|---|---|---|\n";
  for (auto const& r : rows) {
    if (!r.sim) {
      out += "| " + r.name + " | rejected: " + r.error + " | | | | | |\n";
      continue;
    }
    auto const& sim = *r.sim;
    double const v = r.sched->num_chunks();
    auto const acts = sim.peak_in_flight |
                      ranges::views::transform([&](int n) { return fmt(n / v, v == 1 ? 0 : 2); }) |
                      ranges::to<std::vector>();
    auto const mems = sim.peak_memory_bytes |
                      ranges::views::transform([&](double b) { return fmt(b / 1e9, 1); }) |
                      ranges::to<std::vector>();
    out += "| " + r.name + " | " + fmt(sim.makespan, 1) + " | " +
           fmt(100 * sim.bubble_fraction, 1) + "% | " + fmt(r.throughput, 3) + " | " + join(acts) +
           " | " + join(mems) + " | " + fmt(ranges::max(sim.peak_memory_bytes) / 1e9, 1) + " |\n";
  }
  return out;
}

}  // namespace weft::pipeline::plan
