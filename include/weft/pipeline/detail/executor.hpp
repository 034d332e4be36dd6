// weft/pipeline/detail/executor.hpp — the pipeline executor's interpreter: building a rank's
// step_plan from a lowered program (slots, message buffers, the checks), running one step (the
// vocabulary collectives blocking or on the progress thread: vocab_ops.hpp, progress.hpp), and
// turning a failure into an abort of the channels.
#pragma once

#include <weft/pipeline/step.hpp>

#include <weft/comm/concepts.hpp>
#include <weft/comm/work.hpp>
#include <weft/core/dtype.hpp>
#include <weft/core/error.hpp>
#include <weft/core/memory.hpp>
#include <weft/pipeline/action.hpp>
#include <weft/pipeline/detail/deps.hpp>
#include <weft/pipeline/detail/progress.hpp>
#include <weft/pipeline/detail/vocab_ops.hpp>
#include <weft/pipeline/schedule.hpp>
#include <weft/pipeline/stage.hpp>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <exception>
#include <functional>
#include <optional>
#include <span>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

namespace weft::pipeline {

namespace detail {

inline std::string describe_step(int rank, std::size_t index, action const& a) {
  std::string what;
  switch (a.kind) {
    case op::forward: what = "forward"; break;
    case op::backward: what = "backward"; break;
    case op::backward_input: what = "backward_input"; break;
    case op::backward_weight: what = "backward_weight"; break;
    case op::send_forward: what = "send of the forward activation"; break;
    case op::recv_forward: what = "receive of the forward activation"; break;
    case op::send_backward: what = "send of the input gradient"; break;
    case op::recv_backward: what = "receive of the output gradient"; break;
    case op::vocab_forward: what = "vocabulary pass S"; break;
    case op::vocab_backward: what = "vocabulary pass T"; break;
    case op::input_forward: what = "embedding pass IF"; break;
    case op::input_backward: what = "embedding pass IB"; break;
    case op::collective:
      return ::weft::detail::concat("pipeline rank ", rank, ", action #", index, " `", to_string(a),
                                    "` (collective ", to_string(a.tag), " of microbatch ",
                                    a.microbatch, ")");
  }
  char const* unit = is_vocab_compute(a.kind) ? " of rank " : " of stage ";
  return ::weft::detail::concat("pipeline rank ", rank, ", action #", index, " `", to_string(a),
                                "` (", what, unit, a.stage, ", microbatch ", a.microbatch, ")");
}

template <class C>
void abort_channel(C& c, std::string const& reason) noexcept {
  if constexpr (requires { c.abort(reason); })
    c.abort(reason);
  else
    c.abort();
}

template <class C, class VC>
void abort_channels(C& c, VC* v, std::string const& reason) noexcept {
  abort_channel(c, reason);
  if (v != nullptr) abort_channel(*v, reason);
}

// With opt.report_failure: the other ranks' reports, appended to `own`, rethrown as a weft::error
// with the original's code (or internal) and `current` nested. Without: returns (the caller
// rethrows the original).
inline void rethrow_with_reports(step_options const& opt, std::string const& own, errc code,
                                 source_location where = source_location::current()) {
  if (!opt.report_failure) return;
  std::string reports;
  try {
    reports = opt.report_failure(own);
  } catch (std::exception const& e) {
    reports =
        ::weft::detail::concat("; reporting the failure to the other ranks failed: ", e.what());
  }
  std::throw_with_nested(error(code, own + reports, where));
}

inline errc code_of(std::exception const& e) noexcept {
  auto const* w = dynamic_cast<error const*>(&e);
  return w != nullptr ? w->code() : errc::internal;
}

template <class S, class V>
step_plan prepare(schedule const& lowered, int rank, S& stage, V* shard) {
  constexpr bool has_vocab = !std::is_same_v<V, no_vocab>;
  int const p = lowered.num_ranks();
  if (rank < 0 || rank >= p)
    WEFT_THROW(invalid_argument_error, ::weft::detail::expectation_message(
                                           "0 <= rank < num_ranks", "rank",
                                           ::weft::detail::concat("in [0, ", p, ")"), rank));
  if (!has_vocab && lowered.vocab() != vocab_variant::none)
    WEFT_THROW(schedule_error,
               "argument `lowered`: expected a schedule without vocabulary passes "
               "(vocab_variant::none) for a call without a vocabulary shard, actual ",
               to_string(lowered.vocab()));
  if (has_vocab && lowered.vocab() == vocab_variant::none)
    WEFT_THROW(schedule_error,
               "argument `lowered`: expected a vocabulary-balanced schedule for a call with a "
               "vocabulary shard, actual ",
               to_string(lowered.vocab()));
  if (p > 1 && !lowered.has_p2p())
    WEFT_THROW(schedule_error,
               "argument `lowered`: expected a lowered schedule (SEND/RECV actions; see lower()), "
               "actual a compute-only schedule on ",
               p, " ranks");
  int const n_stages = lowered.num_stages();
  int const m = lowered.num_microbatches();
  int const chunks = lowered.num_chunks();
  int const last = n_stages - 1;
  auto const& program = lowered.actions(rank);
  auto const sm = static_cast<std::size_t>(n_stages) * static_cast<std::size_t>(m);
  auto key = [&](int s, int mb) {
    return static_cast<std::size_t>(s) * static_cast<std::size_t>(m) + static_cast<std::size_t>(mb);
  };
  auto fail = [&](std::size_t i, std::string const& rule) {
    WEFT_THROW(schedule_error, "argument `lowered`: rank ", rank, " action #", i, " `",
               to_string(program[i]), "`: ", rule);
  };

  step_plan plan;
  plan.rank_ = rank;
  plan.ranks_ = p;
  plan.stages_ = n_stages;
  plan.microbatches_ = m;
  plan.vocab_ = lowered.vocab();
  plan.last_rank_ = lowered.stage_to_rank(last);

  std::vector<char> split(sm, 0);
  for (std::size_t i = 0; i < program.size(); ++i) {
    auto const& a = program[i];
    if (a.kind == op::collective) {
      if (a.microbatch < 0 || a.microbatch > m ||
          (a.microbatch == m && a.tag != collective_kind::broadcast_output))
        fail(i, ::weft::detail::concat("expected microbatch in [0, ", m, ")"));
      continue;
    }
    if (a.stage < 0 || a.stage >= n_stages || a.microbatch < 0 || a.microbatch >= m)
      fail(i, ::weft::detail::concat("expected stage in [0, ", n_stages, ") and microbatch in [0, ",
                                     m, ")"));
    if (is_vocab_compute(a.kind)) {
      if (a.stage != rank)
        fail(i, ::weft::detail::concat("expected a vocabulary pass of this rank, actual rank ",
                                       a.stage));
      continue;
    }
    if (lowered.stage_to_rank(a.stage) != rank)
      fail(i, ::weft::detail::concat("expected a stage of this rank, actual stage ", a.stage,
                                     " of rank ", lowered.stage_to_rank(a.stage)));
    if (is_p2p(a.kind) && (a.peer < 0 || a.peer >= p))
      fail(i, ::weft::detail::concat("expected a peer in [0, ", p, "), actual ", a.peer));
    if (a.kind == op::backward_weight) split[key(a.stage, a.microbatch)] = 1;
  }

  // Buffers: one per message. Activation (s, mb) is F(s)'s output and F(s+1)'s input; gradient
  // (s, mb) is B/I(s)'s input gradient and B/I(s-1)'s output gradient. A hand-over inside the
  // rank (the turn of a V) shares the buffer: no copy, no send.
  std::vector<int> index(2 * sm, -1);
  auto call_for = [&](int s, int mb) {
    stage_call c;
    c.stage = s;
    c.chunk = lowered.chunk_of(s);
    c.microbatch = mb;
    c.num_microbatches = m;
    c.num_stages = n_stages;
    return c;
  };
  auto buffer = [&](std::size_t i, bool grad, int s, int mb, message_layout layout) {
    auto& slot = index[(grad ? sm : 0) + key(s, mb)];
    if (slot < 0) {
      slot = plan.add_buffer(layout);
    } else if (!(plan.buffers_[static_cast<std::size_t>(slot)].layout == layout)) {
      auto const& have = plan.buffers_[static_cast<std::size_t>(slot)].layout;
      WEFT_THROW(shape_error, "stage layouts: rank ", rank, " action #", i, " `",
                 to_string(program[i]), "`: the ", grad ? "gradient" : "activation",
                 " between stages ", grad ? s - 1 : s, " and ", grad ? s : s + 1, ", microbatch ",
                 mb, " is declared twice with different layouts: expected ", have.count, " x ",
                 name(have.type), ", actual ", layout.count, " x ", name(layout.type));
    }
    return slot;
  };

  if constexpr (has_vocab) {
    // The vocabulary buffers exist on every rank: the collectives involve all of them.
    bool const one = lowered.vocab() == vocab_variant::one_barrier;
    plan.hidden_ = shard->hidden();
    std::size_t const h = plan.hidden_;
    plan.tokens_.resize(static_cast<std::size_t>(m));
    for (int i = 0; i < m; ++i) {
      auto c = call_for(0, i);
      c.stage = rank;
      c.chunk = 0;
      plan.tokens_[static_cast<std::size_t>(i)] = shard->tokens(c);
    }
    // Every vocabulary buffer has the type of stage 0's input (f32 or f64).
    dtype const type = m > 0 ? stage.input_layout(call_for(0, 0)).type : dtype::f32;
    if (type != dtype::f32 && type != dtype::f64)
      WEFT_THROW(shape_error,
                 "stage layouts: under vocabulary parallelism the input of stage 0, microbatch 0 "
                 "is the n x h embedding: expected f32 or f64 elements, actual ",
                 name(type));
    plan.vocab_type_ = type;
    auto typed = [type](std::size_t n) { return message_layout{n, type}; };
    auto want = [&](char const* what, int s, int i, message_layout got) {
      auto const n = plan.tokens_[static_cast<std::size_t>(i)] * h;
      if (!(got == typed(n)))
        WEFT_THROW(shape_error, "stage layouts: under vocabulary parallelism the ", what,
                   " of stage ", s, ", microbatch ", i, " is the n x h embedding: expected ", n,
                   " x ", name(type), ", actual ", got.count, " x ", name(got.type));
    };
    for (int i = 0; i < m; ++i) {
      auto const n = plan.tokens_[static_cast<std::size_t>(i)];
      want("input", 0, i, stage.input_layout(call_for(0, i)));
      want("output", last, i, stage.output_layout(call_for(last, i)));
      plan.re_.push_back(plan.add_buffer(typed(n * h)));
      plan.stats_.push_back(plan.add_buffer(typed(3 * n + (one ? 2 * n * h : 0))));
      plan.max_.push_back(plan.add_buffer(typed(n)));
      plan.g_.push_back(plan.add_buffer(typed(n)));
      plan.dout_.push_back(plan.add_buffer(typed(n * h)));
      plan.be_.push_back(buffer(0, true, 0, i, typed(n * h)));
    }
    for (int i = 0; i <= m; ++i) {
      std::size_t const x = i < m ? plan.tokens_[static_cast<std::size_t>(i)] * h : 0;
      std::size_t const g = i > 0 ? plan.tokens_[static_cast<std::size_t>(i - 1)] : 0;
      plan.bx_.push_back(plan.add_buffer(typed(x + g)));
    }
  }

  std::vector<int> slot_of(sm, -1);
  std::vector<std::vector<char>> in_use(static_cast<std::size_t>(chunks));
  plan.slots_.assign(static_cast<std::size_t>(chunks), 0);
  std::vector<int> last_grad_mb(static_cast<std::size_t>(chunks), -1);
  std::vector<int> last_grad_step(static_cast<std::size_t>(chunks), -1);
  int live = 0;
  for (std::size_t i = 0; i < program.size(); ++i) {
    auto const& a = program[i];
    step_plan::step st;
    st.a = a;
    if (a.kind == op::collective || is_vocab_compute(a.kind)) {
      plan.steps_.push_back(st);  // buffers by microbatch, above
      continue;
    }
    int const s = a.stage, mb = a.microbatch;
    auto const k = key(s, mb);
    auto const c = static_cast<std::size_t>(lowered.chunk_of(s));
    auto const call = call_for(s, mb);
    bool const is_split = split[k] != 0;
    switch (a.kind) {
      case op::forward: {
        if (slot_of[k] >= 0) fail(i, "a second forward of the same (stage, microbatch)");
        auto& used = in_use[c];
        auto const free = std::find(used.begin(), used.end(), char{0});
        auto const slot = static_cast<int>(free - used.begin());
        if (free == used.end())
          used.push_back(1);
        else
          *free = 1;
        slot_of[k] = slot;
        plan.slots_[c] = std::max(plan.slots_[c], static_cast<int>(used.size()));
        ++live;
        st.slot = slot;
        if (s > 0)
          st.in = buffer(i, false, s - 1, mb, stage.input_layout(call));
        else if (has_vocab)
          st.in = plan.re_[static_cast<std::size_t>(mb)];
        if (s < last || has_vocab) st.out = buffer(i, false, s, mb, stage.output_layout(call));
        break;
      }
      case op::backward:
      case op::backward_input:
      case op::backward_weight: {
        if (slot_of[k] < 0) fail(i, "a backward before its forward, or after its last backward");
        st.slot = slot_of[k];
        if (a.kind == op::backward && is_split)
          fail(i, "expected B or I + W for one (stage, microbatch), actual both B and W");
        if (a.kind == op::backward_input && !is_split)
          fail(i, "an I without a W for the same (stage, microbatch)");
        if (a.kind != op::backward_weight) {
          if (s < last)
            st.in = buffer(i, true, s + 1, mb, stage.output_layout(call));
          else if (has_vocab)
            st.in = plan.dout_[static_cast<std::size_t>(mb)];
          if (s > 0 || has_vocab) st.out = buffer(i, true, s, mb, stage.input_layout(call));
        }
        if (a.kind != op::backward_input) {
          // Gradient accumulation order: equal to sequential accumulation only when each chunk
          // adds its microbatches' gradients in increasing order.
          if (mb <= last_grad_mb[c])
            fail(i, ::weft::detail::concat(
                        "expected the chunk's gradient-accumulating actions (B, or W when split) "
                        "in increasing microbatch order, actual microbatch ",
                        mb, " after ", last_grad_mb[c]));
          last_grad_mb[c] = mb;
          last_grad_step[c] = static_cast<int>(i);
          in_use[c][static_cast<std::size_t>(slot_of[k])] = 0;
          slot_of[k] = -1;
          --live;
        }
        break;
      }
      case op::send_forward: st.in = buffer(i, false, s, mb, stage.output_layout(call)); break;
      case op::recv_forward: st.in = buffer(i, false, s - 1, mb, stage.input_layout(call)); break;
      case op::send_backward: st.in = buffer(i, true, s, mb, stage.input_layout(call)); break;
      case op::recv_backward: st.in = buffer(i, true, s + 1, mb, stage.output_layout(call)); break;
      default: fail(i, "unsupported action");
    }
    plan.steps_.push_back(st);
  }
  if (live != 0)
    WEFT_THROW(schedule_error, "argument `lowered`: rank ", rank, " ends with ", live,
               " (stage, microbatch) pairs whose forward has no last backward");
  if constexpr (has_vocab) {
    if (rank == plan.last_rank_)
      for (int mb = 0; mb < m; ++mb) plan.x_.push_back(index[key(last, mb)]);
    // The collectives' ordinals in program order, and the ones each step reads the results of:
    // where an overlapped step waits (and, on the last stage's rank, computes C0's loss).
    constexpr std::size_t tags = static_cast<std::size_t>(collective_kind::broadcast_input) + 1;
    auto const per_tag = static_cast<std::size_t>(m) + 1;
    std::vector<int> ordinal(tags * per_tag, -1);
    auto slot_of_coll = [&](collective_kind t, int mb) -> int& {
      return ordinal[static_cast<std::size_t>(t) * per_tag + static_cast<std::size_t>(mb)];
    };
    plan.c0_step_.assign(static_cast<std::size_t>(m), -1);
    int issued = 0;
    for (std::size_t i = 0; i < plan.steps_.size(); ++i) {
      auto& st = plan.steps_[i];
      std::size_t w = 0;
      for (auto const& n : needs_of(lowered, st.a, rank)) {
        if (n.what != need::type::collective) continue;
        int const k = n.mb >= 0 && n.mb <= m ? slot_of_coll(n.tag, n.mb) : -1;
        if (k < 0)
          fail(i, ::weft::detail::concat("expected collective ", to_string(n.tag),
                                         " of microbatch ", n.mb,
                                         ", whose result this action reads, earlier in the "
                                         "rank's program"));
        st.waits[w++] = k;
        if (n.tag == collective_kind::c0 && rank == plan.last_rank_) st.c0 = n.mb;
      }
      if (st.a.kind == op::collective) {
        st.ordinal = issued++;
        slot_of_coll(st.a.tag, st.a.microbatch) = st.ordinal;
        if (st.a.tag == collective_kind::c0)
          plan.c0_step_[static_cast<std::size_t>(st.a.microbatch)] = static_cast<int>(i);
      }
    }
  }
  for (int c = 0; c < chunks; ++c) {
    auto const ci = static_cast<std::size_t>(c);
    if (last_grad_step[ci] >= 0)
      plan.steps_[static_cast<std::size_t>(last_grad_step[ci])].grads_final = true;
    stage.reserve_slots(c, plan.slots_[ci]);
  }
  return plan;
}

template <class S, class V, class C, class VC>
step_result run(step_plan& plan, S& stage, V* shard, C& channel, VC* vocab_channel,
                step_options const& opt) {
  constexpr bool has_vocab = !std::is_same_v<V, no_vocab>;
  if (channel.size() != plan.ranks_)
    WEFT_THROW(invalid_argument_error,
               ::weft::detail::expectation_message("channel.size() == num_ranks", "channel.size()",
                                                   plan.ranks_, channel.size()));
  if (channel.rank() != plan.rank_)
    WEFT_THROW(invalid_argument_error,
               ::weft::detail::expectation_message("channel.rank() == plan.rank()",
                                                   "channel.rank()", plan.rank_, channel.rank()));
  if constexpr (has_vocab) {
    if (vocab_channel->size() != plan.ranks_ || vocab_channel->rank() != plan.rank_)
      WEFT_THROW(invalid_argument_error,
                 ::weft::detail::expectation_message(
                     "vocab_channel rank and size equal the pipeline's", "vocab_channel",
                     ::weft::detail::concat("rank ", plan.rank_, " of ", plan.ranks_),
                     ::weft::detail::concat("rank ", vocab_channel->rank(), " of ",
                                            vocab_channel->size())));
  }
  if (!has_vocab && opt.token_loss)
    WEFT_THROW(invalid_argument_error,
               "argument `opt.token_loss`: expected empty for a schedule without vocabulary "
               "passes (its last stage computes the loss), actual a function");
  if (has_vocab != (plan.vocab_ != vocab_variant::none))
    WEFT_THROW(invalid_argument_error, "argument `plan`: expected a plan prepared ",
               has_vocab ? "with" : "without", " a vocabulary shard, actual one prepared ",
               has_vocab ? "without" : "with", " one");
  // Under vocabulary parallelism the shard declares the tokens: they weight the loss unless the
  // caller gave the counts (data-parallel replicas, or tokens that do not count).
  std::vector<double> weights;
  if (has_vocab && opt.tokens.empty()) {
    auto counted = opt;
    counted.tokens = plan.tokens_;
    weights = loss_weights(counted, plan.microbatches_);
  } else {
    weights = loss_weights(opt, plan.microbatches_);
  }
  using clock = std::chrono::steady_clock;
  auto const since = [](clock::time_point from, clock::time_point to) {
    return std::chrono::duration_cast<std::chrono::nanoseconds>(to - from);
  };

  step_result res;
  res.rank = plan.rank_;
  res.metrics.slots = plan.slots_;
  res.timeline.reserve(plan.steps_.size());
  int const last = plan.stages_ - 1;
  std::vector<double> losses(static_cast<std::size_t>(plan.microbatches_), 0.0);
  bool const holds_last = plan.rank_ == plan.last_rank_;

  std::vector<comm::work> recvs(plan.steps_.size());
  std::vector<comm::work> sends;
  sends.reserve(plan.steps_.size());
  std::size_t i = 0;
  bool aborted = false;  // by a stage failure, with its own description

  // Vocabulary collectives: blocking where they stand, or posted to the progress thread in
  // program order (the same on every rank), each action waiting for the ones it reads. The
  // progress thread is joined when run returns or unwinds (after the catch below aborted the
  // channels, so a collective it still runs fails fast instead of waiting for its peers).
  bool overlap = false;
  if constexpr (has_vocab)
    overlap = opt.vocab_overlap && allows_concurrent_calls(channel) &&
              allows_concurrent_calls(*vocab_channel);
  res.metrics.vocab_overlapped = overlap;
  std::optional<progress_thread> progress;
  if (overlap) progress.emplace();
  std::vector<std::size_t> posted_step;      // the step index of each posted collective
  std::vector<std::size_t> posted_timeline;  // and of its timeline entry
  int losses_done = 0;  // C0's loss is computed for microbatches below (last stage's rank)
  // C0's loss, in microbatch order, up to microbatch `mb` (on the last stage's rank; a token loss
  // that throws fails the step on every rank, naming C0).
  auto c0_loss_through = [&](int mb) {
    for (; losses_done <= mb; ++losses_done) {
      auto const k = static_cast<std::size_t>(losses_done);
      std::exception_ptr loss_failure;
      losses[k] = plan.vocab_type_ == dtype::f64
                      ? vocab_ops::c0_loss<double>(plan, losses_done, weights[k], opt, loss_failure)
                      : vocab_ops::c0_loss<float>(plan, losses_done, weights[k], opt, loss_failure);
      if (!loss_failure) continue;
      std::string what = "a non-standard exception";
      try {
        std::rethrow_exception(loss_failure);
      } catch (std::exception const& e) {
        what = e.what();
      } catch (...) {}
      auto const at = static_cast<std::size_t>(plan.c0_step_[k]);
      auto const msg = ::weft::detail::concat(describe_step(plan.rank_, at, plan.steps_[at].a),
                                              ": step_options::token_loss of microbatch ",
                                              losses_done, " threw: ", what);
      abort_channels(channel, vocab_channel, msg);
      aborted = true;
      rethrow_with_reports(opt, msg, errc::internal);
      try {
        std::rethrow_exception(loss_failure);
      } catch (...) {
        std::throw_with_nested(error(errc::internal, msg));
      }
    }
  };
  // Before step `st`: the collectives it reads have completed, and C0's loss it needs exists.
  // A failed collective is reported as that collective's failure.
  auto await = [&](step_plan::step const& st) {
    if (overlap)
      for (int k : st.waits) {
        if (k < 0) continue;
        try {
          progress->wait(k);
        } catch (...) {
          if (int const f = progress->failed(); f >= 0)
            i = posted_step[static_cast<std::size_t>(f)];
          throw;
        }
      }
    if (st.c0 >= 0) c0_loss_through(st.c0);
  };

  res.origin = clock::now();
  try {
    for (std::size_t j = 0; j < plan.steps_.size(); ++j) {
      i = j;
      auto const& st = plan.steps_[j];
      if (is_recv(st.a.kind)) recvs[j] = channel.irecv(plan.view(st.in), st.a.peer, opt.p2p);
    }
    for (i = 0; i < plan.steps_.size(); ++i) {
      auto const& st = plan.steps_[i];
      auto const& a = st.a;
      if (has_vocab && a.kind != op::collective && (st.waits[0] >= 0 || st.c0 >= 0)) {
        auto const tw = clock::now();
        await(st);
        res.metrics.collective += since(tw, clock::now());
      }
      auto const t0 = clock::now();
      if (is_recv(a.kind)) {
        recvs[i].wait();
        res.metrics.bytes_received += plan.view(st.in).bytes();
      } else if (is_send(a.kind)) {
        auto const v = plan.view(st.in);
        sends.push_back(channel.isend(v, a.peer, opt.p2p));
        res.metrics.bytes_sent += v.bytes();
      } else if (a.kind == op::collective) {
        if constexpr (has_vocab) {
          auto& vc = *vocab_channel;
          await(st);  // BX on the last stage's rank: g of the previous microbatch
          if (a.tag == collective_kind::broadcast_output && holds_last)
            vocab_ops::pack_output(plan, a.microbatch);  // [X_i | g_{i-1}], on the rank's thread
          auto task = vocab_ops::task(plan, vc, a.tag, a.microbatch, opt);
          if (overlap) {
            posted_step.push_back(i);
            posted_timeline.push_back(res.timeline.size());
            (void)progress->post(std::move(task));
          } else {
            task();
            if (a.tag == collective_kind::c0 && holds_last) c0_loss_through(a.microbatch);
          }
        }
      } else {
        stage_call c;
        c.stage = a.stage;
        c.chunk = a.chunk;
        c.microbatch = a.microbatch;
        c.num_microbatches = plan.microbatches_;
        c.num_stages = plan.stages_;
        c.slot = st.slot;
        c.loss_weight = a.stage == last || is_vocab_compute(a.kind)
                            ? weights[static_cast<std::size_t>(a.microbatch)]
                            : 0.0;
        c.grads_final = st.grads_final;
        try {
          switch (a.kind) {
            case op::forward: {
              double const l = stage.forward(c, plan.view(st.in), plan.view(st.out));
              if (!has_vocab && a.stage == last) losses[static_cast<std::size_t>(a.microbatch)] = l;
              break;
            }
            case op::backward:
              if constexpr (FusedBackwardStage<S>) {
                stage.backward(c, plan.view(st.in), plan.view(st.out));
              } else {
                stage.backward_input(c, plan.view(st.in), plan.view(st.out));
                stage.backward_weight(c);
              }
              break;
            case op::backward_input:
              stage.backward_input(c, plan.view(st.in), plan.view(st.out));
              break;
            case op::backward_weight: stage.backward_weight(c); break;
            default:
              if constexpr (has_vocab) {
                auto const mb = static_cast<std::size_t>(a.microbatch);
                std::size_t const n = plan.tokens_[mb], h = plan.hidden_;
                c.chunk = 0;
                c.slot = -1;
                switch (a.kind) {
                  case op::input_forward: shard->input_forward(c, plan.view(plan.re_[mb])); break;
                  case op::input_backward: shard->input_backward(c, plan.view(plan.be_[mb])); break;
                  case op::vocab_forward:
                    shard->output_forward(c, plan.view(plan.bx_[mb], 0, n * h),
                                          plan.view(plan.stats_[mb]));
                    break;
                  case op::vocab_backward: {
                    std::size_t const next_x =
                        mb + 1 < plan.tokens_.size() ? plan.tokens_[mb + 1] * h : 0;
                    shard->output_backward(
                        c, plan.view(plan.bx_[mb], 0, n * h),
                        plan.view(plan.bx_[mb + 1], next_x, n), plan.view(plan.max_[mb]),
                        plan.view(plan.stats_[mb], n, n),
                        plan.vocab_ == vocab_variant::two_barrier ? plan.view(plan.dout_[mb])
                                                                  : comm::buffer_view{});
                    break;
                  }
                  default: break;
                }
              }
              break;
          }
        } catch (std::exception const& e) {
          auto const msg = ::weft::detail::concat(describe_step(plan.rank_, i, a),
                                                  ": the stage threw: ", e.what());
          abort_channels(channel, vocab_channel, msg);
          aborted = true;
          rethrow_with_reports(opt, msg, errc::internal);
          std::throw_with_nested(error(errc::internal, msg));
        } catch (...) {
          auto const msg = ::weft::detail::concat(describe_step(plan.rank_, i, a),
                                                  ": the stage threw a non-standard exception");
          abort_channels(channel, vocab_channel, msg);
          aborted = true;
          rethrow_with_reports(opt, msg, errc::internal);
          std::throw_with_nested(error(errc::internal, msg));
        }
        res.metrics.compute += since(t0, clock::now());
      }
      auto const t1 = clock::now();
      if (is_recv(a.kind)) res.metrics.recv_wait += since(t0, t1);
      if (is_send(a.kind)) res.metrics.send_post += since(t0, t1);
      if (a.kind == op::collective) res.metrics.collective += since(t0, t1);
      res.timeline.push_back(
          {a, static_cast<int>(i), since(res.origin, t0), since(res.origin, t1)});
    }
    if constexpr (has_vocab) {
      // The collectives still in flight, the losses not needed by an action, the timeline.
      auto const tw = clock::now();
      if (overlap && !posted_step.empty()) {
        step_plan::step all;
        all.waits[0] = static_cast<int>(posted_step.size()) - 1;
        await(all);
      }
      if (holds_last) c0_loss_through(plan.microbatches_ - 1);
      res.metrics.collective += since(tw, clock::now());
      for (std::size_t k = 0; k < posted_timeline.size(); ++k) {
        auto const span = progress->times(static_cast<int>(k));
        auto& e = res.timeline[posted_timeline[k]];
        e.start = since(res.origin, span.start);
        e.end = since(res.origin, span.end);
      }
    }
    auto const t0 = clock::now();
    for (auto& w : sends) w.wait();
    res.metrics.send_wait = since(t0, clock::now());
  } catch (std::exception const& e) {
    if (!aborted) {  // a communicator's failure (a stage's was reported above)
      auto const& a = i < plan.steps_.size() ? plan.steps_[i].a : action{};
      auto const msg = ::weft::detail::concat(describe_step(plan.rank_, i, a), ": ", e.what());
      abort_channels(channel, vocab_channel, msg);
      rethrow_with_reports(opt, msg, code_of(e));
    }
    throw;
  } catch (...) {
    if (!aborted) {
      auto const& a = i < plan.steps_.size() ? plan.steps_[i].a : action{};
      abort_channels(
          channel, vocab_channel,
          ::weft::detail::concat(describe_step(plan.rank_, i, a), ": a non-standard exception"));
    }
    throw;
  }
  res.metrics.step = since(res.origin, clock::now());
  res.metrics.actions = plan.steps_.size();
  if (holds_last) {
    res.has_loss = true;
    res.microbatch_losses = losses;
    for (double l : losses) res.loss += l;
  }
  return res;
}

}  // namespace detail

}  // namespace weft::pipeline
