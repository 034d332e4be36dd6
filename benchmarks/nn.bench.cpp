// Benchmarks of weft/nn: one training step (zero_grad, forward, backward, AdamW) of a GPT on one
// thread, in tokens per second: GPT-2 small (124M parameters: 12 layers, d 768, 12 heads, MLP
// 3072, vocabulary 50257, context 1024) on B = 4 sequences of T = 64 tokens, and a 2-layer d = 64
// model (4 heads, MLP 256, vocabulary 256, context 64) on the same 4 x 64 tokens, where per-call
// overhead rather than GEMM time decides. Beside them, in the same run, the sgemm of the 124M
// model's MLP shape ([256, 768] x [768, 3072]) gives the machine's single-thread GEMM rate, so
// the step's GEMM share can be read as a fraction of it. benchmarks/peers/gpt_torch.py times the
// same two models in PyTorch eager; run both with OPENBLAS_NUM_THREADS=1 (see RESULTS.md).
#include <weft/core/blas.hpp>
#include <weft/nn/gpt.hpp>
#include <weft/optim/adamw.hpp>

#include <benchmark/benchmark.h>

#include <cstdint>
#include <vector>

namespace {

using weft::index_t;
namespace nn = weft::nn;

nn::gpt_config gpt2_small() {
  nn::gpt_config c;
  c.vocab = 50257;
  c.context = 1024;
  c.d_model = 768;
  c.heads = 12;
  c.layers = 12;
  return c;
}

nn::gpt_config tiny() {
  nn::gpt_config c;
  c.vocab = 256;
  c.context = 64;
  c.d_model = 64;
  c.heads = 4;
  c.layers = 2;
  c.mlp_hidden = 256;
  return c;
}

// One model, its batch and optimizer; a step is what a training loop does per batch.
struct trainer {
  nn::gpt_config c;
  nn::param_store<float> store;
  nn::gpt<float> model;
  weft::optim::adamw<float> opt;
  std::vector<std::int32_t> tokens, positions, targets;
  std::vector<std::int64_t> cu{0};

  trainer(nn::gpt_config const& config, index_t batch, index_t seq)
      : c(config),
        store(nn::gpt_layout(config)),
        model(config, store),
        opt(store.layout().infos(), weft::optim::adamw_options{3e-4, 0.9, 0.95, 1e-8, 0.1}) {
    nn::gpt_init(store, c, 1);
    std::uint64_t h = 12345;
    for (index_t n = 0; n < batch; ++n) {
      for (index_t i = 0; i < seq; ++i) {
        h = h * 6364136223846793005ull + 1442695040888963407ull;
        tokens.push_back(
            static_cast<std::int32_t>((h >> 33) % static_cast<std::uint64_t>(c.vocab)));
        positions.push_back(static_cast<std::int32_t>(i));
      }
      cu.push_back((n + 1) * seq);
    }
    targets.assign(tokens.begin() + 1, tokens.end());
    targets.push_back(-1);
  }

  double step() {
    store.zero_grad();
    double const loss = model.forward({tokens, positions, targets, cu});
    model.backward();
    opt.step(store.params(), store.grads(), 3e-4);
    return loss;
  }
};

void run_steps(benchmark::State& state, nn::gpt_config const& c) {
  index_t const batch = 4, seq = 64;
  trainer t(c, batch, seq);
  t.step();  // warm-up: allocations, first touch of the optimizer state
  double loss = 0.0;
  for (auto _ : state) {
    loss = t.step();
    benchmark::DoNotOptimize(loss);
  }
  state.counters["tokens_per_s"] = benchmark::Counter(
      static_cast<double>(batch * seq), benchmark::Counter::kIsIterationInvariantRate);
  state.counters["params_M"] = static_cast<double>(t.store.layout().size()) / 1e6;
  state.counters["loss"] = loss;
}

void bm_gpt2_small_step(benchmark::State& state) { run_steps(state, gpt2_small()); }
void bm_tiny_step(benchmark::State& state) { run_steps(state, tiny()); }

#if WEFT_HAS_BLAS
// The single-thread sgemm baseline: C [256, 3072] += A [256, 768] · B [768, 3072].
void bm_sgemm_baseline(benchmark::State& state) {
  index_t const m = 256, k = 768, n = 3072;
  std::vector<float> a(static_cast<std::size_t>(m * k), 0.5f),
      b(static_cast<std::size_t>(k * n), 0.25f), c(static_cast<std::size_t>(m * n), 0.0f);
  for (auto _ : state) {
    weft::blas::gemm(weft::blas::op::none, weft::blas::op::none, m, n, k, 1.0f, a.data(), k,
                     b.data(), n, 0.0f, c.data(), n);
    benchmark::DoNotOptimize(c.data());
  }
  state.counters["GFLOP_per_s"] = benchmark::Counter(2.0 * static_cast<double>(m * n * k),
                                                     benchmark::Counter::kIsIterationInvariantRate,
                                                     benchmark::Counter::kIs1000);
}
BENCHMARK(bm_sgemm_baseline)->Unit(benchmark::kMillisecond)->MinTime(1.0);
#endif

}  // namespace

BENCHMARK(bm_tiny_step)->Unit(benchmark::kMillisecond)->MinTime(2.0);
BENCHMARK(bm_gpt2_small_step)->Unit(benchmark::kSecond)->Iterations(3);

BENCHMARK_MAIN();
