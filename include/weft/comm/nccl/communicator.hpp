// weft/comm/nccl/communicator.hpp — the logic of the NCCL backend (weft::comm::nccl::communicator):
// argument checks, dtype/op mapping, non-blocking init and split, enqueueing through the nccl_api
// table, completion through CUDA events polled to a deadline, fault mapping and abort, history.
// It makes no kernel launch, so g++ compiles it; users include <weft/comm/nccl/communicator.cuh>.
#pragma once

#include <weft/comm/nccl/api.hpp>

#if WEFT_HAS_NCCL
#  include <weft/comm/concepts.hpp>
#  include <weft/comm/detail/checked.hpp>
#  include <weft/comm/reference.hpp>
#  include <weft/core/dtype.hpp>
#  include <weft/core/error.hpp>
#  include <weft/core/memory.hpp>

#  include <algorithm>
#  include <array>
#  include <atomic>
#  include <chrono>
#  include <cstddef>
#  include <cstdint>
#  include <cstring>
#  include <memory>
#  include <mutex>
#  include <span>
#  include <string>
#  include <thread>
#  include <utility>
#  include <vector>

#  include <unistd.h>  // gethostname, to tell which ranks share a host

namespace weft::comm::nccl {

//! Per-communicator settings; split() children inherit them.
struct options {
  //! Deadline of every operation (init, split, each collective, finalize) unless op_options says
  //! otherwise. When it passes, the communicator is aborted (ncclCommAbort) and timeout_error thrown.
  std::chrono::milliseconds timeout{std::chrono::minutes(5)};
  std::size_t history_size = 64;
  //! Debug mode: before each collective, an extra 8-word all_gather compares every rank's
  //! fingerprint (op, dtype, count, root, reduction, seq) and throws mismatch_error on a difference,
  //! where NCCL itself would hang or corrupt memory. Costs one small collective per call.
  bool check_fingerprints = WEFT_DEBUG != 0;
  //! Sleep between polls of cudaEventQuery / ncclCommGetAsyncError (never pure spinning).
  std::chrono::microseconds poll_interval{100};
  //! The function table; nullptr means linked_api(). Tests pass a mock.
  nccl_api const* api = nullptr;
};

//! weft dtype -> NCCL datatype.
constexpr ncclDataType_t to_nccl(dtype d) {
  switch (d) {
    case dtype::f32: return ncclFloat32;
    case dtype::f64: return ncclFloat64;
    case dtype::bf16: return ncclBfloat16;
    case dtype::f16: return ncclFloat16;
    case dtype::i32: return ncclInt32;
    case dtype::i64: return ncclInt64;
    case dtype::u8: return ncclUint8;
  }
  WEFT_THROW(invalid_argument_error, "argument `type`: expected one of f32, f64, bf16, f16, i32, i64, u8, actual ",
             static_cast<int>(d));
}

//! Built-in reduce kinds -> ncclRedOp_t. premul_sum has no built-in value: the communicator creates
//! one with ncclRedOpCreatePreMulSum per call and destroys it once enqueued.
constexpr ncclRedOp_t to_nccl(reduce_kind k) {
  switch (k) {
    case reduce_kind::sum: return ncclSum;
    case reduce_kind::prod: return ncclProd;
    case reduce_kind::min: return ncclMin;
    case reduce_kind::max: return ncclMax;
    case reduce_kind::avg: return ncclAvg;
    case reduce_kind::premul_sum: break;
  }
  WEFT_THROW(invalid_argument_error, "argument `op.kind`: expected sum, prod, min, max or avg (premul_sum "
             "needs a communicator), actual ", to_string(k));
}

namespace detail {

using clock = std::chrono::steady_clock;

//! The premul_sum scalar in the element type, as ncclScalarHostImmediate reads it.
struct scalar_storage {
  alignas(8) std::array<std::byte, 8> bytes{};
  scalar_storage(double s, dtype d) {
    auto put = [&](auto v) { std::memcpy(bytes.data(), &v, sizeof(v)); };
    switch (d) {
      case dtype::f32: put(static_cast<float>(s)); break;
      case dtype::f64: put(s); break;
      case dtype::bf16: put(bf16(static_cast<float>(s))); break;
      case dtype::f16: put(f16(static_cast<float>(s))); break;
      case dtype::i32: put(static_cast<std::int32_t>(s)); break;
      case dtype::i64: put(static_cast<std::int64_t>(s)); break;
      case dtype::u8: put(static_cast<std::uint8_t>(s)); break;
    }
  }
  void* data() noexcept { return bytes.data(); }
};

inline bool overlap(buffer_view const& a, buffer_view const& b) noexcept {
  if (a.count == 0 || b.count == 0) return false;
  auto const a0 = reinterpret_cast<std::uintptr_t>(a.data);
  auto const b0 = reinterpret_cast<std::uintptr_t>(b.data);
  return a0 < b0 + b.bytes() && b0 < a0 + a.bytes();
}

inline void* offset(void* p, std::size_t elements, dtype t) noexcept {
  return p == nullptr ? nullptr : static_cast<std::byte*>(p) + elements * size_of(t);
}

//! Everything a communicator and its pending work share: the NCCL handle, the fault state and the
//! history. Work holds it by shared_ptr so a fault seen while waiting poisons the communicator.
struct core {
  nccl_api const* api = nullptr;
  ncclComm_t comm = nullptr;
  bool owns = false;
  int rank = -1;
  int size = 0;
  int device = -1;
  options opts;

  std::atomic<comm_state> state{comm_state::healthy};
  std::atomic<bool> nccl_aborted{false};
  std::uint64_t seq = 0;   // collectives issued (issuing thread only)
  void* scratch = nullptr;  // device words for barrier and fingerprints, allocated on first use

  mutable std::mutex m;  // guards everything below
  errc fault_kind = errc::comm;
  std::string fault_message;
  int fault_origin = -1;
  long long fault_code = 0;
  std::string fault_backend;
  std::vector<op_record> ring;
  std::uint64_t recorded = 0;
  op_hook hook;

  core() = default;
  core(core const&) = delete;
  core& operator=(core const&) = delete;

  ~core() {
    if (scratch != nullptr && api->free != nullptr) (void)api->free(scratch);
    if (comm == nullptr || nccl_aborted.load()) return;
    if (!owns) return;
    if (state.load() == comm_state::healthy) {
      // Flush, bounded by the deadline; a comm that does not quiesce is aborted, never waited on.
      ncclResult_t r = api->comm_finalize(comm);
      if (r == ncclInProgress || r == ncclSuccess) r = poll_ready(comm, clock::now() + opts.timeout);
      if (r == ncclSuccess) {
        (void)api->comm_destroy(comm);
        return;
      }
    }
    (void)api->comm_abort(comm);
  }

  //! Polls ncclCommGetAsyncError until it leaves ncclInProgress or the deadline passes (then
  //! returns ncclInProgress).
  ncclResult_t poll_ready(ncclComm_t c, clock::time_point deadline) const {
    for (;;) {
      ncclResult_t state_now = ncclSuccess;
      ncclResult_t const r = api->comm_get_async_error(c, &state_now);
      if (r != ncclSuccess) return r;
      if (state_now != ncclInProgress) return state_now;
      if (clock::now() >= deadline) return ncclInProgress;
      std::this_thread::sleep_for(opts.poll_interval);
    }
  }

  void abort_nccl() noexcept {
    if (comm != nullptr && !nccl_aborted.exchange(true)) (void)api->comm_abort(comm);
  }

  std::string nccl_text(ncclResult_t r) const {
    std::string s = api->get_error_string != nullptr ? api->get_error_string(r) : "";
    if (comm != nullptr && api->get_last_error != nullptr) {
      char const* last = api->get_last_error(comm);
      if (last != nullptr && *last != '\0') s += weft::detail::concat(" (", last, ")");
    }
    return weft::detail::concat("ncclResult_t ", static_cast<int>(r), " ", s);
  }

  //! Records the first fault, poisons, aborts NCCL (every rank must, per the NCCL docs) and throws.
  [[noreturn]] void fail(errc kind, std::string const& message, int origin = -1,
                         long long code = 0, char const* backend = "nccl") {
    {
      std::lock_guard lock(m);
      if (state.load() == comm_state::healthy) {
        fault_kind = kind;
        fault_message = message;
        fault_origin = origin;
        fault_code = code;
        fault_backend = backend;
        state.store(comm_state::poisoned);
      }
    }
    abort_nccl();
    switch (kind) {
      case errc::timeout: throw timeout_error(message);
      case errc::peer_aborted: throw peer_aborted_error(message, origin);
      case errc::mismatch: throw mismatch_error(message);
      case errc::backend: throw backend_error(message, backend, code);
      default: throw comm_error(message);
    }
  }

  //! Maps a result of an NCCL call. ncclInvalidArgument means "the call had no effect" and leaves
  //! the communicator usable; ncclRemoteError is a peer's failure; everything else is fatal.
  void check(ncclResult_t r, std::string const& context) {
    if (r == ncclSuccess || r == ncclInProgress) return;
    std::string const msg = weft::detail::concat(context, " failed: ", nccl_text(r));
    if (r == ncclInvalidArgument)
      throw backend_error(msg + "; the call had no effect and the communicator is still usable",
                          "nccl", static_cast<long long>(r));
    if (r == ncclRemoteError)
      fail(errc::peer_aborted, msg + "; a remote peer failed, the communicator was aborted", -1,
           static_cast<long long>(r));
    fail(errc::backend, msg + "; the communicator was aborted", -1, static_cast<long long>(r));
  }

  void check_cuda(cudaError_t e, std::string const& context) {
    if (e == cudaSuccess) return;
    fail(errc::backend,
         weft::detail::concat(context, " failed: ",
                              api->cuda_error_name != nullptr ? api->cuda_error_name(e) : "",
                              " (cudaError_t ", static_cast<int>(e), ")"),
         -1, static_cast<long long>(e), "cuda");
  }

  //! Throws at once on a poisoned or aborted communicator.
  void check_usable(std::string const& context) const {
    comm_state const s = state.load();
    if (s == comm_state::healthy) return;
    std::unique_lock lock(m);
    if (s == comm_state::aborted)
      throw peer_aborted_error(
          weft::detail::concat(context, " on an aborted communicator: abort() was called on rank ",
                               rank),
          rank);
    std::string const msg =
        weft::detail::concat(context, " on a poisoned communicator: ", fault_message);
    // The original fault's type, as on every weft backend.
    switch (fault_kind) {
      case errc::timeout: throw timeout_error(msg);
      case errc::mismatch: throw mismatch_error(msg);
      case errc::backend: throw backend_error(msg, fault_backend, fault_code);
      case errc::peer_aborted: throw peer_aborted_error(msg, fault_origin);
      default: throw comm_error(msg);
    }
  }

  std::uint64_t record(op_record const& r) {
    std::lock_guard lock(m);
    std::uint64_t const id = recorded++;
    if (opts.history_size == 0) return id;
    if (ring.size() < opts.history_size) {
      ring.push_back(r);
    } else {
      ring[static_cast<std::size_t>(id % opts.history_size)] = r;
    }
    return id;
  }

  void finish_record(std::uint64_t id, bool ok, std::string const& error) {
    op_record copy;
    op_hook h;
    {
      std::lock_guard lock(m);
      if (opts.history_size == 0 || id >= recorded || id + opts.history_size < recorded) return;
      op_record& r = ring[static_cast<std::size_t>(id % opts.history_size)];
      r.end = clock::now();
      r.ok = ok;
      r.error = error;
      copy = r;
      h = hook;
    }
    if (h) {
      try {
        h(copy);
      } catch (...) {  // a hook must not turn a completed operation into a failure
      }
    }
  }

  std::vector<op_record> history() const {
    std::lock_guard lock(m);
    std::vector<op_record> out;
    std::uint64_t const first = recorded - ring.size();
    for (std::uint64_t id = first; id < recorded; ++id)
      out.push_back(ring[static_cast<std::size_t>(id % opts.history_size)]);
    return out;
  }
};

//! A pending operation: a CUDA event recorded after it on its stream, polled together with
//! ncclCommGetAsyncError until it completes, a fault appears, or its deadline passes.
class event_work final : public weft::comm::detail::work_state {
 public:
  event_work(std::shared_ptr<core> c, cudaEvent_t e, std::uint64_t record_id,
             clock::time_point op_deadline, std::string context)
      : core_(std::move(c)), event_(e), id_(record_id), op_deadline_(op_deadline),
        context_(std::move(context)) {}
  event_work(event_work const&) = delete;
  event_work& operator=(event_work const&) = delete;
  ~event_work() override {
    if (event_ != nullptr) (void)core_->api->event_destroy(event_);
  }

  bool wait_until(clock::time_point deadline) override {
    if (done_.load()) return true;
    for (;;) {
      cudaError_t const q = core_->api->event_query(event_);
      if (q == cudaSuccess) {
        done_.store(true);
        core_->finish_record(id_, true, {});
        return true;
      }
      try {
        if (q != cudaErrorNotReady) core_->check_cuda(q, "cudaEventQuery after " + context_);
        core_->check_usable(context_);
        ncclResult_t async = ncclSuccess;
        ncclResult_t const r = core_->api->comm_get_async_error(core_->comm, &async);
        core_->check(r, "ncclCommGetAsyncError during " + context_);
        core_->check(async, "asynchronous error during " + context_);
        if (clock::now() >= op_deadline_)
          core_->fail(errc::timeout,
                      weft::detail::concat(
                          context_, " did not complete within its deadline (",
                          core_->opts.timeout.count(), " ms default); ncclCommAbort was called. ",
                          "NCCL cannot tell which ranks are missing: check every rank's history()"));
      } catch (std::exception const& e) {
        core_->finish_record(id_, false, e.what());
        throw;
      }
      auto const now = clock::now();
      if (now >= deadline) return false;
      auto const left = std::min(deadline, op_deadline_) - now;
      std::this_thread::sleep_for(std::min<clock::duration>(core_->opts.poll_interval, left));
    }
  }

  [[nodiscard]] bool done() const noexcept override {
    if (done_.load()) return true;
    return core_->api->event_query(event_) == cudaSuccess;
  }

 private:
  std::shared_ptr<core> core_;
  cudaEvent_t event_ = nullptr;
  std::uint64_t id_ = 0;
  clock::time_point op_deadline_;
  std::string context_;
  std::atomic<bool> done_{false};
};

}  // namespace detail

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
//! - Count 0 is a local no-op (NCCL discards empty collectives): not a synchronisation point.
//! - all_gather_v and all_to_all_v are grouped ncclSend/ncclRecv; reduce_scatter_v is grouped
//!   ncclReduce (one per destination rank); all_to_all, gather and scatter are the 2.28 natives.
//! - Float avg follows NCCL (a premultiply by the dtype-rounded 1/n, within 2 ulp of sum/n);
//!   integer avg truncates the sum divided by n.
//! - One thread issues operations on a communicator (NCCL is not thread-safe per communicator);
//!   abort() may come from any thread.
class communicator {
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
    std::string const what =
        weft::detail::concat("ncclCommInitRankConfig(rank ", rank, " of ", size, ", device ", device, ")");
    c->check(r, what);
    if (r == ncclInProgress) r = c->poll_ready(c->comm, deadline);
    if (r == ncclInProgress)
      c->fail(errc::timeout, weft::detail::concat(what, " did not complete within ", opts.timeout.count(),
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
        throw backend_error(weft::detail::concat(what, " on the adopted communicator failed: ",
                                                 c->nccl_text(r)),
                            "nccl", static_cast<long long>(r));
    };
    query(api.comm_user_rank(comm, &c->rank), "ncclCommUserRank");
    query(api.comm_count(comm, &c->size), "ncclCommCount");
    query(api.comm_cu_device(comm, &c->device), "ncclCommCuDevice");
    return communicator(std::move(c));
  }

  [[nodiscard]] int rank() const noexcept { return core_ ? core_->rank : -1; }
  [[nodiscard]] int size() const noexcept { return core_ ? core_->size : 0; }
  [[nodiscard]] int device() const noexcept { return core_ ? core_->device : -1; }
  [[nodiscard]] comm_state state() const noexcept {
    return core_ ? core_->state.load() : comm_state::healthy;
  }
  //! The wrapped handle (still owned by this object unless adopted).
  [[nodiscard]] ncclComm_t native_handle() const noexcept { return core_ ? core_->comm : nullptr; }
  [[nodiscard]] std::vector<op_record> history() const {
    return core_ ? core_->history() : std::vector<op_record>{};
  }
  //! Called with each operation's record once it completes or fails (from the waiting thread).
  void set_hook(op_hook hook) {
    member("set_hook");
    std::lock_guard lock(core_->m);
    core_->hook = std::move(hook);
  }

  work all_reduce(buffer_view in, buffer_view out, reduce_op op = {}, op_options o = {}) {
    auto ctx = begin(op_kind::all_reduce);
    check_buffer(in, "in");
    check_buffer(out, "out");
    check_same_type(in, out);
    WEFT_EXPECTS_SHAPE(out.count == in.count, "out.count", in.count, out.count);
    check_in_place_or_disjoint(in, out, in.data == out.data, "out == in (in-place)");
    validate_reduce_op(op, in.type);
    if (in.count == 0) return {};
    op_record rec = make_record(op_kind::all_reduce, in.type, in.bytes(), out.bytes(), -1);
    return issue(rec, {op_kind::all_reduce, in.type, in.count, -1, op.kind, 0}, o, ctx,
                 [&](cudaStream_t s) {
                   return with_op(op, in.type, [&](ncclRedOp_t r) {
                     return api().all_reduce(in.data, out.data, in.count, to_nccl(in.type), r, comm(), s);
                   });
                 });
  }

  work reduce(buffer_view in, buffer_view out, reduce_op op, int root, op_options o = {}) {
    auto ctx = begin(op_kind::reduce);
    check_rank(root, "root");
    check_buffer(in, "in");
    bool const is_root = root == rank();
    if (is_root) {
      check_buffer(out, "out");
      check_same_type(in, out);
      WEFT_EXPECTS_SHAPE(out.count == in.count, "out.count (on the root)", in.count, out.count);
      check_in_place_or_disjoint(in, out, in.data == out.data, "out == in (in-place)");
    }
    validate_reduce_op(op, in.type);
    if (in.count == 0) return {};
    op_record rec = make_record(op_kind::reduce, in.type, in.bytes(), is_root ? in.bytes() : 0, root);
    void* const recv = is_root ? out.data : nullptr;
    return issue(rec, {op_kind::reduce, in.type, in.count, root, op.kind, 0}, o, ctx,
                 [&](cudaStream_t s) {
                   return with_op(op, in.type, [&](ncclRedOp_t r) {
                     return api().reduce(in.data, recv, in.count, to_nccl(in.type), r, root, comm(), s);
                   });
                 });
  }

  work broadcast(buffer_view in, buffer_view out, int root, op_options o = {}) {
    auto ctx = begin(op_kind::broadcast);
    check_rank(root, "root");
    check_buffer(out, "out");
    bool const is_root = root == rank();
    if (is_root) {
      check_buffer(in, "in");
      check_same_type(in, out);
      WEFT_EXPECTS_SHAPE(in.count == out.count, "in.count (on the root)", out.count, in.count);
      check_in_place_or_disjoint(in, out, in.data == out.data, "out == in (in-place)");
    }
    if (out.count == 0) return {};
    op_record rec =
        make_record(op_kind::broadcast, out.type, is_root ? out.bytes() : 0, out.bytes(), root);
    void const* const send = is_root ? in.data : out.data;
    return issue(rec, {op_kind::broadcast, out.type, out.count, root, reduce_kind::sum, 0}, o, ctx,
                 [&](cudaStream_t s) {
                   return api().broadcast(send, out.data, out.count, to_nccl(out.type), root, comm(), s);
                 });
  }

  work all_gather(buffer_view in, buffer_view out, op_options o = {}) {
    auto ctx = begin(op_kind::all_gather);
    check_buffer(in, "in");
    check_buffer(out, "out");
    check_same_type(in, out);
    auto const n = static_cast<std::size_t>(size());
    WEFT_EXPECTS_SHAPE(out.count == weft::comm::detail::checked_mul(n, in.count, "size() * in.count"), "out.count",
                       weft::detail::concat(weft::comm::detail::checked_mul(n, in.count, "size() * in.count"), " (size() * in.count)"), out.count);
    check_in_place_or_disjoint(in, out, in.data == detail::offset(out.data, rank() * in.count, in.type),
                               "in == out + rank() * in.count (in-place)");
    if (in.count == 0) return {};
    op_record rec = make_record(op_kind::all_gather, in.type, in.bytes(), out.bytes(), -1);
    return issue(rec, {op_kind::all_gather, in.type, in.count, -1, reduce_kind::sum, 0}, o, ctx,
                 [&](cudaStream_t s) {
                   return api().all_gather(in.data, out.data, in.count, to_nccl(in.type), comm(), s);
                 });
  }

  work reduce_scatter(buffer_view in, buffer_view out, reduce_op op = {}, op_options o = {}) {
    auto ctx = begin(op_kind::reduce_scatter);
    check_buffer(in, "in");
    check_buffer(out, "out");
    check_same_type(in, out);
    auto const n = static_cast<std::size_t>(size());
    WEFT_EXPECTS_SHAPE(in.count == weft::comm::detail::checked_mul(n, out.count, "size() * out.count"), "in.count",
                       weft::detail::concat(weft::comm::detail::checked_mul(n, out.count, "size() * out.count"), " (size() * out.count)"), in.count);
    check_in_place_or_disjoint(in, out, out.data == detail::offset(in.data, rank() * out.count, in.type),
                               "out == in + rank() * out.count (in-place)");
    validate_reduce_op(op, in.type);
    if (out.count == 0) return {};
    op_record rec = make_record(op_kind::reduce_scatter, in.type, in.bytes(), out.bytes(), -1);
    return issue(rec, {op_kind::reduce_scatter, in.type, out.count, -1, op.kind, 0}, o, ctx,
                 [&](cudaStream_t s) {
                   return with_op(op, in.type, [&](ncclRedOp_t r) {
                     return api().reduce_scatter(in.data, out.data, out.count, to_nccl(in.type), r,
                                                 comm(), s);
                   });
                 });
  }

  work all_to_all(buffer_view in, buffer_view out, op_options o = {}) {
    auto ctx = begin(op_kind::all_to_all);
    check_buffer(in, "in");
    check_buffer(out, "out");
    check_same_type(in, out);
    auto const n = static_cast<std::size_t>(size());
    WEFT_EXPECTS_SHAPE(in.count % n == 0, "in.count", weft::detail::concat("a multiple of size() = ", n),
                       in.count);
    WEFT_EXPECTS_SHAPE(out.count == in.count, "out.count", in.count, out.count);
    check_in_place_or_disjoint(in, out, false, "disjoint buffers (all_to_all is out-of-place)");
    if (in.count == 0) return {};
    std::size_t const per = in.count / n;
    op_record rec = make_record(op_kind::all_to_all, in.type, in.bytes(), out.bytes(), -1);
    return issue(rec, {op_kind::all_to_all, in.type, in.count, -1, reduce_kind::sum, 0}, o, ctx,
                 [&](cudaStream_t s) {
                   return api().all_to_all(in.data, out.data, per, to_nccl(in.type), comm(), s);
                 });
  }

  work gather(buffer_view in, buffer_view out, int root, op_options o = {}) {
    auto ctx = begin(op_kind::gather);
    check_rank(root, "root");
    check_buffer(in, "in");
    bool const is_root = root == rank();
    auto const n = static_cast<std::size_t>(size());
    if (is_root) {
      check_buffer(out, "out");
      check_same_type(in, out);
      WEFT_EXPECTS_SHAPE(out.count == weft::comm::detail::checked_mul(n, in.count, "size() * in.count"), "out.count (on the root)",
                         weft::detail::concat(weft::comm::detail::checked_mul(n, in.count, "size() * in.count"), " (size() * in.count)"), out.count);
      check_in_place_or_disjoint(in, out, in.data == detail::offset(out.data, root * in.count, in.type),
                                 "in == out + root * in.count (in-place)");
    }
    if (in.count == 0) return {};
    op_record rec =
        make_record(op_kind::gather, in.type, in.bytes(), is_root ? out.bytes() : 0, root);
    void* const recv = is_root ? out.data : nullptr;
    return issue(rec, {op_kind::gather, in.type, in.count, root, reduce_kind::sum, 0}, o, ctx,
                 [&](cudaStream_t s) {
                   return api().gather(in.data, recv, in.count, to_nccl(in.type), root, comm(), s);
                 });
  }

  work scatter(buffer_view in, buffer_view out, int root, op_options o = {}) {
    auto ctx = begin(op_kind::scatter);
    check_rank(root, "root");
    check_buffer(out, "out");
    bool const is_root = root == rank();
    auto const n = static_cast<std::size_t>(size());
    if (is_root) {
      check_buffer(in, "in");
      check_same_type(in, out);
      WEFT_EXPECTS_SHAPE(in.count == weft::comm::detail::checked_mul(n, out.count, "size() * out.count"), "in.count (on the root)",
                         weft::detail::concat(weft::comm::detail::checked_mul(n, out.count, "size() * out.count"), " (size() * out.count)"), in.count);
      check_in_place_or_disjoint(in, out, out.data == detail::offset(in.data, root * out.count, in.type),
                                 "out == in + root * out.count (in-place)");
    }
    if (out.count == 0) return {};
    op_record rec =
        make_record(op_kind::scatter, out.type, is_root ? in.bytes() : 0, out.bytes(), root);
    void const* const send = is_root ? in.data : nullptr;
    return issue(rec, {op_kind::scatter, out.type, out.count, root, reduce_kind::sum, 0}, o, ctx,
                 [&](cudaStream_t s) {
                   return api().scatter(send, out.data, out.count, to_nccl(out.type), root, comm(), s);
                 });
  }

  //! Uneven all-gather: rank r contributes counts[r] elements, placed at out + sum(counts[<r]).
  //! Grouped ncclSend/ncclRecv with every peer (a self pair unless in-place).
  work all_gather_v(buffer_view in, buffer_view out, std::span<std::size_t const> counts,
                    op_options o = {}) {
    auto ctx = begin(op_kind::all_gather_v);
    check_counts(counts, "counts");
    check_buffer(in, "in");
    check_buffer(out, "out");
    check_same_type(in, out);
    auto const off = weft::comm::detail::checked_offsets(counts, in.type, "counts");
    auto const me = static_cast<std::size_t>(rank());
    WEFT_EXPECTS_SHAPE(in.count == counts[me], "in.count", weft::detail::concat(counts[me], " (counts[rank()])"),
                       in.count);
    WEFT_EXPECTS_SHAPE(out.count == off.back(), "out.count", weft::detail::concat(off.back(), " (sum of counts)"),
                       out.count);
    bool const in_place = in.data == detail::offset(out.data, off[me], in.type);
    check_in_place_or_disjoint(in, out, in_place, "in == out + sum(counts[<rank()]) (in-place)");
    if (out.count == 0) return {};
    op_record rec = make_record(op_kind::all_gather_v, in.type, in.bytes() * counts.size(),
                                out.bytes(), -1);
    auto const t = to_nccl(in.type);
    return issue(rec, {op_kind::all_gather_v, in.type, 0, -1, reduce_kind::sum, 0}, o, ctx,
                 [&](cudaStream_t s) {
                   return grouped([&](auto& call) {
                     for (int p = 0; p < size(); ++p) {
                       auto const up = static_cast<std::size_t>(p);
                       if (p == rank() && in_place) continue;
                       if (in.count > 0) call(api().send(in.data, in.count, t, p, comm(), s));
                       if (counts[up] > 0)
                         call(api().recv(detail::offset(out.data, off[up], in.type), counts[up], t, p,
                                         comm(), s));
                     }
                   });
                 });
  }

  //! Uneven reduce-scatter: rank r receives the reduction of slice r, counts[r] elements at
  //! in + sum(counts[<r]). Grouped ncclReduce, one per destination (as torchcomms does).
  work reduce_scatter_v(buffer_view in, buffer_view out, std::span<std::size_t const> counts,
                        reduce_op op = {}, op_options o = {}) {
    auto ctx = begin(op_kind::reduce_scatter_v);
    check_counts(counts, "counts");
    check_buffer(in, "in");
    check_buffer(out, "out");
    check_same_type(in, out);
    auto const off = weft::comm::detail::checked_offsets(counts, in.type, "counts");
    auto const me = static_cast<std::size_t>(rank());
    WEFT_EXPECTS_SHAPE(out.count == counts[me], "out.count",
                       weft::detail::concat(counts[me], " (counts[rank()])"), out.count);
    WEFT_EXPECTS_SHAPE(in.count == off.back(), "in.count", weft::detail::concat(off.back(), " (sum of counts)"),
                       in.count);
    check_in_place_or_disjoint(in, out, out.data == detail::offset(in.data, off[me], in.type),
                               "out == in + sum(counts[<rank()]) (in-place)");
    validate_reduce_op(op, in.type);
    if (in.count == 0) return {};
    op_record rec = make_record(op_kind::reduce_scatter_v, in.type, in.bytes(), out.bytes(), -1);
    auto const t = to_nccl(in.type);
    return issue(rec, {op_kind::reduce_scatter_v, in.type, 0, -1, op.kind, 0}, o, ctx,
                 [&](cudaStream_t s) {
                   return with_op(op, in.type, [&](ncclRedOp_t r) {
                     return grouped([&](auto& call) {
                       for (int p = 0; p < size(); ++p) {
                         auto const up = static_cast<std::size_t>(p);
                         if (counts[up] == 0) continue;
                         call(api().reduce(detail::offset(in.data, off[up], in.type),
                                           p == rank() ? out.data : nullptr, counts[up], t, r, p,
                                           comm(), s));
                       }
                     });
                   });
                 });
  }

  //! Uneven all-to-all: send_counts[p] elements go to p (packed in rank order in `in`),
  //! recv_counts[p] come from p (packed in rank order in `out`). Grouped ncclSend/ncclRecv.
  work all_to_all_v(buffer_view in, buffer_view out, std::span<std::size_t const> send_counts,
                    std::span<std::size_t const> recv_counts, op_options o = {}) {
    auto ctx = begin(op_kind::all_to_all_v);
    check_counts(send_counts, "send_counts");
    check_counts(recv_counts, "recv_counts");
    check_buffer(in, "in");
    check_buffer(out, "out");
    check_same_type(in, out);
    auto const so = weft::comm::detail::checked_offsets(send_counts, in.type, "send_counts");
    auto const ro = weft::comm::detail::checked_offsets(recv_counts, in.type, "recv_counts");
    WEFT_EXPECTS_SHAPE(in.count == so.back(), "in.count",
                       weft::detail::concat(so.back(), " (sum of send_counts)"), in.count);
    WEFT_EXPECTS_SHAPE(out.count == ro.back(), "out.count",
                       weft::detail::concat(ro.back(), " (sum of recv_counts)"), out.count);
    check_in_place_or_disjoint(in, out, false, "disjoint buffers (all_to_all_v is out-of-place)");
    // No early return when this rank moves nothing: its peers' counts may not all be zero, and
    // every rank must advance the sequence (and check fingerprints) alike.
    op_record rec = make_record(op_kind::all_to_all_v, in.type, in.bytes(), out.bytes(), -1);
    auto const t = to_nccl(in.type);
    return issue(rec, {op_kind::all_to_all_v, in.type, 0, -1, reduce_kind::sum, 0}, o, ctx,
                 [&](cudaStream_t s) {
                   return grouped([&](auto& call) {
                     for (int p = 0; p < size(); ++p) {
                       auto const up = static_cast<std::size_t>(p);
                       if (send_counts[up] > 0)
                         call(api().send(detail::offset(in.data, so[up], in.type), send_counts[up], t,
                                         p, comm(), s));
                       if (recv_counts[up] > 0)
                         call(api().recv(detail::offset(out.data, ro[up], in.type), recv_counts[up], t,
                                         p, comm(), s));
                     }
                   });
                 });
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

  //! NCCL has no barrier: a one-word all_reduce on device scratch; wait() on the work to block.
  work barrier(op_options o = {}) {
    auto ctx = begin(op_kind::barrier);
    void* const word = scratch(o);
    op_record rec = make_record(op_kind::barrier, dtype::i32, 4, 4, -1);
    return issue(rec, {op_kind::barrier, dtype::i32, 1, -1, reduce_kind::sum, 0}, o, ctx,
                 [&](cudaStream_t s) {
                   return api().all_reduce(word, word, 1, ncclInt32, ncclSum, comm(), s);
                 });
  }

  //! Collective ncclCommSplit (non-blocking, polled to the deadline). A negative color gives a
  //! non-member (size 0).
  communicator split(int color, int key) {
    auto ctx = begin(op_kind::split);
    auto& c = *core_;
    std::string const what = weft::detail::concat("ncclCommSplit(color ", color, ", key ", key, ") on rank ",
                                            rank());
    op_record rec = make_record(op_kind::split, dtype::i32, 0, 0, -1);
    rec.seq = ++c.seq;
    auto const id = c.record(rec);
    try {
      ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
      config.blocking = 0;
      ncclComm_t child = nullptr;
      auto const deadline = detail::clock::now() + c.opts.timeout;
      ncclResult_t r = api().comm_split(comm(), color < 0 ? NCCL_SPLIT_NOCOLOR : color, key, &child,
                                        &config);
      c.check(r, what);
      if (r == ncclInProgress) {
        r = c.poll_ready(child != nullptr ? child : comm(), deadline);
        if (r == ncclInProgress) {
          if (child != nullptr) (void)api().comm_abort(child);
          c.fail(errc::timeout, weft::detail::concat(what, " did not complete within ",
                                               c.opts.timeout.count(), " ms; ncclCommAbort was called"));
        }
        c.check(r, what);
      }
      c.finish_record(id, true, {});
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
      c.finish_record(id, false, e.what());
      throw;
    }
  }

  //! Waits (bounded by the deadline) for everything enqueued so far on o.stream.
  void synchronize(op_options o = {}) {
    member("synchronize");
    std::string const ctx = weft::detail::concat("synchronize on rank ", rank(), " of ", size());
    core_->check_usable(ctx);
    work w = track(o, ctx, std::uint64_t(-1));
    w.wait();
  }

  //! Idempotent; may be called from any thread. Calls ncclCommAbort (which also stops device work
  //! in flight); every later call throws peer_aborted_error naming this rank.
  void abort() noexcept {
    if (!core_) return;
    comm_state expected = comm_state::healthy;
    core_->state.compare_exchange_strong(expected, comm_state::aborted);
    core_->abort_nccl();
  }

 private:
  explicit communicator(std::shared_ptr<detail::core> c) : core_(std::move(c)) {}

  //! NCCL 2.28 fails init with ncclInvalidUsage ("Duplicate GPU detected") when two ranks on one
  //! host share a device, after every rank has joined; checking first over the host communicator
  //! gives every rank the same clear invalid_argument_error instead. Hosts are told apart by a
  //! hash of gethostname().
  template <class Host>
  static void check_distinct_devices(Host& host, int device, op_options const& ho) {
    std::array<char, 256> name{};
    if (::gethostname(name.data(), name.size() - 1) != 0) name[0] = '\0';
    std::uint64_t h = 1469598103934665603ull;  // FNV-1a
    for (char ch : name) {
      if (ch == '\0') break;
      h = (h ^ static_cast<unsigned char>(ch)) * 1099511628211ull;
    }
    auto const n = static_cast<std::size_t>(host.size());
    std::array<std::int64_t, 2> mine{static_cast<std::int64_t>(h), device};
    std::vector<std::int64_t> all(2 * n);
    host.all_gather(buffer_view{mine.data(), 2, dtype::i64, memory_kind::host, -1},
                    buffer_view{all.data(), all.size(), dtype::i64, memory_kind::host, -1}, ho)
        .wait();
    for (std::size_t a = 0; a < n; ++a)
      for (std::size_t b = a + 1; b < n; ++b)
        if (all[2 * a] == all[2 * b] && all[2 * a + 1] == all[2 * b + 1])
          WEFT_THROW(invalid_argument_error, "argument `device`: expected a CUDA device no other rank on ",
                     "the same host uses (NCCL 2.28 refuses two ranks on one GPU), actual device ",
                     all[2 * a + 1], " for both rank ", a, " and rank ", b);
  }

  static nccl_api const& resolve(options const& o) noexcept {
    return o.api != nullptr ? *o.api : linked_api();
  }
  [[nodiscard]] nccl_api const& api() const noexcept { return *core_->api; }
  [[nodiscard]] ncclComm_t comm() const noexcept { return core_->comm; }

  void member(char const* what) const {
    WEFT_EXPECTS(core_ != nullptr, "communicator",
                 weft::detail::concat("a member communicator (size() > 0) for ", what),
                 "a non-member (default-constructed, moved-from, or split with a negative color)");
  }

  //! Entry of every operation: membership and poison; nothing is enqueued. Returns the context
  //! quoted by error messages.
  std::string begin(op_kind op) const {
    member(to_string(op).data());
    std::string ctx = weft::detail::concat(to_string(op), " on rank ", rank(), " of ", size());
    core_->check_usable(ctx);
    return ctx;
  }

  void check_rank(int r, char const* name) const {
    WEFT_EXPECTS(r >= 0 && r < size(), name, weft::detail::concat("a rank in [0, ", size(), ")"), r);
  }

  void check_buffer(buffer_view const& b, char const* name) const {
    WEFT_EXPECTS(weft::detail::is_valid(b.type), std::string(name) + ".type",
                 "one of f32, f64, bf16, f16, i32, i64, u8", static_cast<int>(b.type));
    WEFT_EXPECTS(b.where == memory_kind::cuda, std::string(name) + ".where",
                 "cuda memory (NCCL reads and writes device buffers)", to_string(b.where));
    WEFT_EXPECTS(b.count == 0 || b.data != nullptr, std::string(name) + ".data",
                 "non-null when count > 0", "nullptr");
    (void)weft::comm::detail::checked_bytes(b.count, b.type, std::string(name) + ".count");
    WEFT_EXPECTS(b.device < 0 || b.device == device(), std::string(name) + ".device",
                 weft::detail::concat(device(), " (this communicator's device) or -1"), b.device);
  }

  static void check_same_type(buffer_view const& in, buffer_view const& out) {
    WEFT_EXPECTS(out.type == in.type, "out.type", weft::detail::concat(in.type, " (in.type)"), out.type);
  }

  static void check_in_place_or_disjoint(buffer_view const& in, buffer_view const& out,
                                         bool in_place, char const* in_place_form) {
    WEFT_EXPECTS(in_place || !detail::overlap(in, out), "out",
                 weft::detail::concat("disjoint from in, or exactly ", in_place_form),
                 "a partial overlap with in");
  }

  void check_counts(std::span<std::size_t const> counts, char const* name) const {
    WEFT_EXPECTS(counts.size() == static_cast<std::size_t>(size()), std::string(name) + ".size()",
                 weft::detail::concat(size(), " (one per rank)"), counts.size());
  }

  op_record make_record(op_kind k, dtype t, std::size_t send_bytes, std::size_t recv_bytes,
                        int root_or_peer) const {
    op_record r;
    r.op = k;
    r.type = t;
    r.send_bytes = send_bytes;
    r.recv_bytes = recv_bytes;
    r.root_or_peer = root_or_peer;
    r.start = detail::clock::now();
    r.end = r.start;
    return r;
  }

  //! Runs `f(op)` with the ncclRedOp_t for `op`: premul_sum creates a per-call op (scalar in the
  //! element type, host-immediate) and destroys it once enqueued, which NCCL allows.
  template <class F>
  ncclResult_t with_op(reduce_op op, dtype t, F&& f) {
    if (op.kind != reduce_kind::premul_sum) return f(to_nccl(op.kind));
    detail::scalar_storage scalar(op.scalar, t);
    ncclRedOp_t r{};
    core_->check(api().red_op_create_pre_mul_sum(&r, scalar.data(), to_nccl(t),
                                                 ncclScalarHostImmediate, comm()),
                 "ncclRedOpCreatePreMulSum");
    ncclResult_t const result = f(r);
    ncclResult_t const destroyed = api().red_op_destroy(r, comm());
    if (result != ncclSuccess && result != ncclInProgress) return result;
    return destroyed == ncclSuccess ? result : destroyed;
  }

  //! ncclGroupStart, the calls made by `body(call)`, ncclGroupEnd; the first failing result wins
  //! and ncclGroupEnd is always called so NCCL's group state is reset.
  template <class Body>
  ncclResult_t grouped(Body&& body) {
    ncclResult_t first = api().group_start();
    if (first != ncclSuccess) return first;
    auto call = [&](ncclResult_t r) {
      if ((first == ncclSuccess || first == ncclInProgress) && r != ncclSuccess) first = r;
    };
    body(call);
    ncclResult_t const end = api().group_end();
    if (first == ncclSuccess || first == ncclInProgress) return end == ncclSuccess ? first : end;
    return first;
  }

  void* scratch(op_options const& o) {
    auto& c = *core_;
    if (c.scratch == nullptr) {
      // Word 0: barrier; words 8..: 8 fingerprint words per rank.
      std::size_t const bytes = (8 + 8 * static_cast<std::size_t>(size())) * sizeof(std::int64_t);
      void* p = nullptr;
      c.check_cuda(api().malloc(&p, bytes), "cudaMalloc of the communicator's scratch words");
      c.scratch = p;
    }
    (void)o;
    return c.scratch;
  }

  //! An event recorded on o.stream now, wrapped as pending work with the op's deadline.
  work track(op_options const& o, std::string const& ctx, std::uint64_t record_id) {
    auto& c = *core_;
    auto const timeout = o.timeout.count() > 0 ? o.timeout : c.opts.timeout;
    auto const s = static_cast<cudaStream_t>(o.stream);
    cudaEvent_t e = nullptr;
    c.check_cuda(api().event_create_with_flags(&e, cudaEventDisableTiming), "cudaEventCreateWithFlags");
    cudaError_t const rec = api().event_record(e, s);
    if (rec != cudaSuccess) {
      (void)api().event_destroy(e);
      c.check_cuda(rec, "cudaEventRecord");
    }
    return work(std::make_shared<detail::event_work>(core_, e, record_id,
                                                     detail::clock::now() + timeout, ctx));
  }

  //! Debug mode: all ranks all_gather their fingerprints (8 words each) and compare them.
  void check_fingerprint(fingerprint const& fp, op_options const& o, std::string const& ctx) {
    auto& c = *core_;
    auto* const base = static_cast<std::int64_t*>(scratch(o)) + 8;
    auto const s = static_cast<cudaStream_t>(o.stream);
    auto const n = static_cast<std::size_t>(size());
    std::array<std::int64_t, 8> mine{static_cast<std::int64_t>(fp.op), static_cast<std::int64_t>(fp.type),
                                     static_cast<std::int64_t>(fp.count), fp.root,
                                     static_cast<std::int64_t>(fp.reduction),
                                     static_cast<std::int64_t>(fp.seq), 0, 0};
    std::vector<std::int64_t> all(8 * n, 0);
    c.check_cuda(api().memcpy_async(base + 8 * rank(), mine.data(), sizeof(mine),
                                    cudaMemcpyHostToDevice, s),
                 "cudaMemcpyAsync (fingerprint to device)");
    c.check(api().all_gather(base + 8 * rank(), base, 8, ncclInt64, comm(), s),
            ctx + ": fingerprint all_gather");
    c.check_cuda(api().memcpy_async(all.data(), base, all.size() * sizeof(std::int64_t),
                                    cudaMemcpyDeviceToHost, s),
                 "cudaMemcpyAsync (fingerprints to host)");
    track(o, ctx + " (fingerprint check)", std::uint64_t(-1)).wait();
    static constexpr char const* fields[] = {"op", "dtype", "count", "root", "reduction", "seq"};
    for (std::size_t r = 0; r < n; ++r) {
      for (std::size_t f = 0; f < 6; ++f) {
        if (all[8 * r + f] == mine[f]) continue;
        auto const peer = describe(std::span<std::int64_t const>(all).subspan(8 * r, 8));
        c.fail(errc::mismatch,
               weft::detail::concat(ctx, ": collectives differ in ", fields[f], ": rank ", rank(), " called ",
                              describe(mine), " but rank ", r, " called ", peer));
      }
    }
  }

  static std::string describe(std::span<std::int64_t const> w) {
    return weft::detail::concat(to_string(static_cast<op_kind>(w[0])), "(dtype ",
                                name(static_cast<dtype>(w[1])), ", count ", w[2], ", root ", w[3],
                                ", op ", to_string(static_cast<reduce_kind>(w[4])), ", seq ", w[5], ")");
  }

  //! Sequence, optional fingerprint check, enqueue (polling ncclInProgress to the deadline),
  //! completion event.
  template <class Enqueue>
  work issue(op_record rec, fingerprint fp, op_options const& o, std::string ctx, Enqueue&& enqueue) {
    auto& c = *core_;
    rec.seq = fp.seq = ++c.seq;
    ctx += weft::detail::concat(" (seq ", rec.seq, ")");
    auto const id = c.record(rec);
    try {
      if (c.opts.check_fingerprints && size() > 1) check_fingerprint(fp, o, ctx);
      auto const timeout = o.timeout.count() > 0 ? o.timeout : c.opts.timeout;
      ncclResult_t r = enqueue(static_cast<cudaStream_t>(o.stream));
      c.check(r, ctx);
      if (r == ncclInProgress) {
        r = c.poll_ready(comm(), detail::clock::now() + timeout);
        if (r == ncclInProgress)
          c.fail(errc::timeout, weft::detail::concat(ctx, " was not enqueued within ", timeout.count(),
                                               " ms; ncclCommAbort was called"));
        c.check(r, ctx);
      }
      return track(o, ctx, id);
    } catch (std::exception const& e) {
      c.finish_record(id, false, e.what());
      throw;
    }
  }

  work p2p(op_kind k, buffer_view b, int peer_rank, op_options const& o) {
    auto ctx = begin(k);
    char const* const name = k == op_kind::send ? "in" : "out";
    check_rank(peer_rank, "peer");
    WEFT_EXPECTS(peer_rank != rank(), "peer",
                 weft::detail::concat("a rank other than this one (", rank(), ")"), peer_rank);
    check_buffer(b, name);
    if (b.count == 0) return {};
    auto& c = *core_;
    op_record rec = make_record(k, b.type, k == op_kind::send ? b.bytes() : 0,
                                k == op_kind::recv ? b.bytes() : 0, peer_rank);
    rec.seq = c.seq;
    ctx += weft::detail::concat(" (peer ", peer_rank, ")");
    auto const id = c.record(rec);
    try {
      auto const s = static_cast<cudaStream_t>(o.stream);
      auto const t = to_nccl(b.type);
      ncclResult_t r = grouped([&](auto& call) {
        call(k == op_kind::send ? api().send(b.data, b.count, t, peer_rank, comm(), s)
                                : api().recv(b.data, b.count, t, peer_rank, comm(), s));
      });
      c.check(r, ctx);
      if (r == ncclInProgress) {
        auto const timeout = o.timeout.count() > 0 ? o.timeout : c.opts.timeout;
        r = c.poll_ready(comm(), detail::clock::now() + timeout);
        if (r == ncclInProgress)
          c.fail(errc::timeout, weft::detail::concat(ctx, " was not enqueued within ", timeout.count(),
                                               " ms; ncclCommAbort was called"));
        c.check(r, ctx);
      }
      return track(o, ctx, id);
    } catch (std::exception const& e) {
      c.finish_record(id, false, e.what());
      throw;
    }
  }

  std::shared_ptr<detail::core> core_;
};

static_assert(StreamCommunicator<communicator>);

}  // namespace weft::comm::nccl

#endif  // WEFT_HAS_NCCL
