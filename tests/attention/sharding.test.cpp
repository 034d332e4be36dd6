// Tests of the sequence layouts: the index maps against hand-written tables (zigzag and stripe as
// in ring-flash-attention's tests), bijectivity, extract_local/restore_global round trips, and
// errors.
#include <weft/attention/sharding.hpp>

#include "attention_testing.hpp"

#include <doctest/doctest.h>

#include <algorithm>
#include <vector>

namespace wa = weft::attention;
using namespace attention_testing;

TEST_CASE("layout positions match the published definitions") {
  // S = 8, N = 2. zigzag: 4 chunks of 2; rank 0 holds chunks 0 and 3, rank 1 chunks 1 and 2.
  auto const z = wa::seq_layout::zigzag(2, 8);
  CHECK(z.positions(0) == std::vector<std::int64_t>{0, 1, 6, 7});
  CHECK(z.positions(1) == std::vector<std::int64_t>{2, 3, 4, 5});
  auto const s = wa::seq_layout::stripe(2, 8);
  CHECK(s.positions(0) == std::vector<std::int64_t>{0, 2, 4, 6});
  CHECK(s.positions(1) == std::vector<std::int64_t>{1, 3, 5, 7});
  auto const c = wa::seq_layout::contiguous(2, 8);
  CHECK(c.positions(1) == std::vector<std::int64_t>{4, 5, 6, 7});
  // USP u = 2 over a zigzag ring of 2: ring rank 0's chunk {0,1,6,7} is cut in two pieces.
  auto const u = wa::seq_layout::usp(2, 2, wa::layout_kind::zigzag, 8);
  CHECK(u.positions(0) == std::vector<std::int64_t>{0, 1});
  CHECK(u.positions(1) == std::vector<std::int64_t>{6, 7});
  CHECK(u.positions(2) == std::vector<std::int64_t>{2, 3});
  CHECK(u.positions(3) == std::vector<std::int64_t>{4, 5});
}

TEST_CASE("layouts are bijections and extract/restore round-trip") {
  std::vector<wa::seq_layout> lays;
  for (int n : {1, 2, 3, 4, 8}) {
    lays.push_back(wa::seq_layout::contiguous(n, 6 * n));
    lays.push_back(wa::seq_layout::zigzag(n, 2 * n * 3));
    lays.push_back(wa::seq_layout::stripe(n, 5 * n));
  }
  lays.push_back(wa::seq_layout::usp(2, 2, wa::layout_kind::zigzag, 24));
  lays.push_back(wa::seq_layout::usp(4, 2, wa::layout_kind::zigzag, 32));
  lays.push_back(wa::seq_layout::usp(3, 2, wa::layout_kind::stripe, 24));
  lays.push_back(wa::seq_layout::usp(2, 3, wa::layout_kind::contiguous, 12));
  for (auto const& lay : lays) {
    CAPTURE(wa::to_string(lay.kind()));
    CAPTURE(lay.world());
    CAPTURE(lay.ulysses_degree());
    std::vector<int> seen(static_cast<std::size_t>(lay.seq()), 0);
    for (int r = 0; r < lay.world(); ++r)
      for (auto p : lay.positions(r)) ++seen[static_cast<std::size_t>(p)];
    CHECK(std::all_of(seen.begin(), seen.end(), [](int x) { return x == 1; }));

    std::int64_t const B = 2, H = 3, D = 2;
    auto x = random_tensor<double>(5, 1.0, B, lay.seq(), H, D);
    auto back = filled_tensor<double>(0.0, B, lay.seq(), H, D);
    auto lse = random_tensor<float>(6, 1.0, B, H, lay.seq());
    auto lse_back = filled_tensor<float>(0.0, B, H, lay.seq());
    for (int r = 0; r < lay.world(); ++r) {
      auto loc = make_owned<double>(B, lay.local_length(), H, D);
      wa::extract_local(lay, r, x.view(), loc.view());
      auto pos = lay.positions(r);
      CHECK(loc.view()(1, 0, 2, 1) == x.view()(1, pos[0], 2, 1));
      wa::restore_global(lay, r, loc.view(), back.view());
      auto lloc = make_owned<float>(B, H, lay.local_length());
      wa::extract_local(lay, r, lse.view(), lloc.view(), 2);
      wa::restore_global(lay, r, lloc.view(), lse_back.view(), 2);
    }
    CHECK(x.buf == back.buf);
    CHECK(lse.buf == lse_back.buf);
  }
}

TEST_CASE("layouts reject lengths they cannot split, and bad ranks") {
  CHECK_THROWS_WITH_AS(wa::seq_layout::zigzag(4, 12), doctest::Contains("a multiple of 8"),
                       weft::invalid_argument_error);
  CHECK_THROWS_AS(wa::seq_layout::stripe(3, 10), weft::invalid_argument_error);
  CHECK_THROWS_AS(wa::seq_layout::contiguous(0, 10), weft::invalid_argument_error);
  auto const z = wa::seq_layout::zigzag(2, 8);
  CHECK_THROWS_WITH_AS((void)z.positions(2), doctest::Contains("argument `rank`"),
                       weft::invalid_argument_error);
  auto g = make_owned<float>(1, 8, 1, 1);
  auto l = make_owned<float>(1, 3, 1, 1);
  CHECK_THROWS_AS(wa::extract_local(z, 0, g.view(), l.view()), weft::shape_error);
}
