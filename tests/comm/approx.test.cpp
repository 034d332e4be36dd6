// tests/comm/approx.test.cpp — the shared comparison helper (tests/support/approx.hpp) that the
// comm suites use: bitwise, relative + absolute and ulp tolerances, NaN and infinities by kind,
// and a report naming the first mismatches.
#include "support/checks.hpp"
#include <support/approx.hpp>

#include <doctest/doctest.h>

#include <cmath>
#include <limits>
#include <string>
#include <vector>

namespace {
using weft::test::has;

using weft::test::compare;
using weft::test::tolerance;
using weft::test::ulp_distance;

}  // namespace

TEST_CASE("approx: ulp distance counts representable values, across zero and for 16-bit floats") {
  CHECK(ulp_distance(1.0f, 1.0f) == 0);
  CHECK(ulp_distance(1.0f, std::nextafter(1.0f, 2.0f)) == 1);
  CHECK(ulp_distance(-0.0f, 0.0f) == 0);
  float const tiny = std::numeric_limits<float>::denorm_min();
  CHECK(ulp_distance(-tiny, tiny) == 2);  // -tiny, (-0 == +0), +tiny
  CHECK(ulp_distance(1.0, std::nextafter(std::nextafter(1.0, 2.0), 2.0)) == 2);
  // bf16 has 8 significand bits: 1 + 2^-7 is the next value after 1.
  CHECK(ulp_distance(weft::bf16(1.0f), weft::bf16(1.0f + 1.0f / 128.0f)) == 1);
  CHECK(ulp_distance(weft::f16(1.0f), weft::f16(1.0f + 1.0f / 1024.0f)) == 1);
  CHECK(ulp_distance(std::int32_t{-3}, std::int32_t{4}) == 7);
  CHECK(ulp_distance(std::nanf(""), 1.0f) == std::numeric_limits<std::uint64_t>::max());
}

TEST_CASE("approx: tolerances, NaN and infinities") {
  float const nan = std::numeric_limits<float>::quiet_NaN();
  float const inf = std::numeric_limits<float>::infinity();
  CHECK(weft::test::close(nan, nan, tolerance::within(0.1)));
  CHECK_FALSE(weft::test::close(nan, 1.0f, tolerance::within(1e30)));
  CHECK_FALSE(weft::test::close(1.0f, nan, tolerance::ulp(1000)));
  CHECK(weft::test::close(inf, inf, tolerance::within(0.0)));
  CHECK_FALSE(weft::test::close(inf, -inf, tolerance::within(1e30)));
  CHECK_FALSE(weft::test::close(inf, 3e38f, tolerance::within(1.0)));
  CHECK(weft::test::close(1.001f, 1.0f, tolerance::within(2e-3)));
  CHECK_FALSE(weft::test::close(1.01f, 1.0f, tolerance::within(2e-3)));
  CHECK(weft::test::close(1e-9f, 0.0f, tolerance::within(0.0, 1e-8)));
  CHECK(weft::test::close(std::nextafter(1.0f, 2.0f), 1.0f, tolerance::ulp(1)));
  CHECK_FALSE(weft::test::close(std::nextafter(1.0f, 2.0f), 1.0f, tolerance::exact()));
  CHECK_FALSE(weft::test::close(-0.0f, 0.0f, tolerance::exact()));  // bitwise tells zeros apart
  CHECK(weft::test::close(-0.0f, 0.0f, tolerance::within(0.0)));
}

TEST_CASE(
    "approx: the report names the count and the first mismatches with index, expected, actual") {
  std::vector<float> want(100, 1.0f);
  std::vector<float> got = want;
  for (std::size_t i : {3u, 17u, 18u, 40u, 41u, 42u, 99u}) got[i] = 2.0f;
  auto const r = compare(got, want, tolerance::within(1e-6), 3);
  CHECK_FALSE(r.ok());
  CHECK(r.failed == 7);
  CHECK(r.first.size() == 3);
  CHECK(r.first[0].index == 3);
  CHECK(r.first[2].index == 18);
  CHECK(r.max_abs == 1.0);
  std::string const text = r.report("all_reduce rank 1");
  INFO(text);
  CHECK(has(text, "all_reduce rank 1: 7 of 100 elements differ"));
  CHECK(has(text, "[3] expected 1 (bits 0x3f800000), got 2 (bits 0x40000000)"));
  CHECK_FALSE(has(text, "[40]"));
  auto const sizes = compare(std::vector<float>(3), std::vector<float>(4), tolerance::exact());
  CHECK_FALSE(sizes.ok());
  CHECK(has(sizes.report("x"), "got 3 elements, expected 4"));
  CHECK(compare(want, want, tolerance::exact()).ok());
}
