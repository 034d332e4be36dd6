// CUDA twins of the nn layer tests: LayerNorm, RMSNorm, GELU, SwiGLU and linear (cuBLAS) kernels
// (weft/nn/cuda/*.cuh) against the CPU path (the tested reference) over odd, empty and degenerate
// shapes, f32 and bf16. The host build compiles only the argument checks that need no GPU.
//
// Tolerances (normwise: max |gpu − cpu| / max |cpu|): f32 1e-5 — both sides compute in f32 and
// differ only by summation order (block trees vs serial loops, cuBLAS's blocking) and FMA
// contraction, a few ulp on rows of at most a few hundred; bf16 8e-3 — every output is rounded
// once to bf16 (2^-8 relative spacing) from f32 values that differ in their last bits, so an
// element may land one bf16 ulp away from the CPU's (up to 2^-8 ≈ 3.9e-3 of the largest), twice
// that for chained quantities (dx from a bf16 y is not tested; the weight gradients accumulate into
// bf16 once).
#include <weft/nn/activation.hpp>
#include <weft/nn/embedding.hpp>
#include <weft/nn/linear.hpp>
#include <weft/nn/norm.hpp>
#include <weft/nn/rope.hpp>

#include "nn_test.hpp"

#include <weft/core/config.hpp>
#include <weft/core/tensor.hpp>

#include <doctest/doctest.h>

#include <cmath>
#include <cstdint>
#include <span>
#include <string>
#include <tuple>
#include <vector>

#if defined(__CUDACC__) && WEFT_HAS_CUDA_RUNTIME
#include <weft/nn/cuda/activation.cuh>
#include <weft/nn/cuda/embedding.cuh>
#include <weft/nn/cuda/linear.cuh>
#include <weft/nn/cuda/norm.cuh>
#include <weft/nn/cuda/rope.cuh>

#include <cublas_v2.h>
#include "support/cuda_buffer.hpp"

#include <cuda_runtime_api.h>

namespace {
using namespace nn_test;
using weft::index_t;
namespace nn = weft::nn;
namespace nk = weft::nn::kernels;

using weft::test::have_cuda_device;
template <class T>
using dbuf = weft::test::device_buffer<T>;

template <class T>
std::vector<double> values_of(T const* p, std::size_t n) {
  std::vector<double> v(n);
  for (std::size_t i = 0; i < n; ++i) v[i] = static_cast<double>(p[i]);
  return v;
}

// Normwise comparison that, on failure, reports the quantity, the shape, the error and the first
// element off by more than tol·max|cpu| (index, gpu and cpu values).
// `floor`: the least scale the error is measured against, for results that cancel (a norm's dx
// over a row of one element is rounding noise around 0, while its terms are of size
// rstd·|w·dy|).
void expect_close(std::string const& what, std::vector<double> const& gpu,
                  std::vector<double> const& cpu, double tol, double floor = 0.0) {
  REQUIRE_MESSAGE(gpu.size() == cpu.size(),
                  what << ": sizes " << gpu.size() << " vs " << cpu.size());
  double const scale = std::max(max_abs(cpu) == 0 ? 1.0 : max_abs(cpu), floor);
  double err = 0;
  if (floor == 0.0) {
    err = normwise_error(gpu, cpu);
  } else {
    for (std::size_t i = 0; i < gpu.size() && err < INFINITY; ++i)
      err = std::isfinite(gpu[i]) ? std::max(err, std::abs(gpu[i] - cpu[i]) / scale) : INFINITY;
  }
  if (err <= tol) {
    CHECK(err <= tol);
    return;
  }
  std::size_t first = 0;
  for (; first < gpu.size(); ++first)
    if (!std::isfinite(gpu[first]) || std::abs(gpu[first] - cpu[first]) > tol * scale) break;
  std::size_t bad = 0;
  for (std::size_t i = 0; i < gpu.size(); ++i)
    if (!std::isfinite(gpu[i]) || std::abs(gpu[i] - cpu[i]) > tol * scale) ++bad;
  MESSAGE(what << ": normwise error " << err << " > " << tol << " (max|cpu| " << max_abs(cpu)
               << "), " << bad << " of " << gpu.size() << " elements off; first at " << first
               << ": gpu " << (first < gpu.size() ? gpu[first] : 0.0) << " cpu "
               << (first < cpu.size() ? cpu[first] : 0.0));
  CHECK(err <= tol);
}

// The size of the terms a norm's dx is made of: max over rows of rstd · max|w| · max|dy|.
template <class R, class W, class G>
double dx_scale(R const& rs, W const& w, G const& dy) {
  auto const mx = [](auto const& t) {
    double m = 0;
    for (std::size_t i = 0; i < t.size(); ++i)
      m = std::max(m, std::abs(static_cast<double>(t.data()[i])));
    return m;
  };
  return mx(rs) * mx(w) * mx(dy);
}

template <class T>
std::string type_name() {
  return sizeof(T) == 4 ? "f32" : "bf16";
}

std::string shape(index_t a, index_t b) {
  return "[" + std::to_string(a) + ", " + std::to_string(b) + "]";
}

// ---- norms ----------------------------------------------------------------------------------

template <class T>
void norms_against_cpu(index_t n, index_t c, double tol, bool degenerate, double ln_eps = 1e-5,
                       double rms_eps = 1e-6) {
  using C = weft::compute_t<T>;
  std::string const tag = type_name<T>() + " norm x" + shape(n, c) + " eps " +
                          std::to_string(ln_eps) + ", " + std::to_string(rms_eps);
  auto x = random<T>(10, -3, 3, n, c);
  if (degenerate && n >= 3) {
    for (index_t j = 0; j < c; ++j) {
      x.data()[j] = T(3.0f);                                             // zero variance
      x.data()[c + j] = T(0.0f);                                         // all zero
      x.data()[2 * c + j] = static_cast<T>(1e4 + (j % 2 ? 0.5 : -0.5));  // far from zero
    }
  }
  auto w = random<T>(11, 0.5, 1.5, c);
  auto b = random<T>(12, -1, 1, c);
  auto dy = random<T>(13, -1, 1, n, c);
  auto dw0 = random<T>(14, -1, 1, c);  // the weight gradients accumulate onto these
  auto db0 = random<T>(15, -1, 1, c);
  for (bool with_bias : {true, false}) {
    std::string const lt = tag + (with_bias ? " LayerNorm" : " LayerNorm (no bias)");
    auto y = weft::make_tensor<T>(n, c);
    auto m = weft::make_tensor<C>(n);
    auto rs = weft::make_tensor<C>(n);
    auto dx = weft::make_tensor<T>(n, c);
    auto dw = filled(dw0, 0.0);
    auto db = filled(db0, 0.0);
    for (std::size_t i = 0; i < dw.size(); ++i) dw.data()[i] = dw0.data()[i];
    for (std::size_t i = 0; i < db.size(); ++i) db.data()[i] = db0.data()[i];
    if (with_bias) {
      nn::layer_norm_forward(x, w, b, y, m, rs, ln_eps);
      nn::layer_norm_backward_weight(dy, x, m, rs, dw, db);
    } else {
      nn::layer_norm_forward(x, w, nn::no_bias<T>(), y, m, rs, ln_eps);
      nn::layer_norm_backward_weight(dy, x, m, rs, dw, nn::no_bias_grad<T>());
    }
    nn::layer_norm_backward_input(dy, x, w, m, rs, dx);
    dbuf<T> gx(x), gw(w), gb(b), gdy(dy), gy(x.size()), gdx(x.size()), gdw(dw0), gdb(db0);
    dbuf<C> gm(static_cast<std::size_t>(n)), grs(static_cast<std::size_t>(n));
    nk::layer_norm_forward<T>(nullptr, gx.p, gw.p, with_bias ? gb.p : nullptr, gy.p, gm.p, grs.p, n,
                              c, ln_eps);
    // The backward takes the CPU forward's statistics, so it is tested on its own.
    dbuf<C> cm(m.data(), m.size()), crs(rs.data(), rs.size());
    nk::layer_norm_backward_input<T>(nullptr, gdy.p, gx.p, gw.p, cm.p, crs.p, gdx.p, n, c);
    nk::layer_norm_backward_weight<T>(nullptr, gdy.p, gx.p, cm.p, crs.p, gdw.p,
                                      with_bias ? gdb.p : nullptr, n, c);
    WEFT_CUDA_TRY(cudaDeviceSynchronize());
    expect_close(lt + " y", gy.values(), values(y), tol);
    expect_close(lt + " mean", gm.values(), values(m), 1e-5);
    expect_close(lt + " rstd", grs.values(), values(rs), 1e-5);
    expect_close(lt + " dx", gdx.values(), values(dx), tol, dx_scale(rs, w, dy));
    expect_close(lt + " dweight (accumulated)", gdw.values(), values(dw), tol);
    if (with_bias)
      expect_close(lt + " dbias (accumulated)", gdb.values(), values(db), tol);
    else
      expect_close(lt + " dbias untouched", gdb.values(), values(db0), 0.0);
  }
  {
    std::string const rt = tag + " RMSNorm";
    auto y = weft::make_tensor<T>(n, c);
    auto rs = weft::make_tensor<C>(n);
    auto dx = weft::make_tensor<T>(n, c);
    auto dw = filled(dw0, 0.0);
    for (std::size_t i = 0; i < dw.size(); ++i) dw.data()[i] = dw0.data()[i];
    nn::rms_norm_forward(x, w, y, rs, rms_eps);
    nn::rms_norm_backward_input(dy, x, w, rs, dx);
    nn::rms_norm_backward_weight(dy, x, rs, dw);
    dbuf<T> gx(x), gw(w), gdy(dy), gy(x.size()), gdx(x.size()), gdw(dw0);
    dbuf<C> grs(static_cast<std::size_t>(n)), crs(rs.data(), rs.size());
    nk::rms_norm_forward<T>(nullptr, gx.p, gw.p, gy.p, grs.p, n, c, rms_eps);
    nk::rms_norm_backward_input<T>(nullptr, gdy.p, gx.p, gw.p, crs.p, gdx.p, n, c);
    nk::rms_norm_backward_weight<T>(nullptr, gdy.p, gx.p, crs.p, gdw.p, n, c);
    WEFT_CUDA_TRY(cudaDeviceSynchronize());
    expect_close(rt + " y", gy.values(), values(y), tol);
    expect_close(rt + " rstd", grs.values(), values(rs), 1e-5);
    expect_close(rt + " dx", gdx.values(), values(dx), tol, dx_scale(rs, w, dy));
    expect_close(rt + " dweight (accumulated)", gdw.values(), values(dw), tol);
  }
}

TEST_CASE("nn/cuda: LayerNorm and RMSNorm kernels give the CPU path's results (f32, bf16)") {
  if (!have_cuda_device()) return;
  struct shp {
    index_t n, c;
    bool degenerate;
  };
  for (shp s : {shp{5, 96, false}, shp{3, 8, true}, shp{3, 24, true}, shp{1, 1, false},
                shp{7, 257, false}, shp{33, 4099, false}, shp{0, 8, false}, shp{4, 0, false},
                // more rows than one chunk of the weight gradients' column sums
                shp{1000, 300, false}, shp{4099, 33, true}}) {
    CAPTURE(s.n);
    CAPTURE(s.c);
    norms_against_cpu<float>(s.n, s.c, 1e-5, s.degenerate);
    norms_against_cpu<weft::bf16>(s.n, s.c, 8e-3, s.degenerate);
  }
  // Other eps (they decide the zero-variance and all-zero rows' rstd).
  norms_against_cpu<float>(3, 24, 1e-5, true, 1e-2, 1e-3);
  norms_against_cpu<weft::bf16>(33, 4099, 8e-3, false, 1e-2, 1e-3);
}

// ---- activations ----------------------------------------------------------------------------

template <class T>
void activations_against_cpu(index_t n, index_t c, double tol) {
  std::string const tag = type_name<T>() + " activation " + shape(n, c);
  auto x = random<T>(30, -6, 6, n, c);
  if (x.size() > 2) {
    x.data()[0] = T(30.0f);  // saturated tanh / sigmoid
    x.data()[1] = T(-30.0f);
  }
  auto b = random<T>(31, -2, 2, n, c);
  auto dy = random<T>(32, -1, 1, n, c);
  auto y = weft::make_tensor<T>(n, c);
  auto dx = weft::make_tensor<T>(n, c);
  auto ys = weft::make_tensor<T>(n, c);
  auto da = weft::make_tensor<T>(n, c);
  auto db = weft::make_tensor<T>(n, c);
  nn::gelu_forward(x, y);
  nn::gelu_backward(x, dy, dx);
  nn::swiglu_forward(x, b, ys);
  nn::swiglu_backward(x, b, dy, da, db);
  auto const size = x.size();
  dbuf<T> gx(x), gb(b), gdy(dy), gy(size), gdx(size), gys(size), gda(size), gdb(size);
  auto const cnt = static_cast<std::int64_t>(size);
  nk::gelu_forward<T>(nullptr, gx.p, gy.p, cnt);
  nk::gelu_backward<T>(nullptr, gx.p, gdy.p, gdx.p, cnt);
  nk::swiglu_forward<T>(nullptr, gx.p, gb.p, gys.p, cnt);
  nk::swiglu_backward<T>(nullptr, gx.p, gb.p, gdy.p, gda.p, gdb.p, cnt);
  WEFT_CUDA_TRY(cudaDeviceSynchronize());
  expect_close(tag + " gelu y", gy.values(), values(y), tol);
  expect_close(tag + " gelu dx", gdx.values(), values(dx), tol);
  expect_close(tag + " swiglu y", gys.values(), values(ys), tol);
  expect_close(tag + " swiglu da", gda.values(), values(da), tol);
  expect_close(tag + " swiglu db", gdb.values(), values(db), tol);
  // In place, as the CPU allows: y = x.
  dbuf<T> inplace(x);
  nk::gelu_forward<T>(nullptr, inplace.p, inplace.p, cnt);
  WEFT_CUDA_TRY(cudaDeviceSynchronize());
  expect_close(tag + " gelu in place", inplace.values(), values(y), tol);
}

TEST_CASE("nn/cuda: GELU and SwiGLU kernels give the CPU path's results (f32, bf16)") {
  if (!have_cuda_device()) return;
  for (auto [n, c] : {std::pair<index_t, index_t>{3, 17}, {1, 1}, {0, 4}, {65, 1000}, {2, 0}}) {
    CAPTURE(n);
    CAPTURE(c);
    activations_against_cpu<float>(n, c, 1e-5);
    activations_against_cpu<weft::bf16>(n, c, 8e-3);
  }
}

// ---- embedding and RoPE --------------------------------------------------------------------

template <class I, class T>
void embedding_against_cpu(index_t tokens, index_t rows, index_t dim) {
  std::string const tag = type_name<T>() + (sizeof(I) == 4 ? " int32" : " int64") +
                          " embedding tokens=" + std::to_string(tokens) +
                          " table=" + shape(rows, dim);
  std::vector<I> ids(static_cast<std::size_t>(tokens));
  for (std::size_t k = 0; k < ids.size(); ++k)  // repeats, in no order
    ids[k] = static_cast<I>((k * 7 + k / 3) % static_cast<std::size_t>(rows));
  auto table = random<T>(50, -1, 1, rows, dim);
  auto dout = random<T>(51, -1, 1, tokens, dim);
  auto dtable = random<T>(52, -1, 1, rows, dim);  // accumulated onto
  auto out = weft::make_tensor<T>(tokens, dim);
  nn::embedding_forward(std::span<I const>(ids), table, out);
  dbuf<I> gids(ids.data(), ids.size());
  dbuf<T> gtable(table), gdout(dout), gout(out.size()), gdtable(dtable);
  nn::embedding_backward(std::span<I const>(ids), dout, dtable);
  nk::embedding_forward<I, T>(nullptr, gids.p, tokens, gtable.p, rows, dim, gout.p);
  nk::embedding_backward<I, T>(nullptr, gids.p, tokens, gdout.p, gdtable.p, rows, dim);
  WEFT_CUDA_TRY(cudaDeviceSynchronize());
  // Same additions in the same order, one rounding each: bitwise equal.
  expect_close(tag + " out", gout.values(), values(out), 0.0);
  expect_close(tag + " dtable (accumulated, bitwise)", gdtable.values(), values(dtable), 0.0);
}

template <class T, class I = std::int64_t>
void rope_against_cpu(index_t rows, index_t heads, index_t head_dim, double tol,
                      double base = 10000.0) {
  std::string const tag = type_name<T>() + " rope rows=" + std::to_string(rows) +
                          " heads=" + std::to_string(heads) +
                          " head_dim=" + std::to_string(head_dim) + " positions=int" +
                          std::to_string(8 * sizeof(I)) + " base=" + std::to_string(base);
  index_t const width = heads * head_dim;
  std::vector<I> pos(static_cast<std::size_t>(rows));
  for (std::size_t k = 0; k < pos.size(); ++k)  // packed documents restarting at 0, up to ~300
    pos[k] = static_cast<I>(k < pos.size() / 2 ? k * 3 : k - pos.size() / 2);
  auto x = random<T>(60, -2, 2, rows, width);
  auto dy = random<T>(61, -1, 1, rows, width);
  auto y = weft::make_tensor<T>(rows, width);
  auto dx = weft::make_tensor<T>(rows, width);
  nn::rope_forward(x, std::span<I const>(pos), head_dim, y, base);
  nn::rope_backward(dy, std::span<I const>(pos), head_dim, dx, base);
  dbuf<I> gpos(pos.data(), pos.size());
  dbuf<T> gx(x), gdy(dy), gy(x.size());
  nk::rope_forward<I, T>(nullptr, gx.p, gpos.p, rows, width, head_dim, gy.p, base);
  nk::rope_backward<I, T>(nullptr, gdy.p, gpos.p, rows, width, head_dim, gdy.p, base);
  WEFT_CUDA_TRY(cudaDeviceSynchronize());
  expect_close(tag + " y", gy.values(), values(y), tol);
  expect_close(tag + " dx (in place)", gdy.values(), values(dx), tol);
}

TEST_CASE("nn/cuda: embedding lookup and deterministic scatter-add, RoPE, give the CPU's results") {
  if (!have_cuda_device()) return;
  for (auto [t, v, d] : {std::tuple<index_t, index_t, index_t>{200, 50, 33},
                         {1, 1, 1},
                         {0, 5, 4},
                         {3000, 7, 129},
                         {17, 100000, 8}}) {
    CAPTURE(t);
    CAPTURE(v);
    CAPTURE(d);
    embedding_against_cpu<std::int64_t, float>(t, v, d);
    embedding_against_cpu<std::int32_t, weft::bf16>(t, v, d);
  }
  // f32: base^(−2i/D), cos and sin come from CUDA's libdevice instead of libm (powf within a few
  // ulp); the angle pos·inv_freq carries that relative error times pos, so at positions up to
  // ~300 the turn may differ by up to ~300·4·2^-23 ≈ 1.4e-4 rad: 2e-4 of the largest value (the
  // CPU itself is only 1e-5-close to f64 there). bf16: one output rounding, as elsewhere.
  for (auto [r, h, hd] :
       {std::tuple<index_t, index_t, index_t>{7, 3, 64}, {1, 1, 2}, {0, 2, 8}, {200, 4, 128}}) {
    CAPTURE(r);
    CAPTURE(h);
    CAPTURE(hd);
    rope_against_cpu<float>(r, h, hd, 2e-4);
    rope_against_cpu<weft::bf16>(r, h, hd, 1e-2);
    // int32 positions and LLaMA 3's base 500000.
    rope_against_cpu<float, std::int32_t>(r, h, hd, 2e-4, 500000.0);
  }
}

// ---- linear (cuBLAS) ------------------------------------------------------------------------

template <class T>
void linear_against_cpu(cublasHandle_t h, index_t n, index_t in, index_t out, bool with_bias,
                        double tol) {
  std::string const tag = type_name<T>() + " linear n=" + std::to_string(n) +
                          " in=" + std::to_string(in) + " out=" + std::to_string(out) +
                          (with_bias ? " bias" : " no bias");
  auto x = random<T>(40, -1, 1, n, in);
  auto w = random<T>(41, -0.5, 0.5, out, in);
  auto b = random<T>(42, -1, 1, out);
  auto dy = random<T>(43, -1, 1, n, out);
  auto dw0 = random<T>(44, -1, 1, out, in);
  auto db0 = random<T>(45, -1, 1, out);
  auto y = weft::make_tensor<T>(n, out);
  auto dx = weft::make_tensor<T>(n, in);
  auto dw = random<T>(44, -1, 1, out, in);
  auto db = random<T>(45, -1, 1, out);
  if (with_bias) {
    nn::linear_forward(x, w, b, y);
    nn::linear_backward_weight(dy, x, dw, db);
  } else {
    nn::linear_forward(x, w, nn::no_bias<T>(), y);
    nn::linear_backward_weight(dy, x, dw, nn::no_bias_grad<T>());
  }
  nn::linear_backward_input(dy, w, dx);
  dbuf<T> gx(x), gw(w), gb(b), gdy(dy), gy(y.size()), gdx(dx.size()), gdw(dw0), gdb(db0);
  nk::linear_forward<T>(h, nullptr, gx.p, gw.p, with_bias ? gb.p : nullptr, gy.p, n, in, out);
  nk::linear_backward_input<T>(h, nullptr, gdy.p, gw.p, gdx.p, n, in, out);
  nk::linear_backward_weight<T>(h, nullptr, gdy.p, gx.p, gdw.p, with_bias ? gdb.p : nullptr, n, in,
                                out);
  WEFT_CUDA_TRY(cudaDeviceSynchronize());
  expect_close(tag + " y", gy.values(), values(y), tol);
  expect_close(tag + " dx", gdx.values(), values(dx), tol);
  expect_close(tag + " dw (accumulated)", gdw.values(), values(dw), tol);
  expect_close(tag + " dbias", gdb.values(), values(with_bias ? db : db0), tol);
}

TEST_CASE("nn/cuda: cuBLAS linear forward/backward gives the CPU path's results (f32, bf16)") {
  if (!have_cuda_device()) return;
  cublasHandle_t h = nullptr;
  REQUIRE(cublasCreate(&h) == CUBLAS_STATUS_SUCCESS);
  struct shp {
    index_t n, in, out;
  };
  for (shp s : {shp{5, 7, 3}, shp{1, 1, 1}, shp{17, 33, 9}, shp{64, 300, 130}, shp{3, 0, 4},
                shp{0, 5, 4}, shp{4, 5, 0}, shp{129, 257, 63},
                // more rows than one chunk of the bias gradient's column sum
                shp{1000, 40, 70}, shp{3000, 8, 300}}) {
    for (bool bias : {true, false}) {
      CAPTURE(s.n);
      CAPTURE(s.in);
      CAPTURE(s.out);
      CAPTURE(bias);
      linear_against_cpu<float>(h, s.n, s.in, s.out, bias, 1e-5);
      linear_against_cpu<weft::bf16>(h, s.n, s.in, s.out, bias, 8e-3);
    }
  }
  cublasDestroy(h);
}

// Host side, no device needed: the row split of the parameter gradients' column sums covers
// every row exactly once with no empty chunk, keeps at least 32 rows a chunk, and stays inside
// the grid's y limit.
TEST_CASE("nn/cuda: the column sums' row split covers the rows with non-empty chunks") {
  namespace cd = weft::nn::kernels::column_detail;
  for (std::int64_t rows : {1, 2, 31, 32, 33, 63, 64, 65, 1000, 4099, 16384, 1 << 20, 100000007})
    for (std::int64_t cols : {1, 33, 256, 257, 4096, 65536, 1 << 22}) {
      CAPTURE(rows);
      CAPTURE(cols);
      cd::row_split const s = cd::split_rows(rows, cols);
      CHECK(s.chunks >= 1);
      CHECK(s.chunks <= 65535);
      CHECK(s.chunk_rows >= 1);
      CHECK(s.chunks * s.chunk_rows >= rows);       // every row in a chunk
      CHECK((s.chunks - 1) * s.chunk_rows < rows);  // the last chunk is not empty
      if (s.chunks > 1) CHECK(s.chunk_rows >= cd::min_rows);
      std::int64_t const col_blocks = (cols + cd::block - 1) / cd::block;
      if (s.chunks > 1) CHECK(s.chunks * col_blocks <= 2 * cd::target_blocks);
      if (rows >= 64 * cd::min_rows && col_blocks <= 16) CHECK(s.chunks > 1);  // the point of it
    }
}

}  // namespace
#endif  // __CUDACC__ && WEFT_HAS_CUDA_RUNTIME

// Argument checks happen before any launch, so they run without a device (and in the host build
// they have no kernels to check: the host part of this file is empty).
#if defined(__CUDACC__) && WEFT_HAS_CUDA_RUNTIME
TEST_CASE("nn/cuda: bad eps, rows and sizes throw before any launch, naming the argument") {
  using weft::nn::kernels::layer_norm_forward;
  using weft::nn::kernels::rms_norm_forward;
  float* none = nullptr;
  nn_test::expect_throw<weft::invalid_argument_error>(
      [&] { layer_norm_forward<float>(nullptr, none, none, none, none, none, none, 2, 3, 0.0); },
      "`eps`");
  nn_test::expect_throw<weft::invalid_argument_error>(
      [&] { rms_norm_forward<float>(nullptr, none, none, none, none, -1, 3); }, "`rows`");
  nn_test::expect_throw<weft::invalid_argument_error>(
      [&] { weft::nn::kernels::gelu_forward<float>(nullptr, none, none, -2); }, "`n`");
  nn_test::expect_throw<weft::invalid_argument_error>(
      [&] {
        weft::nn::kernels::linear_forward<float>(nullptr, nullptr, none, none, none, none, 1,
                                                 std::int64_t{1} << 32, 1);
      },
      "`in`");
}
#endif
