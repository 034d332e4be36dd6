// weft/parallel/gpt_vocab.hpp — the vocabulary shard of a GPT under the vocabulary-balanced
// pipeline schedules (pipeline::vocab_one_f_one_b; reference note pipeline.md section 2.5): every
// pipeline rank holds V/p rows of the token embedding "wte" and of the output layer "head",
// split again over its tensor-parallel ranks (V/(p·tp) each: gpt_vocab_rows, gpt_vocab_layout),
// and runs the executor's vocabulary passes on them: IF (the embedding rows of the tokens it
// owns), IB (their gradient), S (its logits' per-token max, sum of exponentials and target logit)
// and T (the output layer's gradient, and the input gradient for the two-barrier variant). The
// stages (gpt_pipeline_stage over gpt_parallelism::vocab_pipeline) run the blocks, the position
// embedding and the final norm.
#pragma once

#include <weft/comm/collectives.hpp>
#include <weft/comm/concepts.hpp>
#include <weft/core/dtype.hpp>
#include <weft/core/error.hpp>
#include <weft/core/tensor/view.hpp>
#include <weft/nn/gpt.hpp>
#include <weft/nn/linear.hpp>
#include <weft/nn/params.hpp>
#include <weft/parallel/gpt.hpp>
#include <weft/parallel/gpt_shard.hpp>
#include <weft/parallel/vocab.hpp>
#include <weft/rl/logprobs.hpp>
#include <weft/pipeline/stage.hpp>
#include <weft/pipeline/vocab_stats.hpp>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <span>
#include <type_traits>
#include <utility>
#include <vector>

namespace weft::parallel {

namespace detail {
//! gpt_vocab_shard's tensor-parallel group type where there is none (tp = 1).
struct no_tp_group {};
}  // namespace detail

//! The vocabulary shard of pipeline rank p.pp_rank, tp rank p.tp_rank of a GPT (p.vocab_pipeline;
//! any tp, sequence parallelism and cp): a pipeline::VocabShard over `store` (laid out by
//! gpt_vocab_layout(config, p): rows gpt_vocab_rows(config, p) of "wte" and "head").
//! `microbatch(i)` gives microbatch i's sequences, the same as the stages'; a cp rank works on its
//! own rows, in the stages' order (gpt::rows()), all of them under sequence parallelism too.
//! Buffers are T, the stages' boundary type. The gradients accumulate in `store`'s gradient
//! buffer in microbatch order; zeroing them, the reduction over the data group (dp x cp:
//! reduce_gpt_grads) and the optimizer are the caller's, as for the stages' stores.
//!
//! Tensor parallelism (TP: the rank's tp group, of p.tp ranks). The executor's collectives run
//! over the pipeline ranks of one tp index (a vocabulary channel per tp rank), so each pass hands
//! the executor its pipeline rank's result, combined over tp by the shard itself, collective over
//! `tp` in the same order on its ranks: IF sums the embeddings (one SUM all-reduce of n x d), S
//! combines the statistics as C0 does over the pipeline (a MAX all-reduce of the maxima, then one
//! SUM all-reduce of the rescaled sums, the target logits and, one barrier, G and H), T sums the
//! input gradient (two barriers: a SUM all-reduce of n x d). IB and the output layer's gradient
//! need nothing. Without a tp group (the constructor without `tp`) p.tp must be 1.
//!
//! The loss. The executor's built-in cross-entropy counts every token; a microbatch with ignored
//! targets (-1) needs a step_options::token_loss: cross_entropy(weight) gives the GPT's, and
//! token_loss(fn) adapts a gpt_pipeline_stage::microbatch_loss_fn (rows and log-probabilities as
//! the GPT's last stage gives them). A token without a target whose loss-gradient weight is not
//! 0 fails the step (T throws invalid_argument_error on every rank, naming it).
template <class T, class TP = detail::no_tp_group>
class gpt_vocab_shard {
  static_assert(std::is_same_v<T, float> || std::is_same_v<T, double>,
                "weft::parallel::gpt_vocab_shard<T>: T must be float or double");
  static constexpr bool has_tp = !std::is_same_v<TP, detail::no_tp_group>;
  static_assert(!has_tp || comm::CollectiveIn<TP, host_space>,
                "weft::parallel::gpt_vocab_shard<T, TP>: TP must be a host collective group");

 public:
  using vocab_concept = pipeline::vocab_tag;
  //! gpt_pipeline_stage's microbatch_loss_fn: (microbatch, rows, logp, dlogp) -> loss.
  using microbatch_loss_fn =
      std::function<double(int microbatch, std::span<std::int64_t const> rows,
                           std::span<double const> logp, std::span<double> dlogp)>;
  //! step_options::token_loss's type.
  using token_loss_fn =
      std::function<double(int microbatch, std::span<double const> logp, std::span<double> dlogp)>;

  //! tp = 1 (parallelism.tp must be 1).
  gpt_vocab_shard(nn::gpt_config const& config, gpt_parallelism const& parallelism,
                  nn::param_store<T>& store,
                  std::function<gpt_sequences(int)> microbatch) requires(!has_tp)
      : gpt_vocab_shard(config, parallelism, nullptr, store, std::move(microbatch)) {}

  //! Over the tensor-parallel group `tp` (parallelism.tp and tp_rank must be its size and rank).
  gpt_vocab_shard(nn::gpt_config const& config, gpt_parallelism const& parallelism, TP& tp,
                  nn::param_store<T>& store,
                  std::function<gpt_sequences(int)> microbatch) requires has_tp
      : gpt_vocab_shard(config, parallelism, &tp, store, std::move(microbatch)) {}

  //! The vocabulary rows this shard holds (gpt_vocab_rows).
  [[nodiscard]] rl::vocab_shard const& vocab_rows() const noexcept { return rows_; }

  // ---- pipeline::VocabShard ----
  [[nodiscard]] std::size_t tokens(pipeline::stage_call const& c) const {
    auto const b = microbatch_(c.microbatch);
    WEFT_EXPECTS_SHAPE(b.seq_len > 0, "microbatch(i).seq_len", "> 0", b.seq_len);
    return b.tokens.size() / static_cast<std::size_t>(p_.cp);
  }
  [[nodiscard]] std::size_t hidden() const noexcept { return static_cast<std::size_t>(c_.d_model); }

  //! IF: the embedding rows of the tokens this shard owns, zeros for the others.
  void input_forward(pipeline::stage_call const& c, comm::buffer_view partial) {
    load(c);
    auto const out = matrix(partial, "partial");
    detail::masked_lookup(std::span<std::int32_t const>(tokens_), rows_,
                          tensor_view<T const, 2>(store_->template param<2>("wte")), out);
    tp_sum(std::span<T>(out.data_handle(), partial.count));
  }
  //! IB: adds the owned rows of `grad` (the embedding output's gradient) into "wte"'s gradient.
  void input_backward(pipeline::stage_call const& c, comm::buffer_view grad) {
    load(c);
    detail::scatter_add_rows(std::span<std::int32_t const>(tokens_), rows_,
                             tensor_view<T const, 2>(matrix(grad, "grad")),
                             store_->template grad<2>("wte"));
  }

  //! S: this shard's logits of x and their statistics (pipeline::VocabShard). Keeps, until T,
  //! e_tv = exp(Y_tv - m_t) and the shard's maxima m_t (the exponentials are computed once).
  void output_forward(pipeline::stage_call const& c, comm::buffer_view x, comm::buffer_view stats) {
    load(c);
    auto const n = static_cast<index_t>(tokens_.size());
    index_t const d = c_.d_model, vs = rows_.size;
    auto const xv = matrix(x, "x");
    bool const one = stats.count == static_cast<std::size_t>(3 * n + 2 * n * d);
    WEFT_EXPECTS_SHAPE(one || stats.count == static_cast<std::size_t>(3 * n), "stats",
                       ::weft::detail::concat(3 * n, " or ", 3 * n + 2 * n * d, " elements"),
                       stats.count);
    expect_type(stats, "stats");
    auto& kept = kept_[c.microbatch];
    auto& e = kept.e;
    e.assign(static_cast<std::size_t>(n * vs), T(0));
    kept.max.assign(static_cast<std::size_t>(n), T(0));
    auto const head = tensor_view<T const, 2>(store_->template param<2>("head"));
    nn::linear_forward(tensor_view<T const, 2>(xv), head, nn::no_bias<T>(),
                       tensor_view<T, 2>(e.data(), n, vs));
    T* st = static_cast<T*>(stats.data);
    // rl's row statistics (the log-prob kernels' vectorised sweep): the max, the sum of
    // exponentials and each e^{Y - m_c} relative to its chunk's max m_c, moved onto the row's max.
    // A NaN logit makes the row's statistics NaN, as under the other schedules.
    saved_.resize(static_cast<std::size_t>(vs));
    chunk_max_.resize(
        static_cast<std::size_t>((vs + rl::detail::logit_chunk - 1) / rl::detail::logit_chunk));
    for (index_t t = 0; t < n; ++t) {
      T* row = e.data() + t * vs;
      auto const target = owned_target(t);
      st[2 * n + t] = target ? row[*target] : T(0);
      auto const stat =
          rl::detail::row_stats_saved(row, vs, T(1), saved_.data(), chunk_max_.data());
      for (index_t c0 = 0; c0 < vs; c0 += rl::detail::logit_chunk) {
        auto const f = static_cast<T>(std::exp(
            chunk_max_[static_cast<std::size_t>(c0 / rl::detail::logit_chunk)] - stat.max));
        index_t const end = std::min(vs, c0 + rl::detail::logit_chunk);
        for (index_t v = c0; v < end; ++v) row[v] = saved_[static_cast<std::size_t>(v)] * f;
      }
      st[t] = static_cast<T>(stat.max);
      st[n + t] = static_cast<T>(stat.sum);
      kept.max[static_cast<std::size_t>(t)] = static_cast<T>(stat.max);
    }
    if (one) {
      // G = E W (the exponentials times the rows), H = the target's row (0 where not owned).
      tensor_view<T, 2> const g(st + 3 * n, n, d), h(st + 3 * n + n * d, n, d);
      nn::linear_backward_input(tensor_view<T const, 2>(e.data(), n, vs), head, g);
      for (index_t t = 0; t < n; ++t) {
        auto const target = owned_target(t);
        T* out = h.data_handle() + t * d;
        if (target)
          std::copy_n(head.data_handle() + *target * d, d, out);
        else
          std::fill_n(out, d, T(0));
      }
    }
    tp_combine_stats(st, static_cast<std::size_t>(n), stats.count, one ? d : 0);
  }

  //! T: adds this shard's output-layer gradient and, for the two-barrier variant, writes dx:
  //! dY_tv = g_t (e_tv exp(m_t - max_t) / sumexp_t - onehot_tv).
  void output_backward(pipeline::stage_call const& c, comm::buffer_view x, comm::buffer_view g,
                       comm::buffer_view max, comm::buffer_view sumexp, comm::buffer_view dx) {
    load(c);
    auto it = kept_.find(c.microbatch);
    WEFT_EXPECTS(it != kept_.end(), "output_backward", "an output_forward of the microbatch first",
                 ::weft::detail::concat("none for microbatch ", c.microbatch));
    auto const n = static_cast<index_t>(tokens_.size());
    index_t const vs = rows_.size;
    for (auto [v, what] : {std::pair{g, "g"}, std::pair{max, "max"}, std::pair{sumexp, "sumexp"}}) {
      WEFT_EXPECTS_SHAPE(v.count == static_cast<std::size_t>(n), what,
                         ::weft::detail::concat(n, " elements"), v.count);
      expect_type(v, what);
    }
    auto const* gv = static_cast<T const*>(g.data);
    auto const* mv = static_cast<T const*>(max.data);
    auto const* sv = static_cast<T const*>(sumexp.data);
    for (index_t t = 0; t < n; ++t)
      if (targets_[static_cast<std::size_t>(t)] < 0 && gv[t] != T(0))
        WEFT_THROW(invalid_argument_error, "gpt_vocab_shard: microbatch ", c.microbatch, ", row ",
                   t, " has no target (-1) but the loss-gradient weight ", gv[t],
                   ": with ignored targets give step_options::token_loss "
                   "(gpt_vocab_shard::cross_entropy or token_loss), which gives them 0");
    auto& y = it->second.e;  // becomes dY in place
    auto const& local_max = it->second.max;
    for (index_t t = 0; t < n; ++t) {
      T* row = y.data() + t * vs;
      double const gt = gv[t];
      auto const scale =
          static_cast<T>(gt *
                         std::exp(static_cast<double>(local_max[static_cast<std::size_t>(t)]) -
                                  static_cast<double>(mv[t])) /
                         static_cast<double>(sv[t]));
      for (index_t v = 0; v < vs; ++v) row[v] *= scale;
      if (auto const target = owned_target(t)) row[*target] -= static_cast<T>(gt);
    }
    tensor_view<T const, 2> const dy(y.data(), n, vs);
    nn::linear_backward_weight(dy, tensor_view<T const, 2>(matrix(x, "x")),
                               store_->template grad<2>("head"), nn::no_bias_grad<T>());
    if (dx.count > 0) {
      auto const out = matrix(dx, "dx");
      nn::linear_backward_input(dy, tensor_view<T const, 2>(store_->template param<2>("head")),
                                out);
      tp_sum(std::span<T>(out.data_handle(), dx.count));
    }
    kept_.erase(it);
  }

  // ---- the loss ----
  //! The GPT's rows of microbatch i on this cp rank (gpt::rows(): n·S + position), in the order
  //! of the executor's log-probabilities.
  [[nodiscard]] std::vector<std::int64_t> rows(int microbatch) {
    load_rows(microbatch);
    return global_rows_;
  }

  //! step_options::token_loss for `fn` (a gpt_pipeline_stage::microbatch_loss_fn): called with
  //! this cp rank's rows, logp 0 where the target is -1, and its dlogp read only where the
  //! target is >= 0, as on the GPT's last stage. The function refers to this shard.
  [[nodiscard]] token_loss_fn token_loss(microbatch_loss_fn fn) {
    WEFT_EXPECTS(static_cast<bool>(fn), "fn", "a callable", "an empty function");
    return
        [this, fn = std::move(fn)](int i, std::span<double const> logp, std::span<double> dlogp) {
          load_rows(i);
          WEFT_EXPECTS_SHAPE(logp.size() == targets_.size(), "logp",
                             ::weft::detail::concat(targets_.size(), " elements"), logp.size());
          masked_.assign(logp.begin(), logp.end());
          for (std::size_t k = 0; k < masked_.size(); ++k)
            if (targets_[k] < 0) masked_[k] = 0.0;
          double const loss = fn(i, std::span<std::int64_t const>(global_rows_),
                                 std::span<double const>(masked_), dlogp);
          for (std::size_t k = 0; k < masked_.size(); ++k)
            if (targets_[k] < 0) dlogp[k] = 0.0;
          return loss;
        };
  }

  //! step_options::token_loss of the GPT's cross-entropy: Σ weight · (-logp) over the rows with
  //! a target (weight: 1 / the batch's targets over every data rank gives the mean).
  [[nodiscard]] token_loss_fn cross_entropy(double weight) {
    return token_loss([weight](int, std::span<std::int64_t const>, std::span<double const> logp,
                               std::span<double> dlogp) {
      double loss = 0.0;
      for (std::size_t k = 0; k < logp.size(); ++k) {
        loss -= weight * logp[k];
        dlogp[k] = -weight;
      }
      return loss;
    });
  }

 private:
  gpt_vocab_shard(nn::gpt_config const& config, gpt_parallelism const& parallelism, TP* tp,
                  nn::param_store<T>& store, std::function<gpt_sequences(int)> microbatch)
      : c_(config),
        p_(parallelism),
        rows_(gpt_vocab_rows(config, parallelism)),
        tp_(tp),
        store_(&store),
        microbatch_(std::move(microbatch)) {
    WEFT_EXPECTS(static_cast<bool>(microbatch_), "microbatch", "a callable", "an empty function");
    if constexpr (has_tp) {
      WEFT_EXPECTS(p_.tp == tp->size() && p_.tp_rank == tp->rank(), "parallelism.tp, tp_rank",
                   ::weft::detail::concat(tp->size(), ", ", tp->rank(), " (the tp group's)"),
                   ::weft::detail::concat(p_.tp, ", ", p_.tp_rank));
    } else {
      WEFT_EXPECTS(p_.tp == 1, "parallelism.tp",
                   "1 without a tp group (gpt_vocab_shard<T, TP>(config, parallelism, tp, ...))",
                   p_.tp);
    }
    nn::detail::expect_layout(store.layout(), gpt_vocab_layout(c_, p_),
                              "gpt_vocab_layout(config, parallelism)");
  }

  // x summed over the tp group, in place (nothing at tp = 1).
  void tp_sum(std::span<T> x) {
    if constexpr (has_tp)
      if (tp_->size() > 1) comm::all_reduce(*tp_, x, comm::reduce_kind::sum).wait();
  }
  // S's statistics of n tokens (`count` elements: max, sum, target logit, and G, H of width `g`
  // for the one-barrier variant) combined over the tp group as C0 combines them over the
  // pipeline (combine_vocab_stats), the group's maxima written back as the shard's.
  void tp_combine_stats(T* st, std::size_t n, std::size_t count, index_t g) {
    if constexpr (has_tp) {
      if (tp_->size() == 1) return;
      tp_max_.resize(n);
      pipeline::combine_vocab_stats(*tp_, std::span<T>(st, count), std::span<T>(tp_max_), n,
                                    static_cast<std::size_t>(g));
      std::copy(tp_max_.begin(), tp_max_.end(), st);
    } else {
      (void)st, (void)n, (void)count, (void)g;
    }
  }

  // This cp rank's tokens, targets and global rows of microbatch i, in the GPT's row order.
  void load_rows(int i) {
    auto const b = microbatch_(i);
    index_t const s = b.seq_len;
    WEFT_EXPECTS_SHAPE(s > 0 && s <= c_.context, "microbatch(i).seq_len",
                       ::weft::detail::concat("in [1, context = ", c_.context, "]"), s);
    auto const total = static_cast<index_t>(b.tokens.size());
    WEFT_EXPECTS_SHAPE(total % s == 0 && b.targets.size() == b.tokens.size(), "microbatch(i)",
                       ::weft::detail::concat("tokens and targets of a multiple of seq_len = ", s,
                                              " elements each"),
                       ::weft::detail::concat(b.tokens.size(), " and ", b.targets.size()));
    if (p_.cp > 1)
      WEFT_EXPECTS_SHAPE(s % (2 * p_.cp) == 0, "microbatch(i).seq_len",
                         ::weft::detail::concat("a multiple of 2 * cp = ", 2 * p_.cp), s);
    index_t const seqs = total / s;
    auto const n = static_cast<std::size_t>(seqs * (s / p_.cp));
    tokens_.resize(n);
    targets_.resize(n);
    global_rows_.resize(n);
    detail::for_each_cp_row(seqs, s, p_, [&](std::size_t row, std::size_t src, index_t) {
      tokens_[row] = b.tokens[src];
      targets_[row] = b.targets[src];
      global_rows_[row] = static_cast<std::int64_t>(src);
      WEFT_EXPECTS(tokens_[row] >= 0 && tokens_[row] < c_.vocab, "microbatch(i).tokens",
                   ::weft::detail::concat("ids in [0, ", c_.vocab, ")"),
                   ::weft::detail::concat(tokens_[row], " at ", src));
      WEFT_EXPECTS(targets_[row] >= -1 && targets_[row] < c_.vocab, "microbatch(i).targets",
                   ::weft::detail::concat("-1 (ignored) or ids in [0, ", c_.vocab, ")"),
                   ::weft::detail::concat(targets_[row], " at ", src));
    });
  }
  void load(pipeline::stage_call const& c) {
    WEFT_EXPECTS(c.stage == p_.pp_rank, "stage_call::stage",
                 ::weft::detail::concat(p_.pp_rank,
                                        " (parallelism.pp_rank: the vocabulary pass's "
                                        "rank)"),
                 c.stage);
    load_rows(c.microbatch);
  }
  // The local column of token t's target where this shard owns it.
  [[nodiscard]] std::optional<index_t> owned_target(index_t t) const {
    index_t const v = targets_[static_cast<std::size_t>(t)] - rows_.begin;
    if (targets_[static_cast<std::size_t>(t)] < 0 || v < 0 || v >= rows_.size) return std::nullopt;
    return v;
  }
  static void expect_type(comm::buffer_view v, char const* what) {
    WEFT_EXPECTS(v.type == dtype_of<T>, what,
                 ::weft::detail::concat("elements of ", name(dtype_of<T>)), name(v.type));
  }
  // An n x d view of `v` (n: the loaded microbatch's rows).
  tensor_view<T, 2> matrix(comm::buffer_view v, char const* what) const {
    auto const n = static_cast<index_t>(tokens_.size());
    WEFT_EXPECTS_SHAPE(v.count == static_cast<std::size_t>(n * c_.d_model), what,
                       ::weft::detail::concat(n, " x ", c_.d_model, " elements"), v.count);
    expect_type(v, what);
    return tensor_view<T, 2>(static_cast<T*>(v.data), n, c_.d_model);
  }

  nn::gpt_config c_;
  gpt_parallelism p_;
  rl::vocab_shard rows_;
  TP* tp_ = nullptr;  // the tensor-parallel group (has_tp)
  nn::param_store<T>* store_;
  std::function<gpt_sequences(int)> microbatch_;
  std::vector<std::int32_t> tokens_, targets_;
  std::vector<std::int64_t> global_rows_;
  std::vector<double> masked_;
  struct kept_exponentials {
    std::vector<T> e;    // exp(Y - m) [n, vs], then dY in T
    std::vector<T> max;  // m: the shard's per-token maxima
  };
  std::map<int, kept_exponentials> kept_;  // S's, per microbatch, until its T
  std::vector<T> saved_;                   // S's scratch: one row's e^{Y - m_c}
  std::vector<double> chunk_max_;          // and its chunks' maxima
  std::vector<T> tp_max_;                  // S's maxima over the tp group
};

}  // namespace weft::parallel
