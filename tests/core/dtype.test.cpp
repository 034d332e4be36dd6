// Tests for weft/core/dtype.hpp. References: CUDA's own host conversions from cuda_bf16.h and
// cuda_fp16.h (bit for bit, exhaustively where the input space allows), and a naive rounding that
// looks the two neighbours of an exact long double up in a table of every finite value built from
// the closed form (-1)^s * 2^(e - bias) * 1.f. Exhaustive float sweeps are in TEST_SUITE("slow").
#include <weft/core/dtype.hpp>

#include <doctest/doctest.h>

#include "support/checks.hpp"

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cuda/std/limits>

#include <algorithm>
#include <array>
#include <bit>
#include <cmath>
#include <cstdint>
#include <limits>
#include <optional>
#include <random>
#include <sstream>
#include <string>
#include <type_traits>
#include <vector>

namespace {

using weft::bf16;
using weft::f16;

std::uint32_t bits_of(float x) { return std::bit_cast<std::uint32_t>(x); }
std::uint64_t bits_of(double x) { return std::bit_cast<std::uint64_t>(x); }
float float_from_bits(std::uint32_t u) { return std::bit_cast<float>(u); }
double double_from_bits(std::uint64_t u) { return std::bit_cast<double>(u); }

// doctest stringifies each INFO argument on its own, so std::hex would not stick.
std::string hex(std::uint64_t v) {
  std::ostringstream os;
  os << "0x" << std::hex << v;
  return os.str();
}

// ---- CUDA's host functions, reduced to bit patterns -------------------------------------------

std::uint16_t raw(__nv_bfloat16 h) { return static_cast<__nv_bfloat16_raw>(h).x; }
std::uint16_t raw(__half h) { return static_cast<__half_raw>(h).x; }
__nv_bfloat16 cuda_bf16(std::uint16_t bits) {
  __nv_bfloat16_raw r;
  r.x = bits;
  return __nv_bfloat16(r);
}
__half cuda_f16(std::uint16_t bits) {
  __half_raw r;
  r.x = bits;
  return __half(r);
}

// Everything a test needs to know about one 16-bit format, so each check is written once.
struct bf16_format {
  using type = bf16;
  static constexpr char const* name = "bf16";
  static constexpr int frac_bits = 7;
  static constexpr int exp_bits = 8;
  static constexpr int bias = 127;
  static std::uint16_t cuda_from_float(float x) { return raw(__float2bfloat16(x)); }
  static std::uint16_t cuda_from_double(double x) { return raw(__double2bfloat16(x)); }
  static std::uint16_t cuda_from_int(int x) { return raw(__int2bfloat16_rn(x)); }
  static std::uint16_t cuda_from_ll(long long x) { return raw(__ll2bfloat16_rn(x)); }
  static float cuda_to_float(std::uint16_t b) { return __bfloat162float(cuda_bf16(b)); }
  static int cuda_to_int_rz(std::uint16_t b) { return __bfloat162int_rz(cuda_bf16(b)); }
  static long long cuda_to_ll_rz(std::uint16_t b) { return __bfloat162ll_rz(cuda_bf16(b)); }
  static unsigned char cuda_to_uchar_rz(std::uint16_t b) {
    return __bfloat162uchar_rz(cuda_bf16(b));
  }
};

struct f16_format {
  using type = f16;
  static constexpr char const* name = "f16";
  static constexpr int frac_bits = 10;
  static constexpr int exp_bits = 5;
  static constexpr int bias = 15;
  static std::uint16_t cuda_from_float(float x) { return raw(__float2half(x)); }
  static std::uint16_t cuda_from_double(double x) { return raw(__double2half(x)); }
  static std::uint16_t cuda_from_int(int x) { return raw(__int2half_rn(x)); }
  static std::uint16_t cuda_from_ll(long long x) { return raw(__ll2half_rn(x)); }
  static float cuda_to_float(std::uint16_t b) { return __half2float(cuda_f16(b)); }
  static int cuda_to_int_rz(std::uint16_t b) { return __half2int_rz(cuda_f16(b)); }
  static long long cuda_to_ll_rz(std::uint16_t b) { return __half2ll_rz(cuda_f16(b)); }
  static unsigned char cuda_to_uchar_rz(std::uint16_t b) { return __half2uchar_rz(cuda_f16(b)); }
};

template <class Format>
constexpr std::uint16_t exp_mask = static_cast<std::uint16_t>(((1u << Format::exp_bits) - 1u)
                                                              << Format::frac_bits);
template <class Format>
constexpr std::uint16_t max_finite_bits = static_cast<std::uint16_t>(exp_mask<Format> - 1u);

template <class Format>
bool is_nan_bits(std::uint16_t b) {
  return (b & exp_mask<Format>) == exp_mask<Format> && (b & ((1u << Format::frac_bits) - 1u)) != 0;
}

// ---- the independent reference -----------------------------------------------------------------

// (-1)^s * 2^(e - bias) * 1.f, or 2^(1 - bias) * 0.f for e == 0: the textbook definition.
template <class Format>
long double closed_form(std::uint16_t b) {
  int const frac = b & ((1 << Format::frac_bits) - 1);
  int const e = (b >> Format::frac_bits) & ((1 << Format::exp_bits) - 1);
  long double const mag =
      e == 0 ? std::ldexp(static_cast<long double>(frac), 1 - Format::bias - Format::frac_bits)
             : std::ldexp(static_cast<long double>((1 << Format::frac_bits) + frac),
                          e - Format::bias - Format::frac_bits);
  return (b & 0x8000u) ? -mag : mag;
}

// Rounds an exact value (long double holds every double, every int64 and every sum or product
// used below exactly) to nearest, ties to even, by looking up its two neighbours.
template <class Format>
std::uint16_t reference_round(long double v) {
  static std::vector<long double> const table = [] {
    std::vector<long double> t;
    for (unsigned b = 0; b <= max_finite_bits<Format>; ++b) {
      t.push_back(closed_form<Format>(static_cast<std::uint16_t>(b)));
    }
    return t;
  }();
  if (std::isnan(v)) return 0x7fff;
  std::uint16_t const sign = std::signbit(v) ? 0x8000u : 0u;
  long double const a = std::fabs(v);
  long double const max = table.back();
  long double const overflow = max + (max - table[table.size() - 2]) / 2;  // ties go to "2^emax"
  if (a >= overflow) return static_cast<std::uint16_t>(sign | exp_mask<Format>);
  auto const above = std::upper_bound(table.begin(), table.end(), a);
  auto lo = static_cast<std::uint16_t>((above - table.begin()) - 1);
  if (above != table.end()) {
    long double const mid = (table[lo] + *above) / 2;  // exact: a few more bits than the format
    if (a > mid || (a == mid && (lo & 1u) != 0)) ++lo;
  }
  return static_cast<std::uint16_t>(sign | lo);
}

// The float an f16 pattern stands for, from the closed form (inf and NaN by their definition).
float closed_form_or_nan(f16 h) {
  std::uint16_t const b = h.bits();
  if ((b & exp_mask<f16_format>) == exp_mask<f16_format>) {
    if (is_nan_bits<f16_format>(b)) return std::numeric_limits<float>::quiet_NaN();
    return (b & 0x8000u) ? -std::numeric_limits<float>::infinity()
                         : std::numeric_limits<float>::infinity();
  }
  return static_cast<float>(closed_form<f16_format>(b));
}

// The finite values next to the rounding boundaries of a format, as floats: each value, the
// midpoint to its successor, and the floats one ulp either side of that midpoint.
template <class Format>
std::vector<float> boundary_floats() {
  std::vector<float> out;
  for (unsigned b = 0; b < max_finite_bits<Format>; ++b) {
    long double const lo = closed_form<Format>(static_cast<std::uint16_t>(b));
    long double const hi = closed_form<Format>(static_cast<std::uint16_t>(b + 1));
    auto const mid = static_cast<float>((lo + hi) / 2);  // exact in float for both formats
    for (float x : {static_cast<float>(lo), mid, std::nextafter(mid, 0.0f),
                    std::nextafter(mid, std::numeric_limits<float>::infinity())}) {
      out.push_back(x);
      out.push_back(-x);
    }
  }
  return out;
}

// ---- checks written once per format ------------------------------------------------------------

template <class Format>
void check_decode_all() {
  using T = typename Format::type;
  int mismatches = 0;
  for (unsigned b = 0; b < 0x10000u; ++b) {
    auto const h = static_cast<std::uint16_t>(b);
    std::uint32_t const ours = bits_of(static_cast<float>(T::from_bits(h)));
    std::uint32_t const cuda = bits_of(Format::cuda_to_float(h));
    if (ours != cuda && ++mismatches <= 5) {
      INFO(Format::name, " bits ", hex(b), ": weft ", hex(ours), ", CUDA ", hex(cuda));
      CHECK(ours == cuda);
    }
  }
  CHECK(mismatches == 0);
}

template <class Format>
void check_decode_closed_form() {
  using T = typename Format::type;
  int mismatches = 0;
  for (unsigned b = 0; b < 0x10000u; ++b) {
    auto const h = static_cast<std::uint16_t>(b);
    if ((h & exp_mask<Format>) == exp_mask<Format>) continue;  // inf/NaN: separate golden checks
    auto const ours = static_cast<long double>(static_cast<float>(T::from_bits(h)));
    long double const want = closed_form<Format>(h);
    bool const ok = ours == want && std::signbit(ours) == std::signbit(want);
    if (!ok && ++mismatches <= 5) {
      INFO(Format::name, " bits ", hex(b));
      CHECK(ours == want);
    }
  }
  CHECK(mismatches == 0);
}

template <class Format>
void check_round_trip_all() {
  using T = typename Format::type;
  int mismatches = 0;
  for (unsigned b = 0; b < 0x10000u; ++b) {
    auto const h = static_cast<std::uint16_t>(b);
    std::uint16_t const want = is_nan_bits<Format>(h) ? std::uint16_t{0x7fff} : h;
    std::uint16_t const got = T(static_cast<float>(T::from_bits(h))).bits();
    std::uint16_t const via_double = T(static_cast<double>(T::from_bits(h))).bits();
    if ((got != want || via_double != want) && ++mismatches <= 5) {
      INFO(Format::name, " bits ", hex(b), " -> ", hex(got), " (via double ", hex(via_double), ")");
      CHECK(got == want);
    }
  }
  CHECK(mismatches == 0);
}

template <class Format>
void check_float_boundaries() {
  using T = typename Format::type;
  int mismatches = 0;
  std::vector<float> xs = boundary_floats<Format>();
  // Plus, for bf16's rounding position, every upper half with the interesting lower halves.
  for (std::uint32_t hi = 0; hi < 0x10000u; ++hi) {
    for (std::uint32_t lo : {0x0000u, 0x0001u, 0x7fffu, 0x8000u, 0x8001u, 0xffffu}) {
      xs.push_back(float_from_bits(hi << 16 | lo));
    }
  }
  for (float x : xs) {
    std::uint16_t const ours = T(x).bits();
    std::uint16_t const cuda = Format::cuda_from_float(x);
    std::uint16_t const ref = reference_round<Format>(static_cast<long double>(x));
    if ((ours != cuda || ours != ref) && ++mismatches <= 5) {
      INFO(Format::name, " from float bits ", hex(bits_of(x)), ": weft ", hex(ours), ", CUDA ",
           hex(cuda), ", reference ", hex(ref));
      CHECK(ours == cuda);
      CHECK(ours == ref);
    }
  }
  CHECK(mismatches == 0);
}

template <class Format>
void check_double_conversion() {
  using T = typename Format::type;
  std::vector<double> xs;
  // Midpoints of neighbours (exact in double) and a few double ulps either side: the inputs
  // where rounding to float first and then to the format would go wrong.
  for (unsigned b = 0; b < max_finite_bits<Format>; ++b) {
    auto const lo = static_cast<double>(closed_form<Format>(static_cast<std::uint16_t>(b)));
    auto const hi = static_cast<double>(closed_form<Format>(static_cast<std::uint16_t>(b + 1)));
    double const mid = (lo + hi) / 2;
    for (double x : {lo, mid, std::nextafter(mid, 0.0), std::nextafter(mid, 1e300),
                     mid + std::ldexp(mid, -40), mid - std::ldexp(mid, -40)}) {
      xs.push_back(x);
      xs.push_back(-x);
    }
  }
  // Random bit patterns over the whole double range, and random values in the format's range.
  std::mt19937_64 rng(20240611);
  for (int i = 0; i < 200000; ++i) xs.push_back(double_from_bits(rng()));
  std::uniform_real_distribution<double> unit(-1.0, 1.0);
  std::uniform_int_distribution<int> scale(-140, 130);
  for (int i = 0; i < 200000; ++i) xs.push_back(std::ldexp(unit(rng), scale(rng)));
  for (double x :
       {0.0, -0.0, 1e300, -1e300, 1e-300, -1e-300, std::numeric_limits<double>::infinity(),
        -std::numeric_limits<double>::infinity(), std::numeric_limits<double>::quiet_NaN(),
        -std::numeric_limits<double>::quiet_NaN(), std::numeric_limits<double>::denorm_min(),
        double{std::numeric_limits<float>::max()},
        std::nextafter(double{std::numeric_limits<float>::max()}, 1e300)}) {
    xs.push_back(x);
  }

  int mismatches = 0;
  for (double x : xs) {
    std::uint16_t const ours = T(x).bits();
    std::uint16_t const cuda = Format::cuda_from_double(x);
    std::uint16_t const ref = reference_round<Format>(static_cast<long double>(x));
    std::uint16_t const via_convert = weft::convert<T>(x).bits();
    if ((ours != cuda || ours != ref || via_convert != ours) && ++mismatches <= 5) {
      INFO(Format::name, " from double bits ", hex(bits_of(x)), ": weft ", hex(ours), ", CUDA ",
           hex(cuda), ", reference ", hex(ref));
      CHECK(ours == cuda);
      CHECK(ours == ref);
      CHECK(via_convert == ours);
    }
  }
  CHECK(mismatches == 0);
}

template <class Format>
void check_integer_conversion() {
  using T = typename Format::type;
  int mismatches = 0;
  // cuda: CUDA's host conversion of v, where it is defined (below).
  auto check_one = [&](auto v, std::uint16_t ours, std::optional<std::uint16_t> cuda) {
    std::uint16_t const ref = reference_round<Format>(static_cast<long double>(v));
    if ((ours != ref || (cuda && ours != *cuda)) && ++mismatches <= 5) {
      INFO(Format::name, " from integer ", v, ": weft ", hex(ours), ", CUDA ",
           cuda ? hex(*cuda) : std::string("-"), ", reference ", hex(ref));
      CHECK(ours == ref);
      if (cuda) CHECK(ours == *cuda);
    }
  };
  // CUDA's host __ll2bfloat16_rn casts float(v) back to long long: undefined behaviour where
  // float(v) rounds up to 2^63 (v > 2^63 - 2^39; clang's UBSan reports it). There only the
  // reference judges weft.
  auto const cuda_ll = [](std::int64_t v) -> std::optional<std::uint16_t> {
    if (std::is_same_v<T, bf16> && static_cast<float>(v) >= 0x1p63f) return std::nullopt;
    return Format::cuda_from_ll(v);
  };
  for (int v = 0; v < 256; ++v) {
    auto const u = static_cast<std::uint8_t>(v);
    check_one(v, weft::convert<T>(u).bits(), Format::cuda_from_int(v));
  }
  std::mt19937_64 rng(77);
  std::vector<std::int64_t> wide = {std::numeric_limits<std::int64_t>::min(),
                                    std::numeric_limits<std::int64_t>::max(),
                                    std::numeric_limits<std::int64_t>::min() + 1,
                                    0,
                                    1,
                                    -1,
                                    65504,
                                    65519,
                                    65520,
                                    -65520,
                                    (1LL << 24) + 1,
                                    (1LL << 53) + 1,
                                    (1LL << 62) + (1LL << 54) + 1};
  // 300000 random values (30000 under a sanitizer, where the whole takes 13 s at -O0).
  int const draws = weft::test::under_sanitizer ? 30000 : 300000;
  for (int i = 0; i < draws; ++i) {
    // Random magnitudes with every bit width, so that all exponents get rounded.
    std::int64_t const v = static_cast<std::int64_t>(rng() >> (rng() % 64));
    wide.push_back(v);
    if (v != std::numeric_limits<std::int64_t>::min()) wide.push_back(-v);
    // And values sitting on or beside a tie: a few significant bits, then a 1 and a tail.
    auto const base = static_cast<std::int64_t>(rng() >> 52) << (rng() % 40);
    wide.push_back(base + 1);
    wide.push_back(base - 1);
  }
  for (std::int64_t v : wide) {
    check_one(v, weft::convert<T>(v).bits(), cuda_ll(v));
    auto const v32 = static_cast<std::int32_t>(v);
    check_one(v32, weft::convert<T>(v32).bits(), Format::cuda_from_int(v32));
  }
  CHECK(mismatches == 0);
}

template <class Format>
void check_to_integer_all() {
  using T = typename Format::type;
  int mismatches = 0;
  for (unsigned b = 0; b < 0x10000u; ++b) {
    auto const h = static_cast<std::uint16_t>(b);
    T const x = T::from_bits(h);
    bool const nan = is_nan_bits<Format>(h);
    std::int32_t const i = weft::convert<std::int32_t>(x);
    std::int64_t const l = weft::convert<std::int64_t>(x);
    std::uint8_t const u = weft::convert<std::uint8_t>(x);
    // CUDA's host __half2ll_rz / __bfloat162ll_rz return INT64_MIN for NaN (the x86 answer)
    // while their int and uchar versions and every device cvt.rzi return 0; weft says 0 always.
    long long const want_l = nan ? 0 : Format::cuda_to_ll_rz(h);
    bool const ok =
        i == Format::cuda_to_int_rz(h) && l == want_l && u == Format::cuda_to_uchar_rz(h);
    if (!ok && ++mismatches <= 5) {
      INFO(Format::name, " bits ", hex(b), ": weft ", i, " / ", l, " / ", int{u});
      CHECK(i == Format::cuda_to_int_rz(h));
      CHECK(l == want_l);
      CHECK(int{u} == int{Format::cuda_to_uchar_rz(h)});
    }
  }
  CHECK(mismatches == 0);
}

// +, -, *, / on random pairs against the reference rounding of the exact result. The operands'
// exponents are kept within 40 of each other, so every exact sum fits long double's 64 bits.
template <class Format>
void check_arithmetic() {
  using T = typename Format::type;
  std::mt19937 rng(4242);
  std::uniform_int_distribution<unsigned> any_bits(0, 0xffff);
  int mismatches = 0;
  int checked = 0;
  while (checked < 200000) {
    auto const ab = static_cast<std::uint16_t>(any_bits(rng));
    auto const bb = static_cast<std::uint16_t>(any_bits(rng));
    if ((ab & exp_mask<Format>) == exp_mask<Format> ||
        (bb & exp_mask<Format>) == exp_mask<Format>) {
      continue;
    }
    int const ea = (ab & exp_mask<Format>) >> Format::frac_bits;
    int const eb = (bb & exp_mask<Format>) >> Format::frac_bits;
    if (std::abs(ea - eb) > 40) continue;
    ++checked;
    T const a = T::from_bits(ab);
    T const b = T::from_bits(bb);
    long double const x = closed_form<Format>(ab);
    long double const y = closed_form<Format>(bb);
    std::uint16_t const got[4] = {(a + b).bits(), (a - b).bits(), (a * b).bits(),
                                  y == 0 ? std::uint16_t{0} : (a / b).bits()};
    std::uint16_t const want[4] = {reference_round<Format>(x + y), reference_round<Format>(x - y),
                                   reference_round<Format>(x * y),
                                   y == 0 ? std::uint16_t{0} : reference_round<Format>(x / y)};
    for (int k = 0; k < 4; ++k) {
      if (got[k] != want[k] && ++mismatches <= 5) {
        INFO(Format::name, " op ", "+-*/"[k], " on ", hex(ab), ", ", hex(bb), ": weft ",
             hex(got[k]), ", reference ", hex(want[k]));
        CHECK(got[k] == want[k]);
      }
    }
  }
  CHECK(mismatches == 0);
}

// All 2^32 floats against CUDA's host conversion; OpenMP splits the range where available.
template <class Format>
void check_all_floats() {
  using T = typename Format::type;
  std::int64_t mismatches = 0;
  std::int64_t first = std::int64_t{1} << 32;
#if defined(_OPENMP)
#pragma omp parallel for schedule(static) reduction(+ : mismatches) reduction(min : first)
#endif
  for (std::int64_t i = 0; i < (std::int64_t{1} << 32); ++i) {
    float const x = float_from_bits(static_cast<std::uint32_t>(i));
    if (T(x).bits() != Format::cuda_from_float(x)) {
      ++mismatches;
      first = std::min(first, i);
    }
  }
  INFO(Format::name, ": first mismatching float bits ", hex(static_cast<std::uint64_t>(first)));
  CHECK(mismatches == 0);
}

// A list of the element types, to run a check over every (To, From) pair.
template <class... Ts>
struct type_list {};
using all_elements = type_list<float, double, bf16, f16, std::int32_t, std::int64_t, std::uint8_t>;

template <class To, class From>
void check_small_values_pair() {
  // 0, 1, 3 and 100 are exact in every element type, so every pair must carry them unchanged.
  for (int v : {0, 1, 3, 100}) {
    From const from = weft::convert<From>(static_cast<std::int32_t>(v));
    To const to = weft::convert<To>(from);
    INFO("convert<", weft::dtype_of<To>, ">(", weft::dtype_of<From>, " ", v, ")");
    CHECK(weft::convert<std::int32_t>(to) == v);
    CHECK(static_cast<double>(weft::convert<double>(to)) == static_cast<double>(v));
  }
}

template <class... Tos, class... Froms>
void check_all_pairs(type_list<Tos...>, type_list<Froms...>) {
  auto const one_to = [&]<class To>() { (check_small_values_pair<To, Froms>(), ...); };
  (one_to.template operator()<Tos>(), ...);
}

}  // namespace

// ---- compile-time properties --------------------------------------------------------------------

static_assert(sizeof(bf16) == 2 && sizeof(f16) == 2);
static_assert(std::is_trivially_copyable_v<bf16> && std::is_trivially_copyable_v<f16>);
static_assert(std::is_standard_layout_v<bf16> && std::is_standard_layout_v<f16>);
static_assert(!std::is_convertible_v<float, bf16> && !std::is_convertible_v<float, f16>,
              "construction from float rounds, so it must be spelled out");
static_assert(std::is_convertible_v<bf16, float> && std::is_convertible_v<f16, float>);
// The conversions are usable in constant expressions.
static_assert(bf16(1.0f).bits() == 0x3f80 && f16(1.0f).bits() == 0x3c00);
static_assert(bf16(1.0 + 0x1p-8 + 0x1p-40).bits() == 0x3f81);
static_assert(static_cast<float>(f16::from_bits(0x0001)) == 0x1p-24f);
static_assert(weft::convert<std::int32_t>(bf16(-2.75f)) == -2);
static_assert(weft::convert<f16>(std::int64_t{65520}).bits() == 0x7c00);
static_assert((bf16(1.5f) + bf16(2.0f)).bits() == bf16(3.5f).bits());

static_assert(weft::Element<float> && weft::Element<double> && weft::Element<bf16> &&
              weft::Element<f16> && weft::Element<std::int32_t> && weft::Element<std::int64_t> &&
              weft::Element<std::uint8_t>);
static_assert(!weft::Element<std::string> && !weft::Element<bool> && !weft::Element<char> &&
              !weft::Element<std::int16_t> && !weft::Element<float const> &&
              !weft::Element<__nv_bfloat16>);
static_assert(std::is_same_v<weft::f32, float> && std::is_same_v<weft::f64, double> &&
              std::is_same_v<weft::i32, std::int32_t> && std::is_same_v<weft::i64, std::int64_t> &&
              std::is_same_v<weft::u8, std::uint8_t>);
static_assert(weft::dtype_of<float const> == weft::dtype::f32);

// ---- decoding -----------------------------------------------------------------------------------

TEST_CASE("dtype: bf16 -> float equals __bfloat162float for all 65536 bit patterns") {
  check_decode_all<bf16_format>();
}

TEST_CASE("dtype: f16 -> float equals __half2float for all 65536 bit patterns") {
  check_decode_all<f16_format>();
}

TEST_CASE("dtype: bf16 and f16 decode to the closed-form value of every finite pattern") {
  check_decode_closed_form<bf16_format>();
  check_decode_closed_form<f16_format>();
}

TEST_CASE("dtype: decoding infinities and NaNs") {
  CHECK(bits_of(static_cast<float>(bf16::from_bits(0x7f80))) == 0x7f800000u);
  CHECK(bits_of(static_cast<float>(bf16::from_bits(0xff80))) == 0xff800000u);
  CHECK(bits_of(static_cast<float>(bf16::from_bits(0x7fc1))) == 0x7fc10000u);  // payload kept
  CHECK(bits_of(static_cast<float>(bf16::from_bits(0xff81))) == 0xff810000u);
  CHECK(bits_of(static_cast<float>(f16::from_bits(0x7c00))) == 0x7f800000u);
  CHECK(bits_of(static_cast<float>(f16::from_bits(0xfc00))) == 0xff800000u);
  CHECK(bits_of(static_cast<float>(f16::from_bits(0x7e00))) == 0x7fffffffu);  // as CUDA: canonical
  CHECK(bits_of(static_cast<float>(f16::from_bits(0xfc01))) == 0x7fffffffu);
  CHECK(static_cast<float>(f16::from_bits(0x7bff)) == 65504.0f);
  CHECK(static_cast<float>(f16::from_bits(0x03ff)) == 1023 * 0x1p-24f);
  CHECK(bits_of(static_cast<float>(f16::from_bits(0x8000))) == 0x80000000u);
}

// ---- encoding from float ------------------------------------------------------------------------

TEST_CASE("dtype: every finite bf16 and f16 survives float -> and back, NaNs become 0x7FFF") {
  check_round_trip_all<bf16_format>();
  check_round_trip_all<f16_format>();
}

TEST_CASE("dtype: float -> bf16 golden values") {
  struct golden {
    std::uint32_t in;
    std::uint16_t out;
  };
  golden const cases[] = {
      {0x3f800000, 0x3f80},                        // 1
      {0xc0000000, 0xc000},                        // -2
      {0x3dcccccd, 0x3dcd},                        // 0.1f: remainder 0xcccd > half, up
      {0x3f808000, 0x3f80},                        // 1 + 2^-8: tie, 0x3f80 is even, down
      {0x3f818000, 0x3f82},                        // tie next to odd 0x3f81, up to even
      {0x3f808001, 0x3f81},                        // just above the tie
      {0x3f817fff, 0x3f81},                        // just below the tie
      {0x7f7f7fff, 0x7f7f},                        // just below max + ulp/2: max
      {0x7f7f8000, 0x7f80},                        // the overflow tie goes to infinity
      {0x7f7fffff, 0x7f80},                        // FLT_MAX overflows
      {0xff7fffff, 0xff80}, {0x00000001, 0x0000},  // float denorm_min underflows
      {0x00008000, 0x0000},                        // half of bf16 denorm_min: tie to even zero
      {0x00008001, 0x0001}, {0x00018000, 0x0002},  // tie next to odd 1, up
      {0x00800000, 0x0080},                        // smallest normal
      {0x80000000, 0x8000},                        // -0
      {0x807fffff, 0x8080},  // largest negative subnormal float rounds up into the normals
      {0x7f800000, 0x7f80},  // inf
      {0xff800000, 0xff80},  // -inf
      {0x7fc00000, 0x7fff},  // NaNs of any sign and payload: canonical
      {0xffc00000, 0x7fff}, {0x7f800001, 0x7fff},  // truncating would give inf
      {0x7fbfffff, 0x7fff}, {0xffffffff, 0x7fff}, {0x7fff8000, 0x7fff},
  };
  for (auto const& c : cases) {
    INFO("float bits ", hex(c.in));
    CHECK(bf16(float_from_bits(c.in)).bits() == c.out);
    CHECK(bf16_format::cuda_from_float(float_from_bits(c.in)) == c.out);  // the golden table itself
  }
}

TEST_CASE("dtype: float -> f16 golden values") {
  struct golden {
    float in;
    std::uint16_t out;
  };
  golden const cases[] = {
      {1.0f, 0x3c00},
      {-2.0f, 0xc000},
      {0.1f, 0x2e66},
      {1.0f + 0x1p-11f, 0x3c00},      // tie, even down
      {1.0f + 3 * 0x1p-11f, 0x3c02},  // tie next to odd 0x3c01, up
      {65504.0f, 0x7bff},             // max
      {65519.0f, 0x7bff},
      {65519.996f, 0x7bff},
      {65520.0f, 0x7c00},  // max + ulp/2: tie to even is infinity
      {-65520.0f, 0xfc00},
      {1e6f, 0x7c00},
      {0x1p-14f, 0x0400},            // smallest normal
      {1023.5f * 0x1p-24f, 0x0400},  // tie between largest subnormal (odd) and it
      {1023.25f * 0x1p-24f, 0x03ff},
      {0x1p-24f, 0x0001},  // smallest subnormal
      {-0x1p-24f, 0x8001},
      {0x1p-25f, 0x0000},  // half of it: tie to even zero
      {-0x1p-25f, 0x8000},
      {std::nextafter(0x1p-25f, 1.0f), 0x0001},
      {3 * 0x1p-25f, 0x0002},  // 1.5 units: tie, up to even 2
      {5 * 0x1p-25f, 0x0002},  // 2.5 units: tie, down to even 2
      {0x1p-26f, 0x0000},
      {0x1p-149f, 0x0000},
      {-0.0f, 0x8000},
      {std::numeric_limits<float>::infinity(), 0x7c00},
      {-std::numeric_limits<float>::infinity(), 0xfc00},
      {float_from_bits(0x7fc00000), 0x7fff},
      {float_from_bits(0xffc00000), 0x7fff},
      {float_from_bits(0x7f800001), 0x7fff},
      {float_from_bits(0xffffffff), 0x7fff},
      {float_from_bits(0x7fa00000), 0x7fff},
  };
  for (auto const& c : cases) {
    INFO("float ", c.in, " (bits ", hex(bits_of(c.in)), ")");
    CHECK(f16(c.in).bits() == c.out);
    CHECK(f16_format::cuda_from_float(c.in) == c.out);
  }
}

TEST_CASE("dtype: float -> bf16 matches CUDA and the reference at every rounding boundary") {
  check_float_boundaries<bf16_format>();
}

TEST_CASE("dtype: float -> f16 matches CUDA and the reference at every rounding boundary") {
  check_float_boundaries<f16_format>();
}

// ---- encoding from double and integers ----------------------------------------------------------

TEST_CASE("dtype: double -> bf16 rounds once (matches __double2bfloat16 and the reference)") {
  // Double rounding witness: via float, 1 + 2^-8 + 2^-40 would become the tie 1 + 2^-8 and then 1.
  CHECK(bf16(1.0 + 0x1p-8 + 0x1p-40).bits() == 0x3f81);
  CHECK(bf16(static_cast<float>(1.0 + 0x1p-8 + 0x1p-40)).bits() == 0x3f80);
  check_double_conversion<bf16_format>();
}

TEST_CASE("dtype: double -> f16 rounds once (matches __double2half and the reference)") {
  CHECK(f16(1.0 + 0x1p-11 + 0x1p-40).bits() == 0x3c01);
  CHECK(f16(static_cast<float>(1.0 + 0x1p-11 + 0x1p-40)).bits() == 0x3c00);
  CHECK(f16(65519.999999).bits() == 0x7bff);
  CHECK(f16(65520.0).bits() == 0x7c00);
  CHECK(f16(0x1p-25 + 0x1p-60).bits() == 0x0001);
  check_double_conversion<f16_format>();
}

TEST_CASE("dtype: integers -> bf16 and f16 round once (u8, i32, i64)") {
  // i64 witness: 2^62 + 2^54 + 1 is just above a bf16 tie; through float it lands on the tie.
  CHECK(weft::convert<bf16>(std::int64_t{(1LL << 62) + (1LL << 54) + 1}).bits() == 0x5e81);
  CHECK(weft::convert<f16>(std::int32_t{65519}).bits() == 0x7bff);
  CHECK(weft::convert<f16>(std::int32_t{-70000}).bits() == 0xfc00);
  CHECK(weft::convert<bf16>(std::uint8_t{255}).bits() == 0x437f);
  CHECK(weft::convert<bf16>(std::int32_t{257}).bits() == 0x4380);  // 256.5 units: tie, even
  CHECK(weft::convert<bf16>(std::numeric_limits<std::int64_t>::min()).bits() == 0xdf00);
  CHECK(bf16(7).bits() == 0x40e0);
  check_integer_conversion<bf16_format>();
  check_integer_conversion<f16_format>();
}

// ---- conversions between element types ----------------------------------------------------------

TEST_CASE("dtype: bf16 and f16 -> integers truncate and saturate like CUDA's _rz (all patterns)") {
  check_to_integer_all<bf16_format>();
  check_to_integer_all<f16_format>();
}

TEST_CASE("dtype: floating -> integer truncates toward zero, saturates, maps NaN to 0") {
  using weft::convert;
  float const nan = std::numeric_limits<float>::quiet_NaN();
  float const inf = std::numeric_limits<float>::infinity();
  CHECK(convert<std::int32_t>(3.9f) == 3);
  CHECK(convert<std::int32_t>(-3.9f) == -3);
  CHECK(convert<std::int32_t>(2147483648.0f) == 2147483647);
  CHECK(convert<std::int32_t>(-2147483648.0f) == -2147483647 - 1);
  CHECK(convert<std::int32_t>(1e10f) == 2147483647);
  CHECK(convert<std::int32_t>(-inf) == -2147483647 - 1);
  CHECK(convert<std::int32_t>(nan) == 0);
  CHECK(convert<std::int32_t>(2147483520.0f) == 2147483520);  // largest float below 2^31
  CHECK(convert<std::int32_t>(2147483647.0) == 2147483647);   // exact in double
  CHECK(convert<std::int32_t>(2147483647.9) == 2147483647);
  CHECK(convert<std::int32_t>(-2147483648.9) == -2147483647 - 1);
  CHECK(convert<std::int64_t>(1e19) == std::numeric_limits<std::int64_t>::max());
  CHECK(convert<std::int64_t>(-1e19) == std::numeric_limits<std::int64_t>::min());
  CHECK(convert<std::int64_t>(9223372036854774784.0) == 9223372036854774784LL);  // 2^63 - 1024
  CHECK(convert<std::int64_t>(-std::numeric_limits<double>::quiet_NaN()) == 0);
  CHECK(convert<std::uint8_t>(-1.0f) == 0);
  CHECK(convert<std::uint8_t>(-0.5f) == 0);
  CHECK(convert<std::uint8_t>(255.9f) == 255);
  CHECK(convert<std::uint8_t>(300.0) == 255);
  CHECK(convert<std::uint8_t>(nan) == 0);
}

TEST_CASE("dtype: other conversions: integer wrap, nearest-even to float, exact widening") {
  using weft::convert;
  CHECK(convert<std::uint8_t>(std::int32_t{300}) == 44);  // modulo 256, as C++ and torch
  CHECK(convert<std::uint8_t>(std::int32_t{-1}) == 255);
  CHECK(convert<std::int32_t>(std::int64_t{1} << 32 | 5) == 5);
  CHECK(convert<std::int64_t>(std::int32_t{-7}) == -7);
  CHECK(convert<float>(std::int32_t{(1 << 24) + 1}) == 16777216.0f);
  CHECK(convert<float>(std::int32_t{(1 << 24) + 3}) == 16777220.0f);
  CHECK(convert<float>(1.0 + 0x1p-24) == 1.0f);
  CHECK(convert<float>(1.0 + 0x1p-24 + 0x1p-50) == 1.0f + 0x1p-23f);
  CHECK(convert<double>(0.1f) == static_cast<double>(0.1f));
  CHECK(bits_of(convert<float>(f16::from_bits(0x0001))) == bits_of(0x1p-24f));
  CHECK(convert<double>(bf16(3.0f)) == 3.0);
  // bf16 <-> f16 goes through float exactly, so it is CUDA's float conversion of the float.
  int mismatches = 0;
  for (unsigned b = 0; b < 0x10000u; ++b) {
    auto const h = static_cast<std::uint16_t>(b);
    std::uint16_t const to_f16 = convert<f16>(bf16::from_bits(h)).bits();
    std::uint16_t const to_bf16 = convert<bf16>(f16::from_bits(h)).bits();
    if (to_f16 != f16_format::cuda_from_float(bf16_format::cuda_to_float(h))) ++mismatches;
    if (to_bf16 != bf16_format::cuda_from_float(f16_format::cuda_to_float(h))) ++mismatches;
  }
  CHECK(mismatches == 0);
  CHECK(convert<f16>(bf16(1e30f)).bits() == 0x7c00);
  CHECK(convert<bf16>(f16::from_bits(0x0001)).bits() == bf16(0x1p-24f).bits());
}

TEST_CASE("dtype: convert carries small exact values between every pair of element types") {
  check_all_pairs(all_elements{}, all_elements{});
  weft::convert_to<bf16> const to_bf16{};  // the functor form used by casting kernels
  CHECK(to_bf16(2.5).bits() == 0x4020);
  CHECK(to_bf16(std::uint8_t{2}).bits() == 0x4000);
}

// ---- arithmetic, comparison, limits -------------------------------------------------------------

TEST_CASE("dtype: bf16 arithmetic is the correctly rounded result of the exact operation") {
  check_arithmetic<bf16_format>();
}

TEST_CASE("dtype: f16 arithmetic is the correctly rounded result of the exact operation") {
  check_arithmetic<f16_format>();
}

TEST_CASE("dtype: compound assignment, negation and mixed expressions") {
  bf16 x(1.5f);
  x += bf16(2.0f);
  CHECK(static_cast<float>(x) == 3.5f);
  x *= bf16(2.0f);
  CHECK(static_cast<float>(x) == 7.0f);
  x -= bf16(8.0f);
  CHECK(static_cast<float>(x) == -1.0f);
  x /= bf16(4.0f);
  CHECK(static_cast<float>(x) == -0.25f);
  f16 h(1.0f);
  h += f16(0x1p-11f);  // a tie: stays 1
  CHECK(h.bits() == 0x3c00);
  CHECK((-f16(2.0f)).bits() == 0xc000);
  CHECK((-bf16::from_bits(0x7fff)).bits() == 0xffff);  // negation flips the sign bit, even of NaN
  CHECK((-f16::from_bits(0x0000)).bits() == 0x8000);
  CHECK((+bf16(3.0f)).bits() == bf16(3.0f).bits());
  // A bf16 mixed with a float is a float expression: no rounding to bf16 happens.
  auto const mixed = bf16(1.0f) + 0x1p-20f;
  static_assert(std::is_same_v<decltype(mixed), float const>);
  CHECK(mixed == 1.0f + 0x1p-20f);
  CHECK((bf16(65504.0f) * bf16(2.0f)).bits() == 0x4800);  // bf16's range is float's
  CHECK((f16(65504.0f) + f16(16.0f)).bits() == 0x7c00);   // 65520: overflow tie
  CHECK((f16(0x1p-24f) * f16(0.5f)).bits() == 0x0000);    // underflow tie to even
  CHECK(isnan(f16(0.0f) / f16(0.0f)));
  CHECK((f16(0.0f) / f16(0.0f)).bits() == 0x7fff);
  CHECK((f16(1.0f) / f16(3.0f)).bits() == 0x3555);
  CHECK((bf16(1.0f) / bf16(3.0f)).bits() == 0x3eab);
}

TEST_CASE("dtype: comparisons have float semantics") {
  bf16 const nan = weft::limits<bf16>::quiet_NaN();
  f16 const hnan = weft::limits<f16>::quiet_NaN();
  CHECK_FALSE(nan == nan);
  CHECK(nan != nan);
  CHECK_FALSE(nan < nan);
  CHECK_FALSE(nan >= nan);
  CHECK_FALSE(hnan == hnan);
  CHECK(hnan != hnan);
  CHECK_FALSE(hnan <= f16(1.0f));
  CHECK(bf16(0.0f) == bf16(-0.0f));
  CHECK(f16(0.0f) == f16(-0.0f));
  CHECK(f16(-0.0f).bits() != f16(0.0f).bits());
  CHECK(bf16(-1.0f) < bf16(0.5f));
  CHECK(f16(2.0f) >= f16(2.0f));
  CHECK(f16(2.0f) > f16::from_bits(0x3fff));
  CHECK(bf16(1.0f) <= bf16(1.0f));
  CHECK(bf16(3.0f) == 3.0f);  // via float
  CHECK(isnan(nan));
  CHECK(isnan(bf16::from_bits(0xff81)));
  CHECK_FALSE(isnan(weft::limits<bf16>::infinity()));
  CHECK(isinf(-weft::limits<f16>::infinity()));
  CHECK_FALSE(isfinite(weft::limits<f16>::infinity()));
  CHECK(isfinite(weft::limits<f16>::max()));
  CHECK(signbit(bf16(-0.0f)));
  CHECK_FALSE(signbit(f16(0.0f)));
  // Ordering agrees with float on a sample of pairs, NaNs included.
  std::mt19937 rng(9);
  int disagreements = 0;
  for (int i = 0; i < 100000; ++i) {
    auto const a = f16::from_bits(static_cast<std::uint16_t>(rng()));
    auto const b = f16::from_bits(static_cast<std::uint16_t>(rng()));
    float const fa = closed_form_or_nan(a);
    float const fb = closed_form_or_nan(b);
    disagreements += (a < b) != (fa < fb);
    disagreements += (a == b) != (fa == fb);
    disagreements += (a >= b) != (fa >= fb);
  }
  CHECK(disagreements == 0);
}

TEST_CASE("dtype: limits of bf16 and f16 are the closed-form values") {
  using L = weft::limits<bf16>;
  using H = weft::limits<f16>;
  CHECK(static_cast<float>(L::max()) == 0x1.fep127f);
  CHECK(static_cast<float>(L::lowest()) == -0x1.fep127f);
  CHECK(static_cast<float>(L::min()) == 0x1p-126f);
  CHECK(static_cast<float>(L::denorm_min()) == 0x1p-133f);
  CHECK(static_cast<float>(L::epsilon()) == 0x1p-7f);
  CHECK(static_cast<float>(L::round_error()) == 0.5f);
  CHECK(static_cast<float>(L::infinity()) == std::numeric_limits<float>::infinity());
  CHECK(L::quiet_NaN().bits() == bf16(std::numeric_limits<float>::quiet_NaN()).bits());
  CHECK(static_cast<float>(bf16::from_bits(static_cast<std::uint16_t>(0x3f80 + 1))) - 1.0f ==
        static_cast<float>(L::epsilon()));
  CHECK(static_cast<float>(H::max()) == 65504.0f);
  CHECK(static_cast<float>(H::lowest()) == -65504.0f);
  CHECK(static_cast<float>(H::min()) == 0x1p-14f);
  CHECK(static_cast<float>(H::denorm_min()) == 0x1p-24f);
  CHECK(static_cast<float>(H::epsilon()) == 0x1p-10f);
  CHECK(static_cast<float>(H::round_error()) == 0.5f);
  CHECK(static_cast<float>(H::infinity()) == std::numeric_limits<float>::infinity());
  CHECK(H::quiet_NaN().bits() == f16(std::numeric_limits<float>::quiet_NaN()).bits());
  CHECK(L::digits == 8);
  CHECK(H::digits == 11);
  // The digits and exponent ranges, derived from max/min as numeric_limits defines them.
  CHECK(std::ldexp(1.0f, L::max_exponent - 1) <= static_cast<float>(L::max()));
  CHECK(std::ldexp(1.0f, L::min_exponent - 1) == static_cast<float>(L::min()));
  CHECK(std::ldexp(1.0f, H::max_exponent - 1) <= static_cast<float>(H::max()));
  CHECK(std::ldexp(1.0f, H::min_exponent - 1) == static_cast<float>(H::min()));
  CHECK(std::pow(10.0f, static_cast<float>(H::max_exponent10)) <= 65504.0f);
  CHECK(std::pow(10.0f, static_cast<float>(H::max_exponent10 + 1)) > 65504.0f);
  CHECK(std::pow(10.0f, static_cast<float>(H::min_exponent10)) >= 0x1p-14f);
  CHECK(std::pow(10.0f, static_cast<float>(H::min_exponent10 - 1)) < 0x1p-14f);
  // The arithmetic types forward to numeric_limits.
  CHECK(weft::limits<float>::infinity() == std::numeric_limits<float>::infinity());
  CHECK(weft::limits<std::int64_t>::max() == std::numeric_limits<std::int64_t>::max());
  CHECK(weft::limits<std::uint8_t>::lowest() == 0);
}

namespace {
// Generic code written for float, as a user writes it.
template <class T>
T dtype_test_negative_infinity() {
  return -std::numeric_limits<T>::infinity();
}

template <class T>
void check_std_limits_are_weft_limits(std::uint16_t quiet_bit) {
  using S = std::numeric_limits<T>;
  using C = cuda::std::numeric_limits<T>;
  using W = weft::limits<T>;
  static_assert(S::is_specialized && C::is_specialized);
  static_assert(S::digits == W::digits && C::digits == W::digits);
  static_assert(S::max_exponent == W::max_exponent && S::min_exponent == W::min_exponent);
  static_assert(S::has_infinity && S::has_quiet_NaN && S::has_signaling_NaN && S::is_bounded);
  static_assert(!S::is_integer && !S::is_exact && !S::is_modulo && S::is_signed);
  static_assert(S::round_style == std::round_to_nearest);
  static_assert(C::round_style == cuda::std::round_to_nearest);
  static_assert(S::has_denorm == std::denorm_present);
  for (auto [s, c, w] : {std::array<T, 3>{S::infinity(), C::infinity(), W::infinity()},
                         {S::quiet_NaN(), C::quiet_NaN(), W::quiet_NaN()},
                         {S::signaling_NaN(), C::signaling_NaN(), W::signaling_NaN()},
                         {S::max(), C::max(), W::max()},
                         {S::lowest(), C::lowest(), W::lowest()},
                         {S::min(), C::min(), W::min()},
                         {S::denorm_min(), C::denorm_min(), W::denorm_min()},
                         {S::epsilon(), C::epsilon(), W::epsilon()},
                         {S::round_error(), C::round_error(), W::round_error()}}) {
    CHECK(s.bits() == w.bits());
    CHECK(c.bits() == w.bits());
  }
  CHECK(static_cast<float>(dtype_test_negative_infinity<T>()) ==
        -std::numeric_limits<float>::infinity());
  CHECK(std::isnan(static_cast<float>(S::quiet_NaN())));
  CHECK(std::isnan(static_cast<float>(S::signaling_NaN())));
  CHECK((S::quiet_NaN().bits() & quiet_bit) != 0);  // the quiet bit set, and clear:
  CHECK((S::signaling_NaN().bits() & quiet_bit) == 0);
}
}  // namespace

TEST_CASE(
    "dtype: std::numeric_limits and cuda::std::numeric_limits of bf16 and f16 are weft::limits' "
    "(not the primary template's zeros)") {
  check_std_limits_are_weft_limits<bf16>(0x0040u);
  check_std_limits_are_weft_limits<f16>(0x0200u);
  // bf16's signalling NaN is float's, truncated.
  CHECK(std::numeric_limits<bf16>::signaling_NaN().bits() ==
        std::bit_cast<std::uint32_t>(std::numeric_limits<float>::signaling_NaN()) >> 16);
}

// ---- the dtype tag ------------------------------------------------------------------------------

TEST_CASE("dtype: sizes, names, floating-ness and dtype_of for every element type") {
  using weft::dtype;
  CHECK(weft::size_of(dtype::f32) == 4);
  CHECK(weft::size_of(dtype::f64) == 8);
  CHECK(weft::size_of(dtype::bf16) == 2);
  CHECK(weft::size_of(dtype::f16) == 2);
  CHECK(weft::size_of(dtype::i32) == 4);
  CHECK(weft::size_of(dtype::i64) == 8);
  CHECK(weft::size_of(dtype::u8) == 1);
  CHECK(weft::name(dtype::f32) == "f32");
  CHECK(weft::name(dtype::f64) == "f64");
  CHECK(weft::name(dtype::bf16) == "bf16");
  CHECK(weft::name(dtype::f16) == "f16");
  CHECK(weft::name(dtype::i32) == "i32");
  CHECK(weft::name(dtype::i64) == "i64");
  CHECK(weft::name(dtype::u8) == "u8");
  CHECK(weft::is_floating(dtype::f32));
  CHECK(weft::is_floating(dtype::f64));
  CHECK(weft::is_floating(dtype::bf16));
  CHECK(weft::is_floating(dtype::f16));
  CHECK_FALSE(weft::is_floating(dtype::i32));
  CHECK_FALSE(weft::is_floating(dtype::i64));
  CHECK_FALSE(weft::is_floating(dtype::u8));
  CHECK(weft::dtype_of<float> == dtype::f32);
  CHECK(weft::dtype_of<double> == dtype::f64);
  CHECK(weft::dtype_of<bf16> == dtype::bf16);
  CHECK(weft::dtype_of<f16> == dtype::f16);
  CHECK(weft::dtype_of<std::int32_t> == dtype::i32);
  CHECK(weft::dtype_of<std::int64_t> == dtype::i64);
  CHECK(weft::dtype_of<std::uint8_t> == dtype::u8);
  static_assert(weft::size_of(weft::dtype_of<bf16>) == sizeof(bf16));
  static_assert(weft::name(dtype::i64) == "i64");
  // size_of agrees with sizeof and dispatch finds the type whose dtype_of is the tag.
  for (dtype d : weft::all_dtypes) {
    INFO(d);
    CHECK(weft::dispatch(d, []<class T>(std::type_identity<T>) { return sizeof(T); }) ==
          weft::size_of(d));
    CHECK(weft::dispatch(d, []<class T>(std::type_identity<T>) { return weft::dtype_of<T>; }) == d);
  }
  CHECK(weft::all_dtypes.size() == 7);
}

TEST_CASE("dtype: printing a dtype writes its name, an out-of-range value its number") {
  std::ostringstream os;
  os << weft::dtype::bf16 << ' ' << weft::dtype::u8 << ' ' << static_cast<weft::dtype>(42);
  CHECK(os.str() == "bf16 u8 dtype(42)");
  std::ostringstream values;
  values << bf16(1.5f) << ' ' << f16(-0.25f);
  CHECK(values.str() == "1.5 -0.25");
}

TEST_CASE("dtype: an out-of-range dtype value throws, naming argument, expectation and value") {
  auto const bad = static_cast<weft::dtype>(9);
  CHECK_THROWS_AS((void)weft::size_of(bad), weft::invalid_argument_error);
  CHECK_THROWS_AS((void)weft::dispatch(bad, [](auto) { return 0; }), weft::invalid_argument_error);
  try {
    (void)weft::name(bad);
    FAIL("expected an exception");
  } catch (weft::invalid_argument_error const& e) {
    std::string const what = e.what();
    CHECK(what.find("`dtype`") != std::string::npos);
    CHECK(what.find("one of f32, f64, bf16, f16, i32, i64, u8") != std::string::npos);
    CHECK(what.find("actual 9") != std::string::npos);
  }
}

// ---- exhaustive sweeps --------------------------------------------------------------------------

TEST_SUITE("slow") {
  TEST_CASE("dtype: all 2^32 floats -> bf16 equal __float2bfloat16") {
    check_all_floats<bf16_format>();
  }

  TEST_CASE("dtype: all 2^32 floats -> f16 equal __float2half") { check_all_floats<f16_format>(); }
}
