// weft/comm/nccl/communicator.hpp — the NCCL backend, weft::comm::nccl::communicator: a
// StreamCommunicator over NCCL 2.28 for buffers in CUDA memory (one GPU per rank). It makes no
// kernel launch, so g++ compiles it and the CPU tests drive it through a mock nccl_api; link
// weft::nccl. The rules of each call come from comm/detail/plan.hpp; the machinery from
// detail/engine.hpp.
#pragma once

#include <weft/comm/nccl/api.hpp>

#if WEFT_HAS_NCCL
#include <weft/comm/concepts.hpp>
#include <weft/comm/detail/plan.hpp>
#include <weft/comm/nccl/detail/core.hpp>
#include <weft/comm/nccl/detail/engine.hpp>
#include <weft/comm/nccl/device_view.hpp>
#include <weft/comm/nccl/options.hpp>
#include <weft/comm/reference.hpp>
#include <weft/core/dtype.hpp>
#include <weft/core/error.hpp>
#include <weft/core/memory.hpp>

#include <array>
#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <memory>
#include <span>
#include <string>
#include <thread>
#include <utility>
#include <vector>

namespace weft::comm::nccl {

//! One rank of an NCCL communicator (a StreamCommunicator).
//!
//! - Obtain one with create(host, device) (rank 0 makes the ncclUniqueId and broadcasts it over any
//!   weft host Communicator), init(id, rank, size, device) if you distribute the id yourself, or
//!   adopt(comm) to wrap an ncclComm_t you own (weft then never destroys it; a fault or abort()
//!   still calls ncclCommAbort on it, as NCCL requires of every rank after a failure).
//! - Communicators are non-blocking (ncclConfig_t::blocking = 0): init, split and every call that
//!   answers ncclInProgress are polled with ncclCommGetAsyncError to the deadline, so a hang
//!   becomes timeout_error plus ncclCommAbort instead of a stuck thread.
//! - Buffers must be memory_kind::cuda on this communicator's device. Every call enqueues on
//!   op_options::stream (a cudaStream_t; nullptr is the legacy default stream) and returns a work
//!   holding a CUDA event; keep the buffers alive until work.wait() returns.
//! - Count 0 is a local no-op (NCCL discards empty collectives): not a synchronisation point, but
//!   recorded in history() and reported to the hook like any other operation.
//! - In-place all_to_all(_v) (out == in) reads the input from a device copy the communicator keeps.
//! - A message to oneself waits for its other half; the second half issues both in one group.
//!   sendrecv() issues a ring step's send and recv as one group.
//! - all_gather_v and all_to_all_v are grouped ncclSend/ncclRecv; reduce_scatter_v is grouped
//!   ncclReduce (one per destination rank); all_to_all, gather and scatter are the 2.28 natives.
//! - Float avg follows NCCL (a premultiply by the dtype-rounded 1/n, within 2 ulp of sum/n);
//!   integer avg truncates the sum divided by n.
//! - One thread issues operations on a communicator (NCCL is not thread-safe per communicator);
//!   abort() may come from any thread.
class communicator : private detail::engine {
 public:
  using communicator_concept = stream_communicator_tag;
  using memory_space = cuda_space;  // the typed collectives accept views of device memory only

  communicator() = default;  // a non-member: size 0, rank -1
  communicator(communicator&&) noexcept = default;
  communicator& operator=(communicator&&) noexcept = default;
  communicator(communicator const&) = delete;
  communicator& operator=(communicator const&) = delete;

  //! Collective over `host` (any weft host Communicator, e.g. threads or MPI): rank 0 calls
  //! ncclGetUniqueId and broadcasts it; the ranks check that no two of them on one host picked the
  //! same `device` (invalid_argument_error on every rank); every rank then joins on `device`.
  //! host.rank() becomes the NCCL rank. `host` is only used during this call.
  template <class Host>
  requires Communicator<Host>
  static communicator create(Host& host, int device, options opts = {}) {
    nccl_api const& api = resolve(opts);
    WEFT_EXPECTS(host.size() > 0, "host", "a member communicator (size() > 0)", host.size());
    WEFT_EXPECTS(device >= 0, "device", "a CUDA device ordinal >= 0", device);
    // Byte 0 carries rank 0's result so a failed ncclGetUniqueId fails every rank alike.
    std::array<std::uint8_t, 1 + sizeof(ncclUniqueId)> msg{};
    if (host.rank() == 0) {
      ncclUniqueId id{};
      ncclResult_t const r = api.get_unique_id(&id);
      msg[0] = static_cast<std::uint8_t>(r);
      std::memcpy(msg.data() + 1, &id, sizeof(id));
    }
    buffer_view const v{msg.data(), msg.size(), dtype::u8, memory_kind::host, -1};
    op_options ho;
    ho.timeout = opts.timeout;
    host.broadcast(v, v, 0, ho).wait();
    if (msg[0] != ncclSuccess) {
      auto const r = static_cast<ncclResult_t>(msg[0]);
      throw backend_error(
          weft::detail::concat("ncclGetUniqueId failed on rank 0 of the bootstrap communicator: ",
                               api.get_error_string != nullptr ? api.get_error_string(r) : "",
                               " (ncclResult_t ", static_cast<int>(r), ")"),
          "nccl", static_cast<long long>(r));
    }
    check_distinct_devices(host, device, ho);
    ncclUniqueId id{};
    std::memcpy(&id, msg.data() + 1, sizeof(id));
    return init(id, host.rank(), host.size(), device, opts);
  }

  //! Joins the communicator named by `id` as `rank` of `size` on `device` (all ranks call it).
  static communicator init(ncclUniqueId const& id, int rank, int size, int device,
                           options opts = {}) {
    nccl_api const& api = resolve(opts);
    WEFT_EXPECTS(size > 0, "size", "> 0", size);
    WEFT_EXPECTS(rank >= 0 && rank < size, "rank",
                 weft::detail::concat("a rank in [0, ", size, ")"), rank);
    WEFT_EXPECTS(device >= 0, "device", "a CUDA device ordinal >= 0", device);
    auto c = std::make_shared<detail::core>();
    c->api = &api;
    c->opts = opts;
    c->opts.api = &api;
    c->owns = true;
    c->rank = rank;
    c->size = size;
    c->device = device;
    c->check_cuda(api.set_device(device), weft::detail::concat("cudaSetDevice(", device, ")"));
    ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
    config.blocking = 0;
    auto const deadline = detail::clock::now() + opts.timeout;
    ncclResult_t r = api.comm_init_rank_config(&c->comm, size, id, rank, &config);
    std::string const what = weft::detail::concat("ncclCommInitRankConfig(rank ", rank, " of ",
                                                  size, ", device ", device, ")");
    c->check(r, what);
    if (r == ncclInProgress) r = c->poll_ready(c->comm, deadline);
    if (r == ncclInProgress)
      c->fail(errc::timeout,
              weft::detail::concat(what, " did not complete within ", opts.timeout.count(),
                                   " ms (do all ranks call it with the same id?); "
                                   "ncclCommAbort was called"));
    c->check(r, what);
    return communicator(std::move(c));
  }

  //! Wraps an existing ncclComm_t without owning it: the caller destroys it after this object.
  static communicator adopt(ncclComm_t comm, options opts = {}) {
    nccl_api const& api = resolve(opts);
    WEFT_EXPECTS(comm != nullptr, "comm", "a valid ncclComm_t", "nullptr");
    auto c = std::make_shared<detail::core>();
    c->api = &api;
    c->opts = opts;
    c->opts.api = &api;
    c->comm = comm;
    c->owns = false;
    // A failed query leaves the caller's communicator alone (no abort): it is not ours.
    auto query = [&](ncclResult_t r, char const* what) {
      if (r != ncclSuccess)
        throw backend_error(
            weft::detail::concat(what, " on the adopted communicator failed: ", c->nccl_text(r)),
            "nccl", static_cast<long long>(r));
    };
    query(api.comm_user_rank(comm, &c->rank), "ncclCommUserRank");
    query(api.comm_count(comm, &c->size), "ncclCommCount");
    query(api.comm_cu_device(comm, &c->device), "ncclCommCuDevice");
    return communicator(std::move(c));
  }

  [[nodiscard]] int rank() const noexcept { return rank_(); }
  [[nodiscard]] int size() const noexcept { return size_(); }
  [[nodiscard]] int device() const noexcept { return core_ ? core_->device : -1; }
  [[nodiscard]] comm_state state() const noexcept {
    return core_ ? core_->state.load() : comm_state::healthy;
  }
  //! The wrapped handle (still owned by this object unless adopted).
  [[nodiscard]] ncclComm_t native_handle() const noexcept { return core_ ? core_->comm : nullptr; }
  [[nodiscard]] std::vector<op_record> history() const {
    return core_ ? core_->history.records() : std::vector<op_record>{};
  }
  //! Called with each operation's record once it completes or fails (from the waiting thread).
  void set_hook(op_hook hook) {
    detail::rules::check_member(core_ != nullptr);
    core_->history.set_hook(std::move(hook));
  }

  work all_reduce(buffer_view in, buffer_view out, reduce_op op = {}, op_options o = {}) {
    op_record rec = begin(op_kind::all_reduce);
    auto const p = detail::rules::plan_all_reduce(endpoint(), in, out, op);
    rec = planned(rec, p);
    if (p.trivial) return finish_trivial(rec);
    return issue(rec, p.fp, o, [&](cudaStream_t s) {
      return with_op(op, in.type, [&](ncclRedOp_t r) {
        return api().all_reduce(in.data, out.data, in.count, to_nccl(in.type), r, comm(), s);
      });
    });
  }

  work reduce(buffer_view in, buffer_view out, reduce_op op, int root, op_options o = {}) {
    op_record rec = begin(op_kind::reduce);
    auto const p = detail::rules::plan_reduce(endpoint(), in, out, op, root);
    rec = planned(rec, p);
    if (p.trivial) return finish_trivial(rec);
    void* const recv = p.is_root ? out.data : nullptr;
    return issue(rec, p.fp, o, [&](cudaStream_t s) {
      return with_op(op, in.type, [&](ncclRedOp_t r) {
        return api().reduce(in.data, recv, in.count, to_nccl(in.type), r, root, comm(), s);
      });
    });
  }

  work broadcast(buffer_view in, buffer_view out, int root, op_options o = {}) {
    op_record rec = begin(op_kind::broadcast);
    auto const p = detail::rules::plan_broadcast(endpoint(), in, out, root);
    rec = planned(rec, p);
    if (p.trivial) return finish_trivial(rec);
    void const* const send = p.is_root ? in.data : out.data;
    return issue(rec, p.fp, o, [&](cudaStream_t s) {
      return api().broadcast(send, out.data, out.count, to_nccl(out.type), root, comm(), s);
    });
  }

  work all_gather(buffer_view in, buffer_view out, op_options o = {}) {
    op_record rec = begin(op_kind::all_gather);
    auto const p = detail::rules::plan_all_gather(endpoint(), in, out);
    rec = planned(rec, p);
    if (p.trivial) return finish_trivial(rec);
    return issue(rec, p.fp, o, [&](cudaStream_t s) {
      return api().all_gather(in.data, out.data, in.count, to_nccl(in.type), comm(), s);
    });
  }

  work reduce_scatter(buffer_view in, buffer_view out, reduce_op op = {}, op_options o = {}) {
    op_record rec = begin(op_kind::reduce_scatter);
    auto const p = detail::rules::plan_reduce_scatter(endpoint(), in, out, op);
    rec = planned(rec, p);
    if (p.trivial) return finish_trivial(rec);
    return issue(rec, p.fp, o, [&](cudaStream_t s) {
      return with_op(op, in.type, [&](ncclRedOp_t r) {
        return api().reduce_scatter(in.data, out.data, out.count, to_nccl(in.type), r, comm(), s);
      });
    });
  }

  //! In place (out == in) too: the input is read from a device copy.
  work all_to_all(buffer_view in, buffer_view out, op_options o = {}) {
    op_record rec = begin(op_kind::all_to_all);
    auto const p = detail::rules::plan_all_to_all(endpoint(), in, out);
    rec = planned(rec, p);
    if (p.trivial) return finish_trivial(rec);
    std::size_t const per = in.count / static_cast<std::size_t>(size());
    work w = issue(rec, p.fp, o, [&](cudaStream_t s) {
      void const* const send = p.in_place ? staged_input(in, o) : in.data;
      return api().all_to_all(send, out.data, per, to_nccl(in.type), comm(), s);
    });
    if (p.in_place) staged_done(o);
    return w;
  }

  work gather(buffer_view in, buffer_view out, int root, op_options o = {}) {
    op_record rec = begin(op_kind::gather);
    auto const p = detail::rules::plan_gather(endpoint(), in, out, root);
    rec = planned(rec, p);
    if (p.trivial) return finish_trivial(rec);
    void* const recv = p.is_root ? out.data : nullptr;
    return issue(rec, p.fp, o, [&](cudaStream_t s) {
      return api().gather(in.data, recv, in.count, to_nccl(in.type), root, comm(), s);
    });
  }

  work scatter(buffer_view in, buffer_view out, int root, op_options o = {}) {
    op_record rec = begin(op_kind::scatter);
    auto const p = detail::rules::plan_scatter(endpoint(), in, out, root);
    rec = planned(rec, p);
    if (p.trivial) return finish_trivial(rec);
    void const* const send = p.is_root ? in.data : nullptr;
    return issue(rec, p.fp, o, [&](cudaStream_t s) {
      return api().scatter(send, out.data, out.count, to_nccl(out.type), root, comm(), s);
    });
  }

  //! Uneven all-gather: rank r contributes counts[r] elements, placed at out + sum(counts[<r]).
  //! Grouped ncclSend/ncclRecv with every peer (a self pair unless in-place).
  work all_gather_v(buffer_view in, buffer_view out, std::span<std::size_t const> counts,
                    op_options o = {}) {
    op_record rec = begin(op_kind::all_gather_v);
    auto const p = detail::rules::plan_all_gather_v(endpoint(), in, out, counts);
    rec = planned(rec, p);
    if (p.trivial) return finish_trivial(rec);
    auto const t = to_nccl(in.type);
    return issue(rec, p.fp, o, [&](cudaStream_t s) {
      return grouped([&](auto& call) {
        for (int q = 0; q < size(); ++q) {
          auto const uq = static_cast<std::size_t>(q);
          if (q == rank() && p.in_place) continue;
          if (in.count > 0) call(api().send(in.data, in.count, t, q, comm(), s));
          if (counts[uq] > 0)
            call(api().recv(detail::rules::byte_offset(out.data, p.offsets[uq], in.type),
                            counts[uq], t, q, comm(), s));
        }
      });
    });
  }

  //! Uneven reduce-scatter: rank r receives the reduction of slice r, counts[r] elements at
  //! in + sum(counts[<r]). Grouped ncclReduce, one per destination (as torchcomms does).
  work reduce_scatter_v(buffer_view in, buffer_view out, std::span<std::size_t const> counts,
                        reduce_op op = {}, op_options o = {}) {
    op_record rec = begin(op_kind::reduce_scatter_v);
    auto const p = detail::rules::plan_reduce_scatter_v(endpoint(), in, out, counts, op);
    rec = planned(rec, p);
    if (p.trivial) return finish_trivial(rec);
    auto const t = to_nccl(in.type);
    return issue(rec, p.fp, o, [&](cudaStream_t s) {
      return with_op(op, in.type, [&](ncclRedOp_t r) {
        return grouped([&](auto& call) {
          for (int q = 0; q < size(); ++q) {
            auto const uq = static_cast<std::size_t>(q);
            if (counts[uq] == 0) continue;
            call(api().reduce(detail::rules::byte_offset(in.data, p.offsets[uq], in.type),
                              q == rank() ? out.data : nullptr, counts[uq], t, r, q, comm(), s));
          }
        });
      });
    });
  }

  //! Uneven all-to-all: send_counts[q] elements go to q (packed in rank order in `in`),
  //! recv_counts[q] come from q (packed in rank order in `out`). Grouped ncclSend/ncclRecv; in
  //! place too (the input is read from a device copy). Never trivial: the peers' counts may not
  //! all be zero, and every rank must advance the sequence (and check fingerprints) alike.
  work all_to_all_v(buffer_view in, buffer_view out, std::span<std::size_t const> send_counts,
                    std::span<std::size_t const> recv_counts, op_options o = {}) {
    op_record rec = begin(op_kind::all_to_all_v);
    auto const p = detail::rules::plan_all_to_all_v(endpoint(), in, out, send_counts, recv_counts);
    rec = planned(rec, p);
    auto const t = to_nccl(in.type);
    work w = issue(rec, p.fp, o, [&](cudaStream_t s) {
      void const* const src = p.in_place ? staged_input(in, o) : in.data;
      return grouped([&](auto& call) {
        for (int q = 0; q < size(); ++q) {
          auto const uq = static_cast<std::size_t>(q);
          if (send_counts[uq] > 0)
            call(api().send(detail::rules::byte_offset(src, p.offsets[uq], in.type),
                            send_counts[uq], t, q, comm(), s));
          if (recv_counts[uq] > 0)
            call(api().recv(detail::rules::byte_offset(out.data, p.offsets2[uq], in.type),
                            recv_counts[uq], t, q, comm(), s));
        }
      });
    });
    if (p.in_place) staged_done(o);
    return w;
  }

  //! Point-to-point: enqueued like everything else, so send and isend are the same (as are recv
  //! and irecv); the peer must post the matching call. Not fingerprinted (not collective).
  work isend(buffer_view in, int peer_rank, op_options o = {}) {
    return p2p(op_kind::send, in, peer_rank, o);
  }
  work irecv(buffer_view out, int peer_rank, op_options o = {}) {
    return p2p(op_kind::recv, out, peer_rank, o);
  }
  work send(buffer_view in, int peer_rank, op_options o = {}) {
    return p2p(op_kind::send, in, peer_rank, o);
  }
  work recv(buffer_view out, int peer_rank, op_options o = {}) {
    return p2p(op_kind::recv, out, peer_rank, o);
  }

  //! One exchange of a ring step: sends `in` to `send_peer` and receives `out` from `recv_peer`
  //! in ONE NCCL group (ncclGroupStart, ncclSend, ncclRecv, ncclGroupEnd), so every rank of a ring
  //! may call it at once without deadlock; separate send and recv calls are separate groups, and
  //! an ncclSend may wait for its peer's ncclRecv. Either peer may be this rank. Recorded in
  //! history() as a send and a recv; the work completes both. Count 0 on one side sends (or
  //! receives) nothing on that side.
  work sendrecv(buffer_view in, int send_peer, buffer_view out, int recv_peer, op_options o = {}) {
    return grouped_sendrecv(in, send_peer, out, recv_peer, o);
  }

  //! NCCL has no barrier: a one-word all_reduce on device scratch; wait() on the work to block.
  work barrier(op_options o = {}) {
    op_record rec = begin(op_kind::barrier);
    void* const word = scratch(o);
    rec = planned(rec, detail::rules::plan_sync(op_kind::barrier));
    return issue(rec, detail::rules::plan_sync(op_kind::barrier).fp, o, [&](cudaStream_t s) {
      return api().all_reduce(word, word, 1, ncclInt32, ncclSum, comm(), s);
    });
  }

  //! Collective ncclCommSplit (non-blocking, polled to the deadline). A negative color gives a
  //! non-member (size 0).
  communicator split(int color, int key) {
    op_record rec = begin(op_kind::split);
    auto& c = *core_;
    std::string const what =
        weft::detail::concat("ncclCommSplit(color ", color, ", key ", key, ") on rank ", rank());
    rec = planned(rec, detail::rules::plan_sync(op_kind::split));
    rec.seq = ++c.seq;
    auto const id = c.history.add(rec);
    try {
      ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
      config.blocking = 0;
      ncclComm_t child = nullptr;
      auto const deadline = detail::clock::now() + c.opts.timeout;
      ncclResult_t r =
          api().comm_split(comm(), color < 0 ? NCCL_SPLIT_NOCOLOR : color, key, &child, &config);
      c.check(r, what);
      // A non-blocking NCCL keeps *newcomm NULL until the split's job has run, then stores the
      // handle from its init thread (src/init.cc: "*newcomm should be NCCL_COMM_NULL until comm
      // split fully complete"), whatever the call returned: wait for it, watching the parent for
      // errors (first seen on the real library: a one-rank split returned a non-member).
      std::atomic_ref<ncclComm_t> handle(child);
      while (color >= 0 && handle.load(std::memory_order_acquire) == nullptr) {
        ncclResult_t state_now = ncclSuccess;
        ncclResult_t const e = api().comm_get_async_error(comm(), &state_now);
        c.check(e != ncclSuccess ? e : (state_now == ncclInProgress ? ncclSuccess : state_now),
                what);
        if (detail::clock::now() > deadline)
          c.fail(errc::timeout, weft::detail::concat(what, " gave no communicator within ",
                                                     c.opts.timeout.count(), " ms"));
        std::this_thread::sleep_for(c.opts.poll_interval);
      }
      child = handle.load(std::memory_order_acquire);
      if (r == ncclInProgress || child != nullptr) {
        r = c.poll_ready(child != nullptr ? child : comm(), deadline);
        if (r == ncclInProgress) {
          if (child != nullptr) (void)api().comm_abort(child);
          c.fail(errc::timeout,
                 weft::detail::concat(what, " did not complete within ", c.opts.timeout.count(),
                                      " ms; ncclCommAbort was called"));
        }
        c.check(r, what);
      }
      rec.end = detail::clock::now();
      c.history.completed(id, rec);
      if (child == nullptr) return communicator{};
      auto k = std::make_shared<detail::core>();
      k->api = c.api;
      k->opts = c.opts;
      k->comm = child;
      k->owns = true;
      k->device = c.device;
      k->check(api().comm_user_rank(child, &k->rank), "ncclCommUserRank");
      k->check(api().comm_count(child, &k->size), "ncclCommCount");
      return communicator(std::move(k));
    } catch (std::exception const& e) {
      detail::rules::mark_failed(rec, e.what());
      c.history.completed(id, rec);
      throw;
    }
  }

  //! Waits (bounded by the deadline) for everything enqueued so far on o.stream.
  void synchronize(op_options o = {}) {
    detail::rules::check_member(core_ != nullptr);
    std::string const ctx = weft::detail::concat("synchronize on rank ", rank());
    core_->check_usable(ctx);
    track(o, ctx).wait();
  }

  //! Idempotent; may be called from any thread. Calls ncclCommAbort (which also stops device work
  //! in flight); every later call throws peer_aborted_error naming this rank, even after a fault.
  void abort() noexcept {
    if (!core_) return;
    core_->state.store(comm_state::aborted);
    core_->abort_nccl();
  }

 private:
  explicit communicator(std::shared_ptr<detail::core> c) : engine(std::move(c)) {}
};

static_assert(StreamCommunicator<communicator>, "nccl::communicator must model StreamCommunicator");

}  // namespace weft::comm::nccl

#endif  // WEFT_HAS_NCCL
