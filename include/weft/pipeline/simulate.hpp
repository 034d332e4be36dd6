// weft/pipeline/simulate.hpp — times a schedule under a cost model: per-rank timelines, makespan,
// bubble, per-rank peak in-flight activations and peak memory. Compute runs in program order on
// each rank's main stream. Point-to-point transfers are asynchronous: in a compute-only schedule
// data is available one transfer time after its producer finishes; in a lowered one it leaves
// where the SEND stands in the sender's program and a RECV holds its rank until it has arrived,
// as an executor running the program in order does. Collectives run in their global order on their
// own stream, starting once every rank has reached them (or, with cost_model::collectives_block,
// holding each rank until they complete).
#pragma once

#include <weft/core/error.hpp>
#include <weft/pipeline/action.hpp>
#include <weft/pipeline/cost_model.hpp>
#include <weft/pipeline/detail/deps.hpp>
#include <weft/pipeline/schedule.hpp>
#include <weft/pipeline/validate.hpp>  // check_mapping: what simulate indexes by must be in range

#include <algorithm>
#include <cstddef>
#include <limits>
#include <string>
#include <vector>

namespace weft::pipeline {

struct interval {
  double start = 0;
  double finish = 0;
};

//! What `simulate` measures. Bubble: `bubble_fraction` = total idle / total busy over ranks
//! (Megatron's bubble/ideal, (p-1)/m for 1F1B); `bubble_rate` = idle / (ranks x makespan)
//! (the zero-bubble papers'); rate = fraction / (1 + fraction).
struct simulation {
  //! [rank][action index]. Compute: when it ran. Lowered: a RECV spans its rank's wait for the
  //! message, a SEND is the instant the message leaves. A collective spans its rank's wait when
  //! collectives block, else it is the instant the rank issues it.
  std::vector<std::vector<interval>> times;
  std::vector<action> collective_order;    //!< the global collective sequence
  std::vector<interval> collective_times;  //!< when each ran on the collective stream
  double makespan = 0;
  std::vector<double> busy;         //!< per rank: compute time
  std::vector<double> first_start;  //!< per rank: start of its first compute
  std::vector<double> last_finish;  //!< per rank: end of its last compute
  double bubble_fraction = 0;
  double bubble_rate = 0;
  std::vector<int> peak_in_flight;        //!< per rank: most (stage, microbatch) activations held
                                          //!< at once, in chunks (F adds one, B or W frees it)
  std::vector<int> peak_vocab_in_flight;  //!< per rank: most S..T output-layer shards held
  std::vector<double> peak_activation_bytes;
  std::vector<double> peak_memory_bytes;  //!< parameters + peak activations

  //! Per-rank busy window (first compute to last), as zero-bubble's `best_time` measures it.
  [[nodiscard]] double window(int rank) const {
    auto const r = static_cast<std::size_t>(rank);
    return last_finish[r] - first_start[r];
  }
};

namespace detail {

inline double compute_cost(cost_model const& c, action const& a) {
  auto const st = static_cast<std::size_t>(a.stage);
  switch (a.kind) {
    case op::forward: return c.forward.at(st);
    case op::backward_input: return c.backward_input.at(st);
    case op::backward_weight: return c.backward_weight.at(st);
    case op::backward: return c.backward_input.at(st) + c.backward_weight.at(st);
    case op::vocab_forward: return c.vocab_forward;
    case op::vocab_backward: return c.vocab_backward;
    case op::input_forward: return c.input_forward;
    case op::input_backward: return c.input_backward;
    default: return 0.0;
  }
}

//! Peak in-flight counts and bytes along each rank's program (order alone decides them).
inline void measure_memory(schedule const& s, cost_model const& c, simulation& out) {
  int const p = s.num_ranks();
  out.peak_in_flight.assign(static_cast<std::size_t>(p), 0);
  out.peak_vocab_in_flight.assign(static_cast<std::size_t>(p), 0);
  out.peak_activation_bytes.assign(static_cast<std::size_t>(p), 0.0);
  out.peak_memory_bytes.assign(static_cast<std::size_t>(p), 0.0);
  for (int r = 0; r < p; ++r) {
    // A stage whose backward is split frees its activation at W, otherwise at B.
    int live = 0, vocab_live = 0, peak = 0, vocab_peak = 0;
    double bytes = 0, peak_bytes = 0;
    for (auto const& a : s.actions(r)) {
      auto const st = static_cast<std::size_t>(a.stage);
      switch (a.kind) {
        case op::forward:
          ++live;
          bytes += st < c.activation_bytes.size() ? c.activation_bytes[st] : 0.0;
          break;
        case op::backward:
        case op::backward_weight:
          --live;
          bytes -= st < c.activation_bytes.size() ? c.activation_bytes[st] : 0.0;
          break;
        case op::vocab_forward:
          ++vocab_live;
          bytes += c.vocab_activation_bytes;
          break;
        case op::vocab_backward:
          --vocab_live;
          bytes -= c.vocab_activation_bytes;
          break;
        case op::input_forward: bytes += c.input_activation_bytes; break;
        case op::input_backward: bytes -= c.input_activation_bytes; break;
        default: break;
      }
      peak = std::max(peak, live);
      vocab_peak = std::max(vocab_peak, vocab_live);
      peak_bytes = std::max(peak_bytes, bytes);
    }
    auto const i = static_cast<std::size_t>(r);
    out.peak_in_flight[i] = peak;
    out.peak_vocab_in_flight[i] = vocab_peak;
    out.peak_activation_bytes[i] = peak_bytes;
    out.peak_memory_bytes[i] =
        peak_bytes + (i < c.parameter_bytes.size() ? c.parameter_bytes[i] : 0.0);
  }
}

}  // namespace detail

//! Times `s` under `costs`. A lowered schedule (one with SEND/RECV) is timed as its programs run:
//! a message leaves when its sender reaches the SEND (after every compute before it, so a SEND
//! placed late delays its receiver) and a RECV holds its rank until the message has arrived; a
//! compute-only schedule lets each message leave as its producer finishes. A lowered schedule
//! therefore simulates like its compute-only form exactly when its point-to-point ops delay
//! nothing. Throws schedule_error when an action is out of the schedule's range or on the wrong
//! rank (validate's mapping rule), when the cost model does not cover the schedule's stages, when
//! ranks disagree on the collective order, or when the dataflow cannot progress (a rank waits on
//! something that never happens); `validate` explains such schedules in more detail.
inline simulation simulate(schedule const& s, cost_model const& costs) {
  detail::require_mapping(s, "simulate");
  int const p = s.num_ranks();
  auto const stages = static_cast<std::size_t>(s.num_stages());
  detail::require(costs.forward.size() == stages && costs.backward_input.size() == stages &&
                      costs.backward_weight.size() == stages,
                  "costs.forward/backward_input/backward_weight.size()",
                  ::weft::detail::concat("num_stages (", stages, ")"), costs.forward.size(),
                  "one cost per stage");
  detail::action_index const index(s);
  simulation out;
  out.times.resize(static_cast<std::size_t>(p));
  for (int r = 0; r < p; ++r) out.times[static_cast<std::size_t>(r)].resize(s.actions(r).size());

  // The global collective order is rank 0's; every rank must agree.
  for (auto const& a : s.actions(0))
    if (a.kind == op::collective) out.collective_order.push_back(a);
  for (int r = 1; r < p; ++r) {
    std::size_t k = 0;
    for (auto const& a : s.actions(r)) {
      if (a.kind != op::collective) continue;
      if (k >= out.collective_order.size() || !(out.collective_order[k] == a))
        WEFT_THROW(schedule_error, "simulate: rank ", r, " runs collective ", to_string(a),
                   " as its collective #", k, " but rank 0 runs ",
                   k < out.collective_order.size() ? to_string(out.collective_order[k])
                                                   : std::string("none"),
                   " (rule: same collective order on every rank)");
      ++k;
    }
    if (k != out.collective_order.size())
      WEFT_THROW(schedule_error, "simulate: rank ", r, " runs ", k, " collectives, rank 0 runs ",
                 out.collective_order.size(), " (rule: same collective order on every rank)");
  }
  std::size_t const ncoll = out.collective_order.size();
  out.collective_times.assign(ncoll, interval{});
  // Sequence number of each (tag, mb) in the collective order.
  std::vector<int> coll_seq(6u * static_cast<std::size_t>(s.num_microbatches() + 1), -1);
  for (std::size_t k = 0; k < ncoll; ++k) {
    auto const& a = out.collective_order[k];
    if (a.microbatch >= 0 && a.microbatch <= s.num_microbatches())
      coll_seq[static_cast<std::size_t>(a.tag) *
                   static_cast<std::size_t>(s.num_microbatches() + 1) +
               static_cast<std::size_t>(a.microbatch)] = static_cast<int>(k);
  }
  constexpr double unknown = -1.0;
  std::vector<std::vector<double>> issued(
      ncoll, std::vector<double>(static_cast<std::size_t>(p), unknown));
  bool const lowered = s.has_p2p();
  // Lowered: when each message (keyed by its RECV) leaves its sender and arrives.
  auto const sm =
      static_cast<std::size_t>(s.num_stages()) * static_cast<std::size_t>(s.num_microbatches());
  std::vector<double> departs(lowered ? 2 * sm : 0, unknown);
  std::vector<double> arrives(lowered ? 2 * sm : 0, unknown);
  auto message = [&](op recv_kind, int stage, int mb) -> std::size_t {
    if (stage < 0 || stage >= s.num_stages() || mb < 0 || mb >= s.num_microbatches())
      return departs.size();  // none: validate's mapping rule keeps p2p ops in range
    return (recv_kind == op::recv_backward ? sm : 0) +
           static_cast<std::size_t>(stage) * static_cast<std::size_t>(s.num_microbatches()) +
           static_cast<std::size_t>(mb);
  };
  std::vector<double> coll_done(ncoll, unknown);
  std::vector<int> issued_count(ncoll, 0);
  std::size_t coll_next = 0;  // next collective to run on the collective stream

  std::vector<std::size_t> pos(static_cast<std::size_t>(p), 0);
  std::vector<std::size_t> coll_pos(static_cast<std::size_t>(p), 0);
  std::vector<double> clock(static_cast<std::size_t>(p), 0.0);
  std::vector<std::vector<char>> done(static_cast<std::size_t>(p));
  for (int r = 0; r < p; ++r) done[static_cast<std::size_t>(r)].assign(s.actions(r).size(), 0);
  double const p2p = costs.p2p_time();

  // When the data a need of `a_of_need` names is available on `rank`, or unknown if not yet
  // simulated.
  action a_of_need{};
  auto available = [&](detail::need const& n, int rank) -> double {
    if (n.what == detail::need::type::collective) {
      if (n.mb < 0 || n.mb > s.num_microbatches()) return unknown;
      int const k = coll_seq[static_cast<std::size_t>(n.tag) *
                                 static_cast<std::size_t>(s.num_microbatches() + 1) +
                             static_cast<std::size_t>(n.mb)];
      return k < 0 ? unknown : coll_done[static_cast<std::size_t>(k)];
    }
    auto const l = index.resolve(n);
    if (l.count == 0 || !done[static_cast<std::size_t>(l.rank)][static_cast<std::size_t>(l.pos)])
      return unknown;
    double const t =
        out.times[static_cast<std::size_t>(l.rank)][static_cast<std::size_t>(l.pos)].finish;
    if (l.rank == rank) return t;
    // Lowered: the data comes through this rank's RECV (which program order puts first), when
    // the schedule has one.
    action recv;
    if (lowered && is_compute(a_of_need.kind) && detail::recv_for_need(a_of_need, n, recv)) {
      auto const k = message(recv.kind, recv.stage, recv.microbatch);
      if (k < arrives.size() && index.find(recv.kind, recv.stage, recv.microbatch).count > 0)
        return arrives[k];
    }
    return t + p2p;
  };

  bool progress = true;
  std::size_t remaining = s.total_actions();
  while (remaining > 0 && progress) {
    progress = false;
    for (int r = 0; r < p; ++r) {
      auto const ri = static_cast<std::size_t>(r);
      auto const& prog = s.actions(r);
      while (pos[ri] < prog.size()) {
        auto const& a = prog[pos[ri]];
        auto& t = out.times[ri][pos[ri]];
        if (is_compute(a.kind)) {
          double ready = clock[ri];
          bool ok = true;
          a_of_need = a;
          for (auto const& n : detail::needs_of(s, a, r)) {
            double const at = available(n, r);
            if (at < 0) {
              ok = false;
              break;
            }
            ready = std::max(ready, at);
          }
          if (!ok) break;
          t.start = ready;
          t.finish = ready + detail::compute_cost(costs, a);
          clock[ri] = t.finish;
        } else if (a.kind == op::collective) {
          // Issuing is non-blocking for the main stream; its own preconditions are earlier in
          // this rank's program, except a root's wait on an earlier collective, which the
          // collective stream's order provides. Blocking collectives then hold the rank.
          std::size_t const k = coll_pos[ri];
          if (issued[k][ri] < 0) {
            issued[k][ri] = clock[ri];
            ++issued_count[k];
          }
          if (costs.collectives_block && coll_done[k] < 0) break;
          ++coll_pos[ri];
          t.start = issued[k][ri];
          if (costs.collectives_block) clock[ri] = std::max(clock[ri], coll_done[k]);
          t.finish = clock[ri];
        } else if (!lowered || !is_p2p(a.kind)) {
          t.start = t.finish = clock[ri];
        } else if (is_send(a.kind)) {
          // The message leaves here, once its producer (earlier on this rank) has finished.
          double leave = clock[ri];
          bool ok = true;
          a_of_need = a;
          for (auto const& n : detail::needs_of(s, a, r)) {
            double const at = available(n, r);
            if (at < 0) {
              ok = false;
              break;
            }
            leave = std::max(leave, at);
          }
          if (!ok) break;
          auto const recv = detail::partner_of(a);
          auto const k = message(recv.kind, recv.stage, recv.microbatch);
          if (k < departs.size()) {
            departs[k] = leave;
            arrives[k] = leave + p2p;
          }
          t.start = t.finish = leave;
        } else {
          auto const k = message(a.kind, a.stage, a.microbatch);
          if (k < departs.size() && departs[k] < 0) break;  // not sent yet
          t.start = clock[ri];
          if (k < departs.size()) clock[ri] = std::max(clock[ri], arrives[k]);
          t.finish = clock[ri];
        }
        done[ri][pos[ri]] = 1;
        ++pos[ri];
        --remaining;
        progress = true;
      }
      // Run every collective that all ranks have issued, in order.
      while (coll_next < ncoll && issued_count[coll_next] == p) {
        double start = coll_next > 0 ? out.collective_times[coll_next - 1].finish : 0.0;
        for (double at : issued[coll_next]) start = std::max(start, at);
        out.collective_times[coll_next] = {start, start + costs.collective_latency};
        coll_done[coll_next] = start + costs.collective_latency;
        ++coll_next;
        progress = true;
      }
    }
  }
  if (remaining > 0) {
    std::string stuck;
    for (int r = 0; r < p; ++r) {
      auto const ri = static_cast<std::size_t>(r);
      if (pos[ri] < s.actions(r).size())
        stuck += ::weft::detail::concat(" rank ", r, " at #", pos[ri], " ",
                                        to_string(s.actions(r)[pos[ri]]), ";");
    }
    WEFT_THROW(schedule_error,
               "simulate: the schedule cannot progress (rule: every need is produced "
               "earlier in the dataflow); waiting:",
               stuck);
  }

  out.busy.assign(static_cast<std::size_t>(p), 0.0);
  out.first_start.assign(static_cast<std::size_t>(p), 0.0);
  out.last_finish.assign(static_cast<std::size_t>(p), 0.0);
  double total_busy = 0;
  for (int r = 0; r < p; ++r) {
    auto const ri = static_cast<std::size_t>(r);
    bool any = false;
    for (std::size_t i = 0; i < s.actions(r).size(); ++i) {
      if (!is_compute(s.actions(r)[i].kind)) continue;
      auto const& t = out.times[ri][i];
      out.busy[ri] += t.finish - t.start;
      if (!any) out.first_start[ri] = t.start;
      any = true;
      out.last_finish[ri] = std::max(out.last_finish[ri], t.finish);
    }
    out.makespan = std::max(out.makespan, out.last_finish[ri]);
    total_busy += out.busy[ri];
  }
  for (auto const& t : out.collective_times) out.makespan = std::max(out.makespan, t.finish);
  double const idle = p * out.makespan - total_busy;
  out.bubble_fraction = total_busy > 0 ? idle / total_busy : 0.0;
  out.bubble_rate = out.makespan > 0 ? idle / (p * out.makespan) : 0.0;
  detail::measure_memory(s, costs, out);
  return out;
}

//! Shorthand: times `s` under `unit_costs(s)` (F = I = W = 1 per stage, 1/v per chunk, the
//! output layer as the schedule runs it). The schedule is checked (validate's mapping rule) before
//! the cost model is sized by its stage count, so a parsed header cannot make it allocate.
inline simulation simulate(schedule const& s) {
  detail::require_mapping(s, "simulate");
  return simulate(s, unit_costs(s));
}

}  // namespace weft::pipeline
