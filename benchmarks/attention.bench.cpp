// benchmarks/attention.bench.cpp — CPU attention throughput: local flash forward and
// forward+backward GFLOP/s (forward 4·S²·H·D, forward+backward 14·S²·H·D, halved when causal) at
// S = 2k, 4k, 8k and d = 64, 128 beside sgemm in the same run; ring and Ulysses at 1 and 2 ranks
// beside the same run's sgemm scaling from 1 to 2 threads.
//
// Build with BLAS for the reference numbers (-DWEFT_HAS_BLAS=1 and -lopenblas); without it the
// tiles use weft's portable loops and "sgemm" is the same loops, so ratios stay meaningful.
// Figures: benchmarks/RESULTS.md. Run e.g.
//   weft.bench.attention --benchmark_filter='flash|sgemm' --benchmark_min_time=1
#include <weft/attention/flash.hpp>
#include <weft/attention/sharding.hpp>
#include <weft/attention/ring.hpp>
#include <weft/attention/ulysses.hpp>
#include <weft/comm/threads/world.hpp>
#include <weft/core/tensor.hpp>

#include <benchmark/benchmark.h>

#include <cstdint>
#include <thread>
#include <vector>

namespace {

namespace wa = weft::attention;
namespace wt = weft::comm::threads;

void single_threaded_blas() {
#if WEFT_HAS_BLAS && defined(OPENBLAS_VERSION)
  openblas_set_num_threads(1);  // ranks and benchmark threads bring their own parallelism
#endif
}

std::vector<float> filled(std::size_t n, std::uint32_t seed) {
  std::vector<float> v(n);
  std::uint32_t x = seed * 2654435761u + 1u;
  for (auto& e : v) {
    x = x * 1664525u + 1013904223u;
    e = float(x >> 8) * 0x1p-24f * 2.0f - 1.0f;
  }
  return v;
}

template <std::size_t R>
weft::tensor_view<float, R> view(std::vector<float>& v, std::array<std::int64_t, R> e) {
  return std::apply([&](auto... x) { return weft::tensor_view<float, R>(v.data(), x...); }, e);
}

// C[m×n] = A[m×k]·B[k×n] in f32: cblas_sgemm with BLAS, weft's register-blocked loops without.
void sgemm(std::int64_t m, std::int64_t n, std::int64_t k, float const* a, float const* b,
           float* c) {
#if WEFT_HAS_BLAS
  cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, int(m), int(n), int(k), 1.0f, a, int(k), b,
              int(n), 0.0f, c, int(n));
#else
  wa::detail::gemm_nn_loops(m, n, k, a, k, b, n, c, n, false);
#endif
}

// The sgemm rate of this machine and build: n×n×n, 2n³ FLOP per iteration.
void bm_sgemm(benchmark::State& st) {
  single_threaded_blas();
  std::int64_t const n = st.range(0);
  auto a = filled(std::size_t(n * n), 1), b = filled(std::size_t(n * n), 2);
  std::vector<float> c(std::size_t(n * n));
  for (auto _ : st) {
    sgemm(n, n, n, a.data(), b.data(), c.data());
    benchmark::DoNotOptimize(c.data());
  }
  st.counters["GFLOP/s"] = benchmark::Counter(2.0 * double(n) * double(n) * double(n) * 1e-9,
                                              benchmark::Counter::kIsIterationInvariantRate);
}
// Single-threaded cases report rates per CPU second (the default), which stays meaningful on a
// shared, oversubscribed machine; the multi-threaded ones below use wall time.
BENCHMARK(bm_sgemm)->Arg(1024)->Arg(2048)->Unit(benchmark::kMillisecond);

// `threads` threads each run an independent n³ sgemm at once: the machine's parallel sgemm rate,
// the yardstick for the ring/Ulysses speedups below.
void bm_sgemm_threads(benchmark::State& st) {
  single_threaded_blas();
  std::int64_t const n = st.range(0);
  int const threads = int(st.range(1));
  std::vector<std::vector<float>> a, b, c;
  for (int t = 0; t < threads; ++t) {
    a.push_back(filled(std::size_t(n * n), 1));
    b.push_back(filled(std::size_t(n * n), 2));
    c.emplace_back(std::size_t(n * n));
  }
  for (auto _ : st) {
    std::vector<std::thread> pool;
    for (int t = 0; t < threads; ++t)
      pool.emplace_back([&, t] {
        sgemm(n, n, n, a[std::size_t(t)].data(), b[std::size_t(t)].data(),
              c[std::size_t(t)].data());
      });
    for (auto& p : pool) p.join();
  }
  st.counters["GFLOP/s"] =
      benchmark::Counter(2.0 * double(threads) * double(n) * double(n) * double(n) * 1e-9,
                         benchmark::Counter::kIsIterationInvariantRate);
}
BENCHMARK(bm_sgemm_threads)
    ->Args({1024, 1})
    ->Args({1024, 2})
    ->Unit(benchmark::kMillisecond)
    ->UseRealTime();

struct problem {
  std::int64_t s, h, d;
  std::vector<float> q, k, v, g, o, l, dq, dk, dv;
  problem(std::int64_t s_, std::int64_t h_, std::int64_t d_)
      : s(s_),
        h(h_),
        d(d_),
        q(filled(std::size_t(s * h * d), 1)),
        k(filled(q.size(), 2)),
        v(filled(q.size(), 3)),
        g(filled(q.size(), 4)),
        o(q.size()),
        l(std::size_t(s * h)),
        dq(q.size()),
        dk(q.size()),
        dv(q.size()) {}
  weft::tensor_view<float, 4> t(std::vector<float>& x) { return view<4>(x, {1, s, h, d}); }
  weft::tensor_view<float, 3> lse() { return view<3>(l, {1, h, s}); }
};

// args: S, d, causal, backward. H = 4 heads (so S = 8k, d = 128 stays under a second per call).
void bm_flash(benchmark::State& st) {
  single_threaded_blas();
  std::int64_t const s = st.range(0), d = st.range(1), h = 4;
  bool const causal = st.range(2) != 0, backward = st.range(3) != 0;
  problem p(s, h, d);
  wa::attention_options const opt{0.0, causal ? wa::causal_mode::top_left : wa::causal_mode::none,
                                  1};
  wa::flash_forward(p.t(p.q), p.t(p.k), p.t(p.v), p.t(p.o), p.lse(), opt);
  for (auto _ : st) {
    wa::flash_forward(p.t(p.q), p.t(p.k), p.t(p.v), p.t(p.o), p.lse(), opt);
    if (backward)
      wa::flash_backward(p.t(p.q), p.t(p.k), p.t(p.v), p.t(p.o), p.lse(), p.t(p.g), p.t(p.dq),
                         p.t(p.dk), p.t(p.dv), opt);
    benchmark::DoNotOptimize(p.o.data());
  }
  double const fwd = 4.0 * double(s) * double(s) * double(h) * double(d) * (causal ? 0.5 : 1.0);
  st.counters["GFLOP/s"] = benchmark::Counter((backward ? 3.5 : 1.0) * fwd * 1e-9,
                                              benchmark::Counter::kIsIterationInvariantRate);
}
BENCHMARK(bm_flash)
    ->ArgNames({"S", "d", "causal", "bwd"})
    ->ArgsProduct({{2048, 4096, 8192}, {64, 128}, {0, 1}, {0, 1}})
    ->Unit(benchmark::kMillisecond);

// Ring (args: ranks, layout 0 = contiguous non-causal, 1 = zigzag causal) and Ulysses (layout 2,
// non-causal) forward+backward on the threads backend, S = 4096, H = 4, d = 64. Compare the
// 2-rank speedup with bm_sgemm_threads' 1 -> 2 thread scaling.
void bm_sequence_parallel(benchmark::State& st) {
  single_threaded_blas();
  int const n = int(st.range(0));
  int const scheme = int(st.range(1));
  std::int64_t const s = 4096, h = 4, d = 64, c = s / n;
  bool const causal = scheme == 1;
  wa::attention_options const opt{0.0, causal ? wa::causal_mode::top_left : wa::causal_mode::none,
                                  1};
  auto const lay = causal ? wa::seq_layout::zigzag(n, s) : wa::seq_layout::contiguous(n, s);
  std::vector<problem> shards;
  for (int r = 0; r < n; ++r) shards.emplace_back(c, h, d);
  wt::world world(n);
  for (auto _ : st) {
    world.run([&](wt::communicator& comm) {
      auto& p = shards[std::size_t(comm.rank())];
      if (scheme == 2) {
        wa::ulysses_forward(comm, p.t(p.q), p.t(p.k), p.t(p.v), p.t(p.o), p.lse(), opt);
        wa::ulysses_backward(comm, p.t(p.q), p.t(p.k), p.t(p.v), p.t(p.o), p.lse(), p.t(p.g),
                             p.t(p.dq), p.t(p.dk), p.t(p.dv), opt);
      } else {
        wa::ring_forward(comm, lay, p.t(p.q), p.t(p.k), p.t(p.v), p.t(p.o), p.lse(), opt);
        wa::ring_backward(comm, lay, p.t(p.q), p.t(p.k), p.t(p.v), p.t(p.o), p.lse(), p.t(p.g),
                          p.t(p.dq), p.t(p.dk), p.t(p.dv), opt);
      }
    });
  }
  double const fwd = 4.0 * double(s) * double(s) * double(h) * double(d) * (causal ? 0.5 : 1.0);
  st.counters["GFLOP/s"] =
      benchmark::Counter(3.5 * fwd * 1e-9, benchmark::Counter::kIsIterationInvariantRate);
}
BENCHMARK(bm_sequence_parallel)
    ->ArgNames({"ranks", "scheme"})
    ->ArgsProduct({{1, 2}, {0, 1, 2}})
    ->Unit(benchmark::kMillisecond)
    ->UseRealTime();

}  // namespace

BENCHMARK_MAIN();
