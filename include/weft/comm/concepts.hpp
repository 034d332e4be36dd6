// weft/comm/concepts.hpp — the vocabulary every communication backend shares (type-erased buffer
// views, reduce ops, per-call options, the operation record kept for post-mortems) and the
// communicator concepts, refined step by step: Group -> PointToPoint -> Collective -> Communicator
// -> StreamCommunicator, with SplittableGroup beside them and a space-aware form of each (`...In`).
#pragma once

#include <weft/core/config.hpp>
#include <weft/core/dtype.hpp>
#include <weft/core/error.hpp>
#include <weft/core/memory.hpp>
#include <weft/comm/work.hpp>

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

// ---- the opt-in tags ----------------------------------------------------------------------------

//! A type models a communicator concept only if it says so, by naming a tag in
//! `using communicator_concept = weft::comm::<tag>;`, so an unrelated class with rank() and
//! send-like members is never mistaken for one. Each tag derives from the weaker ones: name the
//! strongest concept the type models, and it models every concept below it too.
struct group_tag {};
struct point_to_point_tag : group_tag {};
struct collective_tag : point_to_point_tag {};
struct communicator_tag : collective_tag {};
struct stream_communicator_tag : communicator_tag {};

namespace detail {
template <class C, class Tag>
concept tagged = requires {
  typename C::communicator_concept;
}
&&std::derived_from<typename C::communicator_concept, Tag>;
}  // namespace detail

// ---- where a communicator's buffers live -------------------------------------------------------

//! The memory space of a communicator's buffers: `C::memory_space` where the model declares it
//! (threads and MPI: host_space, NCCL: cuda_space), host_space otherwise.
template <class C>
struct communicator_space {
  using type = host_space;
};
template <class C>
requires requires { typename C::memory_space; }
struct communicator_space<C> {
  using type = typename C::memory_space;
};
template <class C>
using communicator_space_t = typename communicator_space<std::remove_cvref_t<C>>::type;

// ---- the concepts, weakest first ---------------------------------------------------------------
// Each consumer asks for the weakest one it uses, in the memory space it needs: ring attention
// for PointToPointIn<C, host_space>, Ulysses and the rl losses for CollectiveIn<C, host_space>,
// device_mesh for SplittableGroup. weft's backends model Communicator (NCCL: StreamCommunicator).

//! Group: a group of size() ranks, of which this object is rank rank().
//! Semantics: 0 <= rank() < size() for a member (a rank left out by split(negative color) has
//! size() == 0); both are constant for the object's lifetime and never throw.
template <class C>
concept Group = detail::tagged<C, group_tag> && requires(C const& cc) {
  { cc.rank() }
  noexcept->std::same_as<int>;
  { cc.size() }
  noexcept->std::same_as<int>;
};

//! SplittableGroup: a Group that splits into sub-groups of its own type.
//! Semantics: split(color, key) is collective (every rank calls it, in the same order relative to
//! its other collective calls); ranks with the same non-negative color form a sub-group ordered
//! by (key, parent rank); a negative color yields a group of size 0 for that rank. Split needs no
//! buffers, so it works the same whatever the memory space.
template <class C>
concept SplittableGroup = Group<C> && std::movable<C> && requires(C& c, int color, int key) {
  { c.split(color, key) } -> std::same_as<C>;
};

//! PointToPoint: a Group whose ranks exchange messages.
//! Semantics:
//! - isend(in, peer, o) starts sending `in` to rank `peer`; irecv(out, peer, o) starts receiving
//!   the next message from `peer` into `out`. Both return a work; the buffer belongs to the
//!   communicator until that work completes (wait() or a true done()).
//! - Messages between one (sender, receiver) pair arrive in the order they were sent (MPI's
//!   non-overtaking rule); a message's count must equal the receiving buffer's count.
//! - Buffers are in communicator_space_t<C>; a bad peer, count or memory kind throws
//!   invalid_argument_error before anything is sent. A failure (peer gone, deadline) throws a
//!   comm_error from wait().
//! - Ranks may post their isend and irecv in any order: a rank that posts both before waiting on
//!   either never deadlocks against a peer doing the same (ring exchanges rely on this).
template <class C>
concept PointToPoint = Group<C> && detail::tagged<C, point_to_point_tag> &&
    requires(C& c, buffer_view in, buffer_view out, int peer, op_options o) {
  { c.isend(in, peer, o) } -> std::same_as<work>;
  { c.irecv(out, peer, o) } -> std::same_as<work>;
};

//! Collective: PointToPoint plus the collectives and barrier.
//! Semantics:
//! - Collectives are called by every rank of the group in the same order with matching
//!   fingerprints (op, dtype, count, root, reduction); sequence numbers advance per call.
//! - Buffers are contiguous; in-place means in.data == out.data where the op allows it.
//! - Invalid arguments (size mismatch, bad root or peer, wrong memory kind) throw
//!   invalid_argument_error before anything is communicated and leave the communicator healthy.
//! - Host models complete the call before returning; stream-ordered ones (StreamCommunicator)
//!   enqueue it on op_options::stream.
//! - Reductions over the same inputs give the same bits on every run (comm/reference.hpp).
template <class C>
concept Collective = PointToPoint<C> && detail::tagged<C, collective_tag> &&
    requires(C& c, buffer_view in, buffer_view out, std::span<std::size_t const> counts,
             reduce_op op, int root, op_options o) {
  { c.all_reduce(in, out, op, o) } -> std::same_as<work>;
  { c.reduce(in, out, op, root, o) } -> std::same_as<work>;
  { c.broadcast(in, out, root, o) } -> std::same_as<work>;
  { c.all_gather(in, out, o) } -> std::same_as<work>;
  { c.all_gather_v(in, out, counts, o) } -> std::same_as<work>;
  { c.reduce_scatter(in, out, op, o) } -> std::same_as<work>;
  { c.reduce_scatter_v(in, out, counts, op, o) } -> std::same_as<work>;
  { c.all_to_all(in, out, o) } -> std::same_as<work>;
  { c.all_to_all_v(in, out, counts, counts, o) } -> std::same_as<work>;
  { c.gather(in, out, root, o) } -> std::same_as<work>;
  { c.scatter(in, out, root, o) } -> std::same_as<work>;
  { c.barrier(o) } -> std::same_as<work>;
};

//! Communicator: a Collective and SplittableGroup with blocking send/recv, a health state, a
//! post-mortem history and a per-operation hook: what weft's backends provide.
//! Semantics, beyond those of the concepts it refines:
//! - send/recv are isend/irecv completed before returning (host models).
//! - A fault (peer failure, deadline, mismatch) throws a comm_error on every rank involved and
//!   poisons the communicator (state() == poisoned): every later call throws at once. abort() is
//!   idempotent, wakes every local waiter and leaves state() == aborted.
//! - history() returns the last operations (oldest first); set_hook(h) calls h with each
//!   operation's record as it completes.
//! - Errors are exceptions on every rank, never hangs: every wait is bounded by a deadline.
template <class C>
concept Communicator = Collective<C> && SplittableGroup<C> && detail::tagged<C, communicator_tag> &&
    requires(C& c, C const& cc, buffer_view in, buffer_view out, int peer, op_options o,
             op_hook hook) {
  { cc.state() }
  noexcept->std::same_as<comm_state>;
  { c.send(in, peer, o) } -> std::same_as<work>;
  { c.recv(out, peer, o) } -> std::same_as<work>;
  { c.abort() }
  noexcept;
  { cc.history() } -> std::same_as<std::vector<op_record>>;
  c.set_hook(hook);
};

//! StreamCommunicator: a Communicator whose operations are ordered on a device stream (NCCL):
//! calls return once enqueued on op_options::stream, and `synchronize(o)` waits for the stream
//! work of `o.stream`. Consumed by comm::synchronize (collectives.hpp), which generic code calls
//! to wait for any communicator's outstanding work (a no-op for host models).
template <class C>
concept StreamCommunicator = Communicator<C> && detail::tagged<C, stream_communicator_tag> &&
    requires(C& c, op_options o) {
  c.synchronize(o);
};

// ---- in a memory space ---------------------------------------------------------------------
// "A point-to-point communicator over host memory" is PointToPointIn<C, host_space>: the way
// TensorIn refines Tensor. A consumer that hands host buffers to the communicator asks for the
// host form, so a CUDA-memory communicator is refused at compile time, naming the requirement.

template <class C, class Space>
concept PointToPointIn =
    PointToPoint<C> && MemorySpace<Space> && std::same_as<communicator_space_t<C>, Space>;
template <class C, class Space>
concept CollectiveIn =
    Collective<C> && MemorySpace<Space> && std::same_as<communicator_space_t<C>, Space>;
template <class C, class Space>
concept CommunicatorIn =
    Communicator<C> && MemorySpace<Space> && std::same_as<communicator_space_t<C>, Space>;

}  // namespace weft::comm
