// Benchmarks of weft/rl: fused log-prob + entropy forward and backward over logits (V = 32k,
// 128k, 152k; f32 and bf16) and the policy loss forward+backward over 1M tokens, in GB/s, each
// beside a memcpy of the same bytes in the same run. Single-threaded: these kernels are
// memory-bound, so the figure of merit is the fraction of memcpy bandwidth they reach.
#include <weft/rl/aggregation.hpp>
#include <weft/rl/logprobs.hpp>
#include <weft/rl/policy_loss.hpp>

#include <benchmark/benchmark.h>

#include <cstdint>
#include <cstring>
#include <random>
#include <string>
#include <vector>

namespace {

using weft::index_t;

// Which multiversioned path the run took (0 SSE2 baseline, 1 AVX2+FMA, 2 AVX-512).
std::string simd_label() {
  static char const* const names[] = {"sse2", "avx2", "avx512"};
  return names[static_cast<int>(weft::rl::detail::host_simd_level())];
}

// Enough tokens that the logits (about 80 MB) do not fit any cache.
index_t tokens_for(index_t vocab) { return (index_t{20} << 20) / vocab; }

template <class L>
std::vector<L> make_logits(std::size_t n) {
  std::mt19937 gen(1);
  std::normal_distribution<float> nd(0.0f, 2.0f);
  std::vector<L> z(n);
  for (auto& x : z) x = static_cast<L>(nd(gen));
  return z;
}

// Bytes: logits read once plus dlogits written once (the fused sweep re-reads each row from cache).
template <class L>
void bm_logprob_fwd_bwd(benchmark::State& state) {
  index_t const V = state.range(0);
  index_t const T = tokens_for(V);
  auto const z = make_logits<L>(static_cast<std::size_t>(T * V));
  std::vector<L> dz(z.size());
  std::vector<std::int64_t> tgt(static_cast<std::size_t>(T));
  for (index_t t = 0; t < T; ++t) tgt[static_cast<std::size_t>(t)] = (t * 7919) % V;
  std::vector<float> lp(static_cast<std::size_t>(T)), h(lp.size());
  for (auto _ : state) {
    weft::rl::log_prob_fused(
        std::span<L const>(z), V, std::span<std::int64_t const>(tgt), {}, std::span<float>(lp),
        std::span<float>(h),
        [](index_t, float logp, float) {
          return weft::rl::logprob_grads{-0.5 * logp, 0.01};
        },
        std::span<L>(dz));
    benchmark::DoNotOptimize(dz.data());
    benchmark::ClobberMemory();
  }
  state.SetBytesProcessed(state.iterations() * static_cast<std::int64_t>(2 * z.size() * sizeof(L)));
  state.counters["tokens"] = static_cast<double>(T);
  state.SetLabel(simd_label());
}

template <class L>
void bm_logprob_memcpy(benchmark::State& state) {
  index_t const V = state.range(0);
  index_t const T = tokens_for(V);
  auto const z = make_logits<L>(static_cast<std::size_t>(T * V));
  std::vector<L> dz(z.size());
  for (auto _ : state) {
    std::memcpy(dz.data(), z.data(), z.size() * sizeof(L));
    benchmark::DoNotOptimize(dz.data());
    benchmark::ClobberMemory();
  }
  state.SetBytesProcessed(state.iterations() * static_cast<std::int64_t>(2 * z.size() * sizeof(L)));
}

BENCHMARK(bm_logprob_fwd_bwd<float>)
    ->Arg(32768)
    ->Arg(131072)
    ->Arg(151936)
    ->Unit(benchmark::kMillisecond);
BENCHMARK(bm_logprob_memcpy<float>)
    ->Arg(32768)
    ->Arg(131072)
    ->Arg(151936)
    ->Unit(benchmark::kMillisecond);
BENCHMARK(bm_logprob_fwd_bwd<weft::bf16>)->Arg(32768)->Arg(151936)->Unit(benchmark::kMillisecond);
BENCHMARK(bm_logprob_memcpy<weft::bf16>)->Arg(32768)->Arg(151936)->Unit(benchmark::kMillisecond);

struct loss_inputs {
  weft::rl::token_layout layout;
  std::vector<float> logp, old, adv, w, dlogp;
  std::vector<std::uint8_t> mask;
};

loss_inputs make_loss_inputs(index_t rows, index_t cols) {
  loss_inputs in;
  in.layout = weft::rl::token_layout::padded(rows, cols);
  auto const n = static_cast<std::size_t>(rows * cols);
  std::mt19937 gen(2);
  std::uniform_real_distribution<float> u(0.0f, 1.0f);
  in.logp.resize(n);
  in.old.resize(n);
  in.adv.resize(n);
  in.w.resize(n);
  in.dlogp.resize(n);
  in.mask.resize(n);
  for (std::size_t k = 0; k < n; ++k) {
    in.old[k] = -3.0f * u(gen);
    in.logp[k] = in.old[k] + 0.4f * (u(gen) - 0.5f);
    in.adv[k] = u(gen) - 0.5f;
    in.mask[k] = u(gen) < 0.9f ? 1 : 0;
  }
  auto const c = weft::rl::count_tokens(in.layout, std::span<std::uint8_t const>(in.mask));
  weft::rl::aggregation_weights(weft::rl::loss_agg::token_mean, in.layout,
                                std::span<std::uint8_t const>(in.mask), c, std::span<float>(in.w));
  return in;
}

// Bytes: logp, old logp, advantages, weights (4 each), mask (1) read; dlogp (4) written.
constexpr std::int64_t loss_bytes_per_token = 4 * 4 + 1 + 4;

void bm_policy_loss(benchmark::State& state) {
  auto in = make_loss_inputs(1024, 1024);
  weft::rl::policy_loss_config cfg;
  cfg.kind = static_cast<weft::rl::policy_loss_kind>(state.range(0));
  for (auto _ : state) {
    auto r =
        weft::rl::policy_loss(cfg, in.layout,
                              weft::rl::policy_inputs<float, std::uint8_t>{
                                  weft::rl::arg::new_logp{in.logp}, weft::rl::arg::old_logp{in.old},
                                  weft::rl::arg::advantages{in.adv}, weft::rl::arg::mask{in.mask},
                                  weft::rl::arg::weights{in.w}},
                              std::span<float>(in.dlogp));
    benchmark::DoNotOptimize(r);
    benchmark::ClobberMemory();
  }
  state.SetBytesProcessed(state.iterations() * loss_bytes_per_token * (1 << 20));
  state.SetLabel(std::string(weft::rl::to_string(cfg.kind)) + " " + simd_label());
}

void bm_policy_loss_memcpy(benchmark::State& state) {
  std::vector<char> src(static_cast<std::size_t>(loss_bytes_per_token * (1 << 20) / 2)),
      dst(src.size());
  std::memset(src.data(), 1, src.size());
  for (auto _ : state) {
    std::memcpy(dst.data(), src.data(), src.size());
    benchmark::DoNotOptimize(dst.data());
    benchmark::ClobberMemory();
  }
  state.SetBytesProcessed(state.iterations() * static_cast<std::int64_t>(2 * src.size()));
}

BENCHMARK(bm_policy_loss)->Arg(0)->Arg(1)->Arg(2)->Unit(benchmark::kMillisecond);
BENCHMARK(bm_policy_loss_memcpy)->Unit(benchmark::kMillisecond);

}  // namespace

BENCHMARK_MAIN();
