// Tests for weft/core/random.hpp: Philox4x32-10 against Random123's known answers, the documented
// (seed, stream, index) -> value mapping against direct Philox calls, distribution sanity with
// fixed seeds, sharded fills against the whole fill bit for bit (also from threads), fills through
// a user's executor (the generic fill over any Executor, house_style probe A.3), errors.
#include <weft/core/random.hpp>

#include <weft/core/exec.hpp>
#include <weft/core/tensor.hpp>

#include <doctest/doctest.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <string>
#include <thread>
#include <vector>

#if defined(__CUDACC__) && WEFT_HAS_CUDA_RUNTIME
#include <weft/core/cuda/random.cuh>
#endif

#if defined(__CUDACC__) && __has_include(<curand_kernel.h>)
// cuRAND's Philox4_32_10 is an independent implementation of the same counter layout: its device
// functions are plain C, so redefining their qualifiers lets the host call them.
#define QUALIFIERS static inline __host__ __device__
#include <curand_kernel.h>
#define WEFT_TEST_HAS_CURAND 1
#endif

// A user's executor (house_style.md probe A.3): it opts in with the tag, names its memory space,
// can synchronize, and provides for_each_index by ADL (here as a plain loop counting its calls).
// weft's generic fill_uniform/fill_normal must accept it and fill exactly as exec::host does.
namespace mine {
struct pool {
  using executor_concept = weft::executor_tag;
  using memory_space = weft::host_space;
  int* calls = nullptr;
  void synchronize() const noexcept {}
};
template <class F>
void for_each_index(pool const& p, std::int64_t n, F f) {
  if (p.calls != nullptr) ++*p.calls;
  for (std::int64_t i = 0; i < n; ++i) f(i);
}
}  // namespace mine

namespace {

using weft::philox_counter;
using weft::philox_key;

template <class T, std::size_t Rank, class Layout = cuda::std::layout_right>
using host_view =
    cuda::std::mdspan<T, weft::dextents<Rank>, Layout, weft::space_accessor<T, weft::host_space>>;

template <class T>
std::uint64_t bits_u64(T x) {
  if constexpr (sizeof(T) == 2) {
    return x.bits();
  } else if constexpr (sizeof(T) == 4) {
    std::uint32_t u;
    std::memcpy(&u, &x, 4);
    return u;
  } else {
    std::uint64_t u;
    std::memcpy(&u, &x, 8);
    return u;
  }
}

template <class T>
bool bitwise_equal(std::vector<T> const& a, std::vector<T> const& b) {
  if (a.size() != b.size()) return false;
  for (std::size_t i = 0; i < a.size(); ++i) {
    if (bits_u64(a[i]) != bits_u64(b[i])) return false;
  }
  return true;
}

template <class T>
std::size_t count_bitwise_equal(std::vector<T> const& a, std::vector<T> const& b) {
  std::size_t n = 0;
  for (std::size_t i = 0; i < a.size(); ++i) n += bits_u64(a[i]) == bits_u64(b[i]) ? 1 : 0;
  return n;
}

// Words of a test-side Philox call for the documented counter layout.
philox_counter reference_block(std::uint64_t seed, std::uint64_t stream, std::uint64_t b) {
  return weft::philox4x32_10(
      {static_cast<std::uint32_t>(b), static_cast<std::uint32_t>(b >> 32),
       static_cast<std::uint32_t>(stream), static_cast<std::uint32_t>(stream >> 32)},
      {static_cast<std::uint32_t>(seed), static_cast<std::uint32_t>(seed >> 32)});
}

struct moments {
  double mean = 0;
  double var = 0;
  double min = std::numeric_limits<double>::infinity();
  double max = -std::numeric_limits<double>::infinity();
};

template <class F>
moments moments_of(std::uint64_t n, F&& f) {
  // Two passes in double: the data are small (1e6) and this keeps the reference obviously right.
  std::vector<double> xs(n);
  moments m;
  for (std::uint64_t i = 0; i < n; ++i) {
    xs[i] = static_cast<double>(f(i));
    m.mean += xs[i];
    m.min = std::min(m.min, xs[i]);
    m.max = std::max(m.max, xs[i]);
  }
  m.mean /= static_cast<double>(n);
  for (double x : xs) m.var += (x - m.mean) * (x - m.mean);
  m.var /= static_cast<double>(n - 1);
  return m;
}

constexpr std::int64_t rows = 64;
constexpr std::int64_t cols = 48;

// The whole [64, 48] tensor filled by `fill(view, placement)`.
template <class T, class Fill>
std::vector<T> fill_whole(Fill const& fill) {
  auto t = weft::make_tensor<T>(rows, cols);
  fill(t.view(), weft::placement{});
  return std::vector<T>(t.data(), t.data() + t.size());
}

// Shards given as (row offset, rows, col offset, cols), each filled into its own buffer and then
// copied into place in a [64, 48] result.
struct tile {
  std::int64_t r0, nr, c0, nc;
};

template <class T, class Fill>
std::vector<T> fill_tiles(Fill const& fill, std::vector<tile> const& tiles) {
  std::vector<T> out(rows * cols, T(-7.0f));
  for (tile const& t : tiles) {
    auto local = weft::make_tensor<T>(t.nr, t.nc);
    fill(local.view(), weft::placement{.global_extents = {rows, cols}, .offsets = {t.r0, t.c0}});
    for (std::int64_t r = 0; r < t.nr; ++r)
      for (std::int64_t c = 0; c < t.nc; ++c)
        out[(t.r0 + r) * cols + t.c0 + c] = local.data()[r * t.nc + c];
  }
  return out;
}

std::vector<tile> row_shards(std::vector<std::int64_t> const& cuts) {
  std::vector<tile> t;
  for (std::size_t k = 0; k + 1 < cuts.size(); ++k)
    t.push_back({cuts[k], cuts[k + 1] - cuts[k], 0, cols});
  return t;
}
std::vector<tile> col_shards(std::vector<std::int64_t> const& cuts) {
  std::vector<tile> t;
  for (std::size_t k = 0; k + 1 < cuts.size(); ++k)
    t.push_back({0, rows, cuts[k], cuts[k + 1] - cuts[k]});
  return t;
}

// All the sharding layouts of the [64, 48] tensor the tests compare with the whole fill.
template <class T, class Fill>
void check_every_sharding(Fill const& fill) {
  std::vector<T> const whole = fill_whole<T>(fill);

  CHECK(bitwise_equal(whole, fill_tiles<T>(fill, row_shards({0, 16, 32, 48, 64}))));
  CHECK(bitwise_equal(whole, fill_tiles<T>(fill, col_shards({0, 16, 32, 48}))));
  CHECK(bitwise_equal(
      whole,
      fill_tiles<T>(fill, {{0, 32, 0, 24}, {0, 32, 24, 24}, {32, 32, 0, 24}, {32, 32, 24, 24}})));
  // Cuts that do not fall on Philox blocks (4 floats, 2 doubles): lanes must be picked right.
  CHECK(bitwise_equal(whole, fill_tiles<T>(fill, row_shards({0, 1, 7, 30, 63, 64}))));
  CHECK(bitwise_equal(whole, fill_tiles<T>(fill, col_shards({0, 13, 30, 31, 48}))));
  CHECK(bitwise_equal(
      whole, fill_tiles<T>(fill, {{0, 5, 0, 7}, {0, 5, 7, 41}, {5, 59, 0, 7}, {5, 59, 7, 41}})));

  // Cyclic (strided) row sharding: shard s holds global rows s, s + 3, s + 6, ...
  {
    std::vector<T> out(rows * cols);
    for (std::int64_t s = 0; s < 3; ++s) {
      std::int64_t const nr = (rows - s + 2) / 3;
      std::vector<T> local(static_cast<std::size_t>(nr * cols));
      fill(host_view<T, 2>(local.data(), nr, cols),
           weft::placement{.global_extents = {rows, cols}, .offsets = {s, 0}, .steps = {3, 1}});
      for (std::int64_t r = 0; r < nr; ++r)
        std::copy_n(local.begin() + r * cols, cols, out.begin() + (s + 3 * r) * cols);
    }
    CHECK(bitwise_equal(whole, out));
  }
  // Every other column, written through a strided subview of a bigger local buffer
  // (layout_stride), and a layout_left shard: values follow the logical position, not the memory
  // layout.
  {
    std::vector<T> out(rows * cols);
    for (std::int64_t s = 0; s < 2; ++s) {
      auto big = weft::make_tensor<T>(rows, 2 * cols);
      weft::fill(big.view(), T(0.0f));
      // Columns 0, 3, ..., 69 of the big buffer hold global columns s, s + 2, ..., s + 46.
      auto strided = weft::subview(
          big.view(), weft::all,
          cuda::std::strided_slice<std::int64_t, std::int64_t, std::int64_t>{0, 70, 3});
      static_assert(
          std::is_same_v<typename decltype(strided)::layout_type, cuda::std::layout_stride>);
      REQUIRE(strided.extent(1) == cols / 2);
      fill(strided,
           weft::placement{.global_extents = {rows, cols}, .offsets = {0, s}, .steps = {1, 2}});
      for (std::int64_t r = 0; r < rows; ++r)
        for (std::int64_t c = 0; c < cols / 2; ++c)
          out[r * cols + s + 2 * c] = big.data()[r * 2 * cols + 3 * c];
    }
    CHECK(bitwise_equal(whole, out));
  }
  {
    std::vector<T> out(rows * cols);
    for (std::int64_t s = 0; s < 2; ++s) {
      std::vector<T> local(static_cast<std::size_t>(32 * cols));
      host_view<T, 2, cuda::std::layout_left> left(local.data(), 32, cols);
      fill(left, weft::placement{.global_extents = {rows, cols}, .offsets = {32 * s, 0}});
      for (std::int64_t r = 0; r < 32; ++r)
        for (std::int64_t c = 0; c < cols; ++c) out[(32 * s + r) * cols + c] = local[c * 32 + r];
    }
    CHECK(bitwise_equal(whole, out));
  }
}

template <class T>
struct uniform_fill {
  weft::rng gen;
  double lo, hi;
  template <class View>
  void operator()(View v, weft::placement const& p) const {
    weft::fill_uniform(v, gen, lo, hi, p);
  }
};

template <class T>
struct normal_fill {
  weft::rng gen;
  double mean, stddev;
  template <class View>
  void operator()(View v, weft::placement const& p) const {
    weft::fill_normal(v, gen, mean, stddev, p);
  }
};

// The CUDA path (one index per Philox block of a row, see random.cuh) emulated on the host: an
// executor whose memory space is not host-accessible makes detail::run_fill take the chunked
// branch, and a view whose accessor counts writes shows that every element is written once.
// (WEFT_HD only because the fill functors are WEFT_HD in this file's nvcc twin.)
struct fake_device_space {
  static constexpr bool host_accessible = false;
};
struct fake_device_exec {
  using memory_space = fake_device_space;
};
template <class F>
void for_each_index(fake_device_exec const&, std::int64_t n, F const& f) {
  for (std::int64_t i = n; i-- > 0;) f(i);  // any order must do: run it backwards
}

struct counted_handle {
  float* data;
  int* writes;
};
struct counting_ref {
  float* p;
  int* w;
  WEFT_HD counting_ref& operator=(float v) {
    *p = v;
    ++*w;
    return *this;
  }
};
struct counting_accessor {
  using offset_policy = counting_accessor;
  using element_type = float;
  using reference = counting_ref;
  using data_handle_type = counted_handle;
  WEFT_HD reference access(data_handle_type h, std::size_t i) const {
    return {h.data + i, h.writes + i};
  }
  WEFT_HD data_handle_type offset(data_handle_type h, std::size_t i) const {
    return {h.data + i, h.writes + i};
  }
};

// A distribution that counts its Philox blocks, to check that the chunked path aligns chunks to
// blocks (one Philox call per block a row touches).
struct counting_uniform {
  using value_type = float;
  static constexpr int per_block = 4;
  weft::random_uniform<float> inner;
  std::int64_t* calls;
  WEFT_HD cuda::std::array<float, 4> block(std::uint64_t b) const {
    ++*calls;
    return inner.block(b);
  }
};

// Runs `dist` over a [nr, nc] shard at (r0, c0) with column step `step` of the [64, 48] tensor
// through the chunked path; returns the values, and checks each element was written once.
template <class Dist>
std::vector<float> chunked_fill(Dist const& dist, std::int64_t r0, std::int64_t nr, std::int64_t c0,
                                std::int64_t nc, std::int64_t step) {
  std::vector<float> values(static_cast<std::size_t>(nr * nc), -1.0f);
  std::vector<int> writes(values.size(), 0);
  using view =
      cuda::std::mdspan<float, weft::dextents<2>, cuda::std::layout_right, counting_accessor>;
  view const v(counted_handle{values.data(), writes.data()}, weft::dextents<2>(nr, nc));
  weft::detail::run_fill(
      fake_device_exec{}, dist, v,
      weft::placement{.global_extents = {rows, cols}, .offsets = {r0, c0}, .steps = {1, step}});
  CHECK(std::all_of(writes.begin(), writes.end(), [](int w) { return w == 1; }));
  return values;
}

}  // namespace

// ---- Philox and the mapping ------------------------------------------------------------------

// Random123 v1.14.0, tests/kat_vectors (github.com/DEShawResearch/random123), the three
// "philox4x32 10" lines: counter (4 words), key (2 words), expected output (4 words).
TEST_CASE("random: philox4x32_10 reproduces Random123's known-answer vectors") {
  struct kat {
    philox_counter ctr;
    philox_key key;
    philox_counter expected;
  };
  std::array<kat, 3> const kats = {{
      {{0x00000000u, 0x00000000u, 0x00000000u, 0x00000000u},
       {0x00000000u, 0x00000000u},
       {0x6627e8d5u, 0xe169c58du, 0xbc57ac4cu, 0x9b00dbd8u}},
      {{0xffffffffu, 0xffffffffu, 0xffffffffu, 0xffffffffu},
       {0xffffffffu, 0xffffffffu},
       {0x408f276du, 0x41c83b0eu, 0xa20bc7c6u, 0x6d5451fdu}},
      {{0x243f6a88u, 0x85a308d3u, 0x13198a2eu, 0x03707344u},
       {0xa4093822u, 0x299f31d0u},
       {0xd16cfe09u, 0x94fdccebu, 0x5001e420u, 0x24126ea1u}},
  }};
  for (kat const& k : kats) {
    philox_counter const out = weft::philox4x32_10(k.ctr, k.key);
    for (std::size_t w = 0; w < 4; ++w) CHECK(out[w] == k.expected[w]);
  }
  // Usable in constant expressions (and so the same on every compiler).
  static_assert(weft::philox4x32_10({0x243f6a88u, 0x85a308d3u, 0x13198a2eu, 0x03707344u},
                                    {0xa4093822u, 0x299f31d0u})[3] == 0x24126ea1u);
}

TEST_CASE("random: rng values follow the documented counter layout") {
  std::uint64_t const seeds[] = {0, 42, 0x0123456789abcdefull};
  std::uint64_t const streams[] = {0, 1, 0xfedcba9876543210ull};
  std::uint64_t const indices[] = {0,
                                   1,
                                   2,
                                   3,
                                   4,
                                   5,
                                   6,
                                   7,
                                   1000003,
                                   (std::uint64_t{1} << 34) + 5,
                                   ~std::uint64_t{0} - 3,
                                   ~std::uint64_t{0}};
  for (std::uint64_t seed : seeds) {
    for (std::uint64_t stream : streams) {
      weft::rng const g(seed, stream);
      CHECK(g.seed() == seed);
      CHECK(g.stream() == stream);
      for (std::uint64_t i : indices) {
        philox_counter const w4 = reference_block(seed, stream, i / 4);
        philox_counter const w2 = reference_block(seed, stream, i / 2);
        std::uint32_t const b32 = w4[i % 4];
        std::uint64_t const b64 =
            (std::uint64_t{w2[2 * (i % 2) + 1]} << 32) | std::uint64_t{w2[2 * (i % 2)]};
        CHECK(g.bits32(i) == b32);
        CHECK(g.bits64(i) == b64);
        CHECK(g.uniform_float(i) == std::ldexp(static_cast<float>(b32 >> 8), -24));
        CHECK(g.uniform_double(i) == std::ldexp(static_cast<double>(b64 >> 11), -53));

        // Box-Muller written out from the header's formulas, in float and double.
        std::size_t const pair = (i % 4) / 2;
        float const u1 = std::ldexp(static_cast<float>((w4[2 * pair] >> 8) + 1), -24);
        float const u2 = std::ldexp(static_cast<float>(w4[2 * pair + 1] >> 8), -24);
        float const r = std::sqrt(-2.0f * std::log(u1));
        float const t = 6.28318530717958647692f * u2;
        float const zf = (i % 2 == 0) ? r * std::cos(t) : r * std::sin(t);
        CHECK(g.normal_float(i) == doctest::Approx(zf).epsilon(1e-6));
        std::uint64_t const q0 = (std::uint64_t{w2[1]} << 32) | w2[0];
        std::uint64_t const q1 = (std::uint64_t{w2[3]} << 32) | w2[2];
        double const d1 = std::ldexp(static_cast<double>((q0 >> 11) + 1), -53);
        double const d2 = std::ldexp(static_cast<double>(q1 >> 11), -53);
        double const rd = std::sqrt(-2.0 * std::log(d1));
        double const td = 6.28318530717958647692 * d2;
        double const zd = (i % 2 == 0) ? rd * std::cos(td) : rd * std::sin(td);
        CHECK(g.normal_double(i) == doctest::Approx(zd).epsilon(1e-12));
      }
    }
  }
  CHECK(weft::rng(5, 1).with_stream(9) == weft::rng(5, 9));
}

#if defined(WEFT_TEST_HAS_CURAND)
TEST_CASE("random: bits32 equals cuRAND's Philox4_32_10 at curand_init(seed, stream, index)") {
  for (std::uint64_t seed :
       {std::uint64_t{0}, std::uint64_t{42}, std::uint64_t{0x0123456789abcdefull}}) {
    for (std::uint64_t stream :
         {std::uint64_t{0}, std::uint64_t{7}, std::uint64_t{0xfedcba9876543210ull}}) {
      for (std::uint64_t offset :
           {std::uint64_t{0}, std::uint64_t{5}, (std::uint64_t{1} << 40) + 3}) {
        curandStatePhilox4_32_10_t state;
        curand_init(seed, stream, offset, &state);
        weft::rng const g(seed, stream);
        for (std::uint64_t k = 0; k < 9; ++k) CHECK(curand(&state) == g.bits32(offset + k));
      }
    }
  }
}
#endif

TEST_CASE("random: uniform_int is floor(bits64 * n / 2^64), always below n") {
  weft::rng const g(2024, 3);
  __extension__ using u128 = unsigned __int128;
  for (std::uint32_t n : {1u, 2u, 3u, 10u, 1000u, 0x80000001u, 0xffffffffu}) {
    for (std::uint64_t i = 0; i < 2000; ++i) {
      auto const expected = static_cast<std::uint32_t>((u128{g.bits64(i)} * n) >> 64);
      std::uint32_t const v = g.uniform_int(i, n);
      REQUIRE(v == expected);
      REQUIRE(v < n);
    }
  }
  // The extremes of the 64 random bits map to 0 and n - 1.
  CHECK(weft::rng::scale_to(0, 7) == 0);
  CHECK(weft::rng::scale_to(~std::uint64_t{0}, 7) == 6);
  CHECK(weft::rng::scale_to(~std::uint64_t{0}, 0xffffffffu) == 0xfffffffeu);

  // Chi-square over 10 bins of 1e6 draws: 9 degrees of freedom, mean 9, sd 4.24; 40 is > 7 sd.
  std::array<double, 10> count{};
  std::uint64_t const draws = 1'000'000;
  for (std::uint64_t i = 0; i < draws; ++i) count[g.uniform_int(i, 10)] += 1;
  double chi2 = 0;
  for (double c : count) chi2 += (c - 1e5) * (c - 1e5) / 1e5;
  CHECK(chi2 < 40.0);
}

// ---- distributions ---------------------------------------------------------------------------

TEST_CASE("random: unit values are exact, below 1, and reach both ends") {
  // The largest word gives the largest value below 1, exactly.
  CHECK(weft::rng::unit_float(0xffffffffu) == 1.0f - std::ldexp(1.0f, -24));
  CHECK(weft::rng::unit_float(0xffffffffu) < 1.0f);
  CHECK(weft::rng::unit_float(0xffu) == 0.0f);
  CHECK(weft::rng::unit_double(~std::uint64_t{0}) == 1.0 - std::ldexp(1.0, -53));
  CHECK(weft::rng::unit_double(~std::uint64_t{0}) < 1.0);

  weft::rng const g(7, 0);
  std::uint64_t const n = 1'000'000;
  bool all_exact = true;
  for (std::uint64_t i = 0; i < n; ++i) {
    float const u = g.uniform_float(i);
    float const scaled = std::ldexp(u, 24);
    all_exact = all_exact && u >= 0.0f && u < 1.0f && scaled == std::floor(scaled);
  }
  CHECK(all_exact);

  // from_unit steps back from hi when the fma rounds onto it: u = 1 - 2^-24 in [1, 2) is a tie
  // between 2 - 2^-23 and 2, which goes to 2.
  weft::random_uniform<float> const one_two(g, 1.0f, 2.0f);
  float const top = one_two.from_unit(1.0f - std::ldexp(1.0f, -24));
  CHECK(top < 2.0f);
  CHECK(top == 2.0f - std::ldexp(1.0f, -23));
  CHECK(one_two.from_unit(0.0f) == 1.0f);
  weft::random_uniform<float> const point(g, 3.0f, 3.0f);
  CHECK(point.from_unit(0.5f) == 3.0f);
}

TEST_CASE("random: 1e6 uniforms have the moments of U[0, 1)") {
  std::uint64_t const n = 1'000'000;
  // Mean 1/2 with sd sqrt(1/12 / n) = 2.9e-4; variance 1/12 with sd sqrt((1/80 - 1/144) / n) =
  // 7.5e-5. Bounds are 5 sd.
  moments const f =
      moments_of(n, [g = weft::rng(11, 0)](std::uint64_t i) { return g.uniform_float(i); });
  CHECK(std::abs(f.mean - 0.5) < 5 * 2.9e-4);
  CHECK(std::abs(f.var - 1.0 / 12) < 5 * 7.5e-5);
  CHECK(f.min >= 0.0);
  CHECK(f.min < 1e-5);  // P(min of 1e6 >= 1e-5) = e^-10
  CHECK(f.max < 1.0);
  CHECK(f.max > 1 - 1e-5);

  moments const d =
      moments_of(n, [g = weft::rng(11, 1)](std::uint64_t i) { return g.uniform_double(i); });
  CHECK(std::abs(d.mean - 0.5) < 5 * 2.9e-4);
  CHECK(std::abs(d.var - 1.0 / 12) < 5 * 7.5e-5);
  CHECK(d.min >= 0.0);
  CHECK(d.max < 1.0);

  // Scaled: U[-3, 5) has mean 1 and variance 64/12.
  weft::random_uniform<float> const u(weft::rng(11, 2), -3.0f, 5.0f);
  moments const s = moments_of(n, u);
  CHECK(std::abs(s.mean - 1.0) < 5 * 8 * 2.9e-4);
  CHECK(std::abs(s.var - 64.0 / 12) < 5 * 64 * 7.5e-5);
  CHECK(s.min >= -3.0);
  CHECK(s.max < 5.0);

  // 1000 equal bins: chi-square with 999 dof has sd 44.7; 999 + 5 sd = 1223.
  std::vector<double> bins(1000, 0.0);
  weft::rng const g(11, 3);
  for (std::uint64_t i = 0; i < n; ++i)
    bins[static_cast<std::size_t>(g.uniform_float(i) * 1000.0f)] += 1;
  double chi2 = 0;
  for (double c : bins) chi2 += (c - 1000.0) * (c - 1000.0) / 1000.0;
  CHECK(chi2 < 1223.0);
}

TEST_CASE("random: 1e6 normals have the moments of N(0, 1)") {
  std::uint64_t const n = 1'000'000;
  for (int kind = 0; kind < 2; ++kind) {
    CAPTURE(kind);
    weft::rng const g(12345, 9);
    auto const draw = [&](std::uint64_t i) {
      return kind == 0 ? static_cast<double>(g.normal_float(i)) : g.normal_double(i);
    };
    // Mean 0 (sd 1e-3), variance 1 (sd sqrt(2 / n) = 1.41e-3), fourth moment 3 (sd sqrt(96 / n)
    // = 9.8e-3), P(|z| < 1) = 0.682689 (sd 4.7e-4). Bounds are 5 sd.
    moments const m = moments_of(n, draw);
    double m4 = 0;
    double inside = 0;
    for (std::uint64_t i = 0; i < n; ++i) {
      double const z = draw(i);
      m4 += z * z * z * z;
      inside += std::abs(z) < 1.0 ? 1.0 : 0.0;
    }
    m4 /= static_cast<double>(n);
    inside /= static_cast<double>(n);
    CHECK(std::abs(m.mean) < 5e-3);
    CHECK(std::abs(m.var - 1.0) < 5 * 1.41e-3);
    CHECK(std::abs(m4 - 3.0) < 5 * 9.8e-3);
    CHECK(std::abs(inside - 0.682689) < 5 * 4.7e-4);
    CHECK(std::isfinite(m.min));
    CHECK(std::isfinite(m.max));
    CHECK(m.min < -4.0);  // P(no draw beyond 4 sd in 1e6) = (1 - 3.2e-5)^1e6, about e^-32
    CHECK(m.max > 4.0);
  }
  // The float radius is bounded by u1 >= 2^-24: never beyond sqrt(48 ln 2) = 5.77.
  CHECK(std::sqrt(-2.0f * std::log(std::ldexp(1.0f, -24))) < 5.8f);

  // mean + stddev * z.
  weft::random_normal<float> const nf(weft::rng(3, 4), 2.0f, 0.5f);
  moments const s = moments_of(n, nf);
  CHECK(std::abs(s.mean - 2.0) < 5 * 0.5e-3);
  CHECK(std::abs(s.var - 0.25) < 5 * 0.25 * 1.41e-3);
  weft::rng const g(3, 4);
  for (std::uint64_t i = 0; i < 64; ++i) CHECK(nf(i) == std::fma(g.normal_float(i), 0.5f, 2.0f));
}

TEST_CASE("random: streams and seeds give unrelated sequences") {
  std::uint64_t const n = 200'000;
  weft::rng const a(1, 0);
  weft::rng const b(1, 1);
  weft::rng const c(2, 0);
  std::uint64_t same_ab = 0;
  std::uint64_t same_ac = 0;
  double corr_ab = 0;
  for (std::uint64_t i = 0; i < n; ++i) {
    same_ab += a.bits32(i) == b.bits32(i) ? 1 : 0;
    same_ac += a.bits32(i) == c.bits32(i) ? 1 : 0;
    corr_ab += (a.uniform_double(i) - 0.5) * (b.uniform_double(i) - 0.5);
  }
  CHECK(same_ab < 3);  // expected n / 2^32 = 5e-5
  CHECK(same_ac < 3);
  // Correlation coefficient: sd 1 / sqrt(n) = 2.2e-3 under independence; bound 5 sd.
  CHECK(std::abs(corr_ab / static_cast<double>(n) * 12.0) < 5 * 2.24e-3);
}

// ---- fills -------------------------------------------------------------------------------------

TEST_CASE("random: a whole fill is the element-wise function of the row-major index") {
  weft::rng const g(99, 5);
  {
    std::vector<float> out = fill_whole<float>(uniform_fill<float>{g, -0.25, 0.75});
    weft::random_uniform<float> const u(g, -0.25f, 0.75f);
    bool same = true;
    for (std::int64_t i = 0; i < rows * cols; ++i)
      same = same && out[i] == u(static_cast<std::uint64_t>(i));
    CHECK(same);
  }
  {
    std::vector<float> out = fill_whole<float>(normal_fill<float>{g, 0.0, 1.0});
    bool same = true;
    for (std::int64_t i = 0; i < rows * cols; ++i)
      same = same && bits_u64(out[i]) == bits_u64(g.normal_float(static_cast<std::uint64_t>(i)));
    CHECK(same);
  }
  {
    std::vector<double> out = fill_whole<double>(uniform_fill<double>{g, 0.0, 1.0});
    bool same = true;
    for (std::int64_t i = 0; i < rows * cols; ++i)
      same = same && out[i] == g.uniform_double(static_cast<std::uint64_t>(i));
    CHECK(same);
  }
  {
    std::vector<double> out = fill_whole<double>(normal_fill<double>{g, 0.0, 1.0});
    bool same = true;
    for (std::int64_t i = 0; i < rows * cols; ++i)
      same = same && bits_u64(out[i]) == bits_u64(g.normal_double(static_cast<std::uint64_t>(i)));
    CHECK(same);
  }
  // bf16 / f16: the float value rounded once to nearest even.
  {
    std::vector<weft::bf16> out = fill_whole<weft::bf16>(normal_fill<weft::bf16>{g, 1.0, 0.02});
    weft::random_normal<float> const nf(g, 1.0f, 0.02f);
    bool same = true;
    for (std::int64_t i = 0; i < rows * cols; ++i)
      same = same && out[i].bits() == weft::bf16(nf(static_cast<std::uint64_t>(i))).bits();
    CHECK(same);
  }
  {
    std::vector<weft::f16> out = fill_whole<weft::f16>(uniform_fill<weft::f16>{g, -2.0, 2.0});
    weft::random_uniform<float> const uf(g, -2.0f, 2.0f);
    bool same = true;
    for (std::int64_t i = 0; i < rows * cols; ++i)
      same = same && out[i].bits() == weft::f16(uf(static_cast<std::uint64_t>(i))).bits();
    CHECK(same);
  }
}

TEST_CASE_TEMPLATE("random: every sharding of a [64, 48] tensor equals the whole fill bit for bit",
                   T, float, double, weft::bf16, weft::f16) {
  check_every_sharding<T>(uniform_fill<T>{weft::rng(2718, 1), -0.5, 0.5});
  check_every_sharding<T>(normal_fill<T>{weft::rng(31415, 0), 0.0, 0.02});
}

TEST_CASE_TEMPLATE("random: different seeds and streams fill differently", T, float, double,
                   weft::bf16, weft::f16) {
  std::vector<T> const base = fill_whole<T>(normal_fill<T>{weft::rng(1, 0), 0.0, 1.0});
  std::vector<T> const seed2 = fill_whole<T>(normal_fill<T>{weft::rng(2, 0), 0.0, 1.0});
  std::vector<T> const stream1 = fill_whole<T>(normal_fill<T>{weft::rng(1, 1), 0.0, 1.0});
  std::vector<T> const again = fill_whole<T>(normal_fill<T>{weft::rng(1, 0), 0.0, 1.0});
  CHECK(bitwise_equal(base, again));
  // 16-bit types collide by chance about once in a few hundred; 5% is far above that.
  std::size_t const limit = sizeof(T) == 2 ? base.size() / 20 : 2;
  CHECK(count_bitwise_equal(base, seed2) < limit);
  CHECK(count_bitwise_equal(base, stream1) < limit);
}

TEST_CASE("random: fills of 1-D, 3-D and 0-D views index the global tensor row-major") {
  weft::rng const g(77, 2);
  // 1-D: the slice [10, 30) of a vector of 100.
  std::vector<float> v(20);
  weft::fill_uniform(host_view<float, 1>(v.data(), 20), g, 0.0, 1.0,
                     weft::placement{.global_extents = {100}, .offsets = {10}});
  for (std::int64_t i = 0; i < 20; ++i)
    CHECK(v[i] == g.uniform_float(static_cast<std::uint64_t>(10 + i)));

  // 3-D: a [2, 3, 4] block at (1, 2, 3) of a [4, 5, 9] tensor.
  std::vector<double> t(24);
  weft::fill_uniform(host_view<double, 3>(t.data(), 2, 3, 4), g, 0.0, 1.0,
                     weft::placement{.global_extents = {4, 5, 9}, .offsets = {1, 2, 3}});
  for (std::int64_t a = 0; a < 2; ++a)
    for (std::int64_t b = 0; b < 3; ++b)
      for (std::int64_t c = 0; c < 4; ++c)
        CHECK(t[(a * 3 + b) * 4 + c] ==
              g.uniform_double(static_cast<std::uint64_t>(((1 + a) * 5 + (2 + b)) * 9 + (3 + c))));

  // 0-D: one element, global index 0.
  float x = -1.0f;
  weft::fill_normal(weft::tensor_view<float, 0>(&x), g, 0.0, 1.0);
  CHECK(x == g.normal_float(0));

  // An empty shard writes nothing and is a valid placement at the end of a dimension.
  std::vector<float> none(1, 5.0f);
  CHECK_NOTHROW(
      weft::fill_uniform(host_view<float, 2>(none.data(), 0, 48), g, 0.0, 1.0,
                         weft::placement{.global_extents = {64, 48}, .offsets = {64, 0}}));
  CHECK(none[0] == 5.0f);
}

TEST_CASE("random: the chunked (CUDA) decomposition writes each element once, as the host does") {
  weft::rng const g(5150, 3);
  weft::random_uniform<float> const u(g, -1.0f, 1.0f);
  weft::random_normal<float> const n(g, 0.0f, 1.0f);
  struct shard {
    std::int64_t r0, nr, c0, nc, step;
  };
  // Aligned and misaligned to Philox blocks of 4, narrower than a block, strided columns.
  for (shard const sh : {shard{0, 64, 0, 48, 1}, shard{5, 59, 7, 41, 1}, shard{3, 2, 45, 3, 1},
                         shard{0, 64, 1, 1, 1}, shard{2, 9, 1, 16, 3}, shard{0, 64, 0, 24, 2}}) {
    CAPTURE(sh.r0);
    CAPTURE(sh.c0);
    CAPTURE(sh.step);
    std::vector<float> const cu = chunked_fill(u, sh.r0, sh.nr, sh.c0, sh.nc, sh.step);
    std::vector<float> const cn = chunked_fill(n, sh.r0, sh.nr, sh.c0, sh.nc, sh.step);
    bool same = true;
    for (std::int64_t r = 0; r < sh.nr; ++r) {
      for (std::int64_t c = 0; c < sh.nc; ++c) {
        auto const gi = static_cast<std::uint64_t>((sh.r0 + r) * cols + sh.c0 + c * sh.step);
        same = same && bits_u64(cu[r * sh.nc + c]) == bits_u64(u(gi)) &&
               bits_u64(cn[r * sh.nc + c]) == bits_u64(g.normal_float(gi));
      }
    }
    CHECK(same);
    if (sh.step == 1) {
      std::int64_t calls = 0;
      std::vector<float> const counted =
          chunked_fill(counting_uniform{u, &calls}, sh.r0, sh.nr, sh.c0, sh.nc, 1);
      CHECK(bitwise_equal(counted, cu));
      std::int64_t blocks = 0;
      for (std::int64_t r = 0; r < sh.nr; ++r) {
        std::int64_t const g0 = (sh.r0 + r) * cols + sh.c0;
        blocks += (g0 + sh.nc - 1) / 4 - g0 / 4 + 1;
      }
      CHECK(calls == blocks);
    }
  }
}

TEST_CASE("random: an OpenMP host executor fills exactly like the sequential one") {
  weft::rng const g(8, 8);
  auto a = weft::make_tensor<float>(300, 77);
  auto b = weft::make_tensor<float>(300, 77);
  weft::fill_normal(a.view(), g, 0.0, 1.0);
  weft::fill_normal(weft::exec::host::parallel(2), b.view(), g, 0.0, 1.0);
  CHECK(std::memcmp(a.data(), b.data(), a.size_bytes()) == 0);
}

static_assert(weft::Executor<mine::pool>);

// fill_uniform(ex, view, ...) accepts a view only in the executor's memory space.
template <class E, class V>
concept can_fill_uniform_with = requires(E const& e, V const& v) {
  weft::fill_uniform(e, v, weft::rng{1, 0}, 0.0, 1.0);
};
static_assert(can_fill_uniform_with<mine::pool, weft::tensor_view<float, 2>>);
static_assert(can_fill_uniform_with<weft::exec::host, weft::strided_view<double, 3>>);
static_assert(!can_fill_uniform_with<mine::pool, weft::tensor_view<float, 2, weft::cuda_space>>);
static_assert(
    !can_fill_uniform_with<weft::exec::host, weft::tensor_view<float, 2, weft::cuda_space>>);
static_assert(!can_fill_uniform_with<mine::pool, weft::tensor_view<float const, 2>>);
static_assert(!can_fill_uniform_with<int, weft::tensor_view<float, 2>>);

TEST_CASE(
    "random: a user's executor (ADL for_each_index) drives fill_uniform and fill_normal like "
    "exec::host") {
  weft::rng const g(21, 3);
  int calls = 0;
  mine::pool const pool{&calls};
  auto a = weft::make_tensor<float>(40, 33);
  auto b = weft::make_tensor<float>(40, 33);
  weft::fill_uniform(weft::exec::host{}, a.view(), g, -1.0, 1.0);
  weft::fill_uniform(pool, b.view(), g, -1.0, 1.0);
  CHECK(calls == 1);
  CHECK(std::memcmp(a.data(), b.data(), a.size_bytes()) == 0);
  weft::fill_normal(weft::exec::host{}, a.view(), g, 0.5, 2.0);
  weft::fill_normal(pool, b.view(), g, 0.5, 2.0);
  CHECK(calls == 2);
  CHECK(std::memcmp(a.data(), b.data(), a.size_bytes()) == 0);
  // A shard (rows 8..23 of a [40, 33] bf16 tensor) through the user's executor equals that part
  // of the whole fill.
  auto whole = weft::make_tensor<weft::bf16>(40, 33);
  auto part = weft::make_tensor<weft::bf16>(16, 33);
  weft::fill_uniform(whole.view(), g, 0.0, 4.0);
  weft::fill_uniform(pool, part.view(), g, 0.0, 4.0, weft::placement{{40, 33}, {8, 0}});
  CHECK(std::memcmp(part.data(), whole.data() + 8 * 33, part.size_bytes()) == 0);
  // Arguments are checked before the executor runs anything.
  CHECK_THROWS_AS(weft::fill_uniform(pool, b.view(), g, 1.0, -1.0), weft::invalid_argument_error);
  CHECK(calls == 3);
}

#if defined(__CUDACC__) && WEFT_HAS_CUDA_RUNTIME
// Runs where the CUDA twin of this file runs: on a machine with a GPU.
TEST_CASE_TEMPLATE("random: device fills equal host fills; device shards equal the device whole", T,
                   float, double, weft::bf16, weft::f16) {
  weft::exec::cuda const ex{};
  weft::rng const g(1234, 5);
  auto to_host = [](auto const& d) {
    auto h = weft::make_tensor<T>(d.extents());
    weft::copy(h.view(), d.view());
    return std::vector<T>(h.data(), h.data() + h.size());
  };
  auto device_whole = [&](bool normal) {
    auto d = weft::make_tensor<T, weft::cuda_space>(rows, cols);
    if (normal) {
      weft::fill_normal(ex, d.view(), g, 0.0, 1.0);
    } else {
      weft::fill_uniform(ex, d.view(), g, -1.0, 1.0);
    }
    ex.synchronize();
    return to_host(d);
  };
  // Uniforms use integer arithmetic and one fma: bit for bit with the host.
  std::vector<T> const du = device_whole(false);
  CHECK(bitwise_equal(du, fill_whole<T>(uniform_fill<T>{g, -1.0, 1.0})));
  // Normals go through CUDA's log, sin, cos: within a few ulps of the host's.
  std::vector<T> const dn = device_whole(true);
  std::vector<T> const hn = fill_whole<T>(normal_fill<T>{g, 0.0, 1.0});
  double worst = 0;
  for (std::size_t i = 0; i < dn.size(); ++i)
    worst = std::max(worst, std::abs(static_cast<double>(dn[i]) - static_cast<double>(hn[i])));
  CHECK(worst < (sizeof(T) == 2 ? 0.05 : 1e-5));
  // Device shards (2x2 tiles off block bounds, and strided columns) equal the device whole fill.
  std::vector<T> assembled(rows * cols);
  for (tile const t :
       {tile{0, 21, 0, 11}, tile{0, 21, 11, 37}, tile{21, 43, 0, 11}, tile{21, 43, 11, 37}}) {
    auto d = weft::make_tensor<T, weft::cuda_space>(t.nr, t.nc);
    weft::fill_normal(ex, d.view(), g, 0.0, 1.0,
                      weft::placement{.global_extents = {rows, cols}, .offsets = {t.r0, t.c0}});
    ex.synchronize();
    std::vector<T> const local = to_host(d);
    for (std::int64_t r = 0; r < t.nr; ++r)
      for (std::int64_t c = 0; c < t.nc; ++c)
        assembled[(t.r0 + r) * cols + t.c0 + c] = local[r * t.nc + c];
  }
  CHECK(bitwise_equal(dn, assembled));
  for (std::int64_t s = 0; s < 2; ++s) {
    auto d = weft::make_tensor<T, weft::cuda_space>(rows, cols / 2);
    weft::fill_normal(
        ex, d.view(), g, 0.0, 1.0,
        weft::placement{.global_extents = {rows, cols}, .offsets = {0, s}, .steps = {1, 2}});
    ex.synchronize();
    std::vector<T> const local = to_host(d);
    bool same = true;
    for (std::int64_t r = 0; r < rows; ++r)
      for (std::int64_t c = 0; c < cols / 2; ++c)
        same = same && bits_u64(local[r * (cols / 2) + c]) == bits_u64(dn[r * cols + s + 2 * c]);
    CHECK(same);
  }
  // Placement errors throw before the launch.
  auto d = weft::make_tensor<T, weft::cuda_space>(16, 30);
  CHECK_THROWS_AS(
      weft::fill_uniform(ex, d.view(), g, 0.0, 1.0,
                         weft::placement{.global_extents = {64, 48}, .offsets = {0, 20}}),
      weft::shape_error);
}
#endif

// ---- errors ------------------------------------------------------------------------------------

TEST_CASE("random: invalid placements and parameters throw before writing") {
  std::vector<float> buf(16 * 30, 123.0f);
  host_view<float, 2> const v(buf.data(), 16, 30);
  weft::rng const g(1, 0);
  auto untouched = [&] {
    return std::all_of(buf.begin(), buf.end(), [](float x) { return x == 123.0f; });
  };

  // Offset + extent beyond the global extent, in dimension 1: names the dimension and both values.
  CHECK_THROWS_WITH_AS(
      weft::fill_uniform(v, g, 0.0, 1.0,
                         weft::placement{.global_extents = {64, 48}, .offsets = {0, 20}}),
      doctest::Contains("dimension 1"), weft::shape_error);
  try {
    weft::fill_normal(v, g, 0.0, 1.0,
                      weft::placement{.global_extents = {64, 48}, .offsets = {0, 20}});
    FAIL("expected a shape_error");
  } catch (weft::shape_error const& e) {
    std::string const what = e.what();
    CHECK(what.find("offsets[1]") != std::string::npos);
    CHECK(what.find("48") != std::string::npos);  // the global extent
    CHECK(what.find("50") != std::string::npos);  // offset + extent
    CHECK(what.find("offset 20 + extent 30") != std::string::npos);
  }
  // Dimension 0 with the last rows.
  CHECK_THROWS_WITH_AS(
      weft::fill_uniform(v, g, 0.0, 1.0,
                         weft::placement{.global_extents = {20, 30}, .offsets = {5, 0}}),
      doctest::Contains("expected <= global_extents[0] = 20, actual 21"), weft::shape_error);
  // Strided placement running past the end: rows 1, 5, ..., 61 need 62 rows.
  CHECK_THROWS_AS(
      weft::fill_uniform(
          v, g, 0.0, 1.0,
          weft::placement{.global_extents = {61, 30}, .offsets = {1, 0}, .steps = {4, 1}}),
      weft::shape_error);
  CHECK_NOTHROW(weft::fill_uniform(host_view<float, 2>(nullptr, 0, 0), g, 0.0, 1.0));
  // Rank mismatches.
  CHECK_THROWS_WITH_AS(
      weft::fill_uniform(v, g, 0.0, 1.0, weft::placement{.global_extents = {16, 30, 1}}),
      doctest::Contains("expected rank 2 (the view's), actual rank 3"), weft::shape_error);
  CHECK_THROWS_WITH_AS(
      weft::fill_uniform(v, g, 0.0, 1.0,
                         weft::placement{.global_extents = {16, 30}, .offsets = {0}}),
      doctest::Contains("placement.offsets"), weft::shape_error);
  CHECK_THROWS_WITH_AS(weft::fill_uniform(v, g, 0.0, 1.0, weft::placement{.offsets = {0, 0}}),
                       doctest::Contains("placement.global_extents"), weft::shape_error);
  // Negative offset, zero step, negative global extent.
  CHECK_THROWS_WITH_AS(
      weft::fill_uniform(v, g, 0.0, 1.0,
                         weft::placement{.global_extents = {64, 48}, .offsets = {-1, 0}}),
      doctest::Contains("placement.offsets[0]`: expected >= 0, actual -1"), weft::shape_error);
  CHECK_THROWS_WITH_AS(
      weft::fill_uniform(
          v, g, 0.0, 1.0,
          weft::placement{.global_extents = {64, 48}, .offsets = {0, 0}, .steps = {1, 0}}),
      doctest::Contains("placement.steps[1]`: expected >= 1, actual 0"), weft::shape_error);
  // A global tensor too large for 63-bit indices.
  CHECK_THROWS_WITH_AS(
      weft::fill_uniform(
          v, g, 0.0, 1.0,
          weft::placement{.global_extents = {std::int64_t{1} << 40, std::int64_t{1} << 40}}),
      doctest::Contains("2^63 - 1"), weft::shape_error);
  // Distribution parameters.
  CHECK_THROWS_WITH_AS(weft::fill_uniform(v, g, 1.0, 0.5),
                       doctest::Contains("`hi`: expected >= lo = 1, actual 0.5"),
                       weft::invalid_argument_error);
  CHECK_THROWS_WITH_AS(weft::fill_uniform(v, g, 0.0, std::numeric_limits<double>::infinity()),
                       doctest::Contains("`hi`"), weft::invalid_argument_error);
  CHECK_THROWS_WITH_AS(weft::fill_uniform(v, g, -3e38, 3e38), doctest::Contains("`hi - lo`"),
                       weft::invalid_argument_error);
  CHECK_THROWS_WITH_AS(weft::fill_uniform(v, g, 0.0, 1e39),
                       doctest::Contains("`hi`"),  // inf as float
                       weft::invalid_argument_error);
  CHECK_THROWS_WITH_AS(weft::fill_normal(v, g, 0.0, -1.0), doctest::Contains("`stddev`"),
                       weft::invalid_argument_error);
  CHECK_THROWS_WITH_AS(weft::fill_normal(v, g, std::nan(""), 1.0), doctest::Contains("`mean`"),
                       weft::invalid_argument_error);
  CHECK(untouched());
}

// ---- threads -----------------------------------------------------------------------------------

TEST_SUITE("threads") {
  TEST_CASE("random: shards filled by concurrent threads equal the serial whole fill") {
    weft::rng const g(4242, 17);
    std::vector<float> const whole_u = fill_whole<float>(uniform_fill<float>{g, -1.0, 1.0});
    std::vector<float> const whole_n = fill_whole<float>(normal_fill<float>{g, 0.0, 0.02});

    // Row shards written by 4 threads into disjoint parts of one buffer (cuts off block bounds).
    std::vector<float> shared(rows * cols, 0.0f);
    std::array<std::int64_t, 5> const cuts = {0, 3, 29, 45, 64};
    {
      std::vector<std::thread> threads;
      for (std::size_t s = 0; s < 4; ++s) {
        threads.emplace_back([&, s] {
          std::int64_t const r0 = cuts[s];
          std::int64_t const nr = cuts[s + 1] - cuts[s];
          weft::fill_uniform(host_view<float, 2>(shared.data() + r0 * cols, nr, cols), g, -1.0, 1.0,
                             weft::placement{.global_extents = {rows, cols}, .offsets = {r0, 0}});
        });
      }
      for (auto& t : threads) t.join();
    }
    CHECK(bitwise_equal(whole_u, shared));

    // 2x2 tiles (off block bounds) written by 4 threads into their own buffers.
    std::array<tile, 4> const tiles = {
        {{0, 21, 0, 11}, {0, 21, 11, 37}, {21, 43, 0, 11}, {21, 43, 11, 37}}};
    std::array<std::vector<float>, 4> local;
    {
      std::vector<std::thread> threads;
      for (std::size_t s = 0; s < 4; ++s) {
        local[s].resize(static_cast<std::size_t>(tiles[s].nr * tiles[s].nc));
        threads.emplace_back([&, s] {
          tile const t = tiles[s];
          weft::fill_normal(
              host_view<float, 2>(local[s].data(), t.nr, t.nc), g, 0.0, 0.02,
              weft::placement{.global_extents = {rows, cols}, .offsets = {t.r0, t.c0}});
        });
      }
      for (auto& t : threads) t.join();
    }
    std::vector<float> assembled(rows * cols);
    for (std::size_t s = 0; s < 4; ++s) {
      tile const t = tiles[s];
      for (std::int64_t r = 0; r < t.nr; ++r)
        for (std::int64_t c = 0; c < t.nc; ++c)
          assembled[(t.r0 + r) * cols + t.c0 + c] = local[s][r * t.nc + c];
    }
    CHECK(bitwise_equal(whole_n, assembled));
  }
}
