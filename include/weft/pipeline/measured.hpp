// weft/pipeline/measured.hpp — the executor's measured timeline next to the simulator: as a
// `simulation` (so render_svg and render_text draw it), both pictures in one SVG, and a cost model
// fitted from measured op times (calibration), to simulate a schedule with what a run measured.
#pragma once

#include <weft/core/error.hpp>
#include <weft/pipeline/action.hpp>
#include <weft/pipeline/cost_model.hpp>
#include <weft/pipeline/executor.hpp>
#include <weft/pipeline/render.hpp>
#include <weft/pipeline/schedule.hpp>
#include <weft/pipeline/simulate.hpp>

#include <algorithm>
#include <chrono>
#include <cstddef>
#include <string>
#include <vector>

namespace weft::pipeline {

namespace detail {

inline void require_timeline_matches(schedule const& s, measured_timeline const& t) {
  if (t.ranks.size() != static_cast<std::size_t>(s.num_ranks()))
    WEFT_THROW(invalid_argument_error, ::weft::detail::expectation_message(
                                           "timeline.ranks.size() == num_ranks",
                                           "timeline.ranks.size()", s.num_ranks(), t.ranks.size()));
  for (int r = 0; r < s.num_ranks(); ++r) {
    auto const& row = t.ranks[static_cast<std::size_t>(r)];
    auto const& prog = s.actions(r);
    for (auto const& e : row)
      if (e.index < 0 || static_cast<std::size_t>(e.index) >= prog.size() ||
          !(prog[static_cast<std::size_t>(e.index)] == e.what))
        WEFT_THROW(invalid_argument_error, "argument `timeline`: rank ", r,
                   ": expected entries of the schedule's program, actual `", to_string(e.what),
                   "` at index ", e.index);
  }
}

inline double in_units(std::chrono::nanoseconds d, double seconds_per_unit) {
  return std::chrono::duration<double>(d).count() / seconds_per_unit;
}

}  // namespace detail

//! The measured timeline of `lowered` (the schedule the executor ran) as a `simulation`: compute
//! intervals in units of `seconds_per_unit` (default milliseconds) from the first compute start of
//! any rank, with makespan, busy, bubble and peak in-flight figures computed as `simulate`
//! computes them. Actions the timeline lacks (a failed step) keep zero-length intervals. Throws
//! invalid_argument_error when the timeline is not one of `lowered`'s.
inline simulation as_simulation(schedule const& lowered, measured_timeline const& timeline,
                                double seconds_per_unit = 1e-3) {
  detail::require_timeline_matches(lowered, timeline);
  if (!(seconds_per_unit > 0.0))
    WEFT_THROW(invalid_argument_error,
               ::weft::detail::expectation_message("seconds_per_unit > 0", "seconds_per_unit",
                                                   "> 0", seconds_per_unit));
  int const p = lowered.num_ranks();
  auto zero = std::chrono::nanoseconds::max();
  for (auto const& row : timeline.ranks)
    for (auto const& e : row)
      if (is_compute(e.what.kind)) zero = std::min(zero, e.start);
  if (zero == std::chrono::nanoseconds::max()) zero = std::chrono::nanoseconds{0};
  simulation out;
  out.times.resize(static_cast<std::size_t>(p));
  out.busy.assign(static_cast<std::size_t>(p), 0.0);
  out.first_start.assign(static_cast<std::size_t>(p), 0.0);
  out.last_finish.assign(static_cast<std::size_t>(p), 0.0);
  double total_busy = 0.0;
  for (int r = 0; r < p; ++r) {
    auto const ri = static_cast<std::size_t>(r);
    out.times[ri].assign(lowered.actions(r).size(), interval{});
    bool any = false;
    for (auto const& e : timeline.ranks[ri]) {
      double const a = detail::in_units(e.start - zero, seconds_per_unit);
      double const b = detail::in_units(e.end - zero, seconds_per_unit);
      out.times[ri][static_cast<std::size_t>(e.index)] = {a, b};
      if (!is_compute(e.what.kind)) continue;
      out.busy[ri] += b - a;
      out.first_start[ri] = any ? std::min(out.first_start[ri], a) : a;
      out.last_finish[ri] = std::max(out.last_finish[ri], b);
      any = true;
    }
    out.makespan = std::max(out.makespan, out.last_finish[ri]);
    total_busy += out.busy[ri];
  }
  double const idle = p * out.makespan - total_busy;
  out.bubble_fraction = total_busy > 0 ? idle / total_busy : 0.0;
  out.bubble_rate = out.makespan > 0 ? idle / (p * out.makespan) : 0.0;
  detail::measure_memory(lowered, cost_model{}, out);
  return out;
}

//! Calibration: a cost model for `lowered`'s stages whose F, I and W are the mean measured times
//! (in units of `seconds_per_unit`) of each stage's forward, backward-input and backward-weight
//! actions. A fused B measures I + W together; a stage that only ran fused backwards gets half of
//! the mean B for each. The vocabulary passes (S, T, IF, IB) get their means over all ranks.
//! Communication and memory stay 0 (the executor's timeline does not separate transfer time from
//! waiting). Stages that ran nothing keep 0. Collectives block where the executor ran them
//! blocking (measured_timeline::collectives_block: step_options::vocab_overlap off, or a channel
//! that refuses a second thread) and run on their own stream where it overlapped them, so
//! simulate(lowered, fit_costs(...)) times what the executor ran.
inline cost_model fit_costs(schedule const& lowered, measured_timeline const& timeline,
                            double seconds_per_unit = 1e-3) {
  detail::require_timeline_matches(lowered, timeline);
  if (!(seconds_per_unit > 0.0))
    WEFT_THROW(invalid_argument_error,
               ::weft::detail::expectation_message("seconds_per_unit > 0", "seconds_per_unit",
                                                   "> 0", seconds_per_unit));
  auto const n = static_cast<std::size_t>(lowered.num_stages());
  std::vector<double> sum_f(n, 0.0), sum_i(n, 0.0), sum_w(n, 0.0), sum_b(n, 0.0);
  std::vector<int> cnt_f(n, 0), cnt_i(n, 0), cnt_w(n, 0), cnt_b(n, 0);
  double vocab_sum[4] = {0.0, 0.0, 0.0, 0.0};  // S, T, IF, IB (per rank: one model for all)
  int vocab_cnt[4] = {0, 0, 0, 0};
  for (auto const& row : timeline.ranks)
    for (auto const& e : row) {
      if (is_vocab_compute(e.what.kind)) {
        int const k = e.what.kind == op::vocab_forward    ? 0
                      : e.what.kind == op::vocab_backward ? 1
                      : e.what.kind == op::input_forward  ? 2
                                                          : 3;
        vocab_sum[k] += detail::in_units(e.end - e.start, seconds_per_unit);
        ++vocab_cnt[k];
        continue;
      }
      if (e.what.stage < 0 || static_cast<std::size_t>(e.what.stage) >= n) continue;
      auto const s = static_cast<std::size_t>(e.what.stage);
      double const d = detail::in_units(e.end - e.start, seconds_per_unit);
      switch (e.what.kind) {
        case op::forward:
          sum_f[s] += d;
          ++cnt_f[s];
          break;
        case op::backward_input:
          sum_i[s] += d;
          ++cnt_i[s];
          break;
        case op::backward_weight:
          sum_w[s] += d;
          ++cnt_w[s];
          break;
        case op::backward:
          sum_b[s] += d;
          ++cnt_b[s];
          break;
        default: break;
      }
    }
  auto mean = [](double sum, int count) { return count > 0 ? sum / count : 0.0; };
  cost_model c;
  c.forward.assign(n, 0.0);
  c.backward_input.assign(n, 0.0);
  c.backward_weight.assign(n, 0.0);
  c.activation_bytes.assign(n, 0.0);
  c.parameter_bytes.assign(static_cast<std::size_t>(lowered.num_ranks()), 0.0);
  c.vocab_forward = mean(vocab_sum[0], vocab_cnt[0]);
  c.vocab_backward = mean(vocab_sum[1], vocab_cnt[1]);
  c.input_forward = mean(vocab_sum[2], vocab_cnt[2]);
  c.input_backward = mean(vocab_sum[3], vocab_cnt[3]);
  c.collectives_block = timeline.collectives_block;
  for (std::size_t s = 0; s < n; ++s) {
    c.forward[s] = mean(sum_f[s], cnt_f[s]);
    if (cnt_i[s] > 0 || cnt_w[s] > 0) {
      c.backward_input[s] = mean(sum_i[s], cnt_i[s]);
      c.backward_weight[s] = mean(sum_w[s], cnt_w[s]);
    } else {
      c.backward_input[s] = c.backward_weight[s] = 0.5 * mean(sum_b[s], cnt_b[s]);
    }
  }
  return c;
}

//! One SVG with the simulated timeline of `lowered` under `costs` above the measured one, on their
//! own time axes (both in units of `seconds_per_unit` when `costs` came from fit_costs).
inline std::string render_measured_svg(schedule const& lowered, measured_timeline const& timeline,
                                       cost_model const& costs, svg_options const& o = {},
                                       double seconds_per_unit = 1e-3) {
  auto const sim = simulate(lowered, costs);
  auto const measured = as_simulation(lowered, timeline, seconds_per_unit);
  svg_options top = o, bottom = o;
  top.title = o.title.empty() ? "simulated" : o.title + " (simulated)";
  bottom.title = o.title.empty() ? "measured" : o.title + " (measured)";
  auto const a = render_svg(lowered, sim, top);
  auto const b = render_svg(lowered, measured, bottom);
  // render_svg's picture height: title, a row per rank (+ collectives), the axis.
  int const rows = lowered.num_ranks() + (o.show_collectives && !sim.collective_order.empty());
  double const ha = 40 + rows * o.row_height + 28 + 8;
  double const hb = 40 + lowered.num_ranks() * o.row_height + 28 + 8;
  std::string out = "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"" + detail::fmt(o.width) +
                    "\" height=\"" + detail::fmt(ha + hb) + "\">\n";
  out += a;
  out += "<g transform=\"translate(0," + detail::fmt(ha) + ")\">\n" + b + "</g>\n";
  out += "</svg>\n";
  return out;
}

}  // namespace weft::pipeline
