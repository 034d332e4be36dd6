// examples/rl_trainer/optimizer.hpp — rl_trainer's optimizer over the parameter stores of a
// rank's model chunks: AdamW replicated on every data rank after an all-reduce of the gradients,
// or, with --zero1, ZeRO-1 (Megatron's distributed optimizer): each chunk's gradients
// reduce-scattered in buckets over the data group (parallel::grad_sync over a sharded
// bucket_plan), AdamW on the pieces this rank owns (parallel::zero1), the parameters all-gathered.
#pragma once

#include <weft/comm/concepts.hpp>
#include <weft/core/error.hpp>
#include <weft/nn/params.hpp>
#include <weft/optim/adamw.hpp>
#include <weft/optim/clip.hpp>
#include <weft/optim/param.hpp>
#include <weft/parallel/buckets.hpp>
#include <weft/parallel/gpt.hpp>
#include <weft/parallel/grad_sync.hpp>
#include <weft/parallel/linear.hpp>
#include <weft/parallel/zero1.hpp>

#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

namespace weft::examples::rl_trainer {

//! Where the data-parallel gradient reduction and the optimizer state live.
//! - replicated: every data rank sums the whole gradient (all-reduce) and steps AdamW over all of
//!   its chunks' parameters; the gradient norm is reduced over the model group (pp × tp), whose
//!   ranks hold disjoint parameters.
//! - zero1: the data group's ranks (dp × cp) split every chunk's gradient buffer and AdamW state;
//!   each reduce-scatters the buckets, steps its pieces and all-gathers the parameters, and the
//!   norm is reduced over data × model (the world), whose ranks then hold disjoint pieces.
//! Both give the same step up to the order in which the norm's squares are summed (bit for bit
//! where clipping is off on the threads backend, whose reduce-scatter and all-reduce fold ranks
//! alike, or over MPI with 2 data ranks).
template <class T, comm::CollectiveIn<host_space> Comm>
class chunk_optimizer {
 public:
  //! One AdamW per store of `stores` (which must stay where they are while this lives), over
  //! the mesh's tp, data (dp × cp) and model (pp × tp) groups and the world (data × model), the
  //! norm's group under ZeRO-1; `bucket_size`: ZeRO-1's buckets. invalid_argument_error where
  //! the world is not data × model.
  chunk_optimizer(std::span<nn::param_store<T>> stores, optim::adamw_options const& ao, Comm& tp,
                  Comm& data, Comm& model, Comm& world, int tp_rank, bool zero1,
                  std::size_t bucket_size)
      : stores_(stores), tp_(&tp), data_(&data), norm_(zero1 ? &world : &model), tp_rank_(tp_rank) {
    WEFT_EXPECTS(world.size() == data.size() * model.size(), "world",
                 ::weft::detail::concat(data.size() * model.size(),
                                        " ranks (data x model: the disjoint pieces' norm)"),
                 world.size());
    for (auto const& st : stores_) {
      auto const infos = st.layout().infos();
      if (!zero1) {
        adams_.emplace_back(infos, ao);
        continue;
      }
      parallel::bucket_plan plan(std::span<optim::param_info const>(infos),
                                 {.bucket_size = bucket_size, .dp = data.size(), .shard = true});
      // The losses are weighted by the global token count already: the plain sum.
      syncs_.emplace_back(data, plan, parallel::grad_sync_options{parallel::grad_scaling::sum});
      zeros_.emplace_back(plan, data.rank(), ao);
    }
  }

  [[nodiscard]] bool sharded() const noexcept { return !zeros_.empty(); }

  //! Elements of the first moment this rank holds over all its chunks (the second is as large).
  [[nodiscard]] std::size_t state_size() const noexcept {
    std::size_t n = 0;
    for (auto const& a : adams_) n += a.size();
    for (auto const& z : zeros_) n += z.state_size();
    return n;
  }

  //! Chunk k's AdamW of a replicated optimizer (the --device engines take its state).
  [[nodiscard]] optim::adamw<T>& replicated(std::size_t k) {
    WEFT_EXPECTS(!sharded(), "optimizer", "replicated (not --zero1)", "ZeRO-1");
    return adams_.at(k);
  }

  //! The step's gradient from every rank's partial one, after backward: the sequence-parallel
  //! parameters' summed over tp, then every gradient over the data group (all-reduce, or under
  //! ZeRO-1 copied into the grad_sync buffer and reduce-scattered bucket by bucket, in the order
  //! backward produced them, then the owned pieces loaded into the shard). Collective over tp
  //! and the data group.
  void reduce() {
    if (!sharded()) {
      for (auto& st : stores_) parallel::reduce_gpt_grads(*tp_, *data_, st);
      return;
    }
    for (std::size_t k = 0; k < stores_.size(); ++k) {
      auto& st = stores_[k];
      auto const infos = st.layout().infos();
      parallel::sum_sequence_parallel_grads(*tp_, std::span<optim::param_info const>(infos),
                                            st.grads());
      auto& sync = syncs_[k];
      sync.zero();
      auto const& plan = sync.plan();
      for (std::size_t i = plan.params().size(); i-- > 0;)
        sync.mark_ready(
            i, std::span<T const>(st.grads()).subspan(plan.slot(i).source, plan.slot(i).count));
      sync.finish();
      zeros_[k].load_grads(std::span<T const>(sync.buffer()));
    }
  }

  //! Clips the reduced gradients of every chunk by one global norm (over the norm group) to
  //! max_norm; returns the norm before clipping. Collective over the norm group.
  double clip(double max_norm) {
    std::vector<std::vector<optim::param_info>> infos;
    std::vector<optim::grad_group<T>> groups;
    infos.reserve(stores_.size());
    if (!sharded()) {
      for (auto& st : stores_) {
        infos.push_back(st.layout().infos());
        groups.push_back({infos.back(), st.grads()});
      }
    } else {
      for (auto& z : zeros_) groups.push_back({z.shard_params(), z.shard_grads()});
    }
    return optim::clip_grad_norm(*norm_, groups, tp_rank_, max_norm);
  }

  //! AdamW at `lr` on every chunk; under ZeRO-1 the updated pieces are all-gathered into every
  //! data rank's parameters (collective over the data group).
  void step(double lr) {
    for (std::size_t k = 0; k < stores_.size(); ++k) {
      auto& st = stores_[k];
      if (!sharded())
        adams_[k].step(st.params(), st.grads(), lr);
      else
        zeros_[k].step(*data_, st.params(), lr);
    }
  }

  [[nodiscard]] std::int64_t steps() const {
    return sharded() ? zeros_.front().optimizer().steps() : adams_.front().steps();
  }

  //! Chunk k's whole first and second moments in definition order, as a replicated AdamW holds
  //! them (under ZeRO-1 gathered from the data group: collective over it).
  void whole_state(std::size_t k, std::vector<T>& m, std::vector<T>& v) {
    if (!sharded()) {
      m.assign(adams_.at(k).m().begin(), adams_.at(k).m().end());
      v.assign(adams_.at(k).v().begin(), adams_.at(k).v().end());
      return;
    }
    auto& z = zeros_.at(k);
    auto const n = z.plan().source_size();
    m.assign(n, T(0));
    v.assign(n, T(0));
    z.gather_state(*data_, std::span<T>(m), std::span<T>(v));
  }

  //! Restores chunk k's state from whole moments (whole_state's) and a step count.
  void load_state(std::size_t k, std::span<T const> m, std::span<T const> v, std::int64_t steps) {
    if (!sharded())
      adams_.at(k).load_state(m, v, steps);
    else
      zeros_.at(k).load_state(m, v, steps);
  }

 private:
  std::span<nn::param_store<T>> stores_;
  Comm *tp_, *data_, *norm_;
  int tp_rank_ = 0;
  std::vector<optim::adamw<T>> adams_;               // replicated: one per chunk
  std::vector<parallel::grad_sync<Comm, T>> syncs_;  // ZeRO-1: one per chunk
  std::vector<parallel::zero1<T>> zeros_;            // ZeRO-1: one per chunk
};

}  // namespace weft::examples::rl_trainer
