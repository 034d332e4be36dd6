// benchmarks/cuda/layers.bench.cu — weft's CUDA layer kernels: fused AdamW and the grad-norm
// reduction (GB/s over 100M f32 parameters), RMSNorm/LayerNorm forward and backward-input (GB/s at
// 16384 x 4096 bf16), the parameter gradients' column sums (norm weights, linear bias; same shape,
// against the one-thread-per-column design they replaced), and the cuBLAS linear forward (TFLOP/s
// at 8192^3 bf16) against a plain cublasGemmEx of the same shape, the baseline. Timed with CUDA
// events (manual time).
#include <weft/nn/cuda/linear.cuh>
#include <weft/nn/cuda/norm.cuh>
#include <weft/optim/cuda/adamw.cuh>

#include <weft/core/dtype.hpp>

#include <benchmark/benchmark.h>
#include <cublas_v2.h>
#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>
#include <vector>

namespace {

using weft::bf16;

template <class T>
struct dev {
  T* p = nullptr;
  explicit dev(std::size_t n, float fill = 0.0f) {
    WEFT_CUDA_TRY(cudaMalloc(reinterpret_cast<void**>(&p), n * sizeof(T)));
    std::vector<T> h(n < (std::size_t{1} << 20) ? n : (std::size_t{1} << 20));
    for (std::size_t i = 0; i < h.size(); ++i)
      h[i] = static_cast<T>(fill + 0.001f * static_cast<float>(i % 977));
    for (std::size_t o = 0; o < n; o += h.size()) {
      std::size_t const c = n - o < h.size() ? n - o : h.size();
      WEFT_CUDA_TRY(cudaMemcpy(p + o, h.data(), c * sizeof(T), cudaMemcpyHostToDevice));
    }
  }
  dev(dev const&) = delete;
  dev& operator=(dev const&) = delete;
  ~dev() { cudaFree(p); }
};

// Times `f` once per iteration with CUDA events on the default stream.
template <class F>
void timed(benchmark::State& state, F&& f) {
  cudaEvent_t a, b;
  WEFT_CUDA_TRY(cudaEventCreate(&a));
  WEFT_CUDA_TRY(cudaEventCreate(&b));
  f();  // warm-up
  WEFT_CUDA_TRY(cudaDeviceSynchronize());
  for (auto _ : state) {
    WEFT_CUDA_TRY(cudaEventRecord(a));
    f();
    WEFT_CUDA_TRY(cudaEventRecord(b));
    WEFT_CUDA_TRY(cudaEventSynchronize(b));
    float ms = 0;
    WEFT_CUDA_TRY(cudaEventElapsedTime(&ms, a, b));
    state.SetIterationTime(static_cast<double>(ms) * 1e-3);
  }
  cudaEventDestroy(a);
  cudaEventDestroy(b);
}

void rate(benchmark::State& state, char const* name, double per_iteration) {
  state.counters[name] =
      benchmark::Counter(per_iteration, benchmark::Counter::kIsIterationInvariantRate);
}

// ---- optimizer -------------------------------------------------------------------------------

void BM_adamw_f32(benchmark::State& state) {
  auto const n = static_cast<std::int64_t>(state.range(0));
  auto const sz = static_cast<std::size_t>(n);
  dev<float> p(sz, 0.5f), g(sz, 0.01f), m(sz), v(sz);
  weft::optim::adamw_options const o{};
  std::int64_t step = 0;
  timed(state, [&] {
    weft::optim::kernels::adamw_step<float>(nullptr, p.p, g.p, m.p, v.p, n, o, ++step, 1e-4);
  });
  rate(state, "GB/s", 28.0 * static_cast<double>(n) * 1e-9);  // read p g m v, write p m v
}
BENCHMARK(BM_adamw_f32)->Arg(100'000'000)->UseManualTime()->Unit(benchmark::kMillisecond);

void BM_grad_norm_f32(benchmark::State& state) {
  auto const n = static_cast<std::int64_t>(state.range(0));
  dev<float> g(static_cast<std::size_t>(n), 0.01f);
  dev<double> out(1);
  std::size_t const bytes = weft::optim::kernels::grad_norm_squared_temp_bytes<float>(n);
  dev<unsigned char> temp(bytes);
  timed(state, [&] {
    weft::optim::kernels::grad_norm_squared<float>(nullptr, g.p, n, out.p, temp.p, bytes);
  });
  rate(state, "GB/s", 4.0 * static_cast<double>(n) * 1e-9);
}
BENCHMARK(BM_grad_norm_f32)->Arg(100'000'000)->UseManualTime()->Unit(benchmark::kMillisecond);

// ---- norms (bf16 rows of 4096) ---------------------------------------------------------------

constexpr std::int64_t norm_rows = 16384, norm_cols = 4096;

void BM_rms_norm_forward_bf16(benchmark::State& state) {
  auto const e = static_cast<std::size_t>(norm_rows * norm_cols);
  dev<bf16> x(e, -1.0f), y(e), w(norm_cols, 1.0f);
  dev<float> rstd(norm_rows);
  timed(state, [&] {
    weft::nn::kernels::rms_norm_forward<bf16>(nullptr, x.p, w.p, y.p, rstd.p, norm_rows, norm_cols);
  });
  rate(state, "GB/s", 4.0 * static_cast<double>(e) * 1e-9);  // read x, write y
}
BENCHMARK(BM_rms_norm_forward_bf16)->UseManualTime()->Unit(benchmark::kMicrosecond);

void BM_rms_norm_backward_input_bf16(benchmark::State& state) {
  auto const e = static_cast<std::size_t>(norm_rows * norm_cols);
  dev<bf16> x(e, -1.0f), dy(e, 0.1f), dx(e), w(norm_cols, 1.0f);
  dev<float> rstd(norm_rows, 1.0f);
  timed(state, [&] {
    weft::nn::kernels::rms_norm_backward_input<bf16>(nullptr, dy.p, x.p, w.p, rstd.p, dx.p,
                                                     norm_rows, norm_cols);
  });
  rate(state, "GB/s", 6.0 * static_cast<double>(e) * 1e-9);  // read dy x, write dx
}
BENCHMARK(BM_rms_norm_backward_input_bf16)->UseManualTime()->Unit(benchmark::kMicrosecond);

void BM_layer_norm_forward_bf16(benchmark::State& state) {
  auto const e = static_cast<std::size_t>(norm_rows * norm_cols);
  dev<bf16> x(e, -1.0f), y(e), w(norm_cols, 1.0f), b(norm_cols);
  dev<float> mean(norm_rows), rstd(norm_rows);
  timed(state, [&] {
    weft::nn::kernels::layer_norm_forward<bf16>(nullptr, x.p, w.p, b.p, y.p, mean.p, rstd.p,
                                                norm_rows, norm_cols);
  });
  rate(state, "GB/s", 4.0 * static_cast<double>(e) * 1e-9);
}
BENCHMARK(BM_layer_norm_forward_bf16)->UseManualTime()->Unit(benchmark::kMicrosecond);

void BM_layer_norm_backward_input_bf16(benchmark::State& state) {
  auto const e = static_cast<std::size_t>(norm_rows * norm_cols);
  dev<bf16> x(e, -1.0f), dy(e, 0.1f), dx(e), w(norm_cols, 1.0f);
  dev<float> mean(norm_rows), rstd(norm_rows, 1.0f);
  timed(state, [&] {
    weft::nn::kernels::layer_norm_backward_input<bf16>(nullptr, dy.p, x.p, w.p, mean.p, rstd.p,
                                                       dx.p, norm_rows, norm_cols);
  });
  rate(state, "GB/s", 6.0 * static_cast<double>(e) * 1e-9);
}
BENCHMARK(BM_layer_norm_backward_input_bf16)->UseManualTime()->Unit(benchmark::kMicrosecond);

// ---- parameter gradients: column sums over the rows (16384 x 4096 bf16) ------------------------

void BM_rms_norm_backward_weight_bf16(benchmark::State& state) {
  auto const e = static_cast<std::size_t>(norm_rows * norm_cols);
  dev<bf16> x(e, -1.0f), dy(e, 0.1f), dw(norm_cols);
  dev<float> rstd(norm_rows, 1.0f);
  timed(state, [&] {
    weft::nn::kernels::rms_norm_backward_weight<bf16>(nullptr, dy.p, x.p, rstd.p, dw.p, norm_rows,
                                                      norm_cols);
  });
  rate(state, "GB/s", 4.0 * static_cast<double>(e) * 1e-9);  // read dy, x
}
BENCHMARK(BM_rms_norm_backward_weight_bf16)->UseManualTime()->Unit(benchmark::kMicrosecond);

void BM_layer_norm_backward_weight_bf16(benchmark::State& state) {
  auto const e = static_cast<std::size_t>(norm_rows * norm_cols);
  dev<bf16> x(e, -1.0f), dy(e, 0.1f), dw(norm_cols), db(norm_cols);
  dev<float> mean(norm_rows), rstd(norm_rows, 1.0f);
  timed(state, [&] {
    weft::nn::kernels::layer_norm_backward_weight<bf16>(nullptr, dy.p, x.p, mean.p, rstd.p, dw.p,
                                                        db.p, norm_rows, norm_cols);
  });
  rate(state, "GB/s", 4.0 * static_cast<double>(e) * 1e-9);  // read dy, x
}
BENCHMARK(BM_layer_norm_backward_weight_bf16)->UseManualTime()->Unit(benchmark::kMicrosecond);

// The linear's bias gradient alone (in = 0 skips the weight GEMM): dbias += column sums of dy.
void BM_linear_bias_grad_bf16(benchmark::State& state) {
  auto const e = static_cast<std::size_t>(norm_rows * norm_cols);
  dev<bf16> dy(e, 0.1f), db(norm_cols);
  cublasHandle_t h = nullptr;
  if (cublasCreate(&h) != CUBLAS_STATUS_SUCCESS) {
    state.SkipWithError("cublasCreate failed");
    return;
  }
  timed(state, [&] {
    weft::nn::kernels::linear_backward_weight<bf16>(h, nullptr, dy.p, nullptr, nullptr, db.p,
                                                    norm_rows, 0, norm_cols);
  });
  cublasDestroy(h);
  rate(state, "GB/s", 2.0 * static_cast<double>(e) * 1e-9);  // read dy
}
BENCHMARK(BM_linear_bias_grad_bf16)->UseManualTime()->Unit(benchmark::kMicrosecond);

// Baseline for the three above: the design they replaced, one thread per column walking every
// row (16 blocks at 4096 columns), on the same dy.
__global__ void column_sum_per_thread(bf16 const* __restrict__ dy, bf16* __restrict__ db,
                                      std::int64_t rows, std::int64_t cols) {
  std::int64_t const j = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (j >= cols) return;
  float acc = static_cast<float>(db[j]);
  for (std::int64_t r = 0; r < rows; ++r) acc += static_cast<float>(dy[r * cols + j]);
  db[j] = bf16(acc);
}
void BM_column_sum_one_thread_per_column_baseline(benchmark::State& state) {
  auto const e = static_cast<std::size_t>(norm_rows * norm_cols);
  dev<bf16> dy(e, 0.1f), db(norm_cols);
  timed(state, [&] {
    column_sum_per_thread<<<static_cast<unsigned>((norm_cols + 255) / 256), 256>>>(
        dy.p, db.p, norm_rows, norm_cols);
  });
  rate(state, "GB/s", 2.0 * static_cast<double>(e) * 1e-9);
}
BENCHMARK(BM_column_sum_one_thread_per_column_baseline)
    ->UseManualTime()
    ->Unit(benchmark::kMicrosecond);

// ---- linear (cuBLAS, bf16 8192^3) --------------------------------------------------------------

void BM_linear_forward_bf16(benchmark::State& state) {
  std::int64_t const n = state.range(0), in = n, out = n;
  auto const s = static_cast<std::size_t>(n);
  dev<bf16> x(s * s, -0.5f), w(s * s, -0.5f), y(s * s), bias(s);
  bool const with_bias = state.range(1) != 0;
  cublasHandle_t h = nullptr;
  WEFT_NN_CUBLAS_TRY(cublasCreate(&h));
  timed(state, [&] {
    weft::nn::kernels::linear_forward<bf16>(h, nullptr, x.p, w.p, with_bias ? bias.p : nullptr, y.p,
                                            n, in, out);
  });
  cublasDestroy(h);
  rate(state, "TFLOP/s", 2.0 * static_cast<double>(n * in) * static_cast<double>(out) * 1e-12);
}
BENCHMARK(BM_linear_forward_bf16)
    ->Args({8192, 0})
    ->Args({8192, 1})
    ->UseManualTime()
    ->Unit(benchmark::kMillisecond);

// The baseline: one cublasGemmEx, bf16 in and out, f32 compute, the forward's layout.
void BM_cublas_gemm_ex_bf16_baseline(benchmark::State& state) {
  std::int64_t const n = state.range(0);
  auto const s = static_cast<std::size_t>(n);
  dev<bf16> x(s * s, -0.5f), w(s * s, -0.5f), y(s * s);
  cublasHandle_t h = nullptr;
  WEFT_NN_CUBLAS_TRY(cublasCreate(&h));
  float const one = 1.0f, zero = 0.0f;
  int const d = static_cast<int>(n);
  timed(state, [&] {
    WEFT_NN_CUBLAS_TRY(cublasGemmEx(h, CUBLAS_OP_T, CUBLAS_OP_N, d, d, d, &one, w.p, CUDA_R_16BF, d,
                                    x.p, CUDA_R_16BF, d, &zero, y.p, CUDA_R_16BF, d,
                                    CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
  });
  cublasDestroy(h);
  rate(state, "TFLOP/s", 2.0 * static_cast<double>(n * n) * static_cast<double>(n) * 1e-12);
}
BENCHMARK(BM_cublas_gemm_ex_bf16_baseline)
    ->Arg(8192)
    ->UseManualTime()
    ->Unit(benchmark::kMillisecond);

}  // namespace

BENCHMARK_MAIN();
