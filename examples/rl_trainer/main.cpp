// rl_trainer — weft's reference RL trainer: a GPT-2 style model learns 2-digit addition by SFT,
// then by DAPO or GRPO, on any pp × dp × cp × tp layout of thread ranks, composed from weft's
// layers (parallel::gpt and its pipeline stages), the pipeline executor, the key/value-cache
// decoder, the RL losses and advantages, and AdamW. No autograd: forward, hand-written backward.
//
// Every rank holds a full replica of the model for generation (gathered from the shards after
// each optimizer step) and generates a share of the groups; a sample's randomness is keyed by
// (seed, step, prompt, sample, position) through Philox, so rollouts do not depend on the layout.
// The rollouts are shared by all ranks, every rank takes the same filtering decision, and the
// update runs under the layout: each data-parallel rank trains on contiguous whole groups,
// microbatch by microbatch (one group each) through its pipeline, with the policy loss on the
// last stage's log-probabilities, gradients summed over dp × cp, clipped over pp × tp (with
// --zero1: reduce-scattered over dp × cp, AdamW on each rank's shard, clipped over all ranks).
//
//   rl_trainer [--mode dapo|grpo] [--seed N] [--rl-steps N] [--dp N] [--pp N] [--tp N] [--cp N]
//              [--sp] [--refill whole|sized] [--zero-advantage] [--out DIR] [--check] ...
//              [--device cpu|cpu-engine|cuda]
//
// --device cuda (rl_trainer_cuda, built with WEFT_ENABLE_CUDA) runs the model step on a GPU:
// forward, backward, clipping and AdamW through nn::cuda_gpt and optim/cuda, and generation
// through nn::cuda_gpt_decoder and rl/cuda's sampler (engine.hpp, engine_cuda.cu); the policy
// loss stays on the host.
//
// The pieces: options.hpp (the command line), task.hpp (the task, generation, metrics),
// optimizer.hpp (AdamW replicated or ZeRO-1), engine.hpp (--device); this file the per-rank
// trainer, its checkpoints, the outputs and the one-rank comparison.
//
// See --help and docs/trainer.md. Exit status: 0 on success (with --check: the layout followed
// the one-rank run), 1 when a check fails, 2 on a bad command line.
#include "common/cli.hpp"
#include "rl_trainer/engine.hpp"
#include "rl_trainer/optimizer.hpp"
#include "rl_trainer/options.hpp"
#include "rl_trainer/task.hpp"

#include <weft/comm/collectives.hpp>
#include <weft/comm/threads/world.hpp>
#include <weft/core/error.hpp>
#include <weft/core/random.hpp>
#include <weft/mesh/device_mesh.hpp>
#include <weft/nn/decode.hpp>
#include <weft/nn/gpt.hpp>
#include <weft/optim/adamw.hpp>
#include <weft/optim/clip.hpp>
#include <weft/parallel/gpt.hpp>
#include <weft/parallel/gpt_pipeline.hpp>
#include <weft/parallel/gpt_vocab.hpp>
#include <weft/pipeline/executor.hpp>
#include <weft/pipeline/lower.hpp>
#include <weft/rl/advantages.hpp>
#include <weft/rl/aggregation.hpp>
#include <weft/rl/policy_loss.hpp>
#include <weft/rl/sampling.hpp>
#if WEFT_HAS_MPI
#include <weft/comm/mpi/communicator.hpp>
#include <weft/comm/mpi/environment.hpp>
#endif
// rl_trainer_cuda with NCCL: --device cuda sums the data-parallel gradients over NCCL.
#if WEFT_TRAINER_CUDA && WEFT_HAS_NCCL
#include <weft/comm/nccl/communicator.hpp>
#include <weft/comm/nccl/device_view.hpp>
#define WEFT_TRAINER_NCCL 1
#else
#define WEFT_TRAINER_NCCL 0
#endif

#include <algorithm>
#include <charconv>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <iostream>
#include <limits>
#include <map>
#include <memory>
#include <mutex>
#include <numeric>
#include <optional>
#include <span>
#include <sstream>
#include <stdexcept>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace {

namespace nn = weft::nn;
namespace par = weft::parallel;
namespace pl = weft::pipeline;
namespace rl = weft::rl;
namespace optim = weft::optim;
using weft::index_t;
using comm_t = weft::comm::threads::communicator;
using clock_type = std::chrono::steady_clock;
namespace rlt = weft::examples::rl_trainer;
using namespace weft::examples::rl_trainer;  // options, task and rollouts

// ---- the per-rank trainer
// -------------------------------------------------------------------------

template <class T, class Comm = comm_t>
class trainer {
  using optimizer_t = rlt::chunk_optimizer<T, Comm>;

 public:
  trainer(options const& o, Comm& world)
      : o_(o),
        c_(model_config(o.layers)),
        world_(&world),
        mesh_(world, {o.pp, o.dp, o.cp, o.tp}, {"pp", "dp", "cp", "tp"},
              {{"dp", "cp"}, {"pp", "tp"}}),
        tp_(&mesh_.group("tp")),
        cp_(&mesh_.group("cp")),
        pp_(&mesh_.group("pp")),
        data_(&mesh_.group({"dp", "cp"})),
        model_group_(&mesh_.group({"pp", "tp"})),
        p_{tp_->size(), tp_->rank(), o.sp,        cp_->size(),
           cp_->rank(), pp_->size(), pp_->rank(), o.pp > 1 && vocab_schedule(o.schedule)},
        // The chunks this rank holds under the schedule's placement (any step's schedule of the
        // family has it: make_schedule's fallbacks keep it, run_units checks).
        chunks_(o.pp > 1
                    ? par::gpt_chunks(p_, make_schedule(o.schedule, o.pp, 2 * o.pp), pp_->rank())
                    : std::vector<par::gpt_parallelism>{p_}),
        replica_(nn::gpt_layout(c_)),
        dp_rank_(mesh_.local_rank("dp")),
        seq_len_(round_up(kPrompt + kMaxNew, 2 * o.cp)) {
    stores_.reserve(chunks_.size() + 1);  // the pipeline stages hold pointers to the stores
    for (auto const& q : chunks_) {
      stores_.emplace_back(par::gpt_shard_layout(c_, q));
      par::gpt_init_shard(stores_.back(), c_, q, o.seed);
      last_stage_ = last_stage_ || q.last_stage();
    }
    if (p_.vocab_pipeline) {
      // The vocabulary-balanced schedules: this rank's rows of the embedding and output layer in
      // a store after the chunk's (the optimizer, clipping and checkpoints take every store),
      // and the vocabulary passes' collectives on a channel of their own.
      static_assert(rlt::kVocab == 14,
                    "options.hpp bounds --pp x --tp by the vocabulary under vocab-*");
      stores_.emplace_back(par::gpt_vocab_layout(c_, p_));
      par::gpt_vocab_init(stores_.back(), c_, p_, o.seed);
      vocab_channel_.emplace(pp_->split(0, pp_->rank()));
    }
    gather_replica();
    if (o.pp == 1) model_.emplace(c_, p_, *tp_, *cp_, store());
    if (seq_len_ > kContext)
      throw bad_argument{"argument `--cp`: 2 cp must divide a length <= the context 16"};
    if (o.device == "cpu-engine")
      engine_ = std::make_unique<rlt::cpu_engine<T, Comm>>(c_, p_, *tp_, *cp_, *model_group_);
#if WEFT_TRAINER_CUDA
    if (o.device == "cuda") engine_ = rlt::make_cuda_engine<T>(c_, world.rank());
#endif
    if (engine_) say("model step on %s\n", engine_->where().c_str());
    // Generation where the model is: the engine's decoder over its parameters, or the host's
    // over the replica.
    index_t const rows = std::max<index_t>(kGenGroups * o.group, kEvalChunk);
    if (engine_)
      decoder_ = engine_->make_decoder(rows, kPrompt + kMaxNew);
    else
      decoder_ = std::make_unique<rlt::host_decoder<T>>(c_, replica_, rows, kPrompt + kMaxNew);
#if WEFT_TRAINER_NCCL
    if (engine_ && engine_->device_grads().data != nullptr && data_->size() > 1) join_nccl();
#endif
  }

  run_result run() {
    run_result r;
    auto const t0 = clock_type::now();
    optim::adamw_options ao;
    ao.lr = o_.rl_lr;
    ao.weight_decay = 0.0;
    rl_opt_.emplace(make_optimizer(ao));
    if (o_.zero1) {
      std::size_t held = 0;
      for (auto const& st : stores_) held += st.params().size();
      say("ZeRO-1: rank 0 holds the AdamW state of %zu of its %zu parameters\n",
          rl_opt_->state_size(), held);
    }
    std::array<double, 2> e1{};
    if (!o_.resume.empty()) {
      load_checkpoint(r);
      e1 = {r.acc_sft_sampled, r.acc_sft_greedy};
      say("resumed from %s after RL step %d\n", o_.resume.c_str(), first_step_);
    } else {
      sft(r);
      r.seconds_sft = seconds_since(t0);
      e1 = evaluate();
      r.acc_sft_sampled = e1[0];
      r.acc_sft_greedy = e1[1];
    }
    say("after SFT (%d steps, %.1f s): eval accuracy sampled %.3f, greedy %.3f\n", r.sft_steps,
        r.seconds_sft, e1[0], e1[1]);
    auto const t1 = clock_type::now();
    rl_phase(r);
    r.seconds_rl = seconds_since(t1);
    auto const e2 = evaluate();
    r.acc_rl_sampled = e2[0];
    r.acc_rl_greedy = e2[1];
    say("after RL (%d steps, %.1f s): eval accuracy sampled %.3f, greedy %.3f\n", o_.rl_steps,
        r.seconds_rl, e2[0], e2[1]);
    r.final_params.assign(replica_.params().begin(), replica_.params().end());
    return r;
  }

 private:
  static constexpr index_t kEvalChunk = 50;
  static constexpr int kGenGroups = 4;  // groups per decoder batch in RL rounds

  // Sequences per microbatch for a step of `groups` groups of `per` sequences: one group under
  // pp (the pipeline needs microbatches); otherwise a data-parallel share in one microbatch,
  // with at least two shares (one rank runs both halves, as two dp ranks run one each).
  [[nodiscard]] index_t microbatch(index_t groups, index_t per) const {
    if (o_.pp > 1) return per;
    index_t const shares = std::max(o_.dp, 2);
    return std::max<index_t>(1, (groups + shares - 1) / shares) * per;
  }

  //! The one chunk's store (pp 1, the engine, a one-chunk pipeline stage).
  nn::param_store<T>& store() { return stores_.front(); }

  //! AdamW over every chunk's parameters: replicated over the data group, or ZeRO-1 (--zero1).
  optimizer_t make_optimizer(optim::adamw_options const& ao) {
    // ZeRO-1 buckets of 16 Ki elements: several per chunk of this small model (Megatron's default,
    // 40 M, would put every chunk in one).
    constexpr std::size_t kBucket = std::size_t{1} << 14;
    return optimizer_t(std::span<nn::param_store<T>>(stores_), ao, *tp_, *data_, *model_group_,
                       *world_, p_.tp_rank, o_.zero1, kBucket);
  }

  //! `whole` (nn::gpt_layout) from stores laid out like stores_ (the chunks', then the
  //! vocabulary rows' under vocab-*), joined over the model group (collective over it).
  void gather_into(std::vector<nn::param_store<T>> const& from, nn::param_store<T>& whole) {
    std::vector<nn::param_store<T> const*> ptrs;
    for (std::size_t k = 0; k < chunks_.size(); ++k) ptrs.push_back(&from[k]);
    par::gpt_gather_replica(*model_group_, ptrs, whole, c_, chunks_,
                            p_.vocab_pipeline ? &from.back() : nullptr);
  }
  //! replica_ = the whole model from every chunk of the model group (collective over it).
  void gather_replica() { gather_into(stores_, replica_); }

  static index_t round_up(index_t n, index_t k) { return (n + k - 1) / k * k; }
  static double seconds_since(clock_type::time_point t) {
    return std::chrono::duration<double>(clock_type::now() - t).count();
  }
  template <class... A>
  void say(char const* fmt, A... a) const {
    if (world_->rank() != 0 || o_.quiet) return;
    std::printf(fmt, a...);
    std::fflush(stdout);
  }

  // A training sequence: the prompt, the response (or the SFT answer), PAD to seq_len_; the
  // targets are the response tokens at the positions that predict them.
  void append_sequence(problem p, std::span<std::int32_t const> response, int length,
                       std::vector<std::int32_t>& tokens,
                       std::vector<std::int32_t>& targets) const {
    auto const pr = prompt_of(p);
    auto const at = tokens.size();
    tokens.insert(tokens.end(), pr.begin(), pr.end());
    for (int t = 0; t < length; ++t) tokens.push_back(response[static_cast<std::size_t>(t)]);
    tokens.resize(at + static_cast<std::size_t>(seq_len_), kPad);
    targets.resize(tokens.size(), -1);
    for (int t = 0; t < length; ++t)
      targets[at + static_cast<std::size_t>(kPrompt - 1 + t)] =
          response[static_cast<std::size_t>(t)];
  }

  //! One optimizer step on `seqs` sequences (tokens/targets, seq_len_ each) cut into microbatches
  //! of `mb` sequences. This dp rank trains on its contiguous share; with one dp rank the share
  //! is accumulated in two halves summed at the end, as two dp ranks sum theirs, so dp 2 is bit
  //! for bit the single rank. `loss` (empty: cross-entropy with `ce_weight`) is the token loss of
  //! a microbatch's rows, called with the index of its first sequence. Returns {loss, grad norm}.
  std::array<double, 2> train_step(
      std::vector<std::int32_t> const& tokens, std::vector<std::int32_t> const& targets, index_t mb,
      double ce_weight, optimizer_t& opt, double lr, double max_norm,
      std::function<double(index_t first_seq, std::span<std::int64_t const>,
                           std::span<double const>, std::span<double>)> const& loss) {
    index_t const seqs = static_cast<index_t>(tokens.size()) / seq_len_;
    index_t const units = (seqs + mb - 1) / mb;  // microbatches of the whole step
    // This dp rank's microbatches [u0, u1), in one or two halves.
    index_t const u0 = units * dp_rank_ / o_.dp, u1 = units * (dp_rank_ + 1) / o_.dp;
    std::vector<std::pair<index_t, index_t>> halves;
    if (o_.dp == 1) {
      halves = {{u0, units / 2}, {units / 2, u1}};
    } else {
      halves = {{u0, u1}};
    }
    if (engine_)
      return engine_step(tokens, targets, seqs, mb, halves, ce_weight, opt.replicated(0), lr,
                         max_norm, loss);
    double loss_sum = 0;
    std::vector<std::vector<T>> first_half(stores_.size());
    for (auto& st : stores_) st.zero_grad();
    for (std::size_t h = 0; h < halves.size(); ++h) {
      auto const [a, b] = halves[h];
      if (h == 1)
        for (std::size_t k = 0; k < stores_.size(); ++k) {
          first_half[k].assign(stores_[k].grads().begin(), stores_[k].grads().end());
          stores_[k].zero_grad();
        }
      loss_sum += run_units(tokens, targets, seqs, mb, a, b, ce_weight, loss);
      if (h == 1)
        for (std::size_t k = 0; k < stores_.size(); ++k) {
          auto g = stores_[k].grads();
          for (std::size_t i = 0; i < g.size(); ++i) g[i] = first_half[k][i] + g[i];
        }
    }
    opt.reduce();
    double const norm = opt.clip(max_norm);
    opt.step(lr);
    gather_replica();
    return {step_loss(loss_sum), norm};
  }

  //! Microbatch u of a step's `seqs` sequences cut into microbatches of `mb`.
  [[nodiscard]] par::gpt_sequences microbatch_of(std::vector<std::int32_t> const& tokens,
                                                 std::vector<std::int32_t> const& targets,
                                                 index_t seqs, index_t mb, index_t u) const {
    index_t const first = u * mb, n = std::min(mb, seqs - first);
    auto const at = static_cast<std::size_t>(first * seq_len_);
    auto const len = static_cast<std::size_t>(n * seq_len_);
    return par::gpt_sequences{std::span(tokens).subspan(at, len),
                              std::span(targets).subspan(at, len), seq_len_};
  }

  //! The step's loss on every rank: the last stage's tp rank 0 of every data rank holds a part.
  double step_loss(double local) {
    double l = last_stage_ && p_.tp_rank == 0 ? local : 0.0;
    weft::comm::all_reduce(*world_, std::span<double>(&l, 1), weft::comm::reduce_kind::sum).wait();
    return l;
  }

  //! train_step on the engine (--device; data parallelism only): the same halves (or this dp
  //! rank's share), the dp all-reduce, clipping and AdamW step, with the parameters, gradients and
  //! optimizer state on the engine. `opt` is the host optimizer of the phase: its state goes to the
  //! engine when the phase's first step starts (and comes back only for a checkpoint,
  //! sync_engine_optimizer); the parameters come back after every step.
  std::array<double, 2> engine_step(
      std::vector<std::int32_t> const& tokens, std::vector<std::int32_t> const& targets,
      index_t seqs, index_t mb, std::vector<std::pair<index_t, index_t>> const& halves,
      double ce_weight, optim::adamw<T>& opt, double lr, double max_norm,
      std::function<double(index_t, std::span<std::int64_t const>, std::span<double const>,
                           std::span<double>)> const& loss) {
    auto& e = *engine_;
    if (!engine_params_) {
      e.set_params(store().params());
      engine_params_ = true;
    }
    if (engine_opt_ != &opt) {
      e.set_optimizer(opt.options(), opt.m(), opt.v(), opt.steps());
      engine_opt_ = &opt;
    }
    double loss_sum = 0;
    e.zero_grad();
    for (std::size_t h = 0; h < halves.size(); ++h) {
      auto const [a, b] = halves[h];
      if (h == 1) e.stash_grads();
      for (index_t u = a; u < b; ++u) {
        rlt::token_loss_fn tl;
        if (loss)
          tl = [&, first = u * mb](auto rows, auto logp, auto dlogp) {
            return loss(first, rows, logp, dlogp);
          };
        loss_sum += e.forward_backward(microbatch_of(tokens, targets, seqs, mb, u), ce_weight, tl);
      }
      if (h == 1) e.add_stash();
    }
    // Data parallelism: the ranks' gradients summed in place over NCCL where the data group has
    // one (every rank on its own GPU), else on the host (reduce_gpt_grads' all-reduce).
#if WEFT_TRAINER_NCCL
    if (nccl_) {
      auto const g = e.device_grads();
      auto const v = weft::comm::nccl::device_view(g.data, g.count, g.device);
      weft::comm::op_options oo;
      oo.stream = g.stream;  // the engine's: after its backward, before its clipping
      nccl_->all_reduce(v, v, weft::comm::reduce_kind::sum, oo).wait();
    } else
#endif
        if (data_->size() > 1) {
      engine_grads_.resize(store().grads().size());
      e.get_grads(engine_grads_);
      weft::comm::all_reduce(*data_, std::span<T>(engine_grads_), weft::comm::reduce_kind::sum)
          .wait();
      e.set_grads(engine_grads_);
    }
    double const norm = e.clip_grad_norm(max_norm);
    e.adamw_step(lr);
    e.get_params(store().params());
    gather_replica();
    return {step_loss(loss_sum), norm};
  }

  //! The decoder, reading the current parameters: an engine that does not hold store()'s yet (none
  //! stepped since the start or a resume) takes them first.
  rlt::model_decoder<T>& decoder() {
    if (engine_ && !engine_params_) {
      engine_->set_params(store().params());
      engine_params_ = true;
    }
    return *decoder_;
  }

#if WEFT_TRAINER_NCCL
  //! The data group over NCCL on the engines' GPUs (communicator::create over the host data group:
  //! rank 0's ncclUniqueId broadcast, then every rank joins on its engine's device). NCCL refuses
  //! two ranks on one GPU; create() then throws invalid_argument_error on every rank alike, and
  //! the gradients are summed on the host as without NCCL.
  void join_nccl() {
    try {
      nccl_ = std::make_unique<weft::comm::nccl::communicator>(
          weft::comm::nccl::communicator::create(*data_, engine_->device_grads().device));
      say("data-parallel gradients summed over NCCL (%d ranks)\n", data_->size());
    } catch (weft::invalid_argument_error const& e) {
      say("data-parallel gradients summed on the host: %s\n", e.what());
    }
  }
#endif

  //! The engine's optimizer state back into `opt` where the engine holds it (a checkpoint reads
  //! the host optimizer).
  void sync_engine_optimizer(optim::adamw<T>& opt) {
    if (engine_ && engine_opt_ == &opt) engine_->get_optimizer(opt);
  }

  // Forward and backward of microbatches [a, b) (accumulating); returns this rank's loss part.
  double run_units(std::vector<std::int32_t> const& tokens,
                   std::vector<std::int32_t> const& targets, index_t seqs, index_t mb, index_t a,
                   index_t b, double ce_weight,
                   std::function<double(index_t, std::span<std::int64_t const>,
                                        std::span<double const>, std::span<double>)> const& loss) {
    if (b <= a) return 0.0;
    auto const unit = [&](index_t u) { return microbatch_of(tokens, targets, seqs, mb, u); };
    if (model_) {
      double sum = 0;
      for (index_t u = a; u < b; ++u) {
        if (!loss) model_->set_token_loss({});
        if (loss)
          model_->set_token_loss([&, first = u * mb](auto rows, auto logp, auto dlogp) {
            return loss(first, rows, logp, dlogp);
          });
        sum += model_->forward(unit(u), ce_weight);
        model_->backward();
      }
      return sum;
    }
    int const m = static_cast<int>(b - a);
    typename par::gpt_pipeline_stage<T, Comm, Comm>::microbatch_loss_fn mloss;
    if (loss)
      mloss = [&](int i, auto rows, auto logp, auto dlogp) {
        return loss((a + i) * mb, rows, logp, dlogp);
      };
    // The step's schedule (a small DAPO batch may take make_schedule's fallback): it must place
    // the chunks where this rank's stores hold them.
    auto const sched = make_schedule(o_.schedule, o_.pp, m);
    auto const placed = par::gpt_chunks(p_, sched, pp_->rank());
    WEFT_EXPECTS(
        placed.size() == chunks_.size() &&
            std::equal(placed.begin(), placed.end(), chunks_.begin(),
                       [](auto const& x, auto const& y) { return x.pp_rank == y.pp_rank; }),
        "schedule", "the placement of the rank's chunks", o_.schedule);
    pl::step_options so;
    so.weighting = pl::loss_weighting::token_mean;
    so.total_tokens = 1.0 / ce_weight;  // w_i = ce_weight (unused under a token loss)
    auto const micro = [&](int i) { return unit(a + i); };
    pl::step_result r;
    if (p_.vocab_pipeline) {
      // The loss from the executor's C0: the cross-entropy (ignored targets skipped) or `loss`.
      par::gpt_pipeline_stage<T, Comm, Comm> stage(c_, p_, *tp_, *cp_, store(), micro);
      par::gpt_vocab_shard<T, Comm> shard(c_, p_, *tp_, stores_.back(), micro);
      so.token_loss = mloss ? shard.token_loss(mloss) : shard.cross_entropy(ce_weight);
      auto plan = pl::prepare_step(pl::lower(sched, pl::replay_model::executor()), pp_->rank(),
                                   stage, shard);
      r = pl::run_step(plan, stage, shard, *pp_, *vocab_channel_, so);
    } else if (chunks_.size() == 1) {
      par::gpt_pipeline_stage<T, Comm, Comm> stage(c_, p_, *tp_, *cp_, store(), micro, mloss);
      r = pl::run_step(pl::lower(sched, pl::replay_model::executor()), stage, *pp_, so);
    } else {
      std::vector<nn::param_store<T>*> ptrs;
      for (auto& st : stores_) ptrs.push_back(&st);
      par::gpt_pipeline_chunks<T, Comm, Comm> stage(c_, chunks_, *tp_, *cp_, ptrs, micro, mloss);
      r = pl::run_step(pl::lower(sched, pl::replay_model::executor()), stage, *pp_, so);
    }
    return r.has_loss ? r.loss : 0.0;
  }

  // Sampled exact match of `probs` (one sample each at temperature 1, coins from `s`, keys
  // offset by `key0`), or greedy; generation split over every rank in chunks of kEvalChunk.
  double accuracy(std::vector<problem> const& probs, weft::rng gen, std::uint64_t key0,
                  bool greedy) {
    auto const n = static_cast<index_t>(probs.size());
    double correct = 0;
    int chunk = 0;
    for (index_t at = 0; at < n; at += kEvalChunk, ++chunk) {
      if (chunk % world_->size() != world_->rank()) continue;
      index_t const k = std::min(kEvalChunk, n - at);
      std::vector<sample> out(static_cast<std::size_t>(k));
      std::vector<std::uint64_t> keys(static_cast<std::size_t>(k));
      std::iota(keys.begin(), keys.end(), key0 + static_cast<std::uint64_t>(at));
      generate(decoder(), std::span(probs).subspan(static_cast<std::size_t>(at), k), 1, keys, gen,
               greedy, out);
      for (auto const& s : out) correct += s.correct ? 1 : 0;
    }
    weft::comm::all_reduce(*world_, std::span<double>(&correct, 1), weft::comm::reduce_kind::sum)
        .wait();
    return correct / static_cast<double>(n);
  }

  std::array<double, 2> evaluate() {
    std::vector<problem> probs;
    for (int i = 0; i < o_.eval_prompts; ++i)
      probs.push_back(draw_problem(o_.seed, eval_prompts, static_cast<std::uint64_t>(i)));
    weft::rng const gen(o_.seed, eval_sampling);
    return {accuracy(probs, gen, 0, false), accuracy(probs, gen, 0, true)};
  }

  void sft(run_result& r) {
    optim::adamw_options ao;
    ao.lr = o_.sft_lr;
    ao.weight_decay = 0.0;
    auto opt = make_optimizer(ao);
    int const cap = o_.sft_steps > 0 ? o_.sft_steps : o_.sft_max_steps;
    int step = 0;
    for (; step < cap; ++step) {
      std::vector<std::int32_t> tokens, targets;
      for (int i = 0; i < o_.sft_batch; ++i) {
        auto const p =
            draw_problem(o_.seed, sft_prompts, static_cast<std::uint64_t>(step * o_.sft_batch + i));
        auto const ans = answer_of(p);
        append_sequence(p, ans, kMaxNew, tokens, targets);
      }
      double const w = 1.0 / static_cast<double>(o_.sft_batch * kMaxNew);
      auto const [loss, norm] =
          train_step(tokens, targets, microbatch(o_.sft_batch / 8, 8), w, opt, o_.sft_lr,
                     std::numeric_limits<double>::infinity(), {});  // SFT: no clipping
      (void)norm;
      if (o_.sft_steps == 0 && (step + 1) % o_.sft_eval_every == 0) {
        int const k = (step + 1) / o_.sft_eval_every;
        std::vector<problem> probs;
        for (int i = 0; i < o_.sft_eval_prompts; ++i)
          probs.push_back(draw_problem(o_.seed, sft_eval_prompts,
                                       static_cast<std::uint64_t>(k * o_.sft_eval_prompts + i)));
        double const acc = accuracy(
            probs, weft::rng(o_.seed, sft_eval_sampling),
            static_cast<std::uint64_t>(k) * static_cast<std::uint64_t>(o_.sft_eval_prompts), false);
        say("sft step %4d  loss %.4f  sampled exact match %.3f\n", step + 1, loss, acc);
        if (acc >= o_.sft_target) {
          ++step;
          break;
        }
      }
    }
    r.sft_steps = step;
    // opt ends here; RL has its own
    if (engine_ && engine_opt_ == &opt.replicated(0)) engine_opt_ = nullptr;
  }

  // Generates groups for prompts [uid0, uid0 + n) of this step: G samples each, in chunks of
  // kGenGroups groups, chunk j on rank j mod W; returns every group's samples on every rank.
  std::vector<sample> generate_round(std::uint64_t uid0, int n) {
    auto const g = static_cast<std::size_t>(o_.group);
    std::vector<double> words(static_cast<std::size_t>(n) * g * kSampleWords, 0.0);
    weft::rng const gen(o_.seed, rl_sampling);
    // Chunks of kGenGroups consecutive groups, chunk j on rank j mod W: a decoder batch never
    // depends on the layout, so neither do its rows' arithmetic and samples.
    for (int k0 = 0, chunk = 0; k0 < n; k0 += kGenGroups, ++chunk) {
      if (chunk % world_->size() != world_->rank()) continue;
      int const k1 = std::min(n, k0 + kGenGroups);
      std::vector<problem> probs;
      std::vector<std::uint64_t> keys;
      for (int k = k0; k < k1; ++k) {
        std::uint64_t const uid = uid0 + static_cast<std::uint64_t>(k);
        probs.push_back(draw_problem(o_.seed, rl_prompts, uid));
        for (std::size_t s = 0; s < g; ++s) keys.push_back(uid * g + s);
      }
      std::vector<sample> out(keys.size());
      generate(decoder(), probs, static_cast<index_t>(g), keys, gen, false, out);
      for (std::size_t i = 0; i < out.size(); ++i)
        pack(out[i], words.data() + (static_cast<std::size_t>(k0) * g + i) * kSampleWords);
    }
    // Every element has one writer: the sum is exact.
    weft::comm::all_reduce(*world_, std::span<double>(words), weft::comm::reduce_kind::sum).wait();
    std::vector<sample> all;
    for (std::size_t i = 0; i < words.size() / kSampleWords; ++i)
      all.push_back(unpack(words.data() + i * kSampleWords));
    return all;
  }

  void rl_phase(run_result& r) {
    auto& opt = *rl_opt_;
    bool const dapo = o_.mode == "dapo";
    rl::policy_loss_config pc;
    pc.clip_low = 0.2;
    pc.clip_high = dapo ? 0.28 : 0.2;
    pc.dual_clip = dapo ? 10.0 : std::numeric_limits<double>::infinity();
    pc.log_ratio_clamp = 20.0;
    auto const agg = dapo ? rl::loss_agg::token_mean : rl::loss_agg::seq_mean_token_mean;
    auto const g = static_cast<std::size_t>(o_.group);
    std::uint64_t& next_uid = next_uid_;
    double& generated_total = generated_total_;
    for (int step = first_step_; step < o_.rl_steps; ++step) {
      auto const t0 = clock_type::now();
      // ---- rollouts, dynamic sampling ----
      std::vector<sample> kept;
      std::uint64_t hash = 0xcbf29ce484222325ull;
      int rounds = 0, generated_groups = 0, zero_std_groups = 0;
      double kept_rate_num = 0, kept_rate_den = 0, round_acc = 0, round_reward = 0;
      int request = o_.prompts;
      while (true) {
        auto const round = generate_round(next_uid, request);
        next_uid += static_cast<std::uint64_t>(request);
        ++rounds;
        generated_groups += request;
        for (auto const& s : round) {
          // The rollout's discrete content: problem, tokens, length (log-probs vary by rounding).
          std::array<double, 7> w{double(s.p.a),       double(s.p.b),       double(s.tokens[0]),
                                  double(s.tokens[1]), double(s.tokens[2]), double(s.tokens[3]),
                                  double(s.length)};
          hash = hash_words(w, hash);
          round_acc += s.correct ? 1 : 0;
          round_reward += s.reward;
        }
        int kept_here = 0;
        for (int k = 0; k < request; ++k) {
          auto const first = round.begin() + static_cast<std::ptrdiff_t>(k * g);
          bool const varied =
              std::any_of(first, first + static_cast<std::ptrdiff_t>(g),
                          [&](sample const& s) { return s.reward != first->reward; });
          if (!varied) ++zero_std_groups;
          if (dapo && !varied) continue;
          ++kept_here;
          if (static_cast<int>(kept.size() / g) < o_.prompts)
            kept.insert(kept.end(), first, first + static_cast<std::ptrdiff_t>(g));
        }
        kept_rate_num += kept_here;
        kept_rate_den += request;
        int const missing = o_.prompts - static_cast<int>(kept.size() / g);
        if (!dapo || missing <= 0 || rounds >= o_.max_rounds) break;
        if (o_.refill == "sized") {
          // rl::dynamic_sampler::next_request's rule: ceil(missing / keep rate * 1.1).
          double const rate = kept_rate_num > 0 ? kept_rate_num / kept_rate_den : 0.0;
          request = rate > 0 ? static_cast<int>(std::ceil(missing / rate * 1.1)) : o_.prompts;
          request = std::clamp(request, 1, o_.prompts);
        }
      }
      double const gen_s = seconds_since(t0);
      double const samples_here = static_cast<double>(generated_groups) * static_cast<double>(g);
      generated_total += samples_here;
      r.rollout_hashes.push_back(hash);
      // ---- advantages, weights ----
      auto const kept_groups = static_cast<index_t>(kept.size() / g);
      std::vector<double> rewards, adv(kept.size());
      for (auto const& s : kept) rewards.push_back(s.reward);
      if (!kept.empty())
        rl::grpo_advantages(rewards, rl::group_layout::fixed(static_cast<index_t>(g)), adv,
                            rl::grpo_options{true, 1e-6});
      if (o_.zero_advantage) std::fill(adv.begin(), adv.end(), 0.0);
      // ---- update: mini-batches of whole groups ----
      auto const t1 = clock_type::now();
      rl::policy_metrics pm;
      double pg_loss = 0, grad_norm = 0, entropy = 0;
      int updates = 0;
      for (int mbi = 0; mbi < o_.minibatches; ++mbi) {
        // Contiguous halves of whole groups, the larger first (np.array_split's rule).
        index_t const ga = (kept_groups * mbi + o_.minibatches - 1) / o_.minibatches,
                      gb = (kept_groups * (mbi + 1) + o_.minibatches - 1) / o_.minibatches;
        if (gb <= ga) continue;
        auto const s0 = static_cast<std::size_t>(ga) * g, s1 = static_cast<std::size_t>(gb) * g;
        index_t const rows = static_cast<index_t>(s1 - s0);
        // Aggregation weights over the mini-batch's [rows, 4] response tokens.
        std::vector<std::uint8_t> mask(static_cast<std::size_t>(rows * kMaxNew), 0);
        std::vector<double> weights(mask.size(), 0.0), ent(mask.size(), 0.0);
        for (index_t i = 0; i < rows; ++i)
          for (int t = 0; t < kept[s0 + static_cast<std::size_t>(i)].length; ++t) {
            mask[static_cast<std::size_t>(i * kMaxNew + t)] = 1;
            ent[static_cast<std::size_t>(i * kMaxNew + t)] =
                kept[s0 + static_cast<std::size_t>(i)].entropy[static_cast<std::size_t>(t)];
          }
        auto const lay = rl::token_layout::padded(rows, kMaxNew);
        rl::aggregation_weights(agg, lay, mask, rl::count_tokens(lay, mask), weights);
        entropy += rl::weighted_sum(ent, weights);
        std::vector<std::int32_t> tokens, targets;
        for (auto i = s0; i < s1; ++i)
          append_sequence(kept[i].p, kept[i].tokens, kept[i].length, tokens, targets);
        rl::policy_metrics local;
        // The policy loss of a microbatch's rows (global token index n·S + position).
        auto const loss = [&](index_t first_seq, std::span<std::int64_t const> rws,
                              std::span<double const> logp, std::span<double> dlogp) {
          std::vector<double> lp, old, a, w, d;
          std::vector<std::size_t> where;
          for (std::size_t k = 0; k < rws.size(); ++k) {
            index_t const n = rws[k] / seq_len_, pos = rws[k] % seq_len_;
            index_t const t = pos - (kPrompt - 1);
            auto const i = static_cast<std::size_t>(first_seq + n);
            if (t < 0 || t >= kMaxNew || mask[i * kMaxNew + static_cast<std::size_t>(t)] == 0)
              continue;
            lp.push_back(logp[k]);
            old.push_back(kept[s0 + i].logp[static_cast<std::size_t>(t)]);
            a.push_back(adv[s0 + i]);
            w.push_back(weights[i * kMaxNew + static_cast<std::size_t>(t)]);
            where.push_back(k);
          }
          if (lp.empty()) return 0.0;
          std::vector<std::uint8_t> ones(lp.size(), 1);
          d.resize(lp.size());
          rl::policy_inputs<double, std::uint8_t> in{rl::arg::new_logp(lp), rl::arg::old_logp(old),
                                                     rl::arg::advantages(a), rl::arg::mask(ones),
                                                     rl::arg::weights(w)};
          auto const res = rl::policy_loss(
              pc, rl::token_layout::padded(1, static_cast<index_t>(lp.size())), in, d);
          for (std::size_t j = 0; j < where.size(); ++j) dlogp[where[j]] = d[j];
          if (p_.tp_rank == 0) local += res.metrics;
          return res.loss;
        };
        auto const [l, norm] =
            train_step(tokens, targets, microbatch(gb - ga, static_cast<index_t>(g)), 1.0, opt,
                       o_.rl_lr, 1.0, loss);
        r.losses.push_back(l);
        pm += all_reduce_metrics_world(local);
        pg_loss += l;
        grad_norm += norm;
        ++updates;
      }
      double const upd_s = seconds_since(t1);
      // ---- metrics ----
      step_metrics m;
      double len = 0, clipped = 0, score = 0, acc = 0;
      for (auto const& s : kept) {
        len += s.length;
        clipped += s.truncated ? 1 : 0;
        score += s.reward;
        acc += s.correct ? 1 : 0;
      }
      double const nk = std::max<double>(1.0, static_cast<double>(kept.size()));
      m.set("step", step + 1);
      m.set("samples", generated_total);
      m.set("rollout/acc", round_acc / samples_here);
      m.set("rollout/reward", round_reward / samples_here);
      m.set("critic/score/mean", score / nk);
      m.set("acc/mean", acc / nk);
      m.set("actor/entropy", updates > 0 ? entropy / updates : 0.0);
      m.set("actor/pg_loss", updates > 0 ? pg_loss / updates : 0.0);
      m.set("actor/pg_clipfrac", pm.pg_clipfrac());
      m.set("actor/pg_clipfrac_lower", pm.pg_clipfrac_lower());
      m.set("actor/ppo_kl", pm.ppo_kl());
      m.set("actor/grad_norm", updates > 0 ? grad_norm / updates : 0.0);
      m.set("actor/lr", o_.rl_lr);
      m.set("response_length/mean", len / nk);
      m.set("response_length/clip_ratio", clipped / nk);
      m.set("frac_reward_zero_std", static_cast<double>(zero_std_groups) / generated_groups);
      m.set("train/num_gen_batches", rounds);
      m.set("train/kept_groups", static_cast<double>(kept_groups));
      m.set("timing_s/gen", gen_s);
      m.set("timing_s/update_actor", upd_s);
      m.set("timing_s/step", seconds_since(t0));
      say("rl step %3d  reward %+.3f  acc %.3f  entropy %.3f  clip %.3f/%.3f  len %.2f  "
          "rounds %d  samples %.0f  %.2f s\n",
          step + 1, m.get("rollout/reward"), m.get("rollout/acc"), m.get("actor/entropy"),
          m.get("actor/pg_clipfrac"), m.get("actor/pg_clipfrac_lower"),
          m.get("response_length/mean"), rounds, generated_total, m.get("timing_s/step"));
      r.steps.push_back(std::move(m));
      bool const last = step + 1 == o_.rl_steps;
      if (!o_.save.empty() && (last || (o_.save_every > 0 && (step + 1) % o_.save_every == 0)))
        save_checkpoint(r, step + 1);
    }
    if (!o_.save.empty() && first_step_ >= o_.rl_steps) save_checkpoint(r, first_step_);
  }

  // ---- checkpoints: the whole model, at RL step boundaries (no rollout is pending then) ----
  template <class V>
  static void put(std::ofstream& f, V const& v) {
    f.write(reinterpret_cast<char const*>(&v), sizeof v);
  }
  template <class V>
  static void get(std::ifstream& f, V& v) {
    f.read(reinterpret_cast<char*>(&v), sizeof v);
  }
  static void put_string(std::ofstream& f, std::string const& s) {
    put(f, static_cast<std::uint64_t>(s.size()));
    f.write(s.data(), static_cast<std::streamsize>(s.size()));
  }
  static std::string get_string(std::ifstream& f) {
    std::uint64_t n = 0;
    get(f, n);
    if (!f || n > (1u << 20)) return {};
    std::string s(n, '\0');
    f.read(s.data(), static_cast<std::streamsize>(n));
    return s;
  }
  template <class V>
  static void put_span(std::ofstream& f, std::span<V const> v) {
    put(f, static_cast<std::uint64_t>(v.size()));
    f.write(reinterpret_cast<char const*>(v.data()), static_cast<std::streamsize>(v.size_bytes()));
  }
  // A vector of at most `limit` elements (a count over it, from a corrupt file, reads as none).
  template <class V>
  static std::vector<V> get_vector(std::ifstream& f, std::size_t limit) {
    std::uint64_t n = 0;
    get(f, n);
    if (!f || n > limit) return {};
    std::vector<V> v(n);
    f.read(reinterpret_cast<char*>(v.data()), static_cast<std::streamsize>(n * sizeof(V)));
    return v;
  }
  static constexpr char kMagic[9] = "WEFTRL02";
  static constexpr char kModelFile[] = "model.bin";

  //! The whole model's layout (nn::gpt_layout) of `parts`, one vector per store laid out like
  //! stores_[k] (its parameters, or AdamW moments of the same layout): every chunk's pieces and
  //! the vocabulary rows joined over the model group as the replica is (gather_into: exact).
  //! Collective over the model group.
  std::vector<T> gather_whole(std::vector<std::vector<T>> const& parts) {
    std::vector<nn::param_store<T>> held;
    held.reserve(stores_.size());
    for (std::size_t k = 0; k < stores_.size(); ++k) {
      held.emplace_back(stores_[k].layout());
      std::ranges::copy(parts[k], held.back().params().begin());
    }
    nn::param_store<T> whole(nn::gpt_layout(c_));
    gather_into(held, whole);
    return {whole.params().begin(), whole.params().end()};
  }

  //! gather_whole's inverse: this rank's part of every store (laid out like stores_[k]) cut out
  //! of a vector in the whole model's layout (gpt_load_shard, gpt_vocab_load).
  std::vector<std::vector<T>> scatter_whole(std::vector<T> const& all) {
    nn::param_store<T> whole(nn::gpt_layout(c_));
    std::ranges::copy(all, whole.params().begin());
    std::vector<std::vector<T>> parts;
    for (std::size_t k = 0; k < stores_.size(); ++k) {
      nn::param_store<T> part(stores_[k].layout());
      if (k < chunks_.size())
        par::gpt_load_shard(part, whole, c_, chunks_[k]);
      else
        par::gpt_vocab_load(part, whole, c_, p_);
      parts.emplace_back(part.params().begin(), part.params().end());
    }
    return parts;
  }

  //! A checkpoint: DIR/step_K/model.bin, the whole model (nn::gpt_layout's order) and its AdamW
  //! moments gathered from every rank's stores (and, under --zero1, over the data group), written
  //! by world rank 0 (every data rank holds the same state), then DIR/latest. The file has no
  //! layout in it: any layout resumes it (scatter_whole).
  void save_checkpoint(run_result const& r, int steps_done) {
    namespace fs = std::filesystem;
    auto const dir = fs::path(o_.save) / ("step_" + std::to_string(steps_done));
    // Rank 0 makes the folder; every rank learns whether it could.
    std::string made_error;
    if (world_->rank() == 0) try {
        fs::create_directories(dir);
      } catch (std::exception const& e) {
        made_error = e.what();
      }
    agree(made_error.empty(), "cannot create the checkpoint folder " + dir.string() +
                                  (made_error.empty() ? std::string() : ": " + made_error));
    // The whole moments, also under --zero1 (gathered over the data group), then over the
    // model group into the whole model's layout: collective on every rank.
    if (engine_) sync_engine_optimizer(rl_opt_->replicated(0));
    std::vector<std::vector<T>> m(stores_.size()), v(stores_.size());
    for (std::size_t k = 0; k < stores_.size(); ++k) rl_opt_->whole_state(k, m[k], v[k]);
    auto const moment1 = gather_whole(m);
    auto const moment2 = gather_whole(v);
    // Rank 0 writes model.bin.tmp, renames it model.bin (a checkpoint rewritten in place, the
    // step `latest` names, stays whole until the new one is), then commits `latest` the same way;
    // every rank learns the outcome (no rank waits in a collective that rank 0 left).
    std::string write_error;
    if (world_->rank() == 0) try {
        auto const file = dir / kModelFile;
        auto const part = dir / (std::string(kModelFile) + ".tmp");
        {
          std::ofstream f(part, std::ios::binary);
          f.write(kMagic, 8);
          put_string(f, fingerprint(o_));
          put(f, static_cast<std::int64_t>(steps_done));
          put(f, next_uid_);
          put(f, generated_total_);
          put(f, static_cast<std::int64_t>(r.sft_steps));
          put(f, r.acc_sft_sampled);
          put(f, r.acc_sft_greedy);
          put_span(f, std::span<T const>(replica_.params()));  // gathered after every step
          put_span(f, std::span<T const>(moment1));
          put_span(f, std::span<T const>(moment2));
          put(f, rl_opt_->steps());
          put(f, static_cast<std::uint64_t>(r.steps.size()));
          for (auto const& sm : r.steps) {
            put(f, static_cast<std::uint64_t>(sm.values.size()));
            for (auto const& [k, val] : sm.values) {
              put_string(f, k);
              put(f, val);
            }
          }
          f.close();
          if (!f) throw std::runtime_error("cannot write " + part.string());
        }
        fs::rename(part, file);
        auto const tmp = fs::path(o_.save) / "latest.tmp";
        {
          std::ofstream l(tmp);
          l << dir.filename().string() << "\n";
          l.close();
          if (!l) throw std::runtime_error("cannot write " + tmp.string());
        }
        fs::rename(tmp, fs::path(o_.save) / "latest");
      } catch (std::exception const& e) {
        write_error = e.what();
      }
    agree(write_error.empty(), "cannot write the checkpoint in " + dir.string() +
                                   (write_error.empty() ? std::string() : ": " + write_error));
  }

  // Every rank learns whether every rank succeeded (a failure on one rank must not leave the
  // others waiting in the next collective): the first failing rank's message on every rank, or
  // none. Collective over the world.
  std::optional<std::pair<int, std::string>> first_failure(bool ok, std::string const& what) {
    int first = ok ? world_->size() : world_->rank();
    weft::comm::all_reduce(*world_, std::span<int>(&first, 1), weft::comm::reduce_kind::min).wait();
    if (first == world_->size()) return std::nullopt;
    auto n = static_cast<std::int64_t>(what.size());
    weft::comm::broadcast(*world_, std::span<std::int64_t>(&n, 1), first).wait();
    std::vector<std::uint8_t> text(static_cast<std::size_t>(n));
    if (first == world_->rank()) std::ranges::copy(what, text.begin());
    weft::comm::broadcast(*world_, std::span<std::uint8_t>(text), first).wait();
    return std::pair{first, std::string(text.begin(), text.end())};
  }
  //! first_failure, thrown on every rank (the same runtime_error, naming the rank).
  void agree(bool ok, std::string const& what) {
    if (auto const e = first_failure(ok, what))
      throw std::runtime_error("rank " + std::to_string(e->first) + ": " + e->second);
  }

  void load_checkpoint(run_result& r) {
    std::string error;
    try {
      read_checkpoint(r);
    } catch (bad_argument const& e) {
      error = e.message;
    } catch (std::exception const& e) {
      error = e.what();
    }
    // Every rank reads the file: a rank that could not names why on all of them.
    if (auto const e = first_failure(error.empty(), error)) throw bad_argument{e->second};
    gather_replica();
  }

  void read_checkpoint(run_result& r) {
    namespace fs = std::filesystem;
    std::string name;
    std::ifstream(fs::path(o_.resume) / "latest") >> name;
    if (name.empty())
      throw bad_argument{
          "argument `--resume`: expected a folder with a committed checkpoint "
          "(its `latest` file), actual `" +
          o_.resume + "`"};
    auto const file = fs::path(o_.resume) / name / kModelFile;
    if (!fs::exists(file) && fs::exists(fs::path(o_.resume) / name / "rank_0.bin"))
      throw bad_argument{"argument `--resume`: expected a checkpoint of the whole model (" +
                         file.string() +
                         "), actual per-rank files (rank_R.bin) of an earlier rl_trainer: resume "
                         "them with the rl_trainer that wrote them"};
    std::ifstream f(file, std::ios::binary);
    char magic[8] = {};
    f.read(magic, 8);
    if (!f || std::string_view(magic, 8) != std::string_view(kMagic, 8))
      throw bad_argument{"argument `--resume`: expected a weft RL checkpoint (" +
                         std::string(kMagic, 8) + "), actual `" + file.string() + "`"};
    auto const fp = get_string(f);
    if (fp != fingerprint(o_))
      throw bad_argument{"argument `--resume`: expected a checkpoint of the same run (flags: " +
                         fingerprint(o_) + "), actual one of (" + fp + ")"};
    std::int64_t steps_done = 0, sft_steps = 0, adam_t = 0;
    std::uint64_t next_uid = 0;
    double generated_total = 0;
    std::array<double, 2> acc{};
    get(f, steps_done);
    get(f, next_uid);
    get(f, generated_total);
    get(f, sft_steps);
    get(f, acc[0]);
    get(f, acc[1]);
    auto const whole = replica_.params().size();
    auto const params = get_vector<T>(f, whole);
    auto const m = get_vector<T>(f, whole);
    auto const v = get_vector<T>(f, whole);
    get(f, adam_t);
    std::uint64_t rows = 0;
    get(f, rows);
    std::vector<step_metrics> history;
    for (std::uint64_t i = 0; f && i < rows && i <= (1u << 20); ++i) {
      std::uint64_t n = 0;
      get(f, n);
      step_metrics sm;
      for (std::uint64_t k = 0; f && k < n && k <= (1u << 10); ++k) {
        auto key = get_string(f);
        double val = 0;
        get(f, val);
        sm.values.emplace_back(std::move(key), val);
      }
      history.push_back(std::move(sm));
    }
    if (!f || params.size() != whole || m.size() != whole || v.size() != whole ||
        history.size() != rows || steps_done < 0 || rows != static_cast<std::uint64_t>(steps_done))
      throw bad_argument{"argument `--resume`: expected " + std::to_string(whole) +
                         " parameters and their moments in " + file.string() +
                         ", actual a truncated or other file"};
    // Nothing is changed before the file is read whole: this rank's pieces of every store.
    auto const mine = scatter_whole(params);
    auto const mine_m = scatter_whole(m);
    auto const mine_v = scatter_whole(v);
    for (std::size_t k = 0; k < stores_.size(); ++k) {
      rl_opt_->load_state(k, mine_m[k], mine_v[k], adam_t);
      std::ranges::copy(mine[k], stores_[k].params().begin());
    }
    next_uid_ = next_uid;
    generated_total_ = generated_total;
    r.acc_sft_sampled = acc[0];
    r.acc_sft_greedy = acc[1];
    r.steps = std::move(history);
    engine_params_ = false;  // the engine takes both again at the next step
    engine_opt_ = nullptr;
    first_step_ = static_cast<int>(steps_done);
    r.sft_steps = static_cast<int>(sft_steps);
  }

  rl::policy_metrics all_reduce_metrics_world(rl::policy_metrics const& local) {
    return rl::all_reduce_metrics(*world_, local);
  }

  options o_;
  nn::gpt_config c_;
  Comm* world_;
  weft::device_mesh<Comm> mesh_;
  Comm *tp_, *cp_, *pp_, *data_, *model_group_;
  par::gpt_parallelism p_;
  std::vector<par::gpt_parallelism> chunks_;  // the model chunks this rank holds (pp 1: one)
  std::vector<nn::param_store<T>> stores_;    // one per chunk (gpt_shard_layout(c_, chunks_[k])),
                                              // then the vocabulary rows under vocab-*
  std::optional<Comm> vocab_channel_;         // the vocabulary passes' collectives (vocab-*)
  nn::param_store<T> replica_;                // the whole model, for generation and the hash
  bool last_stage_ = false;                   // a chunk of this rank is the pipeline's last

  int dp_rank_;
  index_t seq_len_;
  std::optional<par::gpt<T, Comm, Comm>> model_;
  std::optional<optimizer_t> rl_opt_;               // the RL phase's
  std::unique_ptr<rlt::model_engine<T>> engine_;    // --device cpu-engine | cuda
  std::unique_ptr<rlt::model_decoder<T>> decoder_;  // the engine's, or the host's over replica_
#if WEFT_TRAINER_NCCL
  std::unique_ptr<weft::comm::nccl::communicator> nccl_;  // the data group over NCCL (or none)
#endif
  optim::adamw<T> const* engine_opt_ = nullptr;  // whose state the engine holds
  bool engine_params_ = false;                   // the engine holds store()'s parameters
  std::vector<T> engine_grads_;                  // host staging of the dp all-reduce
  std::uint64_t next_uid_ = 0;
  double generated_total_ = 0;
  int first_step_ = 0;
};

run_result train(options const& o) {
  run_result out;
  std::mutex m;
  weft::comm::threads::world(o.dp * o.pp * o.tp * o.cp).run([&](comm_t& world) {
    auto r = o.f64 ? trainer<double>(o, world).run() : trainer<float>(o, world).run();
    if (world.rank() == 0) {
      std::lock_guard lock(m);
      out = std::move(r);
    }
  });
  return out;
}

// ---- outputs
// --------------------------------------------------------------------------------------

void write_outputs(options const& o, run_result const& r) {
  namespace fs = std::filesystem;
  fs::create_directories(o.out);
  // A file that could not be written fully (a full disk, say) is an error, not a short file.
  auto const expect_written = [&](std::ofstream& f, char const* file) {
    f.flush();
    if (!f) throw std::runtime_error("cannot write " + (fs::path(o.out) / file).string());
  };
  {
    std::ofstream csv(fs::path(o.out) / "metrics.csv");
    if (!r.steps.empty()) {
      for (std::size_t k = 0; k < r.steps[0].values.size(); ++k)
        csv << (k ? "," : "") << r.steps[0].values[k].first;
      csv << "\n";
      for (auto const& s : r.steps) {
        for (std::size_t k = 0; k < s.values.size(); ++k)
          csv << (k ? "," : "") << s.values[k].second;
        csv << "\n";
      }
    }
    expect_written(csv, "metrics.csv");
  }
  {
    std::ofstream js(fs::path(o.out) / "summary.json");
    js << "{\n  \"mode\": \"" << o.mode << "\",\n  \"seed\": " << o.seed
       << ",\n  \"layout\": {\"dp\": " << o.dp << ", \"pp\": " << o.pp << ", \"tp\": " << o.tp
       << ", \"cp\": " << o.cp << ", \"sp\": " << (o.sp ? "true" : "false")
       << ", \"layers\": " << o.layers << ", \"schedule\": \"" << o.schedule << "\""
       << "},\n  \"device\": \"" << o.device << "\",\n  \"refill\": \"" << o.refill
       << "\",\n  \"zero_advantage\": " << (o.zero_advantage ? "true" : "false")
       << ",\n  \"sft_steps\": " << r.sft_steps << ",\n  \"rl_steps\": " << o.rl_steps
       << ",\n  \"samples_generated\": " << (r.steps.empty() ? 0.0 : r.steps.back().get("samples"))
       << ",\n  \"eval_prompts\": " << o.eval_prompts
       << ",\n  \"acc_after_sft\": {\"sampled\": " << r.acc_sft_sampled
       << ", \"greedy\": " << r.acc_sft_greedy
       << "},\n  \"acc_after_rl\": {\"sampled\": " << r.acc_rl_sampled
       << ", \"greedy\": " << r.acc_rl_greedy << "},\n  \"seconds\": {\"sft\": " << r.seconds_sft
       << ", \"rl\": " << r.seconds_rl
       << ", \"rl_per_step\": " << (o.rl_steps > 0 ? r.seconds_rl / o.rl_steps : 0.0) << "}\n}\n";
    expect_written(js, "summary.json");
  }
  // Plots: reward, accuracy, entropy and length against step and against samples generated.
  auto plot = [&](std::string const& x_key, std::string const& file) {
    std::vector<std::string> const keys{"rollout/reward", "rollout/acc", "actor/entropy",
                                        "response_length/mean"};
    int const w = 360, h = 220, pad = 40;
    std::ofstream svg(fs::path(o.out) / file);
    svg << "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"" << 2 * w << "\" height=\"" << 2 * h
        << "\" font-family=\"sans-serif\" font-size=\"11\">\n";
    for (std::size_t k = 0; k < keys.size(); ++k) {
      int const ox = static_cast<int>(k % 2) * w, oy = static_cast<int>(k / 2) * h;
      double x0 = 1e300, x1 = -1e300, y0 = 1e300, y1 = -1e300;
      for (auto const& s : r.steps) {
        x0 = std::min(x0, s.get(x_key));
        x1 = std::max(x1, s.get(x_key));
        y0 = std::min(y0, s.get(keys[k]));
        y1 = std::max(y1, s.get(keys[k]));
      }
      if (r.steps.empty() || !(x1 > x0)) x1 = x0 + 1;
      if (!(y1 > y0)) y1 = y0 + 1;
      svg << "<rect x=\"" << ox + pad << "\" y=\"" << oy + 10 << "\" width=\"" << w - pad - 10
          << "\" height=\"" << h - pad - 10 << "\" fill=\"none\" stroke=\"#999\"/>\n";
      svg << "<text x=\"" << ox + pad + 4 << "\" y=\"" << oy + 24 << "\">" << keys[k] << " (" << y0
          << " .. " << y1 << ") vs " << x_key << " (" << x0 << " .. " << x1
          << ")</text>\n<polyline fill=\"none\" stroke=\"#1f77b4\" points=\"";
      for (auto const& s : r.steps) {
        double const px = ox + pad + (s.get(x_key) - x0) / (x1 - x0) * (w - pad - 10);
        double const py = oy + 10 + (1 - (s.get(keys[k]) - y0) / (y1 - y0)) * (h - pad - 10);
        svg << px << "," << py << " ";
      }
      svg << "\"/>\n";
    }
    svg << "</svg>\n";
    expect_written(svg, file.c_str());
  };
  plot("step", "curves_by_step.svg");
  plot("samples", "curves_by_samples.svg");
}

// ---- the one-rank comparison
// ------------------------------------------------------------------------

int compare(options const& o, run_result const& got) {
  options one = o;
  one.dp = one.pp = one.tp = one.cp = 1;
  one.sp = false;
  one.quiet = true;
  one.device = "cpu";
  auto const ref = train(one);
  // cuda: other kernels, other rounding (f64 runs follow within the tolerance).
  // dp alone computes one rank's arithmetic; ZeRO-1 sums the gradient norm's squares in another
  // order (shard by shard), which clipping turns into last-bit differences.
  bool const bitwise =
      o.pp == 1 && o.tp == 1 && o.cp == 1 && o.dp <= 2 && o.device != "cuda" && !o.zero1;
  std::size_t same_rollouts = 0;
  while (same_rollouts < std::min(ref.rollout_hashes.size(), got.rollout_hashes.size()) &&
         ref.rollout_hashes[same_rollouts] == got.rollout_hashes[same_rollouts])
    ++same_rollouts;
  double worst = 0;
  std::size_t const compared = std::min<std::size_t>(
      {ref.losses.size(), got.losses.size(), 2 * std::max<std::size_t>(same_rollouts, 1)});
  for (std::size_t k = 0; k < compared && k < 2 * same_rollouts; ++k)
    worst = std::max(
        worst, std::abs(ref.losses[k] - got.losses[k]) / std::max(1e-3, std::abs(ref.losses[k])));
  bool const params_equal = ref.final_params == got.final_params;
  // The parameter that differs most (absolute), by name.
  {
    auto const lay = nn::gpt_layout(model_config(o.layers));
    double big = 0;
    std::string where = "-";
    for (auto const& e : lay.entries())
      for (std::size_t i = 0; i < e.info.count; ++i) {
        double const d = std::abs(double(ref.final_params[e.offset + i]) -
                                  double(got.final_params[e.offset + i]));
        if (d > big) {
          big = d;
          where = e.name + "[" + std::to_string(i) + "]";
        }
      }
    std::printf("check: largest parameter difference %.3g at %s\n", big, where.c_str());
  }
  std::printf(
      "check: one rank: SFT %d steps (layout %d); rollouts identical for %zu of %zu RL steps; "
      "largest relative loss difference over those steps %.3g; final parameters %s\n",
      ref.sft_steps, got.sft_steps, same_rollouts, ref.rollout_hashes.size(), worst,
      params_equal ? "bitwise equal" : "differ");
  int status = 0;
  std::size_t const need = std::min<std::size_t>(2, ref.rollout_hashes.size());
  // Losses: f64 keeps layouts within rounding of each other (4e-14 measured, 8e-10 on a GPU);
  // in f32 the rounding of a different summation order grows with depth (2.7e-4 at 8 layers, over
  // this bound: check deep layouts in f64).
  double const loss_tol = o.f64 ? 1e-6 : 1e-4;
  if (ref.sft_steps != got.sft_steps || same_rollouts < need || !(worst <= loss_tol)) status = 1;
  if (bitwise &&
      (!params_equal || same_rollouts != ref.rollout_hashes.size() || ref.losses != got.losses))
    status = 1;
  if (status) std::printf("FAILED: the layout left the one-rank run\n");
  return status;
}

}  // namespace

void print_header(options const& o) {
  std::printf(
      "rl_trainer: %s, seed %llu, pp %d x dp %d x cp %d x tp %d%s on %d %s%s; GPT %d layers d "
      "64, 2-digit addition; %d prompts x %d samples per round\n",
      o.mode.c_str(), static_cast<unsigned long long>(o.seed), o.pp, o.dp, o.cp, o.tp,
      o.sp ? " (+SP)" : "", o.dp * o.pp * o.cp * o.tp,
      o.backend == "mpi" ? "MPI processes" : "thread ranks",
      o.pp > 1 ? (", " + o.schedule).c_str() : "", o.layers, o.prompts, o.group);
  std::fflush(stdout);
}

// The end of a run, on the first rank: accuracies, parameter hash, outputs, the check.
int finish(options const& o, run_result const& r) {
  std::printf(
      "accuracy (%d held-out prompts): after SFT sampled %.3f greedy %.3f -> after RL "
      "sampled %.3f greedy %.3f; %.3f s per RL step\n",
      o.eval_prompts, r.acc_sft_sampled, r.acc_sft_greedy, r.acc_rl_sampled, r.acc_rl_greedy,
      o.rl_steps > 0 ? r.seconds_rl / o.rl_steps : 0.0);
  std::printf("final parameters: fnv1a %016llx\n",
              static_cast<unsigned long long>(hash_words(r.final_params, 0xcbf29ce484222325ull)));
  if (!o.out.empty()) write_outputs(o, r);
  if (o.check) return compare(o, r);
  return 0;
}

// --backend mpi: this process is one rank of MPI_COMM_WORLD (its size the layout's); the check
// runs the one-rank reference on threads in the first process.
int run_mpi(int& argc, char**& argv, options const& o) {
#if WEFT_HAS_MPI
  // The vocabulary-balanced schedules overlap their collectives with compute on a second thread,
  // which MPI allows under MPI_THREAD_MULTIPLE only (else the executor runs them blocking).
  bool const overlap = o.pp > 1 && vocab_schedule(o.schedule);
  weft::comm::mpi::environment env(&argc, &argv,
                                   overlap ? MPI_THREAD_MULTIPLE : MPI_THREAD_SERIALIZED);
  auto world = weft::comm::mpi::communicator::world();
  int const want = o.dp * o.pp * o.tp * o.cp;
  if (world.size() != want) {
    if (world.rank() == 0)
      std::cerr << "rl_trainer: MPI world size: expected dp x pp x tp x cp = " << want
                << " processes, actual " << world.size() << "\n";
    return 2;
  }
  // The output folders, checked by the first process (which writes --out and --save's
  // checkpoints); every process learns the outcome, so that none is left waiting in a collective.
  std::string folder_error;
  if (world.rank() == 0) try {
      check_output_folders(o);
    } catch (bad_argument const& e) {
      folder_error = e.message;
    }
  int failed = folder_error.empty() ? 0 : 1;
  weft::comm::all_reduce(world, std::span<int>(&failed, 1), weft::comm::reduce_kind::max).wait();
  if (failed) {
    if (world.rank() == 0) throw bad_argument{folder_error};
    return 2;
  }
  if (world.rank() == 0) print_header(o);
  auto const r = o.f64 ? trainer<double, weft::comm::mpi::communicator>(o, world).run()
                       : trainer<float, weft::comm::mpi::communicator>(o, world).run();
  // Only the first process reports (and runs the --check reference, which may take longer than
  // any deadline): mpiexec's exit status is non-zero when it fails.
  return world.rank() == 0 ? finish(o, r) : 0;
#else
  (void)argc;
  (void)argv;
  (void)o;
  throw bad_argument{
      "argument `--backend`: expected threads (this build has no MPI: weft::mpi was not found), "
      "actual `mpi`"};
#endif
}

int main(int argc, char** argv) {
  try {
    auto const o = parse(argc, argv);
    if (o.backend == "mpi") return run_mpi(argc, argv, o);
    check_output_folders(o);
    print_header(o);
    return finish(o, train(o));
  } catch (bad_argument const& e) {
    std::cerr << "rl_trainer: " << e.message << "\n";
    usage(std::cerr);
    return 2;
  } catch (weft::invalid_argument_error const& e) {
    std::cerr << "rl_trainer: " << e.what() << "\n";
    return 2;
  } catch (std::exception const& e) {
    std::cerr << "rl_trainer: " << e.what() << "\n";
    return 1;
  }
}
