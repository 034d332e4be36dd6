// CUDA twin of the AdamW tests: the fused kernel (weft/optim/cuda/adamw.cuh) against
// optim::adamw<T> over many steps, odd sizes, both lerp branches, decay flags and empty
// parameters; the gradient norm's sum of squares (cub::DeviceReduce) against the CPU's serial
// double sum; clipping by clip_coefficient. The host build compiles nothing here.
//
// Tolerances: the kernel runs the CPU's per-element functor, but nvcc contracts a·b + c into FMAs
// (g++ does not on x86-64), so each step may differ by about one rounding of θ, m and v: after 20
// f32 steps within 1e-6 relative to max(|x|, 1, the size of x's gradients) (the CPU test's
// f32-vs-f64 bound is 2e-6; first H200 run: m of an element with gradients near 100 and m near 1
// was 1.2e-5 off relative to |m|, 1.5 ulp of 100), f64 within 1e-13. The norm: a tree of double
// additions vs a serial one, 1e-12 relative.
#include <weft/optim/adamw.hpp>
#include <weft/optim/clip.hpp>

#include <weft/core/config.hpp>

#include <doctest/doctest.h>

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <random>
#include <span>
#include <string>
#include <vector>

#if defined(__CUDACC__) && WEFT_HAS_CUDA_RUNTIME
#include <weft/optim/cuda/adamw.cuh>

#include "support/cuda_buffer.hpp"

#include <cuda_runtime_api.h>

namespace {
using weft::optim::adamw;
using weft::optim::adamw_options;
using weft::optim::param_info;
namespace ok = weft::optim::kernels;

using weft::test::have_cuda_device;
template <class T>
using dbuf = weft::test::device_buffer<T>;

// max |gpu − cpu| / max(|cpu|, scale_i, 1), reporting the worst element on failure. scale_i is the
// size of what element i was computed from (m: its largest gradient; v: that squared): a moment
// that cancels to near 0 from gradients of 100 carries the roundings of 100.
template <class T>
void expect_close(std::string const& what, std::vector<T> const& gpu, std::span<T const> cpu,
                  double tol, std::vector<double> const& scale = {}) {
  REQUIRE(gpu.size() == cpu.size());
  double worst = 0;
  std::size_t at = 0;
  for (std::size_t i = 0; i < gpu.size(); ++i) {
    double const s = std::max(std::abs(static_cast<double>(cpu[i])),
                              std::max(scale.empty() ? 0.0 : scale[i], 1.0));
    double const e = std::isfinite(static_cast<double>(gpu[i]))
                         ? std::abs(static_cast<double>(gpu[i]) - static_cast<double>(cpu[i])) / s
                         : INFINITY;
    if (e > worst) {
      worst = e;
      at = i;
    }
  }
  if (worst > tol)
    MESSAGE(what << ": error " << worst << " > " << tol << " at element " << at << " of "
                 << gpu.size() << ": gpu " << static_cast<double>(gpu[at]) << " cpu "
                 << static_cast<double>(cpu[at]));
  CHECK(worst <= tol);
}

template <class T>
void adamw_against_cpu(std::vector<param_info> const& layout, adamw_options const& o, double tol) {
  std::size_t n = 0;
  for (auto const& p : layout) n += p.count;
  std::string const tag = std::string(sizeof(T) == 4 ? "f32" : "f64") +
                          " adamw n=" + std::to_string(n) + " beta1=" + std::to_string(o.beta1);
  adamw<T> cpu(std::span<param_info const>(layout), o);
  std::mt19937_64 rng(7);
  std::normal_distribution<double> dist(0.0, 1.0);
  std::vector<T> p(n), g(n), zeros(n, T(0));
  for (auto& x : p) x = static_cast<T>(dist(rng));
  dbuf<T> dp(p), dg(g), dm(zeros), dv(zeros);
  std::vector<double> gmax(n, 0.0), gmax2(n, 0.0);
  for (std::int64_t t = 1; t <= 20; ++t) {
    for (std::size_t i = 0; i < n; ++i) {
      g[i] = static_cast<T>(dist(rng) * std::pow(10.0, static_cast<double>(i % 7) - 4.0));
      gmax[i] = std::max(gmax[i], std::abs(static_cast<double>(g[i])));
      gmax2[i] = gmax[i] * gmax[i];
    }
    double const lr = o.lr * (t % 3 == 0 ? 0.5 : 1.0);  // a schedule's changing lr
    cpu.step(p, g, lr);
    dg.upload(g);
    ok::adamw_step<T>(nullptr, std::span<param_info const>(layout), dp.p, dg.p, dm.p, dv.p, o, t,
                      lr);
  }
  WEFT_CUDA_TRY(cudaDeviceSynchronize());
  expect_close(tag + " params", dp.host(), std::span<T const>(p), tol);
  expect_close(tag + " m", dm.host(), cpu.m(), tol, gmax);
  expect_close(tag + " v", dv.host(), cpu.v(), tol, gmax2);
}

}  // namespace

TEST_CASE("optim/cuda: the fused AdamW kernel follows optim::adamw over 20 steps") {
  if (!have_cuda_device()) return;
  adamw_options o;
  o.lr = 1e-2;
  o.weight_decay = 0.05;
  adamw_options wide = o;
  wide.beta1 = 0.3;  // 1 − β1 = 0.7: lerp's other branch
  std::vector<std::vector<param_info>> const layouts = {
      {{.count = 53}},
      {{.count = 1}},
      {{.count = 0}},
      {{.count = 3, .decay = true}, {.count = 0}, {.count = 4, .decay = false}, {.count = 1000}},
      {{.count = 1000003, .decay = false}, {.count = 17}},
  };
  for (auto const& layout : layouts) {
    adamw_against_cpu<float>(layout, o, 1e-6);
    adamw_against_cpu<float>(layout, wide, 1e-6);
    adamw_against_cpu<double>(layout, o, 1e-13);
    adamw_against_cpu<double>(layout, wide, 1e-13);
  }
}

namespace {
// T gradients on the device, the norm's output and CUB's scratch for them (freed with it).
template <class T>
struct grad_norm_run {
  std::int64_t n;
  dbuf<T> grads;
  dbuf<double> out{std::vector<double>(1, -1.0)};
  std::size_t bytes = ok::grad_norm_squared_temp_bytes<T>(n);
  dbuf<unsigned char> temp{bytes > 0 ? bytes : 1};
  explicit grad_norm_run(std::vector<T> const& g)
      : n(static_cast<std::int64_t>(g.size())), grads(g) {}
  double norm_squared() {
    ok::grad_norm_squared<T>(nullptr, grads.p, n, out.p, temp.p, bytes);
    WEFT_CUDA_TRY(cudaDeviceSynchronize());
    return out.host()[0];
  }
  double clip(double max_norm) {
    return ok::clip_grad_norm<T>(nullptr, grads.p, n, max_norm, temp.p, bytes, out.p);
  }
};

// The CUB sum of squares of T gradients (accumulated in double) against the CPU's, within
// 1e-12; clipping to half the norm scales every gradient by clip_coefficient (rounded to T),
// and clipping at twice the norm leaves them, within 1e-7 (f32) or 1e-11 (f64: the kernel's
// coefficient comes from its own norm, within 1e-12 of the CPU's).
template <class T>
void check_grad_norm_and_clip() {
  for (std::size_t n : {std::size_t{0}, std::size_t{1}, std::size_t{37}, std::size_t{1} << 20,
                        (std::size_t{1} << 22) + 3}) {
    CAPTURE(n);
    CAPTURE(sizeof(T));
    std::mt19937_64 rng(n + 1);
    std::normal_distribution<double> dist(0.0, 1.0);
    std::vector<T> g(n);
    for (auto& x : g) x = static_cast<T>(dist(rng));
    double want = 0;
    for (T x : g) want += static_cast<double>(x) * static_cast<double>(x);
    grad_norm_run<T> run(g);
    double const got = run.norm_squared();
    INFO("gpu " << got << " cpu " << want);
    CHECK(std::abs(got - want) <= 1e-12 * std::max(want, 1e-300));
    // Clipping to half the norm (and not clipping at twice the norm).
    double const norm = std::sqrt(want);
    for (double max_norm : {0.5 * norm, 2.0 * norm + 1.0}) {
      CAPTURE(max_norm);
      run.grads.upload(g);
      double const gn = run.clip(max_norm);
      CHECK(std::abs(gn - norm) <= 1e-12 * std::max(norm, 1e-300));
      auto const f = static_cast<T>(weft::optim::clip_coefficient(norm, max_norm));
      std::vector<T> want_g(g);
      for (auto& x : want_g) x *= f;
      auto const got_g = run.grads.host();
      expect_close("clipped grads", got_g, std::span<T const>(want_g),
                   sizeof(T) == 4 ? 1e-7 : 1e-11);
    }
  }
}

// One NaN gradient, as the CPU's clip test: the norm is NaN, and clipping then makes every
// gradient NaN (clip_coefficient(NaN, max_norm) is NaN), at any max_norm.
template <class T>
void check_nan_gradient_clip() {
  CAPTURE(sizeof(T));
  std::vector<T> g(1000, T(0.25));
  g[617] = std::numeric_limits<T>::quiet_NaN();
  grad_norm_run<T> run(g);
  CHECK(std::isnan(run.norm_squared()));
  for (double max_norm : {1e-3, 1e6}) {
    CAPTURE(max_norm);
    run.grads.upload(g);
    CHECK(std::isnan(run.clip(max_norm)));
    std::size_t finite = 0;
    for (T x : run.grads.host()) finite += std::isnan(static_cast<double>(x)) ? 0 : 1;
    CHECK(finite == 0);
  }
}
}  // namespace

TEST_CASE("optim/cuda: grad-norm sum of squares (CUB) and clipping follow the CPU (f32 and f64)") {
  if (!have_cuda_device()) return;
  check_grad_norm_and_clip<float>();
  check_grad_norm_and_clip<double>();
  check_nan_gradient_clip<float>();
  check_nan_gradient_clip<double>();
}

TEST_CASE("optim/cuda: bad options, lr, step and temp size throw before any launch") {
  adamw_options bad;
  bad.beta2 = 1.0;
  float* none = nullptr;
  auto const msg = [](auto&& f) -> std::string {
    try {
      f();
    } catch (std::exception const& e) {
      return e.what();
    }
    return "";
  };
  CHECK(msg([&] {
          ok::adamw_step<float>(nullptr, none, none, none, none, 4, bad, 1, 0.1);
        }).find("beta2") != std::string::npos);
  CHECK(msg([&] {
          ok::adamw_step<float>(nullptr, none, none, none, none, 4, {}, 0, 0.1);
        }).find("`step`") != std::string::npos);
  CHECK(msg([&] {
          ok::adamw_step<float>(nullptr, none, none, none, none, 4, {}, 1, -1.0);
        }).find("`lr`") != std::string::npos);
}
#endif  // __CUDACC__ && WEFT_HAS_CUDA_RUNTIME
