// weft/pipeline/stage.hpp — what a user implements per pipeline rank for the executor: the `Stage`
// concept (forward, backward-input and backward-weight per (chunk, microbatch), with activation
// stash slots the executor assigns), the `stage_call` that says what one call is about, and the
// `message_layout` of what a stage sends and receives.
#pragma once

#include <weft/comm/concepts.hpp>  // buffer_view
#include <weft/core/dtype.hpp>

#include <concepts>
#include <cstddef>

namespace weft::pipeline {

//! What one stage call is about; the executor builds it from the lowered action.
struct stage_call {
  int stage = 0;             //!< global (virtual) stage, in [0, num_stages)
  int chunk = 0;             //!< model chunk on this rank: stage / ranks
  int microbatch = 0;        //!< in [0, num_microbatches)
  int num_microbatches = 1;  //!< m of the schedule
  int num_stages = 1;        //!< stages of the schedule (ranks x chunks)
  int slot = -1;             //!< stash slot in [0, slots(chunk)); -1 in layout queries
  //! Last stage only: multiplies the microbatch's summed token loss and seeds its backward
  //! (section 2.2 of the reference note). 0 elsewhere.
  double loss_weight = 0.0;
  //! On B or W: this is the chunk's last gradient-accumulating action of the step, so its
  //! parameter gradients are complete once the call returns (a data-parallel bucket may start).
  bool grads_final = false;

  [[nodiscard]] constexpr bool first_stage() const noexcept { return stage == 0; }
  [[nodiscard]] constexpr bool last_stage() const noexcept { return stage == num_stages - 1; }
};

//! The element count and type of one message (a forward activation or an input gradient).
struct message_layout {
  std::size_t count = 0;
  dtype type = dtype::f32;

  friend constexpr bool operator==(message_layout const&, message_layout const&) = default;
};

//! Opt-in tag: a stage says `using stage_concept = weft::pipeline::stage_tag;`.
struct stage_tag {};

// clang-format off
//! Stage: one rank's share of the model (all its chunks; dispatch on `call.chunk` or
//! `call.stage`) as the pipeline executor drives it. Every buffer is host memory, owned by the
//! executor, and has exactly the declared layout.
//! Semantics:
//! - Layouts. `input_layout(c)` is the layout of the activation stage c.stage receives (and of the
//!   input gradient it sends back); `output_layout(c)` of the activation it sends (and of the
//!   output gradient it receives). Both are pure functions of (stage, microbatch), evaluated by
//!   every rank that touches the message, and agree across the two sides of a stage boundary:
//!   `output_layout` of stage s equals `input_layout` of stage s + 1. Stage 0's input and the last
//!   stage's output have count 0 (n x h under vocabulary parallelism: see VocabShard).
//! - Slots. Before a step, `reserve_slots(chunk, n)` tells the stage that calls for that chunk
//!   use stash slots in [0, n) (n is the peak number of microbatches in flight on the chunk in
//!   this schedule); allocate there, not in the calls. A slot is taken by forward and stays the
//!   microbatch's until its last backward action returns (B, or W when the backward is split).
//! - `forward(c, in, out)`: `in` holds the previous stage's activation; on stage 0 it is empty
//!   (the stage reads its own microbatch data), or the summed embedding under vocabulary
//!   parallelism. It stays valid and unchanged until the last backward action of (c.stage,
//!   c.microbatch) returns. Writes `out` (empty on the last stage, the output layer's input under
//!   vocabulary parallelism) and stashes in slot c.slot what backward needs. Returns the weighted
//!   loss `c.loss_weight * sum of token losses` on the last stage and 0 elsewhere (under
//!   vocabulary parallelism the executor computes the loss, and the return value is ignored).
//! - `backward_input(c, dout, din)`: `dout` is the gradient of the stage's output (empty on the
//!   last stage, which seeds its backward with `c.loss_weight`; the output layer's input gradient
//!   under vocabulary parallelism); writes `din`, the gradient of `in` (empty on stage 0 unless
//!   vocabulary-parallel). Keeps what backward_weight needs in the slot.
//! - `backward_weight(c)`: adds this microbatch's parameter gradients to the stage's gradients.
//!   The executor calls it, per chunk, in increasing microbatch order (it refuses schedules that
//!   do otherwise), so accumulating in place equals sequential gradient accumulation bit for bit.
//!   The executor never touches gradient storage: zeroing between steps is the caller's.
//! - A fused `backward(c, dout, din)` is optional (`FusedBackwardStage`); without it a B action
//!   runs backward_input then backward_weight.
//! - Any exception from a call aborts the step on every rank (see executor.hpp).
template <class S>
concept Stage =
    std::derived_from<typename S::stage_concept, stage_tag> &&
    requires(S& s, S const& cs, stage_call const& c, comm::buffer_view in, comm::buffer_view out,
             int chunk, int slots) {
      { cs.input_layout(c) } -> std::same_as<message_layout>;
      { cs.output_layout(c) } -> std::same_as<message_layout>;
      s.reserve_slots(chunk, slots);
      { s.forward(c, in, out) } -> std::same_as<double>;
      s.backward_input(c, out, in);
      s.backward_weight(c);
    };

//! FusedBackwardStage: a Stage that also runs B (= I + W) in one call, with the same results.
template <class S>
concept FusedBackwardStage =
    Stage<S> && requires(S& s, stage_call const& c, comm::buffer_view dout, comm::buffer_view din) {
      s.backward(c, dout, din);
    };
//! Opt-in tag: a vocabulary shard says `using vocab_concept = weft::pipeline::vocab_tag;`.
struct vocab_tag {};

//! VocabShard: this rank's shard of the input embedding and of the output layer (vocabulary
//! parallelism, reference note section 2.5), for the vocabulary-balanced schedules. Every rank
//! holds V/p vocabulary rows of both; every buffer is host memory of one floating type, f32 or f64:
//! the type of stage 0's input layout (the stages' boundary type). `c.stage` is the rank.
//! Semantics:
//! - `tokens(c)`: n, the tokens of microbatch c.microbatch; `hidden()`: h. Pure, equal on every
//!   rank. The first pipeline stage's input and the last stage's output are then n x h
//!   (their input_layout / output_layout must say so).
//! - `input_forward(c, partial)` (IF): writes the n x h embedding rows of the tokens whose ids
//!   this shard owns, zeros elsewhere; the executor sums the partials over ranks (RE) and hands
//!   the sum to stage 0's forward.
//! - `input_backward(c, grad)` (IB): `grad` is the n x h gradient of the embedding output (stage
//!   0's input gradient, broadcast by BE); adds it into the owned rows of the ids.
//! - `output_forward(c, x, stats)` (S): `x` is the n x h input of the output layer (the last
//!   stage's output, broadcast by BX). With Y = x W_shard^T (n x V/p) and per token t: writes
//!   stats = [max_t | sumexp_t | target_t | G | H]: max_t = max_v Y_tv, sumexp_t =
//!   sum_v exp(Y_tv - max_t), target_t = Y_t,target on the shard that owns the target and 0
//!   elsewhere, and, for the one-barrier schedule only (stats.count == 3n + 2nh), G_t = sum_v
//!   exp(Y_tv - max_t) W_v and H_t = W_target (0 where not owned). The two-barrier schedule's
//!   stats have 3n elements.
//! - `output_backward(c, x, g, max, sumexp, dx)` (T): `max` and `sumexp` are the global values
//!   (sumexp relative to the global max) and `g` the per-token weight of the loss gradient; adds
//!   sum_t g_t (softmax_tv - onehot_tv) x_t to the gradient of W_v for the owned v, and for the
//!   two-barrier schedule writes dx_t = g_t sum_v (softmax_tv - onehot_tv) W_v for its v (the
//!   executor sums dx over ranks in C1); dx is empty for the one-barrier schedule. Calls come in
//!   increasing microbatch order.
template <class V>
concept VocabShard =
    std::derived_from<typename V::vocab_concept, vocab_tag> &&
    requires(V& v, V const& cv, stage_call const& c, comm::buffer_view a, comm::buffer_view b,
             comm::buffer_view d, comm::buffer_view e, comm::buffer_view f) {
      { cv.tokens(c) } -> std::same_as<std::size_t>;
      { cv.hidden() } -> std::same_as<std::size_t>;
      v.input_forward(c, a);
      v.input_backward(c, a);
      v.output_forward(c, a, b);
      v.output_backward(c, a, b, d, e, f);
    };
// clang-format on

}  // namespace weft::pipeline
