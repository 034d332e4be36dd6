// weft/pipeline/step.hpp — what the pipeline executor (executor.hpp) works with and returns:
// step_options and the loss weights fixed before backward, the per-rank step_plan that
// prepare_step builds once and run_step reuses, and the measured timeline of a step.
#pragma once

#include <weft/comm/concepts.hpp>
#include <weft/comm/work.hpp>
#include <weft/core/dtype.hpp>
#include <weft/core/error.hpp>
#include <weft/core/memory.hpp>
#include <weft/pipeline/action.hpp>
#include <weft/pipeline/schedule.hpp>
#include <weft/pipeline/stage.hpp>

#include <algorithm>
#include <array>
#include <chrono>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <exception>
#include <functional>
#include <span>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

namespace weft::pipeline {

//! How the executor weights each microbatch's summed token loss (reference note, section 2.2).
//! `token_mean`: w = 1/N with N the global token count (all microbatches, all data-parallel
//! replicas), so the step loss is the single-device token mean. `microbatch_mean`: w_i =
//! 1/(D m n_i), the mean of per-microbatch means (Megatron's 2-tuple path); it equals the token
//! mean only when all n_i are equal. Gradients are never rescaled afterwards.
enum class loss_weighting : std::uint8_t { token_mean, microbatch_mean };

struct step_options {
  loss_weighting weighting = loss_weighting::token_mean;
  //! Valid tokens per microbatch (the plan every rank shares); empty means one per microbatch.
  std::vector<std::size_t> tokens;
  //! N of `token_mean` when data-parallel replicas share the mean (their all-reduced token
  //! count, taken before the step); 0 means the sum of `tokens`.
  double total_tokens = 0.0;
  //! D of `microbatch_mean`.
  int data_parallel_size = 1;
  //! Passed to every isend/irecv (a zero timeout means the communicator's deadline).
  comm::op_options p2p{};
  //! For channels whose abort() cannot wake the peers (MPI has no revoke: they time out in turn),
  //! so that every rank learns what failed first: called once on a failing rank, after it
  //! aborted its channels, with its failure's description; it returns what the other ranks
  //! reported, which the rethrown exception appends. The exception is then a weft::error with
  //! the original's errc (internal for a stage's) and the original nested. exchange_failures
  //! (executor.hpp) builds one over a collective communicator of its own. Empty: not used.
  std::function<std::string(std::string const&)> report_failure;
  //! The loss of a vocabulary-balanced schedule's microbatch (run_step with a VocabShard) as a
  //! function of its tokens' target log-probabilities, for losses other than the cross-entropy
  //! (a policy-gradient loss, say): token_loss(i, logp, dlogp) gets microbatch i's log p(target)
  //! of its n = tokens(c) tokens, in the order of the shard's tokens, computed from C0's combined
  //! max, sum and target logit; it writes dlogp = d loss / d logp (zero-filled before the call)
  //! and returns the microbatch's loss (step_result's microbatch_losses). The loss weight is not
  //! applied: the function weighs its tokens itself. The output layer's gradient then follows
  //! from g_t = -dlogp_t, as the cross-entropy's from g_t = loss weight. Called on the rank that
  //! holds the last stage, once per microbatch in microbatch order, between C0 and the T passes;
  //! if it throws, the step fails on every rank. Empty: the cross-entropy, loss weight x sum of
  //! -logp. Only with a vocabulary shard (elsewhere the last stage computes its own loss: set
  //! there, run_step refuses it).
  std::function<double(int microbatch, std::span<double const> logp, std::span<double> dlogp)>
      token_loss;
  //! Vocabulary-balanced schedules: run the collectives (RE, BX, C0, C1, BE) on a progress thread
  //! of the rank, in program order, while the rank's thread goes on with its compute, waiting only
  //! where an action reads a collective's result (section 2.5's overlap; the results are bit for
  //! bit those of running each collective where it stands). C0's combination runs there too; its
  //! loss (token_loss included) is computed on the rank's thread, in microbatch order, when the
  //! first action needs it. Used only where both channels take calls from two threads at once
  //! (a channel with `allows_concurrent_calls()` answering false, MPI without
  //! MPI_THREAD_MULTIPLE, runs them blocking); false runs every collective blocking where it
  //! stands. rank_metrics::vocab_overlapped says which ran.
  bool vocab_overlap = true;
};

//! The loss weight of every microbatch under `opt`: w_i as documented at loss_weighting. An empty
//! microbatch under microbatch_mean counts as one token (Megatron clamps to 1); a zero N under
//! token_mean gives weight 0. Throws invalid_argument_error naming the field.
inline std::vector<double> loss_weights(step_options const& opt, int microbatches) {
  if (microbatches < 1)
    WEFT_THROW(invalid_argument_error,
               ::weft::detail::expectation_message("microbatches >= 1", "microbatches", ">= 1",
                                                   microbatches));
  auto const m = static_cast<std::size_t>(microbatches);
  if (!opt.tokens.empty() && opt.tokens.size() != m)
    WEFT_THROW(invalid_argument_error,
               ::weft::detail::expectation_message(
                   "tokens.size() == microbatches", "step_options::tokens",
                   ::weft::detail::concat(m, " entries (one per microbatch) or none"),
                   ::weft::detail::concat(opt.tokens.size(), " entries")));
  if (opt.data_parallel_size < 1)
    WEFT_THROW(invalid_argument_error,
               ::weft::detail::expectation_message("data_parallel_size >= 1",
                                                   "step_options::data_parallel_size", ">= 1",
                                                   opt.data_parallel_size));
  if (!(opt.total_tokens >= 0.0))
    WEFT_THROW(invalid_argument_error,
               ::weft::detail::expectation_message(
                   "total_tokens >= 0", "step_options::total_tokens", ">= 0", opt.total_tokens));
  auto tokens_of = [&](std::size_t i) -> double {
    return opt.tokens.empty() ? 1.0 : static_cast<double>(opt.tokens[i]);
  };
  std::vector<double> w(m, 0.0);
  if (opt.weighting == loss_weighting::token_mean) {
    double n = opt.total_tokens;
    if (n == 0.0)
      for (std::size_t i = 0; i < m; ++i) n += tokens_of(i);
    for (auto& x : w) x = n > 0.0 ? 1.0 / n : 0.0;
  } else {
    double const dm = static_cast<double>(opt.data_parallel_size) * static_cast<double>(m);
    for (std::size_t i = 0; i < m; ++i) w[i] = 1.0 / (dm * std::max(tokens_of(i), 1.0));
  }
  return w;
}

//! One executed action: its index in the rank's program and when it started and ended, relative
//! to the rank's step origin. RECV spans the wait for its message; SEND spans posting it.
struct timed_action {
  action what{};
  int index = -1;
  std::chrono::nanoseconds start{0};
  std::chrono::nanoseconds end{0};
};

//! Per-rank measurements of one step.
struct rank_metrics {
  std::chrono::nanoseconds step{0};       //!< origin to the last send's completion
  std::chrono::nanoseconds compute{0};    //!< inside stage calls (F, B, I, W)
  std::chrono::nanoseconds recv_wait{0};  //!< waiting at RECV actions
  std::chrono::nanoseconds send_post{0};  //!< posting sends (SEND actions)
  std::chrono::nanoseconds send_wait{0};  //!< waiting for posted sends after the last action
  //! On the rank's thread: in vocabulary collectives (blocking) or waiting for their results
  //! (overlapped).
  std::chrono::nanoseconds collective{0};
  std::size_t actions = 0;
  std::size_t bytes_sent = 0;
  std::size_t bytes_received = 0;
  std::vector<int> slots;  //!< stash slots per chunk (the peak in flight on this rank)
  //! The vocabulary collectives ran on the rank's progress thread (step_options::vocab_overlap).
  bool vocab_overlapped = false;
};

//! What run_step returns on each rank.
struct step_result {
  int rank = -1;
  //! On the rank that holds the last stage: the step loss, the weighted microbatch losses summed
  //! in microbatch order. 0 with has_loss == false elsewhere (broadcast it if every rank needs it).
  double loss = 0.0;
  bool has_loss = false;
  std::vector<double> microbatch_losses;  //!< weighted, per microbatch (last-stage rank only)
  rank_metrics metrics;
  std::chrono::steady_clock::time_point origin{};  //!< when the rank started the step
  //! One entry per executed action. An overlapped collective's entry is its span on the progress
  //! thread; a compute action's excludes the wait for the collectives it reads.
  std::vector<timed_action> timeline;
};

//! Per-rank timelines on one time axis (the earliest origin). Meaningful when the ranks share a
//! clock (threads; processes on one host).
struct measured_timeline {
  std::vector<std::vector<timed_action>> ranks;
  std::chrono::nanoseconds makespan{0};
  //! The ranks ran their vocabulary collectives blocking (no rank overlapped them).
  bool collectives_block = true;
};

//! Aligns the step results of all ranks (indexed by rank) on their earliest origin.
inline measured_timeline merge_timelines(std::span<step_result const> results) {
  measured_timeline out;
  out.ranks.resize(results.size());
  if (results.empty()) return out;
  auto origin = results.front().origin;
  for (auto const& r : results) origin = std::min(origin, r.origin);
  for (auto const& r : results)
    if (r.metrics.vocab_overlapped) out.collectives_block = false;
  for (std::size_t i = 0; i < results.size(); ++i) {
    auto const shift =
        std::chrono::duration_cast<std::chrono::nanoseconds>(results[i].origin - origin);
    for (auto t : results[i].timeline) {
      t.start += shift;
      t.end += shift;
      out.makespan = std::max(out.makespan, t.end);
      out.ranks[i].push_back(t);
    }
  }
  return out;
}

class step_plan;

namespace detail {

//! The shard type of schedules without vocabulary passes.
struct no_vocab {};

template <class S, class V>
step_plan prepare(schedule const& lowered, int rank, S& stage, V* shard);
template <class S, class V, class C, class VC>
step_result run(step_plan& plan, S& stage, V* shard, C& channel, VC* vocab_channel,
                step_options const& opt);
struct vocab_ops;

}  // namespace detail

//! Set-up for one rank: the program, a stash slot for every compute action, and a buffer for
//! every message (allocated here, reused by every step). Built by prepare_step; run_step uses it.
class step_plan {
 public:
  [[nodiscard]] int rank() const noexcept { return rank_; }
  [[nodiscard]] int num_ranks() const noexcept { return ranks_; }
  [[nodiscard]] int num_stages() const noexcept { return stages_; }
  [[nodiscard]] int num_microbatches() const noexcept { return microbatches_; }
  [[nodiscard]] vocab_variant vocab() const noexcept { return vocab_; }
  //! Stash slots per chunk of this rank (the peak number of the chunk's microbatches in flight).
  [[nodiscard]] std::vector<int> const& slots() const noexcept { return slots_; }

 private:
  struct step {
    action a{};
    int slot = -1;
    int in = -1;   //!< buffer: F input / B,I output-gradient / SEND source / RECV target
    int out = -1;  //!< buffer: F output / B,I input-gradient
    bool grads_final = false;
    //! Vocabulary schedules: a collective's ordinal among the rank's collectives; for any step,
    //! the ordinals of the collectives whose results it reads (-1: none), and the microbatch
    //! whose C0 loss it needs first (-1: none; on the last stage's rank).
    int ordinal = -1;
    std::array<int, 3> waits{-1, -1, -1};
    int c0 = -1;
  };
  struct buffer {
    message_layout layout{};
    std::vector<std::byte> bytes;
  };

  [[nodiscard]] comm::buffer_view view(int b) {
    if (b < 0) return {};
    auto& buf = buffers_[static_cast<std::size_t>(b)];
    return {buf.bytes.data(), buf.layout.count, buf.layout.type, comm::memory_kind::host, -1};
  }
  //! Elements [first, first + count) of buffer b.
  [[nodiscard]] comm::buffer_view view(int b, std::size_t first, std::size_t count) {
    auto v = view(b);
    v.data = static_cast<std::byte*>(v.data) + first * size_of(v.type);
    v.count = count;
    return v;
  }
  template <class F>
  [[nodiscard]] F* elements(int b) {
    return reinterpret_cast<F*>(buffers_[static_cast<std::size_t>(b)].bytes.data());
  }
  int add_buffer(message_layout layout) {
    buffer b;
    b.layout = layout;
    // At least one byte, so that an empty message (a microbatch without tokens) still has a
    // non-null address: backends refuse null data.
    b.bytes.resize(std::max<std::size_t>(layout.count * size_of(layout.type), 1));
    buffers_.push_back(std::move(b));
    return static_cast<int>(buffers_.size()) - 1;
  }

  int rank_ = 0, ranks_ = 0, stages_ = 0, microbatches_ = 0;
  std::vector<step> steps_;
  std::vector<buffer> buffers_;
  std::vector<int> slots_;

  // Vocabulary passes (section 2.5), per microbatch i: the IF partial that RE sums (stage 0's
  // input), BX:i's [X_i | g_{i-1}] (m + 1 of them), S's stats [max | sumexp | target | G | H]
  // that C0 combines, the global max, the loss-gradient weights g_i (last stage's rank), the last
  // stage's output gradient (C1's sum for two barriers) and BE's embedding gradient.
  vocab_variant vocab_ = vocab_variant::none;
  dtype vocab_type_ = dtype::f32;  // of every vocabulary buffer: stage 0's input type
  int last_rank_ = 0;
  std::size_t hidden_ = 0;
  std::vector<std::size_t> tokens_;
  std::vector<int> re_, bx_, stats_, max_, g_, dout_, be_, x_;
  std::vector<double> logp_, dlogp_;  // step_options::token_loss's arguments (last stage's rank)
  std::vector<int> c0_step_;          // the step index of C0 of each microbatch (for messages)

  template <class S, class V>
  friend step_plan detail::prepare(schedule const& lowered, int rank, S& stage, V* shard);
  friend struct detail::vocab_ops;
  template <class S, class V, class C, class VC>
  friend step_result detail::run(step_plan& plan, S& stage, V* shard, C& channel, VC* vocab_channel,
                                 step_options const& opt);
};

}  // namespace weft::pipeline
