// weft/comm/concepts.hpp — the vocabulary every communication backend shares: type-erased buffer
// views, reduce ops, per-call options, the `work` handle, the operation record kept for
// post-mortems, and the `Communicator` / `StreamCommunicator` concepts.
#pragma once

#include <weft/core/config.hpp>
#include <weft/core/dtype.hpp>
#include <weft/core/error.hpp>

#include <chrono>
#include <concepts>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <type_traits>
#include <vector>

namespace weft::comm {

//! Where a buffer lives. Host backends (threads, MPI) accept `host` only; NCCL accepts `cuda` only.
enum class memory_kind : std::uint8_t { host, cuda };

constexpr std::string_view to_string(memory_kind m) noexcept {
  return m == memory_kind::host ? "host" : "cuda";
}

//! The reduction applied by all_reduce, reduce and reduce_scatter. `avg` divides the sum by the
//! group size; `premul_sum` multiplies every input by `scalar` before summing (NCCL semantics).
//! bf16 and f16 accumulate in f32 and round once.
enum class reduce_kind : std::uint8_t { sum, prod, min, max, avg, premul_sum };

constexpr std::string_view to_string(reduce_kind k) noexcept {
  switch (k) {
    case reduce_kind::sum: return "sum";
    case reduce_kind::prod: return "prod";
    case reduce_kind::min: return "min";
    case reduce_kind::max: return "max";
    case reduce_kind::avg: return "avg";
    case reduce_kind::premul_sum: return "premul_sum";
  }
  return "unknown";
}

struct reduce_op {
  reduce_kind kind = reduce_kind::sum;
  double scalar = 1.0;  // used by premul_sum only

  constexpr reduce_op() = default;
  constexpr reduce_op(reduce_kind k) : kind(k) {}  // NOLINT: implicit on purpose
  constexpr reduce_op(reduce_kind k, double s) : kind(k), scalar(s) {}
  static constexpr reduce_op premul(double s) { return {reduce_kind::premul_sum, s}; }
  friend constexpr bool operator==(reduce_op const&, reduce_op const&) = default;
};

//! A non-owning, contiguous, type-erased buffer: what crosses the backend boundary.
struct buffer_view {
  void* data = nullptr;
  std::size_t count = 0;  // elements, not bytes
  dtype type = dtype::f32;
  memory_kind where = memory_kind::host;
  int device = -1;  // CUDA device ordinal for memory_kind::cuda

  [[nodiscard]] constexpr std::size_t bytes() const noexcept { return count * size_of(type); }
  [[nodiscard]] constexpr bool empty() const noexcept { return count == 0; }
};

//! Typed front door over a contiguous host range.
template <class T>
  requires Element<std::remove_const_t<T>>
[[nodiscard]] buffer_view host_view(std::span<T> s) noexcept {
  return {const_cast<std::remove_const_t<T>*>(s.data()), s.size(), dtype_of<std::remove_const_t<T>>,
          memory_kind::host, -1};
}

//! Per-call options. A zero timeout means the communicator's default deadline.
struct op_options {
  std::chrono::milliseconds timeout{0};
  void* stream = nullptr;  // cudaStream_t for stream-ordered backends; ignored by host backends
};

//! healthy: usable. poisoned: a fault happened (timeout, mismatch, peer failure); every later call
//! throws at once. aborted: abort() was called locally.
enum class comm_state : std::uint8_t { healthy, poisoned, aborted };

constexpr std::string_view to_string(comm_state s) noexcept {
  switch (s) {
    case comm_state::healthy: return "healthy";
    case comm_state::poisoned: return "poisoned";
    case comm_state::aborted: return "aborted";
  }
  return "unknown";
}

//! The operations, as recorded in fingerprints and in the history.
enum class op_kind : std::uint8_t {
  all_reduce,
  reduce,
  broadcast,
  all_gather,
  all_gather_v,
  reduce_scatter,
  reduce_scatter_v,
  all_to_all,
  all_to_all_v,
  gather,
  scatter,
  send,
  recv,
  barrier,
  split,
};

constexpr std::string_view to_string(op_kind k) noexcept {
  switch (k) {
    case op_kind::all_reduce: return "all_reduce";
    case op_kind::reduce: return "reduce";
    case op_kind::broadcast: return "broadcast";
    case op_kind::all_gather: return "all_gather";
    case op_kind::all_gather_v: return "all_gather_v";
    case op_kind::reduce_scatter: return "reduce_scatter";
    case op_kind::reduce_scatter_v: return "reduce_scatter_v";
    case op_kind::all_to_all: return "all_to_all";
    case op_kind::all_to_all_v: return "all_to_all_v";
    case op_kind::gather: return "gather";
    case op_kind::scatter: return "scatter";
    case op_kind::send: return "send";
    case op_kind::recv: return "recv";
    case op_kind::barrier: return "barrier";
    case op_kind::split: return "split";
  }
  return "unknown";
}

//! What every rank of a collective must agree on. Compared across ranks (threads: always; MPI and
//! NCCL: in debug mode) so mismatched calls throw mismatch_error instead of corrupting memory.
struct fingerprint {
  op_kind op = op_kind::barrier;
  dtype type = dtype::f32;
  std::size_t count = 0;  // the count every rank must agree on (per-rank for _v ops: 0)
  int root = -1;
  reduce_kind reduction = reduce_kind::sum;
  std::uint64_t seq = 0;
  friend constexpr bool operator==(fingerprint const&, fingerprint const&) = default;
};

//! One entry of a communicator's history: kept for the last N operations so a post-mortem can
//! tell what each rank was doing.
struct op_record {
  op_kind op = op_kind::barrier;
  std::uint64_t seq = 0;
  dtype type = dtype::f32;
  std::size_t send_bytes = 0;
  std::size_t recv_bytes = 0;
  int root_or_peer = -1;
  std::chrono::steady_clock::time_point start{};
  std::chrono::steady_clock::time_point end{};  // == start while pending
  bool ok = true;
  std::string error;  // what() of the failure, if any
};

using op_hook = std::function<void(op_record const&)>;

namespace detail {
//! The state behind a pending operation; backends derive from it.
class work_state {
 public:
  virtual ~work_state() = default;
  //! Waits until done or the deadline; returns whether done. Throws the operation's comm_error.
  virtual bool wait_until(std::chrono::steady_clock::time_point deadline) = 0;
  [[nodiscard]] virtual bool done() const noexcept = 0;
};
}  // namespace detail

//! Handle to an operation. Host backends return completed work from blocking calls; isend/irecv
//! and stream-ordered backends return pending work. wait() rethrows the operation's error.
class work {
 public:
  work() = default;  // already complete
  explicit work(std::shared_ptr<detail::work_state> s) : state_(std::move(s)) {}

  //! Blocks until complete (bounded by the communicator's deadline); throws its comm_error.
  void wait() {
    if (state_) state_->wait_until(std::chrono::steady_clock::time_point::max());
  }
  //! Waits at most `d`; false if still pending (no throw for the deadline itself).
  bool wait_for(std::chrono::milliseconds d) {
    return !state_ || state_->wait_until(std::chrono::steady_clock::now() + d);
  }
  [[nodiscard]] bool done() const noexcept { return !state_ || state_->done(); }

 private:
  std::shared_ptr<detail::work_state> state_;
};

//! Opt-in tag: a type models Communicator only if it says so (`using communicator_concept =
//! weft::comm::communicator_tag;`), so an unrelated class with send/recv is never mistaken for one.
struct communicator_tag {};
struct stream_communicator_tag : communicator_tag {};

//! Communicator: a group of size() ranks; this object is rank rank().
//!
//! Semantics every model guarantees:
//! - Collectives are called by every rank of the group in the same order with matching
//!   fingerprints (op, dtype, count, root, reduction); sequence numbers advance per call.
//! - Buffers are contiguous; in-place means in.data == out.data where the op allows it.
//! - Invalid arguments (size mismatch, bad root or peer, wrong memory kind) throw
//!   invalid_argument_error before anything is communicated and leave the communicator healthy.
//! - A fault (peer failure, deadline, mismatch) throws a comm_error on every rank involved and
//!   poisons the communicator: every later call throws at once. abort() is idempotent and wakes
//!   every local waiter.
//! - Host backends complete blocking calls before returning; stream-ordered backends
//!   (StreamCommunicator) enqueue them on op_options::stream.
//! - split(color, key) is collective; ranks with the same color form a sub-communicator ordered by
//!   (key, parent rank); a negative color yields a communicator of size 0 for that rank.
//! - Reductions over the same inputs give the same bits on every run.
template <class C>
concept Communicator =
    std::movable<C> && std::derived_from<typename C::communicator_concept, communicator_tag> &&
    requires(C& c, C const& cc, buffer_view in, buffer_view out, std::span<std::size_t const> counts,
             reduce_op op, int peer, int color, int key, op_options o, op_hook hook) {
      { cc.rank() } noexcept -> std::same_as<int>;
      { cc.size() } noexcept -> std::same_as<int>;
      { cc.state() } noexcept -> std::same_as<comm_state>;
      { c.all_reduce(in, out, op, o) } -> std::same_as<work>;
      { c.reduce(in, out, op, peer, o) } -> std::same_as<work>;
      { c.broadcast(in, out, peer, o) } -> std::same_as<work>;
      { c.all_gather(in, out, o) } -> std::same_as<work>;
      { c.all_gather_v(in, out, counts, o) } -> std::same_as<work>;
      { c.reduce_scatter(in, out, op, o) } -> std::same_as<work>;
      { c.reduce_scatter_v(in, out, counts, op, o) } -> std::same_as<work>;
      { c.all_to_all(in, out, o) } -> std::same_as<work>;
      { c.all_to_all_v(in, out, counts, counts, o) } -> std::same_as<work>;
      { c.gather(in, out, peer, o) } -> std::same_as<work>;
      { c.scatter(in, out, peer, o) } -> std::same_as<work>;
      { c.send(in, peer, o) } -> std::same_as<work>;
      { c.recv(out, peer, o) } -> std::same_as<work>;
      { c.isend(in, peer, o) } -> std::same_as<work>;
      { c.irecv(out, peer, o) } -> std::same_as<work>;
      { c.barrier(o) } -> std::same_as<work>;
      { c.split(color, key) } -> std::same_as<C>;
      { c.abort() } noexcept;
      { cc.history() } -> std::same_as<std::vector<op_record>>;
      c.set_hook(hook);
    };

//! A Communicator whose operations are ordered on a device stream (NCCL): calls return once
//! enqueued, and `synchronize(o)` waits for the stream work of `o.stream`.
template <class C>
concept StreamCommunicator =
    Communicator<C> && std::derived_from<typename C::communicator_concept, stream_communicator_tag> &&
    requires(C& c, op_options o) { c.synchronize(o); };

}  // namespace weft::comm
