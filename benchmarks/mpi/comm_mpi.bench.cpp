// benchmarks/mpi/comm_mpi.bench.cpp — Open MPI's own collectives (MPI_Allreduce, MPI_Allgather,
// MPI_Reduce_scatter_block, MPI_Alltoall) and an 8-byte MPI_Allreduce beside MPI_Barrier, with the
// sizes, nccl-tests formulas and memcpy baseline of benchmarks/comm.bench.cpp (read its header).
//
// Every process runs the same benchmarks with fixed iteration counts (Google Benchmark's adaptive
// count would differ between processes and deadlock the collectives). Each iteration: MPI_Barrier,
// time the call on every rank, MPI_Allreduce(MAX) of those times: the slowest rank's time is what
// is reported (manual time). Only rank 0 prints. The memcpy2 baseline here is two processes each
// copying S bytes at once, run only when the world has 2 ranks (it is the same physical baseline as
// the threads one). Run:
//   mpiexec -n 2 --oversubscribe --allow-run-as-root weft.bench.comm_mpi [--benchmark_filter=...]
#ifndef OMPI_SKIP_MPICXX
#define OMPI_SKIP_MPICXX 1  // the C API only: the deprecated C++ bindings warn under -Wextra
#endif
#include <mpi.h>

#include <benchmark/benchmark.h>

#include <algorithm>
#include <cstddef>
#include <cstdio>
#include <cstring>
#include <map>
#include <memory>
#include <string>
#include <vector>

namespace {

enum class coll { all_reduce, all_gather, reduce_scatter, all_to_all, memcpy2 };

int world_rank = 0;
int world_size = 1;

constexpr char const* name_of(coll c) {
  switch (c) {
    case coll::all_reduce: return "all_reduce";
    case coll::all_gather: return "all_gather";
    case coll::reduce_scatter: return "reduce_scatter";
    case coll::all_to_all: return "all_to_all";
    case coll::memcpy2: return "memcpy2";
  }
  return "?";
}

double bus_factor(coll c, int n) {
  double const p = n;
  if (c == coll::memcpy2) return 1.0;
  return c == coll::all_reduce ? 2.0 * (p - 1) / p : (p - 1) / p;
}

std::map<std::size_t, double>& memcpy2_best() {
  static std::map<std::size_t, double> m;
  return m;
}

// Iterations per size: about 0.5 GB moved per benchmark, at least 3, at most 2000.
long iterations_for(std::size_t bytes) {
  return std::clamp<long>(static_cast<long>((512ull << 20) / bytes), 3, 2000);
}

int checked(int rc, char const* what) {
  if (rc != MPI_SUCCESS) {
    std::fprintf(stderr, "%s failed with %d\n", what, rc);
    MPI_Abort(MPI_COMM_WORLD, 2);
  }
  return rc;
}

// Times f() on every rank after a barrier; returns the slowest rank's seconds.
template <class F>
double timed(F&& f) {
  checked(MPI_Barrier(MPI_COMM_WORLD), "MPI_Barrier");
  double const t0 = MPI_Wtime();
  f();
  double const mine = MPI_Wtime() - t0;
  double slowest = 0;
  checked(MPI_Allreduce(&mine, &slowest, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD), "MPI_Allreduce");
  return slowest;
}

void bm_mpi(benchmark::State& st, coll c) {
  int const n = world_size;
  auto const bytes = static_cast<std::size_t>(st.range(0));
  auto const big = bytes / sizeof(float);
  auto const small = big / static_cast<std::size_t>(n);
  std::size_t const in_count = c == coll::all_gather ? small : big;
  std::size_t const out_count = c == coll::reduce_scatter ? small : big;
  std::vector<float> in(in_count, float(world_rank + 1));
  std::vector<float> out(out_count, 0.0f);
  auto call = [&] {
    int const ic = static_cast<int>(in_count);
    int const sc = static_cast<int>(small);
    switch (c) {
      case coll::all_reduce:
        checked(MPI_Allreduce(in.data(), out.data(), ic, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD),
                "MPI_Allreduce");
        break;
      case coll::all_gather:
        checked(MPI_Allgather(in.data(), sc, MPI_FLOAT, out.data(), sc, MPI_FLOAT, MPI_COMM_WORLD),
                "MPI_Allgather");
        break;
      case coll::reduce_scatter:
        checked(
            MPI_Reduce_scatter_block(in.data(), out.data(), sc, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD),
            "MPI_Reduce_scatter_block");
        break;
      case coll::all_to_all:
        checked(MPI_Alltoall(in.data(), sc, MPI_FLOAT, out.data(), sc, MPI_FLOAT, MPI_COMM_WORLD),
                "MPI_Alltoall");
        break;
      case coll::memcpy2:
        std::memcpy(out.data(), in.data(), bytes);
        benchmark::ClobberMemory();
        break;
    }
  };
  timed(call);  // warm-up
  double total = 0;
  long count = 0;
  for (auto _ : st) {
    double const s = timed(call);
    st.SetIterationTime(s);
    total += s;
    ++count;
  }
  double const mean = total / double(count);
  if (c != coll::memcpy2) {
    float const want =
        c == coll::all_reduce || c == coll::reduce_scatter ? float(n * (n + 1) / 2) : float(n);
    if (out.back() != want) st.SkipWithError("wrong result");
  }
  double const f = bus_factor(c, n);
  st.counters["algbw_GBps"] =
      benchmark::Counter(double(bytes) / 1e9, benchmark::Counter::kIsIterationInvariantRate);
  st.counters["busbw_GBps"] =
      benchmark::Counter(double(bytes) * f / 1e9, benchmark::Counter::kIsIterationInvariantRate);
  // Ratios use mean times; the baseline is its lowest mean over this run's repetitions.
  if (c == coll::memcpy2) {
    auto& b = memcpy2_best()[bytes];
    b = b == 0 ? mean : std::min(b, mean);
  } else if (auto it = memcpy2_best().find(bytes); it != memcpy2_best().end()) {
    st.counters["vs_memcpy"] = f * it->second / mean;
  }
}

constexpr int latency_batch = 64;

std::map<int, double>& barrier_best() {
  static std::map<int, double> m;
  return m;
}

void bm_latency(benchmark::State& st, bool barrier) {
  float in[2] = {1.0f, 2.0f};
  float out[2] = {};
  auto call = [&] {
    for (int k = 0; k < latency_batch; ++k) {
      if (barrier)
        checked(MPI_Barrier(MPI_COMM_WORLD), "MPI_Barrier");
      else
        checked(MPI_Allreduce(in, out, 2, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD), "MPI_Allreduce");
    }
  };
  timed(call);
  double total = 0;
  long count = 0;
  for (auto _ : st) {
    double const s = timed(call) / latency_batch;
    st.SetIterationTime(s);
    total += s;
    ++count;
  }
  double const mean = total / double(count);
  if (barrier) {
    auto& b = barrier_best()[world_size];
    b = b == 0 ? mean : std::min(b, mean);
  } else if (auto it = barrier_best().find(world_size); it != barrier_best().end()) {
    st.counters["vs_barrier"] = mean / it->second;
  }
}

class null_reporter : public benchmark::BenchmarkReporter {
 public:
  bool ReportContext(Context const&) override { return true; }
  void ReportRuns(std::vector<Run> const&) override {}
};

void reg() {
  std::string const np = "/ranks:" + std::to_string(world_size);
  for (coll c : {coll::memcpy2, coll::all_reduce, coll::all_gather, coll::reduce_scatter,
                 coll::all_to_all}) {
    if (c == coll::memcpy2 && world_size != 2) continue;
    // One registration per size: fixed, size-dependent iteration counts, the same on every
    // process, so that every process makes the same calls.
    for (long s = 4L << 10; s <= 256L << 20; s *= 4)
      benchmark::RegisterBenchmark((std::string("mpi/") + name_of(c) + np).c_str(),
                                   [c](benchmark::State& st) { bm_mpi(st, c); })
          ->Arg(s)
          ->ArgNames({"bytes"})
          ->Iterations(iterations_for(static_cast<std::size_t>(s)))
          ->UseManualTime()
          ->Unit(benchmark::kMicrosecond);
  }
  benchmark::RegisterBenchmark(("mpi/barrier" + np).c_str(),
                               [](benchmark::State& st) { bm_latency(st, true); })
      ->UseManualTime()
      ->Iterations(2000)
      ->Unit(benchmark::kMicrosecond);
  benchmark::RegisterBenchmark(("mpi/all_reduce_8B" + np).c_str(),
                               [](benchmark::State& st) { bm_latency(st, false); })
      ->UseManualTime()
      ->Iterations(2000)
      ->Unit(benchmark::kMicrosecond);
}

}  // namespace

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  MPI_Comm_rank(MPI_COMM_WORLD, &world_rank);
  MPI_Comm_size(MPI_COMM_WORLD, &world_size);
  reg();
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) MPI_Abort(MPI_COMM_WORLD, 1);
  if (world_rank == 0) {
    benchmark::RunSpecifiedBenchmarks();
  } else {
    null_reporter quiet;
    benchmark::RunSpecifiedBenchmarks(&quiet);
  }
  benchmark::Shutdown();
  MPI_Finalize();
  return 0;
}
