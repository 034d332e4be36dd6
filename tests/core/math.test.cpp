// Tests for weft/core/math.hpp, the one source of element and row math: compute_t and index_t,
// the bit select, exp_fn against long double expl (ulp bounds over dense sweeps; -inf, +inf, NaN,
// overflow and underflow), stable_sigmoid and log_add_exp (including the -inf identities and
// |a - b| = 1e4), and the online-softmax statistics: push, merge and finish against a long double
// two-pass reference, merge commutativity/associativity, the empty identity and NaN poisoning;
// softmax_push_chunk (the GPU log-prob kernels' chunk math) against softmax_push value by value.
#include <weft/core/dtype.hpp>
#include <weft/core/math.hpp>

#include <doctest/doctest.h>

#include <array>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <type_traits>
#include <vector>

namespace {

static_assert(std::is_same_v<weft::index_t, std::int64_t>);
static_assert(std::is_same_v<weft::compute_t<float>, float>);
static_assert(std::is_same_v<weft::compute_t<double>, double>);
static_assert(std::is_same_v<weft::compute_t<double const>, double>);
static_assert(std::is_same_v<weft::compute_t<weft::bf16>, float>);
static_assert(std::is_same_v<weft::compute_t<weft::f16 const>, float>);

constexpr float finf = std::numeric_limits<float>::infinity();
constexpr double dinf = std::numeric_limits<double>::infinity();

// Distance in units in the last place between two finite floats of the same sign (or zero).
std::int64_t ulps(float a, float b) {
  std::int32_t ia = 0, ib = 0;
  std::memcpy(&ia, &a, 4);
  std::memcpy(&ib, &b, 4);
  return std::abs(static_cast<std::int64_t>(ia) - static_cast<std::int64_t>(ib));
}

bool same_bits(double a, double b) { return std::memcmp(&a, &b, sizeof a) == 0; }

template <class C>
bool same_stats(weft::softmax_stats<C> const& a, weft::softmax_stats<C> const& b) {
  return same_bits(static_cast<double>(a.max), static_cast<double>(b.max)) &&
         same_bits(static_cast<double>(a.sum), static_cast<double>(b.sum)) &&
         same_bits(static_cast<double>(a.ent), static_cast<double>(b.ent));
}

// Two-pass long double reference of log-sum-exp and entropy of softmax(x).
struct lse_ref {
  long double lse = 0;
  long double entropy = 0;
};
template <class C>
lse_ref reference(std::vector<C> const& x) {
  long double m = -std::numeric_limits<long double>::infinity();
  for (C v : x) m = static_cast<long double>(v) > m ? static_cast<long double>(v) : m;
  long double s = 0;
  for (C v : x) s += std::exp(static_cast<long double>(v) - m);
  lse_ref r;
  r.lse = m + std::log(s);
  for (C v : x) {
    long double const lp = static_cast<long double>(v) - r.lse;
    r.entropy -= std::exp(lp) * lp;
  }
  return r;
}

}  // namespace

TEST_CASE("select picks by the condition, bit for bit (signed zeros and NaN payloads kept)") {
  CHECK(weft::select(true, 1.5f, 2.5f) == 1.5f);
  CHECK(weft::select(false, 1.5f, 2.5f) == 2.5f);
  CHECK(weft::select(true, 1.5, 2.5) == 1.5);
  CHECK(std::signbit(weft::select(true, -0.0f, 0.0f)));
  CHECK(!std::signbit(weft::select(false, -0.0, 0.0)));
  CHECK(std::isnan(weft::select(true, std::numeric_limits<double>::quiet_NaN(), 1.0)));
  CHECK(weft::select(false, std::int64_t{3}, std::int64_t{-4}) == -4);
}

TEST_CASE("exp_fn (f32) is within 2 ulp of expl over its whole finite range") {
  std::int64_t worst = 0;
  float worst_x = 0;
  // A dense sweep of [-87.3, 88.7], plus every float in [-1, 1] stepped by 2^-12 of an ulp walk.
  for (int i = 0; i <= 2'000'000; ++i) {
    float const x = -87.3f + 176.0f * static_cast<float>(i) / 2'000'000.0f;
    float const want = static_cast<float>(std::exp(static_cast<long double>(x)));
    float const got = weft::exp_fn{}(x);
    if (want < std::numeric_limits<float>::min()) {  // documented: results below 2^-126 flush
      CHECK(got >= 0.0f);
      continue;
    }
    std::int64_t const u = ulps(got, want);
    if (u > worst) {
      worst = u;
      worst_x = x;
    }
  }
  CAPTURE(worst_x);
  CHECK(worst <= 2);
}

TEST_CASE("exp_fn (f32): every float near the overflow and flush thresholds, one by one") {
  // Overflow: +inf exactly where the correctly rounded e^x is +inf, else within 2 ulp.
  for (float x = 88.5f; x <= 89.5f; x = std::nextafter(x, 90.0f)) {
    float const want = static_cast<float>(std::exp(static_cast<long double>(x)));
    float const got = weft::exp_fn{}(x);
    CAPTURE(x);
    if (std::isinf(want)) {
      CHECK(got == finf);
    } else {
      CHECK(std::isfinite(got));
      CHECK(ulps(got, want) <= 2);
    }
  }
  // Flush: +0 below 2^-126, else within 2 ulp (a subnormal result may be off by its rounding).
  for (float x = -87.6f; x <= -86.9f; x = std::nextafter(x, 0.0f)) {
    float const want = static_cast<float>(std::exp(static_cast<long double>(x)));
    float const got = weft::exp_fn{}(x);
    CAPTURE(x);
    if (x < -87.3365448f) {
      CHECK(got == 0.0f);
    } else {
      CHECK(ulps(got, want) <= 2);
    }
  }
}

TEST_CASE("exp_fn (f64) is within 1e-15 relative of expl over its whole finite range") {
  long double worst = 0;
  for (int i = 0; i <= 1'000'000; ++i) {
    double const x = -708.39 + 1418.17 * static_cast<double>(i) / 1'000'000.0;
    long double const want = std::exp(static_cast<long double>(x));
    double const got = weft::exp_fn{}(x);
    if (want < static_cast<long double>(std::numeric_limits<double>::min())) continue;
    long double const rel = std::abs((static_cast<long double>(got) - want) / want);
    worst = rel > worst ? rel : worst;
  }
  CHECK(static_cast<double>(worst) < 1e-15);
}

TEST_CASE("exp_fn: -inf gives +0, +inf and overflow give +inf, NaN stays NaN, 0 gives exactly 1") {
  weft::exp_fn const e;
  CHECK(e(-finf) == 0.0f);
  CHECK(!std::signbit(e(-finf)));
  CHECK(e(finf) == finf);
  CHECK(e(88.73f) == finf);
  CHECK(e(1e30f) == finf);
  CHECK(std::isfinite(e(88.72f)));
  CHECK(e(-1e30f) == 0.0f);
  CHECK(e(std::numeric_limits<float>::lowest()) == 0.0f);
  CHECK(std::isnan(e(std::numeric_limits<float>::quiet_NaN())));
  CHECK(e(0.0f) == 1.0f);
  CHECK(e(-0.0f) == 1.0f);
  CHECK(e(-dinf) == 0.0);
  CHECK(e(dinf) == dinf);
  CHECK(e(709.79) == dinf);
  CHECK(std::isfinite(e(709.78)));
  CHECK(e(-1e300) == 0.0);
  CHECK(std::isnan(e(std::numeric_limits<double>::quiet_NaN())));
  CHECK(e(0.0) == 1.0);
  CHECK(weft::fast_exp(1.0) == doctest::Approx(std::exp(1.0)).epsilon(1e-15));
}

TEST_CASE("stable_sigmoid matches 1/(1+e^-x) and never overflows") {
  for (double x = -40.0; x <= 40.0; x += 0.125) {
    long double const want = 1.0L / (1.0L + std::exp(-static_cast<long double>(x)));
    CHECK(weft::stable_sigmoid(x) == doctest::Approx(static_cast<double>(want)).epsilon(4e-15));
    CHECK(weft::stable_sigmoid(static_cast<float>(x)) ==
          doctest::Approx(static_cast<double>(want)).epsilon(4e-7));
  }
  CHECK(weft::stable_sigmoid(0.0) == 0.5);
  CHECK(weft::stable_sigmoid(1e4) == 1.0);
  CHECK(weft::stable_sigmoid(-1e4) == 0.0);
  CHECK(weft::stable_sigmoid(1e4f) == 1.0f);
  CHECK(weft::stable_sigmoid(-1e4f) == 0.0f);
  CHECK(weft::stable_sigmoid(-dinf) == 0.0);
  CHECK(weft::stable_sigmoid(dinf) == 1.0);
}

TEST_CASE("log_add_exp: accurate, commutative, -inf is the identity, huge gaps are harmless") {
  std::mt19937_64 gen(7);
  std::uniform_real_distribution<double> u(-50.0, 50.0);
  for (int i = 0; i < 2000; ++i) {
    double const a = u(gen), b = u(gen);
    long double const hi = a > b ? a : b;
    long double const want = hi + std::log(std::exp(static_cast<long double>(a) - hi) +
                                           std::exp(static_cast<long double>(b) - hi));
    CHECK(weft::log_add_exp(a, b) == doctest::Approx(static_cast<double>(want)).epsilon(2e-15));
    CHECK(same_bits(weft::log_add_exp(a, b), weft::log_add_exp(b, a)));
    auto const af = static_cast<float>(a), bf = static_cast<float>(b);
    CHECK(weft::log_add_exp(af, bf) == doctest::Approx(static_cast<double>(want)).epsilon(1e-6));
  }
  CHECK(weft::log_add_exp(-dinf, 3.0) == 3.0);
  CHECK(weft::log_add_exp(3.0, -dinf) == 3.0);
  CHECK(weft::log_add_exp(-dinf, -dinf) == -dinf);  // not -inf - -inf = NaN
  CHECK(weft::log_add_exp(-finf, -finf) == -finf);
  CHECK(weft::log_add_exp(0.0, -1e4) == 0.0);
  CHECK(weft::log_add_exp(1e4f, -1e4f) == 1e4f);
  CHECK(weft::log_add_exp(1e4, 1e4) == doctest::Approx(1e4 + std::log(2.0)).epsilon(1e-15));
  // Associative up to rounding: three ways of adding the same four terms agree closely.
  double const a = 1.0, b = -2.5, c = 0.25, d = -30.0;
  double const left = weft::log_add_exp(weft::log_add_exp(weft::log_add_exp(a, b), c), d);
  double const right = weft::log_add_exp(a, weft::log_add_exp(b, weft::log_add_exp(c, d)));
  double const pairs = weft::log_add_exp(weft::log_add_exp(a, b), weft::log_add_exp(c, d));
  CHECK(left == doctest::Approx(right).epsilon(1e-15));
  CHECK(left == doctest::Approx(pairs).epsilon(1e-15));
}

TEST_CASE("softmax_rescale: e^(m_old - m_new), 0 from an empty state, 1 while both are empty") {
  CHECK(weft::softmax_rescale(-dinf, -dinf) == 1.0);
  CHECK(weft::softmax_rescale(-dinf, 2.0) == 0.0);
  CHECK(weft::softmax_rescale(2.0, 2.0) == 1.0);
  CHECK(weft::softmax_rescale(1.0, 2.0) == doctest::Approx(std::exp(-1.0)).epsilon(1e-15));
  CHECK(weft::softmax_rescale(-finf, 0.0f) == 0.0f);
}

TEST_CASE("online softmax statistics: push, merge and finish against a long double reference") {
  std::mt19937_64 gen(11);
  std::normal_distribution<double> nd(0.0, 4.0);
  for (int n : {1, 2, 7, 100, 1000}) {
    CAPTURE(n);
    std::vector<double> x(static_cast<std::size_t>(n));
    for (auto& v : x) v = nd(gen);
    x[0] = -dinf;  // a masked value adds nothing (n = 1: the empty set)
    weft::softmax_stats<double> whole;
    weft::softmax_stats<double> part[3];
    for (std::size_t k = 0; k < x.size(); ++k) {
      whole = weft::softmax_push{}(whole, x[k]);
      part[k % 3] = weft::softmax_push{}(part[k % 3], x[k]);
    }
    weft::softmax_merge const merge;
    auto const left = merge(merge(part[0], part[1]), part[2]);
    auto const right = merge(part[0], merge(part[1], part[2]));
    weft::softmax_finish const fin;
    if (n == 1) {
      CHECK(fin.lse(whole) == -dinf);
      CHECK(fin.entropy(whole) == 0.0);
      CHECK(fin.lse(left) == -dinf);
      continue;
    }
    auto const ref = reference(std::vector<double>(x.begin() + 1, x.end()));
    for (auto const& s : {whole, left, right}) {
      CHECK(fin.lse(s) == doctest::Approx(static_cast<double>(ref.lse)).epsilon(1e-13));
      CHECK(fin.entropy(s) == doctest::Approx(static_cast<double>(ref.entropy)).epsilon(1e-12));
    }
    // Commutative bit for bit; associative up to rounding.
    CHECK(same_stats(merge(part[0], part[1]), merge(part[1], part[0])));
    CHECK(left.max == right.max);
    CHECK(left.sum == doctest::Approx(right.sum).epsilon(1e-14));
  }
}

TEST_CASE("online softmax statistics: the empty state is the identity and NaN/+inf poison") {
  weft::softmax_merge const merge;
  weft::softmax_push const push;
  weft::softmax_finish const fin;
  weft::softmax_stats<float> s;
  s = push(s, 1.0f);
  s = push(s, -2.0f);
  s = push(s, 3.5f);
  weft::softmax_stats<float> const empty;
  weft::softmax_stats<float> const masked = push(empty, -finf);  // all -inf: still empty
  CHECK(masked.sum == 0.0f);
  CHECK(masked.max == -finf);
  CHECK(same_stats(merge(empty, s), s));
  CHECK(same_stats(merge(s, empty), s));
  CHECK(same_stats(merge(masked, s), s));
  CHECK(same_stats(merge(empty, empty), empty));
  CHECK(fin.lse(empty) == -finf);
  CHECK(fin.entropy(empty) == 0.0f);
  // One value: lse = the value, entropy 0.
  auto const one = push(empty, 2.0f);
  CHECK(fin.lse(one) == 2.0f);
  CHECK(fin.entropy(one) == 0.0f);
  // Poisoned by NaN or +inf, and every merge or push afterwards stays poisoned.
  for (float bad : {std::numeric_limits<float>::quiet_NaN(), finf}) {
    auto const p = push(s, bad);
    CHECK(std::isnan(fin.lse(p)));
    CHECK(std::isnan(fin.entropy(p)));
    CHECK(std::isnan(fin.lse(merge(s, p))));
    CHECK(std::isnan(fin.lse(merge(p, s))));
    CHECK(std::isnan(fin.lse(merge(p, empty))));
    CHECK(std::isnan(fin.lse(push(p, 1.0f))));
  }
  // |x| = 1e4 apart: no overflow, the small term vanishes.
  auto const wide = push(push(empty, 1e4f), -1e4f);
  CHECK(fin.lse(wide) == 1e4f);
}

namespace {
template <class C>
struct exp2_units {
  C operator()(C d) const { return std::exp2(d); }
};

//! softmax_push_chunk over raw values with 1/τ = inv_tau, in base 2 (the GPU kernels' units: unit =
//! inv_tau · log2 e, back = ln 2) and in base e (unit = inv_tau, back = 1, exp_fn), against
//! softmax_push of each value raw · inv_tau in turn.
template <class C, int K>
void check_chunk(weft::softmax_stats<C> start, std::array<C, K> const& raw, C inv_tau, double tol) {
  C const log2e = C(1.44269504088896341), ln2 = C(0.69314718055994531);
  C r[K];
  for (int j = 0; j < K; ++j) r[j] = raw[static_cast<std::size_t>(j)];
  weft::softmax_stats<C> ref = start;
  for (C x : raw) ref = weft::softmax_push{}(ref, x * inv_tau);
  auto const b2 = weft::softmax_push_chunk(start, r, inv_tau * log2e, ln2, exp2_units<C>{});
  auto const be = weft::softmax_push_chunk(start, r, inv_tau, C(1), weft::exp_fn{});
  weft::softmax_finish const fin;
  for (auto const& got : {b2, be}) {
    if (std::isnan(ref.sum)) {
      CHECK(std::isnan(got.sum));
      CHECK(std::isnan(fin.lse(got)));
      continue;
    }
    if (!(ref.sum > C(0))) {  // nothing added to an empty state: still empty
      CHECK(got.sum == C(0));
      CHECK(fin.lse(got) == -std::numeric_limits<C>::infinity());
      continue;
    }
    CHECK(fin.lse(got) == doctest::Approx(double(fin.lse(ref))).epsilon(tol));
    CHECK(fin.entropy(got) == doctest::Approx(double(fin.entropy(ref))).epsilon(tol).scale(1.0));
    CHECK(got.max == doctest::Approx(double(ref.max)).epsilon(tol));
  }
}
}  // namespace

TEST_CASE(
    "softmax_push_chunk (the GPU log-prob kernels' chunk math) equals softmax_push value by "
    "value") {
  constexpr double nan = std::numeric_limits<double>::quiet_NaN();
  std::mt19937_64 gen(23);
  std::normal_distribution<double> nd(0.0, 6.0);
  weft::softmax_stats<double> const empty;
  weft::softmax_stats<double> warm;
  for (double x : {1.5, -3.0, 9.0}) warm = weft::softmax_push{}(warm, x);
  for (double inv_tau : {1.0, 1.0 / 0.7, 1.0 / 1.3}) {
    CAPTURE(inv_tau);
    for (int trial = 0; trial < 20; ++trial) {
      std::array<double, 32> raw{};
      for (auto& v : raw) v = nd(gen);
      if (trial % 3 == 1) raw[static_cast<std::size_t>(trial) % 32] = -dinf;  // masked logits
      if (trial % 3 == 2)
        for (std::size_t j = 0; j < 32; j += 2) raw[j] = -dinf;
      check_chunk<double, 32>(empty, raw, inv_tau, 1e-12);
      check_chunk<double, 32>(warm, raw, inv_tau, 1e-12);
      std::array<float, 8> rf{};
      for (std::size_t j = 0; j < 8; ++j) rf[j] = static_cast<float>(raw[j]);
      check_chunk<float, 8>(weft::softmax_stats<float>{}, rf, static_cast<float>(inv_tau), 2e-5);
    }
  }
  // Every value -inf: the state is returned as it was (empty stays empty, warm stays warm).
  std::array<double, 8> masked{};
  masked.fill(-dinf);
  double r[8];
  for (int j = 0; j < 8; ++j) r[j] = masked[static_cast<std::size_t>(j)];
  auto const still = weft::softmax_push_chunk(warm, r, 1.0, 1.0, weft::exp_fn{});
  CHECK(same_stats(still, warm));
  check_chunk<double, 8>(empty, masked, 1.0, 1e-12);
  // NaN or +inf anywhere poisons (first, middle, last; with -inf beside it), as does a maximum
  // that overflows once scaled (softmax_push of raw · inv_tau = +inf); a poisoned state stays so.
  for (double bad : {nan, dinf})
    for (std::size_t at : {0u, 3u, 7u}) {
      std::array<double, 8> v{1.0, -2.0, -dinf, 4.0, 0.5, -dinf, 2.0, 3.0};
      v[at] = bad;
      check_chunk<double, 8>(warm, v, 1.0, 1e-12);
      for (int j = 0; j < 8; ++j) r[j] = v[static_cast<std::size_t>(j)];
      CHECK(std::isnan(weft::softmax_push_chunk(warm, r, 1.0, 1.0, weft::exp_fn{}).sum));
    }
  std::array<float, 8> big{1e38f, 1.0f, -2.0f, 0.0f, 3.0f, -finf, 5.0f, 6.0f};
  check_chunk<float, 8>(weft::softmax_stats<float>{}, big, 100.0f, 2e-5);
  float rb[8];
  for (int j = 0; j < 8; ++j) rb[j] = big[static_cast<std::size_t>(j)];
  CHECK(std::isnan(
      weft::softmax_push_chunk(weft::softmax_stats<float>{}, rb, 100.0f, 1.0f, weft::exp_fn{})
          .sum));
  weft::softmax_stats<double> poisoned{nan, nan, nan};
  std::array<double, 8> fine{1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0, 8.0};
  for (int j = 0; j < 8; ++j) r[j] = fine[static_cast<std::size_t>(j)];
  CHECK(std::isnan(weft::softmax_push_chunk(poisoned, r, 1.0, 1.0, weft::exp_fn{}).sum));
  // max_nan propagates NaN from either side, unlike fmax.
  CHECK(std::isnan(weft::max_nan(nan, 1.0)));
  CHECK(std::isnan(weft::max_nan(1.0, nan)));
  CHECK(weft::max_nan(-dinf, -2.0) == -2.0);
  CHECK(weft::max_nan(3.0f, -1.0f) == 3.0f);
}
