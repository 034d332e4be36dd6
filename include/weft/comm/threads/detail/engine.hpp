// weft/comm/threads/detail/engine.hpp — the machinery under every threads-backend operation:
// the per-call record, the first barrier with its deadline (barrier A), the bounded phases after
// it, the cross-check of what every rank called, rank-ordered reductions over peers' buffers, and
// point-to-point matching. threads::communicator derives from it and adds only the operations.
#pragma once

#include <weft/comm/concepts.hpp>
#include <weft/comm/detail/buffers.hpp>
#include <weft/comm/detail/describe.hpp>
#include <weft/comm/detail/fault.hpp>
#include <weft/comm/detail/plan.hpp>
#include <weft/comm/threads/detail/group.hpp>
#include <weft/comm/threads/detail/kernels.hpp>
#include <weft/comm/threads/detail/p2p.hpp>
#include <weft/comm/threads/detail/parking.hpp>
#include <weft/core/dtype.hpp>
#include <weft/core/error.hpp>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <exception>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>
#include <vector>

namespace weft::comm::threads::detail {

using weft::comm::detail::bytes_of;

//! One rank's handle on its group: what threads::communicator is made of, and the steps its
//! operations are built from. A null group_ is a non-member.
class engine {
 protected:
  using clock = detail::clock;

  struct call {
    descriptor d{};
    op_record rec{};
    std::chrono::milliseconds timeout{0};
  };

  engine() = default;
  engine(std::shared_ptr<group> g, int rank, std::chrono::milliseconds timeout)
      : group_(std::move(g)), state_(std::make_shared<rank_state>()), rank_(rank) {
    auto const n = static_cast<std::size_t>(group_->size());
    state_->timeout = timeout;
    state_->send_seq.assign(n, 0);
    state_->recv_seq.assign(n, 0);
    state_->history.set_capacity(group_->opts().history_size);
  }
  engine(engine&&) noexcept = default;
  engine& operator=(engine&& other) noexcept {
    if (this != &other) {
      release();
      group_ = std::move(other.group_);
      state_ = std::move(other.state_);
      rank_ = std::exchange(other.rank_, -1);
    }
    return *this;
  }
  engine(engine const&) = delete;
  engine& operator=(engine const&) = delete;
  ~engine() { release(); }

  [[nodiscard]] std::size_t me() const noexcept { return static_cast<std::size_t>(rank_); }
  [[nodiscard]] int group_size() const noexcept { return group_ ? group_->size() : 0; }

  [[nodiscard]] weft::comm::detail::endpoint endpoint() const noexcept {
    return {rank_, group_->size(), memory_kind::host, -1, "the threads backend shares host memory"};
  }

  [[nodiscard]] std::string context(call const& c) const {
    return names(*group_, state_->name).context(c.rec.op, rank_, c.rec.seq);
  }

  // Entry of every operation: membership and per-call timeout. Nothing is communicated.
  call begin(op_kind op, op_options const& o) {
    weft::comm::detail::check_member(group_ != nullptr);
    call c;
    c.rec.op = op;
    c.rec.start = clock::now();
    c.rec.end = c.rec.start;
    c.timeout = weft::comm::detail::call_timeout(o, state_->timeout);
    return c;
  }

  //! Takes over what the rules decided: fingerprint, bytes, root or peer.
  static void apply_plan(call& c, weft::comm::detail::call_plan const& p, double scalar = 1.0) {
    c.d.fp = p.fp;
    c.d.scalar = scalar;
    c.rec.type = p.fp.type;
    c.rec.send_bytes = p.send_bytes;
    c.rec.recv_bytes = p.recv_bytes;
    c.rec.root_or_peer = p.root_or_peer;
  }

  // After the local argument checks, before anything is communicated or changed: a poisoned
  // communicator fails every call. Arguments come first so that ranks making the same invalid
  // call each get their own argument error, not a peer_aborted_error from whichever of them
  // threw first (threads::world aborts the world when a rank throws).
  void check_alive(call const& c) const {
    if (state_->aborted.load(std::memory_order_acquire)) [[unlikely]]
      weft::comm::detail::throw_aborted(context(c), who(*group_, rank_), rank_);
    if (group_->faulted()) [[unlikely]]
      weft::comm::detail::rethrow(group_->fault(), context(c) + " on a poisoned communicator");
  }

  void reduce_local(buffer_view const& in, buffer_view const& out, reduce_op op) const {
    std::byte const* ins[1] = {bytes_of(in.data)};
    double const scalars[1] = {op.scalar};
    reduce_bytes(in.type, op.kind, bytes_of(out.data), ins, scalars, 1,
                 std::min(in.count, out.count));
  }

  detail::descriptor const& peer(std::uint64_t seq, int s) noexcept {
    return group_->slot(s).desc[seq & 1u];
  }

  // Folds elements [byte_offset, +count) of every rank's send buffer, in rank order, into out
  // (or, with to_all, into the same elements of every rank's receive buffer, by non-temporal
  // stores where `stream`).
  void gathered_reduce(std::uint64_t seq, dtype type, reduce_kind kind, std::byte* out,
                       std::size_t byte_offset, std::size_t count, bool to_all = false,
                       bool stream = false) {
    if (count == 0) return;
    int const n = group_size();
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
      detail::reduce_bytes(type, kind, outs, n, ins, scal, n, count, stream);
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
    int const n = group_size();
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
    if (state_->history.observed()) c.rec.end = clock::now();
    state_->history.finished(c.rec);
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
    if (!g.arrive(seq)) weft::comm::detail::rethrow(g.fault(), context(c));
    auto const deadline = detail::deadline_after(c.timeout, c.rec.start);  // no second clock read
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
              describe_call(c), " at seq ", seq, " on ", detail::who(grp, rank_), ": ",
              detail::who(grp, gone),
              " has finished (its function returned or its communicator was destroyed) without "
              "calling it");
          grp.fail_locked(std::move(f));
          return;
        }
        if (!timed_out) return;
        std::vector<int> missing;
        std::vector<int> arrived;
        for (int s = 0; s < grp.size(); ++s)
          (grp.slot(s).arrived.load(std::memory_order_relaxed) >= seq ? arrived : missing)
              .push_back(s);
        detail::fault_info f;
        f.kind = errc::timeout;
        f.origin = rank_;
        f.missing = missing;
        f.message = weft::detail::concat(describe_call(c), " at seq ", seq, " timed out after ",
                                         c.timeout.count(), " ms on ", detail::who(grp, rank_),
                                         ": ranks ", detail::ranks(grp, missing),
                                         " did not arrive (arrived: ", detail::ranks(grp, arrived),
                                         "; last completed seq ", seq - 1, ")");
        grp.fail_locked(std::move(f));
      });
      if (!closed) return;  // everyone arrived just in time
      weft::comm::detail::rethrow(g.fault(), context(c));
    }
  }

  //! The call as messages describe it: "all_gather_v(dtype f32, counts [1, 0, 2])".
  [[nodiscard]] std::string describe_call(call const& c) const {
    bool const v = weft::comm::detail::has_counts(c.d.fp.op);
    return weft::comm::detail::describe(
        c.d.fp, v ? std::span<std::size_t const>(c.d.counts, static_cast<std::size_t>(group_size()))
                  : std::span<std::size_t const>());
  }

  // Compares what every rank called (after barrier A, so all descriptors of `seq` are posted).

  // Compares what every rank called (after barrier A, so all descriptors of `seq` are posted).
  void check_fingerprints(call& c, std::uint64_t seq) {
    namespace cd = weft::comm::detail;
    int const n = group_size();
    auto counts = [&](descriptor const& d) {
      return cd::has_counts(d.fp.op)
                 ? std::span<std::size_t const>(d.counts, static_cast<std::size_t>(n))
                 : std::span<std::size_t const>();
    };
    auto const& d0 = peer(seq, 0);
    int bad_a = -1;
    int bad_b = -1;
    std::string msg;
    for (int s = 1; s < n && bad_a < 0; ++s) {
      auto const& ds = peer(seq, s);
      std::string const fields = cd::diff_fields(d0.fp, ds.fp, counts(d0), counts(ds));
      if (fields.empty()) continue;
      bad_a = 0;
      bad_b = s;
      msg = cd::mismatch_text(seq, who(*group_, 0), cd::describe(d0.fp, counts(d0)),
                              who(*group_, s), cd::describe(ds.fp, counts(ds)), fields);
    }
    if (bad_a < 0 && d0.fp.op == op_kind::all_to_all_v) {
      // What r sends to s must be what s expects from r.
      for (int r = 0; r < n && bad_a < 0; ++r)
        for (int s = 0; s < n && bad_a < 0; ++s)
          if (peer(seq, r).counts[s] != peer(seq, s).counts2[r]) {
            bad_a = r;
            bad_b = s;
            msg = cd::a2a_mismatch(seq, who(*group_, r), peer(seq, r).counts[s], who(*group_, s),
                                   peer(seq, s).counts2[r]);
          }
    }
    if (bad_a < 0) return;
    fault_info f;
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
        f.message = weft::detail::concat(detail::who(*group_, rank_), " failed inside ",
                                         to_string(c.rec.op), " (seq ", seq, "): ", e.what());
      } catch (...) {}
      group_->fail(std::move(f));
      if (passed && group_->slot(rank_).progress.load(std::memory_order_relaxed) < 4 * seq + 2)
        phase(seq, 2);
      fail_record(c, e);
      throw;
    }
    // The end time is read only when someone sees it: a clock read is 9 % of an 8-byte all_reduce.
    if (state_->history.observed()) c.rec.end = clock::now();
    state_->history.finished(c.rec);
    return work{};
  }

  void fail_record(call& c, std::exception const& e) noexcept {
    weft::comm::detail::mark_failed(c.rec, e.what());
    try {
      state_->history.finished(c.rec);
    } catch (...) {}
  }

  work post_p2p(bool is_send, buffer_view b, int peer_rank, op_options const& o) {
    call c = begin(is_send ? op_kind::send : op_kind::recv, o);
    auto const pl = weft::comm::detail::plan_p2p(endpoint(), c.rec.op, b, peer_rank);
    apply_plan(c, pl);
    auto const up = static_cast<std::size_t>(peer_rank);
    if (pl.trivial) return finish_trivial(c);  // count 0: nothing travels, nothing to match
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
          (is_send ? group_->sends(op->src, op->dst) : group_->recvs(op->src, op->dst))
              .push_back(op);
        }
      }
    }
    if (poisoned)
      weft::comm::detail::rethrow(group_->fault(), context(c) + " on a poisoned communicator");

    if (match) {
      // We complete the match: check, copy between the two user buffers, release the peer.
      if (match->count != op->count || match->type != op->type) {
        auto const& snd = is_send ? *op : *match;
        auto const& rcv = is_send ? *match : *op;
        std::string const msg = weft::detail::concat(
            "mismatched point-to-point message from ", detail::who(*group_, snd.src), " to ",
            detail::who(*group_, snd.dst), ": send #", snd.seq, " has dtype ", snd.type, ", count ",
            snd.count, " but recv #", rcv.seq, " has dtype ", rcv.type, ", count ", rcv.count);
        match->error_kind = errc::mismatch;
        match->error = msg;
        match->state.store(detail::p2p_op::failed, std::memory_order_release);
        detail::fault_info f;
        f.kind = errc::mismatch;
        f.origin = rank_;
        f.message = msg;
        group_->fail(f);
        weft::comm::detail::mark_failed(c.rec, msg.c_str());
        state_->history.finished(c.rec);
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
      state_->history.finished(c.rec);
      return work{};
    }

    // Pending: the peer completes it (or we give up at the deadline).
    std::erase_if(state_->outstanding, [](auto const& w) {
      auto p = w.lock();
      return !p || p->state.load(std::memory_order_acquire) >= detail::p2p_op::done;
    });
    state_->outstanding.push_back(op);
    std::uint64_t const id = state_->history.add(c.rec);
    return work(std::make_shared<detail::p2p_work>(group_, std::move(op), state_, id, c.rec,
                                                   detail::deadline_after(c.timeout), c.timeout,
                                                   rank_));
  }

  // A communicator that goes away must not leave peers a pointer into buffers that are about to
  // die: pending halves are withdrawn, halves a peer is copying right now are waited for.
  void release() noexcept {
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

  std::shared_ptr<group> group_;
  std::shared_ptr<rank_state> state_;
  int rank_ = -1;
};

}  // namespace weft::comm::threads::detail
