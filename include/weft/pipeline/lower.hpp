// weft/pipeline/lower.hpp — turns a compute-only schedule into an executable one: a SEND/RECV
// pair for every dependency between ranks, ordered so the schedule cannot deadlock (rank-parity
// rule for pairs of ranks that exchange in both directions; no pair waits across a collective),
// with the collectives kept in their one global order.
#pragma once

#include <weft/core/error.hpp>
#include <weft/pipeline/action.hpp>
#include <weft/pipeline/detail/deps.hpp>
#include <weft/pipeline/schedule.hpp>
#include <weft/pipeline/validate.hpp>  // replay semantics: recv_for_need, partner_of

#include <algorithm>
#include <cstddef>
#include <string>
#include <tuple>
#include <vector>

namespace weft::pipeline {

namespace detail {

//! Demand-driven construction: replays the compute-only schedule in lock-step and, whenever a
//! rank waits for data whose producer has run, appends the SEND to the producer's program and the
//! RECV to the consumer's at that moment. The construction is itself a rendezvous execution, so
//! the result cannot deadlock; pairs between the same two ranks in one step go lower-rank-
//! receives-first.
inline schedule lower_by_replay(schedule const& s) {
  int const p = s.num_ranks();
  action_index const index(s);
  schedule out(s.num_ranks(), s.num_stages(), s.num_microbatches(), s.style(), s.vocab());
  std::vector<std::size_t> pos(static_cast<std::size_t>(p), 0);
  std::vector<std::vector<char>> done(static_cast<std::size_t>(p));
  for (int r = 0; r < p; ++r) done[static_cast<std::size_t>(r)].assign(s.actions(r).size(), 0);
  // Messages delivered: key (recv kind, stage, mb) -> received.
  std::vector<char> received(2u * static_cast<std::size_t>(s.num_stages()) *
                                 static_cast<std::size_t>(s.num_microbatches()),
                             0);
  auto recv_slot = [&](action const& rv) {
    return (static_cast<std::size_t>(rv.kind == op::recv_backward) *
                static_cast<std::size_t>(s.num_stages()) +
            static_cast<std::size_t>(rv.stage)) *
               static_cast<std::size_t>(s.num_microbatches()) +
           static_cast<std::size_t>(rv.microbatch);
  };
  auto is_done = [&](int rank, int i) {
    return rank >= 0 && i >= 0 &&
           done[static_cast<std::size_t>(rank)][static_cast<std::size_t>(i)] != 0;
  };
  // Needs of `a` on rank r: satisfied, or the RECVs still missing (with producers done) via
  // `wanted`.
  auto ready = [&](action const& a, int r, std::vector<action>* wanted) {
    bool ok = true;
    for (auto const& n : needs_of(s, a, r)) {
      if (n.what == need::type::collective) {
        ok = ok && is_done(r, index.collective_pos(r, n.tag, n.mb));
        continue;
      }
      auto const l = index.resolve(n);
      if (l.count == 0) return false;
      if (l.rank == r) {
        ok = ok && is_done(l.rank, l.pos);
        continue;
      }
      action rv;
      if (!is_compute(a.kind) || !recv_for_need(a, n, rv)) return false;
      rv = s.make(rv.kind, rv.stage, rv.microbatch);
      if (received[recv_slot(rv)]) continue;
      ok = false;
      if (wanted != nullptr && is_done(l.rank, l.pos)) wanted->push_back(rv);
    }
    return ok;
  };
  std::size_t remaining = s.total_actions();
  while (remaining > 0) {
    bool progress = false;
    // Compute: at most one per rank per step, so the lock-step resembles unit time.
    for (int r = 0; r < p; ++r) {
      auto const ri = static_cast<std::size_t>(r);
      if (pos[ri] >= s.actions(r).size()) continue;
      auto const& a = s.actions(r)[pos[ri]];
      if (is_compute(a.kind) && ready(a, r, nullptr)) {
        out.push(r, a);
        done[ri][pos[ri]++] = 1;
        --remaining;
        progress = true;
      }
    }
    // Collectives: once every rank stands at the same one with its preconditions met.
    {
      action const* first = pos[0] < s.actions(0).size() ? &s.actions(0)[pos[0]] : nullptr;
      bool all = first != nullptr && first->kind == op::collective;
      for (int r = 0; r < p && all; ++r) {
        auto const ri = static_cast<std::size_t>(r);
        all = pos[ri] < s.actions(r).size() && s.actions(r)[pos[ri]] == *first &&
              ready(*first, r, nullptr);
      }
      if (all) {
        for (int r = 0; r < p; ++r) {
          auto const ri = static_cast<std::size_t>(r);
          out.push(r, s.actions(r)[pos[ri]]);
          done[ri][pos[ri]++] = 1;
          --remaining;
        }
        progress = true;
      }
    }
    // Messages the waiting ranks need and can have now.
    std::vector<std::tuple<int, int, int, action>> pairs;  // (low, high, receiver-is-high, recv)
    for (int r = 0; r < p; ++r) {
      auto const ri = static_cast<std::size_t>(r);
      if (pos[ri] >= s.actions(r).size()) continue;
      auto const& a = s.actions(r)[pos[ri]];
      if (!is_compute(a.kind)) continue;
      std::vector<action> wanted;
      ready(a, r, &wanted);
      for (auto const& rv : wanted)
        pairs.emplace_back(std::min(r, rv.peer), std::max(r, rv.peer), r > rv.peer, rv);
    }
    std::stable_sort(pairs.begin(), pairs.end(), [](auto const& x, auto const& y) {
      return std::tuple{std::get<0>(x), std::get<1>(x), std::get<2>(x)} <
             std::tuple{std::get<0>(y), std::get<1>(y), std::get<2>(y)};
    });
    for (auto const& [lo, hi, high_receives, rv] : pairs) {
      (void)lo;
      (void)hi;
      (void)high_receives;
      auto const send = partner_of(rv);
      out.push(rv.peer, s.make(send.kind, send.stage, send.microbatch));
      out.push(owner_rank(s, rv.kind, rv.stage), rv);
      received[recv_slot(rv)] = 1;
      progress = true;
    }
    if (!progress) {
      std::string stuck;
      for (int r = 0; r < p; ++r)
        if (pos[static_cast<std::size_t>(r)] < s.actions(r).size())
          stuck += ::weft::detail::concat(
              " rank ", r, " at #", pos[static_cast<std::size_t>(r)], " ",
              to_string(s.actions(r)[pos[static_cast<std::size_t>(r)]]), ";");
      WEFT_THROW(schedule_error,
                 "lower: the compute schedule cannot progress (rule `deadlock`); waiting:", stuck);
    }
  }
  return out;
}

}  // namespace detail

//! Lowers a compute-only schedule (no SEND/RECV) to one with explicit point-to-point ops, built by
//! demand-driven replay (above): each RECV sits right before the action that needs it, each SEND
//! where its rank stands when the receiver starts waiting (right after the producer whenever the
//! receiver keeps up), exchanges between two ranks in one step go lower-rank-receives-first (the
//! rank-parity rule), and no pair straddles a collective. The result passes `validate`'s
//! rendezvous replay by construction. Throws schedule_error if `s` already has point-to-point ops,
//! breaks validate's mapping rule, or its dataflow cannot progress.
inline schedule lower(schedule const& s) {
  if (s.has_p2p())
    WEFT_THROW(schedule_error,
               "argument `s`: expected a compute-only schedule, actual one that already "
               "has SEND/RECV actions");
  detail::require_mapping(s, "lower");
  return detail::lower_by_replay(s);
}

}  // namespace weft::pipeline
