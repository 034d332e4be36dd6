// weft/pipeline/detail/deps.hpp — the dependency model shared by the validator, the simulator,
// the lowering pass and the vocabulary planner: what each action needs before it can run, and an
// index from (op, stage, microbatch) and (collective, microbatch) to where a schedule holds it.
#pragma once

#include <weft/core/error.hpp>
#include <weft/pipeline/action.hpp>
#include <weft/pipeline/schedule.hpp>

#include <array>
#include <cstddef>
#include <string>
#include <vector>

namespace weft::pipeline::detail {

//! One precondition of an action.
//!  - `action`: compute action (kind, stage, mb) has finished (on its own rank);
//!  - `grad`: the input-gradient producer of (stage, mb) has finished: I if the schedule splits
//!    that backward, else B;
//!  - `collective`: collective (tag, mb) has completed on all ranks.
struct need {
  enum class type : std::uint8_t { action, grad, collective };
  type what = type::action;
  op kind = op::forward;
  int stage = -1;
  int mb = -1;
  collective_kind tag = collective_kind::none;
};

struct needs_list {
  std::array<need, 4> items{};
  int size = 0;
  void push(need n) noexcept { items[static_cast<std::size_t>(size++)] = n; }
  [[nodiscard]] need const* begin() const noexcept { return items.data(); }
  [[nodiscard]] need const* end() const noexcept { return items.data() + size; }
};

inline need need_action(op k, int stage, int mb) {
  return {need::type::action, k, stage, mb, collective_kind::none};
}
inline need need_grad(int stage, int mb) {
  return {need::type::grad, op::backward, stage, mb, collective_kind::none};
}
inline need need_collective(collective_kind t, int mb) {
  return {need::type::collective, op::collective, -1, mb, t};
}

//! Data needs of a compute action or a SEND (what must exist before it runs), in the
//! compute-only view: producers are named, not the RECVs that bring them.
//! `rank` is the rank that runs `a` (used for the collectives' roots).
inline needs_list needs_of(schedule const& s, action const& a, int rank) {
  needs_list out;
  int const last = s.num_stages() - 1;
  int const m = s.num_microbatches();
  auto const vocab = s.vocab();
  switch (a.kind) {
    case op::forward:
      if (a.stage > 0)
        out.push(need_action(op::forward, a.stage - 1, a.microbatch));
      else if (vocab != vocab_variant::none)
        out.push(need_collective(collective_kind::reduce_input, a.microbatch));
      break;
    case op::backward:
    case op::backward_input:
      out.push(need_action(op::forward, a.stage, a.microbatch));
      if (a.stage < last)
        out.push(need_grad(a.stage + 1, a.microbatch));
      else if (vocab == vocab_variant::one_barrier)
        out.push(need_collective(collective_kind::c0, a.microbatch));
      else if (vocab == vocab_variant::two_barrier)
        out.push(need_collective(collective_kind::c1, a.microbatch));
      break;
    case op::backward_weight:
      out.push(need_action(op::backward_input, a.stage, a.microbatch));
      break;
    case op::vocab_forward:
      out.push(need_collective(collective_kind::broadcast_output, a.microbatch));
      break;
    case op::vocab_backward:
      out.push(need_action(op::vocab_forward, a.stage, a.microbatch));
      out.push(need_collective(collective_kind::c0, a.microbatch));
      // g_i travels with X_{i+1} (or alone in BX:m).
      out.push(need_collective(collective_kind::broadcast_output, a.microbatch + 1));
      break;
    case op::input_forward: break;
    case op::input_backward:
      out.push(need_action(op::input_forward, a.stage, a.microbatch));
      out.push(need_collective(collective_kind::broadcast_input, a.microbatch));
      break;
    case op::send_forward: out.push(need_action(op::forward, a.stage, a.microbatch)); break;
    case op::send_backward: out.push(need_grad(a.stage, a.microbatch)); break;
    case op::recv_forward:
    case op::recv_backward: break;
    case op::collective:
      switch (a.tag) {
        case collective_kind::broadcast_output:
          if (rank == s.stage_to_rank(last)) {
            if (a.microbatch < m) out.push(need_action(op::forward, last, a.microbatch));
            // g_{i-1} exists once C0(i-1) has completed (the loss needs the global softmax sum).
            if (a.microbatch > 0) out.push(need_collective(collective_kind::c0, a.microbatch - 1));
          }
          break;
        case collective_kind::c0:
          out.push(need_action(op::vocab_forward, rank, a.microbatch));
          break;
        case collective_kind::c1:
          out.push(need_action(op::vocab_backward, rank, a.microbatch));
          break;
        case collective_kind::reduce_input:
          out.push(need_action(op::input_forward, rank, a.microbatch));
          break;
        case collective_kind::broadcast_input:
          if (rank == s.stage_to_rank(0)) out.push(need_grad(0, a.microbatch));
          break;
        case collective_kind::none: break;
      }
      break;
  }
  return out;
}

//! The collectives a schedule with this vocabulary variant must contain, once each on every rank.
inline std::vector<action> required_collectives(schedule const& s) {
  std::vector<action> out;
  if (s.vocab() == vocab_variant::none) return out;
  int const m = s.num_microbatches();
  for (int i = 0; i <= m; ++i)
    out.push_back(schedule::make_collective(collective_kind::broadcast_output, i));
  for (int i = 0; i < m; ++i) {
    out.push_back(schedule::make_collective(collective_kind::c0, i));
    if (s.vocab() == vocab_variant::two_barrier)
      out.push_back(schedule::make_collective(collective_kind::c1, i));
    out.push_back(schedule::make_collective(collective_kind::reduce_input, i));
    out.push_back(schedule::make_collective(collective_kind::broadcast_input, i));
  }
  return out;
}

//! Where a schedule holds each action. Compute and point-to-point ops are keyed by
//! (op, stage, microbatch) with one location each (the first occurrence; `count` says how many);
//! collectives by (tag, microbatch) per rank.
//! validate, simulate and lower index (op, stage, microbatch) densely. Every valid schedule holds
//! a forward for each (stage, microbatch), so it has at least stages × microbatches actions; a
//! header that asks for more (a parsed file's `stages=10^9`) describes no valid schedule and is
//! rejected before anything is sized by it, which bounds the index by the schedule's own size.
[[nodiscard]] inline bool indexable(schedule const& s) noexcept {
  return static_cast<unsigned long long>(s.num_stages()) *
             static_cast<unsigned long long>(s.num_microbatches()) <=
         static_cast<unsigned long long>(s.total_actions());
}
inline std::string indexable_message(schedule const& s) {
  return ::weft::detail::concat("stages x microbatches = ", s.num_stages(), " x ",
                                s.num_microbatches(), " (one forward each) at most the schedule's ",
                                s.total_actions(), " actions");
}
inline void require_indexable(schedule const& s) {
  if (!indexable(s))
    WEFT_THROW(schedule_error, "argument `s`: expected ", indexable_message(s),
               ", actual more (rule `completeness`)");
}

class action_index {
 public:
  struct loc {
    int rank = -1;
    int pos = -1;
    int count = 0;
  };

  explicit action_index(schedule const& s)
      : stages_(s.num_stages()), ranks_(s.num_ranks()), mbs_(s.num_microbatches()) {
    require_indexable(s);
    width_ = stages_ > ranks_ ? stages_ : ranks_;
    ops_.resize(static_cast<std::size_t>(kOps) * static_cast<std::size_t>(width_) *
                static_cast<std::size_t>(mbs_));
    colls_.assign(static_cast<std::size_t>(ranks_) * kTags * static_cast<std::size_t>(mbs_ + 1),
                  -1);
    coll_count_.assign(colls_.size(), 0);
    for (int r = 0; r < ranks_; ++r) {
      auto const& prog = s.actions(r);
      for (int i = 0; i < static_cast<int>(prog.size()); ++i) {
        auto const& a = prog[static_cast<std::size_t>(i)];
        if (a.kind == op::collective) {
          auto const slot = coll_slot(r, a.tag, a.microbatch);
          if (slot < 0) continue;
          auto& c = coll_count_[static_cast<std::size_t>(slot)];
          if (c++ == 0) colls_[static_cast<std::size_t>(slot)] = i;
          continue;
        }
        auto const slot = op_slot(a.kind, a.stage, a.microbatch);
        if (slot < 0) continue;
        auto& l = ops_[static_cast<std::size_t>(slot)];
        if (l.count++ == 0) {
          l.rank = r;
          l.pos = i;
        }
      }
    }
  }

  [[nodiscard]] loc find(op kind, int stage, int mb) const noexcept {
    auto const slot = op_slot(kind, stage, mb);
    return slot < 0 ? loc{} : ops_[static_cast<std::size_t>(slot)];
  }
  //! The input-gradient producer of (stage, mb): I when the schedule has one, else B.
  [[nodiscard]] loc grad(int stage, int mb) const noexcept {
    auto const i = find(op::backward_input, stage, mb);
    return i.count > 0 ? i : find(op::backward, stage, mb);
  }
  [[nodiscard]] op grad_op(int stage, int mb) const noexcept {
    return find(op::backward_input, stage, mb).count > 0 ? op::backward_input : op::backward;
  }
  [[nodiscard]] loc resolve(need const& n) const noexcept {
    return n.what == need::type::grad ? grad(n.stage, n.mb) : find(n.kind, n.stage, n.mb);
  }
  //! Position of collective (tag, mb) in rank's program, -1 if absent.
  [[nodiscard]] int collective_pos(int rank, collective_kind tag, int mb) const noexcept {
    auto const slot = coll_slot(rank, tag, mb);
    return slot < 0 ? -1 : colls_[static_cast<std::size_t>(slot)];
  }
  [[nodiscard]] int collective_count(int rank, collective_kind tag, int mb) const noexcept {
    auto const slot = coll_slot(rank, tag, mb);
    return slot < 0 ? 0 : coll_count_[static_cast<std::size_t>(slot)];
  }

 private:
  static constexpr int kOps = 13;
  static constexpr int kTags = 6;

  [[nodiscard]] int op_slot(op kind, int stage, int mb) const noexcept {
    if (kind == op::collective || stage < 0 || stage >= width_ || mb < 0 || mb >= mbs_) return -1;
    return (static_cast<int>(kind) * width_ + stage) * mbs_ + mb;
  }
  [[nodiscard]] int coll_slot(int rank, collective_kind tag, int mb) const noexcept {
    if (rank < 0 || rank >= ranks_ || mb < 0 || mb > mbs_ || tag == collective_kind::none)
      return -1;
    return (rank * kTags + static_cast<int>(tag)) * (mbs_ + 1) + mb;
  }

  int stages_, ranks_, mbs_, width_ = 0;
  std::vector<loc> ops_;
  std::vector<int> colls_;
  std::vector<int> coll_count_;
};

//! The rank that owns an action's data: the stage's rank, the rank itself for vocabulary passes.
inline int owner_rank(schedule const& s, op kind, int stage) noexcept {
  return is_vocab_compute(kind) ? stage : s.stage_to_rank(stage);
}

}  // namespace weft::pipeline::detail
