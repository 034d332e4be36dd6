// weft/core/dtype.hpp — element types: the 16-bit float storage types `bf16` and `f16` (host and
// device, round-to-nearest-even, bit-identical to CUDA's host conversions), the runtime `dtype` tag
// with its sizes and names, the `Element` concept, `limits<T>` and `convert<To>(from)`.
#pragma once

#include <weft/core/config.hpp>
#include <weft/core/error.hpp>

#include <cuda/std/bit>
#include <cuda/std/limits>

#include <array>
#include <concepts>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <ostream>
#include <string_view>
#include <type_traits>
#include <utility>

namespace weft {

namespace detail {

WEFT_HD constexpr std::uint32_t float_as_bits(float x) noexcept {
  return cuda::std::bit_cast<std::uint32_t>(x);
}
WEFT_HD constexpr float bits_as_float(std::uint32_t u) noexcept {
  return cuda::std::bit_cast<float>(u);
}

// The conversions below are integer code on the IEEE bit patterns rather than hardware cvt
// instructions so that host, device and constant evaluation give the same bits. They reproduce
// the host branches of CUDA 13's __float2bfloat16 / __float2half / __bfloat162float /
// __half2float, NaN handling included (tests/core/dtype.test.cpp checks every input).

// bf16 is the top half of a float, so rounding adds just under half an ulp plus the lsb (the
// tie-to-even nudge) and truncates. NaN first: adding would carry a small payload into infinity.
WEFT_HD constexpr std::uint16_t bf16_bits_from_float(float x) noexcept {
  std::uint32_t const u = float_as_bits(x);
  if ((u & 0x7fffffffu) > 0x7f800000u) return 0x7fffu;  // every NaN -> CUDA's canonical NaN
  return static_cast<std::uint16_t>((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
}

WEFT_HD constexpr float bf16_bits_to_float(std::uint16_t h) noexcept {
  return bits_as_float(static_cast<std::uint32_t>(h) << 16);  // exact; NaN payloads kept
}

WEFT_HD constexpr std::uint16_t f16_bits_from_float(float x) noexcept {
  std::uint32_t const u0 = float_as_bits(x);
  std::uint32_t const sign = (u0 >> 16) & 0x8000u;
  std::uint32_t u = u0 & 0x7fffffffu;
  if (u > 0x7f800000u) return 0x7fffu;  // NaN of either sign -> canonical NaN, as CUDA's host code
  // 65520 = 65504 + ulp/2 is a tie between the largest half (odd significand) and 2^16: to even,
  // which is infinity. So everything from 65520 up, infinity included, is infinity.
  if (u >= 0x477ff000u) return static_cast<std::uint16_t>(sign | 0x7c00u);
  if (u >=
      0x38800000u) {  // normal half (|x| >= 2^-14): rebias the exponent 127 -> 15, round 13 bits
    u -= 0x38000000u;
    u += 0x0fffu + ((u >> 13) & 1u);  // a carry out of the significand bumps the exponent: right
    return static_cast<std::uint16_t>(sign | (u >> 13));
  }
  // |x| <= 2^-25 is at most half the smallest subnormal; the tie 2^-25 goes to even, i.e. zero.
  if (u <= 0x33000000u) return static_cast<std::uint16_t>(sign);
  // Subnormal half: x = m * 2^(e-150) with the 24-bit significand m, in units of 2^-24 that is
  // m >> (126 - e); the shift is 14..24 here because 2^-25 < |x| < 2^-14.
  std::uint32_t const e = u >> 23;
  std::uint32_t const m = (u & 0x7fffffu) | 0x800000u;
  std::uint32_t const shift = 126u - e;
  std::uint32_t q = m >> shift;
  std::uint32_t const rem = m & ((1u << shift) - 1u);
  std::uint32_t const half = 1u << (shift - 1u);
  if (rem > half || (rem == half && (q & 1u) != 0u)) ++q;  // may carry into the smallest normal
  return static_cast<std::uint16_t>(sign | q);
}

WEFT_HD constexpr float f16_bits_to_float(std::uint16_t h) noexcept {
  std::uint32_t const sign = (static_cast<std::uint32_t>(h) & 0x8000u) << 16;
  std::uint32_t const e = (static_cast<std::uint32_t>(h) >> 10) & 0x1fu;
  std::uint32_t const m = static_cast<std::uint32_t>(h) & 0x3ffu;
  if (e == 0x1fu) {
    // CUDA's host __half2float (and the device cvt.f32.f16) drop sign and payload of a NaN.
    return bits_as_float(m != 0u ? 0x7fffffffu : (sign | 0x7f800000u));
  }
  if (e != 0u) return bits_as_float(sign | ((e + 112u) << 23) | (m << 13));
  if (m == 0u) return bits_as_float(sign);
  // Subnormal half m * 2^-24 is a normal float: with p = bit width of m, it is 1.f * 2^(p-25).
  auto const p = static_cast<std::uint32_t>(cuda::std::bit_width(m));
  return bits_as_float(sign | ((p + 102u) << 23) | ((m << (24u - p)) & 0x7fffffu));
}

// Rounds a double to float with "round to odd": truncate toward zero and set the last bit if
// anything was lost. Rounding that once more to a format at least two bits narrower gives the
// correctly rounded result, where double -> float -> narrow with nearest-even twice would not
// (1 + 2^-8 + 2^-40 would become 1 in bf16 instead of 1 + 2^-7).
WEFT_HD constexpr float round_to_odd_float(double x) noexcept {
  float const f = static_cast<float>(x);
  double const back = static_cast<double>(f);
  if (back == x || x != x) return f;  // exact, infinite, or NaN (which stays NaN)
  std::uint32_t u = float_as_bits(f);
  if ((x > 0.0 && back > x) || (x < 0.0 && back < x)) --u;  // rounded away from zero: step back
  return bits_as_float(u | 1u);
}

// Rounds an integer to `Digits` significant bits, nearest-even, and returns it as a float, which
// is exact (Digits <= 24 and |v| < 2^64) and so converts to the narrow type without a second
// rounding. Going through float (24 bits) or double (53 bits) would round twice for large i64.
template <int Digits, class Int>
WEFT_HD constexpr float integer_rounded_to_digits(Int v) noexcept {
  static_assert(std::is_integral_v<Int> && Digits >= 1 && Digits <= 24,
                "weft: integer_rounded_to_digits needs an integer and 1..24 digits");
  bool negative = false;
  std::uint64_t mag = static_cast<std::uint64_t>(v);
  if constexpr (std::is_signed_v<Int>) {
    negative = v < 0;
    if (negative) mag = std::uint64_t{0} - mag;  // well defined for the minimum too
  }
  int const width = cuda::std::bit_width(mag);
  if (width > Digits) {
    int const shift = width - Digits;
    std::uint64_t q = mag >> shift;
    std::uint64_t const rem = mag & ((std::uint64_t{1} << shift) - 1u);
    std::uint64_t const half = std::uint64_t{1} << (shift - 1);
    if (rem > half || (rem == half && (q & 1u) != 0u)) ++q;
    mag = q << shift;  // no overflow: width 64 means |v| == 2^63, which needs no rounding up
  }
  float const f = static_cast<float>(mag);
  return negative ? -f : f;
}

// Truncation toward zero that saturates at the integer's range and maps NaN to 0: the semantics
// of PTX cvt.rzi and CUDA's __float2int_rz, and defined for every input (a plain static_cast is
// undefined behaviour out of range).
template <class Int, class Float>
WEFT_HD constexpr Int saturating_truncate(Float x) noexcept {
  using int_limits = cuda::std::numeric_limits<Int>;
  if (x != x) return Int{0};
  // Both bounds are powers of two (or 0), so exact in any binary float type.
  constexpr Float lo = static_cast<Float>(int_limits::min());
  constexpr Float hi = static_cast<Float>(int_limits::max() / 2 + 1) * Float{2};
  if (x <= lo) return int_limits::min();
  if (x >= hi) return int_limits::max();
  return static_cast<Int>(x);
}

struct from_bits_tag {};

}  // namespace detail

//! bfloat16 storage: 1 sign, 8 exponent, 7 fraction bits (the top half of a float). Conversions
//! from float and double round to nearest, ties to even, in one step; NaN becomes 0x7FFF. Reading
//! it as float is exact. Arithmetic is done in float and rounded back; comparisons are float's
//! (NaN compares unequal, -0 == +0). Layout-compatible with __nv_bfloat16 (bit_cast between them).
class bf16 {
 public:
  bf16() = default;  // trivial, like float: uninitialised unless value-initialised (bf16{} is +0)
  WEFT_HD constexpr explicit bf16(float x) noexcept : bits_(detail::bf16_bits_from_float(x)) {}
  WEFT_HD constexpr explicit bf16(double x) noexcept
      : bits_(detail::bf16_bits_from_float(detail::round_to_odd_float(x))) {}
  template <std::integral Int>
  WEFT_HD constexpr explicit bf16(Int x) noexcept
      : bits_(detail::bf16_bits_from_float(detail::integer_rounded_to_digits<8>(x))) {}

  [[nodiscard]] WEFT_HD static constexpr bf16 from_bits(std::uint16_t bits) noexcept {
    return bf16(detail::from_bits_tag{}, bits);
  }
  [[nodiscard]] WEFT_HD constexpr std::uint16_t bits() const noexcept { return bits_; }

  // Implicit, like a built-in narrow type: mixed expressions (x * 2.0f) are computed in float.
  WEFT_HD constexpr operator float() const noexcept { return detail::bf16_bits_to_float(bits_); }

  friend WEFT_HD constexpr bf16 operator+(bf16 a) noexcept { return a; }
  friend WEFT_HD constexpr bf16 operator-(bf16 a) noexcept {  // exact, NaN too (as __hneg)
    return from_bits(static_cast<std::uint16_t>(a.bits_ ^ 0x8000u));
  }
  friend WEFT_HD constexpr bf16 operator+(bf16 a, bf16 b) noexcept {
    return bf16(float(a) + float(b));
  }
  friend WEFT_HD constexpr bf16 operator-(bf16 a, bf16 b) noexcept {
    return bf16(float(a) - float(b));
  }
  friend WEFT_HD constexpr bf16 operator*(bf16 a, bf16 b) noexcept {
    return bf16(float(a) * float(b));
  }
  friend WEFT_HD constexpr bf16 operator/(bf16 a, bf16 b) noexcept {
    return bf16(float(a) / float(b));
  }
  WEFT_HD constexpr bf16& operator+=(bf16 b) noexcept { return *this = *this + b; }
  WEFT_HD constexpr bf16& operator-=(bf16 b) noexcept { return *this = *this - b; }
  WEFT_HD constexpr bf16& operator*=(bf16 b) noexcept { return *this = *this * b; }
  WEFT_HD constexpr bf16& operator/=(bf16 b) noexcept { return *this = *this / b; }

  friend WEFT_HD constexpr bool operator==(bf16 a, bf16 b) noexcept { return float(a) == float(b); }
  friend WEFT_HD constexpr bool operator!=(bf16 a, bf16 b) noexcept { return float(a) != float(b); }
  friend WEFT_HD constexpr bool operator<(bf16 a, bf16 b) noexcept { return float(a) < float(b); }
  friend WEFT_HD constexpr bool operator<=(bf16 a, bf16 b) noexcept { return float(a) <= float(b); }
  friend WEFT_HD constexpr bool operator>(bf16 a, bf16 b) noexcept { return float(a) > float(b); }
  friend WEFT_HD constexpr bool operator>=(bf16 a, bf16 b) noexcept { return float(a) >= float(b); }

  friend WEFT_HD constexpr bool isnan(bf16 a) noexcept { return (a.bits_ & 0x7fffu) > 0x7f80u; }
  friend WEFT_HD constexpr bool isinf(bf16 a) noexcept { return (a.bits_ & 0x7fffu) == 0x7f80u; }
  friend WEFT_HD constexpr bool isfinite(bf16 a) noexcept { return (a.bits_ & 0x7f80u) != 0x7f80u; }
  friend WEFT_HD constexpr bool signbit(bf16 a) noexcept { return (a.bits_ & 0x8000u) != 0u; }

 private:
  WEFT_HD constexpr bf16(detail::from_bits_tag, std::uint16_t bits) noexcept : bits_(bits) {}
  std::uint16_t bits_;
};

//! IEEE binary16 storage: 1 sign, 5 exponent, 10 fraction bits. Same contract as bf16: one
//! nearest-even rounding from float, double and integers (|x| >= 65520 gives infinity), NaN
//! becomes 0x7FFF, reading as float is exact except that a NaN reads as the float NaN 0x7FFFFFFF
//! (sign and payload dropped, as CUDA does). Layout-compatible with __half.
class f16 {
 public:
  f16() = default;  // trivial, like float: uninitialised unless value-initialised (f16{} is +0)
  WEFT_HD constexpr explicit f16(float x) noexcept : bits_(detail::f16_bits_from_float(x)) {}
  WEFT_HD constexpr explicit f16(double x) noexcept
      : bits_(detail::f16_bits_from_float(detail::round_to_odd_float(x))) {}
  template <std::integral Int>
  WEFT_HD constexpr explicit f16(Int x) noexcept
      : bits_(detail::f16_bits_from_float(detail::integer_rounded_to_digits<11>(x))) {}

  [[nodiscard]] WEFT_HD static constexpr f16 from_bits(std::uint16_t bits) noexcept {
    return f16(detail::from_bits_tag{}, bits);
  }
  [[nodiscard]] WEFT_HD constexpr std::uint16_t bits() const noexcept { return bits_; }

  WEFT_HD constexpr operator float() const noexcept { return detail::f16_bits_to_float(bits_); }

  friend WEFT_HD constexpr f16 operator+(f16 a) noexcept { return a; }
  friend WEFT_HD constexpr f16 operator-(f16 a) noexcept {
    return from_bits(static_cast<std::uint16_t>(a.bits_ ^ 0x8000u));
  }
  friend WEFT_HD constexpr f16 operator+(f16 a, f16 b) noexcept { return f16(float(a) + float(b)); }
  friend WEFT_HD constexpr f16 operator-(f16 a, f16 b) noexcept { return f16(float(a) - float(b)); }
  friend WEFT_HD constexpr f16 operator*(f16 a, f16 b) noexcept { return f16(float(a) * float(b)); }
  friend WEFT_HD constexpr f16 operator/(f16 a, f16 b) noexcept { return f16(float(a) / float(b)); }
  WEFT_HD constexpr f16& operator+=(f16 b) noexcept { return *this = *this + b; }
  WEFT_HD constexpr f16& operator-=(f16 b) noexcept { return *this = *this - b; }
  WEFT_HD constexpr f16& operator*=(f16 b) noexcept { return *this = *this * b; }
  WEFT_HD constexpr f16& operator/=(f16 b) noexcept { return *this = *this / b; }

  friend WEFT_HD constexpr bool operator==(f16 a, f16 b) noexcept { return float(a) == float(b); }
  friend WEFT_HD constexpr bool operator!=(f16 a, f16 b) noexcept { return float(a) != float(b); }
  friend WEFT_HD constexpr bool operator<(f16 a, f16 b) noexcept { return float(a) < float(b); }
  friend WEFT_HD constexpr bool operator<=(f16 a, f16 b) noexcept { return float(a) <= float(b); }
  friend WEFT_HD constexpr bool operator>(f16 a, f16 b) noexcept { return float(a) > float(b); }
  friend WEFT_HD constexpr bool operator>=(f16 a, f16 b) noexcept { return float(a) >= float(b); }

  friend WEFT_HD constexpr bool isnan(f16 a) noexcept { return (a.bits_ & 0x7fffu) > 0x7c00u; }
  friend WEFT_HD constexpr bool isinf(f16 a) noexcept { return (a.bits_ & 0x7fffu) == 0x7c00u; }
  friend WEFT_HD constexpr bool isfinite(f16 a) noexcept { return (a.bits_ & 0x7c00u) != 0x7c00u; }
  friend WEFT_HD constexpr bool signbit(f16 a) noexcept { return (a.bits_ & 0x8000u) != 0u; }

 private:
  WEFT_HD constexpr f16(detail::from_bits_tag, std::uint16_t bits) noexcept : bits_(bits) {}
  std::uint16_t bits_;
};

// Tensors of these are memcpy'd, sent over NCCL/MPI as raw 16-bit words and bit_cast to CUDA's
// __nv_bfloat16 / __half, so the layout is part of the contract.
static_assert(sizeof(bf16) == 2 && alignof(bf16) == 2 && sizeof(f16) == 2 && alignof(f16) == 2);
static_assert(std::is_trivially_copyable_v<bf16> && std::is_standard_layout_v<bf16>);
static_assert(std::is_trivially_copyable_v<f16> && std::is_standard_layout_v<f16>);
static_assert(std::is_trivially_default_constructible_v<bf16> &&
              std::is_trivially_default_constructible_v<f16>);

inline std::ostream& operator<<(std::ostream& os, bf16 x) { return os << static_cast<float>(x); }
inline std::ostream& operator<<(std::ostream& os, f16 x) { return os << static_cast<float>(x); }

using f32 = float;
using f64 = double;
using i32 = std::int32_t;
using i64 = std::int64_t;
using u8 = std::uint8_t;

namespace detail {
template <class T, class... Ts>
inline constexpr bool is_one_of = (std::is_same_v<T, Ts> || ...);
}  // namespace detail

//! Element: the types a weft tensor can hold — exactly f32, f64, bf16, f16, i32, i64, u8
//! (cv-unqualified; `long long` is not i64 on LP64 and is not an element). Each has a `dtype`
//! tag, a `limits<T>` and every `convert<To, From>` pair.
template <class T>
concept Element = detail::is_one_of<T, f32, f64, bf16, f16, i32, i64, u8>;

//! numeric_limits for every Element: the arithmetic types take cuda::std::numeric_limits (host
//! and device); bf16 and f16 are specialised below. quiet_NaN() is the canonical NaN the
//! conversions produce (CUDART_NAN_BF16 / CUDART_NAN_FP16, 0x7FFF).
template <Element T>
struct limits : cuda::std::numeric_limits<T> {};

template <>
struct limits<bf16> {
  static constexpr bool is_specialized = true;
  static constexpr bool is_signed = true;
  static constexpr bool is_integer = false;
  static constexpr bool is_exact = false;
  static constexpr bool has_infinity = true;
  static constexpr bool has_quiet_NaN = true;
  static constexpr bool has_signaling_NaN = true;
  static constexpr cuda::std::float_denorm_style has_denorm = cuda::std::denorm_present;
  static constexpr bool has_denorm_loss = false;
  static constexpr bool is_iec559 = false;  // not an IEEE 754 interchange format
  static constexpr bool is_bounded = true;
  static constexpr bool is_modulo = false;
  static constexpr bool traps = false;
  static constexpr bool tinyness_before = false;
  static constexpr cuda::std::float_round_style round_style = cuda::std::round_to_nearest;
  static constexpr int radix = 2;
  static constexpr int digits = 8;
  static constexpr int digits10 = 2;
  static constexpr int max_digits10 = 4;
  static constexpr int min_exponent = -125;
  static constexpr int min_exponent10 = -37;
  static constexpr int max_exponent = 128;
  static constexpr int max_exponent10 = 38;
  WEFT_HD static constexpr bf16 min() noexcept { return bf16::from_bits(0x0080u); }  // 2^-126
  WEFT_HD static constexpr bf16 lowest() noexcept { return bf16::from_bits(0xff7fu); }
  WEFT_HD static constexpr bf16 max() noexcept {
    return bf16::from_bits(0x7f7fu);
  }  // (2-2^-7)*2^127
  WEFT_HD static constexpr bf16 epsilon() noexcept { return bf16::from_bits(0x3c00u); }  // 2^-7
  WEFT_HD static constexpr bf16 round_error() noexcept { return bf16::from_bits(0x3f00u); }
  WEFT_HD static constexpr bf16 infinity() noexcept { return bf16::from_bits(0x7f80u); }
  WEFT_HD static constexpr bf16 quiet_NaN() noexcept { return bf16::from_bits(0x7fffu); }
  WEFT_HD static constexpr bf16 signaling_NaN() noexcept { return bf16::from_bits(0x7fa0u); }
  WEFT_HD static constexpr bf16 denorm_min() noexcept {
    return bf16::from_bits(0x0001u);
  }  // 2^-133
};

template <>
struct limits<f16> {
  static constexpr bool is_specialized = true;
  static constexpr bool is_signed = true;
  static constexpr bool is_integer = false;
  static constexpr bool is_exact = false;
  static constexpr bool has_infinity = true;
  static constexpr bool has_quiet_NaN = true;
  static constexpr bool has_signaling_NaN = true;
  static constexpr cuda::std::float_denorm_style has_denorm = cuda::std::denorm_present;
  static constexpr bool has_denorm_loss = false;
  static constexpr bool is_iec559 = true;
  static constexpr bool is_bounded = true;
  static constexpr bool is_modulo = false;
  static constexpr bool traps = false;
  static constexpr bool tinyness_before = false;
  static constexpr cuda::std::float_round_style round_style = cuda::std::round_to_nearest;
  static constexpr int radix = 2;
  static constexpr int digits = 11;
  static constexpr int digits10 = 3;
  static constexpr int max_digits10 = 5;
  static constexpr int min_exponent = -13;
  static constexpr int min_exponent10 = -4;
  static constexpr int max_exponent = 16;
  static constexpr int max_exponent10 = 4;
  WEFT_HD static constexpr f16 min() noexcept { return f16::from_bits(0x0400u); }  // 2^-14
  WEFT_HD static constexpr f16 lowest() noexcept { return f16::from_bits(0xfbffu); }
  WEFT_HD static constexpr f16 max() noexcept { return f16::from_bits(0x7bffu); }      // 65504
  WEFT_HD static constexpr f16 epsilon() noexcept { return f16::from_bits(0x1400u); }  // 2^-10
  WEFT_HD static constexpr f16 round_error() noexcept { return f16::from_bits(0x3800u); }
  WEFT_HD static constexpr f16 infinity() noexcept { return f16::from_bits(0x7c00u); }
  WEFT_HD static constexpr f16 quiet_NaN() noexcept { return f16::from_bits(0x7fffu); }
  WEFT_HD static constexpr f16 signaling_NaN() noexcept { return f16::from_bits(0x7d00u); }
  WEFT_HD static constexpr f16 denorm_min() noexcept { return f16::from_bits(0x0001u); }  // 2^-24
};

}  // namespace weft

//! std::numeric_limits and cuda::std::numeric_limits of bf16 and f16 are weft::limits' (PyTorch's
//! c10 and CUTLASS specialise theirs for the same reason): the primary templates answer T() (0)
//! for infinity(), quiet_NaN() and max() of a class type, silently, in generic code written for
//! float. The std one names its enums in std (the rest is weft::limits').
template <>
class cuda::std::numeric_limits<weft::bf16> : public weft::limits<weft::bf16> {};
template <>
class cuda::std::numeric_limits<weft::f16> : public weft::limits<weft::f16> {};
#if defined(_LIBCPP_VERSION)
#define WEFT_STD_LIMITS_KEY class  // libc++ declares numeric_limits a class, libstdc++ a struct
#else
#define WEFT_STD_LIMITS_KEY struct
#endif
template <>
WEFT_STD_LIMITS_KEY std::numeric_limits<weft::bf16> : public weft::limits<weft::bf16> {
 public:
  static constexpr std::float_denorm_style has_denorm = std::denorm_present;
  static constexpr std::float_round_style round_style = std::round_to_nearest;
};
template <>
WEFT_STD_LIMITS_KEY std::numeric_limits<weft::f16> : public weft::limits<weft::f16> {
 public:
  static constexpr std::float_denorm_style has_denorm = std::denorm_present;
  static constexpr std::float_round_style round_style = std::round_to_nearest;
};
#undef WEFT_STD_LIMITS_KEY

namespace weft {

//! The runtime tag of an element type: what type-erased buffers (communicators, checkpoints,
//! casting kernels) carry instead of a template parameter.
// The enumerators deliberately spell the type aliases' names (dtype::bf16 tags bf16); they are
// scoped, so nothing is hidden, but g++'s -Wshadow reports each one.
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wshadow"
#endif
enum class dtype : std::uint8_t { f32, f64, bf16, f16, i32, i64, u8 };
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic pop
#endif

inline constexpr std::array<dtype, 7> all_dtypes = {dtype::f32, dtype::f64, dtype::bf16, dtype::f16,
                                                    dtype::i32, dtype::i64, dtype::u8};

namespace detail {
constexpr bool is_valid(dtype d) noexcept { return static_cast<std::uint8_t>(d) <= 6u; }

// The location defaults to the caller's, so the error points at size_of/name/dispatch's caller.
[[noreturn]] inline void throw_bad_dtype(dtype d,
                                         source_location where = source_location::current()) {
  fail_expectation<invalid_argument_error>(where, "is a dtype enumerator", "dtype",
                                           "one of f32, f64, bf16, f16, i32, i64, u8",
                                           static_cast<int>(d));
}
}  // namespace detail

//! Calls `f(std::type_identity<T>{})` with the element type tagged by `d`; every instantiation of
//! f must return the same type. Throws invalid_argument_error for a value outside the enum.
template <class F>
constexpr decltype(auto) dispatch(dtype d, F&& f) {
  switch (d) {
    case dtype::f32: return std::forward<F>(f)(std::type_identity<f32>{});
    case dtype::f64: return std::forward<F>(f)(std::type_identity<f64>{});
    case dtype::bf16: return std::forward<F>(f)(std::type_identity<bf16>{});
    case dtype::f16: return std::forward<F>(f)(std::type_identity<f16>{});
    case dtype::i32: return std::forward<F>(f)(std::type_identity<i32>{});
    case dtype::i64: return std::forward<F>(f)(std::type_identity<i64>{});
    case dtype::u8: return std::forward<F>(f)(std::type_identity<u8>{});
  }
  detail::throw_bad_dtype(d);
}

//! Bytes per element. Throws invalid_argument_error for a value outside the enum.
constexpr std::size_t size_of(dtype d) {
  switch (d) {
    case dtype::f32: return 4;
    case dtype::f64: return 8;
    case dtype::bf16: return 2;
    case dtype::f16: return 2;
    case dtype::i32: return 4;
    case dtype::i64: return 8;
    case dtype::u8: return 1;
  }
  detail::throw_bad_dtype(d);
}

//! "f32", "bf16", ... (the type alias names). Throws invalid_argument_error outside the enum.
constexpr std::string_view name(dtype d) {
  switch (d) {
    case dtype::f32: return "f32";
    case dtype::f64: return "f64";
    case dtype::bf16: return "bf16";
    case dtype::f16: return "f16";
    case dtype::i32: return "i32";
    case dtype::i64: return "i64";
    case dtype::u8: return "u8";
  }
  detail::throw_bad_dtype(d);
}

constexpr bool is_floating(dtype d) {
  return d == dtype::f32 || d == dtype::f64 || d == dtype::bf16 || d == dtype::f16;
}

//! Prints the name; a value outside the enum prints as "dtype(<n>)" instead of throwing, because
//! this is what error messages about bad dtypes use.
inline std::ostream& operator<<(std::ostream& os, dtype d) {
  if (!detail::is_valid(d)) return os << "dtype(" << static_cast<int>(d) << ')';
  return os << name(d);
}

namespace detail {
template <class T>
inline constexpr bool dependent_false = false;

template <class T>
constexpr dtype dtype_of_impl() noexcept {
  if constexpr (std::is_same_v<T, f32>)
    return dtype::f32;
  else if constexpr (std::is_same_v<T, f64>)
    return dtype::f64;
  else if constexpr (std::is_same_v<T, bf16>)
    return dtype::bf16;
  else if constexpr (std::is_same_v<T, f16>)
    return dtype::f16;
  else if constexpr (std::is_same_v<T, i32>)
    return dtype::i32;
  else if constexpr (std::is_same_v<T, i64>)
    return dtype::i64;
  else if constexpr (std::is_same_v<T, u8>)
    return dtype::u8;
  else {
    static_assert(dependent_false<T>,
                  "weft::dtype_of<T>: T is not a weft element type (f32, f64, bf16, f16, i32, i64, "
                  "u8; note that `long long` is not i64 and `char`/`int8_t` is not u8)");
    return dtype::f32;
  }
}
}  // namespace detail

//! The dtype of an element type; cv-qualifiers are ignored (a view of const f32 holds f32).
template <class T>
inline constexpr dtype dtype_of = detail::dtype_of_impl<std::remove_cv_t<T>>();

namespace detail {
template <class T>
inline constexpr bool is_half_float = std::is_same_v<T, bf16> || std::is_same_v<T, f16>;
}  // namespace detail

//! Element conversion with one defined meaning on host and device, for casting kernels:
//!  - to bf16/f16: one round to nearest even from any source (no double rounding via float);
//!  - to f32/f64: the C++ conversion (nearest even); bf16/f16 sources read exactly as float;
//!  - floating to integer: truncation toward zero, saturating at the integer's range, NaN -> 0
//!    (PTX cvt.rzi semantics; a plain cast would be undefined out of range);
//!  - integer to integer: the C++ conversion (modulo 2^bits, like torch's .to()).
template <Element To>
struct convert_to {
  template <Element From>
  WEFT_HD constexpr To operator()(From x) const noexcept {
    if constexpr (std::is_same_v<To, From>) {
      return x;
    } else if constexpr (detail::is_half_float<From>) {
      return convert_to<To>{}(static_cast<float>(x));  // exact, so still one rounding
    } else if constexpr (detail::is_half_float<To>) {
      return To(x);  // the float, double and integer constructors each round once
    } else if constexpr (std::is_integral_v<To> && std::is_floating_point_v<From>) {
      return detail::saturating_truncate<To>(x);
    } else {
      return static_cast<To>(x);
    }
  }
};

template <Element To, Element From>
WEFT_HD constexpr To convert(From x) noexcept {
  return convert_to<To>{}(x);
}

}  // namespace weft
