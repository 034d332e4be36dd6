// Tests for weft/comm/reference.hpp: the reduction semantics every backend shares, checked against
// hand-computed known answers (accumulation of bf16/f16 in f32 with one rounding, rank order,
// integer wrap-around and truncating avg, NaN propagation, per-rank premul scalars).
#include <weft/comm/reference.hpp>
#include <weft/comm/threads/detail/kernels.hpp>
#include <weft/comm/threads/world.hpp>

#include <support/run_ranks.hpp>

#include <doctest/doctest.h>

#include <climits>
#include <cmath>
#include <cstdint>
#include <limits>
#include <span>
#include <vector>

namespace {

using weft::bf16;
using weft::f16;
using weft::comm::reduce_kind;
using weft::comm::reduce_op;

// Reduces one element per rank with the serial reference.
template <class T>
T fold(std::vector<T> const& per_rank, reduce_op op) {
  std::vector<T const*> ptrs;
  for (auto const& x : per_rank) ptrs.push_back(&x);
  T out{};
  weft::comm::reduce_reference<T>(std::span<T const* const>(ptrs), op, std::span<T>(&out, 1));
  return out;
}

template <class T>
T fold(std::vector<T> const& per_rank, std::vector<reduce_op> const& ops) {
  std::vector<T const*> ptrs;
  for (auto const& x : per_rank) ptrs.push_back(&x);
  T out{};
  weft::comm::reduce_reference<T>(std::span<T const* const>(ptrs), std::span<reduce_op const>(ops),
                                  std::span<T>(&out, 1));
  return out;
}

}  // namespace

TEST_CASE("reference: bf16 and f16 accumulate in f32 and round once") {
  // 1 + 2^-8 + 2^-8: chained bf16 adds round each partial sum back to 1 (a tie, to even); the f32
  // accumulator holds 1 + 2^-7 exactly, which bf16 represents.
  float const e8 = std::ldexp(1.0f, -8);
  bf16 const b = fold<bf16>({bf16(1.0f), bf16(e8), bf16(e8)}, reduce_kind::sum);
  CHECK(b.bits() == 0x3f81);                                   // 1.0078125
  CHECK((bf16(1.0f) + bf16(e8) + bf16(e8)).bits() == 0x3f80);  // what a naive fold would give
  float const e11 = std::ldexp(1.0f, -11);
  f16 const h = fold<f16>({f16(1.0f), f16(e11), f16(e11)}, reduce_kind::sum);
  CHECK(h.bits() == 0x3c01);  // 1 + 2^-10
  // avg of f16 {1, 2, 4}: 7/3 in f32, then one rounding: 1195 * 2^-9 = 2.333984375.
  CHECK(fold<f16>({f16(1.0f), f16(2.0f), f16(4.0f)}, reduce_kind::avg).bits() == 0x40ab);
}

TEST_CASE("reference: the fold runs in ascending rank order") {
  // (1e8 + 1) - 1e8 is 0 in f32 (1e8 + 1 rounds to 1e8); (1e8 - 1e8) + 1 would be 1.
  CHECK(fold<float>({1e8f, 1.0f, -1e8f}, reduce_kind::sum) == 0.0f);
  CHECK(fold<float>({1e8f, -1e8f, 1.0f}, reduce_kind::sum) == 1.0f);
  CHECK(fold<double>({0.1, 0.2, 0.3}, reduce_kind::sum) == (0.1 + 0.2) + 0.3);
}

TEST_CASE("reference: integer sum and prod wrap; avg truncates toward zero") {
  CHECK(fold<std::int32_t>({INT_MAX, 1}, reduce_kind::sum) == INT_MIN);
  CHECK(fold<std::uint8_t>({200, 100}, reduce_kind::sum) == 44);
  CHECK(fold<std::int64_t>({std::int64_t{1} << 62, 4}, reduce_kind::prod) == 0);
  CHECK(fold<std::uint8_t>({16, 17}, reduce_kind::prod) == 16);  // 272 mod 256
  CHECK(fold<std::int32_t>({-3, 0}, reduce_kind::avg) == -1);    // -1.5 -> -1
  CHECK(fold<std::int32_t>({3, 0}, reduce_kind::avg) == 1);
  CHECK(fold<std::int32_t>({7, 8, 9}, reduce_kind::avg) == 8);
  CHECK(fold<std::int64_t>({-7, -8}, reduce_kind::avg) == -7);
  CHECK(fold<std::uint8_t>({200, 100}, reduce_kind::avg) == 22);  // the wrapped sum 44, / 2
  CHECK(fold<std::int32_t>({5, -9, 2}, reduce_kind::min) == -9);
  CHECK(fold<std::uint8_t>({5, 255, 2}, reduce_kind::max) == 255);
}

TEST_CASE("reference: min and max propagate NaN; ties keep the earlier rank's value") {
  float const nan = std::numeric_limits<float>::quiet_NaN();
  CHECK(std::isnan(fold<float>({1.0f, nan, 3.0f}, reduce_kind::max)));
  CHECK(std::isnan(fold<float>({nan, 1.0f}, reduce_kind::min)));
  CHECK(std::isnan(fold<float>({1.0f, nan}, reduce_kind::min)));
  CHECK(fold<float>({1.0f, -2.0f, 3.0f}, reduce_kind::min) == -2.0f);
  CHECK(std::signbit(fold<float>({-0.0f, 0.0f}, reduce_kind::min)));  // equal: the first wins
  CHECK(!std::signbit(fold<float>({0.0f, -0.0f}, reduce_kind::max)));
  CHECK(fold<bf16>({bf16(2.0f), bf16(-1.0f)}, reduce_kind::min).bits() == bf16(-1.0f).bits());
  CHECK(isnan(
      fold<f16>({f16(1.0f), f16(std::numeric_limits<float>::quiet_NaN())}, reduce_kind::max)));
}

TEST_CASE("reference: premul_sum scales each rank's input by that rank's scalar") {
  CHECK(fold<float>({1.0f, 3.0f}, {reduce_op::premul(0.5), reduce_op::premul(2.0)}) == 6.5f);
  CHECK(fold<double>({1.0, 1.0, 1.0}, reduce_op::premul(0.25)) == 0.75);
  CHECK(fold<std::int32_t>({5, -2}, {reduce_op::premul(3.0), reduce_op::premul(2.0)}) == 11);
  // The scalar is rounded to the accumulator type (f32 for bf16) before multiplying.
  float const third = static_cast<float>(1.0 / 3.0);
  CHECK(fold<bf16>({bf16(3.0f)}, reduce_op::premul(1.0 / 3.0)).bits() == bf16(third * 3.0f).bits());
  CHECK(fold<float>({1.0f, 2.0f}, reduce_kind::avg) == 1.5f);
}

TEST_CASE("reference: validate_reduce_op rejects what no backend can apply") {
  using weft::dtype;
  CHECK_NOTHROW(weft::comm::validate_reduce_op(reduce_op::premul(-3.0), dtype::i32));
  CHECK_NOTHROW(weft::comm::validate_reduce_op(reduce_op::premul(0.5), dtype::f32));
  CHECK_NOTHROW(weft::comm::validate_reduce_op(reduce_kind::avg, dtype::u8));
  CHECK_THROWS_WITH_AS(weft::comm::validate_reduce_op(reduce_op::premul(0.5), dtype::u8),
                       doctest::Contains("an integer representable in u8"),
                       weft::invalid_argument_error);
  CHECK_THROWS_AS(weft::comm::validate_reduce_op(reduce_op::premul(300.0), dtype::u8),
                  weft::invalid_argument_error);
  CHECK_THROWS_AS(weft::comm::validate_reduce_op(reduce_op::premul(-1.0), dtype::u8),
                  weft::invalid_argument_error);
  CHECK_THROWS_AS(
      weft::comm::validate_reduce_op(reduce_op::premul(std::ldexp(1.0, 63)), dtype::i64),
      weft::invalid_argument_error);
  CHECK_THROWS_AS(weft::comm::validate_reduce_op(reduce_op::premul(NAN), dtype::i32),
                  weft::invalid_argument_error);
  CHECK_THROWS_WITH_AS(
      weft::comm::validate_reduce_op(reduce_op{static_cast<reduce_kind>(9)}, dtype::f32),
      doctest::Contains("op.kind"), weft::invalid_argument_error);
  std::vector<float> const a{1.0f};
  std::vector<float const*> ptrs{a.data(), a.data()};
  std::vector<reduce_op> ops{reduce_kind::sum, reduce_kind::max};
  float out = 0.0f;
  CHECK_THROWS_AS(weft::comm::reduce_reference<float>(std::span<float const* const>(ptrs),
                                                      std::span<reduce_op const>(ops),
                                                      std::span<float>(&out, 1)),
                  weft::invalid_argument_error);
}

TEST_CASE(
    "reference: a premul_sum scale must be finite in the accumulator type (NaN, inf rejected)") {
  using weft::dtype;
  for (dtype t : {dtype::f32, dtype::f64, dtype::bf16, dtype::f16}) {
    CAPTURE(t);
    CHECK_THROWS_WITH_AS(weft::comm::validate_reduce_op(reduce_op::premul(NAN), t),
                         doctest::Contains("a finite premul_sum scale"),
                         weft::invalid_argument_error);
    CHECK_THROWS_AS(weft::comm::validate_reduce_op(reduce_op::premul(INFINITY), t),
                    weft::invalid_argument_error);
    CHECK_THROWS_AS(weft::comm::validate_reduce_op(reduce_op::premul(-INFINITY), t),
                    weft::invalid_argument_error);
    CHECK_NOTHROW(weft::comm::validate_reduce_op(reduce_op::premul(-0.25), t));
  }
  // 1e300 is a finite double but inf once converted to f32's accumulator.
  CHECK_THROWS_AS(weft::comm::validate_reduce_op(reduce_op::premul(1e300), dtype::f32),
                  weft::invalid_argument_error);
  CHECK_NOTHROW(weft::comm::validate_reduce_op(reduce_op::premul(1e300), dtype::f64));
  // The reference and the threads backend reject it before anything is computed or communicated.
  std::vector<float> const a{1.0f};
  std::vector<float const*> ptrs{a.data()};
  float out = 7.0f;
  CHECK_THROWS_AS(
      weft::comm::reduce_reference<float>(std::span<float const* const>(ptrs),
                                          reduce_op::premul(NAN), std::span<float>(&out, 1)),
      weft::invalid_argument_error);
  CHECK(out == 7.0f);
  weft::test::run_ranks(2, [](weft::comm::threads::communicator& c) {
    std::vector<float> in(4, 1.0f);
    std::vector<float> res(4, 7.0f);
    CHECK_THROWS_WITH_AS(
        c.all_reduce(weft::comm::host_view(std::span<float>(in)),
                     weft::comm::host_view(std::span<float>(res)), reduce_op::premul(NAN)),
        doctest::Contains("op.scalar"), weft::invalid_argument_error);
    CHECK(res == std::vector<float>(4, 7.0f));
    CHECK(c.state() == weft::comm::comm_state::healthy);
  });
}

TEST_CASE("reference: the threads backend's blocked kernel equals the element-wise fold") {
  // Many ranks (the heap path above 64), counts across block boundaries, every kind.
  for (int n : {1, 3, 70}) {
    for (std::size_t count :
         {std::size_t{1}, std::size_t{511}, std::size_t{513}, std::size_t{1500}}) {
      for (auto kind : {reduce_kind::sum, reduce_kind::prod, reduce_kind::min, reduce_kind::max,
                        reduce_kind::avg, reduce_kind::premul_sum}) {
        CAPTURE(n);
        CAPTURE(count);
        std::vector<std::vector<bf16>> in(static_cast<std::size_t>(n), std::vector<bf16>(count));
        std::vector<double> scalars;
        std::vector<reduce_op> ops;
        for (int r = 0; r < n; ++r) {
          for (std::size_t i = 0; i < count; ++i)
            in[static_cast<std::size_t>(r)][i] =
                bf16(0.75f + static_cast<float>((r * 131 + static_cast<int>(i) * 7) % 97) / 193.0f);
          scalars.push_back(1.0 / (r + 2));
          ops.push_back(reduce_op{kind, scalars.back()});
        }
        std::vector<bf16 const*> ptrs;
        std::vector<std::byte const*> bytes;
        for (auto const& v : in) {
          ptrs.push_back(v.data());
          bytes.push_back(reinterpret_cast<std::byte const*>(v.data()));
        }
        std::vector<bf16> want(count);
        std::vector<bf16> got(count);
        weft::comm::reduce_reference<bf16>(std::span<bf16 const* const>(ptrs),
                                           std::span<reduce_op const>(ops), std::span<bf16>(want));
        weft::comm::threads::detail::reduce_bytes(weft::dtype::bf16, kind,
                                                  reinterpret_cast<std::byte*>(got.data()),
                                                  bytes.data(), scalars.data(), n, count);
        bool same = true;
        for (std::size_t i = 0; i < count; ++i) same = same && got[i].bits() == want[i].bits();
        CHECK(same);
      }
    }
  }
}

TEST_CASE("reference: balanced_part splits any count over any rank count") {
  using weft::comm::threads::detail::balanced_part;
  for (std::size_t count :
       {std::size_t{0}, std::size_t{1}, std::size_t{7}, std::size_t{8}, std::size_t{7919}}) {
    for (int n = 1; n <= 9; ++n) {
      std::size_t next = 0;
      for (int r = 0; r < n; ++r) {
        auto const p = balanced_part(count, n, r);
        CHECK(p.offset == next);
        CHECK(p.count + 1 >=
              (count + static_cast<std::size_t>(n) - 1) / static_cast<std::size_t>(n));
        next += p.count;
      }
      CHECK(next == count);
    }
  }
}
