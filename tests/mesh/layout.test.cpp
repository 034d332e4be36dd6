// Tests for weft/mesh/layout.hpp: the pure mesh arithmetic against independent references — an
// odometer for row-major order, PyTorch's permute/reshape and swapdims rules, a line-by-line port
// of Megatron's generate_masked_orthogonal_rank_groups — and the golden tables of the reference
// note (shared/reference/collectives_mesh.md §1.3, §1.4).
#include <weft/mesh/layout.hpp>

#include <doctest/doctest.h>

#include <algorithm>
#include <string>
#include <vector>

namespace {

using groups_t = std::vector<std::vector<int>>;
using weft::mesh::layout;

// The shapes of checklist item B.1.
std::vector<std::vector<int>> const test_shapes = {
    {1}, {8}, {2, 4}, {4, 2}, {2, 2, 2}, {3, 1, 2}, {1, 1, 1, 8}, {2, 3}, {5, 1}, {2, 3, 4}};

int product(std::vector<int> const& v) {
  int p = 1;
  for (int x : v) p *= x;
  return p;
}

// Row-major enumeration by an odometer: increment the last coordinate, carry leftwards.
std::vector<std::vector<int>> odometer(std::vector<int> const& shape) {
  std::vector<std::vector<int>> out;
  std::vector<int> c(shape.size(), 0);
  for (int n = product(shape); n > 0; --n) {
    out.push_back(c);
    for (std::size_t i = shape.size(); i-- > 0;) {
      if (++c[i] < shape[i]) break;
      c[i] = 0;
    }
  }
  return out;
}

// arange(n).view(shape).permute(perm).reshape(-1, row): the permuted array is walked by an
// odometer over the permuted shape and read through explicit strides of the original.
groups_t permute_reshape(std::vector<int> const& shape, std::vector<int> const& perm, int row_len) {
  std::vector<int> stride(shape.size());
  int s = 1;
  for (std::size_t i = shape.size(); i-- > 0;) {
    stride[i] = s;
    s *= shape[i];
  }
  std::vector<int> pshape;
  for (int p : perm) pshape.push_back(shape[static_cast<std::size_t>(p)]);
  groups_t out;
  std::vector<int> row;
  for (auto const& pc : odometer(pshape)) {
    int value = 0;
    for (std::size_t i = 0; i < perm.size(); ++i)
      value += pc[i] * stride[static_cast<std::size_t>(perm[i])];
    row.push_back(value);
    if (static_cast<int>(row.size()) == row_len) {
      out.push_back(row);
      row.clear();
    }
  }
  return out;
}

// PyTorch's _flatten rule: permute(rest..., dims...).reshape(-1, prod(dims)), with `rest` the
// other axes in mesh order.
groups_t torch_flatten(std::vector<int> const& shape, std::vector<int> const& dims) {
  std::vector<int> perm;
  for (int d = 0; d < static_cast<int>(shape.size()); ++d)
    if (std::find(dims.begin(), dims.end(), d) == dims.end()) perm.push_back(d);
  perm.insert(perm.end(), dims.begin(), dims.end());
  int members = 1;
  for (int d : dims) members *= shape[static_cast<std::size_t>(d)];
  return permute_reshape(shape, perm, members);
}

// PyTorch's per-axis rule: mesh.swapdims(-1, d).reshape(-1, shape[d]). The swap moves the last
// axis into d's place, so its groups come in another order than weft's colors: compare sorted.
groups_t torch_swapdims(std::vector<int> const& shape, int d) {
  std::vector<int> perm(shape.size());
  for (std::size_t i = 0; i < perm.size(); ++i) perm[i] = static_cast<int>(i);
  std::swap(perm.back(), perm[static_cast<std::size_t>(d)]);
  return permute_reshape(shape, perm, shape[static_cast<std::size_t>(d)]);
}

groups_t sorted(groups_t g) {
  std::sort(g.begin(), g.end());
  return g;
}

// A port of Megatron-LM's generate_masked_orthogonal_rank_groups (megatron/core/parallel_state.py):
// parallel_size and mask are in order-string order, fastest first.
groups_t megatron_groups(int world_size, std::vector<int> const& parallel_size,
                         std::vector<bool> const& mask) {
  auto prefix_product = [](std::vector<int> const& a) {
    std::vector<int> r{1};
    int init = 1;
    for (int v : a) {
      init *= v;
      r.push_back(init);
    }
    return r;
  };
  auto inner_product = [](std::vector<int> const& a, std::vector<int> const& b) {
    int sum = 0;
    for (std::size_t i = 0; i < std::min(a.size(), b.size()); ++i) sum += a[i] * b[i];
    return sum;
  };
  auto decompose = [&](int index, std::vector<int> const& shape) {
    std::vector<int> const stride = prefix_product(shape);
    std::vector<int> idx;
    for (std::size_t i = 0; i < shape.size(); ++i) idx.push_back((index / stride[i]) % shape[i]);
    REQUIRE(inner_product(idx, stride) == index);
    return idx;
  };
  std::vector<int> masked_shape, unmasked_shape, masked_stride, unmasked_stride;
  std::vector<int> const global_stride = prefix_product(parallel_size);
  for (std::size_t i = 0; i < parallel_size.size(); ++i) {
    (mask[i] ? masked_shape : unmasked_shape).push_back(parallel_size[i]);
    (mask[i] ? masked_stride : unmasked_stride).push_back(global_stride[i]);
  }
  int const group_size = prefix_product(masked_shape).back();
  int const num_of_group = world_size / group_size;
  groups_t ranks;
  for (int group_index = 0; group_index < num_of_group; ++group_index) {
    std::vector<int> const group_idx = decompose(group_index, unmasked_shape);
    std::vector<int> rank;
    for (int rank_in_group = 0; rank_in_group < group_size; ++rank_in_group) {
      std::vector<int> const rank_idx = decompose(rank_in_group, masked_shape);
      rank.push_back(inner_product(rank_idx, masked_stride) +
                     inner_product(group_idx, unmasked_stride));
    }
    ranks.push_back(rank);
  }
  return ranks;
}

// Every ordered selection of distinct axes (all subsets in all orders) of an ndim-axis mesh.
std::vector<std::vector<int>> all_dim_lists(int ndim) {
  std::vector<std::vector<int>> out;
  for (unsigned m = 1; m < (1u << ndim); ++m) {
    std::vector<int> dims;
    for (int d = 0; d < ndim; ++d)
      if (m & (1u << d)) dims.push_back(d);
    do out.push_back(dims);
    while (std::next_permutation(dims.begin(), dims.end()));
  }
  return out;
}

}  // namespace

TEST_CASE("mesh::layout: strides are row-major with the last axis fastest") {
  CHECK(weft::mesh::strides(std::vector{2, 3, 4}) == std::vector{12, 4, 1});
  CHECK(weft::mesh::strides(std::vector{8}) == std::vector{1});
  CHECK(weft::mesh::strides(std::vector{2, 2, 2, 2}) == std::vector{8, 4, 2, 1});
  CHECK(weft::mesh::volume(std::vector{2, 3, 4}) == 24);
  CHECK(weft::mesh::volume(std::vector<int>{}) == 1);
}

TEST_CASE("mesh::layout: ravel and unravel are inverses and enumerate in odometer order") {
  for (auto const& shape : test_shapes) {
    CAPTURE(weft::mesh::detail::format_ints(shape));
    auto const coords = odometer(shape);
    REQUIRE(static_cast<int>(coords.size()) == weft::mesh::volume(shape));
    auto const stride = weft::mesh::strides(shape);
    for (int i = 0; i < static_cast<int>(coords.size()); ++i) {
      auto const& c = coords[static_cast<std::size_t>(i)];
      CHECK(weft::mesh::unravel(i, shape) == c);
      CHECK(weft::mesh::ravel(c, shape) == i);
      int dot = 0;
      for (std::size_t k = 0; k < c.size(); ++k) dot += c[k] * stride[k];
      CHECK(dot == i);
    }
  }
}

TEST_CASE("mesh::layout: golden tables of the reference note, shape (2,2,2) named (dp,cp,tp)") {
  layout const l({2, 2, 2}, {"dp", "cp", "tp"});
  CHECK(l.groups_along("tp") == groups_t{{0, 1}, {2, 3}, {4, 5}, {6, 7}});
  CHECK(l.groups_along("cp") == groups_t{{0, 2}, {1, 3}, {4, 6}, {5, 7}});
  CHECK(l.groups_along("dp") == groups_t{{0, 4}, {1, 5}, {2, 6}, {3, 7}});
  // PyTorch's _flatten docstring example.
  CHECK(l.groups_along({"dp", "cp"}) == groups_t{{0, 2, 4, 6}, {1, 3, 5, 7}});
  // The order given numbers the members: cp slowest now.
  CHECK(l.groups_along({"cp", "dp"}) == groups_t{{0, 4, 2, 6}, {1, 5, 3, 7}});
  CHECK(l.groups_along({"dp", "cp", "tp"}) == groups_t{{0, 1, 2, 3, 4, 5, 6, 7}});
  CHECK(l.coordinate(5) == std::vector{1, 0, 1});
  CHECK(l.global_rank(std::vector{1, 1, 0}) == 6);
  CHECK(l.size() == 8);
  CHECK(l.size("cp") == 2);
  CHECK(l.axis("tp") == 2);
  CHECK(l.describe() == "(dp=2, cp=2, tp=2)");
}

TEST_CASE("mesh::layout: golden tables, shape (2,4) named (dp,tp)") {
  layout const l({2, 4}, {"dp", "tp"});
  CHECK(l.groups_along("tp") == groups_t{{0, 1, 2, 3}, {4, 5, 6, 7}});
  CHECK(l.groups_along("dp") == groups_t{{0, 4}, {1, 5}, {2, 6}, {3, 7}});
  // PyTorch docstring: mesh_2d["dp"] on rank 1 is [1, 5].
  auto const sk = l.split_along(1, "dp");
  CHECK(l.groups_along("dp")[static_cast<std::size_t>(sk.color)] == std::vector{1, 5});
  CHECK(sk.key == 0);
}

TEST_CASE("mesh::layout: groups_along equals PyTorch's permute/reshape rule for every axis list") {
  for (auto const& shape : test_shapes) {
    for (auto const& dims : all_dim_lists(static_cast<int>(shape.size()))) {
      CAPTURE(weft::mesh::detail::format_ints(shape));
      CAPTURE(weft::mesh::detail::format_ints(dims));
      auto const got = weft::mesh::groups_along(shape, dims);
      CHECK(got == torch_flatten(shape, dims));
      if (dims.size() == 1) CHECK(sorted(got) == sorted(torch_swapdims(shape, dims[0])));
    }
  }
}

TEST_CASE("mesh::layout: split_along puts every rank at [color][key] of groups_along") {
  for (auto const& shape : test_shapes) {
    for (auto const& dims : all_dim_lists(static_cast<int>(shape.size()))) {
      CAPTURE(weft::mesh::detail::format_ints(shape));
      CAPTURE(weft::mesh::detail::format_ints(dims));
      auto const groups = weft::mesh::groups_along(shape, dims);
      int members = 1;
      for (int d : dims) members *= shape[static_cast<std::size_t>(d)];
      REQUIRE(static_cast<int>(groups.size()) * members == weft::mesh::volume(shape));
      std::vector<int> seen(static_cast<std::size_t>(weft::mesh::volume(shape)), 0);
      for (int r = 0; r < weft::mesh::volume(shape); ++r) {
        auto const c = weft::mesh::unravel(r, shape);
        auto const sk = weft::mesh::split_along(c, shape, dims);
        REQUIRE(sk.color >= 0);
        REQUIRE(sk.color < static_cast<int>(groups.size()));
        REQUIRE(sk.key >= 0);
        REQUIRE(sk.key < members);
        CHECK(groups[static_cast<std::size_t>(sk.color)][static_cast<std::size_t>(sk.key)] == r);
        if (dims.size() == 1) CHECK(sk.key == c[static_cast<std::size_t>(dims[0])]);
        ++seen[static_cast<std::size_t>(r)];
      }
      // Groups partition the ranks: every rank appears exactly once.
      for (auto const& g : groups)
        for (int r : g) --seen[static_cast<std::size_t>(r)];
      CHECK(std::count(seen.begin(), seen.end(), 0) == static_cast<long>(seen.size()));
    }
  }
}

TEST_CASE("mesh::layout: from_megatron reverses the order string") {
  layout const l = layout::from_megatron("tp-cp-ep-dp-pp",
                                         {{"tp", 2}, {"cp", 3}, {"ep", 1}, {"dp", 4}, {"pp", 5}});
  CHECK(std::vector<std::string>(l.names().begin(), l.names().end()) ==
        std::vector<std::string>{"pp", "dp", "ep", "cp", "tp"});
  CHECK(std::vector<int>(l.shape().begin(), l.shape().end()) == std::vector{5, 4, 1, 3, 2});
  CHECK(l == layout({5, 4, 1, 3, 2}, {"pp", "dp", "ep", "cp", "tp"}));
  // Named sizes of 1 missing from the order are appended to it (slowest), as Megatron does.
  layout const m = layout::from_megatron("tp-dp", {{"tp", 2}, {"dp", 2}, {"pp", 1}});
  CHECK(m == layout({1, 2, 2}, {"pp", "dp", "tp"}));
  CHECK(m.groups_along("pp") == groups_t{{0}, {1}, {2}, {3}});
  CHECK(weft::mesh::parse_megatron_order("tp-cp-dp-pp") ==
        std::vector<std::string>{"tp", "cp", "dp", "pp"});
}

TEST_CASE(
    "mesh::layout: Megatron's golden tables (tp=2 cp=1 dp=2 pp=2, and its 16-GPU docstring)") {
  layout const l =
      layout::from_megatron("tp-cp-dp-pp", {{"tp", 2}, {"cp", 1}, {"dp", 2}, {"pp", 2}});
  CHECK(l.groups_along("tp") == groups_t{{0, 1}, {2, 3}, {4, 5}, {6, 7}});
  CHECK(l.groups_along("dp") == groups_t{{0, 2}, {1, 3}, {4, 6}, {5, 7}});
  CHECK(l.groups_along("pp") == groups_t{{0, 4}, {1, 5}, {2, 6}, {3, 7}});

  // initialize_model_parallel's docstring: 16 GPUs, tp=2, pp=4 (so dp=2), order tp-dp-pp.
  layout const g = layout::from_megatron("tp-dp-pp", {{"tp", 2}, {"dp", 2}, {"pp", 4}});
  CHECK(g.groups_along("tp") ==
        groups_t{{0, 1}, {2, 3}, {4, 5}, {6, 7}, {8, 9}, {10, 11}, {12, 13}, {14, 15}});
  CHECK(g.groups_along("dp") ==
        groups_t{{0, 2}, {1, 3}, {4, 6}, {5, 7}, {8, 10}, {9, 11}, {12, 14}, {13, 15}});
  CHECK(g.groups_along("pp") ==
        groups_t{{0, 4, 8, 12}, {1, 5, 9, 13}, {2, 6, 10, 14}, {3, 7, 11, 15}});

  // With cp = 2, Megatron's dp-cp group is PyTorch's flattened (dp, cp).
  layout const c =
      layout::from_megatron("tp-cp-dp-pp", {{"tp", 2}, {"cp", 2}, {"dp", 2}, {"pp", 1}});
  CHECK(c.groups_along({"dp", "cp"}) == groups_t{{0, 2, 4, 6}, {1, 3, 5, 7}});
  CHECK(c.groups_along("cp") == groups_t{{0, 2}, {1, 3}, {4, 6}, {5, 7}});
}

TEST_CASE("mesh::layout: from_megatron equals Megatron's generator for every order and mask") {
  std::vector<std::string> order = {"cp", "dp", "pp", "tp"};  // sorted: next_permutation visits all
  std::vector<std::pair<std::string, int>> const sizes = {
      {"tp", 2}, {"cp", 3}, {"dp", 2}, {"pp", 2}};
  int const world = 24;
  int orders = 0;
  do {
    ++orders;
    std::string order_string;
    std::vector<int> ordered_size;
    for (auto const& t : order) {
      order_string += (order_string.empty() ? "" : "-") + t;
      for (auto const& [n, s] : sizes)
        if (n == t) ordered_size.push_back(s);
    }
    CAPTURE(order_string);
    layout const l = layout::from_megatron(order_string, sizes);
    REQUIRE(l.size() == world);
    for (unsigned m = 1; m < (1u << order.size()); ++m) {
      std::vector<bool> mask(order.size());
      std::vector<std::string> slowest_first;  // the masked axes in mesh order
      for (std::size_t i = 0; i < order.size(); ++i) mask[i] = (m >> i) & 1u;
      for (std::size_t i = order.size(); i-- > 0;)
        if (mask[i]) slowest_first.push_back(order[i]);
      CAPTURE(weft::mesh::detail::format_names(slowest_first));
      CHECK(l.groups_along(slowest_first) == megatron_groups(world, ordered_size, mask));
    }
  } while (std::next_permutation(order.begin(), order.end()));
  CHECK(orders == 24);
}

TEST_CASE("mesh::layout: a permuted rank map (JAX style) is respected") {
  // jax.make_mesh's docs example: 8 TPU v3 devices in ring order [0,1,2,3,6,7,4,5], shape (2,4).
  layout const l({2, 4}, {"x", "y"}, {0, 1, 2, 3, 6, 7, 4, 5});
  CHECK(l.groups_along("y") == groups_t{{0, 1, 2, 3}, {6, 7, 4, 5}});
  CHECK(l.groups_along("x") == groups_t{{0, 6}, {1, 7}, {2, 4}, {3, 5}});
  CHECK(l.coordinate(6) == std::vector{1, 0});
  CHECK(l.coordinate(4) == std::vector{1, 2});
  CHECK(l.global_rank(std::vector{1, 3}) == 5);
  for (int r = 0; r < 8; ++r) CHECK(l.global_rank(l.coordinate(r)) == r);
  // A transposed map turns axis groups into the other axis's groups of the identity layout.
  layout const t({2, 2}, {"a", "b"}, {0, 2, 1, 3});
  CHECK(t.groups_along("b") == layout({2, 2}, {"a", "b"}).groups_along("a"));
}

TEST_CASE(
    "mesh::layout: bad arguments throw invalid_argument_error naming argument, expected, actual") {
  using doctest::Contains;
  using weft::invalid_argument_error;
  layout const l({2, 4}, {"dp", "tp"});
  CHECK_THROWS_WITH_AS((void)l.axis("pp"),
                       Contains("argument `axis`: expected one of (dp, tp), actual `pp`"),
                       invalid_argument_error);
  CHECK_THROWS_WITH_AS((void)l.groups_along("cp"), Contains("actual `cp`"), invalid_argument_error);
  CHECK_THROWS_WITH_AS((void)l.groups_along({"dp", "dp"}), Contains("`dp` repeated"),
                       invalid_argument_error);
  CHECK_THROWS_WITH_AS(layout({2, 2}, {"dp", "dp"}),
                       Contains("argument `names`: expected distinct axis names"),
                       invalid_argument_error);
  CHECK_THROWS_WITH_AS(
      layout({2, 2}, {"dp"}),
      Contains("expected 2 names, one per axis of shape (2, 2), actual 1 names (dp)"),
      invalid_argument_error);
  CHECK_THROWS_WITH_AS(layout({2, 0}, {"a", "b"}),
                       Contains("argument `shape`: expected every extent >= 1, actual (2, 0)"),
                       invalid_argument_error);
  CHECK_THROWS_WITH_AS(layout({}, {}), Contains("argument `shape`: expected at least one axis"),
                       invalid_argument_error);
  CHECK_THROWS_WITH_AS(layout({65536, 65536}, {"a", "b"}), Contains("INT_MAX"),
                       invalid_argument_error);
  CHECK_THROWS_WITH_AS(layout({2, 2}, {"a", ""}), Contains("non-empty"), invalid_argument_error);
  CHECK_THROWS_WITH_AS(layout({2, 2}, {"a", "b"}, {0, 1, 2}),
                       Contains("argument `rank_map`: expected 4 entries"), invalid_argument_error);
  CHECK_THROWS_WITH_AS(layout({2, 2}, {"a", "b"}, {0, 1, 1, 3}),
                       Contains("rank 1 at entries 1 and 2"), invalid_argument_error);
  CHECK_THROWS_WITH_AS(layout({2, 2}, {"a", "b"}, {0, 1, 4, 3}), Contains("entry 2 = 4"),
                       invalid_argument_error);
  CHECK_THROWS_WITH_AS((void)l.coordinate(8),
                       Contains("argument `global_rank`: expected 0 <= global_rank < 8, actual 8"),
                       invalid_argument_error);

  std::vector<int> const shape = {2, 3};
  CHECK_THROWS_WITH_AS((void)weft::mesh::ravel(std::vector{1, 3}, shape),
                       Contains("argument `coord`"), invalid_argument_error);
  CHECK_THROWS_WITH_AS(
      (void)weft::mesh::ravel(std::vector{1}, shape),
      Contains("expected 2 coordinates for shape (2, 3), actual 1 coordinates (1,)"),
      invalid_argument_error);
  CHECK_THROWS_WITH_AS((void)weft::mesh::unravel(6, shape),
                       Contains("argument `index`: expected 0 <= index < 6"),
                       invalid_argument_error);
  CHECK_THROWS_WITH_AS((void)weft::mesh::unravel(-1, shape), Contains("actual -1"),
                       invalid_argument_error);
  CHECK_THROWS_WITH_AS((void)weft::mesh::groups_along(shape, std::vector{0, 0}),
                       Contains("argument `dims`: expected distinct axis indices, actual (0, 0)"),
                       invalid_argument_error);
  CHECK_THROWS_WITH_AS((void)weft::mesh::groups_along(shape, std::vector{2}),
                       Contains("axis indices in [0, 2)"), invalid_argument_error);
}

TEST_CASE("mesh::layout: bad Megatron order strings and sizes throw naming the argument") {
  using doctest::Contains;
  using weft::invalid_argument_error;
  weft::mesh::axis_sizes const sizes = {{"tp", 2}, {"dp", 2}, {"pp", 2}};
  CHECK_THROWS_WITH_AS((void)layout::from_megatron("", sizes), Contains("argument `order`"),
                       invalid_argument_error);
  for (char const* bad : {"tp--dp-pp", "-tp-dp-pp", "tp-dp-pp-", "-"})
    CHECK_THROWS_WITH_AS((void)layout::from_megatron(bad, sizes),
                         Contains("argument `order`: expected non-empty axis names"),
                         invalid_argument_error);
  CHECK_THROWS_WITH_AS((void)layout::from_megatron("tp-dp-tp-pp", sizes), Contains("`tp` repeated"),
                       invalid_argument_error);
  CHECK_THROWS_WITH_AS(
      (void)layout::from_megatron("tp-cp-dp-pp", sizes),
      Contains("argument `sizes`: expected a size for every axis of order \"tp-cp-dp-pp\", actual "
               "none for `cp` in {tp=2, dp=2, pp=2}"),
      invalid_argument_error);
  CHECK_THROWS_WITH_AS((void)layout::from_megatron("tp-dp", sizes),
                       Contains("argument `order`: expected every axis of size > 1 named (`pp` has "
                                "size 2), actual \"tp-dp\""),
                       invalid_argument_error);
  CHECK_THROWS_WITH_AS(
      (void)layout::from_megatron("tp-dp-pp", {{"tp", 2}, {"dp", 2}, {"pp", 2}, {"tp", 1}}),
      Contains("`tp` given twice"), invalid_argument_error);
  CHECK_THROWS_WITH_AS((void)layout::from_megatron("tp-dp-pp", {{"tp", 0}, {"dp", 2}, {"pp", 2}}),
                       Contains("expected a size >= 1 for axis `tp`, actual 0"),
                       invalid_argument_error);
  // Names are case-sensitive: Megatron lowercases, weft reports the mismatch instead.
  CHECK_THROWS_AS((void)layout::from_megatron("TP-dp-pp", sizes), invalid_argument_error);
}
