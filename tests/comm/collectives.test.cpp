// Tests for weft/comm/collectives.hpp: the typed collectives over weft tensors, owning tensors and
// contiguous ranges, in-place and out-of-place; non-contiguous views rejected with a clear error
// before anything is communicated; wrong memory spaces and element types rejected at compile time.
#include <weft/comm/collectives.hpp>
#include <weft/comm/threads/world.hpp>
#include <weft/core/tensor.hpp>

#include <support/run_ranks.hpp>

#include <doctest/doctest.h>

#include <array>
#include <numeric>
#include <span>
#include <vector>

namespace {

using weft::comm::threads::communicator;
namespace comm = weft::comm;

// Compile-time contract: the communicator's memory space and matching element types.
template <class C, class In, class Out>
concept can_all_reduce = requires(C& c, In in, Out out) {
  comm::all_reduce(c, in, out);
};

static_assert(can_all_reduce<communicator, std::vector<float>&, std::vector<float>&>);
static_assert(
    can_all_reduce<communicator, weft::tensor_view<float const, 2>, weft::tensor_view<float, 1>>);
static_assert(!can_all_reduce<communicator, std::vector<float>&, std::vector<double>&>);
static_assert(!can_all_reduce<communicator, std::vector<float>&, std::vector<float> const&>);
static_assert(!can_all_reduce<communicator, weft::tensor_view<float, 1, weft::cuda_space>,
                              weft::tensor_view<float, 1, weft::cuda_space>>);
static_assert(!can_all_reduce<communicator, std::vector<long long>&, std::vector<long long>&>);
static_assert(comm::Buffer<weft::tensor<weft::bf16, 3>&>);
static_assert(comm::BufferIn<weft::tensor_view<float, 1, weft::cuda_space>, weft::cuda_space>);

}  // namespace

TEST_CASE("collectives: buffer_of describes views, owning tensors and ranges") {
  auto t = weft::make_tensor<weft::bf16>(2, 3);
  auto const b = comm::buffer_of(t);
  CHECK(b.data == t.data());
  CHECK(b.count == 6);
  CHECK(b.type == weft::dtype::bf16);
  CHECK(b.where == comm::memory_kind::host);
  std::array<std::int64_t, 4> a{};
  CHECK(comm::buffer_of(a).count == 4);
  CHECK(comm::buffer_of(a).type == weft::dtype::i64);
  weft::tensor_view<float, 2, weft::cuda_space> dev(reinterpret_cast<float*>(16), 4, 4);
  CHECK(comm::buffer_of(dev).where == comm::memory_kind::cuda);
  // A strided view that happens to be contiguous is accepted; a transposed one is not.
  auto f = weft::make_tensor<float>(3, 4);
  CHECK(comm::buffer_of(weft::as_strided(f.view())).count == 12);
  CHECK_THROWS_WITH_AS(
      (void)comm::buffer_of(weft::transpose(f.view(), 0, 1), "in"),
      doctest::Contains("argument `in`: expected a row-major contiguous view, actual "
                        "extents [4, 3] with strides [1, 4]"),
      weft::shape_error);
  CHECK_THROWS_AS((void)comm::sub_buffer(comm::buffer_of(f), 10, 3), weft::shape_error);
}

TEST_SUITE("threads") {
  TEST_CASE("collectives: typed calls over tensors and vectors, in-place and out-of-place") {
    for (int n : {1, 2, 3}) {
      CAPTURE(n);
      weft::test::run_ranks(n, [n](communicator& c) {
        auto const un = static_cast<std::size_t>(n);
        int const r = c.rank();
        // all_reduce: owning tensor in place; const vector to a view.
        auto t = weft::make_tensor<float>(2, 3);
        weft::fill(t.view(), static_cast<float>(r + 1));
        comm::all_reduce(c, t);
        CHECK(t.data()[5] == static_cast<float>(n * (n + 1) / 2));
        std::vector<int> const cin(4, r);
        auto out = weft::make_tensor<int>(4);
        comm::all_reduce(c, cin, out.view(), comm::reduce_kind::max);
        CHECK(out.data()[0] == n - 1);
        // reduce in place and out of place.
        std::vector<double> d(3, 1.0);
        comm::reduce(c, d, 0, comm::reduce_kind::sum);
        if (r == 0) CHECK(d[2] == static_cast<double>(n));
        std::vector<double> dout(3);
        comm::reduce(c, std::vector<double>(3, 2.0), dout, n - 1);
        if (r == n - 1) CHECK(dout[0] == 2.0 * n);
        // broadcast in place.
        std::vector<weft::bf16> b(5, weft::bf16(static_cast<float>(r)));
        comm::broadcast(c, b, n - 1);
        CHECK(static_cast<float>(b[4]) == static_cast<float>(n - 1));
        // all_gather: out-of-place and the in-place form (own block already in place).
        std::vector<int> g(2 * un, -1);
        comm::all_gather(c, std::array<int, 2>{r, r}, g);
        for (std::size_t s = 0; s < un; ++s) CHECK(g[2 * s + 1] == static_cast<int>(s));
        std::vector<int> gi(2 * un, -1);
        gi[2 * static_cast<std::size_t>(r)] = 10 * r;
        gi[2 * static_cast<std::size_t>(r) + 1] = 10 * r + 1;
        comm::all_gather(c, gi);
        for (std::size_t s = 0; s < un; ++s) CHECK(gi[2 * s + 1] == 10 * static_cast<int>(s) + 1);
        // reduce_scatter in place: block r of the sum lands at block r.
        std::vector<float> rs(2 * un);
        std::iota(rs.begin(), rs.end(), 0.0f);
        comm::reduce_scatter(c, rs);
        CHECK(rs[2 * static_cast<std::size_t>(r)] == static_cast<float>(n * 2 * r));
        // all_to_all in place.
        std::vector<int> aa(un);
        for (std::size_t s = 0; s < un; ++s) aa[s] = 100 * r + static_cast<int>(s);
        comm::all_to_all(c, aa);
        for (std::size_t s = 0; s < un; ++s) CHECK(aa[s] == 100 * static_cast<int>(s) + r);
        // _v variants and rooted data movement.
        std::vector<std::size_t> counts(un);
        for (std::size_t s = 0; s < un; ++s) counts[s] = s + 1;
        std::vector<int> mine(static_cast<std::size_t>(r) + 1, r);
        std::vector<int> gv(un * (un + 1) / 2);
        comm::all_gather_v(c, mine, gv, counts);
        CHECK(gv.back() == n - 1);
        std::vector<int> sc(1);
        std::vector<int> root_in(un);
        std::iota(root_in.begin(), root_in.end(), 7);
        comm::scatter(c, root_in, sc, 0);
        CHECK(sc[0] == 7 + r);
        std::vector<int> ga(un);
        comm::gather(c, sc, ga, 0);
        if (r == 0) CHECK(ga == root_in);
        comm::barrier(c);
        // Point-to-point, typed.
        if (n >= 2 && r < 2) {
          std::vector<std::uint8_t> msg(3, static_cast<std::uint8_t>(r + 1));
          std::vector<std::uint8_t> got(3);
          auto rw = comm::irecv(c, got, 1 - r);
          auto sw = comm::isend(c, msg, 1 - r);
          sw.wait();
          rw.wait();
          CHECK(got[0] == 2 - r);
        }
      });
    }
  }

  TEST_CASE("collectives: a non-contiguous view is rejected before anything is communicated") {
    weft::test::run_ranks(3, [](communicator& c) {
      auto m = weft::make_tensor<float>(3, 4);
      weft::fill(m.view(), 1.0f);
      auto const cols = weft::transpose(m.view(), 0, 1);  // [4, 3] with strides [1, 4]
      CHECK_THROWS_WITH_AS(comm::all_reduce(c, cols), doctest::Contains("`inout`"),
                           weft::shape_error);
      std::vector<float> out(12);
      CHECK_THROWS_WITH_AS(comm::all_reduce(c, cols, out), doctest::Contains("argument `in`"),
                           weft::shape_error);
      auto const strided_rows = weft::slice(m.view(), 1, 0, 2);  // [3, 2] with strides [4, 1]
      CHECK_THROWS_AS(comm::broadcast(c, strided_rows, 0), weft::shape_error);
      CHECK(c.state() == comm::comm_state::healthy);
      CHECK(c.history().empty());  // nothing was issued
      comm::all_reduce(c, m);      // still usable
      CHECK(m.data()[0] == 3.0f);
    });
  }

}  // TEST_SUITE("threads")
