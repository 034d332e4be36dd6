// weft/pipeline/executor.hpp — runs one rank's program of a lowered schedule with the user's
// `Stage` (and, for the vocabulary-balanced schedules, its `VocabShard` over a second, collective
// channel) over a point-to-point communicator: receives posted early, sends waited late, loss
// weights fixed before backward, a measured timeline per rank, and faults turned into exceptions
// on every rank. It interprets the program and adds no scheduling of its own.
#pragma once

#include <weft/comm/concepts.hpp>
#include <weft/core/memory.hpp>
#include <weft/pipeline/detail/executor.hpp>
#include <weft/pipeline/schedule.hpp>
#include <weft/pipeline/stage.hpp>
#include <weft/pipeline/step.hpp>

#include <algorithm>
#include <cstring>
#include <exception>
#include <functional>
#include <string>
#include <vector>

namespace weft::pipeline {

// clang-format off
//! PipelineCommunicator: what the executor needs from the pipeline channel: point-to-point over
//! host memory, and `abort()` so that a failure on one rank wakes every peer (threads, MPI and
//! weft's Communicator models all qualify). Where the model also has `abort(std::string)` (threads),
//! the executor passes the failure's description, which peers' peer_aborted_error then quotes.
template <class C>
concept PipelineCommunicator = comm::PointToPointIn<C, host_space> && requires(C& c) {
  c.abort();
};
// clang-format on

//! Builds rank `rank`'s plan for the lowered schedule `lowered` and calls
//! `stage.reserve_slots(chunk, n)` for each of its chunks. Local: no communication.
//! Throws schedule_error when `lowered` is not lowered (ranks > 1 without SEND/RECV), has
//! vocabulary passes (use the overload with a VocabShard), puts a compute action on the wrong
//! rank, runs a backward before its forward, leaves a forward without backward, or runs a
//! chunk's gradient-accumulating actions (B, or W when split) out of microbatch order;
//! shape_error when two layouts of one message disagree; invalid_argument_error for a bad rank.
template <Stage S>
step_plan prepare_step(schedule const& lowered, int rank, S& stage) {
  return detail::prepare(lowered, rank, stage, static_cast<detail::no_vocab*>(nullptr));
}

//! As above for a vocabulary-balanced schedule (vocab_one_f_one_b): `shard` runs the S, T, IF and
//! IB passes; stage 0's input and the last stage's output must be n x h, f32 or f64 (VocabShard).
template <Stage S, VocabShard V>
step_plan prepare_step(schedule const& lowered, int rank, S& stage, V& shard) {
  return detail::prepare(lowered, rank, stage, &shard);
}

//! Runs one training step of `plan` on this rank: every RECV's irecv is posted at the start (each
//! message has its own buffer), each action runs in program order (a RECV waits for its message,
//! a SEND posts an isend), and the sends are waited after the last action. The last stage gets
//! each microbatch's loss weight (loss_weights) in its forward; its losses are summed in
//! microbatch order.
//!
//! Faults: argument errors (communicator size or rank, step_options) throw before anything is
//! communicated. Any exception during the step, from a stage call or from the communicator,
//! aborts `channel` with a description naming this rank, the action index and text, the stage and
//! the microbatch (peers' waits then throw peer_aborted_error, which on threads quotes it), and
//! is rethrown: a stage's exception as weft::error (errc::internal) with that description and the
//! original nested (std::throw_with_nested); a communicator's as itself. Nothing waits beyond the
//! communicator's deadline.
template <Stage S, PipelineCommunicator C>
step_result run_step(step_plan& plan, S& stage, C& channel, step_options const& opt = {}) {
  return detail::run(plan, stage, static_cast<detail::no_vocab*>(nullptr), channel,
                     static_cast<C*>(nullptr), opt);
}

//! prepare_step and run_step in one call, for a single step. A failure in prepare_step (a schedule
//! or layout error) also aborts `channel`, so peers do not wait for this rank.
template <Stage S, PipelineCommunicator C>
step_result run_step(schedule const& lowered, S& stage, C& channel, step_options const& opt = {}) {
  step_plan plan;
  try {
    plan = prepare_step(lowered, channel.rank(), stage);
  } catch (std::exception const& e) {
    detail::abort_channel(channel, ::weft::detail::concat("pipeline rank ", channel.rank(),
                                                          ", preparing the step: ", e.what()));
    throw;
  }
  return run_step(plan, stage, channel, opt);
}

//! A step of a vocabulary-balanced schedule: as run_step, with the vocabulary passes run by
//! `shard` and their collectives (RE, BX, C0, C1, BE, in program order) on `vocab_channel`, a
//! communicator of its own over the same ranks (split it from the pipeline's up front) so that
//! they never interleave with the pipeline's messages. By default the collectives run on a
//! progress thread of the rank, overlapped with its compute, and an action waits only for the
//! collectives it reads (step_options::vocab_overlap; `vocab_channel` is then used by that thread
//! alone during the step, and the shard and the token loss are still called on the rank's
//! thread). The loss (on the last
//! stage's rank) is sum_i w_i sum_t (log s_t - z_t) from C0; the per-token loss-gradient weight is
//! w_i. Without step_options::tokens the shard's tokens(c) weight the loss. A failure aborts both
//! channels.
template <Stage S, VocabShard V, PipelineCommunicator C, class VC>
requires comm::CollectiveIn<VC, host_space> step_result run_step(step_plan& plan, S& stage,
                                                                 V& shard, C& channel,
                                                                 VC& vocab_channel,
                                                                 step_options const& opt = {}) {
  return detail::run(plan, stage, &shard, channel, &vocab_channel, opt);
}

//! A step_options::report_failure over `reports`, a collective communicator of its own over the
//! pipeline's ranks (split or dup it up front; it must outlive the steps): the failing ranks
//! all-gather their descriptions (the first 511 bytes of each) within `reports`'s deadline, and
//! each rank's exception quotes the others'. Meant for MPI, where a rank's abort() cannot wake its
//! peers: they time out on the message that never comes, join the exchange, and every rank then
//! names the rank, action and microbatch that failed first. On threads abort() already wakes the
//! peers with the description (peer_aborted_error), so it is not needed there. A rank whose step
//! finished without error does not join: the others then wait for `reports`'s deadline and say
//! that the reports did not arrive.
template <class RC>
requires comm::CollectiveIn<RC, host_space> std::function<std::string(std::string const&)>
exchange_failures(RC& reports) {
  return [&reports](std::string const& mine) -> std::string {
    constexpr std::size_t width = 512;
    auto const n = static_cast<std::size_t>(reports.size());
    std::vector<unsigned char> in(width, 0), all(width * n, 0);
    std::memcpy(in.data(), mine.data(), std::min(mine.size(), width - 1));
    try {
      reports
          .all_gather(comm::buffer_view{in.data(), width, dtype::u8},
                      comm::buffer_view{all.data(), width * n, dtype::u8})
          .wait();
    } catch (std::exception const& e) {
      return ::weft::detail::concat("; the other ranks' failure reports did not arrive: ",
                                    e.what());
    }
    std::string out;
    for (std::size_t r = 0; r < n; ++r) {
      if (static_cast<int>(r) == reports.rank()) continue;
      auto const* text = reinterpret_cast<char const*>(all.data() + r * width);
      out += ::weft::detail::concat("; rank ", r,
                                    " reported: ", std::string(text, strnlen(text, width)));
    }
    return out;
  };
}

}  // namespace weft::pipeline
