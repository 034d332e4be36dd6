// weft/comm/mpi/communicator.hpp — the MPI backend: a Communicator over an MPI_Comm it duplicates
// or adopts (host memory only). Every operation is a non-blocking MPI call polled to a deadline;
// bf16/f16 reduce in f32, counts above INT_MAX are chunked, fingerprints are checked on request.
// The rules of each call come from comm/detail/plan.hpp; the machinery from detail/engine.hpp.
#pragma once

#if !WEFT_HAS_MPI
#error \
    "weft/comm/mpi/communicator.hpp needs MPI: link the CMake target weft::mpi (it defines WEFT_HAS_MPI=1 and adds MPI's include path and libraries)"
#endif

#include <weft/comm/concepts.hpp>
#include <weft/comm/detail/buffers.hpp>
#include <weft/comm/detail/plan.hpp>
#include <weft/comm/mpi/detail/engine.hpp>
#include <weft/comm/mpi/detail/state.hpp>
#include <weft/comm/mpi/detail/wire.hpp>
#include <weft/comm/mpi/environment.hpp>
#include <weft/comm/mpi/options.hpp>
#include <weft/comm/reference.hpp>
#include <weft/core/dtype.hpp>
#include <weft/core/error.hpp>
#include <weft/core/memory.hpp>

#include <mpi.h>

#include <algorithm>
#include <chrono>
#include <cstddef>
#include <cstring>
#include <memory>
#include <span>
#include <string>
#include <type_traits>
#include <vector>

namespace weft::comm::mpi {

//! A rank of an MPI communicator. Models Communicator over host memory:
//!  - create one with communicator::world() / dup(parent) (collective; owns an MPI_Comm_dup of the
//!    parent) or adopt(comm) (local; uses the caller's MPI_Comm without owning it, installs
//!    MPI_ERRORS_RETURN on it and restores the previous handler on destruction);
//!  - every operation is a non-blocking MPI call polled with MPI_Testall until done or the
//!    deadline (options::timeout, or op_options::timeout per call); blocking calls return
//!    completed work, isend/irecv return pending work;
//!  - count 0 is a local no-op, not a synchronisation point (barrier and split always are);
//!  - reductions follow reference.hpp: bf16/f16 sums and products accumulate in f32 and round
//!    once, integer sums and products wrap, min/max propagate NaN, avg and premul_sum as
//!    documented there; the order of the combination is MPI's, so float results may differ from
//!    the rank-ordered reference in the last bits (exact inputs give exact results);
//!  - a fault (deadline, MPI error, fingerprint mismatch) throws on the rank that detects it and
//!    poisons its communicator. MPI cannot wake or cancel the peers' pending collectives: they
//!    time out in turn, or the program ends with MPI_Abort (weft never calls it);
//!  - one thread uses a communicator (and its work) at a time; abort() may come from any thread.
//! A default-constructed or moved-from communicator, or one from split with a negative color, is
//! a non-member: size() == 0, rank() == -1, and every operation throws invalid_argument_error.
class communicator : private detail::engine {
 public:
  using communicator_concept = communicator_tag;
  using memory_space = host_space;

  communicator() = default;  // a non-member; move-only, as its engine

  //! Collective over `parent`: a new communicator owning MPI_Comm_idup(parent), waited for with
  //! the options' deadline.
  [[nodiscard]] static communicator dup(MPI_Comm parent, options opts = {}) {
    WEFT_EXPECTS(parent != MPI_COMM_NULL, "parent", "a valid MPI communicator", "MPI_COMM_NULL");
    check_options(opts);
    MPI_Comm c = MPI_COMM_NULL;
    MPI_Request req = MPI_REQUEST_NULL;
    WEFT_MPI_TRY(MPI_Comm_idup(parent, &c, &req));
    auto s = std::make_shared<detail::shared>();
    s->opts = opts;
    std::vector<MPI_Request> reqs{req};
    auto const r = detail::poll(*s, reqs, detail::clock::now() + opts.timeout);
    if (r != weft::comm::detail::poll_result::done)
      throw timeout_error(
          weft::detail::concat("MPI_Comm_idup timed out after ", opts.timeout.count(),
                               " ms: not every rank of the parent communicator took part"));
    s->comm = c;
    s->owned = true;
    WEFT_MPI_TRY(MPI_Comm_set_errhandler(c, MPI_ERRORS_RETURN));
    return communicator(std::move(s));
  }

  //! A communicator over MPI_COMM_WORLD (a duplicate: weft's traffic never meets the caller's).
  [[nodiscard]] static communicator world(options opts = {}) { return dup(MPI_COMM_WORLD, opts); }

  //! Local: uses `comm` without owning it (the caller frees it after this object is gone).
  //! weft's point-to-point traffic on it uses tags 30000 and 30001.
  [[nodiscard]] static communicator adopt(MPI_Comm comm, options opts = {}) {
    WEFT_EXPECTS(comm != MPI_COMM_NULL, "comm", "a valid MPI communicator", "MPI_COMM_NULL");
    check_options(opts);
    auto s = std::make_shared<detail::shared>();
    s->opts = opts;
    s->comm = comm;
    s->owned = false;
    WEFT_MPI_TRY(MPI_Comm_get_errhandler(comm, &s->saved_handler));
    WEFT_MPI_TRY(MPI_Comm_set_errhandler(comm, MPI_ERRORS_RETURN));
    return communicator(std::move(s));
  }

  [[nodiscard]] int rank() const noexcept { return s_ ? s_->rank : -1; }
  [[nodiscard]] int size() const noexcept { return s_ ? s_->size : 0; }
  [[nodiscard]] comm_state state() const noexcept {
    return s_ ? s_->state.load(std::memory_order_acquire) : comm_state::healthy;
  }
  //! The wrapped communicator (MPI_COMM_NULL for a non-member).
  [[nodiscard]] MPI_Comm native() const noexcept { return s_ ? s_->comm : MPI_COMM_NULL; }
  //! Whether one thread may call this communicator while another thread of the process calls
  //! another one: MPI initialised with MPI_THREAD_MULTIPLE (MPI_Query_thread). The pipeline
  //! executor overlaps its vocabulary collectives only then (step_options::vocab_overlap).
  [[nodiscard]] bool allows_concurrent_calls() const noexcept {
    int level = MPI_THREAD_SINGLE;
    return MPI_Query_thread(&level) == MPI_SUCCESS && level == MPI_THREAD_MULTIPLE;
  }
  [[nodiscard]] options const& opts() const noexcept {
    static options const none{};
    return s_ ? s_->opts : none;
  }
  [[nodiscard]] std::chrono::milliseconds timeout() const noexcept {
    return s_ ? s_->opts.timeout : std::chrono::milliseconds{0};
  }
  void set_timeout(std::chrono::milliseconds t) {
    WEFT_EXPECTS(t.count() > 0, "timeout", "> 0 ms", t.count());
    if (s_) s_->opts.timeout = t;
  }
  //! The name that errors raised in this communicator give its group ("tp": device_mesh names
  //! each axis group after its axis). Errors in a communicator made by split name the group and
  //! give each rank they mention as "rank 1 (world rank 3)".
  void set_name(std::string name) {
    if (s_) s_->name = std::move(name);
  }
  [[nodiscard]] std::string const& name() const noexcept {
    static std::string const none;
    return s_ ? s_->name : none;
  }
  //! Turns the debug-mode fingerprint check on or off; every rank must do the same.
  void set_check_fingerprints(bool on) noexcept {
    if (s_) s_->opts.check_fingerprints = on;
  }

  [[nodiscard]] std::vector<op_record> history() const {
    return s_ ? s_->history.records() : std::vector<op_record>{};
  }
  //! Called with the record of every operation when it completes or fails. A hook that throws on
  //! success propagates to the caller; on failure it is ignored (the comm_error wins).
  void set_hook(op_hook hook) {
    if (s_) s_->history.set_hook(std::move(hook));
  }

  //! Marks the communicator aborted: pending waits on this rank stop and every later call throws
  //! peer_aborted_error naming this rank. Idempotent. It cannot reach the peers (MPI 3.1 has no
  //! revoke): they time out.
  void abort() noexcept {
    if (!s_) return;
    comm_state h = comm_state::healthy;
    s_->state.compare_exchange_strong(h, comm_state::aborted);
    if (h == comm_state::poisoned) s_->state.store(comm_state::aborted);
  }

  // ---- reductions ------------------------------------------------------------------------------

  work all_reduce(buffer_view in, buffer_view out, reduce_op op = {}, op_options o = {}) {
    call c = begin(op_kind::all_reduce, o);
    auto const p = detail::rules::plan_all_reduce(endpoint(), in, out, op);
    apply_plan(c, p);
    if (p.trivial) return finish_trivial(c);
    return run_staged(c, in, out, true, true, [&] { reduce_into(c, in, out, op, -1); });
  }

  work reduce(buffer_view in, buffer_view out, reduce_op op, int root, op_options o = {}) {
    call c = begin(op_kind::reduce, o);
    auto const p = detail::rules::plan_reduce(endpoint(), in, out, op, root);
    apply_plan(c, p);
    if (p.trivial) return finish_trivial(c);
    return run_staged(c, in, out, true, p.is_root,
                      [&] { reduce_into(c, in, p.is_root ? out : in, op, root); });
  }

  work reduce_scatter(buffer_view in, buffer_view out, reduce_op op = {}, op_options o = {}) {
    call c = begin(op_kind::reduce_scatter, o);
    auto const p = detail::rules::plan_reduce_scatter(endpoint(), in, out, op);
    apply_plan(c, p);
    if (p.trivial) return finish_trivial(c);
    std::vector<std::size_t> counts(static_cast<std::size_t>(size()), out.count);
    return run_staged(c, in, out, true, true, [&] { reduce_scatter_into(c, in, out, counts, op); });
  }

  work reduce_scatter_v(buffer_view in, buffer_view out, std::span<std::size_t const> counts,
                        reduce_op op = {}, op_options o = {}) {
    call c = begin(op_kind::reduce_scatter_v, o);
    auto const p = detail::rules::plan_reduce_scatter_v(endpoint(), in, out, counts, op);
    apply_plan(c, p);
    c.counts.assign(counts.begin(), counts.end());
    if (p.trivial) return finish_trivial(c);
    return run_staged(c, in, out, true, true, [&] { reduce_scatter_into(c, in, out, counts, op); });
  }

  // ---- data movement ---------------------------------------------------------------------------

  work broadcast(buffer_view in, buffer_view out, int root, op_options o = {}) {
    call c = begin(op_kind::broadcast, o);
    auto const p = detail::rules::plan_broadcast(endpoint(), in, out, root);
    apply_plan(c, p);
    if (p.trivial) return finish_trivial(c);
    bool const is_root = p.is_root;
    return run_staged(c, in, out, is_root, true, [&] {
      if (is_root && in.data != out.data) std::memcpy(out.data, in.data, out.bytes());
      if (out.count <= max_count()) {
        post(c,
             MPI_Ibcast(out.data, to_int(out.count), detail::move_type(out.type), root, s_->comm,
                        &c.reqs.emplace_back()),
             "MPI_Ibcast");
      } else if (is_root) {
        for (int s = 0; s < size(); ++s)
          if (s != root) p2p_send(c, out.data, out.count, out.type, s);
      } else {
        p2p_recv(c, out.data, out.count, out.type, root);
      }
      complete(c);
    });
  }

  work all_gather(buffer_view in, buffer_view out, op_options o = {}) {
    call c = begin(op_kind::all_gather, o);
    auto const p = detail::rules::plan_all_gather(endpoint(), in, out);
    apply_plan(c, p);
    if (p.trivial) return finish_trivial(c);
    std::vector<std::size_t> counts(static_cast<std::size_t>(size()), in.count);
    return run_staged(c, in, out, true, true,
                      [&] { gather_v(c, in, out, counts, p.in_place, -1); });
  }

  work all_gather_v(buffer_view in, buffer_view out, std::span<std::size_t const> counts,
                    op_options o = {}) {
    call c = begin(op_kind::all_gather_v, o);
    auto const p = detail::rules::plan_all_gather_v(endpoint(), in, out, counts);
    apply_plan(c, p);
    c.counts.assign(counts.begin(), counts.end());
    if (p.trivial) return finish_trivial(c);
    return run_staged(c, in, out, true, true,
                      [&] { gather_v(c, in, out, counts, p.in_place, -1); });
  }

  work gather(buffer_view in, buffer_view out, int root, op_options o = {}) {
    call c = begin(op_kind::gather, o);
    auto const p = detail::rules::plan_gather(endpoint(), in, out, root);
    apply_plan(c, p);
    if (p.trivial) return finish_trivial(c);
    std::vector<std::size_t> counts(static_cast<std::size_t>(size()), in.count);
    return run_staged(c, in, out, true, p.is_root, [&] {
      gather_v(c, in, p.is_root ? out : buffer_view{}, counts, p.in_place, root);
    });
  }

  work scatter(buffer_view in, buffer_view out, int root, op_options o = {}) {
    call c = begin(op_kind::scatter, o);
    auto const p = detail::rules::plan_scatter(endpoint(), in, out, root);
    apply_plan(c, p);
    if (p.trivial) return finish_trivial(c);
    bool const is_root = p.is_root;
    bool const in_place = p.in_place;
    auto const n = static_cast<std::size_t>(size());
    return run_staged(c, in, out, is_root, true, [&] {
      auto const t = detail::move_type(out.type);
      auto const b = out.count;
      if (n * b <= max_count()) {
        void* recvbuf = (is_root && in_place) ? MPI_IN_PLACE : out.data;
        post(c,
             MPI_Iscatter(is_root ? in.data : nullptr, to_int(b), t, recvbuf, to_int(b), t, root,
                          s_->comm, &c.reqs.emplace_back()),
             "MPI_Iscatter");
      } else if (is_root) {
        for (int s = 0; s < size(); ++s) {
          auto* src = detail::byte_offset(in.data, static_cast<std::size_t>(s) * b, out.type);
          if (s != root)
            p2p_send(c, src, b, out.type, s);
          else if (!in_place)
            std::memcpy(out.data, src, out.bytes());
        }
      } else {
        p2p_recv(c, out.data, b, out.type, root);
      }
      complete(c);
    });
  }

  work all_to_all(buffer_view in, buffer_view out, op_options o = {}) {
    call c = begin(op_kind::all_to_all, o);
    auto const p = detail::rules::plan_all_to_all(endpoint(), in, out);
    apply_plan(c, p);
    if (p.trivial) return finish_trivial(c);
    std::vector<std::size_t> counts(static_cast<std::size_t>(size()),
                                    in.count / static_cast<std::size_t>(size()));
    return run_staged(c, in, out, true, true,
                      [&] { all_to_all_into(c, in, out, counts, counts, true); });
  }

  work all_to_all_v(buffer_view in, buffer_view out, std::span<std::size_t const> send_counts,
                    std::span<std::size_t const> recv_counts, op_options o = {}) {
    call c = begin(op_kind::all_to_all_v, o);
    auto const p = detail::rules::plan_all_to_all_v(endpoint(), in, out, send_counts, recv_counts);
    apply_plan(c, p);
    c.counts.assign(send_counts.begin(), send_counts.end());
    c.counts2.assign(recv_counts.begin(), recv_counts.end());
    return run_staged(c, in, out, true, true,
                      [&] { all_to_all_into(c, in, out, send_counts, recv_counts, false); });
  }

  work barrier(op_options o = {}) {
    call c = begin(op_kind::barrier, o);
    apply_plan(c, detail::rules::plan_sync(op_kind::barrier));
    return run(c, [&] {
      post(c, MPI_Ibarrier(s_->comm, &c.reqs.emplace_back()), "MPI_Ibarrier");
      complete(c);
    });
  }

  //! Collective: ranks with equal color form a communicator ordered by (key, rank); a negative
  //! color gives a non-member. Everyone's arrival is first checked against the deadline (an
  //! all-gather of the colors), then MPI_Comm_split runs; the child inherits the options.
  communicator split(int color, int key) {
    call c = begin(op_kind::split, {});
    apply_plan(c, detail::rules::plan_sync(op_kind::split));
    MPI_Comm nc = MPI_COMM_NULL;
    run(c, [&] {
      std::vector<int> mine{color, key};
      std::vector<int> all(2 * static_cast<std::size_t>(size()));
      post(c,
           MPI_Iallgather(mine.data(), 2, MPI_INT, all.data(), 2, MPI_INT, s_->comm,
                          &c.reqs.emplace_back()),
           "MPI_Iallgather");
      complete(c);
      int const rc = MPI_Comm_split(s_->comm, color < 0 ? MPI_UNDEFINED : color, key, &nc);
      if (rc != MPI_SUCCESS) mpi_fail(c, "MPI_Comm_split", rc);
    });
    if (nc == MPI_COMM_NULL) return communicator{};
    auto s = std::make_shared<detail::shared>();
    s->opts = s_->opts;
    s->comm = nc;
    s->owned = true;
    s->split = true;
    WEFT_MPI_TRY(MPI_Comm_set_errhandler(nc, MPI_ERRORS_RETURN));
    return communicator(std::move(s));
  }

  // ---- point to point --------------------------------------------------------------------------

  //! Blocking send: returns once `in` may be reused (MPI's standard-mode completion).
  work send(buffer_view in, int peer, op_options o = {}) {
    return detail::rules::blocking(isend(in, peer, o));
  }
  work recv(buffer_view out, int peer, op_options o = {}) {
    return detail::rules::blocking(irecv(out, peer, o));
  }
  //! Messages between a pair arrive in the order they were posted.
  work isend(buffer_view in, int peer, op_options o = {}) {
    return p2p(op_kind::send, in, peer, o);
  }
  work irecv(buffer_view out, int peer, op_options o = {}) {
    return p2p(op_kind::recv, out, peer, o);
  }

 private:
  friend class detail::p2p_work;

  explicit communicator(std::shared_ptr<detail::shared> s) : engine(std::move(s)) {}

  // ---- transports
  // --------------------------------------------------------------------------------

  // all_gather(_v) (root < 0) and gather (root >= 0; `out` empty off the root).
  void gather_v(call& c, buffer_view in, buffer_view out, std::span<std::size_t const> counts,
                bool in_place, int root) {
    auto const t = detail::move_type(in.type);
    auto const off = detail::rules::exclusive_sums(counts);
    bool const equal =
        std::all_of(counts.begin(), counts.end(), [&](auto x) { return x == counts[0]; });
    void const* sendbuf = in_place ? MPI_IN_PLACE : in.data;
    if (fits(counts)) {
      if (root < 0 && equal) {
        post(c,
             MPI_Iallgather(sendbuf, to_int(in.count), t, out.data, to_int(counts[0]), t, s_->comm,
                            &c.reqs.emplace_back()),
             "MPI_Iallgather");
      } else if (root < 0) {
        auto rc = int_array(c, counts);
        auto dis = int_array(c, std::span<std::size_t const>(off.data(), counts.size()));
        post(c,
             MPI_Iallgatherv(sendbuf, to_int(in.count), t, out.data, rc, dis, t, s_->comm,
                             &c.reqs.emplace_back()),
             "MPI_Iallgatherv");
      } else {
        bool const is_root = root == rank();
        post(c,
             MPI_Igather(is_root ? sendbuf : in.data, to_int(in.count), t,
                         is_root ? out.data : nullptr, to_int(counts[0]), t, root, s_->comm,
                         &c.reqs.emplace_back()),
             "MPI_Igather");
      }
      complete(c);
      return;
    }
    // Chunked fallback: every block travels as point-to-point messages of at most max_count.
    int const n = size();
    for (int s = 0; s < n; ++s) {
      auto const su = static_cast<std::size_t>(s);
      bool const receiver = root < 0 || root == rank();
      if (receiver && s != rank())
        p2p_recv(c, detail::byte_offset(out.data, off[su], in.type), counts[su], in.type, s);
    }
    for (int d = 0; d < n; ++d) {
      if (d == rank() || (root >= 0 && d != root)) continue;
      p2p_send(c, in.data, in.count, in.type, d);
    }
    if ((root < 0 || root == rank()) && !in_place && in.count != 0)
      std::memcpy(detail::byte_offset(out.data, off[me()], in.type), in.data, in.bytes());
    complete(c);
  }

  // Equal blocks (`uniform`, the same on every rank) go through MPI_Ialltoall when they fit;
  // all_to_all_v always travels as point-to-point messages: its counts are known locally only,
  // so ranks could not agree on a native-or-chunked choice (Open MPI's own alltoallv is linear
  // point-to-point too).
  void all_to_all_into(call& c, buffer_view in, buffer_view out, std::span<std::size_t const> sc,
                       std::span<std::size_t const> rc, bool uniform) {
    std::shared_ptr<std::vector<std::byte>> copy;
    void const* src = in.data;
    if (in.data == out.data && in.count != 0) {
      // MPI's in-place all-to-all needs equal send and receive layouts; a copy serves every case.
      copy = std::make_shared<std::vector<std::byte>>(
          static_cast<std::byte const*>(in.data),
          static_cast<std::byte const*>(in.data) + in.bytes());
      c.keep.push_back(copy);
      src = copy->data();
    }
    auto const so = detail::rules::exclusive_sums(sc);
    auto const ro = detail::rules::exclusive_sums(rc);
    auto const t = detail::move_type(in.type);
    if (uniform && fits(sc)) {
      post(c,
           MPI_Ialltoall(src, to_int(sc[0]), t, out.data, to_int(sc[0]), t, s_->comm,
                         &c.reqs.emplace_back()),
           "MPI_Ialltoall");
      complete(c);
      return;
    }
    for (int s = 0; s < size(); ++s) {
      auto const su = static_cast<std::size_t>(s);
      if (s != rank())
        p2p_recv(c, detail::byte_offset(out.data, ro[su], in.type), rc[su], in.type, s);
    }
    for (int d = 0; d < size(); ++d) {
      auto const du = static_cast<std::size_t>(d);
      if (d != rank()) p2p_send(c, detail::byte_offset(src, so[du], in.type), sc[du], in.type, d);
    }
    if (sc[me()] != 0)
      std::memcpy(detail::byte_offset(out.data, ro[me()], in.type),
                  detail::byte_offset(src, so[me()], in.type), sc[me()] * size_of(in.type));
    complete(c);
  }

  // ---- reductions on the wire ------------------------------------------------------------------

  // all_reduce (root < 0) or reduce to `root`: converts to the wire type where needed, reduces in
  // chunks of at most max_count elements, converts back.
  void reduce_into(call& c, buffer_view in, buffer_view out, reduce_op op, int root) {
    dispatch(in.type, [&](auto tid) {
      using T = typename decltype(tid)::type;
      dispatch_reduce_kind(op.kind, [&](auto kind) {
        constexpr reduce_kind K = decltype(kind)::value;
        using Wr = detail::wire<T, K>;
        using W = typename Wr::type;
        bool const receives = root < 0 || root == rank();
        std::size_t const n = in.count;
        auto const* src = static_cast<T const*>(in.data);
        auto* dst = static_cast<T*>(out.data);
        W* wire_in = nullptr;
        W* wire_out = nullptr;
        bool in_place = in.data == out.data;
        if constexpr (Wr::staged_in) {
          auto buf = std::make_shared<std::vector<W>>(n);
          c.keep.push_back(buf);
          auto const scale = scale_of<T>(op);
          for (std::size_t i = 0; i < n; ++i) (*buf)[i] = reducer<T, K>::load(src[i], scale);
          wire_in = buf->data();
          if constexpr (Wr::staged_out) {
            wire_out = wire_in;  // reduce in place in the staging buffer
            in_place = true;
          } else {
            wire_out = reinterpret_cast<W*>(dst);
            in_place = false;
          }
        } else {
          wire_in = const_cast<W*>(reinterpret_cast<W const*>(src));
          wire_out = reinterpret_cast<W*>(dst);
        }
        auto const dt = Wr::datatype();
        auto const mop = Wr::op();
        for (std::size_t done = 0; done < n; done += max_count()) {
          auto const k = std::min(max_count(), n - done);
          void const* sb = in_place ? MPI_IN_PLACE : static_cast<void const*>(wire_in + done);
          if (root < 0) {
            post(c,
                 MPI_Iallreduce(sb, wire_out + done, to_int(k), dt, mop, s_->comm,
                                &c.reqs.emplace_back()),
                 "MPI_Iallreduce");
          } else {
            // MPI_IN_PLACE is the root's alone; elsewhere the send buffer is the data.
            void const* rsb =
                (receives && in_place) ? MPI_IN_PLACE : static_cast<void const*>(wire_in + done);
            post(c,
                 MPI_Ireduce(rsb, receives ? static_cast<void*>(wire_out + done) : nullptr,
                             to_int(k), dt, mop, root, s_->comm, &c.reqs.emplace_back()),
                 "MPI_Ireduce");
          }
        }
        complete(c);
        if constexpr (Wr::finish) {
          if (receives)
            for (std::size_t i = 0; i < n; ++i) dst[i] = reducer<T, K>::finish(wire_out[i], size());
        }
      });
    });
  }

  void reduce_scatter_into(call& c, buffer_view in, buffer_view out,
                           std::span<std::size_t const> counts, reduce_op op) {
    dispatch(in.type, [&](auto tid) {
      using T = typename decltype(tid)::type;
      dispatch_reduce_kind(op.kind, [&](auto kind) {
        constexpr reduce_kind K = decltype(kind)::value;
        using Wr = detail::wire<T, K>;
        using W = typename Wr::type;
        auto const off = detail::rules::exclusive_sums(counts);
        std::size_t const total = off.back();
        std::size_t const mine = counts[me()];
        auto const* src = static_cast<T const*>(in.data);
        auto* dst = static_cast<T*>(out.data);
        // The input goes to the wire by copy when staged or when `out` lies inside it (MPI's
        // in-place reduce-scatter puts the result at the start, weft's at the rank's offset).
        W const* wire_in = reinterpret_cast<W const*>(src);
        if (Wr::staged_in || detail::rules::overlap(in, out)) {
          auto buf = std::make_shared<std::vector<W>>(total);
          c.keep.push_back(buf);
          if constexpr (Wr::staged_in) {
            auto const scale = scale_of<T>(op);
            for (std::size_t i = 0; i < total; ++i) (*buf)[i] = reducer<T, K>::load(src[i], scale);
          } else {
            std::memcpy(buf->data(), src, total * sizeof(T));
          }
          wire_in = buf->data();
        }
        W* wire_out = reinterpret_cast<W*>(dst);
        if constexpr (Wr::staged_out) {
          auto buf = std::make_shared<std::vector<W>>(mine);
          c.keep.push_back(buf);
          wire_out = buf->data();
        }
        auto const dt = Wr::datatype();
        auto const mop = Wr::op();
        if (fits(counts)) {
          auto* rc = int_array(c, counts);
          post(c,
               MPI_Ireduce_scatter(wire_in, mine == 0 ? nullptr : wire_out, rc, dt, mop, s_->comm,
                                   &c.reqs.emplace_back()),
               "MPI_Ireduce_scatter");
          complete(c);
        } else {
          // One chunked reduce per block, to the block's owner.
          for (int r = 0; r < size(); ++r) {
            auto const ru = static_cast<std::size_t>(r);
            for (std::size_t done = 0; done < counts[ru]; done += max_count()) {
              auto const k = std::min(max_count(), counts[ru] - done);
              post(c,
                   MPI_Ireduce(wire_in + off[ru] + done, r == rank() ? wire_out + done : nullptr,
                               to_int(k), dt, mop, r, s_->comm, &c.reqs.emplace_back()),
                   "MPI_Ireduce");
            }
          }
          complete(c);
        }
        if constexpr (Wr::finish) {
          for (std::size_t i = 0; i < mine; ++i)
            dst[i] = reducer<T, K>::finish(wire_out[i], size());
        }
      });
    });
  }
};

static_assert(Communicator<communicator>);

}  // namespace weft::comm::mpi
