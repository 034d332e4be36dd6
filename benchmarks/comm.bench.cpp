// benchmarks/comm.bench.cpp — threads-backend collectives: algorithm and bus bandwidth (nccl-tests
// formulas) of all_reduce, all_gather, reduce_scatter and all_to_all from 4 KiB to 256 MiB at 2 and
// 4 ranks beside two concurrent single-thread memcpys of the same size; 8-byte all_reduce latency
// beside a std::barrier round trip, and the same through comm::monitored (straggler detection on);
// the data-parallel optimizer step, replicated AdamW against ZeRO-1 (bm_dp_step).
// The Open MPI twin is benchmarks/mpi/comm_mpi.bench.cpp.
//
// Ranks are threads: rank 0 is the benchmark's own thread, ranks 1..n-1 are helpers. Every
// iteration starts all ranks together (a std::barrier whose completion stamps t0), runs one
// collective (or a batch of small ones), and is charged max over ranks of (end_r - t0): the
// slowest rank, from a common start (UseManualTime). The synchronising barriers are not timed.
//
// Sizes S follow nccl-tests (reference/collectives_mesh.md §2.7): all_reduce and all_to_all move
// S-byte buffers per rank, all_gather produces S bytes per rank from S/n, reduce_scatter reduces S
// bytes per rank into S/n. algbw = S/t; busbw = algbw·2(n-1)/n (all_reduce) or algbw·(n-1)/n.
// vs_memcpy = busbw / (S / t_memcpy2), where t_memcpy2 is the slowest of two threads each copying
// S bytes at the same time (the physical baseline; at p = 2 an RS+AG all_reduce moves the same
// bytes per rank as one such memcpy, so vs_memcpy is then the time ratio t_memcpy2 / t).
// Figures and commands: benchmarks/RESULTS.comm.md. Run e.g.
//   weft.bench.comm --benchmark_filter='all_reduce/ranks:2/bytes:67108864|memcpy2/bytes:67108864'
//                   --benchmark_repetitions=5
#include <weft/comm/concepts.hpp>
#include <weft/comm/monitored.hpp>
#include <weft/comm/threads/communicator.hpp>
#include <weft/optim/adamw.hpp>
#include <weft/parallel/buckets.hpp>
#include <weft/parallel/grad_sync.hpp>
#include <weft/parallel/zero1.hpp>

#include <benchmark/benchmark.h>

#include <algorithm>
#include <atomic>
#include <barrier>
#include <chrono>
#include <cstddef>
#include <cstdio>
#include <cstring>
#include <exception>
#include <limits>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <span>
#include <string>
#include <thread>
#include <type_traits>
#include <vector>

namespace {

namespace wc = weft::comm;
namespace wt = weft::comm::threads;
using clock_type = std::chrono::steady_clock;

enum class coll { all_reduce, all_gather, reduce_scatter, all_to_all };

constexpr char const* name_of(coll c) {
  switch (c) {
    case coll::all_reduce: return "all_reduce";
    case coll::all_gather: return "all_gather";
    case coll::reduce_scatter: return "reduce_scatter";
    case coll::all_to_all: return "all_to_all";
  }
  return "?";
}

// nccl-tests busbw factor (§2.7).
double bus_factor(coll c, int n) {
  double const p = n;
  return c == coll::all_reduce ? 2.0 * (p - 1) / p : (p - 1) / p;
}

// One rank's buffers, first-touched by the rank's own thread so pages are warm before timing.
struct buffers {
  std::unique_ptr<float[]> in;
  std::unique_ptr<float[]> out;
  std::size_t in_count = 0;
  std::size_t out_count = 0;
};

// The team's own untimed barrier: a generation counter with futex waits (atomic::wait), and an
// optional completion run by the last arriver before anyone is released. (libstdc++ 12's
// std::barrier hung here once at 4 threads under load; it stays only as the measured baseline.)
class gen_barrier {
 public:
  explicit gen_barrier(int n) : n_(n) {}
  template <class Completion>
  void arrive_and_wait(Completion&& done) {
    auto const g = gen_.load(std::memory_order_acquire);
    if (arrived_.fetch_add(1, std::memory_order_acq_rel) + 1 == n_) {
      done();
      arrived_.store(0, std::memory_order_relaxed);
      gen_.store(g + 1, std::memory_order_release);
      gen_.notify_all();
      return;
    }
    while (gen_.load(std::memory_order_acquire) == g) gen_.wait(g, std::memory_order_acquire);
  }
  void arrive_and_wait() {
    arrive_and_wait([] {});
  }

 private:
  int n_;
  std::atomic<int> arrived_{0};
  std::atomic<unsigned> gen_{0};
};

// The fixed team of n threads; rank 0 is the calling (benchmark) thread. step(r) runs rank r's
// timed work for one iteration; the returned seconds are max_r(end_r) - t0.
class team {
 public:
  explicit team(int n) : n_(n), ends_(static_cast<std::size_t>(n)), start_(n), finish_(n) {}

  // `between()` runs on rank 0's thread after its part of each timed iteration, untimed.
  template <class Step, class Between = void (*)()>
  void run(
      benchmark::State& st, Step&& step, double divide = 1.0, Between between = [] {}) {
    std::atomic<bool> stop{false};
    std::exception_ptr err;
    std::mutex m;
    auto loop = [&](int r) {
      for (;;) {
        start_.arrive_and_wait(stamp{this});
        if (stop.load(std::memory_order_relaxed)) return;
        try {
          step(r);
        } catch (...) {
          std::lock_guard<std::mutex> lock(m);
          if (!err) err = std::current_exception();
        }
        ends_[static_cast<std::size_t>(r)].t = clock_type::now();
        finish_.arrive_and_wait();
      }
    };
    std::vector<std::thread> helpers;
    for (int r = 1; r < n_; ++r) helpers.emplace_back(loop, r);
    for (auto _ : st) {
      start_.arrive_and_wait(stamp{this});
      step(0);
      ends_[0].t = clock_type::now();
      between();
      finish_.arrive_and_wait();
      if (err) break;
      auto last = ends_[0].t;
      for (auto const& e : ends_) last = std::max(last, e.t);
      double const s = std::chrono::duration<double>(last - t0_).count();
      st.SetIterationTime(s / divide);
      total_ += s / divide;
      ++count_;
    }
    stop.store(true, std::memory_order_relaxed);
    start_.arrive_and_wait(stamp{this});
    for (auto& h : helpers) h.join();
    if (err) std::rethrow_exception(err);
  }

  // Runs f(r) once on every rank concurrently (setup, untimed).
  template <class F>
  void each(F&& f) {
    std::vector<std::thread> helpers;
    for (int r = 1; r < n_; ++r) helpers.emplace_back([&, r] { f(r); });
    f(0);
    for (auto& h : helpers) h.join();
  }

  //! Mean seconds per iteration (what the Time column shows).
  [[nodiscard]] double mean() const { return count_ ? total_ / double(count_) : 0.0; }

 private:
  struct stamp {
    team* t;
    void operator()() noexcept { t->t0_ = clock_type::now(); }
  };
  struct alignas(64) padded_time {
    clock_type::time_point t{};
  };
  int n_;
  std::vector<padded_time> ends_;
  clock_type::time_point t0_{};
  gen_barrier start_;
  gen_barrier finish_;
  double total_ = 0;
  long count_ = 0;
};

// The physical baseline: two threads each memcpy S bytes at the same time. The lowest mean time
// per size over this run's executions of bm_memcpy2 (Google Benchmark's short calibration runs
// included, so the ratio errs low), or measured on demand, so that every ratio uses this run's
// memory system.
std::map<std::size_t, double>& memcpy2_best() {
  static std::map<std::size_t, double> m;
  return m;
}

void set_bw(benchmark::State& st, double bytes_per_iter) {
  // Rate counters divide by the (manual) time: GB/s in units of 1e9 bytes.
  st.counters["algbw_GBps"] =
      benchmark::Counter(bytes_per_iter / 1e9, benchmark::Counter::kIsIterationInvariantRate);
}

void bm_memcpy2(benchmark::State& st) {
  auto const bytes = static_cast<std::size_t>(st.range(0));
  auto const count = bytes / sizeof(float);
  team t(2);
  std::vector<buffers> b(2);
  t.each([&](int r) {
    auto& x = b[static_cast<std::size_t>(r)];
    x.in.reset(new float[count]);
    x.out.reset(new float[count]);
    std::fill_n(x.in.get(), count, 1.0f);
    std::fill_n(x.out.get(), count, 0.0f);
  });
  t.run(st, [&](int r) {
    auto& x = b[static_cast<std::size_t>(r)];
    std::memcpy(x.out.get(), x.in.get(), bytes);
    benchmark::ClobberMemory();
  });
  auto& best = memcpy2_best()[bytes];
  best = best == 0 ? t.mean() : std::min(best, t.mean());
  set_bw(st, double(bytes));  // per copy
  st.counters["aggregate_GBps"] =
      benchmark::Counter(2.0 * double(bytes) / 1e9, benchmark::Counter::kIsIterationInvariantRate);
  st.SetLabel("2 threads x memcpy(S)");
}

double memcpy2_seconds(std::size_t bytes) {
  auto it = memcpy2_best().find(bytes);
  if (it != memcpy2_best().end()) return it->second;
  // Not run in this invocation (filtered out): measure it now, best of 5 after a warm-up.
  auto const count = bytes / sizeof(float);
  std::vector<float> a0(count, 1.0f), a1(count, 1.0f), b0(count), b1(count);
  double best = 1e300;
  for (int rep = 0; rep < 6; ++rep) {
    std::barrier go(2);
    clock_type::time_point e0, e1, s;
    std::thread h([&] {
      go.arrive_and_wait();
      std::memcpy(b1.data(), a1.data(), bytes);
      e1 = clock_type::now();
    });
    s = clock_type::now();
    go.arrive_and_wait();
    std::memcpy(b0.data(), a0.data(), bytes);
    e0 = clock_type::now();
    h.join();
    if (rep > 0) best = std::min(best, std::chrono::duration<double>(std::max(e0, e1) - s).count());
  }
  memcpy2_best()[bytes] = best;
  return best;
}

// stores: where the zero-copy all_reduce writes by non-temporal stores (options::
// streaming_store_bytes): from the default size, never (ordinary stores, the baseline), always.
enum class stores { by_default, ordinary, streaming };

void bm_threads(benchmark::State& st, coll c, stores how = stores::by_default) {
  int const n = static_cast<int>(st.range(0));
  auto const bytes = static_cast<std::size_t>(st.range(1));
  auto const big = bytes / sizeof(float);                // S in elements
  auto const small = big / static_cast<std::size_t>(n);  // S/n in elements
  double const base = memcpy2_seconds(bytes);

  wt::options opts;
  opts.timeout = std::chrono::seconds(60);
  opts.history_size = 0;
  if (how == stores::ordinary) opts.streaming_store_bytes = std::numeric_limits<std::size_t>::max();
  if (how == stores::streaming) opts.streaming_store_bytes = 0;
  auto comms = wt::make_communicators(n, opts);
  team t(n);
  std::vector<buffers> b(static_cast<std::size_t>(n));
  t.each([&](int r) {
    auto& x = b[static_cast<std::size_t>(r)];
    x.in_count = (c == coll::all_gather) ? small : big;
    x.out_count = (c == coll::reduce_scatter) ? small : big;
    x.in.reset(new float[x.in_count]);
    x.out.reset(new float[x.out_count]);
    std::fill_n(x.in.get(), x.in_count, float(r + 1));
    std::fill_n(x.out.get(), x.out_count, 0.0f);
  });
  auto step = [&](int r) {
    auto& x = b[static_cast<std::size_t>(r)];
    auto& comm = comms[static_cast<std::size_t>(r)];
    wc::buffer_view in{x.in.get(), x.in_count, weft::dtype::f32};
    wc::buffer_view out{x.out.get(), x.out_count, weft::dtype::f32};
    switch (c) {
      case coll::all_reduce: comm.all_reduce(in, out).wait(); break;
      case coll::all_gather: comm.all_gather(in, out).wait(); break;
      case coll::reduce_scatter: comm.reduce_scatter(in, out).wait(); break;
      case coll::all_to_all: comm.all_to_all(in, out).wait(); break;
    }
  };
  t.each(step);  // warm-up: staging buffers, first barrier crossings
  t.run(st, step);

  // Sanity: a sum of 1..n must have landed (all_reduce, reduce_scatter), the senders' ids (others).
  float const want_sum = float(n * (n + 1) / 2);
  auto const& x0 = b[0];
  float const got = x0.out[x0.out_count - 1];
  float const want = (c == coll::all_reduce || c == coll::reduce_scatter) ? want_sum : float(n);
  if (got != want) st.SkipWithError("wrong result");

  double const f = bus_factor(c, n);
  set_bw(st, double(bytes));
  st.counters["busbw_GBps"] =
      benchmark::Counter(double(bytes) * f / 1e9, benchmark::Counter::kIsIterationInvariantRate);
  // busbw / (S / t_memcpy2) = f · t_memcpy2 / t, with t this repetition's mean time.
  st.counters["vs_memcpy"] =
      benchmark::Counter(f * base, benchmark::Counter::kIsIterationInvariantRate);
  st.counters["memcpy2_GBps"] = double(bytes) / base / 1e9;
}

constexpr int latency_batch = 64;  // back-to-back operations per timed iteration

// The straggler detector alone: ns per row (one row per monitored collective) for `ranks` ranks,
// arrivals jittered by +-50 us around a 1 ms step (no rank late, the common case).
void bm_detector_observe(benchmark::State& st) {
  int const n = static_cast<int>(st.range(0));
  wc::straggler_detector det(n, wc::straggler_options{});
  std::vector<double> row(static_cast<std::size_t>(n));
  std::uint64_t x = 88172645463325252ull;
  double t = 0;
  std::size_t named = 0;
  for (auto _ : st) {
    t += 1e-3;
    for (auto& a : row) {
      x ^= x << 13;
      x ^= x >> 7;
      x ^= x << 17;
      a = t + double(x % 100000) * 1e-9 - 50e-6;
    }
    det.observe(
        row, [&](wc::straggler_report const&) { ++named; }, [](int) {});
    benchmark::DoNotOptimize(named);
  }
  st.counters["ns_per_row"] = benchmark::Counter(
      double(st.iterations()) * 1e-9, benchmark::Counter::kIsRate | benchmark::Counter::kInvert);
}

// Best std::barrier crossing per thread count in this run (bm_barrier_latency runs first).
std::map<int, double>& barrier_best() {
  static std::map<int, double> m;
  return m;
}
// back-to-back operations per timed iteration

// 8-byte all_reduce (two floats) latency: `latency_batch` calls per iteration, time per call.
// Monitored: the same calls through comm::monitored with one shared straggler_monitor (default
// options), to measure what arrival stamps and the per-collective evaluation cost.
// Exchange: 0 plain; 1 monitored, shared clock (the default for threads); 2 monitored, stamps
// exchanged by all_gather every 8 collectives (the MPI scheme); 3 monitored, shared clock, with a
// straggler_watchdog evaluating off the ranks' path (set_offload); 4 offloaded, evaluated between
// the timed iterations (every 64 collectives): the ranks' own cost when the watchdog has a core of
// its own, which the 2-core CI machine cannot give it while 2 ranks spin; 5 plain, with rank 0
// pausing 1.3 us between the timed iterations (what evaluating 64 rows of 2 ranks takes there):
// the control of 4, which shows that the pause itself costs the timed calls nothing.
template <bool Monitored, int Exchange = 1>
void bm_threads_latency(benchmark::State& st) {
  int const n = static_cast<int>(st.range(0));
  wt::options opts;
  opts.timeout = std::chrono::seconds(60);
  opts.history_size = 0;
  using comm_type =
      std::conditional_t<Monitored, wc::monitored<wt::communicator>, wt::communicator>;
  std::vector<comm_type> comms;
  std::optional<wc::straggler_watchdog> dog;  // destroyed first: joins before the comms go
  std::shared_ptr<wc::straggler_monitor> offloaded;
  {
    auto plain = wt::make_communicators(n, opts);
    auto mon = std::make_shared<wc::straggler_monitor>(
        n, wc::straggler_options{},
        Exchange == 2 ? wc::stamp_exchange::all_gather : wc::stamp_exchange::shared_clock);
    for (auto& c : plain) {
      if constexpr (Monitored) {
        comms.emplace_back(std::move(c), mon);
      } else {
        comms.push_back(std::move(c));
      }
    }
    if (Exchange == 3) dog.emplace(mon);
    if (Exchange == 4) mon->set_offload(true);
    offloaded = mon;
  }
  team t(n);
  struct alignas(64) eight {
    float in[2];
    float out[2];
  };
  std::vector<eight> b(static_cast<std::size_t>(n));
  auto step = [&](int r) {
    auto& x = b[static_cast<std::size_t>(r)];
    auto& comm = comms[static_cast<std::size_t>(r)];
    wc::buffer_view in{x.in, 2, weft::dtype::f32};
    wc::buffer_view out{x.out, 2, weft::dtype::f32};
    for (int k = 0; k < latency_batch; ++k) comm.all_reduce(in, out).wait();
  };
  t.each(step);
  if (Exchange == 5) {
    t.run(st, step, latency_batch, [] {
      auto const until = clock_type::now() + std::chrono::nanoseconds(1300);
      while (clock_type::now() < until) {}
    });
  } else if (Exchange == 4) {
    t.run(st, step, latency_batch, [&] { offloaded->evaluate(); });
  } else {
    t.run(st, step, latency_batch);
  }
  st.counters["us_per_op"] = benchmark::Counter(
      1e-6, benchmark::Counter::kIsIterationInvariantRate | benchmark::Counter::kInvert);
  if (auto it = barrier_best().find(n); it != barrier_best().end())
    st.counters["vs_barrier"] = t.mean() / it->second;  // goal: <= 3
}

// The floor: a barrier crossing by the same number of threads, same batching. libstdc++ 12's
// std::barrier deadlocked in this loop after some millions of crossings (every thread parked in
// __tree_barrier::wait; seen at 2 and 4 threads under load), so the latency benchmarks run a fixed
// 3000 iterations on a fresh barrier per repetition, and a futex generation barrier (the wait
// primitive of the threads backend) is measured beside it.
template <class Barrier>
void bm_barrier_latency(benchmark::State& st) {
  int const n = static_cast<int>(st.range(0));
  team t(n);
  Barrier bar(n);
  auto step = [&](int) {
    for (int k = 0; k < latency_batch; ++k) bar.arrive_and_wait();
  };
  t.each(step);
  t.run(st, step, latency_batch);
  st.counters["us_per_op"] = benchmark::Counter(
      1e-6, benchmark::Counter::kIsIterationInvariantRate | benchmark::Counter::kInvert);
  auto& best = barrier_best()[n];  // lowest mean over this run's repetitions
  best = best == 0 ? t.mean() : std::min(best, t.mean());
}

void sizes(benchmark::internal::Benchmark* b, bool with_ranks) {
  for (int n : {2, 4}) {
    for (long s = 4L << 10; s <= 256L << 20; s *= 4) {
      if (with_ranks)
        b->Args({n, s});
      else if (n == 2)
        b->Args({s});
    }
  }
}

// The data-parallel optimizer step on n thread ranks over S bytes of f32 parameters (tensors of
// 1 Mi elements; 4 Mi-element buckets): `replicated` is grad_sync's bucketed SUM all-reduce, then
// optim::adamw over every parameter, in the buffer's layout (no copies, Megatron's DDP without the
// distributed optimizer); `zero1` is grad_sync's reduce-scatter, then parallel::zero1 (AdamW on
// the rank's 1/n, the bucket all-gathers, the unpack into the definition-order parameters). Each
// step zeroes the gradient buffer first (what a trainer does before backward; the gradients are
// then 0, which costs AdamW the same). Counters: state_MiB, AdamW's m and v on a rank.
void bm_dp_step(benchmark::State& st, bool zero) {
  int const n = static_cast<int>(st.range(0));
  auto const elements = static_cast<std::size_t>(st.range(1)) / sizeof(float);
  std::vector<weft::optim::param_info> infos(elements >> 20, weft::optim::param_info{1u << 20});
  weft::parallel::bucket_plan const plan(
      infos, {.bucket_size = std::size_t{4} << 20, .dp = n, .shard = zero});
  weft::optim::adamw_options const ao{.lr = 1e-4, .weight_decay = 0.1};
  wt::options opts;
  opts.timeout = std::chrono::seconds(60);
  opts.history_size = 0;
  auto comms = wt::make_communicators(n, opts);
  using sync_t = weft::parallel::grad_sync<wt::communicator, float>;
  struct rank_state {
    std::optional<sync_t> sync;
    std::optional<weft::optim::adamw<float>> adam;
    std::optional<weft::parallel::zero1<float>> zero;
    std::vector<float> params;
  };
  std::vector<rank_state> ranks(static_cast<std::size_t>(n));
  team t(n);
  t.each([&](int r) {
    auto& x = ranks[static_cast<std::size_t>(r)];
    x.sync.emplace(comms[static_cast<std::size_t>(r)], plan,
                   weft::parallel::grad_sync_options{weft::parallel::grad_scaling::sum});
    x.params.assign(zero ? plan.source_size() : plan.buffer_size(), 0.5f);
    if (zero)
      x.zero.emplace(plan, r, ao);
    else
      x.adam.emplace(plan.buffer_size(), ao);
  });
  auto step = [&](int r) {
    auto& x = ranks[static_cast<std::size_t>(r)];
    auto& comm = comms[static_cast<std::size_t>(r)];
    x.sync->zero();
    for (std::size_t i = infos.size(); i-- > 0;) x.sync->mark_ready(i);
    x.sync->finish();
    if (zero)
      x.zero->step(comm, std::span<float>(x.params), std::span<float const>(x.sync->buffer()),
                   1e-4);
    else
      x.adam->step(std::span<float>(x.params), std::span<float const>(x.sync->buffer()), 1e-4);
  };
  t.each(step);  // warm-up: staging buffers, first touches
  t.run(st, step);
  auto const& x0 = ranks[0];
  std::size_t const state = zero ? x0.zero->state_size() : x0.adam->size();
  st.counters["state_MiB"] = 2.0 * double(state * sizeof(float)) / double(1 << 20);
  // AdamW with zero gradients and weight decay 0.1 shrinks every parameter alike.
  float const p0 = x0.params.front(), p1 = x0.params.back();
  if (!(p0 < 0.5f) || p0 != p1) st.SkipWithError("the parameters did not take the step");
}

// Bigger messages take ~0.1 s a call at 4 ranks here: fewer iterations keep the sweep short.
void reg() {
  benchmark::RegisterBenchmark("memcpy2", bm_memcpy2)
      ->Apply([](auto* b) { sizes(b, false); })
      ->ArgNames({"bytes"})
      ->UseManualTime()
      ->Unit(benchmark::kMicrosecond);
  for (coll c : {coll::all_reduce, coll::all_gather, coll::reduce_scatter, coll::all_to_all}) {
    benchmark::RegisterBenchmark((std::string("threads/") + name_of(c)).c_str(),
                                 [c](benchmark::State& st) { bm_threads(st, c); })
        ->Apply([](auto* b) { sizes(b, true); })
        ->ArgNames({"ranks", "bytes"})
        ->UseManualTime()
        ->Unit(benchmark::kMicrosecond);
  }
  for (auto [name, how] : {std::pair{"threads/all_reduce_ordinary_stores", stores::ordinary},
                           std::pair{"threads/all_reduce_streaming_stores", stores::streaming}})
    benchmark::RegisterBenchmark(
        name, [how](benchmark::State& st) { bm_threads(st, coll::all_reduce, how); })
        ->Apply([](auto* b) {  // 256 KiB to 256 MiB by factors of 2: where streaming pays
          for (int n : {2, 4})
            for (long s = 256L << 10; s <= 256L << 20; s *= 2) b->Args({n, s});
        })
        ->ArgNames({"ranks", "bytes"})
        ->UseManualTime()
        ->Unit(benchmark::kMicrosecond);
  for (auto [name, zero] :
       {std::pair{"dp_step/replicated", false}, std::pair{"dp_step/zero1", true}})
    benchmark::RegisterBenchmark(name, [zero](benchmark::State& st) { bm_dp_step(st, zero); })
        ->ArgsProduct({{2, 4}, {64L << 20}})
        ->ArgNames({"ranks", "bytes"})
        ->UseManualTime()
        ->Unit(benchmark::kMillisecond);
  // The latency benchmarks: 2 and 4 ranks, a fixed 3000 iterations (see bm_barrier_latency).
  auto latency = [](char const* name, void (*fn)(benchmark::State&)) {
    benchmark::RegisterBenchmark(name, fn)
        ->Arg(2)
        ->Arg(4)
        ->ArgNames({"ranks"})
        ->Iterations(3000)
        ->UseManualTime()
        ->Unit(benchmark::kMicrosecond);
  };
  latency("std_barrier", bm_barrier_latency<std::barrier<>>);
  latency("futex_barrier", bm_barrier_latency<gen_barrier>);
  latency("threads/all_reduce_8B", bm_threads_latency<false>);
  latency("threads/all_reduce_8B_monitored", bm_threads_latency<true>);
  latency("threads/all_reduce_8B_monitored_gather", bm_threads_latency<true, 2>);
  latency("threads/all_reduce_8B_monitored_watchdog", bm_threads_latency<true, 3>);
  latency("threads/all_reduce_8B_monitored_offloaded", bm_threads_latency<true, 4>);
  latency("threads/all_reduce_8B_pause_between", bm_threads_latency<false, 5>);
  benchmark::RegisterBenchmark("straggler_detector/observe", bm_detector_observe)
      ->Arg(2)
      ->Arg(4)
      ->Arg(8)
      ->ArgNames({"ranks"})
      ->Unit(benchmark::kNanosecond);
}

}  // namespace

int main(int argc, char** argv) {
  reg();
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
