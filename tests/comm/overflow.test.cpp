// tests/comm/overflow.test.cpp — size arithmetic on user counts is checked (issue 9, item 10):
// `_v` counts whose sum (or whose sum in bytes) does not fit in std::size_t, and counts whose
// product with the world size wraps, are invalid_argument_errors naming the argument on every
// rank, before anything is communicated; the communicator stays healthy.
#include "support/checks.hpp"
#include <weft/comm/detail/checked.hpp>
#include <weft/comm/threads/world.hpp>

#include <support/run_ranks.hpp>

#include <doctest/doctest.h>

#include <atomic>
#include <cstddef>
#include <limits>
#include <span>
#include <string>
#include <vector>

namespace {
using weft::test::has;

using weft::comm::buffer_view;
using weft::comm::host_view;
using weft::comm::threads::communicator;
constexpr std::size_t size_max = std::numeric_limits<std::size_t>::max();

// A view claiming `count` elements of f32 at a real (small) buffer: never read, since the
// arguments are rejected first.
buffer_view fake(float* p, std::size_t count) {
  buffer_view b = host_view(std::span<float>(p, 1));
  b.count = count;
  return b;
}

}  // namespace

TEST_CASE("checked: add, mul, bytes and offsets throw invalid_argument_error naming the argument") {
  using namespace weft::comm::detail;
  CHECK(checked_add(2, 3, "x") == 5);
  CHECK(checked_mul(size_max / 2, 2, "x") == size_max - 1);
  CHECK_THROWS_AS(checked_add(size_max, 1, "a + b"), weft::invalid_argument_error);
  CHECK_THROWS_AS(checked_mul(size_max / 2 + 1, 2, "a * b"), weft::invalid_argument_error);
  CHECK(checked_bytes(size_max / 4, weft::dtype::f32, "n") == (size_max / 4) * 4);
  CHECK_THROWS_AS(checked_bytes(size_max / 4 + 1, weft::dtype::f32, "n"),
                  weft::invalid_argument_error);
  std::vector<std::size_t> const ok{1, 2, 3};
  CHECK(checked_offsets(ok, weft::dtype::f64, "counts") == std::vector<std::size_t>{0, 1, 3, 6});
  std::vector<std::size_t> const wraps{size_max, 1};  // sums to 0 unchecked
  try {
    (void)checked_sum(wraps, weft::dtype::u8, "counts");
    FAIL("the sum wrapped silently");
  } catch (weft::invalid_argument_error const& e) {
    CHECK(has(e.what(), "argument `counts`"));
    CHECK(has(e.what(), "expected"));
    CHECK(has(e.what(), "actual"));
  }
  // Fits in elements, not in bytes.
  std::vector<std::size_t> const big{size_max / 8, size_max / 8 + 1};
  CHECK_THROWS_AS((void)checked_sum(big, weft::dtype::f64, "counts"), weft::invalid_argument_error);
  CHECK(checked_sum(big, weft::dtype::u8, "counts") == big[0] + big[1]);  // no overflow in u8
}

TEST_SUITE("threads") {
  TEST_CASE("threads: _v counts that overflow are rejected on every rank before communicating") {
    // u8, so that every single count is a valid buffer size and only the sum overflows.
    for (int n : {2, 3}) {
      CAPTURE(n);
      std::atomic<int> rejected{0};
      weft::test::run_ranks(n, [&](communicator& c) {
        auto const un = static_cast<std::size_t>(n);
        unsigned char dummy[1] = {0};
        auto fake8 = [&](std::size_t count) {
          buffer_view b = host_view(std::span<unsigned char>(dummy, 1));
          b.count = count;
          return b;
        };
        // counts {SIZE_MAX, 1, 0, ...}: the unchecked sum is 0.
        std::vector<std::size_t> counts(un, 0);
        counts[0] = size_max;
        counts[1] = 1;
        auto const mine = counts[static_cast<std::size_t>(c.rank())];
        auto expect_counts_error = [&](auto&& f, char const* arg) {
          try {
            f();
            FAIL_CHECK("accepted overflowing " << arg);
          } catch (weft::invalid_argument_error const& e) {
            CHECK(has(e.what(), std::string("argument `") + arg + "`"));
            CHECK(has(e.what(), "overflows"));
            ++rejected;
          }
        };
        expect_counts_error([&] { c.all_gather_v(fake8(mine), fake8(0), counts); }, "counts");
        expect_counts_error([&] { c.reduce_scatter_v(fake8(0), fake8(mine), counts); }, "counts");
        expect_counts_error([&] { c.all_to_all_v(fake8(0), fake8(0), counts, counts); },
                            "send_counts");
        CHECK(c.state() == weft::comm::comm_state::healthy);
        // The communicator is still usable: the checks communicated nothing.
        std::vector<float> v(4, 1.0f);
        c.all_reduce(host_view(std::span<float>(v)), host_view(std::span<float>(v)));
        CHECK(v[0] == static_cast<float>(n));
      });
      CHECK(rejected.load() == 3 * n);
    }
  }

  TEST_CASE("threads: size() * count that wraps around is rejected, not taken as a match") {
    // 4 * 2^62 == 0 (mod 2^64); u8 so that the count alone is a valid buffer size.
    weft::test::run_ranks(4, [&](communicator& c) {
      unsigned char dummy[1] = {0};
      buffer_view in = host_view(std::span<unsigned char>(dummy, 1));
      in.count = std::size_t{1} << 62;
      buffer_view out = host_view(std::span<unsigned char>(dummy, 1));
      out.count = 0;
      CHECK_THROWS_AS(c.all_gather(in, out), weft::invalid_argument_error);
      CHECK_THROWS_AS(c.reduce_scatter(out, in), weft::invalid_argument_error);
      // gather checks `out` on the root only (it is ignored elsewhere).
      if (c.rank() == 0) CHECK_THROWS_AS(c.gather(in, out, 0), weft::invalid_argument_error);
      CHECK(c.state() == weft::comm::comm_state::healthy);
      c.barrier();
    });
  }

  TEST_CASE("threads: a buffer whose bytes do not fit in std::size_t is rejected") {
    weft::test::run_ranks(2, [&](communicator& c) {
      float dummy[1] = {0.0f};
      auto const b = fake(dummy, size_max / 2);  // * 4 bytes wraps
      CHECK_THROWS_AS(c.all_reduce(b, b), weft::invalid_argument_error);
      CHECK_THROWS_AS(c.broadcast(b, b, 0), weft::invalid_argument_error);
      CHECK(c.state() == weft::comm::comm_state::healthy);
      c.barrier();
    });
  }

}  // TEST_SUITE("threads")
