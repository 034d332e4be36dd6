// weft/parallel/grad_sync.hpp — data-parallel gradient reduction in buckets during backward:
// grad_sync owns the gradient buffer of a bucket_plan, launches each bucket's all-reduce (or, for
// ZeRO-1, reduce-scatter) once its parameters are marked ready, and waits for them in finish().
#pragma once

#include <weft/comm/collectives.hpp>
#include <weft/comm/concepts.hpp>
#include <weft/comm/work.hpp>
#include <weft/core/error.hpp>
#include <weft/core/memory.hpp>  // host_space
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

//! How the reduction turns per-replica gradients into the step's gradient.
//! - `average`: each replica's loss is its own mean (over its microbatches or tokens); every
//!   gradient is multiplied by 1/dp as it is summed (premul_sum, Megatron's
//!   gradient_scaling_factor = 1/dp then SUM), giving the mean over replicas.
//! - `sum`: the loss is already weighted by the global token count (every replica divided its
//!   token losses by the number of tokens over all replicas), so the plain SUM is the step's
//!   gradient (Megatron's per-token mode, scaling 1). Replicas with unequal token counts need this
//!   to equal one replica holding all the data.
enum class grad_scaling : std::uint8_t { average, sum };

struct grad_sync_options {
  grad_scaling scaling = grad_scaling::average;
};

//! Data-parallel gradient reduction over `dp_group`, bucket by bucket, as backward produces the
//! gradients (Megatron's `DistributedDataParallel` with overlap_grad_reduce, PyTorch DDP's
//! reducer). T is the gradient type (float or double).
//!
//! One step:
//!   sync.zero();                                  // gradients 0, nothing ready
//!   for each parameter i, in the order backward finishes them:
//!     write (or accumulate over microbatches) its gradient into sync.grad(i);
//!     sync.mark_ready(i);                          // on the last microbatch only
//!   sync.finish();                                 // every bucket reduced
//! A bucket's collective is issued from the mark_ready call that completes it, provided every
//! earlier bucket has been issued (buckets are issued in bucket order on every rank, so ranks
//! whose parameters become ready in different orders still issue matching collectives; with the
//! plan's reverse layout and a backward in reverse order this costs nothing). The collective is
//! SUM all-reduce over the bucket (replicated plan) or an in-place SUM reduce-scatter that leaves
//! rank r's owned range reduced (sharded plan; the rest of the bucket is unspecified afterwards),
//! scaled as grad_scaling says. The returned work is kept and finish() waits for it: a
//! stream-ordered communicator (NCCL) overlaps it with the rest of backward; host communicators
//! (threads, MPI) complete a collective before returning, so the bucket is reduced inside
//! mark_ready (the launch is as early, but the rank waits there for its peers).
//!
//! Unused parameters never hang: finish() issues every bucket not issued yet, in bucket order,
//! with whatever its gradients hold (zero for a parameter nobody wrote since zero()). A parameter
//! one replica does not use (a branch, an expert without tokens) thus contributes 0 from that
//! replica, as PyTorch DDP's find_unused_parameters does; unused() lists this rank's unmarked
//! parameters so a trainer can warn. (Megatron waits for every parameter and hangs,
//! Megatron-LM#1150; throwing on the one rank that saw the unused parameter would leave its peers
//! blocked in the bucket's collective until their deadline.)
//!
//! Errors: an index out of range, a parameter marked twice in one step or after finish(), a
//! gradient of the wrong size, and a group whose size is not the plan's dp throw
//! invalid_argument_error (shape_error for sizes) naming the parameter, before anything is
//! communicated. A collective's comm_error propagates from mark_ready or finish(). The
//! communicator is used from the calling thread only.
template <comm::CollectiveIn<host_space> C, class T>
class grad_sync {
  static_assert(std::is_same_v<T, float> || std::is_same_v<T, double>,
                "weft::parallel::grad_sync: T must be float or double");

 public:
  //! `dp_group` must outlive this object; its size must equal plan.dp().
  grad_sync(C& dp_group, bucket_plan plan, grad_sync_options const& options = {})
      : comm_(&dp_group), plan_(std::move(plan)), options_(options) {
    WEFT_EXPECTS(dp_group.size() == plan_.dp(), "dp_group.size()",
                 ::weft::detail::concat(plan_.dp(), " (the plan's dp)"), dp_group.size());
    buffer_.assign(plan_.buffer_size(), T(0));
    ready_.assign(plan_.params().size(), 0);
    pending_.resize(plan_.buckets().size());
    reset_counts();
  }

  [[nodiscard]] bucket_plan const& plan() const noexcept { return plan_; }
  [[nodiscard]] grad_sync_options const& options() const noexcept { return options_; }

  //! The whole gradient buffer, in the plan's layout (padding is kept at zero).
  [[nodiscard]] std::span<T> buffer() noexcept { return buffer_; }
  [[nodiscard]] std::span<T const> buffer() const noexcept { return buffer_; }
  //! Parameter `param`'s gradient (definition-order index), a view into buffer().
  [[nodiscard]] std::span<T> grad(std::size_t param) {
    auto const& s = plan_.slot(param);
    return std::span<T>(buffer_).subspan(s.start, s.count);
  }
  [[nodiscard]] std::span<T const> grad(std::size_t param) const {
    auto const& s = plan_.slot(param);
    return std::span<T const>(buffer_).subspan(s.start, s.count);
  }

  //! Starts a step: every gradient 0, no parameter ready, no bucket issued. Call it after the
  //! optimizer has read the gradients (Megatron's zero_grad_buffer).
  void zero() {
    std::fill(buffer_.begin(), buffer_.end(), T(0));
    reset_counts();
  }

  //! Parameter `param`'s gradient is final for this step; issues every bucket that is now
  //! complete and next in order.
  void mark_ready(std::size_t param) {
    expect_markable(param);
    ready_[param] = 1;
    auto const b = plan_.slot(param).bucket;
    --pending_[b];
    launch_ready();
  }

  //! Copies `g` (the parameter's count elements) into grad(param), then mark_ready(param).
  void mark_ready(std::size_t param, std::span<T const> g) {
    expect_markable(param);
    auto const dst = grad(param);
    WEFT_EXPECTS_SHAPE(g.size() == dst.size(), "g",
                       ::weft::detail::concat(dst.size(), " elements (parameter ", param, ")"),
                       ::weft::detail::concat(g.size(), " elements"));
    std::copy(g.begin(), g.end(), dst.begin());
    mark_ready(param);
  }

  //! Issues every bucket not issued yet (in bucket order, unused parameters included) and waits
  //! for all of them. After it, grad(i) holds the reduced gradient (replicated plan), or the
  //! owned pieces of plan().owned(b, rank) hold theirs (sharded plan). Every rank of the group
  //! must call it.
  void finish() {
    WEFT_EXPECTS(!finished_, "finish", "one call per step (zero() starts the next step)",
                 "a second call");
    finished_ = true;
    while (next_ < pending_.size()) launch(next_++);
    // Wait in issue order; keep the handles until all are done so a failure leaves none pending.
    for (auto& w : works_) w.wait();
    works_.clear();
  }

  [[nodiscard]] bool finished() const noexcept { return finished_; }
  //! Buckets issued so far this step (they are issued in order: buckets [0, issued())).
  [[nodiscard]] std::size_t issued() const noexcept { return next_; }
  //! Parameters of this rank not marked ready this step, in definition order.
  [[nodiscard]] std::vector<std::size_t> unused() const {
    std::vector<std::size_t> out;
    for (std::size_t i = 0; i < ready_.size(); ++i)
      if (!ready_[i]) out.push_back(i);
    return out;
  }

  //! After finish(): sums the gradients of tied parameters (param_info::tied or tied_secondary)
  //! over `embedding_group` (the pipeline ranks holding the copies), SUM all-reduce, one call per
  //! tied parameter of this rank in definition order (every rank of the group must hold the same
  //! number of tied parameters, in matching order and counts). Sharded plan: only the owned piece
  //! of each copy is summed (each copy has a bucket of its own, so both shard alike); replicated:
  //! the whole gradient. This is Megatron's `_allreduce_word_embedding_grads`, after the DP
  //! reduction.
  template <comm::CollectiveIn<host_space> E>
  void sum_tied(E& embedding_group) {
    WEFT_EXPECTS(finished_, "sum_tied", "a call after finish()", "a call before finish()");
    auto const params = plan_.params();
    for (std::size_t i = 0; i < params.size(); ++i) {
      if (!optim::is_tied(params[i])) continue;
      std::span<T> g = grad(i);
      if (plan_.sharded()) {
        auto const r = plan_.owned(plan_.slot(i).bucket, comm_->rank());
        std::size_t lo = 0, n = 0;
        for (auto const& p : r.pieces)
          if (p.param == i) lo = p.offset, n = p.count;
        g = g.subspan(lo, n);
      }
      comm::all_reduce(embedding_group, g, comm::reduce_kind::sum).wait();
    }
  }

  //! Replicated plan, after finish(): copies the reduced gradients into a flat definition-order
  //! buffer (plan().source_size() elements).
  void unpack(std::span<T> flat) const {
    WEFT_EXPECTS(!plan_.sharded(), "unpack",
                 "a replicated plan (a sharded one is reduced only "
                 "on the owned ranges)",
                 "a sharded plan");
    plan_.unpack(std::span<T const>(buffer_), flat);
  }

 private:
  void reset_counts() {
    std::fill(ready_.begin(), ready_.end(), 0);
    auto const buckets = plan_.buckets();
    for (std::size_t b = 0; b < buckets.size(); ++b) pending_[b] = buckets[b].params.size();
    next_ = 0;
    finished_ = false;
    works_.clear();
  }

  void expect_markable(std::size_t param) const {
    WEFT_EXPECTS(param < ready_.size(), "param",
                 ::weft::detail::concat("a parameter index < ", ready_.size()), param);
    WEFT_EXPECTS(!finished_, "param",
                 ::weft::detail::concat("a parameter marked before finish() (parameter ", param,
                                        "; zero() starts the next step)"),
                 "a call after finish()");
    WEFT_EXPECTS(!ready_[param], "param",
                 ::weft::detail::concat("parameter ", param, " marked ready once per step"),
                 "a second mark_ready for it (call zero() between steps)");
  }

  void launch_ready() {
    while (next_ < pending_.size() && pending_[next_] == 0) launch(next_++);
  }

  void launch(std::size_t b) {
    auto const& bk = plan_.buckets()[b];
    comm::buffer_view const whole =
        comm::sub_buffer(comm::host_view(std::span<T>(buffer_)), bk.start, bk.size());
    comm::reduce_op const op = options_.scaling == grad_scaling::average
                                   ? comm::reduce_op::premul(1.0 / static_cast<double>(plan_.dp()))
                                   : comm::reduce_op(comm::reduce_kind::sum);
    if (plan_.sharded()) {
      std::size_t const part = bk.size() / static_cast<std::size_t>(plan_.dp());
      works_.push_back(comm_->reduce_scatter(
          whole, comm::sub_buffer(whole, static_cast<std::size_t>(comm_->rank()) * part, part), op,
          {}));
    } else {
      works_.push_back(comm_->all_reduce(whole, whole, op, {}));
    }
  }

  C* comm_;
  bucket_plan plan_;
  grad_sync_options options_;
  std::vector<T> buffer_;
  std::vector<unsigned char> ready_;
  std::vector<std::size_t> pending_;  // parameters of each bucket not ready yet
  std::size_t next_ = 0;              // the next bucket to issue
  bool finished_ = false;
  std::vector<comm::work> works_;
};

}  // namespace weft::parallel
