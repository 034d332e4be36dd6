// weft/parallel/zero1.hpp — ZeRO-1 AdamW (Megatron's DistributedOptimizer): each data-parallel
// rank keeps optim::adamw state for the pieces of the gradient buffer it owns, steps them after
// the reduce-scatter, and all-gathers the updated parameters bucket by bucket.
#pragma once

#include <weft/comm/collectives.hpp>
#include <weft/comm/concepts.hpp>
#include <weft/comm/work.hpp>
#include <weft/core/error.hpp>
#include <weft/core/memory.hpp>  // host_space
#include <weft/optim/adamw.hpp>
#include <weft/optim/clip.hpp>
#include <weft/optim/param.hpp>
#include <weft/parallel/buckets.hpp>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <span>
#include <type_traits>
#include <utility>
#include <vector>

namespace weft::parallel {

//! ZeRO-1 AdamW for DP rank `dp_rank` of a sharded bucket_plan. T is the parameter and gradient
//! type (float or double).
//!
//! State: one optim::adamw<T> over this rank's owned pieces (plan.owned_pieces(dp_rank), in
//! buffer order, padding excluded), so m and v hold about 1/dp of the model (state_size();
//! the state sizes of all ranks add up to the parameter count). The step is AdamW's, element by
//! element, so it is bitwise equal to a replicated optim::adamw step whenever the gradients are
//! (the threads backend's reduce-scatter and all-reduce both fold ranks in ascending order).
//!
//! One step, after grad_sync::finish() (and sum_tied for tied weights):
//!   opt.load_grads(sync.buffer());                   // owned pieces -> a contiguous shard
//!   opt.clip_grad_norm(dp_tp_pp_group, tp_rank, 1.0); // optional: norm over DP × TP × PP
//!   opt.step(dp_group, params, lr);                  // AdamW on the shard, all-gather
//! `params` is the user's flat definition-order parameter buffer (plan.source_size() elements),
//! identical on every DP rank; it is the truth (no master copy is kept): step reads the owned
//! pieces from it, updates them, and all-gathers every bucket (in place, in a staging buffer in
//! the plan's layout that this object owns) before unpacking the result into `params` on every
//! rank.
template <class T>
class zero1 {
  static_assert(std::is_same_v<T, float> || std::is_same_v<T, double>,
                "weft::parallel::zero1: T must be float or double");

 public:
  //! Throws invalid_argument_error for a replicated plan or a rank outside [0, plan.dp()), and
  //! for invalid options (optim::validate).
  zero1(bucket_plan plan, int dp_rank, optim::adamw_options const& options)
      : plan_(std::move(plan)), rank_(dp_rank), adam_(std::span<param_info const>{}, options) {
    WEFT_EXPECTS(plan_.sharded(), "plan", "a sharded plan (bucket_options::shard = true)",
                 "a replicated plan");
    WEFT_EXPECTS(dp_rank >= 0 && dp_rank < plan_.dp(), "dp_rank",
                 ::weft::detail::concat("in [0, ", plan_.dp(), ")"), dp_rank);
    pieces_ = plan_.owned_pieces(rank_);
    auto const params = plan_.params();
    infos_.reserve(pieces_.size());
    std::size_t n = 0;
    for (auto const& p : pieces_) {
      // The piece keeps its parameter's flags: decay for AdamW, tp_sharded and tied_secondary
      // for the norm.
      param_info info = params[p.param];
      info.count = p.count;
      infos_.push_back(info);
      n += p.count;
    }
    adam_ = optim::adamw<T>(std::span<param_info const>(infos_), options);
    shard_params_.assign(n, T(0));
    shard_grads_.assign(n, T(0));
  }

  [[nodiscard]] bucket_plan const& plan() const noexcept { return plan_; }
  [[nodiscard]] int dp_rank() const noexcept { return rank_; }
  //! The owned pieces, in buffer order; the shard is their concatenation.
  [[nodiscard]] std::span<owned_piece const> pieces() const noexcept { return pieces_; }
  //! One param_info per owned piece (count = the piece's), describing the shard.
  [[nodiscard]] std::span<param_info const> shard_params() const noexcept { return infos_; }
  //! Elements of this rank's shard, and of each of AdamW's moments.
  [[nodiscard]] std::size_t state_size() const noexcept { return adam_.size(); }
  [[nodiscard]] optim::adamw<T> const& optimizer() const noexcept { return adam_; }
  //! The shard's gradients, as load_grads left them (and clip_grad_norm scaled them).
  [[nodiscard]] std::span<T> shard_grads() noexcept { return shard_grads_; }

  //! Copies the owned pieces of a reduced gradient buffer in the plan's layout (grad_sync's
  //! buffer() after finish()) into the shard.
  void load_grads(std::span<T const> grad_buffer) {
    WEFT_EXPECTS_SHAPE(
        grad_buffer.size() == plan_.buffer_size(), "grad_buffer",
        ::weft::detail::concat(plan_.buffer_size(), " elements (the plan's buffer_size)"),
        ::weft::detail::concat(grad_buffer.size(), " elements"));
    take_pieces<&owned_piece::buffer>(grad_buffer, std::span<T>(shard_grads_));
  }

  //! optim::clip_grad_norm over the shard: the shards of a DP group are disjoint, so the norm is
  //! reduced over `stats_group` = data × tensor × pipeline parallel (Megatron's
  //! intra_dist_opt_group), not tensor × pipeline as for a replicated optimizer. Returns the norm
  //! before clipping; every rank of `stats_group` must call.
  template <comm::CollectiveIn<host_space> S>
  double clip_grad_norm(S& stats_group, int tp_rank, double max_norm,
                        optim::grad_norm_kind kind = optim::grad_norm_kind::l2) {
    return optim::clip_grad_norm(stats_group, std::span<param_info const>(infos_),
                                 std::span<T>(shard_grads_), tp_rank, max_norm, kind);
  }

  //! optim::global_grad_norm over the shard (see clip_grad_norm for the group).
  template <comm::CollectiveIn<host_space> S>
  [[nodiscard]] double grad_norm(S& stats_group, int tp_rank,
                                 optim::grad_norm_kind kind = optim::grad_norm_kind::l2) const {
    return optim::global_grad_norm(stats_group, std::span<param_info const>(infos_),
                                   std::span<T const>(shard_grads_), tp_rank, kind);
  }

  //! AdamW at learning rate `lr` on the owned pieces of `params` with the loaded gradients, then
  //! an in-place all-gather of every bucket over `dp_group` (whose size is the plan's dp and whose
  //! rank is dp_rank()), then every parameter of `params` is the gathered value. shape_error for
  //! a `params` of another size; invalid_argument_error for a wrong group, before anything
  //! changes.
  template <comm::CollectiveIn<host_space> C>
  void step(C& dp_group, std::span<T> params, double lr) {
    expect_group(dp_group);
    expect_whole(params.size(), "params");
    WEFT_EXPECTS(lr >= 0.0, "lr", ">= 0", lr);
    take_pieces<&owned_piece::source>(params, std::span<T>(shard_params_));
    adam_.step(std::span<T>(shard_params_), std::span<T const>(shard_grads_), lr);
    all_gather_shards(dp_group, std::span<T const>(shard_params_), params);
  }

  //! load_grads(grad_buffer), then step(dp_group, params, lr).
  template <comm::CollectiveIn<host_space> C>
  void step(C& dp_group, std::span<T> params, std::span<T const> grad_buffer, double lr) {
    load_grads(grad_buffer);
    step(dp_group, params, lr);
  }

  //! The whole AdamW state, as a replicated optim::adamw over the plan's parameters would hold
  //! it after the same steps: every rank's owned first and second moments all-gathered over
  //! `dp_group` into `m` and `v` (plan().source_size() elements each, definition order) on every
  //! rank. For a checkpoint that any layout can resume, sharded or not, at any dp (Megatron's
  //! get_parameter_state_dp_zero, which gathers to DP rank 0 only). Collective over dp_group;
  //! the step count is optimizer().steps(). shape_error for other sizes and
  //! invalid_argument_error for a wrong group, before anything is communicated.
  template <comm::CollectiveIn<host_space> C>
  void gather_state(C& dp_group, std::span<T> m, std::span<T> v) {
    expect_group(dp_group);
    expect_whole(m.size(), "m");
    expect_whole(v.size(), "v");
    all_gather_shards(dp_group, adam_.m(), m);
    all_gather_shards(dp_group, adam_.v(), v);
  }

  //! Restores the state from whole moments in definition order (gather_state's, or a replicated
  //! optim::adamw's m() and v() over the same parameters) and a step count: this rank takes its
  //! owned pieces, so the following steps equal those of the optimizer they were saved from, bit
  //! for bit. No communication. shape_error for other sizes, invalid_argument_error for a negative
  //! step count, before anything changes.
  void load_state(std::span<T const> m, std::span<T const> v, std::int64_t steps) {
    expect_whole(m.size(), "m");
    expect_whole(v.size(), "v");
    WEFT_EXPECTS(steps >= 0, "steps", ">= 0", steps);
    std::vector<T> sm(adam_.size()), sv(adam_.size());
    take_pieces<&owned_piece::source>(m, std::span<T>(sm));
    take_pieces<&owned_piece::source>(v, std::span<T>(sv));
    adam_.load_state(std::span<T const>(sm), std::span<T const>(sv), steps);
  }

 private:
  // The owned pieces of `from` (each at its offset Where: in the plan's buffer or in the flat
  // definition-order buffer) concatenated into `shard`, in pieces() order.
  template <std::size_t owned_piece::*Where>
  void take_pieces(std::span<T const> from, std::span<T> shard) const {
    std::size_t k = 0;
    for (auto const& p : pieces_) {
      std::copy_n(from.begin() + static_cast<std::ptrdiff_t>(p.*Where), p.count,
                  shard.begin() + static_cast<std::ptrdiff_t>(k));
      k += p.count;
    }
  }

  template <class C>
  void expect_group(C const& dp_group) const {
    WEFT_EXPECTS(dp_group.size() == plan_.dp() && dp_group.rank() == rank_, "dp_group",
                 ::weft::detail::concat("size ", plan_.dp(), " and rank ", rank_),
                 ::weft::detail::concat("size ", dp_group.size(), " and rank ", dp_group.rank()));
  }
  void expect_whole(std::size_t size, char const* name) const {
    WEFT_EXPECTS_SHAPE(
        size == plan_.source_size(), name,
        ::weft::detail::concat(plan_.source_size(), " elements (the sum of the counts)"),
        ::weft::detail::concat(size, " elements"));
  }

  // Every rank's `shard` (its owned pieces concatenated in pieces() order) all-gathered over
  // dp_group into `flat` (definition order): each rank writes its pieces into a staging buffer in
  // the plan's layout, every bucket is all-gathered in place, and the result is unpacked. The
  // staging buffer is zeroed once: no rank ever writes its padding, so it stays 0, and every
  // other element is overwritten by its owner's piece.
  template <class C>
  void all_gather_shards(C& dp_group, std::span<T const> shard, std::span<T> flat) {
    if (gather_.size() != plan_.buffer_size()) gather_.assign(plan_.buffer_size(), T(0));
    std::size_t k = 0;
    for (auto const& p : pieces_) {
      std::copy_n(shard.begin() + static_cast<std::ptrdiff_t>(k), p.count,
                  gather_.begin() + static_cast<std::ptrdiff_t>(p.buffer));
      k += p.count;
    }
    auto const all = comm::host_view(std::span<T>(gather_));
    std::vector<comm::work> works;
    works.reserve(plan_.buckets().size());
    for (auto const& bk : plan_.buckets()) {
      std::size_t const part = bk.size() / static_cast<std::size_t>(plan_.dp());
      auto const whole = comm::sub_buffer(all, bk.start, bk.size());
      works.push_back(dp_group.all_gather(
          comm::sub_buffer(whole, static_cast<std::size_t>(rank_) * part, part), whole, {}));
    }
    for (auto& w : works) w.wait();
    plan_.unpack(std::span<T const>(gather_), flat);
  }

  bucket_plan plan_;
  int rank_ = 0;
  std::vector<owned_piece> pieces_;
  std::vector<param_info> infos_;
  optim::adamw<T> adam_;
  std::vector<T> shard_params_, shard_grads_, gather_;
};

}  // namespace weft::parallel
