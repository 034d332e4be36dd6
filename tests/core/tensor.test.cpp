// Tests for weft/core/tensor.hpp (tensor/{view,owning,subview,print}.hpp,
// algorithm/{copy,fill}.hpp) and weft/core/memory.hpp: concepts, owning tensors, sub-view offsets
// and strides (checked against offsets written out by hand), copies, fills, shape errors and the
// printer's exact output.
#include <weft/core/algorithm/copy.hpp>
#include <weft/core/algorithm/fill.hpp>
#include <weft/core/dtype.hpp>
#include <weft/core/exec.hpp>
#include <weft/core/memory.hpp>
#include <weft/core/tensor.hpp>

#include <doctest/doctest.h>

#include <array>
#include <cstdint>
#include <sstream>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>
#include <vector>

namespace {

using weft::cuda_space;
using weft::host_space;
using weft::index_t;

// ---- concepts (compile-time) ----------------------------------------------------------------

using hv2 = weft::tensor_view<float, 2>;
using hcv2 = weft::tensor_view<float const, 2>;
using dv2 = weft::tensor_view<float, 2, cuda_space>;
using hs3 = weft::strided_view<float, 3>;

static_assert(weft::Tensor<hv2>);
static_assert(weft::Tensor<hs3>);
static_assert(weft::Tensor<dv2>);
static_assert(weft::TensorIn<hv2, host_space>);
static_assert(!weft::TensorIn<hv2, cuda_space>);
static_assert(weft::TensorIn<dv2, cuda_space>);
static_assert(!weft::TensorIn<dv2, host_space>);
static_assert(!weft::Tensor<int>);
static_assert(!weft::Tensor<std::vector<float>>);
static_assert(!weft::Tensor<float*>);
// An owning tensor is move-only, hence not a (non-owning, copyable) Tensor.
static_assert(!weft::Tensor<weft::tensor<float, 2>>);
// An mdspan without a memory space in its accessor is not a weft Tensor.
static_assert(!weft::Tensor<cuda::std::mdspan<float, weft::dextents<2>>>);
static_assert(weft::ContiguousTensor<hv2>);
static_assert(!weft::ContiguousTensor<hs3>);
static_assert(weft::MutableTensor<hv2>);
static_assert(!weft::MutableTensor<hcv2>);
static_assert(std::is_same_v<weft::memory_space_t<dv2>, cuda_space>);
static_assert(std::is_same_v<weft::memory_space_t<weft::tensor<int, 1, cuda_space>>, cuda_space>);
static_assert(std::is_same_v<weft::memory_space_t<hv2 const&>, host_space>);
// float -> float const converts implicitly; the reverse and cross-space conversions do not.
static_assert(std::is_convertible_v<hv2, hcv2>);
static_assert(!std::is_convertible_v<hcv2, hv2>);
static_assert(!std::is_convertible_v<dv2, hv2>);
static_assert(!std::is_convertible_v<hv2, dv2>);
// Owning tensors: move-only, convertible to their views from lvalues only (no dangling views).
static_assert(!std::is_copy_constructible_v<weft::tensor<float, 1>>);
static_assert(std::is_nothrow_move_constructible_v<weft::tensor<float, 1>>);
static_assert(std::is_nothrow_move_assignable_v<weft::tensor<float, 1>>);
static_assert(std::is_convertible_v<weft::tensor<float, 1>&, weft::tensor_view<float, 1>>);
static_assert(
    std::is_convertible_v<weft::tensor<float, 1> const&, weft::tensor_view<float const, 1>>);
static_assert(!std::is_convertible_v<weft::tensor<float, 1>&&, weft::tensor_view<float const, 1>>);
static_assert(!std::is_convertible_v<weft::tensor<float, 1> const&, weft::tensor_view<float, 1>>);
static_assert(weft::MemorySpace<host_space> && weft::MemorySpace<cuda_space>);
static_assert(!weft::MemorySpace<int>);

// A [2, 3, 4] host tensor holding 0, 1, ..., 23 in row-major order, so that an element's value
// equals its offset from the start of the allocation.
weft::tensor<float, 3> iota_234() {
  auto t = weft::make_tensor<float>(2, 3, 4);
  for (int i = 0; i < 24; ++i) t.data()[i] = static_cast<float>(i);
  return t;
}

template <class V>
index_t offset_of(V const& v, float const* base) {
  return static_cast<index_t>(v.data_handle() - base);
}

template <std::size_t R, class V>
std::array<index_t, R> extents_of(V const& v) {
  std::array<index_t, R> e{};
  for (std::size_t k = 0; k < R; ++k) e[k] = v.extent(k);
  return e;
}

template <std::size_t R, class V>
std::array<index_t, R> strides_of(V const& v) {
  std::array<index_t, R> s{};
  for (std::size_t k = 0; k < R; ++k) s[k] = v.stride(k);
  return s;
}

using arr1 = std::array<index_t, 1>;
using arr2 = std::array<index_t, 2>;
using arr3 = std::array<index_t, 3>;

}  // namespace

TEST_CASE("tensor: make_tensor sets extents, sizes and 64-byte aligned host storage") {
  auto t = weft::make_tensor<float>(2, 3, 4);
  CHECK(t.rank() == 3);
  CHECK(t.extent(0) == 2);
  CHECK(t.extent(1) == 3);
  CHECK(t.extent(2) == 4);
  CHECK(t.size() == 24);
  CHECK(t.size_bytes() == 96);
  CHECK_FALSE(t.empty());
  CHECK(t.extents() == weft::dextents<3>(2, 3, 4));

  // Several element sizes and odd byte counts: each allocation starts on a 64-byte boundary.
  auto a = weft::make_tensor<std::uint8_t>(3);
  auto b = weft::make_tensor<double>(std::array{5, 7});
  auto c = weft::make_tensor<weft::bf16>(std::array<long, 1>{1});
  auto d = weft::make_tensor<std::int32_t>(t.extents());
  for (std::uintptr_t p :
       {reinterpret_cast<std::uintptr_t>(t.data()), reinterpret_cast<std::uintptr_t>(a.data()),
        reinterpret_cast<std::uintptr_t>(b.data()), reinterpret_cast<std::uintptr_t>(c.data()),
        reinterpret_cast<std::uintptr_t>(d.data())}) {
    CHECK(p != 0);
    CHECK(p % 64 == 0);
  }
  CHECK(b.extent(0) == 5);
  CHECK(b.extent(1) == 7);
  CHECK(d.size() == 24);

  auto scalar = weft::make_tensor<float>();  // rank 0 holds one element
  CHECK(scalar.size() == 1);
  CHECK(scalar.data() != nullptr);

  auto none = weft::make_tensor<float>(0, 5);
  CHECK(none.size() == 0);
  CHECK(none.empty());
  CHECK(none.data() == nullptr);
  weft::tensor<float, 2> defaulted;
  CHECK(defaulted.size() == 0);
  CHECK(defaulted.data() == nullptr);
}

TEST_CASE("tensor: negative extents throw shape_error naming the dimension and both values") {
  CHECK_THROWS_AS((void)weft::make_tensor<float>(2, -3), weft::shape_error);
  try {
    (void)weft::make_tensor<float>(2, -3, 4);
    FAIL("expected shape_error");
  } catch (weft::shape_error const& e) {
    std::string const what = e.what();
    CHECK(what.find("`extents[1]`") != std::string::npos);
    CHECK(what.find("expected >= 0") != std::string::npos);
    CHECK(what.find("actual -3") != std::string::npos);
  }
  // A size whose bytes overflow is refused before allocating.
  CHECK_THROWS_AS((void)weft::make_tensor<double>(index_t{1} << 40, index_t{1} << 30),
                  weft::shape_error);
}

TEST_CASE("tensor: moves transfer ownership and leave the source empty") {
  auto a = weft::make_tensor<int>(4, 5);
  int* const p = a.data();
  weft::tensor<int, 2> b(std::move(a));
  CHECK(b.data() == p);
  CHECK(b.extent(0) == 4);
  CHECK(b.extent(1) == 5);
  CHECK(a.data() == nullptr);  // NOLINT(bugprone-use-after-move): moved-from state is specified
  CHECK(a.size() == 0);

  auto c = weft::make_tensor<int>(1, 1);
  c = std::move(b);  // c's old storage is released (ASan reports a leak otherwise)
  CHECK(c.data() == p);
  CHECK(c.size() == 20);
  CHECK(b.data() == nullptr);  // NOLINT(bugprone-use-after-move)

  auto& alias = c;
  c = std::move(alias);  // self-move keeps the storage
  CHECK(c.data() == p);
  CHECK(c.size() == 20);

  weft::tensor_view<int, 2> v = c;  // lvalue conversion to the view
  CHECK(v.data_handle() == p);
  weft::tensor<int, 2> const& cc = c;
  weft::tensor_view<int const, 2> cv = cc;
  CHECK(cv.extent(1) == 5);
}

TEST_CASE("tensor: row-major offsets of a 2x3x4 view") {
  auto t = iota_234();
  auto v = t.view();
  float const* base = t.data();
  CHECK(strides_of<3>(v) == arr3{12, 4, 1});
  // offset = 12 i + 4 j + k, written out by hand for a few elements.
  CHECK(&v(0, 0, 0) - base == 0);
  CHECK(&v(0, 0, 3) - base == 3);
  CHECK(&v(0, 1, 0) - base == 4);
  CHECK(&v(0, 2, 1) - base == 9);
  CHECK(&v(1, 0, 0) - base == 12);
  CHECK(&v(1, 2, 3) - base == 23);
  CHECK(v(1, 2, 3) == 23.0f);
  CHECK(weft::is_contiguous(v));
  CHECK(weft::shape_string(v) == "[2, 3, 4]");
}

TEST_CASE("tensor: select drops a dimension with hand-computed strides and offsets") {
  auto t = iota_234();
  auto v = t.view();
  float const* base = t.data();

  auto s1 = weft::select(v, 1, 2);  // v[:, 2, :]
  static_assert(std::is_same_v<decltype(s1), weft::strided_view<float, 2>>);
  CHECK(extents_of<2>(s1) == arr2{2, 4});
  CHECK(strides_of<2>(s1) == arr2{12, 1});
  CHECK(offset_of(s1, base) == 8);
  CHECK(&s1(1, 3) - base == 23);  // 8 + 12 + 3
  CHECK(s1(0, 1) == 9.0f);

  auto s0 = weft::select(v, 0, 1);  // v[1, :, :]
  CHECK(extents_of<2>(s0) == arr2{3, 4});
  CHECK(strides_of<2>(s0) == arr2{4, 1});
  CHECK(offset_of(s0, base) == 12);
  CHECK(weft::is_contiguous(s0));

  auto s2 = weft::select(v, 2, 3);  // v[:, :, 3]
  CHECK(extents_of<2>(s2) == arr2{2, 3});
  CHECK(strides_of<2>(s2) == arr2{12, 4});
  CHECK(offset_of(s2, base) == 3);
  CHECK(s2(1, 1) == 19.0f);  // 3 + 12 + 4
  CHECK_FALSE(weft::is_contiguous(s2));

  auto e = weft::select(weft::select(s2, 0, 1), 0, 2);  // down to rank 0
  static_assert(decltype(e)::rank() == 0);
  CHECK(offset_of(e, base) == 23);
  CHECK(e() == 23.0f);

  CHECK_THROWS_AS((void)weft::select(v, 3, 0), weft::invalid_argument_error);
  CHECK_THROWS_WITH_AS((void)weft::select(v, 1, 3),
                       doctest::Contains("`index`: expected in [0, 3), actual 3"),
                       weft::invalid_argument_error);
}

TEST_CASE("tensor: slice keeps the rank and offsets the start") {
  auto t = iota_234();
  auto v = t.view();
  float const* base = t.data();

  auto a = weft::slice(v, 2, 1, 3);  // v[:, :, 1:3]
  CHECK(extents_of<3>(a) == arr3{2, 3, 2});
  CHECK(strides_of<3>(a) == arr3{12, 4, 1});
  CHECK(offset_of(a, base) == 1);
  CHECK(&a(1, 2, 1) - base == 22);  // 1 + 12 + 8 + 1
  CHECK_FALSE(weft::is_contiguous(a));

  auto b = weft::slice(v, 0, 1, 2);  // v[1:2]
  CHECK(extents_of<3>(b) == arr3{1, 3, 4});
  CHECK(offset_of(b, base) == 12);
  CHECK(weft::is_contiguous(b));

  auto c = weft::slice(v, 1, 1, 1);  // empty
  CHECK(c.size() == 0);
  CHECK(weft::is_contiguous(c));

  CHECK_THROWS_WITH_AS((void)weft::slice(v, 1, 2, 4),
                       doctest::Contains("`end`: expected in [2, 3], actual 4"),
                       weft::invalid_argument_error);
  CHECK_THROWS_AS((void)weft::slice(v, 1, -1, 2), weft::invalid_argument_error);
  CHECK_THROWS_WITH_AS((void)weft::slice(v, -1, 0, 1),
                       doctest::Contains("`dim`: expected in [0, 3), actual -1"),
                       weft::invalid_argument_error);
}

TEST_CASE("tensor: transpose swaps extents and strides without moving data") {
  auto t = iota_234();
  auto v = t.view();
  float const* base = t.data();
  auto tr = weft::transpose(v, 0, 2);
  CHECK(extents_of<3>(tr) == arr3{4, 3, 2});
  CHECK(strides_of<3>(tr) == arr3{1, 4, 12});
  CHECK(offset_of(tr, base) == 0);
  CHECK(&tr(3, 2, 1) - base == 23);
  CHECK(&tr(1, 0, 1) - base == 13);  // 1 + 0 + 12
  CHECK_FALSE(weft::is_contiguous(tr));

  auto m = weft::make_tensor<int>(2, 3);
  auto mt = weft::transpose(m.view());
  CHECK(extents_of<2>(mt) == arr2{3, 2});
  CHECK(strides_of<2>(mt) == arr2{1, 3});
  auto back = weft::transpose(mt, 1, 0);
  CHECK(weft::is_contiguous(back));  // strides {3, 1} again
  CHECK_THROWS_AS((void)weft::transpose(v, 0, 3), weft::invalid_argument_error);
}

TEST_CASE("tensor: subview takes submdspan-style slices and checks them") {
  auto t = iota_234();
  auto v = t.view();
  float const* base = t.data();

  auto a = weft::subview(v, 1, weft::all, std::pair{1, 3});  // v[1, :, 1:3]
  static_assert(decltype(a)::rank() == 2);
  CHECK(extents_of<2>(a) == arr2{3, 2});
  CHECK(strides_of<2>(a) == arr2{4, 1});
  CHECK(offset_of(a, base) == 13);
  CHECK(a(2, 1) == 22.0f);  // 13 + 8 + 1

  // Leading index, full trailing dimensions: a strided view that is contiguous at run time.
  auto b = weft::subview(v, 1, weft::all, weft::all);
  static_assert(std::is_same_v<decltype(b), weft::strided_view<float, 2>>);
  CHECK(offset_of(b, base) == 12);
  CHECK(strides_of<2>(b) == arr2{4, 1});
  CHECK(weft::is_contiguous(b));

  // v[:, :, 1:3]: element (1, 0, 0) is at 12 + 1 = 13 (CCCL 3.0.1's submdspan says 7).
  auto d = weft::subview(v, weft::all, weft::all, std::pair{1, 3});
  CHECK(extents_of<3>(d) == arr3{2, 3, 2});
  CHECK(strides_of<3>(d) == arr3{12, 4, 1});
  CHECK(&d(1, 0, 0) - base == 13);
  CHECK(d(1, 2, 1) == 22.0f);

  // Every other element of the last dimension, starting at 1: elements 1 and 3.
  auto c = weft::subview(v, cuda::std::tuple{0, 2}, 2, cuda::std::strided_slice{1, 3, 2});
  CHECK(extents_of<2>(c) == arr2{2, 2});
  CHECK(strides_of<2>(c) == arr2{12, 2});
  CHECK(offset_of(c, base) == 9);  // 8 + 1
  CHECK(c(1, 1) == 23.0f);

  // All indices: rank 0 at offset 12 + 8 + 3.
  auto e = weft::subview(v, 1, 2, 3);
  static_assert(decltype(e)::rank() == 0);
  CHECK(offset_of(e, base) == 23);

  CHECK_THROWS_WITH_AS((void)weft::subview(v, 2, weft::all, weft::all),
                       doctest::Contains("`slices[0]`: expected an index in [0, 2), actual 2"),
                       weft::invalid_argument_error);
  CHECK_THROWS_AS((void)weft::subview(v, 0, std::pair{2, 4}, 0), weft::invalid_argument_error);
  CHECK_THROWS_AS((void)weft::subview(v, 0, 0, cuda::std::strided_slice{2, 3, 1}),
                  weft::invalid_argument_error);
}

TEST_CASE("tensor: reshape and flatten re-view contiguous data") {
  auto t = iota_234();
  auto v = t.view();

  auto r = weft::reshape(v, 6, 4);
  static_assert(std::is_same_v<decltype(r), weft::tensor_view<float, 2>>);
  CHECK(r.data_handle() == t.data());
  CHECK(extents_of<2>(r) == arr2{6, 4});
  CHECK(r(5, 3) == 23.0f);

  auto inferred = weft::reshape(v, 4, -1);
  CHECK(extents_of<2>(inferred) == arr2{4, 6});
  auto r3 = weft::reshape(v, std::array<index_t, 3>{2, 2, 6});
  CHECK(r3(1, 1, 5) == 23.0f);

  auto f = weft::flatten(v);
  CHECK(extents_of<1>(f) == arr1{24});
  // A strided view that is contiguous at run time reshapes too.
  auto row_pair = weft::slice(v, 0, 1, 2);
  auto fr = weft::flatten(row_pair);
  CHECK(fr.extent(0) == 12);
  CHECK(fr(0) == 12.0f);
  CHECK(weft::as_contiguous(row_pair).data_handle() == t.data() + 12);

  try {
    (void)weft::reshape(v, 5, 5);
    FAIL("expected shape_error");
  } catch (weft::shape_error const& e) {
    std::string const what = e.what();
    CHECK(what.find("`extents`") != std::string::npos);
    CHECK(what.find("expected 24 elements") != std::string::npos);
    CHECK(what.find("actual 25 elements ([5, 5])") != std::string::npos);
  }
  CHECK_THROWS_AS((void)weft::reshape(v, 5, -1), weft::shape_error);
  CHECK_THROWS_AS((void)weft::reshape(v, -1, -1), weft::shape_error);
  CHECK_THROWS_AS((void)weft::reshape(v, -2, -12), weft::shape_error);
  // A product that overflows 64 bits is a mismatch, not undefined behaviour.
  CHECK_THROWS_AS((void)weft::reshape(v, index_t{1} << 40, index_t{1} << 40, 0, 24),
                  weft::shape_error);
  try {
    (void)weft::flatten(weft::transpose(v, 0, 1));
    FAIL("expected shape_error");
  } catch (weft::shape_error const& e) {
    std::string const what = e.what();
    CHECK(what.find("`view`") != std::string::npos);
    CHECK(what.find("expected a row-major contiguous view") != std::string::npos);
    CHECK(what.find("actual extents [3, 2, 4] with strides [4, 12, 1]") != std::string::npos);
  }
  CHECK_THROWS_AS((void)weft::as_contiguous(weft::slice(v, 2, 0, 2)), weft::shape_error);
}

TEST_CASE("tensor: is_contiguous ignores strides of extent-1 dimensions") {
  float buf[8] = {};
  using mapping = cuda::std::layout_stride::mapping<weft::dextents<3>>;
  // [2, 1, 4] with a nonsense stride on the unit dimension is still packed row-major.
  weft::strided_view<float, 3> a(
      buf, mapping(weft::dextents<3>(2, 1, 4), cuda::std::array<index_t, 3>{4, 99, 1}));
  CHECK(weft::is_contiguous(a));
  weft::strided_view<float, 3> b(
      buf, mapping(weft::dextents<3>(2, 1, 3), cuda::std::array<index_t, 3>{4, 1, 1}));
  CHECK_FALSE(weft::is_contiguous(b));  // a padded row
  auto s = weft::as_strided(weft::tensor_view<float, 2>(buf, 2, 4));
  static_assert(std::is_same_v<decltype(s), weft::strided_view<float, 2>>);
  CHECK(strides_of<2>(s) == arr2{4, 1});
  CHECK(weft::is_contiguous(s));
}

TEST_CASE("tensor: copy between contiguous and strided host views") {
  auto src = iota_234();
  auto dst = weft::make_tensor<float>(2, 3, 4);
  weft::fill(dst.view(), -1.0f);
  weft::copy(dst.view(), std::as_const(src).view());
  for (int i = 0; i < 24; ++i) CHECK(dst.data()[i] == static_cast<float>(i));

  // Strided source: the transpose [4, 3, 2] of iota; element (a, b, c) holds 12 c + 4 b + a.
  auto tr = weft::make_tensor<float>(4, 3, 2);
  weft::copy(tr.view(), weft::transpose(src.view(), 0, 2));
  for (int a = 0; a < 4; ++a)
    for (int b = 0; b < 3; ++b)
      for (int c = 0; c < 2; ++c)
        CHECK(tr.view()(a, b, c) == static_cast<float>(12 * c + 4 * b + a));

  // Strided destination: write a [2, 3] block into column 1 of a [2, 3, 4] tensor of zeros.
  auto block = weft::make_tensor<float>(2, 3);
  for (int i = 0; i < 6; ++i) block.data()[i] = static_cast<float>(100 + i);
  auto z = weft::make_tensor<float>(2, 3, 4);
  weft::fill(z.view(), 0.0f);
  weft::copy(weft::select(z.view(), 2, 1), block.view());
  for (int i = 0; i < 24; ++i) {
    int const row = i / 4;  // (i0, i1) flattened
    float const expected = (i % 4 == 1) ? static_cast<float>(100 + row) : 0.0f;
    CHECK(z.data()[i] == expected);
  }

  // Strided to strided.
  auto y = weft::make_tensor<float>(3, 2);
  weft::copy(weft::as_strided(y.view()), weft::select(weft::transpose(src.view(), 0, 1), 2, 0));
  // transpose(0,1) is [3, 2, 4]; select(dim 2, 0) is element (j, i) = iota(i, j, 0) = 12 i + 4 j.
  for (int j = 0; j < 3; ++j)
    for (int i = 0; i < 2; ++i) CHECK(y.view()(j, i) == static_cast<float>(12 * i + 4 * j));

  // Rank 0 and empty views.
  auto s0 = weft::make_tensor<float>();
  weft::copy(s0.view(), weft::select(weft::select(weft::select(src.view(), 0, 1), 0, 2), 0, 3));
  CHECK(*s0.data() == 23.0f);
  auto e0 = weft::make_tensor<float>(0, 4);
  weft::copy(e0.view(), weft::slice(weft::select(src.view(), 1, 0), 0, 0, 0));  // [0, 4]: no-op
  CHECK(e0.size() == 0);
}

TEST_CASE("tensor: a failed copy names both shapes and writes nothing") {
  auto src = weft::make_tensor<float>(3, 2);
  weft::fill(src.view(), 7.0f);
  auto dst = weft::make_tensor<float>(2, 3);
  weft::fill(dst.view(), -1.0f);
  try {
    weft::copy(dst.view(), src.view());
    FAIL("expected shape_error");
  } catch (weft::shape_error const& e) {
    std::string const what = e.what();
    CHECK(what.find("`src`") != std::string::npos);
    CHECK(what.find("expected extents [2, 3] (those of `dst`)") != std::string::npos);
    CHECK(what.find("actual [3, 2]") != std::string::npos);
  }
  for (int i = 0; i < 6; ++i) CHECK(dst.data()[i] == -1.0f);
  // Same element count, different shape, strided path: still nothing written.
  CHECK_THROWS_AS(weft::copy(weft::transpose(dst.view()), weft::as_strided(dst.view())),
                  weft::shape_error);
  for (int i = 0; i < 6; ++i) CHECK(dst.data()[i] == -1.0f);
}

TEST_CASE("tensor: copy between overlapping host views reads all of src before writing dst") {
  // Reference: the same copy from a separate snapshot of the buffer, element by element.
  std::vector<float> buf(16);
  auto reset = [&] {
    for (std::size_t i = 0; i < buf.size(); ++i) buf[i] = static_cast<float>(i);
  };
  // Contiguous, dst after src (a forward memcpy would read elements it already wrote).
  reset();
  weft::copy(hv2(buf.data() + 2, 2, 6), weft::tensor_view<float const, 2>(buf.data(), 2, 6));
  for (int i = 0; i < 16; ++i)
    CHECK(buf[std::size_t(i)] == static_cast<float>(i >= 2 && i < 14 ? i - 2 : i));
  // Contiguous, dst before src.
  reset();
  weft::copy(hv2(buf.data(), 2, 6), hv2(buf.data() + 3, 2, 6));
  for (int i = 0; i < 16; ++i) CHECK(buf[std::size_t(i)] == static_cast<float>(i < 12 ? i + 3 : i));
  // Strided: the even elements shifted by one step (buf[2 i] = old buf[2 i - 2], i = 1..7); an
  // element loop without a snapshot would spread buf[0] over all of them.
  reset();
  auto const even = weft::select(hv2(buf.data(), 8, 2), 1, 0);  // elements 0, 2, ..., 14
  weft::copy(weft::slice(even, 0, 1, 8), weft::slice(even, 0, 0, 7));
  for (int i = 0; i < 16; ++i)
    CHECK(buf[std::size_t(i)] == static_cast<float>(i % 2 == 0 && i >= 2 ? i - 2 : i));
  // In-place transpose of a 4x4 matrix: dst is the transposed view of src's own storage.
  reset();
  hv2 const m(buf.data(), 4, 4);
  weft::copy(m, weft::transpose(m));
  for (int r = 0; r < 4; ++r)
    for (int c = 0; c < 4; ++c) CHECK(buf[std::size_t(r * 4 + c)] == static_cast<float>(c * 4 + r));
  // Strided with a gap: columns 0..2 of a 4x4 matrix into columns 1..3 of the same matrix.
  reset();
  auto const ms = weft::as_strided(m);
  weft::copy(weft::slice(ms, 1, 1, 4), weft::slice(ms, 1, 0, 3));
  for (int r = 0; r < 4; ++r)
    for (int c = 0; c < 4; ++c)
      CHECK(buf[std::size_t(r * 4 + c)] == static_cast<float>(r * 4 + (c == 0 ? 0 : c - 1)));
  // The same view as dst and src is a no-op.
  reset();
  weft::copy(m, m);
  for (int i = 0; i < 16; ++i) CHECK(buf[std::size_t(i)] == static_cast<float>(i));
}

// A user's memory space and executor for copy's device-side checks, in a named namespace like
// random.test.cpp's `mine` (nvcc warns about unused members of types in an anonymous namespace).
namespace copy_test {

// A memory space host code must not dereference, laid over ordinary host memory: it reaches
// copy's checks for device views without a GPU (they throw before any byte is touched).
struct device_space {
  static constexpr std::string_view name = "fake_device";
  static constexpr bool host_accessible = false;
  friend constexpr bool operator==(device_space, device_space) noexcept = default;
};

// An executor of that space: runs its work on the calling thread (the bytes are host memory after
// all) and counts its launches, so a test sees whether a rejected call launched anything.
struct device_queue {
  using executor_concept = weft::executor_tag;
  using memory_space = device_space;
  int* launches = nullptr;
  void synchronize() const noexcept {}
};

template <class F>
void for_each_index(device_queue const& q, std::int64_t n, F f) {
  ++*q.launches;
  for (std::int64_t i = 0; i < n; ++i) f(i);
}

}  // namespace copy_test

static_assert(weft::MemorySpace<copy_test::device_space>);
static_assert(weft::Executor<copy_test::device_queue>);

namespace {

// Runs copy(ex, dst, src) between two views of one 8x8 buffer (dst_of and src_of make them from
// the buffer's address) and checks the result against the same copy read from a separate snapshot
// of the buffer: an overlap-safe copy reads all of src before it writes any of dst.
template <class MakeDst, class MakeSrc>
void check_executor_copy_matches_snapshot(std::string const& what, weft::exec::host const& ex,
                                          MakeDst dst_of, MakeSrc src_of) {
  CAPTURE(what);
  CAPTURE(ex.num_threads);
  std::vector<float> initial(64);
  for (std::size_t i = 0; i < initial.size(); ++i) initial[i] = static_cast<float>(i);
  std::vector<float> snapshot = initial;  // src_of takes float*: views of either constness
  std::vector<float> expected = initial;
  weft::copy(dst_of(expected.data()), src_of(snapshot.data()));  // disjoint buffers
  std::vector<float> buf = initial;
  weft::copy(ex, dst_of(buf.data()), src_of(buf.data()));
  std::size_t first_difference = 0;
  while (first_difference < buf.size() && buf[first_difference] == expected[first_difference])
    ++first_difference;
  CHECK(first_difference == buf.size());
}

using fdv2 = weft::tensor_view<float, 2, copy_test::device_space>;
using fdcv2 = weft::tensor_view<float const, 2, copy_test::device_space>;

// The message of a refused overlapping device copy names the argument, what was expected and
// what was found.
void check_device_overlap_message(std::string const& what) {
  CHECK(what.find("`dst`") != std::string::npos);
  CHECK(what.find("a device view that does not overlap `src`") != std::string::npos);
  CHECK(what.find("overlapping byte ranges") != std::string::npos);
}

}  // namespace

TEST_CASE(
    "tensor: copy(ex, dst, src) between overlapping host views equals a copy from a "
    "snapshot (issue 9.7)") {
  // A team of 2 splits the element loop: without a snapshot each half reads elements that it, or
  // the other half, has already written.
  auto const team = weft::exec::host::parallel(2);
  for (auto const& ex : {team, weft::exec::host{}}) {
    // Contiguous, dst 3 elements after src (a forward loop smears the first 3 values).
    check_executor_copy_matches_snapshot(
        "contiguous, dst after src", ex, [](float* p) { return hv2(p + 3, 4, 12); },
        [](float* p) { return weft::tensor_view<float const, 2>(p, 4, 12); });
    // Contiguous, dst before src.
    check_executor_copy_matches_snapshot(
        "contiguous, dst before src", ex, [](float* p) { return hv2(p, 4, 12); },
        [](float* p) { return hv2(p + 5, 4, 12); });
    // Strided: the even elements shifted by one step (buf[2 i] = old buf[2 i - 2]).
    check_executor_copy_matches_snapshot(
        "strided shift", ex,
        [](float* p) { return weft::slice(weft::select(hv2(p, 32, 2), 1, 0), 0, 1, 32); },
        [](float* p) { return weft::slice(weft::select(hv2(p, 32, 2), 1, 0), 0, 0, 31); });
    // Strided: an in-place transpose of the 8x8 matrix.
    check_executor_copy_matches_snapshot(
        "in-place transpose", ex, [](float* p) { return hv2(p, 8, 8); },
        [](float* p) { return weft::transpose(hv2(p, 8, 8)); });
    // Strided with a gap: columns 0..6 into columns 1..7 of the same matrix.
    check_executor_copy_matches_snapshot(
        "strided with a gap", ex, [](float* p) { return weft::slice(hv2(p, 8, 8), 1, 1, 8); },
        [](float* p) { return weft::slice(hv2(p, 8, 8), 1, 0, 7); });
    // Contiguous dst, strided src: rows 0..3 from the transpose of the [8, 4] block at 16.
    check_executor_copy_matches_snapshot(
        "contiguous dst, strided src", ex, [](float* p) { return hv2(p, 4, 8); },
        [](float* p) { return weft::transpose(hv2(p + 16, 8, 4)); });
    // The same view as dst and src: a no-op.
    check_executor_copy_matches_snapshot(
        "same view", ex, [](float* p) { return hv2(p, 8, 8); },
        [](float* p) { return hv2(p, 8, 8); });
  }
}

TEST_CASE(
    "tensor: copy(ex, dst, src) refuses overlapping device views before launching anything "
    "(issue 9.7)") {
  std::vector<float> buf(16);
  for (std::size_t i = 0; i < buf.size(); ++i) buf[i] = static_cast<float>(i);
  int launches = 0;
  copy_test::device_queue const q{&launches};
  auto const unchanged = [&] {
    for (std::size_t i = 0; i < buf.size(); ++i) CHECK(buf[i] == static_cast<float>(i));
  };
  try {  // contiguous, dst one element after src
    weft::copy(q, fdv2(buf.data() + 1, 2, 6), fdcv2(buf.data(), 2, 6));
    FAIL("expected invalid_argument_error");
  } catch (weft::invalid_argument_error const& e) {
    check_device_overlap_message(e.what());
  }
  // Strided: an in-place transpose; and the same view twice.
  fdv2 const m(buf.data(), 4, 4);
  CHECK_THROWS_AS(weft::copy(q, m, weft::transpose(m)), weft::invalid_argument_error);
  CHECK_THROWS_AS(weft::copy(q, m, m), weft::invalid_argument_error);
  CHECK(launches == 0);
  unchanged();
  // Views that only touch (src ends where dst begins) do not overlap: copied, one launch.
  weft::copy(q, fdv2(buf.data() + 8, 2, 4), fdcv2(buf.data(), 2, 4));
  CHECK(launches == 1);
  for (int i = 0; i < 16; ++i) CHECK(buf[std::size_t(i)] == static_cast<float>(i < 8 ? i : i - 8));
}

#if WEFT_HAS_CUDA_RUNTIME
// copy(dst, src) between device views goes through cudaMemcpy, so it compiles only with the CUDA
// runtime; the overlap check throws before any CUDA call, so no GPU is needed.
TEST_CASE("tensor: copy(dst, src) refuses overlapping device views before writing (issue 9.7)") {
  std::vector<float> buf(16);
  for (std::size_t i = 0; i < buf.size(); ++i) buf[i] = static_cast<float>(i);
  try {
    weft::copy(fdv2(buf.data() + 1, 2, 6), fdcv2(buf.data(), 2, 6));
    FAIL("expected invalid_argument_error");
  } catch (weft::invalid_argument_error const& e) {
    check_device_overlap_message(e.what());
  }
  fdv2 const m(buf.data(), 4, 4);
  CHECK_THROWS_AS(weft::copy(weft::as_strided(m), weft::transpose(m)),
                  weft::invalid_argument_error);
  for (std::size_t i = 0; i < buf.size(); ++i) CHECK(buf[i] == static_cast<float>(i));
}
#endif

TEST_CASE("tensor: fill writes exactly the viewed elements") {
  auto t = weft::make_tensor<int>(3, 4);
  weft::fill(t.view(), 0);
  weft::fill(weft::select(t.view(), 1, 2), 5);                        // column 2
  weft::fill(weft::slice(weft::select(t.view(), 0, 0), 0, 0, 2), 9);  // row 0, columns 0..1
  int const expected[12] = {9, 9, 5, 0,                               //
                            0, 0, 5, 0,                               //
                            0, 0, 5, 0};
  for (int i = 0; i < 12; ++i) CHECK(t.data()[i] == expected[i]);
}

TEST_CASE(
    "tensor: both halves of copy and of fill keep one contract (algorithm/copy.hpp, fill.hpp)") {
  // The host-thread half and the executor half must write the same elements with the same
  // values, leave everything outside dst untouched, and refuse a shape mismatch before writing.
  auto src = iota_234();
  auto const tr = weft::transpose(std::as_const(src).view(), 0, 2);  // [4, 3, 2], strided
  auto a = weft::make_tensor<float>(4, 3, 4);
  auto b = weft::make_tensor<float>(4, 3, 4);
  weft::fill(a.view(), -1.0f);
  weft::fill(weft::exec::host{}, b.view(), -1.0f);
  for (int i = 0; i < 48; ++i) CHECK(a.data()[i] == b.data()[i]);
  auto const a_dst = weft::slice(a.view(), 2, 1, 3);  // [4, 3, 2] inside a [4, 3, 4] buffer
  auto const b_dst = weft::slice(b.view(), 2, 1, 3);
  weft::copy(a_dst, tr);
  weft::copy(weft::exec::host{}, b_dst, tr);
  for (int i = 0; i < 48; ++i) {
    CHECK(a.data()[i] == b.data()[i]);
    if (i % 4 == 0 || i % 4 == 3) CHECK(a.data()[i] == -1.0f);  // outside dst: untouched
  }
  CHECK(a_dst(3, 2, 1) == 23.0f);

  weft::fill(weft::select(a.view(), 1, 1), 5.0f);
  weft::fill(weft::exec::host{}, weft::select(b.view(), 1, 1), 5.0f);
  for (int i = 0; i < 48; ++i) CHECK(a.data()[i] == b.data()[i]);

  auto wrong = weft::make_tensor<float>(2, 3, 4);
  weft::fill(wrong.view(), 0.0f);
  CHECK_THROWS_AS(weft::copy(wrong.view(), tr), weft::shape_error);
  CHECK_THROWS_AS(weft::copy(weft::exec::host{}, wrong.view(), tr), weft::shape_error);
  for (int i = 0; i < 24; ++i) CHECK(wrong.data()[i] == 0.0f);

  auto empty = weft::make_tensor<float>(0, 3);  // empty views: both halves are no-ops
  weft::fill(empty.view(), 1.0f);
  weft::fill(weft::exec::host{}, empty.view(), 1.0f);
  weft::copy(weft::exec::host{}, empty.view(), std::as_const(empty).view());
  CHECK(empty.size() == 0);
}

TEST_CASE("tensor: printer output for small tensors") {
  auto f = weft::make_tensor<float>(2, 3);
  for (int i = 0; i < 6; ++i) f.data()[i] = static_cast<float>(i + 1);
  CHECK(weft::to_string(f.view()) == "tensor<f32>[2, 3] host\n[[1, 2, 3],\n [4, 5, 6]]");
  std::ostringstream os;
  os << f.view();
  CHECK(os.str() == "tensor<f32>[2, 3] host\n[[1, 2, 3],\n [4, 5, 6]]");
  std::ostringstream os2;
  os2 << f;  // the owning tensor prints the same
  CHECK(os2.str() == os.str());

  // i32, padded to a common width, right-aligned.
  auto i = weft::make_tensor<std::int32_t>(2, 2);
  int const iv[4] = {1, -20, 300, 4};
  for (int k = 0; k < 4; ++k) i.data()[k] = iv[k];
  CHECK(weft::to_string(i) == "tensor<i32>[2, 2] host\n[[  1, -20],\n [300,   4]]");

  // Shortest round-trip floats; a strided view prints in its logical order.
  float const fv[4] = {0.5f, 0.1f, -2.0f, 1e20f};
  auto g = weft::make_tensor<float>(2, 2);
  for (int k = 0; k < 4; ++k) g.data()[k] = fv[k];
  CHECK(weft::to_string(weft::transpose(g.view())) ==
        "tensor<f32>[2, 2] host\n[[  0.5,    -2],\n [  0.1, 1e+20]]");

  // Rank 3 separates its matrices by a blank line; rank 1 and rank 0.
  auto t = iota_234();
  CHECK(weft::to_string(weft::slice(t.view(), 2, 0, 2)) ==
        "tensor<f32>[2, 3, 2] host\n"
        "[[[ 0,  1],\n"
        "  [ 4,  5],\n"
        "  [ 8,  9]],\n"
        "\n"
        " [[12, 13],\n"
        "  [16, 17],\n"
        "  [20, 21]]]");
  CHECK(weft::to_string(weft::select(weft::select(t.view(), 0, 1), 0, 2)) ==
        "tensor<f32>[4] host\n[20, 21, 22, 23]");
  auto s = weft::make_tensor<double>();
  *s.data() = 2.25;
  CHECK(weft::to_string(s) == "tensor<f64>[] host\n2.25");

  // Empty tensors.
  auto e = weft::make_tensor<float>(0, 3);
  CHECK(weft::to_string(e) == "tensor<f32>[0, 3] host\n[]");
  auto e2 = weft::make_tensor<float>(2, 0);
  CHECK(weft::to_string(e2) == "tensor<f32>[2, 0] host\n[]");

  // bf16 and f16 print the float they hold.
  auto h = weft::make_tensor<weft::bf16>(3);
  h.data()[0] = weft::bf16(1.5f);
  h.data()[1] = weft::bf16(-0.25f);
  h.data()[2] = weft::bf16(3.0f);
  CHECK(weft::to_string(h) == "tensor<bf16>[3] host\n[  1.5, -0.25,     3]");
  auto h16 = weft::make_tensor<weft::f16>(1);
  h16.data()[0] = weft::f16(65504.0f);
  CHECK(weft::to_string(h16) == "tensor<f16>[1] host\n[65504]");
}

TEST_CASE("tensor: printer summarises large tensors with ...") {
  auto big = weft::make_tensor<std::int64_t>(2000);
  for (int k = 0; k < 2000; ++k) big.data()[k] = k;
  CHECK(weft::to_string(big) ==
        "tensor<i64>[2000] host\n[   0,    1,    2, ..., 1997, 1998, 1999]");

  auto m = weft::make_tensor<std::int32_t>(40, 40);
  for (int k = 0; k < 1600; ++k) m.data()[k] = k % 10;
  std::string const text = weft::to_string(m, {.threshold = 1000, .edge_items = 2});
  CHECK(text ==
        "tensor<i32>[40, 40] host\n"
        "[[0, 1, ..., 8, 9],\n"
        " [0, 1, ..., 8, 9],\n"
        " ...,\n"
        " [0, 1, ..., 8, 9],\n"
        " [0, 1, ..., 8, 9]]");
  // Below the threshold nothing is elided.
  auto small = weft::make_tensor<std::int32_t>(8);
  for (int k = 0; k < 8; ++k) small.data()[k] = k;
  CHECK(weft::to_string(small) == "tensor<i32>[8] host\n[0, 1, 2, 3, 4, 5, 6, 7]");
}

TEST_CASE("tensor: copy_bytes and host allocation") {
  void* p = weft::allocate_bytes(host_space{}, 100);
  CHECK(reinterpret_cast<std::uintptr_t>(p) % weft::host_alignment == 0);
  unsigned char const src[5] = {1, 2, 3, 4, 5};
  weft::copy_bytes(host_space{}, p, host_space{}, src, 5);
  CHECK(static_cast<unsigned char*>(p)[4] == 5);
  weft::copy_bytes(host_space{}, nullptr, host_space{}, nullptr, 0);  // zero bytes: no-op
  CHECK_THROWS_AS(weft::copy_bytes(host_space{}, nullptr, host_space{}, src, 5),
                  weft::invalid_argument_error);
  weft::deallocate_bytes(host_space{}, p, 100);
  CHECK(weft::allocate_bytes(host_space{}, 0) == nullptr);
  CHECK(host_space::name == "host");
  CHECK(cuda_space::name == "cuda");
}

#if WEFT_CUDA_COMPILER && WEFT_HAS_CUDA_RUNTIME
// Runs only in the CUDA twin (label gpu) on a machine with a GPU.
TEST_CASE("tensor: copies through device memory round-trip (gpu)") {
  auto src = iota_234();
  auto dev = weft::make_tensor<float, cuda_space>(2, 3, 4);
  CHECK(reinterpret_cast<std::uintptr_t>(dev.data()) % 256 == 0);
  weft::copy(dev.view(), src.view());  // host -> device, one cudaMemcpy
  auto back = weft::make_tensor<float>(4, 3, 2);
  // device contiguous -> host strided goes through a host staging buffer
  weft::copy(weft::transpose(back.view(), 0, 2), dev.view());
  for (int a = 0; a < 4; ++a)
    for (int b = 0; b < 3; ++b)
      for (int c = 0; c < 2; ++c)
        CHECK(back.view()(a, b, c) == static_cast<float>(12 * c + 4 * b + a));
  CHECK(weft::to_string(weft::slice(dev.view(), 0, 0, 1))
            .find("tensor<f32>[1, 3, 4] cuda\n[[[ 0,  1,  2,  3],") == 0);
  // A strided device view cannot be copied without a kernel.
  CHECK_THROWS_AS(weft::copy(back.view(), weft::transpose(dev.view(), 0, 2)), weft::error);
  // Overlapping device views are refused by both halves before anything is written (issue 9.7).
  auto const flat = weft::flatten(dev.view());
  CHECK_THROWS_AS(weft::copy(weft::slice(flat, 0, 1, 24), weft::slice(flat, 0, 0, 23)),
                  weft::invalid_argument_error);
  CHECK_THROWS_AS(
      weft::copy(weft::exec::cuda{}, weft::slice(flat, 0, 1, 24), weft::slice(flat, 0, 0, 23)),
      weft::invalid_argument_error);
  auto again = weft::make_tensor<float>(2, 3, 4);
  weft::copy(again.view(), dev.view());
  for (int i = 0; i < 24; ++i) CHECK(again.data()[i] == static_cast<float>(i));
}
#endif
