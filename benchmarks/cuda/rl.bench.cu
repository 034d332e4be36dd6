// benchmarks/cuda/rl.bench.cu — the token log-prob kernels (weft/rl/cuda/logprobs.cuh) against the
// GPU's memory bandwidth: forward (reads the logits once) and backward (reads the logits, writes
// dlogits), bf16 and f32 logits, vocabularies of Llama 3 and Qwen 2.5; the baseline is a
// device-to-device cudaMemcpy in the same run (BM_memcpy_d2d). Counter GB/s: the bytes each kernel
// must move (read plus written; the copy's likewise) over its time, so kernel GB/s over the copy's
// is the fraction of the attainable bandwidth. Timed with CUDA events (manual time).
// Also GAE (weft/rl/cuda/returns.cuh: a block-wide reverse scan per row) over padded [rows, cols]
// f32 batches, with and without whitening, and masked whitening alone; their GB/s count the bytes
// a fused kernel must move (GAE: rewards, values and the byte mask read, advantages and returns
// written, 17 bytes a token; whitening: values and mask read, out written, 9 bytes), so the ratio
// to the copy also shows what the scans and the extra passes cost. BM_gae_thread_per_row is the
// design the scans replaced (rl::detail::gae_row on one thread per row), the baseline of the same
// run: few long rows are where it starves the GPU.
// And the sampler (weft/rl/cuda/sampling.cuh: a block per row) over bf16 logits of decoding batches
// of 64 and 256 rows, against the design it replaced in the same run (rl::detail::sample_row on one
// thread per row, BM_sample_thread_per_row); GB/s counts the logits read once.
#include <weft/core/dtype.hpp>
#include <weft/core/error.hpp>
#include <weft/core/random.hpp>
#include <weft/rl/cuda/logprobs.cuh>
#include <weft/rl/cuda/returns.cuh>
#include <weft/rl/cuda/sampling.cuh>

#include <benchmark/benchmark.h>
#include <cuda_runtime_api.h>

#include <cstdint>
#include <vector>

namespace {

namespace wk = weft::rl::kernels;

struct events {
  cudaEvent_t a{}, b{};
  events() {
    WEFT_CUDA_TRY(cudaEventCreate(&a));
    WEFT_CUDA_TRY(cudaEventCreate(&b));
  }
  ~events() {
    cudaEventDestroy(a);
    cudaEventDestroy(b);
  }
  double seconds() const {
    WEFT_CUDA_TRY(cudaEventSynchronize(b));
    float ms = 0;
    WEFT_CUDA_TRY(cudaEventElapsedTime(&ms, a, b));
    return ms * 1e-3;
  }
};

// One warm-up launch of run(), then each iteration's launches timed by events (manual time).
template <class Run>
void time_launches(benchmark::State& state, Run&& run) {
  run();
  WEFT_CUDA_TRY(cudaDeviceSynchronize());
  events ev;
  for (auto _ : state) {
    WEFT_CUDA_TRY(cudaEventRecord(ev.a));
    run();
    WEFT_CUDA_TRY(cudaEventRecord(ev.b));
    state.SetIterationTime(ev.seconds());
  }
  WEFT_CUDA_TRY(cudaGetLastError());
}

template <class T>
T* device_alloc(std::size_t n) {
  void* p = nullptr;
  WEFT_CUDA_TRY(cudaMalloc(&p, n * sizeof(T)));
  return static_cast<T*>(p);
}

// Logits filled on the host with values in [-4, 4) (a realistic spread; the kernels' cost does not
// depend on the values), targets spread over the vocabulary.
template <class L>
L* make_logits(std::int64_t tokens, std::int64_t vocab) {
  std::size_t const n = static_cast<std::size_t>(tokens * vocab);
  std::vector<L> h(n);
  std::uint64_t x = 88172645463325252ull;
  for (std::size_t i = 0; i < n; ++i) {
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    h[i] = static_cast<L>(static_cast<float>((x >> 40) % 8192) / 1024.0f - 4.0f);
  }
  L* d = device_alloc<L>(n);
  WEFT_CUDA_TRY(cudaMemcpy(d, h.data(), n * sizeof(L), cudaMemcpyHostToDevice));
  return d;
}

std::int32_t* make_targets(std::int64_t tokens, std::int64_t vocab) {
  std::vector<std::int32_t> h(static_cast<std::size_t>(tokens));
  for (std::int64_t k = 0; k < tokens; ++k)
    h[static_cast<std::size_t>(k)] = static_cast<std::int32_t>((k * 7919) % vocab);
  auto* d = device_alloc<std::int32_t>(h.size());
  WEFT_CUDA_TRY(cudaMemcpy(d, h.data(), h.size() * sizeof(std::int32_t), cudaMemcpyHostToDevice));
  return d;
}

void BM_memcpy_d2d(benchmark::State& state) {
  std::size_t const bytes = static_cast<std::size_t>(state.range(0)) << 20;
  auto* a = device_alloc<std::uint8_t>(bytes);
  auto* b = device_alloc<std::uint8_t>(bytes);
  events ev;
  for (auto _ : state) {
    WEFT_CUDA_TRY(cudaEventRecord(ev.a));
    WEFT_CUDA_TRY(cudaMemcpyAsync(b, a, bytes, cudaMemcpyDeviceToDevice));
    WEFT_CUDA_TRY(cudaEventRecord(ev.b));
    state.SetIterationTime(ev.seconds());
  }
  state.SetBytesProcessed(static_cast<std::int64_t>(state.iterations() * 2 * bytes));
  // read + write bytes per second, as the kernels' counters count them
  state.counters["GB/s"] = benchmark::Counter(static_cast<double>(2 * bytes) * 1e-9,
                                              benchmark::Counter::kIsIterationInvariantRate);
  cudaFree(a);
  cudaFree(b);
}

template <class L>
void BM_log_prob_forward(benchmark::State& state) {
  std::int64_t const tokens = state.range(0), vocab = state.range(1);
  L* z = make_logits<L>(tokens, vocab);
  std::int32_t* tgt = make_targets(tokens, vocab);
  float* logp = device_alloc<float>(static_cast<std::size_t>(tokens));
  float* ent = device_alloc<float>(static_cast<std::size_t>(tokens));
  float* lse = device_alloc<float>(static_cast<std::size_t>(tokens));
  weft::rl::logprob_options opt{};
  events ev;
  wk::log_prob_forward(nullptr, z, vocab, tgt, tokens, opt, logp, ent, lse);  // warm-up
  WEFT_CUDA_TRY(cudaDeviceSynchronize());
  for (auto _ : state) {
    WEFT_CUDA_TRY(cudaEventRecord(ev.a));
    wk::log_prob_forward(nullptr, z, vocab, tgt, tokens, opt, logp, ent, lse);
    WEFT_CUDA_TRY(cudaEventRecord(ev.b));
    state.SetIterationTime(ev.seconds());
  }
  WEFT_CUDA_TRY(cudaGetLastError());
  double const bytes = static_cast<double>(tokens) * static_cast<double>(vocab) * sizeof(L);
  state.counters["GB/s"] =
      benchmark::Counter(bytes * 1e-9, benchmark::Counter::kIsIterationInvariantRate);
  cudaFree(z);
  cudaFree(tgt);
  cudaFree(logp);
  cudaFree(ent);
  cudaFree(lse);
}

template <class L>
void BM_log_prob_backward(benchmark::State& state) {
  std::int64_t const tokens = state.range(0), vocab = state.range(1);
  L* z = make_logits<L>(tokens, vocab);
  L* dz = device_alloc<L>(static_cast<std::size_t>(tokens * vocab));
  std::int32_t* tgt = make_targets(tokens, vocab);
  float* logp = device_alloc<float>(static_cast<std::size_t>(tokens));
  float* ent = device_alloc<float>(static_cast<std::size_t>(tokens));
  float* lse = device_alloc<float>(static_cast<std::size_t>(tokens));
  float* g = device_alloc<float>(static_cast<std::size_t>(tokens));
  std::vector<float> ones(static_cast<std::size_t>(tokens), 1.0f);
  WEFT_CUDA_TRY(cudaMemcpy(g, ones.data(), ones.size() * sizeof(float), cudaMemcpyHostToDevice));
  weft::rl::logprob_options opt{};
  wk::log_prob_forward(nullptr, z, vocab, tgt, tokens, opt, logp, ent, lse);
  wk::log_prob_backward(nullptr, z, vocab, tgt, tokens, opt, lse, ent, g, g, dz);  // warm-up
  WEFT_CUDA_TRY(cudaDeviceSynchronize());
  events ev;
  for (auto _ : state) {
    WEFT_CUDA_TRY(cudaEventRecord(ev.a));
    wk::log_prob_backward(nullptr, z, vocab, tgt, tokens, opt, lse, ent, g, g, dz);
    WEFT_CUDA_TRY(cudaEventRecord(ev.b));
    state.SetIterationTime(ev.seconds());
  }
  WEFT_CUDA_TRY(cudaGetLastError());
  double const bytes = 2.0 * static_cast<double>(tokens) * static_cast<double>(vocab) * sizeof(L);
  state.counters["GB/s"] =
      benchmark::Counter(bytes * 1e-9, benchmark::Counter::kIsIterationInvariantRate);
  cudaFree(z);
  cudaFree(dz);
  cudaFree(tgt);
  cudaFree(logp);
  cudaFree(ent);
  cudaFree(lse);
  cudaFree(g);
}

// Rewards and values in [-1, 1), the last quarter of each row masked (padding).
struct token_data {
  float *rewards = nullptr, *values = nullptr, *adv = nullptr, *ret = nullptr;
  std::uint8_t* mask = nullptr;
  std::int64_t n = 0;
  token_data(std::int64_t rows, std::int64_t cols) : n(rows * cols) {
    std::vector<float> r(static_cast<std::size_t>(n)), v(r.size());
    std::vector<std::uint8_t> m(r.size());
    for (std::int64_t k = 0; k < n; ++k) {
      auto const i = static_cast<std::size_t>(k);
      r[i] = static_cast<float>((k * 7919) % 2000) / 1000.0f - 1.0f;
      v[i] = static_cast<float>((k * 104729) % 2000) / 1000.0f - 1.0f;
      m[i] = k % cols < cols - cols / 4 ? 1 : 0;
    }
    rewards = upload(r);
    values = upload(v);
    mask = upload(m);
    adv = device_alloc<float>(r.size());
    ret = device_alloc<float>(r.size());
  }
  template <class T>
  static T* upload(std::vector<T> const& h) {
    T* d = device_alloc<T>(h.size());
    WEFT_CUDA_TRY(cudaMemcpy(d, h.data(), h.size() * sizeof(T), cudaMemcpyHostToDevice));
    return d;
  }
  token_data(token_data const&) = delete;
  token_data& operator=(token_data const&) = delete;
  ~token_data() {
    cudaFree(rewards);
    cudaFree(values);
    cudaFree(adv);
    cudaFree(ret);
    cudaFree(mask);
  }
};

void BM_gae(benchmark::State& state) {
  std::int64_t const rows = state.range(0), cols = state.range(1);
  bool const whiten = state.range(2) != 0;
  token_data d(rows, cols);
  auto const layout = wk::device_rows::padded(rows, cols);
  weft::rl::gae_options const opt{0.99, 0.95, whiten};
  time_launches(state, [&] {
    wk::gae_advantages(nullptr, layout, d.rewards, d.values, d.mask, d.adv, d.ret, opt);
  });
  state.counters["GB/s"] = benchmark::Counter(17.0 * static_cast<double>(d.n) * 1e-9,
                                              benchmark::Counter::kIsIterationInvariantRate);
}

// The replaced design: one thread per row runs rl::detail::gae_row (no whitening).
__global__ void gae_thread_per_row(wk::device_rows rows, float const* __restrict__ rewards,
                                   float const* __restrict__ values,
                                   std::uint8_t const* __restrict__ mask, double gamma,
                                   double lambda, float* adv, float* ret) {
  std::int64_t const i = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= rows.rows) return;
  weft::rl::detail::gae_row(rows.begin(i), rows.end(i), rewards, values, mask, gamma, lambda, adv,
                            ret);
}

void BM_gae_thread_per_row(benchmark::State& state) {
  std::int64_t const rows = state.range(0), cols = state.range(1);
  token_data d(rows, cols);
  auto const layout = wk::device_rows::padded(rows, cols);
  auto const blocks = static_cast<unsigned>((rows + 255) / 256);
  auto const run = [&] {
    gae_thread_per_row<<<blocks, 256>>>(layout, d.rewards, d.values, d.mask, 0.99, 0.95, d.adv,
                                        d.ret);
  };
  time_launches(state, run);
  state.counters["GB/s"] = benchmark::Counter(17.0 * static_cast<double>(d.n) * 1e-9,
                                              benchmark::Counter::kIsIterationInvariantRate);
}

void BM_masked_whiten(benchmark::State& state) {
  std::int64_t const rows = state.range(0), cols = state.range(1);
  token_data d(rows, cols);
  time_launches(state, [&] {
    wk::masked_whiten(nullptr, static_cast<float const*>(d.values), d.mask, d.n, d.adv);
  });
  state.counters["GB/s"] = benchmark::Counter(9.0 * static_cast<double>(d.n) * 1e-9,
                                              benchmark::Counter::kIsIterationInvariantRate);
}

// Sampling: bf16 logits [rows, vocab], one coin a row; `block` the kernel of sampling.cuh, else the
// thread-per-row design it replaced.
__global__ void sample_thread_per_row(weft::bf16 const* __restrict__ logits, std::int64_t rows,
                                      weft::index_t vocab, weft::rng gen,
                                      std::uint64_t const* __restrict__ coins,
                                      weft::rl::token_sample* __restrict__ out) {
  std::int64_t const r = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (r >= rows) return;
  out[r] = weft::rl::detail::sample_row(logits + r * vocab, vocab, 1.0,
                                        gen.uniform_double(coins[r]), false);
}

template <bool Block>
void BM_sample(benchmark::State& state) {
  std::int64_t const rows = state.range(0), vocab = state.range(1);
  auto* z = make_logits<weft::bf16>(rows, vocab);
  std::vector<std::uint64_t> hc(static_cast<std::size_t>(rows));
  for (std::int64_t r = 0; r < rows; ++r) hc[static_cast<std::size_t>(r)] = 17 * r + 1;
  auto* coins = device_alloc<std::uint64_t>(hc.size());
  WEFT_CUDA_TRY(
      cudaMemcpy(coins, hc.data(), hc.size() * sizeof(std::uint64_t), cudaMemcpyHostToDevice));
  auto* out = device_alloc<weft::rl::token_sample>(hc.size());
  weft::rng const gen(7, 1);
  auto const run = [&] {
    if constexpr (Block) {
      wk::sample_tokens(nullptr, z, rows, vocab, gen, coins, out);
    } else {
      sample_thread_per_row<<<static_cast<unsigned>((rows + 127) / 128), 128>>>(z, rows, vocab, gen,
                                                                                coins, out);
    }
  };
  time_launches(state, run);
  state.counters["GB/s"] = benchmark::Counter(
      static_cast<double>(rows) * static_cast<double>(vocab) * sizeof(weft::bf16) * 1e-9,
      benchmark::Counter::kIsIterationInvariantRate);
  cudaFree(z);
  cudaFree(coins);
  cudaFree(out);
}
void BM_sample_block(benchmark::State& state) { BM_sample<true>(state); }
void BM_sample_thread_per_row(benchmark::State& state) { BM_sample<false>(state); }

void shapes(benchmark::internal::Benchmark* b) {
  b->Args({2048, 128256})->Args({2048, 151936})->Args({8192, 32000});
}

}  // namespace

BENCHMARK(BM_memcpy_d2d)->Arg(512)->Arg(1024)->UseManualTime()->Unit(benchmark::kMicrosecond);
BENCHMARK(BM_log_prob_forward<weft::bf16>)
    ->Apply(shapes)
    ->UseManualTime()
    ->Unit(benchmark::kMicrosecond);
BENCHMARK(BM_log_prob_forward<float>)
    ->Apply(shapes)
    ->UseManualTime()
    ->Unit(benchmark::kMicrosecond);
BENCHMARK(BM_log_prob_backward<weft::bf16>)
    ->Apply(shapes)
    ->UseManualTime()
    ->Unit(benchmark::kMicrosecond);
BENCHMARK(BM_log_prob_backward<float>)
    ->Apply(shapes)
    ->UseManualTime()
    ->Unit(benchmark::kMicrosecond);

// [rows, cols]: 1024 responses of 4096 tokens, 8192 of 512, 8 of 32768 and one of 262144;
// whitening off / on; the thread-per-row baseline at the same shapes.
BENCHMARK(BM_gae)
    ->Args({1024, 4096, 0})
    ->Args({1024, 4096, 1})
    ->Args({8192, 512, 0})
    ->Args({8192, 512, 1})
    ->Args({8, 32768, 0})
    ->Args({1, 262144, 0})
    ->UseManualTime()
    ->Unit(benchmark::kMicrosecond);
BENCHMARK(BM_gae_thread_per_row)
    ->Args({1024, 4096})
    ->Args({8192, 512})
    ->Args({8, 32768})
    ->Args({1, 262144})
    ->UseManualTime()
    ->Unit(benchmark::kMicrosecond);
BENCHMARK(BM_masked_whiten)
    ->Args({1024, 4096})
    ->Args({8192, 512})
    ->UseManualTime()
    ->Unit(benchmark::kMicrosecond);

// [rows, vocab]: decoding batches of 64 and 256 rows over the vocabularies of Qwen 2.5 and Llama 2.
BENCHMARK(BM_sample_block)
    ->Args({64, 151936})
    ->Args({256, 151936})
    ->Args({256, 32000})
    ->UseManualTime()
    ->Unit(benchmark::kMicrosecond);
BENCHMARK(BM_sample_thread_per_row)
    ->Args({64, 151936})
    ->Args({256, 151936})
    ->Args({256, 32000})
    ->UseManualTime()
    ->Unit(benchmark::kMicrosecond);

BENCHMARK_MAIN();
