// weft/comm/threads/communicator.hpp — the threads backend's Communicator: ranks are threads of
// one process that read each other's buffers directly (zero-copy), reduce in ascending rank order
// (bitwise equal to comm/reference.hpp), and turn every fault into an exception on every rank.
#pragma once

#include <weft/comm/concepts.hpp>
#include <weft/comm/detail/checked.hpp>
#include <weft/comm/reference.hpp>
#include <weft/comm/threads/detail/group.hpp>
#include <weft/comm/threads/detail/kernels.hpp>
#include <weft/comm/threads/detail/parking.hpp>
#include <weft/comm/threads/options.hpp>
#include <weft/core/dtype.hpp>
#include <weft/core/error.hpp>
#include <weft/core/memory.hpp>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <exception>
#include <memory>
#include <mutex>
#include <numeric>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace weft::comm::threads {

class communicator;
class world;
inline std::vector<communicator> make_communicators(int n, options opts = {});

namespace detail {

//! What one rank keeps for itself: sequence numbers, its deadline, its history and hook. Shared
//! with its pending work so that a work outliving a moved communicator still finds it.
struct rank_state {
  std::string name;       // the group's name in messages (a mesh axis); set_name()
  std::uint64_t seq = 0;  // collectives that synchronised (zero-length ones do not count)
  std::vector<std::uint64_t> send_seq;
  std::vector<std::uint64_t> recv_seq;
  std::chrono::milliseconds timeout{0};
  std::atomic<bool> aborted{false};
  std::vector<std::weak_ptr<p2p_op>> outstanding;  // this rank's p2p halves, possibly pending

  std::size_t capacity = 0;
  std::vector<op_record> ring;
  std::uint64_t recorded = 0;  // records ever added
  op_hook hook;

  //! Adds a record; returns its number (for update()).
  std::uint64_t add(op_record const& r) {
    std::uint64_t const id = recorded++;
    if (capacity == 0) return id;
    if (ring.size() < capacity) {
      ring.push_back(r);
    } else {
      ring[static_cast<std::size_t>(id % capacity)] = r;
    }
    return id;
  }
  //! Replaces record `id` if it is still kept.
  void update(std::uint64_t id, op_record const& r) {
    if (capacity == 0 || id + capacity < recorded) return;
    ring[static_cast<std::size_t>(id % capacity)] = r;
  }
  [[nodiscard]] std::vector<op_record> history() const {
    std::vector<op_record> out;
    out.reserve(ring.size());
    std::uint64_t const first = recorded - ring.size();
    for (std::uint64_t id = first; id < recorded; ++id)
      out.push_back(ring[static_cast<std::size_t>(id % capacity)]);
    return out;
  }
  //! Hooks must not throw while an error is on its way out; the original error wins.
  void call_hook(op_record const& r, bool rethrow) {
    if (!hook) return;
    if (rethrow) {
      hook(r);
    } else {
      try {
        hook(r);
      } catch (...) {
      }
    }
  }
};


inline std::string describe(descriptor const& d, int size) {
  if (d.fp.op == op_kind::barrier || d.fp.op == op_kind::split)
    return std::string(to_string(d.fp.op)) + "()";
  std::string s = weft::detail::concat(to_string(d.fp.op), "(dtype ", d.fp.type);
  switch (d.fp.op) {
    case op_kind::all_gather_v:
    case op_kind::reduce_scatter_v: {
      std::vector<int> c;
      for (int r = 0; r < size; ++r) c.push_back(static_cast<int>(d.counts[r]));
      s += ", counts " + rank_list(c);
      break;
    }
    case op_kind::all_to_all_v: break;
    default: s += weft::detail::concat(", count ", d.fp.count);
  }
  if (d.fp.root >= 0) s += weft::detail::concat(", root ", d.fp.root);
  switch (d.fp.op) {
    case op_kind::all_reduce:
    case op_kind::reduce:
    case op_kind::reduce_scatter:
    case op_kind::reduce_scatter_v: s += weft::detail::concat(", op ", to_string(d.fp.reduction)); break;
    default: break;
  }
  return s + ")";
}

[[noreturn]] inline void throw_fault(fault_info const& f, std::string const& context) {
  std::string const msg = context + ": " + (f.message.empty() ? "the communicator is poisoned" : f.message);
  switch (f.kind) {
    case errc::timeout: throw timeout_error(msg, f.missing);
    case errc::peer_aborted: throw peer_aborted_error(msg, f.origin);
    case errc::mismatch: throw mismatch_error(msg);
    default: throw comm_error(msg);
  }
}

inline std::byte* bytes_of(void* p) noexcept { return static_cast<std::byte*>(p); }

inline bool overlap(buffer_view const& a, buffer_view const& b) noexcept {
  if (a.count == 0 || b.count == 0) return false;
  auto const a0 = reinterpret_cast<std::uintptr_t>(a.data);
  auto const b0 = reinterpret_cast<std::uintptr_t>(b.data);
  return a0 < b0 + b.bytes() && b0 < a0 + a.bytes();
}

//! Pending work of isend/irecv.
class p2p_work;

}  // namespace detail

//! A rank of a group of threads. Obtain one from threads::world (which runs a callable on every
//! rank) or threads::make_communicators (for your own threads). Models Communicator:
//!  - blocking calls return completed work; isend/irecv return pending work;
//!  - results of reductions are bitwise equal to the serial rank-ordered reference;
//!  - count 0 is a local no-op, not a synchronisation point (barrier and split always are);
//!  - send is synchronous (returns once the receiver has the data); pair isend/irecv to exchange;
//!  - one thread uses a communicator (and its work) at a time; abort() may come from any thread.
//! A default-constructed or moved-from communicator, or one from split with a negative color, is
//! a non-member: size() == 0, rank() == -1, and every operation throws invalid_argument_error.
class communicator {
 public:
  using communicator_concept = communicator_tag;
  using memory_space = host_space;

  communicator() = default;
  communicator(communicator&&) noexcept = default;
  communicator& operator=(communicator&& other) noexcept {
    if (this != &other) {
      release();
      group_ = std::move(other.group_);
      state_ = std::move(other.state_);
      rank_ = std::exchange(other.rank_, -1);
    }
    return *this;
  }
  communicator(communicator const&) = delete;
  communicator& operator=(communicator const&) = delete;
  ~communicator() { release(); }

  [[nodiscard]] int rank() const noexcept { return group_ ? rank_ : -1; }
  [[nodiscard]] int size() const noexcept { return group_ ? group_->size() : 0; }
  [[nodiscard]] comm_state state() const noexcept {
    if (!group_) return comm_state::healthy;
    if (state_->aborted.load(std::memory_order_acquire)) return comm_state::aborted;
    return group_->faulted() ? comm_state::poisoned : comm_state::healthy;
  }
  //! The rank of this thread in the world the communicator was split from (for messages).
  [[nodiscard]] int world_rank() const noexcept { return group_ ? group_->world_rank(rank_) : -1; }
  //! The name that errors raised in this communicator give its group ("tp": device_mesh names
  //! each axis group after its axis). Errors in a group made by split name the group and give
  //! each rank they mention as "rank 1 (world rank 3)".
  void set_name(std::string name) {
    if (state_) state_->name = std::move(name);
  }
  [[nodiscard]] std::string const& name() const noexcept {
    static std::string const none;
    return state_ ? state_->name : none;
  }

  //! This communicator's default deadline (inherited by split); op_options::timeout overrides it.
  [[nodiscard]] std::chrono::milliseconds timeout() const noexcept {
    return state_ ? state_->timeout : std::chrono::milliseconds{0};
  }
  void set_timeout(std::chrono::milliseconds t) {
    WEFT_EXPECTS(t.count() > 0, "timeout", "> 0 ms", t.count());
    if (state_) state_->timeout = t;
  }

  //! The last options::history_size operations of this rank, oldest first.
  [[nodiscard]] std::vector<op_record> history() const {
    return state_ ? state_->history() : std::vector<op_record>{};
  }
  //! Called with the record of every operation when it completes or fails (on this rank's
  //! thread). A hook that throws on success propagates its exception to the caller; on failure
  //! it is ignored so that the communication error is the one reported.
  void set_hook(op_hook hook) {
    if (state_) state_->hook = std::move(hook);
  }

  // ---- collectives ---------------------------------------------------------------------------

  work all_reduce(buffer_view in, buffer_view out, reduce_op op = {}, op_options o = {}) {
    call c = begin(op_kind::all_reduce, o);
    check_buffer(in, "in");
    check_buffer(out, "out");
    check_same_type(in, out);
    WEFT_EXPECTS_SHAPE(out.count == in.count, "out.count", in.count, out.count);
    check_in_place_or_disjoint(in, out, in.data == out.data, "out == in (in-place)");
    validate_reduce_op(op, in.type);
    c.d.fp = {op_kind::all_reduce, in.type, in.count, -1, op.kind, 0};
    c.d.scalar = op.scalar;
    c.d.send = detail::bytes_of(in.data);
    c.d.recv = detail::bytes_of(out.data);
    c.rec.send_bytes = in.bytes();
    c.rec.recv_bytes = out.bytes();
    if (in.count == 0) return finish_trivial(c);
    if (size() == 1) {
      return finish_local(c, [&] { reduce_local(in, out, op); });
    }
    bool const staged = in.bytes() <= group_->opts().small_message_bytes;
    auto const n = size();
    return run(
        c,
        [&](std::uint64_t seq) {
          if (!staged) return;
          auto& buf = group_->slot(rank_).staging[seq & 1u];
          if (!buf) buf.reset(new std::byte[std::max<std::size_t>(group_->opts().small_message_bytes, 1)]);
          std::memcpy(buf.get(), in.data, in.bytes());
          c.d.send = buf.get();
        },
        [&](std::uint64_t seq) {
          auto const es = size_of(in.type);
          if (staged) {
            // Every rank folds all staged inputs: no rank reads a buffer its owner may change.
            gathered_reduce(seq, in.type, op.kind, c.d.recv, 0, in.count);
            return;
          }
          // Reduce-scatter fused with a pushed all-gather: rank r folds slice r of every input
          // and writes the result into slice r of every rank's output. Only rank r touches slice
          // r of any buffer, and each block is read fully before it is written, so in-place
          // (send == recv) is safe; the final barrier keeps every buffer alive until all slices
          // have landed.
          auto const mine = detail::balanced_part(in.count, n, rank_);
          gathered_reduce(seq, in.type, op.kind, nullptr, mine.offset * es, mine.count, true);
          phase(seq, 2);
        });
  }

  work reduce(buffer_view in, buffer_view out, reduce_op op, int root, op_options o = {}) {
    call c = begin(op_kind::reduce, o);
    check_rank(root, "root");
    check_buffer(in, "in");
    bool const is_root = root == rank_;
    if (is_root) {
      check_buffer(out, "out");
      check_same_type(in, out);
      WEFT_EXPECTS_SHAPE(out.count == in.count, "out.count (on the root)", in.count, out.count);
      check_in_place_or_disjoint(in, out, in.data == out.data, "out == in (in-place)");
    }
    validate_reduce_op(op, in.type);
    c.d.fp = {op_kind::reduce, in.type, in.count, root, op.kind, 0};
    c.d.scalar = op.scalar;
    c.d.send = detail::bytes_of(in.data);
    c.d.recv = is_root ? detail::bytes_of(out.data) : nullptr;
    c.rec.root_or_peer = root;
    c.rec.send_bytes = in.bytes();
    c.rec.recv_bytes = is_root ? in.bytes() : 0;
    if (in.count == 0) return finish_trivial(c);
    if (size() == 1) return finish_local(c, [&] { reduce_local(in, out, op); });
    return run(c, nullptr, [&](std::uint64_t seq) {
      // Every rank folds its slice of all inputs straight into the root's output.
      auto const es = size_of(in.type);
      auto const mine = detail::balanced_part(in.count, size(), rank_);
      gathered_reduce(seq, in.type, op.kind, peer(seq, root).recv + mine.offset * es,
                      mine.offset * es, mine.count);
      phase(seq, 2);
    });
  }

  work broadcast(buffer_view in, buffer_view out, int root, op_options o = {}) {
    call c = begin(op_kind::broadcast, o);
    check_rank(root, "root");
    check_buffer(out, "out");
    bool const is_root = root == rank_;
    if (is_root) {
      check_buffer(in, "in");
      check_same_type(in, out);
      WEFT_EXPECTS_SHAPE(in.count == out.count, "in.count (on the root)", out.count, in.count);
      check_in_place_or_disjoint(in, out, in.data == out.data, "out == in (in-place)");
    }
    c.d.fp = {op_kind::broadcast, out.type, out.count, root, reduce_kind::sum, 0};
    c.d.send = is_root ? detail::bytes_of(in.data) : nullptr;
    c.d.recv = detail::bytes_of(out.data);
    c.rec.root_or_peer = root;
    c.rec.send_bytes = is_root ? in.bytes() : 0;
    c.rec.recv_bytes = out.bytes();
    if (out.count == 0) return finish_trivial(c);
    auto const copy_own = [&] {
      if (in.data != out.data) std::memcpy(out.data, in.data, out.bytes());
    };
    if (size() == 1) return finish_local(c, copy_own);
    return run(c, nullptr, [&](std::uint64_t seq) {
      if (is_root) {
        copy_own();
      } else {
        std::memcpy(out.data, peer(seq, root).send, out.bytes());
      }
      phase(seq, 2);
    });
  }

  work all_gather(buffer_view in, buffer_view out, op_options o = {}) {
    call c = begin(op_kind::all_gather, o);
    check_buffer(in, "in");
    check_buffer(out, "out");
    check_same_type(in, out);
    auto const n = static_cast<std::size_t>(size());
    WEFT_EXPECTS_SHAPE(out.count == weft::comm::detail::checked_mul(n, in.count, "size() * in.count"), "out.count",
                       weft::detail::concat(weft::comm::detail::checked_mul(n, in.count, "size() * in.count"), " (size() * in.count)"), out.count);
    auto const es = size_of(in.type);
    bool const in_place =
        in.count != 0 && detail::bytes_of(in.data) == detail::bytes_of(out.data) + me() * in.count * es;
    check_in_place_or_disjoint(in, out, in_place, "in == out + rank() * in.count (in-place)");
    c.d.fp = {op_kind::all_gather, in.type, in.count, -1, reduce_kind::sum, 0};
    c.d.send = detail::bytes_of(in.data);
    c.d.recv = detail::bytes_of(out.data);
    c.rec.send_bytes = in.bytes();
    c.rec.recv_bytes = out.bytes();
    if (in.count == 0) return finish_trivial(c);
    auto const copy_own = [&] {
      if (!in_place) std::memcpy(c.d.recv + me() * in.count * es, in.data, in.bytes());
    };
    if (size() == 1) return finish_local(c, copy_own);
    return run(c, nullptr, [&](std::uint64_t seq) {
      // Start at the own block and stagger the rest so ranks do not all read rank 0 first.
      copy_own();
      for (int k = 1; k < size(); ++k) {
        int const s = (rank_ + k) % size();
        std::memcpy(c.d.recv + static_cast<std::size_t>(s) * in.count * es, peer(seq, s).send,
                    in.bytes());
      }
      phase(seq, 2);
    });
  }

  work all_gather_v(buffer_view in, buffer_view out, std::span<std::size_t const> counts,
                    op_options o = {}) {
    call c = begin(op_kind::all_gather_v, o);
    check_counts(counts, "counts");
    check_buffer(in, "in");
    check_buffer(out, "out");
    check_same_type(in, out);
    auto const offsets = weft::comm::detail::checked_offsets(counts, in.type, "counts");
    std::size_t const total = offsets.back();
    WEFT_EXPECTS_SHAPE(in.count == counts[me()], "in.count",
                       weft::detail::concat(counts[me()], " (counts[rank()])"), in.count);
    WEFT_EXPECTS_SHAPE(out.count == total, "out.count",
                       weft::detail::concat(total, " (the sum of counts)"), out.count);
    auto const es = size_of(in.type);
    bool const in_place = in.count != 0 && detail::bytes_of(in.data) ==
                                               detail::bytes_of(out.data) + offsets[me()] * es;
    check_in_place_or_disjoint(in, out, in_place,
                               "in == out + (counts[0] + ... + counts[rank()-1]) (in-place)");
    c.d.fp = {op_kind::all_gather_v, in.type, 0, -1, reduce_kind::sum, 0};
    c.d.send = detail::bytes_of(in.data);
    c.d.recv = detail::bytes_of(out.data);
    c.d.counts = counts.data();
    c.rec.send_bytes = in.bytes();
    c.rec.recv_bytes = out.bytes();
    if (total == 0) return finish_trivial(c);
    auto const copy_own = [&] {
      if (!in_place && in.count != 0) std::memcpy(c.d.recv + offsets[me()] * es, in.data, in.bytes());
    };
    if (size() == 1) return finish_local(c, copy_own);
    return run(c, nullptr, [&](std::uint64_t seq) {
      copy_own();
      for (int k = 1; k < size(); ++k) {
        int const s = (rank_ + k) % size();
        auto const cnt = counts[static_cast<std::size_t>(s)];
        if (cnt != 0)
          std::memcpy(c.d.recv + offsets[static_cast<std::size_t>(s)] * es, peer(seq, s).send,
                      cnt * es);
      }
      phase(seq, 2);
    });
  }

  work reduce_scatter(buffer_view in, buffer_view out, reduce_op op = {}, op_options o = {}) {
    call c = begin(op_kind::reduce_scatter, o);
    check_buffer(in, "in");
    check_buffer(out, "out");
    check_same_type(in, out);
    auto const n = static_cast<std::size_t>(size());
    WEFT_EXPECTS_SHAPE(in.count == weft::comm::detail::checked_mul(n, out.count, "size() * out.count"), "in.count",
                       weft::detail::concat(weft::comm::detail::checked_mul(n, out.count, "size() * out.count"), " (size() * out.count)"), in.count);
    auto const es = size_of(in.type);
    bool const in_place = out.count != 0 && detail::bytes_of(out.data) ==
                                                detail::bytes_of(in.data) + me() * out.count * es;
    check_in_place_or_disjoint(in, out, in_place, "out == in + rank() * out.count (in-place)");
    validate_reduce_op(op, in.type);
    c.d.fp = {op_kind::reduce_scatter, in.type, out.count, -1, op.kind, 0};
    c.d.scalar = op.scalar;
    c.d.send = detail::bytes_of(in.data);
    c.d.recv = detail::bytes_of(out.data);
    c.rec.send_bytes = in.bytes();
    c.rec.recv_bytes = out.bytes();
    if (out.count == 0) return finish_trivial(c);
    if (size() == 1) return finish_local(c, [&] { reduce_local(in, out, op); });
    return run(c, nullptr, [&](std::uint64_t seq) {
      gathered_reduce(seq, in.type, op.kind, c.d.recv, me() * out.count * es, out.count);
      phase(seq, 2);
    });
  }

  work reduce_scatter_v(buffer_view in, buffer_view out, std::span<std::size_t const> counts,
                        reduce_op op = {}, op_options o = {}) {
    call c = begin(op_kind::reduce_scatter_v, o);
    check_counts(counts, "counts");
    check_buffer(in, "in");
    check_buffer(out, "out");
    check_same_type(in, out);
    auto const offsets = weft::comm::detail::checked_offsets(counts, in.type, "counts");
    std::size_t const total = offsets.back();
    WEFT_EXPECTS_SHAPE(out.count == counts[me()], "out.count",
                       weft::detail::concat(counts[me()], " (counts[rank()])"), out.count);
    WEFT_EXPECTS_SHAPE(in.count == total, "in.count",
                       weft::detail::concat(total, " (the sum of counts)"), in.count);
    auto const es = size_of(in.type);
    bool const in_place = out.count != 0 && detail::bytes_of(out.data) ==
                                                detail::bytes_of(in.data) + offsets[me()] * es;
    check_in_place_or_disjoint(in, out, in_place,
                               "out == in + (counts[0] + ... + counts[rank()-1]) (in-place)");
    validate_reduce_op(op, in.type);
    c.d.fp = {op_kind::reduce_scatter_v, in.type, 0, -1, op.kind, 0};
    c.d.scalar = op.scalar;
    c.d.send = detail::bytes_of(in.data);
    c.d.recv = detail::bytes_of(out.data);
    c.d.counts = counts.data();
    c.rec.send_bytes = in.bytes();
    c.rec.recv_bytes = out.bytes();
    if (total == 0) return finish_trivial(c);
    if (size() == 1) return finish_local(c, [&] { reduce_local(in, out, op); });
    return run(c, nullptr, [&](std::uint64_t seq) {
      gathered_reduce(seq, in.type, op.kind, c.d.recv, offsets[me()] * es, out.count);
      phase(seq, 2);
    });
  }

  work all_to_all(buffer_view in, buffer_view out, op_options o = {}) {
    call c = begin(op_kind::all_to_all, o);
    check_buffer(in, "in");
    check_buffer(out, "out");
    check_same_type(in, out);
    auto const n = static_cast<std::size_t>(size());
    WEFT_EXPECTS_SHAPE(out.count == in.count, "out.count", in.count, out.count);
    WEFT_EXPECTS_SHAPE(in.count % n == 0, "in.count",
                       weft::detail::concat("a multiple of size() = ", n), in.count);
    bool const in_place = in.data == out.data && in.count != 0;
    check_in_place_or_disjoint(in, out, in_place, "out == in (in-place)");
    std::size_t const block = in.count / n;
    c.d.fp = {op_kind::all_to_all, in.type, in.count, -1, reduce_kind::sum, 0};
    c.d.send = detail::bytes_of(in.data);
    c.d.recv = detail::bytes_of(out.data);
    c.rec.send_bytes = in.bytes();
    c.rec.recv_bytes = out.bytes();
    if (in.count == 0) return finish_trivial(c);
    auto const es = size_of(in.type);
    if (size() == 1) return finish_local(c, [&] {
        if (!in_place) std::memcpy(out.data, in.data, in.bytes());
      });
    // In-place: peers read our blocks while we overwrite them, so they read a private copy.
    std::vector<std::byte> copy;
    return run(
        c,
        [&](std::uint64_t) {
          if (!in_place) return;
          copy.assign(c.d.send, c.d.send + in.bytes());
          c.d.send = copy.data();
        },
        [&](std::uint64_t seq) {
          for (int k = 0; k < size(); ++k) {
            int const s = (rank_ + k) % size();
            std::memcpy(c.d.recv + static_cast<std::size_t>(s) * block * es,
                        peer(seq, s).send + me() * block * es, block * es);
          }
          phase(seq, 2);
        });
  }

  work all_to_all_v(buffer_view in, buffer_view out, std::span<std::size_t const> send_counts,
                    std::span<std::size_t const> recv_counts, op_options o = {}) {
    call c = begin(op_kind::all_to_all_v, o);
    check_counts(send_counts, "send_counts");
    check_counts(recv_counts, "recv_counts");
    check_buffer(in, "in");
    check_buffer(out, "out");
    check_same_type(in, out);
    auto const soff = weft::comm::detail::checked_offsets(send_counts, in.type, "send_counts");
    auto const roff = weft::comm::detail::checked_offsets(recv_counts, in.type, "recv_counts");
    WEFT_EXPECTS_SHAPE(in.count == soff.back(), "in.count",
                       weft::detail::concat(soff.back(), " (the sum of send_counts)"), in.count);
    WEFT_EXPECTS_SHAPE(out.count == roff.back(), "out.count",
                       weft::detail::concat(roff.back(), " (the sum of recv_counts)"), out.count);
    WEFT_EXPECTS_SHAPE(send_counts[me()] == recv_counts[me()], "recv_counts[rank()]",
                       weft::detail::concat(send_counts[me()], " (send_counts[rank()])"),
                       recv_counts[me()]);
    bool const in_place = in.data == out.data && in.count != 0;
    check_in_place_or_disjoint(in, out, in_place, "out == in (in-place)");
    c.d.fp = {op_kind::all_to_all_v, in.type, 0, -1, reduce_kind::sum, 0};
    c.d.send = detail::bytes_of(in.data);
    c.d.recv = detail::bytes_of(out.data);
    c.d.counts = send_counts.data();
    c.d.counts2 = recv_counts.data();
    c.rec.send_bytes = in.bytes();
    c.rec.recv_bytes = out.bytes();
    auto const es = size_of(in.type);
    // Not a local no-op at count 0: whether anything moves depends on the peers' counts.
    if (size() == 1) return finish_local(c, [&] {
        if (!in_place && in.count != 0) std::memcpy(out.data, in.data, in.bytes());
      });
    std::vector<std::byte> copy;
    return run(
        c,
        [&](std::uint64_t) {
          if (!in_place) return;
          copy.assign(c.d.send, c.d.send + in.bytes());
          c.d.send = copy.data();
        },
        [&](std::uint64_t seq) {
          for (int k = 0; k < size(); ++k) {
            int const s = (rank_ + k) % size();
            auto const cnt = recv_counts[static_cast<std::size_t>(s)];
            if (cnt == 0) continue;
            auto const& ps = peer(seq, s);
            std::size_t from = 0;  // where s's block for us starts in s's input
            for (std::size_t t = 0; t < me(); ++t) from += ps.counts[t];
            std::memcpy(c.d.recv + roff[static_cast<std::size_t>(s)] * es, ps.send + from * es,
                        cnt * es);
          }
          phase(seq, 2);
        });
  }

  work gather(buffer_view in, buffer_view out, int root, op_options o = {}) {
    call c = begin(op_kind::gather, o);
    check_rank(root, "root");
    check_buffer(in, "in");
    bool const is_root = root == rank_;
    auto const es = size_of(in.type);
    bool in_place = false;
    if (is_root) {
      check_buffer(out, "out");
      check_same_type(in, out);
      auto const n = static_cast<std::size_t>(size());
      WEFT_EXPECTS_SHAPE(out.count == weft::comm::detail::checked_mul(n, in.count, "size() * in.count"), "out.count (on the root)",
                         weft::detail::concat(weft::comm::detail::checked_mul(n, in.count, "size() * in.count"), " (size() * in.count)"), out.count);
      in_place = in.count != 0 &&
                 detail::bytes_of(in.data) == detail::bytes_of(out.data) + me() * in.count * es;
      check_in_place_or_disjoint(in, out, in_place, "in == out + root * in.count (in-place)");
    }
    c.d.fp = {op_kind::gather, in.type, in.count, root, reduce_kind::sum, 0};
    c.d.send = detail::bytes_of(in.data);
    c.d.recv = is_root ? detail::bytes_of(out.data) : nullptr;
    c.rec.root_or_peer = root;
    c.rec.send_bytes = in.bytes();
    c.rec.recv_bytes = is_root ? out.bytes() : 0;
    if (in.count == 0) return finish_trivial(c);
    if (size() == 1) return finish_local(c, [&] {
        if (!in_place) std::memcpy(out.data, in.data, in.bytes());
      });
    return run(c, nullptr, [&](std::uint64_t seq) {
      // Every rank writes its own block into the root's output, in parallel.
      if (!(is_root && in_place))
        std::memcpy(peer(seq, root).recv + me() * in.count * es, in.data, in.bytes());
      phase(seq, 2);
    });
  }

  work scatter(buffer_view in, buffer_view out, int root, op_options o = {}) {
    call c = begin(op_kind::scatter, o);
    check_rank(root, "root");
    check_buffer(out, "out");
    bool const is_root = root == rank_;
    auto const es = size_of(out.type);
    bool in_place = false;
    if (is_root) {
      check_buffer(in, "in");
      check_same_type(in, out);
      auto const n = static_cast<std::size_t>(size());
      WEFT_EXPECTS_SHAPE(in.count == weft::comm::detail::checked_mul(n, out.count, "size() * out.count"), "in.count (on the root)",
                         weft::detail::concat(weft::comm::detail::checked_mul(n, out.count, "size() * out.count"), " (size() * out.count)"), in.count);
      in_place = out.count != 0 &&
                 detail::bytes_of(out.data) == detail::bytes_of(in.data) + me() * out.count * es;
      check_in_place_or_disjoint(in, out, in_place, "out == in + root * out.count (in-place)");
    }
    c.d.fp = {op_kind::scatter, out.type, out.count, root, reduce_kind::sum, 0};
    c.d.send = is_root ? detail::bytes_of(in.data) : nullptr;
    c.d.recv = detail::bytes_of(out.data);
    c.rec.root_or_peer = root;
    c.rec.send_bytes = is_root ? in.bytes() : 0;
    c.rec.recv_bytes = out.bytes();
    if (out.count == 0) return finish_trivial(c);
    if (size() == 1) return finish_local(c, [&] {
        if (!in_place) std::memcpy(out.data, in.data, out.bytes());
      });
    return run(c, nullptr, [&](std::uint64_t seq) {
      if (!(is_root && in_place))
        std::memcpy(out.data, peer(seq, root).send + me() * out.count * es, out.bytes());
      phase(seq, 2);
    });
  }

  work barrier(op_options o = {}) {
    call c = begin(op_kind::barrier, o);
    c.d.fp = {op_kind::barrier, dtype::u8, 0, -1, reduce_kind::sum, 0};
    if (size() == 1) return finish_local(c, [] {});
    return run(c, nullptr, [](std::uint64_t) {});
  }

  //! Collective over this communicator: ranks passing the same color >= 0 form a new
  //! communicator ordered by (key, rank here); a negative color yields a non-member (size 0).
  //! The new communicator inherits the options and timeout; aborting this one aborts it too.
  communicator split(int color, int key) {
    call c = begin(op_kind::split, {});
    c.d.fp = {op_kind::split, dtype::u8, 0, -1, reduce_kind::sum, 0};
    c.d.color = color;
    c.d.key = key;
    communicator result;
    if (size() == 1) {
      finish_local(c, [&] {
        if (color < 0) return;
        auto g = std::make_shared<detail::group>(1, group_->opts(), std::vector<int>{world_rank()},
                                                 true);
        group_->add_child(g, {rank_});
        result = make_child(std::move(g), 0);
      });
      return result;
    }
    run(c, nullptr, [&](std::uint64_t seq) {
      int const n = size();
      std::vector<int> members;  // ranks here, in new-rank order
      if (color >= 0) {
        for (int s = 0; s < n; ++s)
          if (peer(seq, s).color == color) members.push_back(s);
        std::stable_sort(members.begin(), members.end(),
                         [&](int a, int b) { return peer(seq, a).key < peer(seq, b).key; });
      }
      bool const leader = !members.empty() && members.front() == rank_;
      if (leader) {
        std::vector<int> world;
        for (int m : members) world.push_back(group_->world_rank(m));
        auto g = std::make_shared<detail::group>(static_cast<int>(members.size()), group_->opts(),
                                                 std::move(world), true);
        group_->add_child(g, members);
        group_->slot(rank_).split_out = std::move(g);
      }
      phase(seq, 1);
      bool lost = false;
      if (!members.empty()) {
        auto g = group_->slot(members.front()).split_out;
        lost = g == nullptr;  // the leader failed to create it (and poisoned this group)
        auto const it = std::find(members.begin(), members.end(), rank_);
        if (!lost) result = make_child(std::move(g), static_cast<int>(it - members.begin()));
      }
      phase(seq, 2);
      if (leader) group_->slot(rank_).split_out.reset();
      if (lost) detail::throw_fault(group_->fault(), context(c));
    });
    return result;
  }

  // ---- point-to-point ------------------------------------------------------------------------
  // Messages between a pair of ranks match in the order they were posted (FIFO per direction);
  // the count and dtype of a matched send and receive must agree (mismatch_error otherwise).
  // The rank that completes a match copies the data once, straight between the user buffers.

  work isend(buffer_view in, int peer_rank, op_options o = {}) {
    return post_p2p(true, in, peer_rank, o);
  }
  work irecv(buffer_view out, int peer_rank, op_options o = {}) {
    return post_p2p(false, out, peer_rank, o);
  }
  //! Returns once the receiver has copied the data (synchronous mode): a cycle of blocking sends
  //! waits until the deadline. Use isend/irecv for exchanges.
  work send(buffer_view in, int peer_rank, op_options o = {}) {
    work w = isend(in, peer_rank, o);
    w.wait();
    return work{};
  }
  work recv(buffer_view out, int peer_rank, op_options o = {}) {
    work w = irecv(out, peer_rank, o);
    w.wait();
    return work{};
  }

  //! Poisons this communicator for every rank (each pending and later call throws
  //! peer_aborted_error naming this rank) and every communicator split from it. Idempotent;
  //! safe from any thread.
  void abort() noexcept {
    if (!group_) return;
    if (state_->aborted.exchange(true)) return;
    try {
      group_->abort_tree(rank_, weft::detail::concat(detail::who(*group_, rank_),
                                                     detail::group_label(*group_, state_->name),
                                                     " called abort()"));
    } catch (...) {
      group_->abort_tree(rank_, {});
    }
  }

  //! As abort(), with the reason that peers' exceptions will quote (threads::world passes the
  //! failed rank's exception message).
  void abort(std::string const& reason) noexcept {
    if (!group_) return;
    if (state_->aborted.exchange(true)) return;
    group_->abort_tree(rank_, reason);
  }

 private:
  friend class detail::p2p_work;
  friend class world;
  friend std::vector<communicator> make_communicators(int, options);

  using clock = detail::clock;

  struct call {
    detail::descriptor d{};
    op_record rec{};
    clock::time_point deadline{};
    std::chrono::milliseconds timeout{0};
  };

  communicator(std::shared_ptr<detail::group> g, int rank, std::chrono::milliseconds timeout)
      : group_(std::move(g)), state_(std::make_shared<detail::rank_state>()), rank_(rank) {
    auto const n = static_cast<std::size_t>(group_->size());
    state_->timeout = timeout;
    state_->send_seq.assign(n, 0);
    state_->recv_seq.assign(n, 0);
    state_->capacity = group_->opts().history_size;
  }

  communicator make_child(std::shared_ptr<detail::group> g, int new_rank) const {
    return communicator(std::move(g), new_rank, state_->timeout);
  }

  [[nodiscard]] std::size_t me() const noexcept { return static_cast<std::size_t>(rank_); }

  [[nodiscard]] std::string context(call const& c) const {
    std::string s = weft::detail::concat(to_string(c.rec.op), " on ", detail::who(*group_, rank_),
                                         detail::group_label(*group_, state_->name));
    if (c.rec.seq != 0) s += weft::detail::concat(" (seq ", c.rec.seq, ")");
    return s;
  }

  // Entry of every operation: membership and per-call timeout. Nothing is communicated.
  call begin(op_kind op, op_options const& o) {
    WEFT_EXPECTS(group_ != nullptr, "communicator",
                 "a member communicator (size() > 0)",
                 "a non-member (default-constructed, moved-from, or split with a negative color)");
    call c;
    c.rec.op = op;
    c.rec.start = clock::now();
    c.rec.end = c.rec.start;
    WEFT_EXPECTS(o.timeout.count() >= 0, "options.timeout", ">= 0 ms (0: the communicator's default)",
                 o.timeout.count());
    c.timeout = o.timeout.count() > 0 ? o.timeout : state_->timeout;
    return c;
  }

  // After the local argument checks, before anything is communicated or changed: a poisoned
  // communicator fails every call. Arguments come first so that ranks making the same invalid
  // call each get their own argument error, not a peer_aborted_error from whichever of them
  // threw first (threads::world aborts the world when a rank throws).
  void check_alive(call const& c) const {
    if (state_->aborted.load(std::memory_order_acquire) || group_->faulted()) {
      detail::fault_info f = group_->fault();
      detail::throw_fault(f, context(c) + " on a poisoned communicator");
    }
  }

  void check_rank(int r, char const* name) const {
    WEFT_EXPECTS(r >= 0 && r < size(), name, weft::detail::concat("a rank in [0, ", size(), ")"), r);
  }

  static void check_buffer(buffer_view const& b, char const* name) {
    WEFT_EXPECTS(weft::detail::is_valid(b.type), std::string(name) + ".type",
                 "one of f32, f64, bf16, f16, i32, i64, u8", b.type);
    WEFT_EXPECTS(b.where == memory_kind::host, std::string(name) + ".where",
                 "host memory (the threads backend shares host memory)", to_string(b.where));
    WEFT_EXPECTS(b.count == 0 || b.data != nullptr, std::string(name) + ".data",
                 "non-null when count > 0", "nullptr");
    (void)weft::comm::detail::checked_bytes(b.count, b.type, std::string(name) + ".count");
  }

  static void check_same_type(buffer_view const& in, buffer_view const& out) {
    WEFT_EXPECTS(out.type == in.type, "out.type", weft::detail::concat(in.type, " (in.type)"),
                 out.type);
  }

  static void check_in_place_or_disjoint(buffer_view const& in, buffer_view const& out,
                                         bool in_place, char const* allowed) {
    WEFT_EXPECTS(in_place || !detail::overlap(in, out), "out",
                 weft::detail::concat("disjoint from `in` or exactly ", allowed),
                 "a partial overlap with `in`");
  }

  void check_counts(std::span<std::size_t const> counts, char const* name) const {
    WEFT_EXPECTS(counts.size() == static_cast<std::size_t>(size()),
                 weft::detail::concat(name, ".size()"), weft::detail::concat(size(), " (size())"),
                 counts.size());
  }

  void reduce_local(buffer_view const& in, buffer_view const& out, reduce_op op) const {
    std::byte const* ins[1] = {detail::bytes_of(in.data)};
    double const scalars[1] = {op.scalar};
    detail::reduce_bytes(in.type, op.kind, detail::bytes_of(out.data), ins, scalars, 1,
                         std::min(in.count, out.count));
  }

  detail::descriptor const& peer(std::uint64_t seq, int s) noexcept {
    return group_->slot(s).desc[seq & 1u];
  }

  // Folds elements [byte_offset, +count) of every rank's send buffer, in rank order, into out
  // (or, with to_all, into the same elements of every rank's receive buffer).
  void gathered_reduce(std::uint64_t seq, dtype type, reduce_kind kind, std::byte* out,
                       std::size_t byte_offset, std::size_t count, bool to_all = false) {
    if (count == 0) return;
    int const n = size();
    constexpr int stack_ranks = 64;
    std::byte const* ins_stack[stack_ranks];
    std::byte* outs_stack[stack_ranks];
    double scal_stack[stack_ranks];
    std::vector<std::byte const*> ins_heap;
    std::vector<std::byte*> outs_heap;
    std::vector<double> scal_heap;
    std::byte const** ins = ins_stack;
    std::byte** outs = outs_stack;
    double* scal = scal_stack;
    if (n > stack_ranks) {
      ins_heap.resize(static_cast<std::size_t>(n));
      outs_heap.resize(static_cast<std::size_t>(n));
      scal_heap.resize(static_cast<std::size_t>(n));
      ins = ins_heap.data();
      outs = outs_heap.data();
      scal = scal_heap.data();
    }
    for (int s = 0; s < n; ++s) {
      auto const& d = peer(seq, s);
      ins[s] = d.send + byte_offset;
      scal[s] = d.scalar;
      outs[s] = to_all ? d.recv + byte_offset : nullptr;
    }
    if (to_all) {
      detail::reduce_bytes(type, kind, outs, n, ins, scal, n, count);
    } else {
      detail::reduce_bytes(type, kind, out, ins, scal, n, count);
    }
  }

  // A barrier after barrier A: every rank that passed A reaches it in bounded time (it only
  // copies and reduces), so it has no deadline and is not interrupted by faults; buffers stay
  // in use until it is passed, which is what makes an exception elsewhere safe.
  void phase(std::uint64_t seq, int p) {
    std::uint64_t const target = 4 * seq + static_cast<std::uint64_t>(p);
    group_->slot(rank_).progress.store(target, std::memory_order_seq_cst);
    group_->park().notify_all();
    int const n = size();
    group_->park().wait_until(
        [&] {
          for (int s = 0; s < n; ++s)
            if (group_->slot(s).progress.load(std::memory_order_acquire) < target) return false;
          return true;
        },
        clock::time_point::max());
  }

  work finish_trivial(call& c) {
    check_alive(c);
    c.rec.type = c.d.fp.type;
    c.rec.end = clock::now();
    state_->add(c.rec);
    state_->call_hook(c.rec, true);
    return work{};
  }

  template <class Local>
  work finish_local(call& c, Local&& local) {
    check_alive(c);
    c.rec.seq = ++state_->seq;
    local();
    return finish_trivial(c);
  }

  // Barrier A with the deadline: arrive, wait for all, or give up by closing the barrier.
  void arrive_all(call& c, std::uint64_t seq) {
    auto& g = *group_;
    g.slot(rank_).arrived.store(seq, std::memory_order_relaxed);
    if (!g.arrive(seq)) detail::throw_fault(g.fault(), context(c));
    auto const deadline = detail::deadline_after(c.timeout);
    for (;;) {
      bool const ok = g.park().wait_until(
          [&] { return g.all_arrived(seq) || g.faulted() || g.departed_missing(seq) >= 0; },
          deadline);
      if (g.all_arrived(seq)) return;
      int const gone = g.departed_missing(seq);
      if (ok && !g.faulted() && gone < 0) continue;  // spurious
      bool const timed_out = !g.faulted() && gone < 0;
      bool const closed = g.close_or_pass(seq, [&](detail::group& grp) {
        if (grp.faulted()) return;
        if (gone >= 0) {
          // It will never arrive: waiting for the deadline would only delay the same failure.
          detail::fault_info f;
          f.kind = errc::peer_aborted;
          f.origin = gone;
          f.missing = {gone};
          f.message = weft::detail::concat(
              describe(c.d, grp.size()), " at seq ", seq, " on ", detail::who(grp, rank_), ": ",
              detail::who(grp, gone), " has finished (its function returned or its communicator was destroyed) without "
              "calling it");
          grp.fail_locked(std::move(f));
          return;
        }
        if (!timed_out) return;
        std::vector<int> missing;
        std::vector<int> arrived;
        for (int s = 0; s < grp.size(); ++s)
          (grp.slot(s).arrived.load(std::memory_order_relaxed) >= seq ? arrived : missing).push_back(s);
        detail::fault_info f;
        f.kind = errc::timeout;
        f.origin = rank_;
        f.missing = missing;
        f.message = weft::detail::concat(
            describe(c.d, grp.size()), " at seq ", seq, " timed out after ", c.timeout.count(),
            " ms on ", detail::who(grp, rank_), ": ranks ", detail::ranks(grp, missing),
            " did not arrive (arrived: ", detail::ranks(grp, arrived), "; last completed seq ", seq - 1,
            ")");
        grp.fail_locked(std::move(f));
      });
      if (!closed) return;  // everyone arrived just in time
      detail::throw_fault(g.fault(), context(c));
    }
  }

  // Compares what every rank called (after barrier A, so all descriptors of `seq` are posted).
  void check_fingerprints(call& c, std::uint64_t seq) {
    int const n = size();
    auto const& d0 = peer(seq, 0);
    auto differs = [&](detail::descriptor const& a, detail::descriptor const& b) {
      std::vector<std::string_view> f;
      if (a.fp.op != b.fp.op) {
        f.push_back("op");
        return f;
      }
      if (a.fp.type != b.fp.type) f.push_back("dtype");
      if (a.fp.count != b.fp.count) f.push_back("count");
      if (a.fp.root != b.fp.root) f.push_back("root");
      if (a.fp.reduction != b.fp.reduction) f.push_back("reduction");
      if (a.fp.seq != b.fp.seq) f.push_back("sequence");
      if ((a.fp.op == op_kind::all_gather_v || a.fp.op == op_kind::reduce_scatter_v) &&
          !std::equal(a.counts, a.counts + n, b.counts))
        f.push_back("counts");
      return f;
    };
    int bad_a = -1;
    int bad_b = -1;
    std::vector<std::string_view> fields;
    for (int s = 1; s < n && bad_a < 0; ++s) {
      fields = differs(d0, peer(seq, s));
      if (!fields.empty()) {
        bad_a = 0;
        bad_b = s;
      }
    }
    if (bad_a < 0 && d0.fp.op == op_kind::all_to_all_v) {
      // What r sends to s must be what s expects from r.
      for (int r = 0; r < n && bad_a < 0; ++r)
        for (int s = 0; s < n && bad_a < 0; ++s)
          if (peer(seq, r).counts[s] != peer(seq, s).counts2[r]) {
            bad_a = r;
            bad_b = s;
            fields = {"counts"};
          }
    }
    if (bad_a < 0) return;
    std::string list;
    for (auto f : fields) list += (list.empty() ? "" : ", ") + std::string(f);
    std::string msg;
    auto const& da = peer(seq, bad_a);
    auto const& db = peer(seq, bad_b);
    if (da.fp.op == op_kind::all_to_all_v && fields.front() == "counts" && da.fp.op == db.fp.op) {
      msg = weft::detail::concat("mismatched all_to_all_v at seq ", seq, ": ",
                                 detail::who(*group_, bad_a), " sends ", da.counts[bad_b],
                                 " elements to ", detail::who(*group_, bad_b), " but ",
                                 detail::who(*group_, bad_b), " expects ", db.counts2[bad_a],
                                 " from ", detail::who(*group_, bad_a), "; they differ in: counts");
    } else {
      msg = weft::detail::concat("mismatched collectives at seq ", seq, ": ", detail::who(*group_, bad_a),
                                 " called ", describe(da, n), " but ", detail::who(*group_, bad_b),
                                 " called ", describe(db, n),
                                 "; they differ in: ", list);
    }
    detail::fault_info f;
    f.kind = errc::mismatch;
    f.origin = bad_b;
    f.message = msg;
    group_->fail(f);
    // Peers may still be reading our descriptor's counts: leave only together.
    phase(seq, 2);
    throw mismatch_error(context(c) + ": " + msg);
  }

  template <class Prepare, class Body>
  work run(call& c, Prepare&& prepare, Body&& body) {
    check_alive(c);
    std::uint64_t const seq = ++state_->seq;
    c.rec.seq = seq;
    c.rec.type = c.d.fp.type;
    c.d.fp.seq = seq;
    bool passed = false;
    try {
      if constexpr (!std::is_same_v<std::decay_t<Prepare>, std::nullptr_t>) prepare(seq);
      group_->slot(rank_).desc[seq & 1u] = c.d;
      arrive_all(c, seq);
      passed = true;
      check_fingerprints(c, seq);
      body(seq);
    } catch (comm_error const& e) {
      fail_record(c, e);
      throw;
    } catch (std::exception const& e) {
      // A local failure (out of memory in split): poison the group so that the peers learn of
      // it, finish this collective with them (they may be reading our buffers), then report.
      detail::fault_info f;
      f.kind = errc::peer_aborted;
      f.origin = rank_;
      try {
        f.message = weft::detail::concat(detail::who(*group_, rank_), " failed inside ", to_string(c.rec.op),
                                         " (seq ", seq, "): ", e.what());
      } catch (...) {
      }
      group_->fail(std::move(f));
      if (passed && group_->slot(rank_).progress.load(std::memory_order_relaxed) < 4 * seq + 2)
        phase(seq, 2);
      fail_record(c, e);
      throw;
    }
    c.rec.end = clock::now();
    state_->add(c.rec);
    state_->call_hook(c.rec, true);
    return work{};
  }

  void fail_record(call& c, std::exception const& e) noexcept {
    try {
      c.rec.ok = false;
      c.rec.error = e.what();
      c.rec.end = clock::now();
      state_->add(c.rec);
    } catch (...) {
    }
    state_->call_hook(c.rec, false);
  }

  work post_p2p(bool is_send, buffer_view b, int peer_rank, op_options const& o);

  void release() noexcept;

  std::shared_ptr<detail::group> group_;
  std::shared_ptr<detail::rank_state> state_;
  int rank_ = -1;
};

namespace detail {

class p2p_work final : public weft::comm::detail::work_state {
 public:
  p2p_work(std::shared_ptr<group> g, std::shared_ptr<p2p_op> op, std::shared_ptr<rank_state> st,
           std::uint64_t record_id, op_record rec, clock::time_point deadline,
           std::chrono::milliseconds timeout, int rank)
      : group_(std::move(g)),
        op_(std::move(op)),
        state_(std::move(st)),
        record_id_(record_id),
        rec_(std::move(rec)),
        deadline_(deadline),
        timeout_(timeout),
        rank_(rank) {}

  [[nodiscard]] bool done() const noexcept override {
    return op_->state.load(std::memory_order_acquire) == p2p_op::done;
  }

  bool wait_until(clock::time_point caller_deadline) override {
    for (;;) {
      int const st = op_->state.load(std::memory_order_acquire);
      if (st == p2p_op::done) {
        complete(true, {});
        return true;
      }
      if (st == p2p_op::failed || st == p2p_op::cancelled) rethrow_failure();
      if (st == p2p_op::claimed) {
        // The peer is copying; that is bounded, so wait for it without a deadline.
        group_->park().wait_until(
            [&] { return op_->state.load(std::memory_order_acquire) != p2p_op::claimed; },
            clock::time_point::max());
        continue;
      }
      // pending
      if (group_->faulted()) {
        if (cancel()) fail_with(group_->fault());
        continue;
      }
      int const peer = op_->is_send ? op_->dst : op_->src;
      if (group_->departed(peer)) {
        if (cancel()) {
          fault_info f;
          f.kind = errc::peer_aborted;
          f.origin = peer;
          f.missing = {peer};
          f.message = weft::detail::concat(
              op_->is_send ? "send" : "recv", " #", op_->seq, " (dtype ", op_->type, ", count ",
              op_->count, ") ", op_->is_send ? "to" : "from", " ", who(*group_, peer), " on ",
              who(*group_, rank_), ": ", who(*group_, peer), " has finished (its function returned or its communicator was destroyed) without "
              "posting the matching ",
              op_->is_send ? "recv" : "send");
          group_->fail(f);
          fail_with(f);
        }
        continue;
      }
      auto const now = clock::now();
      if (now >= deadline_) {
        if (cancel()) {
          fault_info f;
          f.kind = errc::timeout;
          f.origin = rank_;
          f.missing = {peer};
          f.message = weft::detail::concat(
              op_->is_send ? "send" : "recv", " #", op_->seq, " (dtype ", op_->type, ", count ",
              op_->count, ") ", op_->is_send ? "to" : "from", " ", who(*group_, peer),
              " timed out after ", timeout_.count(), " ms on ", who(*group_, rank_), ": ",
              who(*group_, peer), " did not post the matching ", op_->is_send ? "recv" : "send",
              " (missing ranks ", ranks(*group_, {peer}), ")");
          group_->fail(f);
          fail_with(f);
        }
        continue;
      }
      if (now >= caller_deadline) return false;
      group_->park().wait_until(
          [&] {
            return op_->state.load(std::memory_order_acquire) != p2p_op::pending ||
                   group_->faulted() || group_->departed(peer);
          },
          std::min(deadline_, caller_deadline));
    }
  }

 private:
  // Takes a pending op out of its queue so that nobody copies from or into it any more.
  bool cancel() {
    std::lock_guard<std::mutex> lock(group_->p2p_mutex);
    if (op_->state.load(std::memory_order_acquire) != p2p_op::pending) return false;
    auto& q = op_->is_send ? group_->sends(op_->src, op_->dst) : group_->recvs(op_->src, op_->dst);
    std::erase(q, op_);
    op_->state.store(p2p_op::cancelled, std::memory_order_release);
    return true;
  }

  [[noreturn]] void fail_with(fault_info const& f) {
    std::string const ctx = weft::detail::concat(op_->is_send ? "isend" : "irecv", " on ",
                                                 who(*group_, rank_), group_label(*group_, state_->name),
                                                 " (message #", op_->seq, ")");
    try {
      throw_fault(f, ctx);
    } catch (comm_error const&) {
      error_ = std::current_exception();
      complete(false, error_);
      throw;
    }
  }

  [[noreturn]] void rethrow_failure() {
    if (!error_) {
      // Failed by the peer that matched us (mismatch): it left the reason in the op.
      fault_info f;
      f.kind = op_->error_kind;
      f.origin = -1;
      f.message = op_->error;
      if (f.kind == errc::comm && group_->faulted()) f = group_->fault();
      fail_with(f);
    }
    std::rethrow_exception(error_);
  }

  void complete(bool ok, std::exception_ptr const& e) {
    if (completed_) return;
    completed_ = true;
    rec_.end = clock::now();
    rec_.ok = ok;
    if (e) {
      try {
        std::rethrow_exception(e);
      } catch (std::exception const& x) {
        rec_.error = x.what();
      } catch (...) {
      }
    }
    state_->update(record_id_, rec_);
    state_->call_hook(rec_, ok);
  }

  std::shared_ptr<group> group_;
  std::shared_ptr<p2p_op> op_;
  std::shared_ptr<rank_state> state_;
  std::uint64_t record_id_;
  op_record rec_;
  clock::time_point deadline_;
  std::chrono::milliseconds timeout_;
  int rank_;
  bool completed_ = false;
  std::exception_ptr error_;
};

}  // namespace detail

inline work communicator::post_p2p(bool is_send, buffer_view b, int peer_rank, op_options const& o) {
  call c = begin(is_send ? op_kind::send : op_kind::recv, o);
  check_rank(peer_rank, "peer");
  check_buffer(b, is_send ? "in" : "out");
  c.rec.type = b.type;
  c.rec.root_or_peer = peer_rank;
  (is_send ? c.rec.send_bytes : c.rec.recv_bytes) = b.bytes();
  auto const up = static_cast<std::size_t>(peer_rank);
  if (b.count == 0) return finish_trivial(c);
  check_alive(c);
  c.rec.seq = ++(is_send ? state_->send_seq : state_->recv_seq)[up];

  auto op = std::make_shared<detail::p2p_op>();
  op->is_send = is_send;
  op->src = is_send ? rank_ : peer_rank;
  op->dst = is_send ? peer_rank : rank_;
  op->data = detail::bytes_of(b.data);
  op->count = b.count;
  op->type = b.type;
  op->seq = c.rec.seq;

  std::shared_ptr<detail::p2p_op> match;
  bool poisoned = false;
  {
    std::lock_guard<std::mutex> lock(group_->p2p_mutex);
    if (group_->faulted()) {
      poisoned = true;
    } else {
      auto& other = is_send ? group_->recvs(op->src, op->dst) : group_->sends(op->src, op->dst);
      if (!other.empty()) {
        match = std::move(other.front());
        other.pop_front();
        match->state.store(detail::p2p_op::claimed, std::memory_order_relaxed);
      } else {
        (is_send ? group_->sends(op->src, op->dst) : group_->recvs(op->src, op->dst)).push_back(op);
      }
    }
  }
  if (poisoned) detail::throw_fault(group_->fault(), context(c) + " on a poisoned communicator");

  if (match) {
    // We complete the match: check, copy between the two user buffers, release the peer.
    if (match->count != op->count || match->type != op->type) {
      auto const& snd = is_send ? *op : *match;
      auto const& rcv = is_send ? *match : *op;
      std::string const msg = weft::detail::concat(
          "mismatched point-to-point message from ", detail::who(*group_, snd.src), " to ",
          detail::who(*group_, snd.dst),
          ": send #", snd.seq, " has dtype ", snd.type, ", count ", snd.count, " but recv #",
          rcv.seq, " has dtype ", rcv.type, ", count ", rcv.count);
      match->error_kind = errc::mismatch;
      match->error = msg;
      match->state.store(detail::p2p_op::failed, std::memory_order_release);
      detail::fault_info f;
      f.kind = errc::mismatch;
      f.origin = rank_;
      f.message = msg;
      group_->fail(f);
      c.rec.ok = false;
      c.rec.error = msg;
      c.rec.end = clock::now();
      state_->add(c.rec);
      state_->call_hook(c.rec, false);
      throw mismatch_error(context(c) + ": " + msg);
    }
    if (is_send) {
      std::memcpy(match->data, op->data, b.bytes());
    } else {
      std::memcpy(op->data, match->data, b.bytes());
    }
    match->state.store(detail::p2p_op::done, std::memory_order_release);
    group_->park().notify_all();
    c.rec.end = clock::now();
    state_->add(c.rec);
    state_->call_hook(c.rec, true);
    return work{};
  }

  // Pending: the peer completes it (or we give up at the deadline).
  std::erase_if(state_->outstanding, [](auto const& w) {
    auto p = w.lock();
    return !p || p->state.load(std::memory_order_acquire) >= detail::p2p_op::done;
  });
  state_->outstanding.push_back(op);
  std::uint64_t const id = state_->add(c.rec);
  return work(std::make_shared<detail::p2p_work>(group_, std::move(op), state_, id, c.rec,
                                                 detail::deadline_after(c.timeout), c.timeout,
                                                 rank_));
}

// A communicator that goes away must not leave peers a pointer into buffers that are about to
// die: pending halves are withdrawn, halves a peer is copying right now are waited for.
inline void communicator::release() noexcept {
  if (!group_ || !state_) return;
  std::vector<std::shared_ptr<detail::p2p_op>> busy;
  {
    std::lock_guard<std::mutex> lock(group_->p2p_mutex);
    for (auto const& w : state_->outstanding) {
      auto op = w.lock();
      if (!op) continue;
      int const st = op->state.load(std::memory_order_acquire);
      if (st == detail::p2p_op::pending) {
        auto& q = op->is_send ? group_->sends(op->src, op->dst) : group_->recvs(op->src, op->dst);
        std::erase(q, op);
        op->error_kind = errc::comm;
        op->error = "the communicator was destroyed with this operation pending";
        op->state.store(detail::p2p_op::cancelled, std::memory_order_release);
      } else if (st == detail::p2p_op::claimed) {
        busy.push_back(std::move(op));
      }
    }
  }
  for (auto const& op : busy)
    group_->park().wait_until(
        [&] { return op->state.load(std::memory_order_acquire) != detail::p2p_op::claimed; },
        detail::clock::time_point::max());
  state_->outstanding.clear();
  // Destroyed by an exception's unwinding, the rank is failing, not finishing: world::run's catch
  // then aborts the tree with the real reason, which a departure would otherwise pre-empt.
  if (std::uncaught_exceptions() == 0) group_->depart(rank_, false);
  group_.reset();
  state_.reset();
  rank_ = -1;
}

//! Creates the n communicators of a new world without starting threads: hand communicator r to
//! the thread that plays rank r (move it there). If one of your threads fails, call abort() on
//! its communicator so that its peers throw instead of waiting for their deadline.
inline std::vector<communicator> make_communicators(int n, options opts) {
  WEFT_EXPECTS(n >= 1 && n <= detail::group::max_size, "n",
               weft::detail::concat("a world size in [1, ", detail::group::max_size, "]"), n);
  WEFT_EXPECTS(opts.timeout.count() > 0, "opts.timeout", "> 0 ms", opts.timeout.count());
  std::vector<int> world(static_cast<std::size_t>(n));
  std::iota(world.begin(), world.end(), 0);
  auto g = std::make_shared<detail::group>(n, opts, std::move(world));
  std::vector<communicator> comms;
  comms.reserve(static_cast<std::size_t>(n));
  for (int r = 0; r < n; ++r) comms.push_back(communicator(g, r, opts.timeout));
  return comms;
}

static_assert(Communicator<communicator>);

}  // namespace weft::comm::threads
