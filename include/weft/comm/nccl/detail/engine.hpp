// weft/comm/nccl/detail/engine.hpp — the machinery under every NCCL-backend operation: entry
// checks, sequencing, the debug-mode fingerprint check, enqueueing (polling ncclInProgress to the
// deadline), grouped calls, per-call premul_sum ops, completion events, the staging copy of an
// in-place all-to-all and messages to oneself. nccl::communicator derives from it.
#pragma once

#include <weft/comm/nccl/api.hpp>

#if WEFT_HAS_NCCL
#include <weft/comm/concepts.hpp>
#include <weft/comm/detail/describe.hpp>
#include <weft/comm/detail/fault.hpp>
#include <weft/comm/detail/plan.hpp>
#include <weft/comm/nccl/detail/core.hpp>
#include <weft/comm/nccl/options.hpp>
#include <weft/core/dtype.hpp>
#include <weft/core/error.hpp>

#include <array>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <memory>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include <unistd.h>  // gethostname, to tell which ranks share a host

namespace weft::comm::nccl::detail {

//! One rank's handle on an NCCL communicator, and the steps its operations are built from. A null
//! core_ is a non-member.
class engine {
 protected:
  engine() = default;
  explicit engine(std::shared_ptr<core> c) : core_(std::move(c)) {
    core_->history.set_capacity(core_->opts.history_size);
  }

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
          WEFT_THROW(invalid_argument_error,
                     "argument `device`: expected a CUDA device no other rank on ",
                     "the same host uses (NCCL 2.28 refuses two ranks on one GPU), actual device ",
                     all[2 * a + 1], " for both rank ", a, " and rank ", b);
  }

  static nccl_api const& resolve(options const& o) noexcept {
    return o.api != nullptr ? *o.api : linked_api();
  }
  [[nodiscard]] nccl_api const& api() const noexcept { return *core_->api; }
  [[nodiscard]] ncclComm_t comm() const noexcept { return core_->comm; }
  [[nodiscard]] int rank_() const noexcept { return core_ ? core_->rank : -1; }
  [[nodiscard]] int size_() const noexcept { return core_ ? core_->size : 0; }

  [[nodiscard]] rules::endpoint endpoint() const noexcept {
    return {core_->rank, core_->size, memory_kind::cuda, core_->device,
            "NCCL reads and writes device buffers"};
  }

  //! "all_reduce on rank 1", the prefix of the call's errors (issue() adds the sequence number).
  [[nodiscard]] std::string context(op_kind op) const {
    return rules::group_names{}.context(op, core_->rank, 0);
  }

  //! Entry of every operation: membership and poison; nothing is enqueued.
  op_record begin(op_kind op) const {
    rules::check_member(core_ != nullptr);
    core_->check_usable(context(op));
    op_record r;
    r.op = op;
    r.start = clock::now();
    r.end = r.start;
    return r;
  }

  //! The record of a call the rules have planned.
  static op_record planned(op_record const& started, rules::call_plan const& p) {
    return p.record(started.start);
  }

  //! A call with nothing to move: recorded and reported at once, like any other operation.
  work finish_trivial(op_record rec) {
    rec.end = clock::now();
    core_->history.finished(rec);
    return work{};
  }

  //! Runs `f(op)` with the ncclRedOp_t for `op`: premul_sum creates a per-call op (scalar in the
  //! element type, host-immediate) and destroys it once enqueued, which NCCL allows.
  template <class F>
  ncclResult_t with_op(reduce_op op, dtype t, F&& f) {
    if (op.kind != reduce_kind::premul_sum) return f(to_nccl(op.kind));
    scalar_storage scalar(op.scalar, t);
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
      std::size_t const bytes = (8 + 8 * static_cast<std::size_t>(size_())) * sizeof(std::int64_t);
      void* p = nullptr;
      c.check_cuda(api().malloc(&p, bytes), "cudaMalloc of the communicator's scratch words");
      c.scratch = p;
    }
    (void)o;
    return c.scratch;
  }

  //! An event recorded on o.stream now: pending work with the op's deadline that completes
  //! record `record_id` (none by default).
  std::shared_ptr<event_work> event_after(op_options const& o, std::string const& ctx,
                                          std::uint64_t record_id = event_work::no_record,
                                          op_record rec = {}) {
    auto& c = *core_;
    auto const timeout = o.timeout.count() > 0 ? o.timeout : c.opts.timeout;
    auto const s = static_cast<cudaStream_t>(o.stream);
    cudaEvent_t e = nullptr;
    c.check_cuda(api().event_create_with_flags(&e, cudaEventDisableTiming),
                 "cudaEventCreateWithFlags");
    cudaError_t const recorded = api().event_record(e, s);
    if (recorded != cudaSuccess) {
      (void)api().event_destroy(e);
      c.check_cuda(recorded, "cudaEventRecord");
    }
    return std::make_shared<event_work>(core_, e, record_id, std::move(rec), clock::now() + timeout,
                                        ctx);
  }
  work track(op_options const& o, std::string const& ctx,
             std::uint64_t record_id = event_work::no_record, op_record rec = {}) {
    return work(event_after(o, ctx, record_id, std::move(rec)));
  }

  //! Debug mode: all ranks all_gather their fingerprints (8 words each) and compare them.
  void check_fingerprint(fingerprint const& fp, op_options const& o, std::string const& ctx) {
    auto& c = *core_;
    auto* const base = static_cast<std::int64_t*>(scratch(o)) + 8;
    auto const s = static_cast<cudaStream_t>(o.stream);
    auto const n = static_cast<std::size_t>(c.size);
    std::size_t const width = rules::fingerprint_width(n, false);
    auto const mine = rules::fingerprint_row(fp, width);
    std::vector<std::int64_t> all(width * n, 0);
    c.check_cuda(api().memcpy_async(base + width * me(), mine.data(), width * sizeof(std::int64_t),
                                    cudaMemcpyHostToDevice, s),
                 "cudaMemcpyAsync (fingerprint to device)");
    c.check(api().all_gather(base + width * me(), base, width, ncclInt64, comm(), s),
            ctx + ": fingerprint all_gather");
    c.check_cuda(api().memcpy_async(all.data(), base, all.size() * sizeof(std::int64_t),
                                    cudaMemcpyDeviceToHost, s),
                 "cudaMemcpyAsync (fingerprints to host)");
    track(o, ctx + " (fingerprint check)").wait();
    if (auto msg = rules::compare_rows(all, n, width, rules::group_names{}))
      c.fail(errc::mismatch, ctx + ": " + *msg);
  }

  [[nodiscard]] std::size_t me() const noexcept { return static_cast<std::size_t>(core_->rank); }

  //! Polls an enqueue that answered ncclInProgress to the deadline.
  void enqueued(ncclResult_t r, op_options const& o, std::string const& ctx) {
    auto& c = *core_;
    c.check(r, ctx);
    if (r != ncclInProgress) return;
    auto const timeout = o.timeout.count() > 0 ? o.timeout : c.opts.timeout;
    r = c.poll_ready(comm(), clock::now() + timeout);
    if (r == ncclInProgress)
      c.fail(errc::timeout, weft::detail::concat(ctx, " was not enqueued within ", timeout.count(),
                                                 " ms; ncclCommAbort was called"));
    c.check(r, ctx);
  }

  //! Sequence, optional fingerprint check, enqueue, completion event.
  template <class Enqueue>
  work issue(op_record rec, fingerprint fp, op_options const& o, Enqueue&& enqueue) {
    auto& c = *core_;
    rec.seq = fp.seq = ++c.seq;
    std::string const ctx = rules::group_names{}.context(rec.op, c.rank, rec.seq);
    auto const id = c.history.add(rec);
    try {
      (void)rules::call_timeout(o, c.opts.timeout);
      if (c.opts.check_fingerprints && c.size > 1) check_fingerprint(fp, o, ctx);
      enqueued(enqueue(static_cast<cudaStream_t>(o.stream)), o, ctx);
      return track(o, ctx, id, rec);
    } catch (std::exception const& e) {
      rules::mark_failed(rec, e.what());
      c.history.completed(id, rec);
      throw;
    }
  }

  //! In-place all_to_all(_v): NCCL reads the input while writing the output, so the input is
  //! first copied (on the call's stream) into a device buffer the communicator keeps and grows.
  //! A later call waits on the stream for the previous reader of that buffer.
  void const* staged_input(buffer_view const& in, op_options const& o) {
    auto& c = *core_;
    auto const s = static_cast<cudaStream_t>(o.stream);
    if (c.stage_free != nullptr)
      c.check_cuda(api().stream_wait_event(s, c.stage_free, 0), "cudaStreamWaitEvent (staging)");
    if (c.stage_bytes < in.bytes()) {
      // cudaFree waits for the device, so no earlier collective still reads the old buffer.
      if (c.stage != nullptr) c.check_cuda(api().free(c.stage), "cudaFree (staging)");
      c.stage = nullptr;
      c.stage_bytes = 0;
      c.check_cuda(api().malloc(&c.stage, in.bytes()), "cudaMalloc (in-place all_to_all staging)");
      c.stage_bytes = in.bytes();
    }
    c.check_cuda(api().memcpy_async(c.stage, in.data, in.bytes(), cudaMemcpyDeviceToDevice, s),
                 "cudaMemcpyAsync (in-place all_to_all staging)");
    return c.stage;
  }
  //! After the collective that read the staging buffer was enqueued.
  void staged_done(op_options const& o) {
    auto& c = *core_;
    if (c.stage_free == nullptr)
      c.check_cuda(api().event_create_with_flags(&c.stage_free, cudaEventDisableTiming),
                   "cudaEventCreateWithFlags (staging)");
    c.check_cuda(api().event_record(c.stage_free, static_cast<cudaStream_t>(o.stream)),
                 "cudaEventRecord (staging)");
  }

  //! send/recv. A message to oneself waits for its other half and issues both in one group.
  work p2p(op_kind k, buffer_view b, int peer, op_options const& o) {
    op_record rec = begin(k);
    auto const p = rules::plan_p2p(endpoint(), k, b, peer);
    rec = planned(rec, p);
    if (p.trivial) return finish_trivial(rec);
    auto& c = *core_;
    rec.seq = c.seq;
    std::string const ctx = context(k) + weft::detail::concat(" (peer ", peer, ")");
    auto const timeout = rules::call_timeout(o, c.opts.timeout);
    auto const id = c.history.add(rec);
    if (peer == c.rank) {
      auto const other = k == op_kind::send ? op_kind::recv : op_kind::send;
      if (c.self_pending.empty() || c.self_pending.front().kind != other) {
        auto w = std::make_shared<deferred_work>(core_, id, rec, clock::now() + timeout, ctx);
        c.self_pending.push_back({k, b, w});
        return work(w);
      }
    }
    try {
      auto const s = static_cast<cudaStream_t>(o.stream);
      auto const t = to_nccl(b.type);
      if (peer != c.rank) {
        enqueued(grouped([&](auto& call) {
                   call(k == op_kind::send ? api().send(b.data, b.count, t, peer, comm(), s)
                                           : api().recv(b.data, b.count, t, peer, comm(), s));
                 }),
                 o, ctx);
        return track(o, ctx, id, rec);
      }
      self_half const first = c.self_pending.front();
      c.self_pending.pop_front();
      auto const& snd = k == op_kind::send ? b : first.buffer;
      auto const& rcv = k == op_kind::send ? first.buffer : b;
      if (snd.count != rcv.count || snd.type != rcv.type)
        c.fail(errc::mismatch,
               weft::detail::concat(ctx, ": mismatched point-to-point message from rank ", peer,
                                    " to itself: send has dtype ", snd.type, ", count ", snd.count,
                                    " but recv has dtype ", rcv.type, ", count ", rcv.count));
      enqueued(grouped([&](auto& call) {
                 call(api().send(snd.data, snd.count, t, peer, comm(), s));
                 call(api().recv(rcv.data, rcv.count, t, peer, comm(), s));
               }),
               o, ctx);
      first.work->matched(
          event_after(o, first.work->context(), first.work->record_id(), first.work->record()));
      return track(o, ctx, id, rec);
    } catch (std::exception const& e) {
      rules::mark_failed(rec, e.what());
      c.history.completed(id, rec);
      throw;
    }
  }

  //! One ring step: `in` to `send_peer` and `out` from `recv_peer` issued as ONE NCCL group, so
  //! ranks that all send before they receive cannot deadlock (two separate groups may: an
  //! ncclSend can wait for its peer's ncclRecv). Either peer may be this rank (both halves are in
  //! the group). Recorded as a send and a recv; the returned work completes both.
  work grouped_sendrecv(buffer_view in, int send_peer, buffer_view out, int recv_peer,
                        op_options const& o) {
    op_record srec = begin(op_kind::send);
    op_record rrec = srec;
    rrec.op = op_kind::recv;
    auto const ps = rules::plan_p2p(endpoint(), op_kind::send, in, send_peer);
    auto const pr = rules::plan_p2p(endpoint(), op_kind::recv, out, recv_peer);
    srec = planned(srec, ps);
    rrec = planned(rrec, pr);
    auto& c = *core_;
    srec.seq = rrec.seq = c.seq;
    std::string const ctx = weft::detail::concat(context(op_kind::send), " (sendrecv: to peer ",
                                                 send_peer, ", from peer ", recv_peer, ")");
    (void)rules::call_timeout(o, c.opts.timeout);
    auto const sid = c.history.add(srec);
    auto const rid = c.history.add(rrec);
    try {
      auto const s = static_cast<cudaStream_t>(o.stream);
      if (!ps.trivial || !pr.trivial)
        enqueued(grouped([&](auto& call) {
                   if (!ps.trivial)
                     call(api().send(in.data, in.count, to_nccl(in.type), send_peer, comm(), s));
                   if (!pr.trivial)
                     call(api().recv(out.data, out.count, to_nccl(out.type), recv_peer, comm(), s));
                 }),
                 o, ctx);
      return work(std::make_shared<both_work>(work(event_after(o, ctx, sid, srec)),
                                              work(event_after(o, ctx, rid, rrec))));
    } catch (std::exception const& e) {
      rules::mark_failed(srec, e.what());
      rules::mark_failed(rrec, e.what());
      c.history.completed(sid, srec);
      c.history.completed(rid, rrec);
      throw;
    }
  }

  //! Two works as one: done when both are.
  class both_work final : public rules::work_state {
   public:
    both_work(work a, work b) : a_(std::move(a)), b_(std::move(b)) {}
    bool wait_until(clock::time_point deadline) override {
      return wait_one(a_, deadline) && wait_one(b_, deadline);
    }
    [[nodiscard]] bool done() const noexcept override { return a_.done() && b_.done(); }

   private:
    static bool wait_one(work& w, clock::time_point deadline) {
      if (deadline == clock::time_point::max()) {
        w.wait();
        return true;
      }
      auto const left = deadline - clock::now();
      return w.wait_for(std::chrono::duration_cast<std::chrono::milliseconds>(
          left > clock::duration::zero() ? left : clock::duration::zero()));
    }
    work a_, b_;
  };

  std::shared_ptr<core> core_;
};

}  // namespace weft::comm::nccl::detail

#endif  // WEFT_HAS_NCCL
