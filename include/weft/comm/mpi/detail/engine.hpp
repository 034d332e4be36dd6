// weft/comm/mpi/detail/engine.hpp — the machinery under every MPI-backend operation: the call
// record, sequencing, the debug-mode fingerprint check, staging through weft-owned buffers,
// posting non-blocking MPI calls and polling them to the deadline, fault mapping, the chunked
// point-to-point fallbacks and user point-to-point. mpi::communicator derives from it.
#pragma once

#if !WEFT_HAS_MPI
#error \
    "weft/comm/mpi/detail/engine.hpp needs MPI: link the CMake target weft::mpi (it defines WEFT_HAS_MPI=1 and adds MPI's include path and libraries)"
#endif

#include <weft/comm/concepts.hpp>
#include <weft/comm/detail/buffers.hpp>
#include <weft/comm/detail/describe.hpp>
#include <weft/comm/detail/fault.hpp>
#include <weft/comm/detail/plan.hpp>
#include <weft/comm/mpi/detail/state.hpp>
#include <weft/comm/mpi/detail/wire.hpp>
#include <weft/comm/mpi/options.hpp>
#include <weft/core/dtype.hpp>
#include <weft/core/error.hpp>

#include <mpi.h>

#include <algorithm>
#include <chrono>
#include <climits>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <memory>
#include <span>
#include <string>
#include <utility>
#include <vector>

namespace weft::comm::mpi::detail {

using rules::byte_offset;

//! One rank's handle on an MPI communicator, and the steps its operations are built from. A null
//! s_ is a non-member.
class engine {
 protected:
  engine() = default;

  struct call {
    fingerprint fp{};
    std::vector<std::size_t> counts;   // _v counts (send counts for all_to_all_v)
    std::vector<std::size_t> counts2;  // recv counts for all_to_all_v
    op_record rec{};
    std::chrono::milliseconds timeout{0};
    clock::time_point deadline{};
    std::vector<MPI_Request> reqs;
    std::vector<std::shared_ptr<void>> keep;  // staging buffers the requests use
  };

  explicit engine(std::shared_ptr<shared> s) : s_(std::move(s)) {
    s_->history.set_capacity(s_->opts.history_size);
    WEFT_MPI_TRY(MPI_Comm_rank(s_->comm, &s_->rank));
    WEFT_MPI_TRY(MPI_Comm_size(s_->comm, &s_->size));
    if (s_->split) {
      // Local: where each rank of this group sits in MPI_COMM_WORLD, for messages.
      MPI_Group mine = MPI_GROUP_NULL;
      MPI_Group world = MPI_GROUP_NULL;
      WEFT_MPI_TRY(MPI_Comm_group(s_->comm, &mine));
      WEFT_MPI_TRY(MPI_Comm_group(MPI_COMM_WORLD, &world));
      std::vector<int> ranks(static_cast<std::size_t>(s_->size));
      for (int r = 0; r < s_->size; ++r) ranks[static_cast<std::size_t>(r)] = r;
      s_->world_ranks.assign(ranks.size(), MPI_UNDEFINED);
      int const rc =
          MPI_Group_translate_ranks(mine, s_->size, ranks.data(), world, s_->world_ranks.data());
      MPI_Group_free(&mine);
      MPI_Group_free(&world);
      WEFT_MPI_TRY(rc);
    }
  }

  static void check_options(options const& o) {
    WEFT_EXPECTS(o.timeout.count() > 0, "options.timeout", "> 0 ms", o.timeout.count());
    WEFT_EXPECTS(o.max_count >= 1 && o.max_count <= static_cast<std::size_t>(INT_MAX),
                 "options.max_count", "in [1, INT_MAX]", o.max_count);
  }

  [[nodiscard]] int rank_() const noexcept { return s_ ? s_->rank : -1; }
  [[nodiscard]] int size_() const noexcept { return s_ ? s_->size : 0; }
  [[nodiscard]] std::size_t me() const noexcept { return static_cast<std::size_t>(rank_()); }
  [[nodiscard]] std::size_t max_count() const noexcept { return s_->opts.max_count; }
  static int to_int(std::size_t v) noexcept { return static_cast<int>(v); }

  [[nodiscard]] rules::endpoint endpoint() const noexcept {
    return {s_->rank, s_->size, memory_kind::host, -1,
            "Debian's Open MPI is built without CUDA support"};
  }

  [[nodiscard]] std::string context(call const& c) const {
    return s_->names().context(c.rec.op, s_->rank, c.rec.seq);
  }

  // Entry of every operation: membership, per-call timeout, a dead communicator.
  call begin(op_kind op, op_options const& o) {
    rules::check_member(s_ != nullptr);
    call c;
    c.rec.op = op;
    c.rec.start = clock::now();
    c.rec.end = c.rec.start;
    c.timeout = rules::call_timeout(o, s_->opts.timeout);
    if (s_->state.load(std::memory_order_acquire) != comm_state::healthy)
      s_->rethrow_fault(context(c));
    return c;
  }

  //! Takes over what the rules decided: fingerprint, bytes, root or peer.
  static void apply_plan(call& c, rules::call_plan const& p) {
    c.fp = p.fp;
    c.rec.type = p.fp.type;
    c.rec.send_bytes = p.send_bytes;
    c.rec.recv_bytes = p.recv_bytes;
    c.rec.root_or_peer = p.root_or_peer;
  }

  work finish_trivial(call& c) {
    c.rec.type = c.fp.type;
    c.rec.end = clock::now();
    s_->history.finished(c.rec);
    return work{};
  }

  template <class Body>
  work run(call& c, Body&& body) {
    std::uint64_t const seq = ++s_->seq;
    c.rec.seq = seq;
    c.rec.type = c.fp.type;
    c.fp.seq = seq;
    c.deadline = clock::now() + c.timeout;
    std::uint64_t const id = s_->history.add(c.rec);
    try {
      if (s_->opts.check_fingerprints) check_fingerprints(c);
      body();
    } catch (comm_error const& e) {
      rules::mark_failed(c.rec, e.what());
      s_->history.completed(id, c.rec);
      throw;
    }
    c.rec.end = clock::now();
    s_->history.completed(id, c.rec);
    return work{};
  }

  // options::own_buffers: points `in` (when read) and `out` (when written) at weft's memory, held
  // by the call until it completes and buried with it when abandoned; returns what copies the
  // result back. Exact in-place forms (in and out overlap) share one staging region, so every
  // pointer relation the bodies test (in == out, in == out + offset) still holds.
  struct staged_out {
    void* user = nullptr;
    std::byte const* owned = nullptr;
    std::size_t bytes = 0;
  };
  staged_out stage(call& c, buffer_view& in, buffer_view& out, bool reads_in, bool writes_out) {
    staged_out back;
    bool const use_in = reads_in && in.count != 0;
    bool const use_out = writes_out && out.count != 0;
    auto own = [&](std::size_t bytes) {
      std::shared_ptr<std::byte[]> p(new std::byte[bytes]);
      c.keep.push_back(p);
      return p.get();
    };
    if (use_in && use_out && rules::overlap(in, out)) {
      auto const a = reinterpret_cast<std::uintptr_t>(in.data);
      auto const b = reinterpret_cast<std::uintptr_t>(out.data);
      auto const lo = std::min(a, b);
      auto const hi = std::max(a + in.bytes(), b + out.bytes());
      std::byte* const base = own(hi - lo);
      std::memcpy(base, reinterpret_cast<void const*>(lo), hi - lo);
      back = {out.data, base + (b - lo), out.bytes()};
      in.data = base + (a - lo);
      out.data = base + (b - lo);
      return back;
    }
    if (use_in) {
      std::byte* const p = own(in.bytes());
      std::memcpy(p, in.data, in.bytes());
      in.data = p;
    }
    if (use_out) {
      std::byte* const p = own(out.bytes());
      back = {out.data, p, out.bytes()};
      out.data = p;
    }
    return back;
  }

  template <class Body>
  work run_staged(call& c, buffer_view& in, buffer_view& out, bool reads_in, bool writes_out,
                  Body&& body) {
    if (!s_->opts.own_buffers) return run(c, std::forward<Body>(body));
    staged_out const back = stage(c, in, out, reads_in, writes_out);
    work w = run(c, std::forward<Body>(body));
    if (back.bytes != 0) std::memcpy(back.user, back.owned, back.bytes);
    return w;
  }

  [[noreturn]] void fail(call& c, rules::fault f) {
    if (!c.reqs.empty() || !c.keep.empty()) {
      // Requests that may never complete keep their staging buffers (and their communicator).
      for (auto& k : c.keep) s_->keep.push_back(std::move(k));
      c.keep.clear();
      if (!c.reqs.empty()) s_->abandoned = true;
    }
    if (f.kind == errc::backend) f.backend = "mpi";
    s_->poison(f);
    rules::rethrow(f, context(c));
  }

  [[noreturn]] void mpi_fail(call& c, char const* what, int rc) {
    fail(c, {errc::backend,
             weft::detail::concat(what, " failed: ", mpi_error_text(rc)),
             s_->rank,
             {},
             "mpi",
             rc});
  }

  void post(call& c, int rc, char const* what) {
    if (rc != MPI_SUCCESS) {
      c.reqs.pop_back();
      mpi_fail(c, what, rc);
    }
  }

  // Waits for every posted request of `c` until its deadline.
  void complete(call& c) {
    if (c.reqs.empty()) return;
    rules::poll_result r{};
    try {
      r = poll(*s_, c.reqs, c.deadline);
    } catch (backend_error const& e) {
      fail(c, {errc::backend, e.message(), s_->rank, {}, "mpi", e.backend_code()});
    }
    if (r == rules::poll_result::done) {
      c.reqs.clear();
      return;
    }
    if (r == rules::poll_result::stopped) {
      // abort() while waiting: the requests stay posted, with their buffers.
      for (auto& k : c.keep) s_->keep.push_back(std::move(k));
      c.keep.clear();
      s_->abandoned = true;
      rules::throw_aborted(context(c), s_->who(s_->rank), s_->rank);
    }
    bool const v = rules::has_counts(c.fp.op);
    fail(c, {errc::timeout,
             weft::detail::concat(rules::describe(c.fp, v ? std::span<std::size_t const>(c.counts)
                                                          : std::span<std::size_t const>()),
                                  " timed out after ", c.timeout.count(), " ms on ",
                                  s_->who(s_->rank), ": not every rank of the ", size_(),
                                  " took part (MPI cannot tell which; last completed seq ",
                                  c.fp.seq - 1, ")"),
             s_->rank,
             {},
             {},
             0});
  }

  // Debug mode: every rank all-gathers its fingerprint (and _v counts) and compares them all, so
  // every rank reaches the same verdict and a mismatch throws everywhere before any data moves.
  void check_fingerprints(call& c) {
    auto const n = static_cast<std::size_t>(size_());
    std::size_t const width = rules::fingerprint_width(n, true);
    auto const mine = rules::fingerprint_row(c.fp, width, c.counts, c.counts2);
    std::vector<std::int64_t> all(width * n);
    post(c,
         MPI_Iallgather(mine.data(), to_int(width), MPI_INT64_T, all.data(), to_int(width),
                        MPI_INT64_T, s_->comm, &c.reqs.emplace_back()),
         "MPI_Iallgather (fingerprints)");
    complete(c);
    if (auto msg = rules::compare_rows(all, n, width, s_->names()))
      fail(c, {errc::mismatch, std::move(*msg), -1, {}, {}, 0});
  }

  // ---- internal point-to-point (chunked fallbacks) ----------------------------------------------

  void p2p_send(call& c, void const* data, std::size_t count, dtype t, int peer) {
    auto const mt = detail::move_type(t);
    for (std::size_t done = 0; done < count; done += max_count()) {
      auto const k = std::min(max_count(), count - done);
      post(c,
           MPI_Isend(byte_offset(data, done, t), to_int(k), mt, peer, detail::internal_tag,
                     s_->comm, &c.reqs.emplace_back()),
           "MPI_Isend");
    }
  }
  void p2p_recv(call& c, void* data, std::size_t count, dtype t, int peer) {
    auto const mt = detail::move_type(t);
    for (std::size_t done = 0; done < count; done += max_count()) {
      auto const k = std::min(max_count(), count - done);
      post(c,
           MPI_Irecv(byte_offset(data, done, t), to_int(k), mt, peer, detail::internal_tag,
                     s_->comm, &c.reqs.emplace_back()),
           "MPI_Irecv");
    }
  }

  // Count and displacement arrays of a pending request live as long as its staging buffers.
  static int* int_array(call& c, std::span<std::size_t const> v) {
    auto a = std::make_shared<std::vector<int>>(v.size());
    for (std::size_t i = 0; i < v.size(); ++i) (*a)[i] = to_int(v[i]);
    c.keep.push_back(a);
    return a->data();
  }

  bool fits(std::span<std::size_t const> counts) const {
    std::size_t total = 0;
    for (auto x : counts)
      if (__builtin_add_overflow(total, x, &total)) return false;
    return total <= max_count();  // every count and displacement is at most the total
  }

  // ---- user point-to-point ---------------------------------------------------------------------

  // ---- user point-to-point ---------------------------------------------------------------------

  work p2p(op_kind kind, buffer_view b, int peer, op_options const& o) {
    call c = begin(kind, o);
    auto const pl = rules::plan_p2p(endpoint(), kind, b, peer);
    apply_plan(c, pl);
    // Count 0 is a local no-op on every backend: nothing travels, nothing must be matched.
    if (pl.trivial) return finish_trivial(c);
    auto const mt = detail::move_type(b.type);
    // options::own_buffers: the message travels from (or into) weft's copy.
    std::shared_ptr<std::byte[]> owned;
    void* user_out = nullptr;
    std::size_t out_bytes = 0;
    if (s_->opts.own_buffers && b.count != 0) {
      owned.reset(new std::byte[b.bytes()]);
      c.keep.push_back(owned);
      if (kind == op_kind::send) {
        std::memcpy(owned.get(), b.data, b.bytes());
      } else {
        user_out = b.data;
        out_bytes = b.bytes();
      }
      b.data = owned.get();
    }
    std::size_t done = 0;
    do {
      auto const k = std::min(max_count(), b.count - done);
      void* p = byte_offset(b.data, done, b.type);
      int const rc = kind == op_kind::send ? MPI_Isend(p, to_int(k), mt, peer, detail::user_tag,
                                                       s_->comm, &c.reqs.emplace_back())
                                           : MPI_Irecv(p, to_int(k), mt, peer, detail::user_tag,
                                                       s_->comm, &c.reqs.emplace_back());
      post(c, rc, kind == op_kind::send ? "MPI_Isend" : "MPI_Irecv");
      done += k;
    } while (done < b.count);
    auto const id = s_->history.add(c.rec);
    return work(std::make_shared<detail::p2p_work>(s_, std::move(c.reqs), id, c.rec,
                                                   clock::now() + c.timeout, c.timeout,
                                                   std::move(owned), user_out, out_bytes));
  }

  std::shared_ptr<shared> s_;
};

}  // namespace weft::comm::mpi::detail
