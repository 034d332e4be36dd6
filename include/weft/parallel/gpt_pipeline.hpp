// weft/parallel/gpt_pipeline.hpp — parallel::gpt cut into pipeline stages for weft::pipeline's
// executor: a `Stage` whose rank holds one contiguous range of blocks (gpt_stage_layers), the
// first stage also the embeddings, the last the final norm, head and loss (cross-entropy or a
// token loss on the targets' log-probabilities), with one model
// instance per stash slot over the rank's one parameter store, so that every microbatch in
// flight keeps its own activations while the gradients accumulate in one buffer; and
// gpt_pipeline_chunks, the same for a rank that holds several chunks (virtual stages) of the
// model, as interleaved 1F1B, ZBV and DualPipeV place them, one parameter store per chunk.
#pragma once

#include <weft/comm/concepts.hpp>
#include <weft/core/dtype.hpp>
#include <weft/core/error.hpp>
#include <weft/nn/gpt.hpp>
#include <weft/nn/params.hpp>
#include <weft/parallel/gpt.hpp>
#include <weft/parallel/gpt_shard.hpp>
#include <weft/pipeline/schedule.hpp>
#include <weft/pipeline/stage.hpp>

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <span>
#include <utility>
#include <vector>

namespace weft::parallel {

//! One pipeline rank's share of a GPT (parallelism.pp stages, one chunk per rank: the plain
//! schedules GPipe, 1F1B, ZB-H1, ZB-H2; a rank of interleaved 1F1B, ZBV or DualPipeV holds one of
//! these per chunk in gpt_pipeline_chunks; the vocabulary-balanced schedules under
//! parallelism.vocab_pipeline, with a gpt_vocab_shard beside it) over its tensor-
//! and context-parallel groups. `microbatch(i)` gives microbatch i's sequences, the same on every
//! stage, and must stay valid during the step (the spans are read in forward and the shapes in
//! the layouts). The last stage's loss is Σ loss_weight · CE over its rows (the executor's
//! weights: token_mean with step_options::total_tokens = the step's targets over every data
//! rank gives the mean over the global batch).
//!
//! B runs the fused backward; a split schedule's I computes the input gradient and keeps each
//! layer's output gradient, and its W then computes the weight gradients from them (so the
//! zero-bubble schedules move that work into their bubbles, at the memory cost of the kept
//! gradients until W). The two forms give the same gradients bit for bit. Gradients accumulate
//! in `store`'s gradient buffer in microbatch order; zeroing them between steps, the
//! sequence-parallel and data-parallel reductions (reduce_gpt_grads) and the optimizer are the
//! caller's, after run_step.
template <class T, comm::CollectiveIn<host_space> TP, comm::PointToPointIn<host_space> CP>
class gpt_pipeline_stage {
 public:
  using stage_concept = pipeline::stage_tag;
  using model_type = gpt<T, TP, CP>;
  //! gpt::token_loss_fn with the microbatch's index first: the last stage's loss on the log-
  //! probabilities of microbatch i's targets (rows: global token indices within the microbatch).
  //! Empty: the cross-entropy weighted by the executor's loss weight.
  using microbatch_loss_fn =
      std::function<double(int microbatch, std::span<std::int64_t const> rows,
                           std::span<double const> logp, std::span<double> dlogp)>;

  gpt_pipeline_stage(nn::gpt_config const& config, gpt_parallelism const& parallelism, TP& tp,
                     CP& cp, nn::param_store<T>& store,
                     std::function<gpt_sequences(int)> microbatch,
                     microbatch_loss_fn token_loss = {})
      : c_(config),
        p_(parallelism),
        tp_(&tp),
        cp_(&cp),
        store_(&store),
        microbatch_(std::move(microbatch)),
        token_loss_(std::move(token_loss)) {
    WEFT_EXPECTS(static_cast<bool>(microbatch_), "microbatch", "a callable", "an empty function");
    WEFT_EXPECTS(!(token_loss_ && p_.vocab_pipeline), "token_loss",
                 "empty under vocab_pipeline (the executor computes the loss there: "
                 "step_options::token_loss, gpt_vocab_shard::token_loss)",
                 "a function");
    // One instance now, so that a wrong layout or store fails at construction.
    models_.push_back(std::make_unique<model_type>(c_, p_, *tp_, *cp_, *store_));
  }

  [[nodiscard]] gpt_parallelism const& parallelism() const noexcept { return p_; }
  //! The model instance of stash slot `slot` (its rows(), for instance).
  [[nodiscard]] model_type& model(int slot) { return *models_.at(static_cast<std::size_t>(slot)); }

  // Under vocabulary parallelism every rank is asked for the first stage's input and the last
  // stage's output (the vocabulary buffers' layouts: all of the microbatch's N rows, under
  // sequence parallelism too, gpt::vocab_boundary_size); between stages the boundary is
  // gpt::boundary_size (a token slice under sequence parallelism).
  [[nodiscard]] pipeline::message_layout input_layout(pipeline::stage_call const& c) const {
    check_layout_call(c);
    if (c.first_stage() && !p_.vocab_pipeline) return {0, dtype_of<T>};
    return {boundary(c.microbatch, c.first_stage()), dtype_of<T>};
  }
  [[nodiscard]] pipeline::message_layout output_layout(pipeline::stage_call const& c) const {
    check_layout_call(c);
    if (c.last_stage() && !p_.vocab_pipeline) return {0, dtype_of<T>};
    return {boundary(c.microbatch, c.last_stage()), dtype_of<T>};
  }

  void reserve_slots(int chunk, int slots) {
    WEFT_EXPECTS(chunk == 0, "chunk",
                 "0 (gpt_pipeline_stage holds one chunk per rank: gpt_pipeline_chunks holds "
                 "several)",
                 chunk);
    WEFT_EXPECTS(slots >= 1, "slots", ">= 1", slots);
    while (models_.size() < static_cast<std::size_t>(slots))
      models_.push_back(std::make_unique<model_type>(c_, p_, *tp_, *cp_, *store_));
  }

  double forward(pipeline::stage_call const& c, comm::buffer_view in, comm::buffer_view out) {
    check(c);
    auto& m = slot(c);
    if (token_loss_ && c.last_stage()) {
      m.set_token_loss([this, i = c.microbatch](
                           std::span<std::int64_t const> rows, std::span<double const> logp,
                           std::span<double> dlogp) { return token_loss_(i, rows, logp, dlogp); });
    }
    return m.forward_stage(microbatch_(c.microbatch), c.loss_weight, typed<T const>(in),
                           typed<T>(out));
  }
  void backward(pipeline::stage_call const& c, comm::buffer_view dout, comm::buffer_view din) {
    check(c);
    slot(c).backward_stage(typed<T const>(dout), typed<T>(din));
  }
  //! I of a split backward: the input gradient, the weight gradients kept for backward_weight
  //! (gpt::backward_input_stage).
  void backward_input(pipeline::stage_call const& c, comm::buffer_view dout,
                      comm::buffer_view din) {
    check(c);
    slot(c).backward_input_stage(typed<T const>(dout), typed<T>(din));
  }
  //! W: the weight gradients backward_input kept, accumulated into the store.
  void backward_weight(pipeline::stage_call const& c) {
    check(c);
    slot(c).backward_weight_stage();
  }

 private:
  void check_stages(pipeline::stage_call const& c) const {
    WEFT_EXPECTS(c.num_stages == p_.pp, "stage_call::num_stages",
                 ::weft::detail::concat(p_.pp, " (parallelism.pp: the schedule's stages)"),
                 c.num_stages);
    WEFT_EXPECTS(c.stage >= 0 && c.stage < p_.pp, "stage_call::stage",
                 ::weft::detail::concat("in [0, ", p_.pp, ")"), c.stage);
  }
  void check_layout_call(pipeline::stage_call const& c) const {
    if (p_.vocab_pipeline)
      check_stages(c);
    else
      check(c);
  }
  void check(pipeline::stage_call const& c) const {
    check_stages(c);
    WEFT_EXPECTS(c.stage == p_.pp_rank, "stage_call::stage",
                 ::weft::detail::concat(p_.pp_rank, " (parallelism.pp_rank)"), c.stage);
  }
  // `vocab_end`: the first stage's input or the last stage's output.
  [[nodiscard]] std::size_t boundary(int microbatch, bool vocab_end) const {
    auto const b = microbatch_(microbatch);
    WEFT_EXPECTS_SHAPE(b.seq_len > 0, "microbatch(i).seq_len", "> 0", b.seq_len);
    index_t const seqs = static_cast<index_t>(b.tokens.size()) / b.seq_len;
    auto const& m = *models_.front();
    return vocab_end && p_.vocab_pipeline ? m.vocab_boundary_size(seqs, b.seq_len)
                                          : m.boundary_size(seqs, b.seq_len);
  }
  model_type& slot(pipeline::stage_call const& c) {
    WEFT_EXPECTS(c.slot >= 0 && static_cast<std::size_t>(c.slot) < models_.size(),
                 "stage_call::slot", ::weft::detail::concat("in [0, ", models_.size(), ")"),
                 c.slot);
    return *models_[static_cast<std::size_t>(c.slot)];
  }
  template <class U>
  static std::span<U> typed(comm::buffer_view v) {
    if (v.count > 0)
      WEFT_EXPECTS(v.type == dtype_of<std::remove_const_t<U>>, "message type",
                   name(dtype_of<std::remove_const_t<U>>), name(v.type));
    return {static_cast<U*>(v.data), v.count};
  }

  nn::gpt_config c_;
  gpt_parallelism p_;
  TP* tp_;
  CP* cp_;
  nn::param_store<T>* store_;
  std::function<gpt_sequences(int)> microbatch_;
  microbatch_loss_fn token_loss_;
  std::vector<std::unique_ptr<model_type>> models_;
};

//! The parallelism of each chunk pipeline rank `rank` holds under schedule `s`, in chunk order:
//! `base`'s tensor, context and sequence-parallel settings with pp = s.num_stages() (the model's
//! blocks split over every virtual stage, gpt_stage_layers) and pp_rank = that chunk's stage
//! (schedule::stage_at). One chunk per rank (GPipe, 1F1B, ZB-H1/H2) gives {base with pp = p and
//! pp_rank = rank}. Each chunk's parameters are laid out by gpt_shard_layout(config, chunk).
[[nodiscard]] inline std::vector<gpt_parallelism> gpt_chunks(gpt_parallelism const& base,
                                                             pipeline::schedule const& s,
                                                             int rank) {
  std::vector<gpt_parallelism> out;
  for (int k = 0; k < s.num_chunks(); ++k) {
    gpt_parallelism q = base;
    q.pp = s.num_stages();
    q.pp_rank = s.stage_at(rank, k);
    out.push_back(q);
  }
  return out;
}

//! A pipeline rank that holds several chunks of a GPT (interleaved 1F1B: v chunks in a loop; ZBV
//! and DualPipeV: two in a V): chunk k is gpt_pipeline_stage over `chunks[k]` (gpt_chunks: pp =
//! the schedule's stages, pp_rank = the chunk's stage) and its own parameter store `stores[k]`,
//! and every call goes to the chunk stage_call::chunk names. The virtual stages hold contiguous
//! block ranges in stage order, so the model is the one a plain pipeline of that many stages
//! would hold, and a step gives its numbers. Everything else is gpt_pipeline_stage's: the
//! microbatches, the token loss, the fused or split backward, gradients accumulated per chunk in
//! microbatch order, the reductions and the optimizer the caller's (per store; clip over all
//! of a rank's stores with optim::clip_grad_norm over grad_group).
template <class T, comm::CollectiveIn<host_space> TP, comm::PointToPointIn<host_space> CP>
class gpt_pipeline_chunks {
 public:
  using stage_concept = pipeline::stage_tag;
  using chunk_type = gpt_pipeline_stage<T, TP, CP>;
  using microbatch_loss_fn = typename chunk_type::microbatch_loss_fn;

  //! invalid_argument_error when `chunks` is empty, its sizes differ from `stores`', a store is
  //! null, two chunks name the same stage, or the chunks disagree on anything but pp_rank; a
  //! store whose layout is not gpt_shard_layout(config, chunks[k]) is refused by its chunk.
  gpt_pipeline_chunks(nn::gpt_config const& config, std::vector<gpt_parallelism> const& chunks,
                      TP& tp, CP& cp, std::vector<nn::param_store<T>*> const& stores,
                      std::function<gpt_sequences(int)> microbatch,
                      microbatch_loss_fn token_loss = {}) {
    WEFT_EXPECTS(!chunks.empty(), "chunks", "at least one chunk", "none");
    WEFT_EXPECTS_SHAPE(stores.size() == chunks.size(), "stores",
                       ::weft::detail::concat(chunks.size(), " (one per chunk)"), stores.size());
    for (std::size_t k = 0; k < chunks.size(); ++k) {
      auto const& q = chunks[k];
      WEFT_EXPECTS(stores[k] != nullptr, "stores", "a store per chunk",
                   ::weft::detail::concat("null at chunk ", k));
      detail::check_chunk(chunks, k);
      chunks_.push_back(
          std::make_unique<chunk_type>(config, q, tp, cp, *stores[k], microbatch, token_loss));
    }
  }

  [[nodiscard]] int num_chunks() const noexcept { return static_cast<int>(chunks_.size()); }
  //! Chunk k's stage (its stash slots' model instances, its parallelism).
  [[nodiscard]] chunk_type& chunk(int k) { return *chunks_.at(static_cast<std::size_t>(k)); }

  [[nodiscard]] pipeline::message_layout input_layout(pipeline::stage_call const& c) const {
    return of(c).input_layout(c);
  }
  [[nodiscard]] pipeline::message_layout output_layout(pipeline::stage_call const& c) const {
    return of(c).output_layout(c);
  }
  void reserve_slots(int chunk, int slots) {
    WEFT_EXPECTS(chunk >= 0 && chunk < num_chunks(), "chunk",
                 ::weft::detail::concat("in [0, ", num_chunks(), ")"), chunk);
    chunks_[static_cast<std::size_t>(chunk)]->reserve_slots(0, slots);
  }
  double forward(pipeline::stage_call const& c, comm::buffer_view in, comm::buffer_view out) {
    return of(c).forward(c, in, out);
  }
  void backward(pipeline::stage_call const& c, comm::buffer_view dout, comm::buffer_view din) {
    of(c).backward(c, dout, din);
  }
  void backward_input(pipeline::stage_call const& c, comm::buffer_view dout,
                      comm::buffer_view din) {
    of(c).backward_input(c, dout, din);
  }
  void backward_weight(pipeline::stage_call const& c) { of(c).backward_weight(c); }

 private:
  // The chunk a call is for; its stage_call::stage is checked by the chunk (its pp_rank).
  chunk_type& of(pipeline::stage_call const& c) const {
    WEFT_EXPECTS(c.chunk >= 0 && c.chunk < num_chunks(), "stage_call::chunk",
                 ::weft::detail::concat("in [0, ", num_chunks(), ")"), c.chunk);
    return *chunks_[static_cast<std::size_t>(c.chunk)];
  }

  std::vector<std::unique_ptr<chunk_type>> chunks_;
};

}  // namespace weft::parallel
