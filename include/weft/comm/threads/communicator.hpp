// weft/comm/threads/communicator.hpp — the threads backend's Communicator: ranks are threads of
// one process that read each other's buffers directly (zero-copy), reduce in ascending rank order
// (bitwise equal to comm/reference.hpp), and turn every fault into an exception on every rank.
// The rules of each call come from comm/detail/plan.hpp; the machinery from detail/engine.hpp.
#pragma once

#include <weft/comm/concepts.hpp>
#include <weft/comm/detail/plan.hpp>
#include <weft/comm/reference.hpp>
#include <weft/comm/threads/detail/engine.hpp>
#include <weft/comm/threads/detail/group.hpp>
#include <weft/comm/threads/detail/kernels.hpp>
#include <weft/comm/threads/options.hpp>
#include <weft/core/dtype.hpp>
#include <weft/core/error.hpp>
#include <weft/core/memory.hpp>

#include <algorithm>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <memory>
#include <numeric>
#include <span>
#include <string>
#include <utility>
#include <vector>

namespace weft::comm::threads {

class communicator;
class world;
inline std::vector<communicator> make_communicators(int n, options opts = {});

//! A rank of a group of threads. Obtain one from threads::world (which runs a callable on every
//! rank) or threads::make_communicators (for your own threads). Models Communicator:
//!  - blocking calls return completed work; isend/irecv return pending work;
//!  - results of reductions are bitwise equal to the serial rank-ordered reference;
//!  - count 0 is a local no-op, not a synchronisation point (barrier and split always are);
//!  - send is synchronous (returns once the receiver has the data); pair isend/irecv to exchange;
//!  - one thread uses a communicator (and its work) at a time; abort() may come from any thread.
//! A default-constructed or moved-from communicator, or one from split with a negative color, is
//! a non-member: size() == 0, rank() == -1, and every operation throws invalid_argument_error.
class communicator : private detail::engine {
 public:
  using communicator_concept = communicator_tag;
  using memory_space = host_space;

  communicator() = default;  // a non-member; move-only, as its engine

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
    return state_ ? state_->history.records() : std::vector<op_record>{};
  }
  //! Called with the record of every operation when it completes or fails (on this rank's
  //! thread). A hook that throws on success propagates its exception to the caller; on failure
  //! it is ignored so that the communication error is the one reported.
  void set_hook(op_hook hook) {
    if (state_) state_->history.set_hook(std::move(hook));
  }

  // ---- collectives ---------------------------------------------------------------------------

  work all_reduce(buffer_view in, buffer_view out, reduce_op op = {}, op_options o = {}) {
    call c = begin(op_kind::all_reduce, o);
    auto const p = weft::comm::detail::plan_all_reduce(endpoint(), in, out, op);
    apply_plan(c, p, op.scalar);
    c.d.send = detail::bytes_of(in.data);
    c.d.recv = detail::bytes_of(out.data);
    if (p.trivial) return finish_trivial(c);
    if (size() == 1) return finish_local(c, [&] { reduce_local(in, out, op); });
    bool const staged = in.bytes() <= group_->opts().small_message_bytes;
    auto const n = size();
    return run(
        c,
        [&](std::uint64_t seq) {
          if (!staged) return;
          auto& buf = group_->slot(rank_).staging[seq & 1u];
          if (!buf)
            buf.reset(new std::byte[std::max<std::size_t>(group_->opts().small_message_bytes, 1)]);
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
          bool const stream = in.bytes() >= group_->opts().streaming_store_bytes;
          gathered_reduce(seq, in.type, op.kind, nullptr, mine.offset * es, mine.count, true,
                          stream);
          phase(seq, 2);
        });
  }

  work reduce(buffer_view in, buffer_view out, reduce_op op, int root, op_options o = {}) {
    call c = begin(op_kind::reduce, o);
    auto const p = weft::comm::detail::plan_reduce(endpoint(), in, out, op, root);
    apply_plan(c, p, op.scalar);
    c.d.send = detail::bytes_of(in.data);
    c.d.recv = p.is_root ? detail::bytes_of(out.data) : nullptr;
    if (p.trivial) return finish_trivial(c);
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
    auto const p = weft::comm::detail::plan_broadcast(endpoint(), in, out, root);
    apply_plan(c, p);
    c.d.send = p.is_root ? detail::bytes_of(in.data) : nullptr;
    c.d.recv = detail::bytes_of(out.data);
    if (p.trivial) return finish_trivial(c);
    auto const copy_own = [&] {
      if (in.data != out.data) std::memcpy(out.data, in.data, out.bytes());
    };
    if (size() == 1) return finish_local(c, copy_own);
    return run(c, nullptr, [&](std::uint64_t seq) {
      if (p.is_root) {
        copy_own();
      } else {
        std::memcpy(out.data, peer(seq, root).send, out.bytes());
      }
      phase(seq, 2);
    });
  }

  work all_gather(buffer_view in, buffer_view out, op_options o = {}) {
    call c = begin(op_kind::all_gather, o);
    auto const p = weft::comm::detail::plan_all_gather(endpoint(), in, out);
    apply_plan(c, p);
    c.d.send = detail::bytes_of(in.data);
    c.d.recv = detail::bytes_of(out.data);
    if (p.trivial) return finish_trivial(c);
    auto const es = size_of(in.type);
    auto const copy_own = [&] {
      if (!p.in_place) std::memcpy(c.d.recv + me() * in.count * es, in.data, in.bytes());
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
    auto const p = weft::comm::detail::plan_all_gather_v(endpoint(), in, out, counts);
    apply_plan(c, p);
    c.d.send = detail::bytes_of(in.data);
    c.d.recv = detail::bytes_of(out.data);
    c.d.counts = counts.data();
    if (p.trivial) return finish_trivial(c);
    auto const es = size_of(in.type);
    auto const& offsets = p.offsets;
    auto const copy_own = [&] {
      if (!p.in_place && in.count != 0)
        std::memcpy(c.d.recv + offsets[me()] * es, in.data, in.bytes());
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
    auto const p = weft::comm::detail::plan_reduce_scatter(endpoint(), in, out, op);
    apply_plan(c, p, op.scalar);
    c.d.send = detail::bytes_of(in.data);
    c.d.recv = detail::bytes_of(out.data);
    if (p.trivial) return finish_trivial(c);
    if (size() == 1) return finish_local(c, [&] { reduce_local(in, out, op); });
    auto const es = size_of(in.type);
    return run(c, nullptr, [&](std::uint64_t seq) {
      gathered_reduce(seq, in.type, op.kind, c.d.recv, me() * out.count * es, out.count);
      phase(seq, 2);
    });
  }

  work reduce_scatter_v(buffer_view in, buffer_view out, std::span<std::size_t const> counts,
                        reduce_op op = {}, op_options o = {}) {
    call c = begin(op_kind::reduce_scatter_v, o);
    auto const p = weft::comm::detail::plan_reduce_scatter_v(endpoint(), in, out, counts, op);
    apply_plan(c, p, op.scalar);
    c.d.send = detail::bytes_of(in.data);
    c.d.recv = detail::bytes_of(out.data);
    c.d.counts = counts.data();
    if (p.trivial) return finish_trivial(c);
    if (size() == 1) return finish_local(c, [&] { reduce_local(in, out, op); });
    auto const es = size_of(in.type);
    return run(c, nullptr, [&](std::uint64_t seq) {
      gathered_reduce(seq, in.type, op.kind, c.d.recv, p.offsets[me()] * es, out.count);
      phase(seq, 2);
    });
  }

  work all_to_all(buffer_view in, buffer_view out, op_options o = {}) {
    call c = begin(op_kind::all_to_all, o);
    auto const p = weft::comm::detail::plan_all_to_all(endpoint(), in, out);
    apply_plan(c, p);
    c.d.send = detail::bytes_of(in.data);
    c.d.recv = detail::bytes_of(out.data);
    if (p.trivial) return finish_trivial(c);
    auto const es = size_of(in.type);
    std::size_t const block = in.count / static_cast<std::size_t>(size());
    if (size() == 1)
      return finish_local(c, [&] {
        if (!p.in_place) std::memcpy(out.data, in.data, in.bytes());
      });
    // In-place: peers read our blocks while we overwrite them, so they read a private copy.
    std::vector<std::byte> copy;
    return run(
        c, [&](std::uint64_t) { stage_in_place(c, p, in, copy); },
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
    auto const p =
        weft::comm::detail::plan_all_to_all_v(endpoint(), in, out, send_counts, recv_counts);
    apply_plan(c, p);
    c.d.send = detail::bytes_of(in.data);
    c.d.recv = detail::bytes_of(out.data);
    c.d.counts = send_counts.data();
    c.d.counts2 = recv_counts.data();
    auto const es = size_of(in.type);
    if (size() == 1)
      return finish_local(c, [&] {
        if (!p.in_place && in.count != 0) std::memcpy(out.data, in.data, in.bytes());
      });
    std::vector<std::byte> copy;
    return run(
        c, [&](std::uint64_t) { stage_in_place(c, p, in, copy); },
        [&](std::uint64_t seq) {
          for (int k = 0; k < size(); ++k) {
            int const s = (rank_ + k) % size();
            auto const cnt = recv_counts[static_cast<std::size_t>(s)];
            if (cnt == 0) continue;
            auto const& ps = peer(seq, s);
            std::size_t from = 0;  // where s's block for us starts in s's input
            for (std::size_t t = 0; t < me(); ++t) from += ps.counts[t];
            std::memcpy(c.d.recv + p.offsets2[static_cast<std::size_t>(s)] * es,
                        ps.send + from * es, cnt * es);
          }
          phase(seq, 2);
        });
  }

  work gather(buffer_view in, buffer_view out, int root, op_options o = {}) {
    call c = begin(op_kind::gather, o);
    auto const p = weft::comm::detail::plan_gather(endpoint(), in, out, root);
    apply_plan(c, p);
    c.d.send = detail::bytes_of(in.data);
    c.d.recv = p.is_root ? detail::bytes_of(out.data) : nullptr;
    if (p.trivial) return finish_trivial(c);
    if (size() == 1)
      return finish_local(c, [&] {
        if (!p.in_place) std::memcpy(out.data, in.data, in.bytes());
      });
    return run(c, nullptr, [&](std::uint64_t seq) {
      // Every rank writes its own block into the root's output, in parallel.
      if (!(p.is_root && p.in_place))
        std::memcpy(peer(seq, root).recv + me() * in.bytes(), in.data, in.bytes());
      phase(seq, 2);
    });
  }

  work scatter(buffer_view in, buffer_view out, int root, op_options o = {}) {
    call c = begin(op_kind::scatter, o);
    auto const p = weft::comm::detail::plan_scatter(endpoint(), in, out, root);
    apply_plan(c, p);
    c.d.send = p.is_root ? detail::bytes_of(in.data) : nullptr;
    c.d.recv = detail::bytes_of(out.data);
    if (p.trivial) return finish_trivial(c);
    if (size() == 1)
      return finish_local(c, [&] {
        if (!p.in_place) std::memcpy(out.data, in.data, out.bytes());
      });
    return run(c, nullptr, [&](std::uint64_t seq) {
      // Every rank reads its own block from the root's input, in parallel.
      if (!(p.is_root && p.in_place))
        std::memcpy(out.data, peer(seq, root).send + me() * out.bytes(), out.bytes());
      phase(seq, 2);
    });
  }

  work barrier(op_options o = {}) {
    call c = begin(op_kind::barrier, o);
    apply_plan(c, weft::comm::detail::plan_sync(op_kind::barrier));
    if (size() == 1) return finish_local(c, [] {});
    return run(c, nullptr, [](std::uint64_t) {});
  }

  //! Collective over this communicator: ranks passing the same color >= 0 form a new
  //! communicator ordered by (key, rank here); a negative color yields a non-member (size 0).
  //! The new communicator inherits the options and timeout; aborting this one aborts it too.
  communicator split(int color, int key) {
    call c = begin(op_kind::split, {});
    apply_plan(c, weft::comm::detail::plan_sync(op_kind::split));
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
      if (lost) weft::comm::detail::rethrow(group_->fault(), context(c));
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
    return weft::comm::detail::blocking(isend(in, peer_rank, o));
  }
  work recv(buffer_view out, int peer_rank, op_options o = {}) {
    return weft::comm::detail::blocking(irecv(out, peer_rank, o));
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
  friend class world;
  friend std::vector<communicator> make_communicators(int, options);

  communicator(std::shared_ptr<detail::group> g, int rank, std::chrono::milliseconds timeout)
      : engine(std::move(g), rank, timeout) {}

  communicator make_child(std::shared_ptr<detail::group> g, int new_rank) const {
    return communicator(std::move(g), new_rank, state_->timeout);
  }

  // In-place all_to_all(_v): peers read our blocks while we overwrite them, so they read a
  // private copy (taken before barrier A, so no peer can see the buffer half-written).
  static void stage_in_place(call& c, weft::comm::detail::call_plan const& p, buffer_view const& in,
                             std::vector<std::byte>& copy) {
    if (!p.in_place) return;
    copy.assign(c.d.send, c.d.send + in.bytes());
    c.d.send = copy.data();
  }
};

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
