// tests/support/faults.hpp — the one set of fault expectations every communicator backend must
// meet, as templates over a harness that runs ranks (threads, MPI processes, the NCCL mock): a
// rank that throws, a rank that never arrives, mismatched calls, abort(), poisoning, zero-count
// operations in the history, in-place all_to_all, zero-length point-to-point as a local no-op,
// messages to one's own rank, and one message text per argument check.
#pragma once

#include "support/checks.hpp"
#include "support/conformance.hpp"

#include <weft/comm/concepts.hpp>
#include <weft/core/error.hpp>

#include <doctest/doctest.h>

#include <atomic>
#include <chrono>
#include <cstddef>
#include <exception>
#include <limits>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

namespace weft::test::faults {

using namespace std::chrono_literals;
using fault_clock = std::chrono::steady_clock;

// A harness H runs one case on the ranks of one backend:
//
//   typename H::comm_type;
//   std::exception_ptr H::run(int n, std::chrono::milliseconds timeout, F&& body);
//
// calls body(comm_type&) on every rank of a fresh communicator of n ranks (where the world size is
// fixed by the launcher, as under mpiexec, n is ignored: read c.size()), whose default deadline is
// `timeout` and which cross-checks fingerprints (debug mode where that is optional). It returns
// the exception that escaped a rank's body in this process (threads: world::run's first; MPI: this
// rank's own), or null. Bodies use CHECK and friends, which doctest allows from any thread.

using weft::test::has;

inline double ms_since(fault_clock::time_point t0) {
  return std::chrono::duration<double, std::milli>(fault_clock::now() - t0).count();
}

inline std::string what_of(std::exception_ptr const& e) {
  if (!e) return "(nothing thrown)";
  try {
    std::rethrow_exception(e);
  } catch (std::exception const& x) {
    return x.what();
  } catch (...) {
    return "(not a std::exception)";
  }
}

//! Four elements of f32 on every rank, through C's memory policy.
template <class C>
struct four_floats {
  std::vector<float> in = std::vector<float>(4, 1.0f);
  std::vector<float> out = std::vector<float>(4, 0.0f);
  [[nodiscard]] comm::buffer_view vin() { return make_view<C>(std::span<float>(in)); }
  [[nodiscard]] comm::buffer_view vout() { return make_view<C>(std::span<float>(out)); }
};

// ---- a rank that throws -----------------------------------------------------------------------

inline constexpr char const* boom = "boom from the fault suite";

//! The last rank throws a std::runtime_error instead of joining an all_reduce: every other rank's
//! all_reduce ends in a comm_error within the deadline plus slack, never a hang or a return (a
//! peer_aborted_error names the thrower as its origin; where the backend only sees a rank that
//! never came, the missing-rank case below holds it to naming it); the thrower's own exception
//! leaves the harness unchanged.
template <class H>
void thrown_rank(H& h, int n, std::chrono::milliseconds timeout = 300ms) {
  std::atomic<int> peers_threw{0};
  std::atomic<int> hosted_bad{0};
  std::atomic<int> size{n};
  auto const escaped = h.run(n, timeout, [&](typename H::comm_type& c) {
    size.store(c.size());
    int const bad = c.size() - 1;
    if (c.rank() == bad) {
      hosted_bad.store(1);
      std::this_thread::sleep_for(20ms);  // let the peers block first
      throw std::runtime_error(boom);
    }
    four_floats<typename H::comm_type> b;
    auto const t0 = fault_clock::now();
    try {
      c.all_reduce(b.vin(), b.vout()).wait();
      FAIL_CHECK("rank " << c.rank() << ": all_reduce returned although rank " << bad << " threw");
      return;
    } catch (peer_aborted_error const& e) {
      INFO("what(): " << std::string(e.what()));
      CHECK(e.origin_rank() == bad);
      peers_threw.fetch_add(1);
    } catch (timeout_error const& e) {
      INFO("what(): " << std::string(e.what()));
      peers_threw.fetch_add(1);
    } catch (comm_error const& e) {
      FAIL_CHECK("rank " << c.rank() << ": expected peer_aborted_error or timeout_error, got: "
                         << std::string(e.what()));
    }
    CHECK(ms_since(t0) < static_cast<double>(timeout.count()) + 1500.0);
    CHECK(c.state() != comm::comm_state::healthy);
  });
  bool const bad_here = hosted_bad.load() != 0;
  if (bad_here) {
    CHECK(what_of(escaped) == boom);
  } else {
    CHECK_MESSAGE(!escaped, what_of(escaped));
  }
  // Every peer in this process threw: all of them where ranks are threads, this one under MPI.
  int const peers_here = H::ranks_in_process ? size.load() - 1 : (bad_here ? 0 : 1);
  CHECK(peers_threw.load() == peers_here);
}

// ---- a rank that never arrives -----------------------------------------------------------------

//! Rank size/2 arrives only well after the deadline: every other rank's all_reduce throws
//! timeout_error after the deadline (not before, not much later); the communicator is then
//! poisoned. A backend that can see who arrived (H::names_missing_ranks: threads) lists exactly
//! that rank in missing_ranks() and in the text ("[r]"); MPI's and NCCL's transports cannot tell
//! (a collective that never completes says nothing about who is absent), so there missing_ranks()
//! is empty and the text says it cannot tell which (docs/comm.md, "Behaviour shared by every
//! backend").
//! The lower bound is measured from the earliest call among ranks that share a process: the
//! group fails when the first rank to arrive reaches its deadline, so a rank that arrives later
//! (thread start-up skew, tens of ms under TSan) hears the timeout before its own deadline.
template <class H>
void missing_rank(H& h, int n, std::chrono::milliseconds timeout = 200ms) {
  std::atomic<int> gave_up{0};
  std::atomic<fault_clock::rep> earliest{std::numeric_limits<fault_clock::rep>::max()};
  auto const escaped = h.run(n, timeout, [&](typename H::comm_type& c) {
    int const missing = c.size() / 2;
    if (c.rank() == missing) {
      std::this_thread::sleep_for(3 * timeout);  // alive but late: returns after the others gave up
      return;
    }
    four_floats<typename H::comm_type> b;
    auto const t0 = fault_clock::now();
    auto seen = earliest.load();
    while (t0.time_since_epoch().count() < seen &&
           !earliest.compare_exchange_weak(seen, t0.time_since_epoch().count())) {}
    try {
      c.all_reduce(b.vin(), b.vout()).wait();
      FAIL_CHECK("all_reduce returned without rank " << missing);
    } catch (timeout_error const& e) {
      double const waited = ms_since(t0);
      auto const first = fault_clock::time_point(fault_clock::duration(earliest.load()));
      double const since_first = H::ranks_in_process ? ms_since(first) : waited;
      INFO("what(): " << std::string(e.what()));
      if constexpr (H::names_missing_ranks) {
        CHECK(e.missing_ranks() == std::vector<int>{missing});
        CHECK(has(e.what(), "[" + std::to_string(missing) + "]"));
      } else {
        CHECK(e.missing_ranks().empty());
        CHECK(has(e.what(), "cannot tell which"));
      }
      CHECK(since_first >= 0.9 * static_cast<double>(timeout.count()));
      CHECK(waited < static_cast<double>(timeout.count()) + 1500.0);
      gave_up.fetch_add(1);
    } catch (comm_error const& e) {
      FAIL_CHECK("expected timeout_error naming rank " << missing
                                                       << ", got: " << std::string(e.what()));
    }
    CHECK(c.state() == comm::comm_state::poisoned);
  });
  CHECK_MESSAGE(!escaped, what_of(escaped));
}

// ---- mismatched calls --------------------------------------------------------------------------

//! The last rank calls all_gather where the others call all_reduce (both count 4, f32): every rank
//! throws mismatch_error naming both fingerprints in one wording, and the fields that differ.
template <class H>
void mismatched_call(H& h, int n) {
  std::atomic<int> thrown{0};
  auto const escaped = h.run(n, 2000ms, [&](typename H::comm_type& c) {
    int const deviant = c.size() - 1;
    using C = typename H::comm_type;
    std::vector<float> in(4, 1.0f);
    std::vector<float> all(4 * static_cast<std::size_t>(c.size()));
    try {
      if (c.rank() == deviant) {
        c.all_gather(make_view<C>(std::span<float>(in)), make_view<C>(std::span<float>(all)))
            .wait();
      } else {
        c.all_reduce(make_view<C>(std::span<float>(in)), make_view<C>(std::span<float>(in))).wait();
      }
      FAIL_CHECK("a mismatched collective returned on rank " << c.rank());
    } catch (mismatch_error const& e) {
      std::string const what = e.what();
      INFO("what(): " << what);
      CHECK(has(what, "mismatched collectives at seq "));
      CHECK(has(what, "rank 0 called all_reduce(dtype f32, count 4, op sum) but rank " +
                          std::to_string(deviant) +
                          " called all_gather(dtype f32, count 4); they differ in: op"));
      thrown.fetch_add(1);
    } catch (comm_error const& e) {
      FAIL_CHECK("expected mismatch_error, got: " << std::string(e.what()));
    }
    // Poisoning: every later call fails at once with the recorded fault, even a zero-length one.
    CHECK(c.state() == comm::comm_state::poisoned);
    auto const t0 = fault_clock::now();
    auto const empty = make_view<C>(std::span<float>());
    auto const expect_recorded = [&](char const* op, auto&& call) {
      try {
        call();
        FAIL_CHECK(std::string(op) << " on a poisoned communicator returned");
      } catch (mismatch_error const& e) {
        INFO(std::string(op) << ": " << std::string(e.what()));
        CHECK(has(e.what(), "differ in: op"));
      } catch (std::exception const& e) {
        FAIL_CHECK(std::string(op)
                   << " on a poisoned communicator: expected the recorded mismatch_error, got: "
                   << std::string(e.what()));
      }
    };
    expect_recorded("barrier", [&] { c.barrier().wait(); });
    expect_recorded("zero-length all_reduce", [&] { c.all_reduce(empty, empty).wait(); });
    expect_recorded("all_reduce", [&] {
      c.all_reduce(make_view<C>(std::span<float>(in)), make_view<C>(std::span<float>(in))).wait();
    });
    if (c.size() > 1) {
      int const peer = (c.rank() + 1) % c.size();
      expect_recorded("isend", [&] { c.isend(make_view<C>(std::span<float>(in)), peer).wait(); });
      expect_recorded("irecv", [&] { c.irecv(make_view<C>(std::span<float>(in)), peer).wait(); });
    }
    CHECK(ms_since(t0) < 500.0);  // at once, not after a deadline each
  });
  CHECK_MESSAGE(!escaped, what_of(escaped));
  if (H::ranks_in_process)
    CHECK(thrown.load() == n);
  else
    CHECK(thrown.load() == 1);
}

// ---- abort()
// -------------------------------------------------------------------------------------

//! Rank 0 calls abort() (twice: idempotent); its state is aborted and every later operation on it
//! throws peer_aborted_error naming rank 0 at once, whatever the operation.
template <class H>
void abort_then_operate(H& h, int n) {
  auto const escaped = h.run(n, 2000ms, [&](typename H::comm_type& c) {
    using C = typename H::comm_type;
    if (c.rank() != 0) return;
    c.abort();
    c.abort();
    CHECK(c.state() == comm::comm_state::aborted);
    std::vector<float> v(4, 1.0f);
    auto const b = make_view<C>(std::span<float>(v));
    auto const empty = make_view<C>(std::span<float>());
    auto const t0 = fault_clock::now();
    auto const expect_aborted = [&](char const* op, auto&& call) {
      try {
        call();
        FAIL_CHECK(std::string(op) << " after abort() returned");
      } catch (peer_aborted_error const& e) {
        INFO(std::string(op) << ": " << std::string(e.what()));
        CHECK(e.origin_rank() == 0);
      } catch (std::exception const& e) {
        FAIL_CHECK(std::string(op) << " after abort(): expected peer_aborted_error, got: "
                                   << std::string(e.what()));
      }
    };
    expect_aborted("all_reduce", [&] { c.all_reduce(b, b).wait(); });
    expect_aborted("zero-length all_reduce", [&] { c.all_reduce(empty, empty).wait(); });
    expect_aborted("broadcast", [&] { c.broadcast(b, b, 0).wait(); });
    expect_aborted("barrier", [&] { c.barrier().wait(); });
    if (c.size() > 1) {
      expect_aborted("send", [&] { c.send(b, 1).wait(); });
      expect_aborted("irecv", [&] { c.irecv(b, 1).wait(); });
    }
    CHECK(ms_since(t0) < 500.0);
    CHECK(c.state() == comm::comm_state::aborted);
  });
  // A backend may report the abort to its peers (threads does, through world::run): that is a
  // comm_error from the rank that aborted, never anything else.
  if (escaped) {
    try {
      std::rethrow_exception(escaped);
    } catch (comm_error const&) {
    } catch (std::exception const& e) {
      FAIL_CHECK("after abort() the run ended with: " << std::string(e.what()));
    }
  }
}

// ---- zero counts
// ---------------------------------------------------------------------------------

//! Every collective with zero elements on every rank is a local no-op that still appears in
//! history() (op kind, no bytes, ok) and reaches the hook, one record per call; so do zero-length
//! send and recv.
template <class H>
void zero_counts_recorded(H& h, int n) {
  auto const escaped = h.run(n, 2000ms, [&](typename H::comm_type& c) {
    using C = typename H::comm_type;
    std::vector<comm::op_record> seen;
    c.set_hook([&](comm::op_record const& r) { seen.push_back(r); });
    auto const e = make_view<C>(std::span<float>());
    std::vector<std::size_t> const zeros(static_cast<std::size_t>(c.size()), 0);
    std::vector<comm::op_kind> want;
    auto const did = [&](comm::op_kind k, comm::work w) {
      w.wait();
      want.push_back(k);
    };
    did(comm::op_kind::all_reduce, c.all_reduce(e, e));
    did(comm::op_kind::reduce, c.reduce(e, e, {}, 0));
    did(comm::op_kind::broadcast, c.broadcast(e, e, 0));
    did(comm::op_kind::all_gather, c.all_gather(e, e));
    did(comm::op_kind::all_gather_v, c.all_gather_v(e, e, zeros));
    did(comm::op_kind::reduce_scatter, c.reduce_scatter(e, e));
    did(comm::op_kind::reduce_scatter_v, c.reduce_scatter_v(e, e, zeros));
    did(comm::op_kind::all_to_all, c.all_to_all(e, e));
    did(comm::op_kind::all_to_all_v, c.all_to_all_v(e, e, zeros, zeros));
    did(comm::op_kind::gather, c.gather(e, e, 0));
    did(comm::op_kind::scatter, c.scatter(e, e, 0));
    if (c.size() > 1) {
      int const peer = (c.rank() + 1) % c.size();
      did(comm::op_kind::send, c.send(e, peer));
      did(comm::op_kind::recv, c.recv(e, peer));
    }
    auto const hist = c.history();
    REQUIRE(hist.size() >= want.size());
    for (std::size_t i = 0; i < want.size(); ++i) {
      auto const& r = hist[hist.size() - want.size() + i];
      INFO("record " << i << ": expected " << comm::to_string(want[i]) << ", got "
                     << comm::to_string(r.op));
      CHECK(r.op == want[i]);
      CHECK(r.send_bytes == 0);
      CHECK(r.recv_bytes == 0);
      CHECK(r.ok);
    }
    REQUIRE(seen.size() == want.size());
    for (std::size_t i = 0; i < want.size(); ++i) CHECK(seen[i].op == want[i]);
    c.set_hook({});
    CHECK(c.state() == comm::comm_state::healthy);
  });
  CHECK_MESSAGE(!escaped, what_of(escaped));
}

// ---- in-place all_to_all
// -------------------------------------------------------------------------

//! all_to_all with out == in works (the conformance check, every dtype class), as on every backend.
template <class H>
void in_place_all_to_all(H& h, int n) {
  auto const escaped = h.run(n, 5000ms, [&](typename H::comm_type& c) {
    for (std::size_t block : {std::size_t{1}, std::size_t{3}, std::size_t{37}}) {
      conformance::check_all_to_all<float>(c, block, true);
      conformance::check_all_to_all<bf16>(c, block, true);
      conformance::check_all_to_all<i64>(c, block, true);
    }
  });
  CHECK_MESSAGE(!escaped, what_of(escaped));
}

// ---- zero-length point-to-point
// ------------------------------------------------------------------

//! A zero-length send or recv completes at once without a partner and leaves nothing behind: rank 0
//! sends an empty message to rank 1 that nobody receives, rank 1 receives an empty message from
//! rank 0 that nobody sends, and the real message that follows arrives intact (an empty message
//! that travelled would be matched by it instead).
template <class H>
void zero_length_p2p_is_local(H& h, int n, std::chrono::milliseconds timeout = 300ms) {
  auto const escaped = h.run(n, timeout, [&](typename H::comm_type& c) {
    using C = typename H::comm_type;
    if (c.size() < 2 || c.rank() > 1) return;
    auto const e = make_view<C>(std::span<float>());
    std::vector<float> msg = {1.5f, -2.0f, 3.25f};
    std::vector<float> got(3, 0.0f);
    auto const t0 = fault_clock::now();
    if (c.rank() == 0) {
      c.send(e, 1).wait();
      auto w = c.isend(e, 1);
      CHECK(w.done());
      w.wait();
      CHECK(ms_since(t0) < 0.5 * static_cast<double>(timeout.count()));
      c.send(make_view<C>(std::span<float>(msg)), 1).wait();
    } else {
      c.recv(e, 0).wait();
      auto w = c.irecv(e, 0);
      CHECK(w.done());
      w.wait();
      CHECK(ms_since(t0) < 0.5 * static_cast<double>(timeout.count()));
      c.recv(make_view<C>(std::span<float>(got)), 0).wait();
      CHECK(got == msg);
    }
    CHECK(c.state() == comm::comm_state::healthy);
  });
  CHECK_MESSAGE(!escaped, what_of(escaped));
}

// ---- messages to one's own rank
// ------------------------------------------------------------------

//! The self_messages_allowed rule (tests/support/conformance.hpp), on every backend. When true:
//! an isend to one's own rank pairs with a recv from it (and an irecv with a send), the data
//! arrive intact and the communicator stays healthy. When false: send, isend, recv and irecv with
//! peer == rank() throw invalid_argument_error naming `peer` before anything is communicated,
//! and the communicator stays healthy.
template <class H>
void self_message_rule(H& h, int n) {
  auto const escaped = h.run(n, 2000ms, [&](typename H::comm_type& c) {
    using C = typename H::comm_type;
    std::vector<float> v = {0.5f, -1.25f};
    std::vector<float> got(2, 0.0f);
    auto const b = make_view<C>(std::span<float>(v));
    auto const g = make_view<C>(std::span<float>(got));
    int const me = c.rank();
    if constexpr (self_messages_allowed) {
      auto w = c.isend(b, me);
      c.recv(g, me).wait();
      w.wait();
      CHECK(got == v);
      got.assign(2, 0.0f);
      auto r = c.irecv(g, me);
      auto s = c.isend(b, me);
      r.wait();
      s.wait();
      CHECK(got == v);
    } else {
      auto const expect_rejected = [&](char const* op, auto&& call) {
        try {
          call();
          FAIL_CHECK(std::string(op) << " to one's own rank was accepted");
        } catch (invalid_argument_error const& e) {
          INFO(std::string(op) << ": " << std::string(e.what()));
          CHECK(has(e.what(), "argument `peer`"));
        } catch (std::exception const& e) {
          FAIL_CHECK(std::string(op) << " to one's own rank: expected invalid_argument_error, got: "
                                     << std::string(e.what()));
        }
      };
      expect_rejected("send", [&] { c.send(b, me).wait(); });
      expect_rejected("isend", [&] { c.isend(b, me).wait(); });
      expect_rejected("recv", [&] { c.recv(g, me).wait(); });
      expect_rejected("irecv", [&] { c.irecv(g, me).wait(); });
    }
    CHECK(c.state() == comm::comm_state::healthy);
    c.barrier().wait();  // still usable
  });
  CHECK_MESSAGE(!escaped, what_of(escaped));
}

// ---- one message per check
// -----------------------------------------------------------------------

//! Each argument check fails every backend with the same invalid_argument_error text, up to the
//! requirement and location that follow it (types by name, the expected count as an expression
//! and its value, as comm/detail/plan.hpp words them), written once here so that a backend that
//! words a check its own way fails; the communicator stays healthy.
template <class H>
void one_message_per_check(H& h, int n) {
  auto const escaped = h.run(n, 2000ms, [&](typename H::comm_type& c) {
    using C = typename H::comm_type;
    auto const size = static_cast<std::size_t>(c.size());
    std::vector<float> f(4 * size + 1, 1.0f);
    std::vector<double> d(4 * size, 1.0);
    auto const f4 = make_view<C>(std::span<float>(f).first(4));
    auto const d4 = make_view<C>(std::span<double>(d).first(4));
    auto const f_short = make_view<C>(std::span<float>(f).first(4 * size - 1));
    std::vector<std::size_t> const too_few(size + 1, 0);
    auto const expect_text = [&](char const* check, std::string const& text, auto&& call) {
      try {
        call();
        FAIL_CHECK(std::string(check) << ": the invalid call was accepted");
      } catch (invalid_argument_error const& e) {
        INFO(std::string(check) << ": " << std::string(e.what()));
        CHECK(has(e.what(), text));
      } catch (std::exception const& e) {
        FAIL_CHECK(std::string(check)
                   << ": expected invalid_argument_error, got: " << std::string(e.what()));
      }
    };
    expect_text("dtype of out", "argument `out.type`: expected in.type = f32, actual f64",
                [&] { c.all_reduce(f4, d4).wait(); });
    expect_text("all_gather out.count",
                "argument `out.count`: expected size() * in.count = " + std::to_string(4 * size) +
                    ", actual " + std::to_string(4 * size - 1),
                [&] { c.all_gather(f4, f_short).wait(); });
    expect_text("_v counts",
                "argument `counts.size()`: expected size() = " + std::to_string(size) +
                    ", actual " + std::to_string(size + 1),
                [&] { c.all_gather_v(f4, f4, too_few).wait(); });
    expect_text("root",
                "argument `root`: expected a rank in [0, " + std::to_string(size) + "), actual " +
                    std::to_string(size),
                [&] { c.broadcast(f4, f4, c.size()).wait(); });
    CHECK(c.state() == comm::comm_state::healthy);
    c.barrier().wait();
  });
  CHECK_MESSAGE(!escaped, what_of(escaped));
}

}  // namespace weft::test::faults
