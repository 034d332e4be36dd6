// weft/core/random.hpp — counter-based random numbers: Philox4x32-10, the keyed stream `rng` whose
// value at a global element index is a pure function of (seed, stream, index), WEFT_HD distribution
// functors, and fills of tensor shards through any executor that equal the unsharded tensor's fill
// bit for bit.
#pragma once

#include <weft/core/config.hpp>
#include <weft/core/dtype.hpp>
#include <weft/core/error.hpp>
#include <weft/core/exec.hpp>
#include <weft/core/math.hpp>
#include <weft/core/memory.hpp>
#include <weft/core/tensor.hpp>

#include <cuda/std/array>
#include <cuda/std/cmath>
#include <cuda/std/cstdint>
#include <cuda/std/limits>
#include <cuda/std/mdspan>
#include <cuda/std/type_traits>

#include <cstddef>
#include <cstdint>
#include <limits>
#include <string>
#include <type_traits>
#include <vector>

namespace weft {

// ------------------------------------------------------------------------------------------------
// Philox4x32-10
// ------------------------------------------------------------------------------------------------
// J. K. Salmon, M. A. Moraes, R. O. Dror, D. E. Shaw, "Parallel random numbers: as easy as
// 1, 2, 3", SC'11, with the constants and key schedule of the Random123 library (philox.h): each of
// the 10 rounds multiplies words 0 and 2 by M0 and M1 and mixes in the key; the key is bumped by
// the Weyl increments W0, W1 before every round but the first. Checked in
// tests/core/random.test.cpp against Random123's tests/kat_vectors
// (github.com/DEShawResearch/random123).

using philox_counter = ::cuda::std::array<std::uint32_t, 4>;
using philox_key = ::cuda::std::array<std::uint32_t, 2>;

namespace detail {

inline constexpr std::uint32_t philox_m0 = 0xD2511F53u;
inline constexpr std::uint32_t philox_m1 = 0xCD9E8D57u;
inline constexpr std::uint32_t philox_w0 = 0x9E3779B9u;  // golden ratio
inline constexpr std::uint32_t philox_w1 = 0xBB67AE85u;  // sqrt(3) - 1

WEFT_HD constexpr philox_counter philox4x32_round(philox_counter c, philox_key k) noexcept {
  // A 32x32 -> 64-bit product; nvcc lowers it to mul.lo/mul.hi, host compilers to one mul.
  std::uint64_t const p0 = std::uint64_t{philox_m0} * c[0];
  std::uint64_t const p1 = std::uint64_t{philox_m1} * c[2];
  auto const hi0 = static_cast<std::uint32_t>(p0 >> 32);
  auto const lo0 = static_cast<std::uint32_t>(p0);
  auto const hi1 = static_cast<std::uint32_t>(p1 >> 32);
  auto const lo1 = static_cast<std::uint32_t>(p1);
  return philox_counter{hi1 ^ c[1] ^ k[0], lo1, hi0 ^ c[3] ^ k[1], lo0};
}

}  // namespace detail

//! Philox4x32 with 10 rounds: a bijection of the 128-bit counter for each 64-bit key.
[[nodiscard]] WEFT_HD constexpr philox_counter philox4x32_10(philox_counter counter,
                                                             philox_key key) noexcept {
  for (int round = 0; round < 10; ++round) {
    if (round > 0) {
      key[0] += detail::philox_w0;
      key[1] += detail::philox_w1;
    }
    counter = detail::philox4x32_round(counter, key);
  }
  return counter;
}

// ------------------------------------------------------------------------------------------------
// rng: the keyed stream
// ------------------------------------------------------------------------------------------------
// An `rng` is two numbers and no state: every value it gives is a pure function of (seed, stream,
// index), so any thread, rank or device can compute any element without coordination, and a tensor
// initialised in shards equals the tensor initialised whole. The mapping is fixed forever
// (changing it changes every model initialised by weft):
//
//   key      = { lo32(seed), hi32(seed) }
//   block(b) = philox4x32_10({ lo32(b), hi32(b), lo32(stream), hi32(stream) }, key) = w0..w3
//
//   32-bit kinds, 4 values per block, element i uses block i / 4, lane L = i % 4:
//     bits32(i)        = w[L]
//     uniform_float(i) = (w[L] >> 8) * 2^-24                       in [0, 1), 24 bits, exact
//     normal_float(i)  = Box-Muller on the pair P = L / 2:
//                        u1 = ((w[2P] >> 8) + 1) * 2^-24            in (0, 1], so log(u1) is finite
//                        u2 = (w[2P+1] >> 8) * 2^-24                in [0, 1)
//                        r = sqrt(-2 log u1), t = 2 pi u2;  L even: r cos t,  L odd: r sin t
//   64-bit kinds, 2 values per block, element i uses block i / 2, lane L = i % 2:
//     bits64(i)         = w[2L+1] * 2^32 + w[2L]
//     uniform_double(i) = (bits64(i) >> 11) * 2^-53                 in [0, 1), 53 bits, exact
//     uniform_int(i, n) = floor(bits64(i) * n / 2^64)               in [0, n), n < 2^32
//     normal_double(i)  = Box-Muller on u1 = ((q0 >> 11) + 1) * 2^-53, u2 = (q1 >> 11) * 2^-53 with
//                         q0 = w1 * 2^32 + w0, q1 = w3 * 2^32 + w2;  L = 0: r cos t, L = 1: r sin t
//
// The counter layout is cuRAND's for Philox4_32_10: bits32(i) is the first curand() of a state
// made by curand_init(seed, stream, i) (checked by the nvcc build of the tests).
// Different kinds drawn from one rng at nearby indices share Philox words and are NOT independent
// (normal_float(0) is a function of bits32(0) and bits32(1)): give each use its own stream.
// As u1 >= 2^-24 (float) and 2^-53 (double), the Box-Muller radius is at most 5.77 and 8.57: the
// untruncated law exceeds them with probability 2^-24 and 2^-53, far below what sampling can see.
//
// Reproducibility: bits, integers and unit uniforms use integer arithmetic and exact conversions,
// scaled uniforms one explicit fma, so they equal bit for bit on every compiler, host and device.
// Normals call log, sqrt, cos and sin (cuda::std): bit for bit on one platform (so any sharding
// equals the whole fill), while glibc and CUDA's libdevice may differ in the last ulp or two.
class rng {
 public:
  WEFT_HD constexpr rng(std::uint64_t seed, std::uint64_t stream = 0) noexcept
      : seed_(seed), stream_(stream) {}

  [[nodiscard]] WEFT_HD constexpr std::uint64_t seed() const noexcept { return seed_; }
  [[nodiscard]] WEFT_HD constexpr std::uint64_t stream() const noexcept { return stream_; }
  //! The same seed on another stream (e.g. one stream per parameter tensor).
  [[nodiscard]] WEFT_HD constexpr rng with_stream(std::uint64_t stream) const noexcept {
    return rng(seed_, stream);
  }

  [[nodiscard]] WEFT_HD constexpr philox_key key() const noexcept {
    return philox_key{static_cast<std::uint32_t>(seed_), static_cast<std::uint32_t>(seed_ >> 32)};
  }
  //! The four Philox words of block `b` (see the mapping above).
  [[nodiscard]] WEFT_HD constexpr philox_counter block(std::uint64_t b) const noexcept {
    return philox4x32_10(
        philox_counter{static_cast<std::uint32_t>(b), static_cast<std::uint32_t>(b >> 32),
                       static_cast<std::uint32_t>(stream_),
                       static_cast<std::uint32_t>(stream_ >> 32)},
        key());
  }

  [[nodiscard]] WEFT_HD constexpr std::uint32_t bits32(std::uint64_t i) const noexcept {
    return block(i / 4)[i % 4];
  }
  [[nodiscard]] WEFT_HD constexpr std::uint64_t bits64(std::uint64_t i) const noexcept {
    philox_counter const w = block(i / 2);
    auto const lane = static_cast<std::size_t>(i % 2);
    return join64(w[2 * lane], w[2 * lane + 1]);
  }
  [[nodiscard]] WEFT_HD constexpr float uniform_float(std::uint64_t i) const noexcept {
    return unit_float(bits32(i));
  }
  [[nodiscard]] WEFT_HD constexpr double uniform_double(std::uint64_t i) const noexcept {
    return unit_double(bits64(i));
  }

  //! An integer in [0, n) by Lemire's multiply-shift on 64 random bits: no rejection, so every
  //! index costs one Philox call, and each outcome has probability floor or ceil(2^64 / n) / 2^64,
  //! off 1/n by less than 2^-64 (relative bias below n / 2^64 <= 2^-32). Requires n > 0; n == 0
  //! gives 0 (device code cannot throw; debug builds assert).
  [[nodiscard]] WEFT_HD constexpr std::uint32_t uniform_int(std::uint64_t i,
                                                            std::uint32_t n) const noexcept {
    WEFT_ASSERT(n > 0);
    return scale_to(bits64(i), n);
  }

  [[nodiscard]] WEFT_HD float normal_float(std::uint64_t i) const noexcept {
    return normal_floats(block(i / 4))[i % 4];
  }
  [[nodiscard]] WEFT_HD double normal_double(std::uint64_t i) const noexcept {
    return normal_doubles(block(i / 2))[i % 2];
  }

  // ---- the block-level kernels every element function and every fill goes through -------------
  // Elements and fills share these so that `uniform_float(i)` equals element i of any fill.

  [[nodiscard]] WEFT_HD static constexpr std::uint64_t join64(std::uint32_t lo,
                                                              std::uint32_t hi) noexcept {
    return (std::uint64_t{hi} << 32) | lo;
  }
  [[nodiscard]] WEFT_HD static constexpr float unit_float(std::uint32_t w) noexcept {
    return static_cast<float>(w >> 8) * 0x1p-24f;  // 24 bits: exact, at most 1 - 2^-24
  }
  [[nodiscard]] WEFT_HD static constexpr double unit_double(std::uint64_t q) noexcept {
    return static_cast<double>(q >> 11) * 0x1p-53;  // 53 bits: exact, at most 1 - 2^-53
  }
  [[nodiscard]] WEFT_HD static constexpr std::uint32_t scale_to(std::uint64_t bits,
                                                                std::uint32_t n) noexcept {
    // floor(bits * n / 2^64) for n < 2^32 without a 128-bit type: with bits = h 2^32 + l,
    // floor((h n 2^32 + l n) / 2^64) = (h n + floor(l n / 2^32)) >> 32, and h n + (l n >> 32)
    // stays below 2^64.
    std::uint64_t const h = bits >> 32;
    std::uint64_t const l = bits & 0xFFFFFFFFu;
    return static_cast<std::uint32_t>((h * n + ((l * n) >> 32)) >> 32);
  }
  [[nodiscard]] WEFT_HD static ::cuda::std::array<float, 4> normal_floats(
      philox_counter w) noexcept {
    ::cuda::std::array<float, 4> z{};
    for (std::size_t pair = 0; pair < 2; ++pair) {
      float const u1 = static_cast<float>((w[2 * pair] >> 8) + 1u) * 0x1p-24f;  // (0, 1]
      float const u2 = unit_float(w[2 * pair + 1]);
      float const r = ::cuda::std::sqrt(-2.0f * ::cuda::std::log(u1));
      float const t = two_pi_f * u2;
      z[2 * pair] = r * ::cuda::std::cos(t);
      z[2 * pair + 1] = r * ::cuda::std::sin(t);
    }
    return z;
  }
  [[nodiscard]] WEFT_HD static ::cuda::std::array<double, 2> normal_doubles(
      philox_counter w) noexcept {
    double const u1 = static_cast<double>((join64(w[0], w[1]) >> 11) + 1u) * 0x1p-53;  // (0, 1]
    double const u2 = unit_double(join64(w[2], w[3]));
    double const r = ::cuda::std::sqrt(-2.0 * ::cuda::std::log(u1));
    double const t = two_pi_d * u2;
    return ::cuda::std::array<double, 2>{r * ::cuda::std::cos(t), r * ::cuda::std::sin(t)};
  }

  friend WEFT_HD constexpr bool operator==(rng const& a, rng const& b) noexcept {
    return a.seed_ == b.seed_ && a.stream_ == b.stream_;
  }

 private:
  static constexpr float two_pi_f = 6.28318530717958647692f;
  static constexpr double two_pi_d = 6.28318530717958647692;

  std::uint64_t seed_;
  std::uint64_t stream_;
};

// ------------------------------------------------------------------------------------------------
// Distribution functors
// ------------------------------------------------------------------------------------------------
// A distribution functor maps a global element index to a value (`operator()`) and a block index
// to the `per_block` consecutive values of that block (`block`), which is what fills use: element
// i is `block(i / per_block)[i % per_block]`, by construction, on host and device alike. `Real` is
// the compute type, float or double; narrower element types (bf16, f16) are converted from float.

template <class Real>
class random_uniform {
  static_assert(std::is_same_v<Real, float> || std::is_same_v<Real, double>,
                "weft::random_uniform<Real>: Real must be float or double");

 public:
  using value_type = Real;
  static constexpr int per_block = sizeof(Real) == 4 ? 4 : 2;

  //! Values in [lo, hi) (exactly `lo` when lo == hi). Preconditions, checked by the host fills:
  //! lo, hi and hi - lo finite, lo <= hi.
  WEFT_HD constexpr random_uniform(rng gen, Real lo, Real hi) noexcept
      : gen_(gen), lo_(lo), hi_(hi), width_(hi - lo) {}

  [[nodiscard]] WEFT_HD ::cuda::std::array<Real, per_block> block(std::uint64_t b) const noexcept {
    philox_counter const w = gen_.block(b);
    ::cuda::std::array<Real, per_block> out{};
    for (std::size_t lane = 0; lane < static_cast<std::size_t>(per_block); ++lane) {
      Real u;
      if constexpr (per_block == 4) {
        u = rng::unit_float(w[lane]);
      } else {
        u = rng::unit_double(rng::join64(w[2 * lane], w[2 * lane + 1]));
      }
      out[lane] = from_unit(u);
    }
    return out;
  }
  [[nodiscard]] WEFT_HD Real operator()(std::uint64_t i) const noexcept {
    return block(i / per_block)[i % per_block];
  }

  //! Maps a unit value u in [0, 1) to [lo, hi).
  [[nodiscard]] WEFT_HD Real from_unit(Real u) const noexcept {
    // An explicit fma: left to itself, nvcc contracts lo + width * u into an fma while a host
    // compiler may not, and the two roundings differ. Rounding can still reach hi (lo = 1, hi = 2,
    // u = 1 - 2^-24 ties to 2): step back to the largest value below hi.
    Real v = ::cuda::std::fma(u, width_, lo_);
    if (v >= hi_ && lo_ < hi_) v = ::cuda::std::nextafter(hi_, lo_);
    return v;
  }

  [[nodiscard]] WEFT_HD constexpr rng generator() const noexcept { return gen_; }
  [[nodiscard]] WEFT_HD constexpr Real lo() const noexcept { return lo_; }
  [[nodiscard]] WEFT_HD constexpr Real hi() const noexcept { return hi_; }

 private:
  rng gen_;
  Real lo_;
  Real hi_;
  Real width_;
};

template <class Real>
class random_normal {
  static_assert(std::is_same_v<Real, float> || std::is_same_v<Real, double>,
                "weft::random_normal<Real>: Real must be float or double");

 public:
  using value_type = Real;
  static constexpr int per_block = sizeof(Real) == 4 ? 4 : 2;

  //! mean + stddev * z with z from rng::normal_float / normal_double. Preconditions, checked by
  //! the host fills: mean and stddev finite, stddev >= 0.
  WEFT_HD constexpr random_normal(rng gen, Real mean, Real stddev) noexcept
      : gen_(gen), mean_(mean), stddev_(stddev) {}

  [[nodiscard]] WEFT_HD ::cuda::std::array<Real, per_block> block(std::uint64_t b) const noexcept {
    ::cuda::std::array<Real, per_block> z;
    if constexpr (per_block == 4) {
      z = rng::normal_floats(gen_.block(b));
    } else {
      z = rng::normal_doubles(gen_.block(b));
    }
    for (auto& v : z) v = ::cuda::std::fma(v, stddev_, mean_);  // explicit fma: see random_uniform
    return z;
  }
  [[nodiscard]] WEFT_HD Real operator()(std::uint64_t i) const noexcept {
    return block(i / per_block)[i % per_block];
  }

  [[nodiscard]] WEFT_HD constexpr rng generator() const noexcept { return gen_; }
  [[nodiscard]] WEFT_HD constexpr Real mean() const noexcept { return mean_; }
  [[nodiscard]] WEFT_HD constexpr Real stddev() const noexcept { return stddev_; }

 private:
  rng gen_;
  Real mean_;
  Real stddev_;
};

// ------------------------------------------------------------------------------------------------
// Placement: where a (shard) view sits inside the global tensor
// ------------------------------------------------------------------------------------------------
// Element (j_0, ..., j_{R-1}) of the view is element (offsets[d] + j_d * steps[d])_d of the global
// tensor, whose row-major linear index picks the random value. Contiguous row or column blocks and
// 2-D tiles need offsets only; cyclic (strided) sharding also sets steps. Values follow the logical
// position, never the memory layout: layout_left or strided views get what layout_right ones do.
struct placement {
  std::vector<std::int64_t> global_extents{};  //!< empty: the view is the whole tensor
  std::vector<std::int64_t> offsets{};         //!< empty: all zero
  std::vector<std::int64_t> steps{};           //!< empty: all one
};

namespace detail {

//! The affine map from view indices to global linear indices, validated; device-copyable.
template <std::size_t Rank>
struct global_map {
  ::cuda::std::array<std::int64_t, Rank> extents{};   // the view's
  ::cuda::std::array<std::uint64_t, Rank> strides{};  // global linear index per view index step
  std::uint64_t base = 0;                             // global linear index of view element 0

  [[nodiscard]] WEFT_HD constexpr std::int64_t inner_extent() const noexcept {
    if constexpr (Rank == 0) {
      return 1;
    } else {
      return extents[Rank - 1];
    }
  }
  [[nodiscard]] WEFT_HD constexpr std::uint64_t inner_stride() const noexcept {
    if constexpr (Rank == 0) {
      return 0;
    } else {
      return strides[Rank - 1];
    }
  }
  //! Rows are the view's index tuples without the last index, in row-major order.
  [[nodiscard]] WEFT_HD constexpr std::int64_t rows() const noexcept {
    std::int64_t n = 1;
    if constexpr (Rank >= 2) {
      for (std::size_t d = 0; d + 1 != Rank; ++d) n *= extents[d];
    }
    if constexpr (Rank > 0) {
      if (extents[Rank - 1] == 0) n = 0;
    }
    return n;
  }
};

template <std::size_t Rank, class Extents>
global_map<Rank> make_global_map(Extents const& ext, placement const& where) {
  static_assert(Extents::rank() == Rank);
  global_map<Rank> map;
  // Dimension loops test `d != Rank`: for Rank 0, nvcc warns that `d < Rank` is pointless.
  for (std::size_t d = 0; d != Rank; ++d) map.extents[d] = static_cast<std::int64_t>(ext.extent(d));

  bool const whole = where.global_extents.empty();
  WEFT_EXPECTS_SHAPE(!whole || (where.offsets.empty() && where.steps.empty()),
                     "placement.global_extents",
                     concat("rank ", Rank, " (offsets or steps are given)"), "rank 0 (empty)");
  WEFT_EXPECTS_SHAPE(whole || where.global_extents.size() == Rank, "placement.global_extents",
                     concat("rank ", Rank, " (the view's)"),
                     concat("rank ", where.global_extents.size()));
  WEFT_EXPECTS_SHAPE(where.offsets.empty() || where.offsets.size() == Rank, "placement.offsets",
                     concat("rank ", Rank, " (the view's) or empty"),
                     concat("rank ", where.offsets.size()));
  WEFT_EXPECTS_SHAPE(where.steps.empty() || where.steps.size() == Rank, "placement.steps",
                     concat("rank ", Rank, " (the view's) or empty"),
                     concat("rank ", where.steps.size()));

  ::cuda::std::array<std::int64_t, Rank> global{};
  ::cuda::std::array<std::int64_t, Rank> offset{};
  ::cuda::std::array<std::int64_t, Rank> step{};
  for (std::size_t d = 0; d != Rank; ++d) {
    global[d] = whole ? map.extents[d] : where.global_extents[d];
    offset[d] = where.offsets.empty() ? 0 : where.offsets[d];
    step[d] = where.steps.empty() ? 1 : where.steps[d];
    WEFT_EXPECTS_SHAPE(global[d] >= 0, concat("placement.global_extents[", d, "]"), ">= 0",
                       global[d]);
    WEFT_EXPECTS_SHAPE(offset[d] >= 0, concat("placement.offsets[", d, "]"), ">= 0", offset[d]);
    WEFT_EXPECTS_SHAPE(step[d] >= 1, concat("placement.steps[", d, "]"), ">= 1", step[d]);
    std::int64_t const e = map.extents[d];
    if (e == 0) {
      WEFT_EXPECTS_SHAPE(offset[d] <= global[d],
                         concat("placement dimension ", d, ": offsets[", d, "]"),
                         concat("<= global_extents[", d, "] = ", global[d]), offset[d]);
    } else if (step[d] == 1) {
      // offset + extent <= global, phrased so that it cannot overflow.
      WEFT_EXPECTS_SHAPE(
          offset[d] <= global[d] && e <= global[d] - offset[d],
          concat("placement dimension ", d, ": offsets[", d, "] + view extent(", d, ")"),
          concat("<= global_extents[", d, "] = ", global[d]),
          concat(static_cast<std::uint64_t>(offset[d]) + static_cast<std::uint64_t>(e), " (offset ",
                 offset[d], " + extent ", e, ")"));
    } else {
      // offset + (extent - 1) * step < global.
      WEFT_EXPECTS_SHAPE(
          offset[d] < global[d] && (e - 1) <= (global[d] - 1 - offset[d]) / step[d],
          concat("placement dimension ", d, ": offsets[", d, "] + (view extent(", d,
                 ") - 1) * steps[", d, "] + 1"),
          concat("<= global_extents[", d, "] = ", global[d]),
          concat("offset ", offset[d], " + (extent ", e, " - 1) * step ", step[d], " + 1"));
    }
  }
  // Global linear indices must fit the uint64 counter and the int64 index arithmetic.
  std::int64_t total = 1;
  for (std::size_t d = 0; d != Rank; ++d) {
    if (global[d] == 0) {
      total = 0;
      break;
    }
  }
  if (total != 0) {
    for (std::size_t d = 0; d != Rank; ++d) {
      WEFT_EXPECTS_SHAPE(total <= std::numeric_limits<std::int64_t>::max() / global[d],
                         "placement.global_extents", "a product of at most 2^63 - 1 elements",
                         concat("a product overflowing int64 at dimension ", d));
      total *= global[d];
    }
  }
  std::uint64_t gstride = 1;
  for (std::size_t k = Rank; k-- > 0;) {
    map.strides[k] = gstride * static_cast<std::uint64_t>(step[k]);
    map.base += gstride * static_cast<std::uint64_t>(offset[k]);
    gstride *= static_cast<std::uint64_t>(global[k]);
  }
  return map;
}

//! Writes dist's values into a view: `run(row, j0, j1)` fills elements j0..j1-1 of a row, calling
//! Philox once per block met. Host loops and CUDA kernels both drive this one functor.
template <class Dist, class View>
class fill_runs_fn {
  static constexpr std::size_t rank = View::rank();
  using element_type = typename View::element_type;
  using real = typename Dist::value_type;
  static constexpr int per_block = Dist::per_block;

 public:
  WEFT_HD fill_runs_fn(Dist dist, View view, global_map<rank> map) noexcept
      : dist_(dist), view_(view), map_(map) {}

  [[nodiscard]] WEFT_HD constexpr global_map<rank> const& map() const noexcept { return map_; }

  WEFT_HD void run(std::int64_t row, std::int64_t j0, std::int64_t j1) const {
    ::cuda::std::array<std::int64_t, rank> idx{};
    std::uint64_t g = map_.base;
    if constexpr (rank >= 2) {
      for (std::size_t d = rank - 1; d-- > 0;) {  // unravel the row, last-but-one index fastest
        idx[d] = row % map_.extents[d];
        row /= map_.extents[d];
        g += static_cast<std::uint64_t>(idx[d]) * map_.strides[d];
      }
    }
    std::uint64_t const s = map_.inner_stride();
    std::uint64_t cached = ~std::uint64_t{0};  // no block has this index: b <= (2^64 - 1) / 2
    ::cuda::std::array<real, per_block> values{};
    for (std::int64_t j = j0; j < j1; ++j) {
      std::uint64_t const gi = g + static_cast<std::uint64_t>(j) * s;
      std::uint64_t const b = gi / per_block;
      if (b != cached) {
        values = dist_.block(b);
        cached = b;
      }
      if constexpr (rank > 0) idx[rank - 1] = j;
      view_[idx] = convert_to<element_type>{}(values[gi % per_block]);
    }
  }

  //! Chunks of a row for one GPU thread each. When the row is contiguous in the global tensor,
  //! chunks are aligned to Philox blocks, so each costs exactly one Philox call.
  [[nodiscard]] WEFT_HD constexpr std::int64_t chunks_per_row() const noexcept {
    return (map_.inner_extent() + 2 * per_block - 2) / per_block;
  }
  WEFT_HD void run_chunk(std::int64_t row, std::int64_t chunk) const {
    std::int64_t const n = map_.inner_extent();
    std::int64_t shift = 0;
    if (map_.inner_stride() == 1) {
      std::uint64_t g = map_.base;
      if constexpr (rank >= 2) {
        std::int64_t r = row;
        for (std::size_t d = rank - 1; d-- > 0;) {
          g += static_cast<std::uint64_t>(r % map_.extents[d]) * map_.strides[d];
          r /= map_.extents[d];
        }
      }
      shift = static_cast<std::int64_t>(g % per_block);
    }
    std::int64_t j0 = chunk * per_block - shift;
    std::int64_t j1 = j0 + per_block;
    if (j0 < 0) j0 = 0;
    if (j1 > n) j1 = n;
    if (j0 < j1) run(row, j0, j1);
  }

 private:
  Dist dist_;
  View view_;
  global_map<rank> map_;
};

//! The element types random fills write: the floating Elements (f32, f64, bf16, f16).
template <class T>
concept RandomFillElement = Element<T> &&(std::is_same_v<T, f32> || std::is_same_v<T, f64> ||
                                          std::is_same_v<T, bf16> || std::is_same_v<T, f16>);

template <class Real>
void check_uniform_args(Real lo, Real hi) {
  WEFT_EXPECTS(::cuda::std::isfinite(lo), "lo", "a finite value (in the compute type)", lo);
  WEFT_EXPECTS(::cuda::std::isfinite(hi), "hi", "a finite value (in the compute type)", hi);
  WEFT_EXPECTS(lo <= hi, "hi", concat(">= lo = ", lo), hi);
  WEFT_EXPECTS(::cuda::std::isfinite(hi - lo), "hi - lo", "a finite width", hi - lo);
}

template <class Real>
void check_normal_args(Real mean, Real stddev) {
  WEFT_EXPECTS(::cuda::std::isfinite(mean), "mean", "a finite value (in the compute type)", mean);
  WEFT_EXPECTS(::cuda::std::isfinite(stddev) && stddev >= Real(0), "stddev",
               "a finite value >= 0 (in the compute type)", stddev);
}

// One index per row on host executors (long runs share Philox blocks); one index per chunk of
// per_block elements on device executors (one Philox call per thread, coalesced writes).
template <class Fn>
struct fill_rows_fn {
  Fn fn;
  WEFT_HD void operator()(std::int64_t row) const { fn.run(row, 0, fn.map().inner_extent()); }
};

template <class Fn>
struct fill_chunks_fn {
  Fn fn;
  std::int64_t chunks_per_row;
  WEFT_HD void operator()(std::int64_t t) const {
    fn.run_chunk(t / chunks_per_row, t % chunks_per_row);
  }
};

//! Validates the placement (throwing before any write), then runs dist over the view on `ex`.
template <class E, class Dist, class View>
void run_fill(E const& ex, Dist const& dist, View const& view, placement const& where) {
  constexpr std::size_t rank = View::rank();
  auto const map = make_global_map<rank>(view.extents(), where);
  fill_runs_fn<Dist, View> const fn(dist, view, map);
  std::int64_t const rows = map.rows();
  if (rows == 0) return;
  if constexpr (memory_space_t<E>::host_accessible) {
    for_each_index(ex, rows, fill_rows_fn<fill_runs_fn<Dist, View>>{fn});
  } else {
    std::int64_t const chunks = fn.chunks_per_row();
    for_each_index(ex, rows * chunks, fill_chunks_fn<fill_runs_fn<Dist, View>>{fn, chunks});
  }
}

template <class V>
concept RandomFillView = MutableTensor<V> && RandomFillElement<typename V::value_type>;

}  // namespace detail

// ------------------------------------------------------------------------------------------------
// Fills through an executor
// ------------------------------------------------------------------------------------------------
// fill_uniform / fill_normal write every element of a view from (gen, global linear index of the
// element), so filling the shards of a tensor, in any order, on any executor, number of threads or
// ranks, gives the tensor that filling it whole gives. One body serves every Executor whose memory
// space holds the view: exec::host (a loop or an OpenMP team), exec::cuda (a kernel; instantiate in
// an nvcc translation unit), or a user's executor with an ADL for_each_index. Host-accessible
// executors run one index per row (long runs share Philox blocks), others one per Philox block of
// a row (one Philox call per GPU thread). Values are computed in weft::compute_t of the element
// type (f32, or f64 for f64 views) and rounded once to it. Arguments are checked before anything
// is written: bad placements throw shape_error, bad lo/hi/mean/stddev invalid_argument_error.
// Asynchronous for exec::cuda (call ex.synchronize() before reading). On the device, uniforms equal
// the host's bit for bit; normals may differ from the host's in the last ulps (CUDA's log, sin and
// cos are not glibc's), while any sharding still equals the whole fill on the same executor.

//! Uniform values in [lo, hi); after rounding to bf16/f16 a value may equal hi.
template <Executor E, TensorIn<memory_space_t<E>> V>
requires detail::RandomFillView<V>
void fill_uniform(E const& ex, V const& view, rng gen, double lo, double hi,
                  placement const& where = {}) {
  using real = compute_t<typename V::value_type>;
  auto const lo_r = static_cast<real>(lo);
  auto const hi_r = static_cast<real>(hi);
  detail::check_uniform_args(lo_r, hi_r);
  detail::run_fill(ex, random_uniform<real>(gen, lo_r, hi_r), view, where);
}

//! Normal values mean + stddev * z.
template <Executor E, TensorIn<memory_space_t<E>> V>
requires detail::RandomFillView<V>
void fill_normal(E const& ex, V const& view, rng gen, double mean, double stddev,
                 placement const& where = {}) {
  using real = compute_t<typename V::value_type>;
  auto const mean_r = static_cast<real>(mean);
  auto const stddev_r = static_cast<real>(stddev);
  detail::check_normal_args(mean_r, stddev_r);
  detail::run_fill(ex, random_normal<real>(gen, mean_r, stddev_r), view, where);
}

//! fill_uniform on the calling thread (exec::host{}).
template <TensorIn<host_space> V>
requires detail::RandomFillView<V>
void fill_uniform(V const& view, rng gen, double lo, double hi, placement const& where = {}) {
  fill_uniform(exec::host{}, view, gen, lo, hi, where);
}

//! fill_normal on the calling thread (exec::host{}).
template <TensorIn<host_space> V>
requires detail::RandomFillView<V>
void fill_normal(V const& view, rng gen, double mean, double stddev, placement const& where = {}) {
  fill_normal(exec::host{}, view, gen, mean, stddev, where);
}

}  // namespace weft
