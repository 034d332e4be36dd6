// weft/comm/nccl/detail/core.hpp — what an NCCL-backend communicator and its pending work share:
// the NCCL handle, the first fault (which aborts NCCL, as every rank must after a failure), the
// history, the device scratch words, the staging buffer of in-place all-to-alls and the messages
// to oneself waiting for their other half; and the pending work itself (a CUDA event polled with
// ncclCommGetAsyncError to a deadline).
#pragma once

#include <weft/comm/nccl/api.hpp>

#if WEFT_HAS_NCCL
#include <weft/comm/concepts.hpp>
#include <weft/comm/detail/fault.hpp>
#include <weft/comm/detail/history.hpp>
#include <weft/comm/detail/poll.hpp>
#include <weft/comm/nccl/options.hpp>
#include <weft/core/dtype.hpp>
#include <weft/core/error.hpp>

#include <algorithm>
#include <array>
#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <deque>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <utility>

namespace weft::comm::nccl::detail {

namespace rules = weft::comm::detail;
using clock = std::chrono::steady_clock;

//! The premul_sum scalar in the element type, as ncclScalarHostImmediate reads it.
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

class deferred_work;

//! A message to oneself whose other half has not been posted yet (NCCL needs both in one group).
struct self_half {
  op_kind kind = op_kind::send;
  buffer_view buffer{};
  std::shared_ptr<deferred_work> work;
};

//! Everything a communicator and its pending work share. Work holds it by shared_ptr so a fault
//! seen while waiting poisons the communicator.
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
  std::uint64_t seq = 0;    // collectives issued (issuing thread only)
  void* scratch = nullptr;  // device words for barrier and fingerprints, allocated on first use
  void* stage = nullptr;    // copy of the input of an in-place all_to_all(_v) (issuing thread)
  std::size_t stage_bytes = 0;
  cudaEvent_t stage_free = nullptr;    // recorded after the last collective that read `stage`
  std::deque<self_half> self_pending;  // issuing thread only

  mutable std::mutex m;  // guards `why`
  rules::fault why;
  rules::basic_op_history<std::mutex> history;

  core() = default;
  core(core const&) = delete;
  core& operator=(core const&) = delete;

  ~core() {
    if (scratch != nullptr && api->free != nullptr) (void)api->free(scratch);
    if (stage != nullptr && api->free != nullptr) (void)api->free(stage);
    if (stage_free != nullptr) (void)api->event_destroy(stage_free);
    if (comm == nullptr || nccl_aborted.load()) return;
    if (!owns) return;
    if (state.load() == comm_state::healthy) {
      // Flush, bounded by the deadline; a comm that does not quiesce is aborted, never waited on.
      ncclResult_t r = api->comm_finalize(comm);
      if (r == ncclInProgress || r == ncclSuccess)
        r = poll_ready(comm, clock::now() + opts.timeout);
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
    ncclResult_t result = ncclInProgress;
    auto ready = [&] {
      ncclResult_t state_now = ncclSuccess;
      ncclResult_t const r = api->comm_get_async_error(c, &state_now);
      result = r != ncclSuccess ? r : state_now;
      return result != ncclInProgress;
    };
    (void)rules::poll_until(
        deadline, ready, [] { return false; }, fixed_interval());
    return result;
  }

  //! NCCL is polled at options::poll_interval (never pure spinning).
  [[nodiscard]] rules::backoff fixed_interval() const noexcept {
    return {0, opts.poll_interval, opts.poll_interval};
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
  //! `message` already names the call.
  [[noreturn]] void fail(errc kind, std::string const& message, int origin = -1, long long code = 0,
                         char const* backend = "nccl") {
    rules::fault f{kind, message, origin, {}, backend, code};
    {
      std::lock_guard lock(m);
      if (state.load() == comm_state::healthy) {
        why = f;
        state.store(comm_state::poisoned);
      }
    }
    abort_nccl();
    rules::rethrow(f, {});
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
         weft::detail::concat(
             context, " failed: ", api->cuda_error_name != nullptr ? api->cuda_error_name(e) : "",
             " (cudaError_t ", static_cast<int>(e), ")"),
         -1, static_cast<long long>(e), "cuda");
  }

  //! Throws at once on a poisoned or aborted communicator.
  void check_usable(std::string const& context) const {
    comm_state const s = state.load();
    if (s == comm_state::healthy) return;
    if (s == comm_state::aborted)
      rules::throw_aborted(context, "rank " + std::to_string(rank), rank);
    rules::fault f;
    {
      std::lock_guard lock(m);
      f = why;
    }
    rules::rethrow(f, context + " on a poisoned communicator");
  }
};

//! A pending operation: a CUDA event recorded after it on its stream, polled together with
//! ncclCommGetAsyncError until it completes, a fault appears, or its deadline passes. `id` is
//! the record it completes (none for internal waits).
class event_work final : public rules::work_state {
 public:
  static constexpr std::uint64_t no_record = ~std::uint64_t{0};

  event_work(std::shared_ptr<core> c, cudaEvent_t e, std::uint64_t id, op_record rec,
             clock::time_point op_deadline, std::string context)
      : core_(std::move(c)),
        event_(e),
        id_(id),
        rec_(std::move(rec)),
        op_deadline_(op_deadline),
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
        finish(nullptr);
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
          core_->fail(
              errc::timeout,
              weft::detail::concat(
                  context_, " did not complete within its deadline (", core_->opts.timeout.count(),
                  " ms default); ncclCommAbort was called. ",
                  "NCCL cannot tell which ranks are missing: check every rank's history()"));
      } catch (std::exception const& e) {
        finish(e.what());
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
  // Completes the record once (nullptr: success); a failure's hook error is ignored.
  void finish(char const* error) {
    if (id_ == no_record || finished_) return;
    finished_ = true;
    rec_.end = clock::now();
    if (error != nullptr) rules::mark_failed(rec_, error);
    core_->history.completed(id_, rec_);
  }

  std::shared_ptr<core> core_;
  cudaEvent_t event_ = nullptr;
  std::uint64_t id_ = no_record;
  op_record rec_;
  clock::time_point op_deadline_;
  std::string context_;
  std::atomic<bool> done_{false};
  bool finished_ = false;
};

//! The first half of a message to oneself: pending until the other half is posted (which issues
//! both in one NCCL group and hands this work its event), failing at its deadline otherwise.
class deferred_work final : public rules::work_state {
 public:
  deferred_work(std::shared_ptr<core> c, std::uint64_t id, op_record rec,
                clock::time_point deadline, std::string context)
      : core_(std::move(c)),
        id_(id),
        rec_(std::move(rec)),
        deadline_(deadline),
        context_(std::move(context)) {}

  //! The other half was issued: `w` completes this half too.
  void matched(std::shared_ptr<rules::work_state> w) { inner_ = std::move(w); }

  bool wait_until(clock::time_point deadline) override {
    for (;;) {
      if (inner_) return inner_->wait_until(deadline);
      if (!failed_) {
        try {
          core_->check_usable(context_);
          if (clock::now() >= deadline_)
            throw timeout_error(
                weft::detail::concat(context_, ": the matching ",
                                     rec_.op == op_kind::send ? "recv from" : "send to", " rank ",
                                     core_->rank, " (itself) was not posted before the deadline (",
                                     core_->opts.timeout.count(), " ms default)"),
                std::vector<int>{core_->rank});
        } catch (std::exception const& e) {
          failed_ = true;
          error_ = std::current_exception();
          rec_.end = clock::now();
          rules::mark_failed(rec_, e.what());
          core_->history.completed(id_, rec_);
        }
      }
      if (error_) std::rethrow_exception(error_);
      if (clock::now() >= deadline) return false;
      std::this_thread::sleep_for(
          std::min<clock::duration>(core_->opts.poll_interval, deadline_ - clock::now()));
    }
  }
  [[nodiscard]] bool done() const noexcept override { return inner_ && inner_->done(); }

  [[nodiscard]] std::uint64_t record_id() const noexcept { return id_; }
  [[nodiscard]] op_record const& record() const noexcept { return rec_; }
  [[nodiscard]] std::string const& context() const noexcept { return context_; }

 private:
  std::shared_ptr<core> core_;
  std::uint64_t id_;
  op_record rec_;
  clock::time_point deadline_;
  std::string context_;
  std::shared_ptr<rules::work_state> inner_;
  bool failed_ = false;
  std::exception_ptr error_;
};

}  // namespace weft::comm::nccl::detail

#endif  // WEFT_HAS_NCCL
