// benchmarks/cuda/flash.bench.cu — the CUDA flash-attention kernels (weft/attention/cuda/flash.cuh)
// on bf16: forward and backward at B = 4, S = 4096, H = 16, d = 128 and d = 64, causal and not.
// Timed with CUDA events around each call (manual time). Counters: TFLOP/s with the usual
// convention, forward 4·B·H·S²·d (halved for causal), backward 2.5x the forward; the backward
// time includes its D = rowsum(dO∘O) pre-pass. Each kernel set runs, chosen explicitly (wgmma = 0:
// mma_sync, 1: flash_kernel::wgmma, 2: wgmma_ws, 4: wgmma_tma; the Hopper sets skipped
// with the reason elsewhere), and the default, flash_kernel::automatic (wgmma = 3: the faster
// Hopper kernel of each pass and head dimension where they run, mma_sync elsewhere).
#include <weft/attention/cuda/flash.cuh>

#include <benchmark/benchmark.h>
#include <cuda_runtime_api.h>

#include <cstdint>
#include <exception>
#include <vector>

namespace {

namespace wa = weft::attention;
namespace wk = weft::attention::kernels;
namespace wd = weft::attention::detail;
using weft::bf16;

template <class T>
T* device_alloc(std::size_t n) {
  T* p = nullptr;
  WEFT_CUDA_TRY(cudaMalloc(reinterpret_cast<void**>(&p), n * sizeof(T)));
  return p;
}

bf16* device_random(std::size_t n, std::uint64_t seed) {
  std::vector<bf16> h(n);
  std::uint64_t x = seed * 0x9E3779B97F4A7C15ull + 1;
  for (auto& e : h) {
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    e = bf16(float(double(x >> 11) * 0x1p-53 * 2.0 - 1.0));
  }
  bf16* p = device_alloc<bf16>(n);
  WEFT_CUDA_TRY(cudaMemcpy(p, h.data(), n * sizeof(bf16), cudaMemcpyHostToDevice));
  return p;
}

// Args: batch, seq, heads, head dim, causal (0/1), backward (0/1), kernels (0 mma.sync, 1 wgmma,
// 2 wgmma_ws: the warp-specialised forward and the two-warpgroup backward, 3 automatic, 4
// wgmma_tma: the TMA forward with ping-pong and the TMA two-warpgroup backward; 1, 2 and 4 skipped
// with an error where they cannot run).
void BM_flash(benchmark::State& state) {
  std::int64_t const b = state.range(0), s = state.range(1), h = state.range(2), d = state.range(3);
  bool const causal = state.range(4) != 0, backward = state.range(5) != 0;
  auto const kernel = state.range(6) == 4   ? wk::flash_kernel::wgmma_tma
                      : state.range(6) == 3 ? wk::flash_kernel::automatic
                      : state.range(6) == 2 ? wk::flash_kernel::wgmma_ws
                      : state.range(6) == 1 ? wk::flash_kernel::wgmma
                                            : wk::flash_kernel::mma_sync;
  try {
    wk::set_flash_kernel(kernel);
  } catch (std::exception const& e) {
    state.SkipWithError(e.what());
    return;
  }
  std::size_t const n = static_cast<std::size_t>(b * s * h * d);
  bf16* q = device_random(n, 1);
  bf16* k = device_random(n, 2);
  bf16* v = device_random(n, 3);
  bf16* g = device_random(n, 4);
  bf16* o = device_alloc<bf16>(n);
  float* lse = device_alloc<float>(static_cast<std::size_t>(b * h * s));
  float* dq = device_alloc<float>(n);
  float* dk = device_alloc<float>(n);
  float* dv = device_alloc<float>(n);
  WEFT_CUDA_TRY(cudaMemset(dq, 0, n * sizeof(float)));
  WEFT_CUDA_TRY(cudaMemset(dk, 0, n * sizeof(float)));
  WEFT_CUDA_TRY(cudaMemset(dv, 0, n * sizeof(float)));
  cudaStream_t stream = nullptr;
  WEFT_CUDA_TRY(cudaStreamCreate(&stream));
  auto const cq = wd::contiguous_bshd(static_cast<bf16 const*>(q), b, s, h, d);
  auto const ck = wd::contiguous_bshd(static_cast<bf16 const*>(k), b, s, h, d);
  auto const cv = wd::contiguous_bshd(static_cast<bf16 const*>(v), b, s, h, d);
  auto const cg = wd::contiguous_bshd(static_cast<bf16 const*>(g), b, s, h, d);
  auto const mask = wa::make_mask(causal ? wa::causal_mode::top_left : wa::causal_mode::none, s, s);
  float const scale = float(wa::resolve_scale(0.0, d));
  auto const fwd = [&] {
    wk::flash_forward<bf16, bf16>(stream, cq, ck, cv, wd::contiguous_bshd(o, b, s, h, d),
                                  wd::contiguous_bhs(lse, b, h, s), mask, scale);
  };
  auto const bwd = [&] {
    wk::flash_backward_accumulate<bf16, bf16>(
        stream, cq, ck, cv, wd::contiguous_bshd(static_cast<bf16 const*>(o), b, s, h, d),
        wd::contiguous_bhs(static_cast<float const*>(lse), b, h, s), cg,
        wd::contiguous_bshd(dq, b, s, h, d), wd::contiguous_bshd(dk, b, s, h, d),
        wd::contiguous_bshd(dv, b, s, h, d), mask, scale);
  };
  fwd();  // warm-up (and the o, lse the backward reads)
  if (backward) bwd();
  WEFT_CUDA_TRY(cudaStreamSynchronize(stream));
  cudaEvent_t e0, e1;
  WEFT_CUDA_TRY(cudaEventCreate(&e0));
  WEFT_CUDA_TRY(cudaEventCreate(&e1));
  double total_s = 0.0;
  for (auto _ : state) {
    WEFT_CUDA_TRY(cudaEventRecord(e0, stream));
    if (backward)
      bwd();
    else
      fwd();
    WEFT_CUDA_TRY(cudaEventRecord(e1, stream));
    WEFT_CUDA_TRY(cudaEventSynchronize(e1));
    float ms = 0.0f;
    WEFT_CUDA_TRY(cudaEventElapsedTime(&ms, e0, e1));
    state.SetIterationTime(double(ms) * 1e-3);
    total_s += double(ms) * 1e-3;
  }
  double const fwd_flops =
      4.0 * double(b) * double(h) * double(s) * double(s) * double(d) * (causal ? 0.5 : 1.0);
  double const flops = fwd_flops * (backward ? 2.5 : 1.0);
  if (total_s > 0.0)
    state.counters["TFLOP/s"] = flops * double(state.iterations()) / total_s * 1e-12;
  state.counters["ms"] = total_s * 1e3 / double(state.iterations());
  WEFT_CUDA_TRY(cudaEventDestroy(e0));
  WEFT_CUDA_TRY(cudaEventDestroy(e1));
  WEFT_CUDA_TRY(cudaStreamDestroy(stream));
  for (void* p : {static_cast<void*>(q), static_cast<void*>(k), static_cast<void*>(v),
                  static_cast<void*>(g), static_cast<void*>(o), static_cast<void*>(lse),
                  static_cast<void*>(dq), static_cast<void*>(dk), static_cast<void*>(dv)})
    WEFT_CUDA_TRY(cudaFree(p));
  wk::set_flash_kernel(wk::flash_kernel::automatic);
}

}  // namespace

BENCHMARK(BM_flash)
    ->ArgNames({"B", "S", "H", "d", "causal", "bwd", "wgmma"})
    ->Args({4, 4096, 16, 128, 1, 0, 0})
    ->Args({4, 4096, 16, 128, 0, 0, 0})
    ->Args({4, 4096, 16, 64, 1, 0, 0})
    ->Args({4, 4096, 16, 64, 0, 0, 0})
    ->Args({4, 4096, 16, 128, 1, 1, 0})
    ->Args({4, 4096, 16, 128, 0, 1, 0})
    ->Args({4, 4096, 16, 64, 1, 1, 0})
    ->Args({4, 4096, 16, 64, 0, 1, 0})
    ->Args({4, 4096, 16, 128, 1, 0, 1})
    ->Args({4, 4096, 16, 128, 0, 0, 1})
    ->Args({4, 4096, 16, 64, 1, 0, 1})
    ->Args({4, 4096, 16, 64, 0, 0, 1})
    ->Args({4, 4096, 16, 128, 1, 1, 1})
    ->Args({4, 4096, 16, 128, 0, 1, 1})
    ->Args({4, 4096, 16, 64, 1, 1, 1})
    ->Args({4, 4096, 16, 64, 0, 1, 1})
    ->Args({4, 4096, 16, 128, 1, 0, 2})
    ->Args({4, 4096, 16, 128, 0, 0, 2})
    ->Args({4, 4096, 16, 64, 1, 0, 2})
    ->Args({4, 4096, 16, 64, 0, 0, 2})
    ->Args({4, 4096, 16, 128, 1, 1, 2})
    ->Args({4, 4096, 16, 128, 0, 1, 2})
    ->Args({4, 4096, 16, 64, 1, 1, 2})
    ->Args({4, 4096, 16, 64, 0, 1, 2})
    ->Args({4, 4096, 16, 128, 1, 0, 3})
    ->Args({4, 4096, 16, 128, 0, 0, 3})
    ->Args({4, 4096, 16, 64, 1, 0, 3})
    ->Args({4, 4096, 16, 64, 0, 0, 3})
    ->Args({4, 4096, 16, 128, 1, 1, 3})
    ->Args({4, 4096, 16, 128, 0, 1, 3})
    ->Args({4, 4096, 16, 64, 1, 1, 3})
    ->Args({4, 4096, 16, 64, 0, 1, 3})
    ->Args({4, 4096, 16, 128, 1, 0, 4})  // wgmma_tma
    ->Args({4, 4096, 16, 128, 0, 0, 4})
    ->Args({4, 4096, 16, 64, 1, 0, 4})
    ->Args({4, 4096, 16, 64, 0, 0, 4})
    ->Args({4, 4096, 16, 128, 1, 1, 4})
    ->Args({4, 4096, 16, 128, 0, 1, 4})
    ->Args({4, 4096, 16, 64, 1, 1, 4})
    ->Args({4, 4096, 16, 64, 0, 1, 4})
    ->UseManualTime()
    ->Unit(benchmark::kMillisecond)
    ->MinTime(0.3);

BENCHMARK_MAIN();
