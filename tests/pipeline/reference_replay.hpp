// An independent reference for the validator, written for the tests only: a brute-force
// rendezvous replay over per-rank sets of "facts" (which activations and gradients a rank
// holds, which collectives it has passed), plus completeness and FIFO counts. It shares no code
// with weft/pipeline/validate.hpp beyond the schedule container and the action type. Two more
// executions, as weft's executor runs: `buffered` sends (each message queued per sender and
// receiver, a RECV taking the head of its queue, so messages must arrive in the order they are
// received) and `overlapped` collectives (posted by each rank on its own into its queue, as a
// progress thread runs them in order; passed by all once every queue's oldest is the same one).
#pragma once

#include <weft/pipeline/action.hpp>
#include <weft/pipeline/schedule.hpp>

#include <map>
#include <set>
#include <tuple>
#include <vector>

namespace weft_test {

using weft::pipeline::action;
using weft::pipeline::collective_kind;
using weft::pipeline::op;
using weft::pipeline::schedule;
using weft::pipeline::vocab_variant;

// A fact a rank can hold: (what, stage or rank, microbatch).
enum fact_kind { out_of, grad_into, input_grad_done, s_done, t_done, if_done, passed };
using fact = std::tuple<int, int, int, int>;  // kind, stage, mb, tag

inline fact f(fact_kind k, int stage, int mb, int tag = 0) { return {k, stage, mb, tag}; }

struct reference_replay {
  schedule const& s;
  std::vector<std::set<fact>> facts;
  bool buffered = false, overlapped = false;
  // Messages in flight, per (sender, receiver): (recv kind, receiving stage, mb), oldest first.
  std::map<std::pair<int, int>, std::vector<std::tuple<int, int, int>>> queues;
  // Overlapped: each rank's posted collectives not yet passed, (tag, mb), oldest first.
  std::vector<std::vector<std::pair<int, int>>> posted;

  explicit reference_replay(schedule const& sched, bool buffered_p2p = false,
                            bool overlapped_collectives = false)
      : s(sched),
        facts(static_cast<std::size_t>(sched.num_ranks())),
        buffered(buffered_p2p),
        overlapped(overlapped_collectives),
        posted(static_cast<std::size_t>(sched.num_ranks())) {}

  bool has(int r, fact x) const { return facts[static_cast<std::size_t>(r)].count(x) > 0; }
  // Passed by rank r (all ranks pass a collective together, blocking or overlapped).
  bool coll(int r, collective_kind t, int mb) const {
    return has(r, f(passed, -1, mb, static_cast<int>(t)));
  }
  // Overlapped: passes the collectives that are the oldest posted on every rank.
  bool pass_posted() {
    bool any = false;
    for (;;) {
      auto const& first = posted[0];
      if (first.empty()) return any;
      auto const head = first.front();
      for (auto const& q : posted)
        if (q.empty() || q.front() != head) return any;
      for (std::size_t r = 0; r < posted.size(); ++r) {
        posted[r].erase(posted[r].begin());
        facts[r].insert(f(passed, -1, head.second, head.first));
      }
      any = true;
    }
  }

  // What a compute op needs on its rank, spelled out from the rules docs/pipeline.md states.
  bool enabled(int r, action const& a) const {
    int const last = s.num_stages() - 1;
    bool const vocab = s.vocab() != vocab_variant::none;
    switch (a.kind) {
      case op::forward:
        if (a.stage == 0) return !vocab || coll(r, collective_kind::reduce_input, a.microbatch);
        return has(r, f(out_of, a.stage - 1, a.microbatch));
      case op::backward:
      case op::backward_input:
        if (!has(r, f(out_of, a.stage, a.microbatch))) return false;
        if (a.stage < last) return has(r, f(grad_into, a.stage + 1, a.microbatch));
        if (s.vocab() == vocab_variant::one_barrier)
          return coll(r, collective_kind::c0, a.microbatch);
        if (s.vocab() == vocab_variant::two_barrier)
          return coll(r, collective_kind::c1, a.microbatch);
        return true;
      case op::backward_weight: return has(r, f(input_grad_done, a.stage, a.microbatch));
      case op::vocab_forward: return coll(r, collective_kind::broadcast_output, a.microbatch);
      case op::vocab_backward:
        return has(r, f(s_done, r, a.microbatch)) && coll(r, collective_kind::c0, a.microbatch) &&
               coll(r, collective_kind::broadcast_output, a.microbatch + 1);
      case op::input_forward: return true;
      case op::input_backward:
        return has(r, f(if_done, r, a.microbatch)) &&
               coll(r, collective_kind::broadcast_input, a.microbatch);
      case op::send_forward: return has(r, f(out_of, a.stage, a.microbatch));
      case op::send_backward: return has(r, f(grad_into, a.stage, a.microbatch));
      default: return true;
    }
  }

  bool collective_enabled(int r, action const& a) const {
    int const last = s.num_stages() - 1;
    switch (a.tag) {
      case collective_kind::broadcast_output:
        if (r != s.stage_to_rank(last)) return true;
        if (a.microbatch < s.num_microbatches() && !has(r, f(out_of, last, a.microbatch)))
          return false;
        return a.microbatch == 0 || coll(r, collective_kind::c0, a.microbatch - 1);
      case collective_kind::c0: return has(r, f(s_done, r, a.microbatch));
      case collective_kind::c1: return has(r, f(t_done, r, a.microbatch));
      case collective_kind::reduce_input: return has(r, f(if_done, r, a.microbatch));
      case collective_kind::broadcast_input:
        return r != s.stage_to_rank(0) || has(r, f(grad_into, 0, a.microbatch));
      default: return false;
    }
  }

  void apply(int r, action const& a) {
    auto& mine = facts[static_cast<std::size_t>(r)];
    switch (a.kind) {
      case op::forward: mine.insert(f(out_of, a.stage, a.microbatch)); break;
      case op::backward: mine.insert(f(grad_into, a.stage, a.microbatch)); break;
      case op::backward_input:
        mine.insert(f(grad_into, a.stage, a.microbatch));
        mine.insert(f(input_grad_done, a.stage, a.microbatch));
        break;
      case op::vocab_forward: mine.insert(f(s_done, r, a.microbatch)); break;
      case op::vocab_backward: mine.insert(f(t_done, r, a.microbatch)); break;
      case op::input_forward: mine.insert(f(if_done, r, a.microbatch)); break;
      case op::recv_forward: mine.insert(f(out_of, a.stage - 1, a.microbatch)); break;
      case op::recv_backward: mine.insert(f(grad_into, a.stage + 1, a.microbatch)); break;
      case op::collective: mine.insert(f(passed, -1, a.microbatch, static_cast<int>(a.tag))); break;
      default: break;
    }
  }

  // Brute force: repeatedly scan every rank and fire whatever can fire, until nothing can.
  bool runs_to_completion() {
    int const p = s.num_ranks();
    std::vector<std::size_t> pc(static_cast<std::size_t>(p), 0);
    auto head = [&](int r) -> action const* {
      auto const& prog = s.actions(r);
      return pc[static_cast<std::size_t>(r)] < prog.size() ? &prog[pc[static_cast<std::size_t>(r)]]
                                                           : nullptr;
    };
    for (bool fired = true; fired;) {
      fired = false;
      for (int r = 0; r < p; ++r) {
        action const* a = head(r);
        if (a == nullptr) continue;
        if (weft::pipeline::is_compute(a->kind)) {
          if (enabled(r, *a)) {
            apply(r, *a);
            ++pc[static_cast<std::size_t>(r)];
            fired = true;
          }
        } else if (buffered && (a->kind == op::send_forward || a->kind == op::send_backward)) {
          if (!enabled(r, *a)) continue;
          int const to_stage = a->kind == op::send_forward ? a->stage + 1 : a->stage - 1;
          if (to_stage < 0 || to_stage >= s.num_stages()) continue;
          int const q = s.stage_to_rank(to_stage);
          if (q == r) continue;
          op const want = a->kind == op::send_forward ? op::recv_forward : op::recv_backward;
          queues[{r, q}].emplace_back(static_cast<int>(want), to_stage, a->microbatch);
          ++pc[static_cast<std::size_t>(r)];
          fired = true;
        } else if (buffered && (a->kind == op::recv_forward || a->kind == op::recv_backward)) {
          int const from_stage = a->kind == op::recv_forward ? a->stage - 1 : a->stage + 1;
          if (from_stage < 0 || from_stage >= s.num_stages()) continue;
          auto& q = queues[{s.stage_to_rank(from_stage), r}];
          if (q.empty() ||
              q.front() != std::tuple{static_cast<int>(a->kind), a->stage, a->microbatch})
            continue;
          q.erase(q.begin());
          apply(r, *a);
          ++pc[static_cast<std::size_t>(r)];
          fired = true;
        } else if (a->kind == op::send_forward || a->kind == op::send_backward) {
          if (!enabled(r, *a)) continue;
          int const to_stage = a->kind == op::send_forward ? a->stage + 1 : a->stage - 1;
          if (to_stage < 0 || to_stage >= s.num_stages()) continue;
          int const q = s.stage_to_rank(to_stage);
          action const* b = q == r ? nullptr : head(q);
          op const want = a->kind == op::send_forward ? op::recv_forward : op::recv_backward;
          if (b != nullptr && b->kind == want && b->stage == to_stage &&
              b->microbatch == a->microbatch) {
            apply(q, *b);
            ++pc[static_cast<std::size_t>(r)];
            ++pc[static_cast<std::size_t>(q)];
            fired = true;
          }
        } else if (a->kind == op::collective && overlapped) {
          if (collective_enabled(r, *a)) {
            posted[static_cast<std::size_t>(r)].emplace_back(static_cast<int>(a->tag),
                                                             a->microbatch);
            ++pc[static_cast<std::size_t>(r)];
            pass_posted();
            fired = true;
          }
        } else if (a->kind == op::collective) {
          bool all = true;
          for (int q = 0; q < p && all; ++q) {
            action const* b = head(q);
            all = b != nullptr && b->kind == op::collective && b->tag == a->tag &&
                  b->microbatch == a->microbatch && collective_enabled(q, *b);
          }
          if (all) {
            for (int q = 0; q < p; ++q) {
              apply(q, *head(q));
              ++pc[static_cast<std::size_t>(q)];
            }
            fired = true;
          }
        }
        // A RECV fires only together with its SEND, from the sender's side.
      }
    }
    for (int r = 0; r < p; ++r)
      if (head(r) != nullptr) return false;
    for (auto const& [pair, q] : queues)
      if (!q.empty()) return false;  // a message nobody received
    for (auto const& q : posted)
      if (!q.empty()) return false;  // a collective the ranks posted in different orders
    return true;
  }

  // Every (stage, mb) gets F and (B, or I and W); vocabulary passes once per rank and mb; per
  // rank, stage and op, microbatches in increasing order.
  bool complete_and_fifo() const {
    std::map<std::tuple<int, int, int>, int> count;  // (op, stage, mb)
    for (int r = 0; r < s.num_ranks(); ++r) {
      std::map<std::pair<int, int>, int> last_mb;
      for (auto const& a : s.actions(r)) {
        if (!weft::pipeline::is_compute(a.kind)) continue;
        ++count[{static_cast<int>(a.kind), a.stage, a.microbatch}];
        auto const key = std::pair{static_cast<int>(a.kind), a.stage};
        auto const it = last_mb.find(key);
        if (it != last_mb.end() && it->second >= a.microbatch) return false;
        last_mb[key] = a.microbatch;
      }
    }
    auto n = [&](op k, int st, int mb) {
      auto const it = count.find({static_cast<int>(k), st, mb});
      return it == count.end() ? 0 : it->second;
    };
    for (int st = 0; st < s.num_stages(); ++st)
      for (int mb = 0; mb < s.num_microbatches(); ++mb) {
        if (n(op::forward, st, mb) != 1) return false;
        int const b = n(op::backward, st, mb), i = n(op::backward_input, st, mb),
                  w = n(op::backward_weight, st, mb);
        if (!((b == 1 && i == 0 && w == 0) || (b == 0 && i == 1 && w == 1))) return false;
      }
    if (s.vocab() != vocab_variant::none)
      for (int r = 0; r < s.num_ranks(); ++r)
        for (int mb = 0; mb < s.num_microbatches(); ++mb)
          for (op k :
               {op::vocab_forward, op::vocab_backward, op::input_forward, op::input_backward})
            if (n(k, r, mb) != 1) return false;
    return true;
  }
};

// The reference verdict on a lowered schedule.
inline bool reference_valid(schedule const& s, bool buffered_p2p = false,
                            bool overlapped_collectives = false) {
  reference_replay rr(s, buffered_p2p, overlapped_collectives);
  return rr.complete_and_fifo() && rr.runs_to_completion();
}

}  // namespace weft_test
