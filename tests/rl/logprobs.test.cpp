// Tests of weft/rl/exp.hpp and weft/rl/logprobs.hpp: the polynomial exp against libm, fused
// streaming log-probs and entropy against a naive two-pass softmax, dlogits against central
// finite differences in f64, temperature, ignored targets, -inf and +-1e4 logits, bf16 logits;
// under nvcc (label gpu) the CUDA kernels of weft/rl/cuda/logprobs.cuh against the CPU path
// (log-probs, entropy and dlogits from f32, bf16 and f64 logits, with the extreme rows; -inf
// logits with large d_entropy).
#include <weft/rl/exp.hpp>
#include <weft/rl/logprobs.hpp>

#include <doctest/doctest.h>

#include <cmath>
#include <cstdint>
#include <limits>
#include <random>
#include <vector>

namespace {
using weft::index_t;
using weft::rl::logprob_options;

struct ref_out {
  std::vector<double> logp, entropy;
};

// Naive two-pass softmax in long double.
template <class L>
ref_out reference(std::vector<L> const& z, index_t V, std::vector<std::int64_t> const& tgt,
                  double tau) {
  ref_out r;
  for (std::size_t k = 0; k < tgt.size(); ++k) {
    if (tgt[k] < 0) {
      r.logp.push_back(0);
      r.entropy.push_back(0);
      continue;
    }
    long double mx = -INFINITY;
    for (index_t v = 0; v < V; ++v) mx = std::max(mx, (long double)(double)z[k * V + v] / tau);
    long double s = 0;
    for (index_t v = 0; v < V; ++v) s += std::exp((long double)(double)z[k * V + v] / tau - mx);
    long double const lse = mx + std::log(s);
    long double h = 0;
    for (index_t v = 0; v < V; ++v) {
      long double const x = (long double)(double)z[k * V + v] / tau;
      if (std::isinf(x)) continue;
      long double const p = std::exp(x - lse);
      h -= p * (x - lse);
    }
    r.logp.push_back(double((long double)(double)z[k * V + tgt[k]] / tau - lse));
    r.entropy.push_back(double(h));
  }
  return r;
}

template <class L>
std::vector<L> random_logits(std::uint64_t seed, std::size_t n, double scale) {
  std::mt19937_64 gen(seed);
  std::normal_distribution<double> nd(0, scale);
  std::vector<L> z(n);
  for (auto& x : z) x = static_cast<L>(nd(gen));
  return z;
}
}  // namespace

TEST_CASE("weft's polynomial exp matches libm and keeps the IEEE specials") {
  float max_rel_f = 0;
  for (float x = -87.0f; x < 88.5f; x += 0.01234f) {
    float const a = weft::fast_exp(x);
    float const b = std::exp(x);
    max_rel_f = std::max(max_rel_f, std::abs(a - b) / b);
  }
  CHECK(max_rel_f < 3e-7f);
  double max_rel_d = 0;
  for (double x = -700.0; x < 709.0; x += 0.0731) {
    double const a = weft::fast_exp(x);
    double const b = std::exp(x);
    max_rel_d = std::max(max_rel_d, std::abs(a - b) / b);
  }
  CHECK(max_rel_d < 2e-15);
  float const finf = std::numeric_limits<float>::infinity();
  CHECK(weft::fast_exp(-finf) == 0.0f);
  CHECK(weft::fast_exp(finf) == finf);
  CHECK(weft::fast_exp(100.0f) == finf);
  CHECK(weft::fast_exp(-100.0f) == 0.0f);
  CHECK(std::isnan(weft::fast_exp(std::numeric_limits<float>::quiet_NaN())));
  CHECK(weft::fast_exp(0.0f) == 1.0f);
  CHECK(weft::fast_exp(-std::numeric_limits<double>::infinity()) == 0.0);
  CHECK(weft::fast_exp(710.0) == std::numeric_limits<double>::infinity());
  CHECK(weft::fast_exp(709.7) == doctest::Approx(std::exp(709.7)).epsilon(1e-14));
  CHECK(weft::fast_exp(88.7f) == doctest::Approx(std::exp(88.7f)).epsilon(1e-6));
}

TEST_CASE("log-probs and entropy equal a naive two-pass softmax (f64 and f32, temperature)") {
  index_t const V = 5003;  // several chunks plus a ragged tail
  std::vector<std::int64_t> tgt = {0, 17, 5002, -100, 2500};
  for (double tau : {1.0, 0.7}) {
    CAPTURE(tau);
    auto const zd = random_logits<double>(1, tgt.size() * V, 3.0);
    auto const ref = reference(zd, V, tgt, tau);
    std::vector<double> lp(tgt.size()), h(tgt.size()), lse(tgt.size());
    weft::rl::log_prob_forward(std::span<double const>(zd), V, std::span<std::int64_t const>(tgt),
                               {tau, -100}, std::span<double>(lp), std::span<double>(h),
                               std::span<double>(lse));
    for (std::size_t k = 0; k < tgt.size(); ++k) {
      CHECK(lp[k] == doctest::Approx(ref.logp[k]).epsilon(1e-13));
      CHECK(h[k] == doctest::Approx(ref.entropy[k]).epsilon(1e-13));
    }
    CHECK(lp[3] == 0.0);
    CHECK(h[3] == 0.0);
    auto const zf = random_logits<float>(2, tgt.size() * V, 3.0);
    auto const reff = reference(zf, V, tgt, tau);
    std::vector<float> lpf(tgt.size()), hf(tgt.size());
    weft::rl::log_prob_forward(std::span<float const>(zf), V, std::span<std::int64_t const>(tgt),
                               {tau, -100}, std::span<float>(lpf), std::span<float>(hf));
    for (std::size_t k = 0; k < tgt.size(); ++k) {
      CHECK(lpf[k] == doctest::Approx(reff.logp[k]).epsilon(2e-6));
      CHECK(hf[k] == doctest::Approx(reff.entropy[k]).epsilon(2e-6));
    }
  }
}

TEST_CASE("dlogits match central finite differences in f64 (log-prob and entropy upstreams)") {
  index_t const V = 37;
  std::vector<std::int64_t> const tgt = {3, 36, -100, 0};
  auto z = random_logits<double>(3, tgt.size() * V, 2.0);
  z[5] = -std::numeric_limits<double>::infinity();  // a masked vocabulary entry in row 0
  std::vector<double> const a = {0.7, -1.3, 0.5, 0.2}, b = {-0.4, 0.9, 0.3, 0.0};
  double const tau = 0.8;
  logprob_options const opt{tau, -100};
  auto objective = [&](std::vector<double> const& zz) {
    std::vector<double> lp(tgt.size()), h(tgt.size());
    weft::rl::log_prob_forward(std::span<double const>(zz), V, std::span<std::int64_t const>(tgt),
                               opt, std::span<double>(lp), std::span<double>(h));
    double f = 0;
    for (std::size_t k = 0; k < tgt.size(); ++k) f += a[k] * lp[k] + b[k] * h[k];
    return f;
  };
  std::vector<double> lp(tgt.size()), h(tgt.size()), lse(tgt.size()), dz(z.size());
  weft::rl::log_prob_forward(std::span<double const>(z), V, std::span<std::int64_t const>(tgt), opt,
                             std::span<double>(lp), std::span<double>(h), std::span<double>(lse));
  weft::rl::log_prob_backward(std::span<double const>(z), V, std::span<std::int64_t const>(tgt),
                              opt, std::span<double const>(lse), std::span<double const>(h),
                              std::span<double const>(a), std::span<double const>(b),
                              std::span<double>(dz));
  // Five-point central differences: truncation O(h^4) and rounding 1e-16/h both near 1e-12.
  double const eps = 1e-3;
  for (std::size_t j = 0; j < z.size(); ++j) {
    if (std::isinf(z[j])) {
      CHECK(dz[j] == 0.0);
      continue;
    }
    auto at = [&](double delta) {
      auto zz = z;
      zz[j] += delta;
      return objective(zz);
    };
    double const fd = (-at(2 * eps) + 8 * at(eps) - 8 * at(-eps) + at(-2 * eps)) / (12 * eps);
    INFO("logit ", j);
    CHECK(std::abs(fd - dz[j]) <= 1e-6 * std::max(std::abs(dz[j]), 1e-3));
  }
  for (index_t v = 0; v < V; ++v) CHECK(dz[2 * V + v] == 0.0);  // ignored token
  // Row sums of dlogits are zero for the log-prob part and the entropy part alike.
  for (std::size_t k = 0; k < tgt.size(); ++k) {
    double s = 0;
    for (index_t v = 0; v < V; ++v) s += dz[k * V + v];
    CHECK(s == doctest::Approx(0.0).scale(1.0).epsilon(1e-12));
  }

  SUBCASE("fused forward+backward gives the same bits as forward then backward") {
    std::vector<double> lp2(tgt.size()), h2(tgt.size()), dz2(z.size());
    weft::rl::log_prob_fused(
        std::span<double const>(z), V, std::span<std::int64_t const>(tgt), opt,
        std::span<double>(lp2), std::span<double>(h2),
        [&](index_t k, double, double) {
          return weft::rl::logprob_grads{a[static_cast<std::size_t>(k)],
                                         b[static_cast<std::size_t>(k)]};
        },
        std::span<double>(dz2));
    CHECK(lp2 == lp);
    CHECK(h2 == h);
    CHECK(dz2 == dz);
  }
}

TEST_CASE("numerically safe at extremes: +-1e4 logits, -inf logits, all -inf rows") {
  index_t const V = 300;
  std::vector<float> z(3 * V, 0.0f);
  for (index_t v = 0; v < V; ++v) {
    z[v] = (v % 2 ? 1e4f : -1e4f);
    z[V + v] = v == 7 ? 0.0f : -std::numeric_limits<float>::infinity();
    z[2 * V + v] = -std::numeric_limits<float>::infinity();
  }
  std::vector<std::int64_t> const tgt = {1, 7, 3};
  std::vector<float> lp(3), h(3), lse(3), dz(z.size());
  logprob_options const opt;
  weft::rl::log_prob_forward(std::span<float const>(z), V, std::span<std::int64_t const>(tgt), opt,
                             std::span<float>(lp), std::span<float>(h), std::span<float>(lse));
  CHECK(lp[0] == doctest::Approx(-std::log(150.0)).epsilon(1e-6));
  CHECK(h[0] == doctest::Approx(std::log(150.0)).epsilon(1e-6));
  CHECK(lp[1] == 0.0f);  // the only finite logit has probability 1
  CHECK(h[1] == 0.0f);
  CHECK(h[2] == 0.0f);  // empty distribution: entropy 0, log-prob -inf, zero gradient
  CHECK(std::isinf(lp[2]));
  std::vector<float> const g = {1.0f, 1.0f, 1.0f};
  weft::rl::log_prob_backward(std::span<float const>(z), V, std::span<std::int64_t const>(tgt), opt,
                              std::span<float const>(lse), std::span<float const>(h),
                              std::span<float const>(g), std::span<float const>(g),
                              std::span<float>(dz));
  for (float x : dz) CHECK(std::isfinite(x));
  CHECK(dz[0] == 0.0f);
  CHECK(dz[1] ==
        doctest::Approx(1.0 - 1.0 / 150 - (1.0 / 150) * (std::log(1.0 / 150) + std::log(150.0)))
            .epsilon(1e-5));
  for (index_t v = 0; v < V; ++v) CHECK(dz[V + v] == 0.0f);
  for (index_t v = 0; v < V; ++v) CHECK(dz[2 * V + v] == 0.0f);
}

TEST_CASE(
    "bf16 logits: the same answers as the f32 logits they read as, bf16 dlogits rounded once") {
  index_t const V = 4099;
  auto const zf0 = random_logits<float>(9, 3 * V, 2.0);
  std::vector<weft::bf16> zb(zf0.size());
  std::vector<float> zf(zf0.size());
  for (std::size_t i = 0; i < zf0.size(); ++i) {
    zb[i] = weft::bf16(zf0[i]);
    zf[i] = static_cast<float>(zb[i]);
  }
  std::vector<std::int64_t> const tgt = {4, 4098, 100};
  std::vector<float> lp1(3), h1(3), l1(3), lp2(3), h2(3), l2(3);
  weft::rl::log_prob_forward(std::span<weft::bf16 const>(zb), V, std::span<std::int64_t const>(tgt),
                             {}, std::span<float>(lp1), std::span<float>(h1), std::span<float>(l1));
  weft::rl::log_prob_forward(std::span<float const>(zf), V, std::span<std::int64_t const>(tgt), {},
                             std::span<float>(lp2), std::span<float>(h2), std::span<float>(l2));
  CHECK(lp1 == lp2);
  CHECK(h1 == h2);
  std::vector<float> const g = {0.5f, -1.0f, 2.0f}, ge = {0.1f, 0.2f, -0.3f};
  std::vector<weft::bf16> db(zb.size());
  std::vector<float> df(zf.size());
  weft::rl::log_prob_backward(std::span<weft::bf16 const>(zb), V,
                              std::span<std::int64_t const>(tgt), {}, std::span<float const>(l1),
                              std::span<float const>(h1), std::span<float const>(g),
                              std::span<float const>(ge), std::span<weft::bf16>(db));
  weft::rl::log_prob_backward(std::span<float const>(zf), V, std::span<std::int64_t const>(tgt), {},
                              std::span<float const>(l2), std::span<float const>(h2),
                              std::span<float const>(g), std::span<float const>(ge),
                              std::span<float>(df));
  for (std::size_t i = 0; i < df.size(); ++i) CHECK(db[i].bits() == weft::bf16(df[i]).bits());
}

TEST_CASE("bad arguments throw before anything is written") {
  std::vector<float> z(10, 0.0f), lp(2, 7.0f), h(2, 7.0f);
  std::vector<std::int64_t> bad = {1, 5};
  CHECK_THROWS_AS(
      weft::rl::log_prob_forward(std::span<float const>(z), 5, std::span<std::int64_t const>(bad),
                                 {}, std::span<float>(lp), std::span<float>(h)),
      weft::invalid_argument_error);
  CHECK(lp[0] == 7.0f);
  std::vector<std::int64_t> ok = {1, 2, 3};
  CHECK_THROWS_AS(
      weft::rl::log_prob_forward(std::span<float const>(z), 5, std::span<std::int64_t const>(ok),
                                 {}, std::span<float>(lp), std::span<float>(h)),
      weft::shape_error);
  std::vector<std::int64_t> two = {1, 2};
  CHECK_THROWS_AS(
      weft::rl::log_prob_forward(std::span<float const>(z), 5, std::span<std::int64_t const>(two),
                                 {0.0, -100}, std::span<float>(lp), std::span<float>(h)),
      weft::invalid_argument_error);
}

TEST_CASE(
    "the per-thread functors of the CUDA kernels (softmax_push, softmax_merge) agree with the CPU "
    "row reduction") {
  index_t const V = 3001;
  auto z = random_logits<float>(21, static_cast<std::size_t>(V), 4.0);
  z[0] = -std::numeric_limits<float>::infinity();
  z[1500] = -std::numeric_limits<float>::infinity();
  float const inv_tau = 1.0f / 1.3f;
  auto const cpu = weft::rl::detail::row_stats(z.data(), V, inv_tau);
  // Three "threads" with strided columns, each pushing one logit at a time, then merged.
  weft::softmax_stats<float> part[3];
  for (index_t v = 0; v < V; ++v)
    part[v % 3] = weft::softmax_push{}(part[v % 3], z[static_cast<std::size_t>(v)] * inv_tau);
  auto const merged = weft::softmax_merge{}(weft::softmax_merge{}(part[0], part[1]), part[2]);
  weft::softmax_finish const fin;
  CHECK(fin.lse(merged) == doctest::Approx(fin.lse(cpu)).epsilon(1e-6));
  CHECK(fin.entropy(merged) == doctest::Approx(fin.entropy(cpu)).epsilon(1e-5));
  // Empty and all -inf states are identities of the merge.
  weft::softmax_stats<float> empty;
  empty = weft::softmax_push{}(empty, -std::numeric_limits<float>::infinity());
  auto const same = weft::softmax_merge{}(empty, merged);
  CHECK(same.sum == merged.sum);
  CHECK(fin.entropy(empty) == 0.0f);
  CHECK(std::isinf(fin.lse(empty)));
}

#if defined(__CUDACC__) && WEFT_HAS_CUDA_RUNTIME
#include <weft/rl/cuda/logprobs.cuh>

#include <cuda_runtime_api.h>

#include <algorithm>
#include <type_traits>

namespace {
template <class T>
T* to_device(std::vector<T> const& v) {
  T* p = nullptr;
  WEFT_CUDA_TRY(cudaMalloc(reinterpret_cast<void**>(&p), v.size() * sizeof(T)));
  WEFT_CUDA_TRY(cudaMemcpy(p, v.data(), v.size() * sizeof(T), cudaMemcpyHostToDevice));
  return p;
}
template <class T>
std::vector<T> to_host(T const* p, std::size_t n) {
  std::vector<T> v(n);
  WEFT_CUDA_TRY(cudaMemcpy(v.data(), p, n * sizeof(T), cudaMemcpyDeviceToHost));
  return v;
}

// Issue 9.1 on the kernel: once |dL/dH| > 1 the clamp of log p at a -inf logit overflowed in the
// product with dL/dH (0 * inf = NaN dlogits). Rows with -inf logits, d_entropy of 5, -3 and 1e30:
// the kernel's dlogits are exactly 0 at every -inf logit, finite elsewhere and equal to the CPU
// path's (both backward passes take the CPU forward's lse and entropy).
template <class L>
void check_kernel_neg_inf_gradient() {
  index_t const V = 1031;
  std::vector<std::int64_t> const tgt = {3, 500, 1030};
  std::size_t const n = tgt.size();
  auto z = random_logits<L>(11, n * static_cast<std::size_t>(V), 2.0);
  L const ninf = -std::numeric_limits<L>::infinity();
  auto const row = static_cast<std::size_t>(V);
  for (std::size_t i : {std::size_t{7}, row, 2 * row + 40, 2 * row + 1029})
    z[i] = ninf;  // a -inf logit in every row (two in the last), none on a target
  logprob_options const opt{0.7, -100};
  std::vector<L> lp(n), h(n), lse(n);
  weft::rl::log_prob_forward(std::span<L const>(z), V, std::span<std::int64_t const>(tgt), opt,
                             std::span<L>(lp), std::span<L>(h), std::span<L>(lse));
  L* dzl = to_device(z);
  std::int64_t* dt = to_device(tgt);
  L* dlse = to_device(lse);
  L* dh = to_device(h);
  for (double gh : {5.0, -3.0, 1e30}) {
    CAPTURE(gh);
    std::vector<L> const g(n, L(2)), ge(n, static_cast<L>(gh));
    std::vector<L> dz(z.size(), L(7));
    weft::rl::log_prob_backward(std::span<L const>(z), V, std::span<std::int64_t const>(tgt), opt,
                                std::span<L const>(lse), std::span<L const>(h),
                                std::span<L const>(g), std::span<L const>(ge), std::span<L>(dz));
    L* dg = to_device(g);
    L* dge = to_device(ge);
    L* ddz = to_device(std::vector<L>(z.size(), L(7)));
    weft::rl::kernels::log_prob_backward(nullptr, dzl, V, dt, static_cast<std::int64_t>(n), opt,
                                         dlse, dh, dg, dge, ddz);
    WEFT_CUDA_TRY(cudaDeviceSynchronize());
    auto const gdz = to_host(ddz, z.size());
    L const rel = sizeof(L) == 4 ? L(1e-5) : L(1e-10);
    for (std::size_t k = 0; k < n; ++k) {
      L row_max = 0;
      for (index_t v = 0; v < V; ++v) row_max = std::max(row_max, std::abs(dz[k * V + v]));
      for (index_t v = 0; v < V; ++v) {
        std::size_t const i = k * V + v;
        if (std::isinf(z[i])) {
          CAPTURE(i);
          CHECK(dz[i] == L(0));
          CHECK(gdz[i] == L(0));
        } else if (!std::isfinite(gdz[i]) || !(std::abs(gdz[i] - dz[i]) <= rel * row_max)) {
          CAPTURE(i);
          CAPTURE(gdz[i]);
          CAPTURE(dz[i]);
          CHECK(std::isfinite(gdz[i]));
          CHECK(std::abs(gdz[i] - dz[i]) <= rel * row_max);
        }
      }
    }
    for (void* p : {static_cast<void*>(dg), static_cast<void*>(dge), static_cast<void*>(ddz)})
      WEFT_CUDA_TRY(cudaFree(p));
  }
  for (void* p : {static_cast<void*>(dzl), static_cast<void*>(dt), static_cast<void*>(dlse),
                  static_cast<void*>(dh)})
    WEFT_CUDA_TRY(cudaFree(p));
}

// The kernels against the CPU path for logits of type L (outputs in compute_t<L>: float for f32
// and bf16 logits, double for f64; dlogits of type L): six random rows (temperature 0.8, an
// ignored target, a -inf logit) and the CPU test's extreme rows (+-1e4 logits; one finite logit
// among -inf ones; an all -inf row). Log-probs within 1e-5 (1e-12 for f64) of the larger of
// their size and lse's, entropy and lse within 1e-5 relative, infinities equal; dlogits within 1e-5
// of the row's largest (1e-12 for f64) of the CPU's unrounded ones, plus bf16's one rounding (2^-8
// relative).
template <class L>
void check_kernels_against_cpu() {
  using T = weft::compute_t<L>;
  bool const wide = sizeof(T) == 8;
  index_t const V = 5003;
  std::vector<std::int64_t> const tgt = {0, 17, 5002, -100, 2500, 9, 1, 7, 3};
  std::size_t const n = tgt.size(), row = static_cast<std::size_t>(V);
  auto const zr = random_logits<float>(4, n * row, 3.0);
  std::vector<L> z(zr.size());
  for (std::size_t i = 0; i < z.size(); ++i) z[i] = static_cast<L>(zr[i]);
  L const ninf = -weft::limits<L>::infinity();  // std::numeric_limits<bf16> would be 0
  REQUIRE(std::isinf(double(ninf)));
  z[7] = ninf;
  for (std::size_t v = 0; v < row; ++v) {
    z[6 * row + v] = static_cast<L>(v % 2 ? 1e4f : -1e4f);
    z[7 * row + v] = v == 7 ? L(0) : ninf;
    z[8 * row + v] = ninf;
  }
  logprob_options const opt{0.8, -100};
  std::vector<T> lp(n), h(n), lse(n), dz(z.size());
  std::vector<T> g = {0.5, -1.0, 2.0, 1.0, 0.25, -0.5, 1.0, 1.0, 1.0},
                 ge = {0.1, 0.2, -0.3, 0.0, 0.05, 0.0, 1.0, 1.0, 1.0};
  weft::rl::log_prob_forward(std::span<L const>(z), V, std::span<std::int64_t const>(tgt), opt,
                             std::span<T>(lp), std::span<T>(h), std::span<T>(lse));
  weft::rl::log_prob_backward(std::span<L const>(z), V, std::span<std::int64_t const>(tgt), opt,
                              std::span<T const>(lse), std::span<T const>(h), std::span<T const>(g),
                              std::span<T const>(ge), std::span<T>(dz));
  L* dzl = to_device(z);
  std::int64_t* dt = to_device(tgt);
  T* dg = to_device(g);
  T* dge = to_device(ge);
  std::vector<T> const zeros(n, T(0));
  T* dlp = to_device(zeros);
  T* dh = to_device(zeros);
  T* dlse = to_device(zeros);
  L* ddz = to_device(std::vector<L>(z.size(), L(7)));
  weft::rl::kernels::log_prob_forward(nullptr, dzl, V, dt, static_cast<std::int64_t>(n), opt, dlp,
                                      dh, dlse);
  weft::rl::kernels::log_prob_backward(nullptr, dzl, V, dt, static_cast<std::int64_t>(n), opt, dlse,
                                       dh, dg, dge, ddz);
  WEFT_CUDA_TRY(cudaDeviceSynchronize());
  auto const glp = to_host(dlp, n), gh = to_host(dh, n), gl = to_host(dlse, n);
  auto const gdz = to_host(ddz, z.size());
  double const rel = wide ? 1e-12 : 1e-5;
  // Relative to the operands: logp = x - lse is a difference of numbers as large as lse (1.25e4
  // in the +-1e4 row, where the kernel's f32 subtraction carries lse's rounding, ~1e-3).
  auto same = [&](double got, double want, double size) {
    if (!std::isfinite(want) || !std::isfinite(got)) return got == want;
    return std::abs(got - want) <= rel * std::max({1.0, std::abs(want), size});
  };
  for (std::size_t k = 0; k < n; ++k) {
    CAPTURE(k);
    double const size = std::isfinite(double(lse[k])) ? std::abs(double(lse[k])) : 0.0;
    CHECK(same(double(glp[k]), double(lp[k]), size));
    CHECK(same(double(gh[k]), double(h[k]), 0.0));
    CHECK(same(double(gl[k]), double(lse[k]), 0.0));
  }
  double const round = std::is_same_v<L, weft::bf16> ? 1.0 / 256 : 0.0;
  for (std::size_t k = 0; k < n; ++k) {
    double row_max = 0;
    for (std::size_t v = 0; v < row; ++v)
      row_max = std::max(row_max, std::abs(double(dz[k * row + v])));
    std::size_t bad = 0;
    for (std::size_t v = 0; v < row; ++v) {
      double const got = double(static_cast<T>(gdz[k * row + v])), want = double(dz[k * row + v]);
      if (!std::isfinite(got) ||
          !(std::abs(got - want) <= round * std::abs(want) + 2 * rel * row_max + 1e-300))
        ++bad;
    }
    CAPTURE(k);
    CAPTURE(row_max);
    CHECK(bad == 0);
  }
  for (void* p : {static_cast<void*>(dzl), static_cast<void*>(dt), static_cast<void*>(dg),
                  static_cast<void*>(dge), static_cast<void*>(dlp), static_cast<void*>(dh),
                  static_cast<void*>(dlse), static_cast<void*>(ddz)})
    WEFT_CUDA_TRY(cudaFree(p));
}
}  // namespace

TEST_CASE("CUDA kernels give the CPU log-probs, entropy and dlogits (f32, bf16 and f64 logits)") {
  int devices = 0;
  if (cudaGetDeviceCount(&devices) != cudaSuccess || devices == 0) {
    MESSAGE("no CUDA device: kernel comparison skipped");
    return;
  }
  check_kernels_against_cpu<float>();
  check_kernels_against_cpu<weft::bf16>();
  check_kernels_against_cpu<double>();
}

TEST_CASE("CUDA kernels give the CPU dlogits at -inf logits for d_entropy 5 and 1e30 (issue 9.1)") {
  int devices = 0;
  if (cudaGetDeviceCount(&devices) != cudaSuccess || devices == 0) {
    MESSAGE("no CUDA device: kernel comparison skipped");
    return;
  }
  check_kernel_neg_inf_gradient<float>();
  check_kernel_neg_inf_gradient<double>();
}
#endif
