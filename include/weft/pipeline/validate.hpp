// weft/pipeline/validate.hpp — proves a schedule correct: stage ownership, completeness (every
// (stage, microbatch) gets exactly the passes it needs), FIFO order per stage, every local and
// cross-rank dependency, send/recv pairing, one collective order, and a rendezvous replay showing
// it cannot deadlock. Errors name the rank, the action index and the violated rule.
#pragma once

#include <weft/core/error.hpp>
#include <weft/pipeline/action.hpp>
#include <weft/pipeline/detail/deps.hpp>
#include <weft/pipeline/schedule.hpp>

#include <cstddef>
#include <map>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

namespace weft::pipeline {

//! The first rule a schedule breaks. `index` is -1 when an action is missing rather than
//! misplaced. Rules: "mapping", "completeness", "fifo", "dependency", "pairing", "p2p-order",
//! "collective-order", "deadlock".
struct validation_issue {
  int rank = -1;
  int index = -1;
  std::string rule;
  std::string message;
};

struct validation_result {
  bool ok = true;
  validation_issue issue;
  explicit operator bool() const noexcept { return ok; }
};

//! The execution under which `check`'s replay (rule `deadlock`) proves a lowered schedule to
//! finish, and how strictly rule `p2p-order` compares two ranks' messages. The default is the
//! strictest, which any transport satisfies; weft's executor needs less (executor()).
struct replay_model {
  //! A SEND completes at once and a RECV waits for its SEND: the receiver posted its receives up
  //! front and sends do not block (weft's executor), so two ranks need only agree on the order of
  //! their messages in each direction. false: a SEND and its RECV complete together (rendezvous),
  //! and two ranks post their sends and receives to each other in one order.
  bool buffered_p2p = false;
  //! A collective is posted without waiting and completes once every rank has posted it; an
  //! action that reads its result waits for that (weft's executor with
  //! step_options::vocab_overlap). false: a collective holds every rank until all have reached it.
  bool overlapped_collectives = false;

  //! What weft's executor needs, with its vocabulary collectives overlapped or blocking:
  //! buffered point-to-point and collectives that may block (a program that finishes with
  //! blocking collectives finishes with overlapped ones).
  [[nodiscard]] static constexpr replay_model executor() noexcept { return {true, false}; }
};

namespace detail {

//! The point-to-point op that carries a cross-rank need of a compute action into its rank:
//! F(s) needs F(s-1)'s output via RECV_F(s); I/B(s) needs the gradient of s+1 via RECV_B(s).
inline bool recv_for_need(action const& consumer, need const& n, action& recv) {
  if (n.what == need::type::action && n.kind == op::forward && consumer.kind == op::forward) {
    recv =
        action{op::recv_forward, consumer.stage, consumer.microbatch, 0, -1, collective_kind::none};
    return true;
  }
  if (n.what == need::type::grad &&
      (consumer.kind == op::backward || consumer.kind == op::backward_input)) {
    recv = action{op::recv_backward,    consumer.stage, consumer.microbatch, 0, -1,
                  collective_kind::none};
    return true;
  }
  return false;
}

//! The op on the other rank that a SEND or RECV pairs with.
inline action partner_of(action const& a) {
  switch (a.kind) {
    case op::send_forward:
      return {op::recv_forward, a.stage + 1, a.microbatch, 0, -1, collective_kind::none};
    case op::recv_forward:
      return {op::send_forward, a.stage - 1, a.microbatch, 0, -1, collective_kind::none};
    case op::send_backward:
      return {op::recv_backward, a.stage - 1, a.microbatch, 0, -1, collective_kind::none};
    case op::recv_backward:
      return {op::send_backward, a.stage + 1, a.microbatch, 0, -1, collective_kind::none};
    default: return a;
  }
}

inline validation_result fail(int rank, int index, char const* rule, std::string message) {
  validation_result r;
  r.ok = false;
  r.issue = {rank, index, rule, std::move(message)};
  return r;
}

inline std::string at(schedule const& s, int rank, int index) {
  if (index < 0) return ::weft::detail::concat("rank ", rank);
  return ::weft::detail::concat("rank ", rank, " action #", index, " (",
                                to_string(s.actions(rank)[static_cast<std::size_t>(index)]), ")");
}

//! Rendezvous replay. Each rank runs its program in order; a compute op waits for its needs
//! (local producers, received data, completed collectives); a SEND and its RECV complete together
//! once both ranks have reached them; a collective completes once every rank has reached it (and
//! its local preconditions hold). Nothing is buffered, so a schedule that finishes here finishes
//! under any more forgiving transport. In compute-only schedules cross-rank data needs no RECV.
//! Returns ranks' positions when stuck (all equal to program sizes on success).
//! With `model` buffered or overlapped, as replay_model describes.
inline std::vector<std::size_t> replay(schedule const& s, action_index const& index,
                                       replay_model model = {}) {
  int const p = s.num_ranks();
  bool const lowered = s.has_p2p();
  std::vector<std::size_t> pos(static_cast<std::size_t>(p), 0);
  std::vector<std::vector<char>> done(static_cast<std::size_t>(p));
  for (int r = 0; r < p; ++r) done[static_cast<std::size_t>(r)].assign(s.actions(r).size(), 0);
  auto is_done = [&](int rank, int i) {
    return rank >= 0 && i >= 0 &&
           done[static_cast<std::size_t>(rank)][static_cast<std::size_t>(i)] != 0;
  };
  auto satisfied = [&](action const& a, int r) {
    for (auto const& n : needs_of(s, a, r)) {
      if (n.what == need::type::collective) {
        // Blocking, a collective ends on every rank at once; overlapped, once all posted it.
        if (!model.overlapped_collectives) {
          if (!is_done(r, index.collective_pos(r, n.tag, n.mb))) return false;
          continue;
        }
        for (int q = 0; q < p; ++q)
          if (!is_done(q, index.collective_pos(q, n.tag, n.mb))) return false;
        continue;
      }
      auto const l = index.resolve(n);
      if (l.count == 0) return false;
      if (l.rank == r || !lowered || !is_compute(a.kind)) {
        if (!is_done(l.rank, l.pos) || (l.rank != r && !is_compute(a.kind))) return false;
        continue;
      }
      action recv;
      if (!recv_for_need(a, n, recv)) return false;
      auto const rl = index.find(recv.kind, recv.stage, recv.microbatch);
      if (rl.count == 0 || rl.rank != r || !is_done(rl.rank, rl.pos)) return false;
    }
    return true;
  };
  auto current = [&](int r) -> action const* {
    auto const& prog = s.actions(r);
    return pos[static_cast<std::size_t>(r)] < prog.size() ? &prog[pos[static_cast<std::size_t>(r)]]
                                                          : nullptr;
  };
  auto advance = [&](int r) {
    done[static_cast<std::size_t>(r)][pos[static_cast<std::size_t>(r)]] = 1;
    ++pos[static_cast<std::size_t>(r)];
  };
  bool progress = true;
  while (progress) {
    progress = false;
    for (int r = 0; r < p; ++r) {
      while (auto const* a = current(r)) {
        if (is_compute(a->kind)) {
          if (!satisfied(*a, r)) break;
          advance(r);
          progress = true;
        } else if (is_p2p(a->kind) && model.buffered_p2p) {
          // A SEND leaves once its data exists; a RECV waits for the SEND.
          if (is_send(a->kind)) {
            if (!satisfied(*a, r)) break;
          } else {
            auto const want = partner_of(*a);
            auto const l = index.find(want.kind, want.stage, want.microbatch);
            if (l.count != 1 || l.rank != a->peer || !is_done(l.rank, l.pos)) break;
          }
          advance(r);
          progress = true;
        } else if (is_p2p(a->kind)) {
          if (is_send(a->kind) && !satisfied(*a, r)) break;
          int const q = a->peer;
          if (q < 0 || q >= p || q == r) break;
          auto const* b = current(q);
          auto const want = partner_of(*a);
          if (b == nullptr || b->kind != want.kind || b->stage != want.stage ||
              b->microbatch != want.microbatch || b->peer != r)
            break;
          if (is_send(b->kind) && !satisfied(*b, q)) break;
          advance(r);
          advance(q);
          progress = true;
        } else if (model.overlapped_collectives) {  // posted once its own inputs exist
          if (!satisfied(*a, r)) break;
          advance(r);
          progress = true;
        } else {  // collective: every rank must be at the same one, its preconditions met
          bool all = true;
          for (int q = 0; q < p && all; ++q) {
            auto const* b = current(q);
            all = b != nullptr && b->kind == op::collective && b->tag == a->tag &&
                  b->microbatch == a->microbatch && satisfied(*b, q);
          }
          if (!all) break;
          for (int q = 0; q < p; ++q) advance(q);
          progress = true;
        }
      }
    }
  }
  return pos;
}

}  // namespace detail

namespace detail {

//! Rule 1, mapping: indices in range, ops allowed, each on its owner rank, derived fields right;
//! and the schedule no larger in stages × microbatches than its actions (see `indexable`). What
//! simulate and lower need before they index anything by an action's fields.
inline validation_result check_mapping(schedule const& s) {
  int const p = s.num_ranks();
  int const S = s.num_stages();
  int const m = s.num_microbatches();
  bool const vocab = s.vocab() != vocab_variant::none;
  for (int r = 0; r < p; ++r) {
    auto const& prog = s.actions(r);
    for (int i = 0; i < static_cast<int>(prog.size()); ++i) {
      auto const& a = prog[static_cast<std::size_t>(i)];
      if (a.kind == op::collective) {
        bool const tag_ok =
            a.tag != collective_kind::none && vocab &&
            (a.tag != collective_kind::c1 || s.vocab() == vocab_variant::two_barrier);
        int const max_mb = a.tag == collective_kind::broadcast_output ? m : m - 1;
        if (!tag_ok || a.microbatch < 0 || a.microbatch > max_mb || a.stage != -1 || a.peer != -1 ||
            a.chunk != 0)
          return fail(r, i, "mapping",
                      at(s, r, i) + ": collective not part of a " +
                          std::string(to_string(s.vocab())) + " schedule with " +
                          std::to_string(m) + " microbatches");
        continue;
      }
      if (a.microbatch < 0 || a.microbatch >= m)
        return fail(r, i, "mapping",
                    at(s, r, i) + ": microbatch outside [0, " + std::to_string(m) + ")");
      if (is_vocab_compute(a.kind)) {
        if (!vocab || a.stage != r || a.chunk != 0 || a.peer != -1)
          return fail(r, i, "mapping",
                      at(s, r, i) +
                          ": vocabulary passes need a vocabulary-parallel "
                          "schedule and carry their own rank as stage");
        continue;
      }
      if (a.stage < 0 || a.stage >= S)
        return fail(r, i, "mapping",
                    at(s, r, i) + ": stage outside [0, " + std::to_string(S) + ")");
      if (s.stage_to_rank(a.stage) != r)
        return fail(r, i, "mapping",
                    at(s, r, i) + ": stage " + std::to_string(a.stage) + " belongs to rank " +
                        std::to_string(s.stage_to_rank(a.stage)));
      action want = a;
      s.resolve(want);
      if (!(want == a))
        return fail(r, i, "mapping",
                    at(s, r, i) + ": chunk or peer disagrees with the stage mapping");
      if (is_p2p(a.kind)) {
        bool const toward_next = a.kind == op::send_forward || a.kind == op::recv_backward;
        int const other = toward_next ? a.stage + 1 : a.stage - 1;
        if (other < 0 || other >= S)
          return fail(r, i, "pairing",
                      at(s, r, i) + ": no stage " + std::to_string(other) + " to exchange with");
        if (s.stage_to_rank(other) == r)
          return fail(r, i, "pairing",
                      at(s, r, i) + ": stages on one rank hand over locally, without send/recv");
      }
    }
  }
  if (!indexable(s))
    return fail(-1, -1, "completeness", "expected " + indexable_message(s) + ", actual more");
  return {};
}

//! Throws schedule_error, naming `who`, when `s` breaks the mapping rule (check_mapping).
inline void require_mapping(schedule const& s, char const* who) {
  auto const r = check_mapping(s);
  if (!r.ok)
    WEFT_THROW(schedule_error, who, ": invalid schedule: rank ", r.issue.rank, ", action ",
               r.issue.index < 0 ? std::string("(missing)") : std::to_string(r.issue.index),
               ", rule `", r.issue.rule, "`: ", r.issue.message);
}

}  // namespace detail

//! Checks every rule; returns the first violation found (static rules first, then the replay).
//! `model`: the execution the replay assumes (the default, rendezvous, is the strictest).
inline validation_result check(schedule const& s, replay_model model = {}) {
  using detail::at;
  using detail::fail;
  int const p = s.num_ranks();
  int const S = s.num_stages();
  int const m = s.num_microbatches();
  bool const vocab = s.vocab() != vocab_variant::none;
  bool const lowered = s.has_p2p();

  if (auto const mapping = detail::check_mapping(s); !mapping.ok) return mapping;
  detail::action_index const index(s);

  // 2. Completeness.
  for (int st = 0; st < S; ++st) {
    int const owner = s.stage_to_rank(st);
    for (int mb = 0; mb < m; ++mb) {
      auto const f = index.find(op::forward, st, mb);
      auto const b = index.find(op::backward, st, mb);
      auto const in = index.find(op::backward_input, st, mb);
      auto const w = index.find(op::backward_weight, st, mb);
      auto const name = ::weft::detail::concat("(stage ", st, ", microbatch ", mb, ")");
      if (f.count != 1)
        return fail(owner, -1, "completeness",
                    name + " has " + std::to_string(f.count) + " forwards, needs 1");
      bool const full = b.count == 1 && in.count == 0 && w.count == 0;
      bool const split = b.count == 0 && in.count == 1 && w.count == 1;
      if (!full && !split)
        return fail(owner, -1, "completeness",
                    name + " needs one B, or one I and one W; has B x" + std::to_string(b.count) +
                        ", I x" + std::to_string(in.count) + ", W x" + std::to_string(w.count));
    }
  }
  if (vocab)
    for (int r = 0; r < p; ++r)
      for (int mb = 0; mb < m; ++mb)
        for (op k :
             {op::vocab_forward, op::vocab_backward, op::input_forward, op::input_backward}) {
          auto const l = index.find(k, r, mb);
          if (l.count != 1)
            return fail(r, -1, "completeness",
                        ::weft::detail::concat("rank ", r, " has ", l.count, " x ", to_string(k),
                                               " of microbatch ", mb, ", needs 1"));
        }
  {
    auto const required = detail::required_collectives(s);
    for (int r = 0; r < p; ++r) {
      for (auto const& c : required) {
        int const n = index.collective_count(r, c.tag, c.microbatch);
        if (n != 1)
          return fail(r, n == 0 ? -1 : index.collective_pos(r, c.tag, c.microbatch), "completeness",
                      ::weft::detail::concat("rank ", r, " runs collective ", to_string(c), " ", n,
                                             " times, needs 1"));
      }
    }
  }
  // Point-to-point ops at most once each.
  for (int r = 0; r < p; ++r) {
    auto const& prog = s.actions(r);
    for (int i = 0; i < static_cast<int>(prog.size()); ++i) {
      auto const& a = prog[static_cast<std::size_t>(i)];
      if (is_p2p(a.kind) && index.find(a.kind, a.stage, a.microbatch).count != 1)
        return fail(r, i, "pairing", at(s, r, i) + ": appears more than once");
    }
  }

  // 3. FIFO: per rank, stage and compute op, microbatches strictly increase (executors keep
  //    FIFO stashes, as Megatron and zero-bubble runtimes do).
  for (int r = 0; r < p; ++r) {
    std::map<std::pair<int, int>, int> last;
    auto const& prog = s.actions(r);
    for (int i = 0; i < static_cast<int>(prog.size()); ++i) {
      auto const& a = prog[static_cast<std::size_t>(i)];
      if (!is_compute(a.kind)) continue;
      auto [it, fresh] = last.try_emplace({static_cast<int>(a.kind), a.stage}, a.microbatch);
      if (!fresh) {
        if (a.microbatch <= it->second)
          return fail(r, i, "fifo",
                      at(s, r, i) + ": microbatch " + std::to_string(a.microbatch) + " after " +
                          std::to_string(it->second) + " of the same op and stage");
        it->second = a.microbatch;
      }
    }
  }

  // 4. Dependencies in program order: local producers, collectives and (lowered) RECVs earlier.
  for (int r = 0; r < p; ++r) {
    auto const& prog = s.actions(r);
    for (int i = 0; i < static_cast<int>(prog.size()); ++i) {
      auto const& a = prog[static_cast<std::size_t>(i)];
      if (is_recv(a.kind)) continue;
      for (auto const& n : detail::needs_of(s, a, r)) {
        if (n.what == detail::need::type::collective) {
          int const c = index.collective_pos(r, n.tag, n.mb);
          if (c < 0 || c > i)
            return fail(r, i, "dependency",
                        at(s, r, i) + " needs collective " +
                            to_string(schedule::make_collective(n.tag, n.mb)) +
                            " completed before it on rank " + std::to_string(r));
          continue;
        }
        auto const l = index.resolve(n);
        if (l.count == 0) continue;  // completeness already holds, so only optional producers
        if (l.rank == r) {
          if (l.pos > i)
            return fail(r, i, "dependency",
                        at(s, r, i) + " runs before its producer " + at(s, l.rank, l.pos));
          continue;
        }
        if (!is_compute(a.kind))
          return fail(r, i, "dependency",
                      at(s, r, i) + " needs " + at(s, l.rank, l.pos) + " on another rank");
        if (!lowered) continue;
        action recv;
        if (!detail::recv_for_need(a, n, recv)) continue;
        auto const rl = index.find(recv.kind, recv.stage, recv.microbatch);
        if (rl.count == 0 || rl.rank != r || rl.pos > i)
          return fail(r, i, "dependency",
                      at(s, r, i) + " needs " + to_string(recv) + " before it on rank " +
                          std::to_string(r));
      }
    }
  }

  // 5. Pairing and pairwise order of point-to-point ops.
  if (lowered) {
    std::map<std::pair<int, int>, std::vector<std::tuple<int, int, int>>>
        seq;  // (from,to) -> (stage,mb,dir)
    for (int r = 0; r < p; ++r) {
      auto const& prog = s.actions(r);
      for (int i = 0; i < static_cast<int>(prog.size()); ++i) {
        auto const& a = prog[static_cast<std::size_t>(i)];
        if (!is_p2p(a.kind)) continue;
        auto const want = detail::partner_of(a);
        auto const l = index.find(want.kind, want.stage, want.microbatch);
        if (l.count != 1 || l.rank != a.peer)
          return fail(r, i, "pairing",
                      at(s, r, i) + " has no matching " + to_string(want) + " on rank " +
                          std::to_string(a.peer));
        // Record the message (identified by its sending stage) in the order this rank sees it;
        // buffered, each direction on its own.
        int const send_stage = is_send(a.kind) ? a.stage : want.stage;
        int const dir = (a.kind == op::send_forward || a.kind == op::recv_forward) ? 0 : 1;
        auto const key = !model.buffered_p2p ? std::pair{r, a.peer}
                         : is_send(a.kind)   ? std::pair{r, a.peer + p}
                                             : std::pair{r + p, a.peer};
        seq[key].emplace_back(send_stage, a.microbatch, dir);
      }
    }
    for (auto const& [pair, mine] : seq) {
      auto const it = seq.find({pair.second, pair.first});
      if (it == seq.end() || it->second != mine) {
        if (!model.buffered_p2p)
          return fail(pair.first, -1, "p2p-order",
                      ::weft::detail::concat(
                          "ranks ", pair.first, " and ", pair.second,
                          " post their sends and recvs to each other in different orders"));
        // (from, to + p) holds from's sends to `to`, (from + p, to) to's receives from `from`.
        int const from = pair.first % p, to = pair.second % p;
        return fail(from, -1, "p2p-order",
                    ::weft::detail::concat("rank ", from, " sends its messages to rank ", to,
                                           " in another order than rank ", to, " receives them"));
      }
    }
  }

  // 6. One collective order.
  {
    std::vector<action> ref;
    for (auto const& a : s.actions(0))
      if (a.kind == op::collective) ref.push_back(a);
    for (int r = 1; r < p; ++r) {
      std::size_t k = 0;
      auto const& prog = s.actions(r);
      for (int i = 0; i < static_cast<int>(prog.size()); ++i) {
        auto const& a = prog[static_cast<std::size_t>(i)];
        if (a.kind != op::collective) continue;
        if (k >= ref.size() || !(ref[k] == a))
          return fail(r, i, "collective-order",
                      at(s, r, i) + " is collective #" + std::to_string(k) +
                          " here but rank 0's #" + std::to_string(k) + " is " +
                          (k < ref.size() ? to_string(ref[k]) : std::string("none")));
        ++k;
      }
    }
  }

  // 7. Rendezvous replay (or the replay of `model`).
  auto const pos = detail::replay(s, index, model);
  for (int r = 0; r < p; ++r) {
    auto const i = pos[static_cast<std::size_t>(r)];
    if (i < s.actions(r).size()) {
      std::string stuck;
      for (int q = 0; q < p; ++q) {
        auto const j = pos[static_cast<std::size_t>(q)];
        if (j < s.actions(q).size()) stuck += " " + at(s, q, static_cast<int>(j)) + ";";
      }
      return fail(r, static_cast<int>(i), "deadlock",
                  "the rendezvous replay cannot progress; waiting:" + stuck);
    }
  }
  return {};
}

//! Throws schedule_error naming the rank, the action index and the rule when `s` breaks one
//! (under `model`: see check).
inline void validate(schedule const& s, replay_model model = {}) {
  auto const r = check(s, model);
  if (!r.ok)
    WEFT_THROW(schedule_error, "invalid schedule: rank ", r.issue.rank, ", action ",
               r.issue.index < 0 ? std::string("(missing)") : std::to_string(r.issue.index),
               ", rule `", r.issue.rule, "`: ", r.issue.message);
}

}  // namespace weft::pipeline
