// tests/comm/mpi/behaviour.test.cpp — what the MPI backend promises beyond the shared conformance
// checks: split and adopt, invalid arguments leave it healthy, debug-mode fingerprints throw
// mismatch_error on every rank, abort and poisoning, history and hook, the typed front door.
#include <weft/comm/collectives.hpp>
#include <weft/comm/mpi/communicator.hpp>
#include <weft/core/tensor.hpp>

#include <doctest/doctest.h>

#include <chrono>
#include <limits>
#include <span>
#include <numeric>
#include <string>
#include <vector>

using weft::comm::buffer_view;
using weft::comm::comm_state;
using weft::comm::host_view;
using weft::comm::op_kind;
using weft::comm::reduce_kind;
using weft::comm::mpi::communicator;

namespace {

weft::comm::mpi::options opts(bool fingerprints = false) {
  weft::comm::mpi::options o;
  o.timeout = std::chrono::seconds(10);
  o.check_fingerprints = fingerprints;
  return o;
}

int world_size() {
  int n = 0;
  MPI_Comm_size(MPI_COMM_WORLD, &n);
  return n;
}

}  // namespace

TEST_SUITE("mpi") {
  TEST_CASE("mpi: world, rank, size and the Communicator concept") {
    static_assert(weft::comm::Communicator<communicator>);
    auto c = communicator::world(opts());
    int r = -1;
    MPI_Comm_rank(MPI_COMM_WORLD, &r);
    CHECK(c.rank() == r);
    CHECK(c.size() == world_size());
    CHECK(c.state() == comm_state::healthy);
    int cmp = 0;
    MPI_Comm_compare(c.native(), MPI_COMM_WORLD, &cmp);
    CHECK(cmp == MPI_CONGRUENT);  // a duplicate, not the world itself

    communicator moved = std::move(c);
    CHECK(moved.rank() == r);
    CHECK(c.size() == 0);  // NOLINT(bugprone-use-after-move): moved-from is a non-member
    CHECK(c.rank() == -1);
    CHECK_THROWS_AS(c.barrier(), weft::invalid_argument_error);
  }

  TEST_CASE("mpi: adopt uses the caller's communicator and restores its error handler") {
    MPI_Comm mine = MPI_COMM_NULL;
    MPI_Comm_dup(MPI_COMM_WORLD, &mine);
    {
      auto c = communicator::adopt(mine, opts());
      CHECK(c.native() == mine);
      MPI_Errhandler h = MPI_ERRHANDLER_NULL;
      MPI_Comm_get_errhandler(mine, &h);
      CHECK(h == MPI_ERRORS_RETURN);
      MPI_Errhandler_free(&h);
      std::vector<int> v{c.rank() + 1};
      weft::comm::all_reduce(c, v);
      CHECK(v[0] == c.size() * (c.size() + 1) / 2);
    }
    MPI_Errhandler h = MPI_ERRHANDLER_NULL;
    MPI_Comm_get_errhandler(mine, &h);
    CHECK(h == MPI_ERRORS_ARE_FATAL);  // restored
    MPI_Errhandler_free(&h);
    MPI_Comm_free(&mine);
  }

  TEST_CASE("mpi: split by parity, keys reversing the order, and a non-member") {
    auto world = communicator::world(opts());
    int const n = world.size();
    int const r = world.rank();
    // Odd ranks keep out (negative color) when there are at least 3 ranks.
    int const color = (n >= 3 && r == 1) ? -1 : r % 2;
    auto sub = world.split(color, -r);
    if (color < 0) {
      CHECK(sub.size() == 0);
      CHECK(sub.rank() == -1);
      CHECK_THROWS_AS(sub.barrier(), weft::invalid_argument_error);
    } else {
      std::vector<int> members;
      for (int s = 0; s < n; ++s)
        if (s % 2 == color && !(n >= 3 && s == 1)) members.push_back(s);
      REQUIRE(sub.size() == static_cast<int>(members.size()));
      // key = -rank: the highest parent rank comes first.
      int const expect_rank =
          static_cast<int>(members.end() - std::find(members.begin(), members.end(), r)) - 1;
      CHECK(sub.rank() == expect_rank);
      std::vector<int> v{r};
      weft::comm::all_reduce(sub, v);
      CHECK(v[0] == std::accumulate(members.begin(), members.end(), 0));
      CHECK(sub.timeout() == world.timeout());  // inherited
    }
    world.barrier();  // the parent is still usable
    CHECK(world.history().back().op == op_kind::barrier);
  }

  TEST_CASE("mpi: typed collectives over std::vector and weft tensors") {
    auto c = communicator::world(opts());
    int const n = c.size();
    int const r = c.rank();
    std::vector<float> in(4);
    for (int i = 0; i < 4; ++i) in[static_cast<std::size_t>(i)] = static_cast<float>(r * 10 + i);
    std::vector<float> out(4);
    weft::comm::all_reduce(c, in, out, reduce_kind::max);
    for (int i = 0; i < 4; ++i)
      CHECK(out[static_cast<std::size_t>(i)] == static_cast<float>((n - 1) * 10 + i));

    std::vector<double> gathered(static_cast<std::size_t>(4 * n));
    for (int i = 0; i < 4; ++i) gathered[static_cast<std::size_t>(4 * r + i)] = r + 0.25 * i;
    weft::comm::all_gather(c, gathered);  // in place
    for (int s = 0; s < n; ++s)
      for (int i = 0; i < 4; ++i)
        CHECK(gathered[static_cast<std::size_t>(4 * s + i)] == s + 0.25 * i);

    std::vector<weft::bf16> half(static_cast<std::size_t>(2 * n), weft::bf16(1.5f));
    weft::comm::reduce_scatter(c, half);  // in place: block r holds the sum
    CHECK(static_cast<float>(half[static_cast<std::size_t>(2 * r)]) ==
          1.5f * static_cast<float>(n));

    weft::tensor<std::int64_t, 1> t({3});
    for (std::int64_t i = 0; i < 3; ++i) t.data()[i] = (r == n - 1) ? 7 * (i + 1) : -1;
    weft::comm::broadcast(c, t, n - 1);
    CHECK(t.data()[0] == 7);
    CHECK(t.data()[2] == 21);
    weft::comm::barrier(c);
  }

  TEST_CASE(
      "mpi: invalid arguments throw before communicating and leave the communicator healthy") {
    auto c = communicator::world(opts(true));
    std::vector<float> a(4, 1.0f);
    std::vector<float> b(3);
    CHECK_THROWS_AS(weft::comm::all_reduce(c, a, b), weft::invalid_argument_error);
    CHECK_THROWS_AS(
        c.reduce(host_view(std::span<float>(a)), host_view(std::span<float>(a)), {}, c.size()),
        weft::invalid_argument_error);
    buffer_view device = host_view(std::span<float>(a));
    device.where = weft::comm::memory_kind::cuda;
    CHECK_THROWS_AS(c.all_reduce(device, device), weft::invalid_argument_error);
    buffer_view null_data{nullptr, 3, weft::dtype::f32};
    CHECK_THROWS_AS(c.all_reduce(null_data, null_data), weft::invalid_argument_error);
    // Partial overlap: out starts one element into in.
    std::vector<float> big(8, 1.0f);
    CHECK_THROWS_AS(c.all_reduce(host_view(std::span<float>(big).subspan(0, 4)),
                                 host_view(std::span<float>(big).subspan(1, 4))),
                    weft::invalid_argument_error);
    std::vector<std::size_t> wrong(static_cast<std::size_t>(c.size()) + 1, 1);
    CHECK_THROWS_AS(
        c.all_gather_v(host_view(std::span<float>(a)), host_view(std::span<float>(big)), wrong),
        weft::invalid_argument_error);
    std::vector<weft::u8> bytes(2);
    CHECK_THROWS_AS(
        c.all_reduce(host_view(std::span<weft::u8>(bytes)), host_view(std::span<weft::u8>(bytes)),
                     weft::comm::reduce_op::premul(0.5)),
        weft::invalid_argument_error);
    CHECK_THROWS_AS(c.send(host_view(std::span<float>(a)), -1), weft::invalid_argument_error);
    CHECK(c.state() == comm_state::healthy);
    weft::comm::all_reduce(c, a);  // still works
    CHECK(a[0] == static_cast<float>(c.size()));
  }

  TEST_CASE("mpi: debug-mode fingerprints — a count mismatch throws mismatch_error on every rank") {
    if (world_size() < 2) return;
    auto c = communicator::world(opts(true));
    std::vector<float> v(c.rank() == 1 ? 5 : 4, 1.0f);
    std::string what;
    try {
      weft::comm::all_reduce(c, v);
    } catch (weft::mismatch_error const& e) {
      what = e.what();
    }
    INFO(what);
    CHECK(what.find("rank 0 called all_reduce(dtype f32, count 4") != std::string::npos);
    CHECK(what.find("rank 1 called all_reduce(dtype f32, count 5") != std::string::npos);
    CHECK(what.find("differ in: count") != std::string::npos);
    CHECK(c.state() == comm_state::poisoned);
    // Every later call throws at once, without communicating.
    auto const t0 = std::chrono::steady_clock::now();
    CHECK_THROWS_AS(c.barrier(), weft::mismatch_error);
    CHECK(std::chrono::steady_clock::now() - t0 < std::chrono::milliseconds(50));
    auto const& h = c.history();
    REQUIRE(!h.empty());
    CHECK(!h.back().ok);
    CHECK(h.back().error.find("mismatch") != std::string::npos);
  }

  TEST_CASE("mpi: debug-mode fingerprints — different collectives and roots") {
    if (world_size() < 2) return;
    {
      auto c = communicator::world(opts(true));
      std::vector<float> in(2, 1.0f);
      std::vector<float> out(static_cast<std::size_t>(2 * c.size()));
      std::string what;
      try {
        if (c.rank() == 0)
          weft::comm::all_reduce(c, in);
        else
          weft::comm::all_gather(c, in, out);
      } catch (weft::mismatch_error const& e) {
        what = e.what();
      }
      CHECK(what.find("rank 0 called all_reduce") != std::string::npos);
      CHECK(what.find("rank 1 called all_gather") != std::string::npos);
      CHECK(what.find("differ in: op") != std::string::npos);
    }
    {
      auto c = communicator::world(opts(true));
      std::vector<int> v(3, 1);
      std::string what;
      try {
        weft::comm::broadcast(c, v, c.rank() == 0 ? 0 : 1);
      } catch (weft::mismatch_error const& e) {
        what = e.what();
      }
      CHECK(what.find("differ in: root") != std::string::npos);
    }
    {
      // Fingerprints on, everything matching: results as usual.
      auto c = communicator::world(opts(true));
      std::vector<int> v(3, 2);
      weft::comm::all_reduce(c, v, reduce_kind::prod);
      CHECK(v[1] == (1 << c.size()));
      CHECK(c.state() == comm_state::healthy);
    }
  }

  TEST_CASE("mpi: errors in a split communicator name the group and both ranks") {
    if (world_size() < 2) return;
    auto w = communicator::world(opts(true));
    int const n = w.size();
    // Keys reverse the order: group rank g is world rank n - 1 - g.
    auto c = w.split(0, -w.rank());
    c.set_name("rev");
    CHECK(c.name() == "rev");
    std::vector<float> in(2, 1.0f);
    std::vector<float> out(static_cast<std::size_t>(2 * n));
    std::string what;
    try {
      if (c.rank() == 0)
        weft::comm::all_reduce(c, in);
      else
        weft::comm::all_gather(c, in, out);
    } catch (weft::mismatch_error const& e) {
      what = e.what();
    }
    INFO(what);
    bool const names_group =
        what.find(weft::detail::concat(c.rank() == 0 ? "all_reduce" : "all_gather", " on rank ",
                                       c.rank(), " (world rank ", w.rank(), ") of group `rev`")) !=
        std::string::npos;
    CHECK(names_group);
    CHECK(what.find(weft::detail::concat("rank 0 (world rank ", n - 1, ") called all_reduce")) !=
          std::string::npos);
    CHECK(what.find(weft::detail::concat("but rank 1 (world rank ", n - 2,
                                         ") called all_gather")) != std::string::npos);
    CHECK(what.find("[at weft/comm/mpi/") != std::string::npos);
  }

  TEST_CASE("mpi: a receive nobody sends times out, poisons, and later calls fail at once") {
    auto c = communicator::world(opts());
    if (c.rank() == 0) {
      // Local only: rank 0 waits for a message from itself that never comes.
      std::vector<float> v(3);
      auto w = c.irecv(host_view(std::span<float>(v)), 0, {std::chrono::milliseconds(100)});
      CHECK_FALSE(w.done());
      CHECK_FALSE(w.wait_for(std::chrono::milliseconds(10)));  // the caller's limit: no throw
      auto const t0 = std::chrono::steady_clock::now();
      std::string what;
      try {
        w.wait();
      } catch (weft::timeout_error const& e) {
        what = e.what();
        REQUIRE(e.missing_ranks().size() == 1);
        CHECK(e.missing_ranks()[0] == 0);
      }
      auto const took = std::chrono::steady_clock::now() - t0;
      CHECK(what.find("timed out after 100 ms") != std::string::npos);
      CHECK(took < std::chrono::milliseconds(300));
      CHECK(c.state() == comm_state::poisoned);
      CHECK_THROWS_AS(c.barrier(), weft::timeout_error);
      CHECK_THROWS_AS(w.wait(), weft::timeout_error);  // the error sticks to the work too
    }
  }

  TEST_CASE("mpi: abort is local, idempotent and rejects later calls with peer_aborted_error") {
    auto c = communicator::world(opts());
    c.abort();
    c.abort();
    CHECK(c.state() == comm_state::aborted);
    std::vector<float> v(2);
    // The same exception as on every backend (it was comm_error here): the origin is this rank.
    try {
      weft::comm::all_reduce(c, v);
      FAIL("all_reduce after abort() returned");
    } catch (weft::peer_aborted_error const& e) {
      CHECK(e.origin_rank() == c.rank());
      CHECK(std::string(e.what()).find("called abort()") != std::string::npos);
    }
    CHECK_THROWS_AS(c.barrier(), weft::peer_aborted_error);
    CHECK_THROWS_AS(c.send(host_view(std::span<float>(v)), 0), weft::peer_aborted_error);
  }

  TEST_CASE(
      "mpi: a zero-length send or receive is a local no-op, recorded like any other operation") {
    auto c = communicator::world(opts());
    std::vector<weft::comm::op_record> seen;
    c.set_hook([&](weft::comm::op_record const& r) { seen.push_back(r); });
    std::vector<float> none;
    int const peer = (c.rank() + 1) % c.size();
    // Nobody posts the matching call: nothing travels, so nothing must be matched (it used to be
    // sent here, and would wait for the peer's zero-length receive).
    auto w = c.isend(host_view(std::span<float>(none)), peer);
    CHECK(w.done());
    c.recv(host_view(std::span<float>(none)), peer).wait();
    REQUIRE(seen.size() == 2);
    CHECK(seen[0].op == op_kind::send);
    CHECK(seen[0].root_or_peer == peer);
    CHECK(seen[0].ok);
    CHECK(seen[1].op == op_kind::recv);
    CHECK(c.history().size() == 2);
    CHECK(c.state() == comm_state::healthy);
    weft::comm::barrier(c);
  }

  TEST_CASE("mpi: history and hook record every operation") {
    weft::comm::mpi::options o = opts();
    o.history_size = 3;
    auto c = communicator::world(o);
    std::vector<weft::comm::op_record> seen;
    c.set_hook([&](weft::comm::op_record const& r) { seen.push_back(r); });
    std::vector<double> v(5, 1.0);
    weft::comm::all_reduce(c, v);
    weft::comm::barrier(c);
    weft::comm::broadcast(c, v, 0);
    std::vector<double> none;
    weft::comm::all_reduce(c,
                           none);  // zero-length: a local no-op, recorded without a sequence number
    REQUIRE(seen.size() == 4);
    CHECK(seen[0].op == op_kind::all_reduce);
    CHECK(seen[0].seq == 1);
    CHECK(seen[0].send_bytes == 40);
    CHECK(seen[0].type == weft::dtype::f64);
    CHECK(seen[0].ok);
    CHECK(seen[0].end >= seen[0].start);
    CHECK(seen[1].op == op_kind::barrier);
    CHECK(seen[1].seq == 2);
    CHECK(seen[2].root_or_peer == 0);
    CHECK(seen[3].seq == 0);
    auto const h = c.history();
    REQUIRE(h.size() == 3);  // the last three, oldest first
    CHECK(h[0].op == op_kind::barrier);
    CHECK(h[1].op == op_kind::broadcast);
    CHECK(h[2].op == op_kind::all_reduce);
  }

  TEST_CASE("mpi: bf16 and f16 sums accumulate in f32 and round once") {
    auto c = communicator::world(opts());
    int const n = c.size();
    // Rank 0 holds 1, the others 2^-9 each. Added to 1 one at a time in bf16 (ulp 2^-7) every 2^-9
    // is lost; in f32 the total 1 + (n-1) 2^-9 is exact and rounds once (to 1 + 2^-7 from n = 4).
    float const tiny = std::ldexp(1.0f, -9);
    std::vector<weft::bf16> x{weft::bf16(c.rank() == 0 ? 1.0f : tiny)};
    weft::comm::all_reduce(c, x);
    CHECK(x[0].bits() == weft::bf16(1.0f + static_cast<float>(n - 1) * tiny).bits());
    // f16 (ulp 2^-10 at 1): 2^-12 each.
    float const tiny16 = std::ldexp(1.0f, -12);
    std::vector<weft::f16> y{weft::f16(c.rank() == 0 ? 1.0f : tiny16)};
    weft::comm::all_reduce(c, y);
    CHECK(y[0].bits() == weft::f16(1.0f + static_cast<float>(n - 1) * tiny16).bits());
  }

  TEST_CASE_TEMPLATE("mpi: min and max propagate NaN (custom ops, 16-bit floats on the wire)", T,
                     float, double, weft::bf16, weft::f16) {
    auto c = communicator::world(opts());
    int const n = c.size();
    auto const nan = weft::limits<T>::quiet_NaN();
    // Element 0: NaN on the last rank; element 1: no NaN (ranks hold -r and r).
    for (auto kind : {reduce_kind::min, reduce_kind::max}) {
      std::vector<T> v{c.rank() == n - 1 ? nan : T(1.0f),
                       T(static_cast<float>(c.rank() % 2 == 0 ? -c.rank() : c.rank()))};
      weft::comm::all_reduce(c, v, kind);
      CHECK(v[0] != v[0]);  // NaN wins
      float want = 0.0f;
      for (int r = 0; r < n; ++r) {
        float const x = static_cast<float>(r % 2 == 0 ? -r : r);
        want = r == 0 ? x : (kind == reduce_kind::min ? std::min(want, x) : std::max(want, x));
      }
      CHECK(static_cast<float>(v[1]) == want);
    }
  }

  TEST_CASE("mpi: a non-contiguous tensor view is rejected before anything is communicated") {
    auto c = communicator::world(opts());
    auto m = weft::make_tensor<float>(3, 4);
    weft::fill(m.view(), 1.0f);
    auto const cols = weft::transpose(m.view(), 0, 1);  // [4, 3] with strides [1, 4]
    CHECK_THROWS_WITH_AS(weft::comm::all_reduce(c, cols), doctest::Contains("`inout`"),
                         weft::shape_error);
    CHECK(c.state() == comm_state::healthy);
    CHECK(c.history().empty());  // nothing was issued
    weft::comm::all_reduce(c, m);
    CHECK(m.data()[0] == static_cast<float>(c.size()));
  }

  TEST_CASE(
      "mpi: _v counts and sizes that overflow std::size_t are argument errors on every rank") {
    // Issue 9, item 10: {SIZE_MAX, 1, ...} summed to 0 unchecked and then offset a null pointer.
    auto c = communicator::world(opts(true));
    auto const n = static_cast<std::size_t>(c.size());
    std::size_t const max = std::numeric_limits<std::size_t>::max();
    weft::u8 dummy[1] = {0};
    auto fake = [&](std::size_t count) {
      buffer_view b = host_view(std::span<weft::u8>(dummy, 1));
      b.count = count;
      return b;
    };
    if (n >= 2) {
      std::vector<std::size_t> counts(n, 0);
      counts[0] = max;
      counts[1] = 1;
      auto const mine = counts[static_cast<std::size_t>(c.rank())];
      CHECK_THROWS_WITH_AS(c.all_gather_v(fake(mine), fake(0), counts),
                           doctest::Contains("`counts`"), weft::invalid_argument_error);
      CHECK_THROWS_WITH_AS(c.reduce_scatter_v(fake(0), fake(mine), counts),
                           doctest::Contains("`counts`"), weft::invalid_argument_error);
      CHECK_THROWS_WITH_AS(c.all_to_all_v(fake(0), fake(0), counts, counts),
                           doctest::Contains("`send_counts`"), weft::invalid_argument_error);
      // size() * count wrapping to out.count.
      std::size_t const wrap = max / n + 1;  // n * wrap overflows
      buffer_view out = fake(wrap * n);      // the wrapped product
      CHECK_THROWS_AS(c.all_gather(fake(wrap), out), weft::invalid_argument_error);
    }
    float fdummy[1] = {0.0f};
    buffer_view huge = host_view(std::span<float>(fdummy, 1));
    huge.count = max / 2;  // its bytes do not fit
    CHECK_THROWS_AS(c.all_reduce(huge, huge), weft::invalid_argument_error);
    CHECK(c.state() == comm_state::healthy);
    std::vector<float> a(4, 1.0f);
    weft::comm::all_reduce(c, a);  // still works
    CHECK(a[0] == static_cast<float>(c.size()));
  }

}  // TEST_SUITE
