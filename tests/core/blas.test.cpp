// weft::blas: the GEMM weft's tiles call matches a naive product, and BLAS calls made from thread
// ranks (weft::blas::gemm, and flash attention's tiles) run on one thread. The thread count is
// measured, not asked: the CPU time each thread of the process spent during the calls, from
// /proc/self/task (Linux).
#include <weft/attention/flash.hpp>
#include <weft/comm/threads/world.hpp>
#include <weft/core/blas.hpp>

#include <doctest/doctest.h>

#include <atomic>
#include <barrier>
#include <chrono>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <map>
#include <mutex>
#include <set>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#if defined(__linux__)
#include <sys/syscall.h>
#include <unistd.h>
#endif

namespace {

using i64 = std::int64_t;

#if WEFT_HAS_BLAS
// C = alpha·op(A)·op(B) + beta·C in long double, the way the definition reads.
template <class T>
std::vector<T> naive_gemm(bool ta, bool tb, i64 m, i64 n, i64 k, T alpha, std::vector<T> const& a,
                          i64 lda, std::vector<T> const& b, i64 ldb, T beta, std::vector<T> c,
                          i64 ldc) {
  for (i64 i = 0; i < m; ++i)
    for (i64 j = 0; j < n; ++j) {
      long double s = 0;
      for (i64 p = 0; p < k; ++p) {
        long double const x = ta ? a[std::size_t(p * lda + i)] : a[std::size_t(i * lda + p)];
        long double const y = tb ? b[std::size_t(j * ldb + p)] : b[std::size_t(p * ldb + j)];
        s += x * y;
      }
      auto& cij = c[std::size_t(i * ldc + j)];
      cij = static_cast<T>(static_cast<long double>(alpha) * s +
                           static_cast<long double>(beta) * cij);
    }
  return c;
}

template <class T>
void check_gemm(double tol) {
  i64 const m = 7, n = 5, k = 9;
  for (bool ta : {false, true})
    for (bool tb : {false, true}) {
      i64 const lda = (ta ? m : k) + 2, ldb = (tb ? k : n) + 1, ldc = n + 3;
      std::vector<T> a(std::size_t((ta ? k : m) * lda)), b(std::size_t((tb ? n : k) * ldb)),
          c(std::size_t(m * ldc));
      for (std::size_t i = 0; i < a.size(); ++i) a[i] = T(int(i * 7 % 13) - 6) / T(4);
      for (std::size_t i = 0; i < b.size(); ++i) b[i] = T(int(i * 5 % 11) - 5) / T(8);
      for (std::size_t i = 0; i < c.size(); ++i) c[i] = T(int(i % 9) - 4);
      auto const want = naive_gemm<T>(ta, tb, m, n, k, T(0.5), a, lda, b, ldb, T(-2), c, ldc);
      weft::blas::gemm<T>(ta ? weft::blas::op::transpose : weft::blas::op::none,
                          tb ? weft::blas::op::transpose : weft::blas::op::none, m, n, k, T(0.5),
                          a.data(), lda, b.data(), ldb, T(-2), c.data(), ldc);
      for (std::size_t i = 0; i < c.size(); ++i)
        CHECK(double(c[i]) == doctest::Approx(double(want[i])).epsilon(tol));
    }
}
#endif

#if defined(__linux__)
long this_thread_id() { return static_cast<long>(::syscall(SYS_gettid)); }

// user + system CPU time, in clock ticks, of every thread of this process.
// utime + stime of one /proc/.../stat file; -1 if it could not be read (the thread ended).
long ticks_of(std::filesystem::path const& stat) {
  std::ifstream in(stat);
  std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  auto const close = text.rfind(')');
  if (close == std::string::npos || close + 2 > text.size()) return -1;
  std::istringstream fields(text.substr(close + 2));  // field 3 (state) onwards
  std::string field;
  long utime = 0, stime = 0;
  for (int i = 3; i <= 15 && fields >> field; ++i) {
    if (i == 14) utime = std::stol(field);
    if (i == 15) stime = std::stol(field);
  }
  return utime + stime;
}

std::map<long, long> cpu_ticks_by_thread() {
  std::map<long, long> out;
  for (auto const& entry : std::filesystem::directory_iterator("/proc/self/task")) {
    long const t = ticks_of(entry.path() / "stat");
    if (t >= 0) out[std::stol(entry.path().filename().string())] = t;
  }
  return out;
}

// OpenBLAS's workers spin for a while after they start or finish a job before they sleep; a
// measurement starts once no thread of the process has used CPU for 100 ms (at most 5 s).
void wait_until_quiet() {
  auto const total = [] {
    long sum = 0;
    for (auto const& [tid, ticks] : cpu_ticks_by_thread()) sum += ticks;
    return sum;
  };
  long last = total();
  for (int i = 0; i < 50; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    long const now = total();
    if (now == last) return;
    last = now;
  }
}

struct cpu_split {
  long ranks = 0;   // ticks spent by the rank threads themselves
  long others = 0;  // ticks spent meanwhile by every other thread (BLAS workers among them)
};

// Runs `per_rank` on `n` thread ranks and splits the CPU time spent meanwhile between the rank
// threads and all the others.
template <class F>
cpu_split measure_on_ranks(int n, F per_rank) {
  std::mutex mutex;
  std::set<long> rank_tids;
  wait_until_quiet();
  auto const before = cpu_ticks_by_thread();
  std::map<long, long> rank_ticks;
  weft::comm::threads::world(n).run([&](weft::comm::threads::communicator& comm) {
    {
      std::lock_guard<std::mutex> const lock(mutex);
      rank_tids.insert(this_thread_id());
    }
    per_rank();
    comm.barrier();
    // A rank thread ends with run(), so its ticks are read while it is alive.
    // Its own stat file, not a directory listing: /proc's readdir may skip an entry while other
    // threads start or end (seen under ASan).
    long const own = ticks_of("/proc/thread-self/stat");
    std::lock_guard<std::mutex> const lock(mutex);
    rank_ticks[this_thread_id()] = own;
  });
  auto const after = cpu_ticks_by_thread();
  cpu_split s;
  for (auto const& [tid, ticks] : rank_ticks) s.ranks += ticks;
  for (auto const& [tid, ticks] : after) {
    if (rank_tids.count(tid)) continue;
    auto const it = before.find(tid);
    s.others += ticks - (it == before.end() ? 0 : it->second);
  }
  return s;
}
#endif

#if WEFT_BLAS_IS_OPENBLAS
// The user's own process-wide setting for the duration of a test, put back afterwards.
struct openblas_threads {
  int previous = openblas_get_num_threads();
  explicit openblas_threads(int n) { openblas_set_num_threads(n); }
  ~openblas_threads() { openblas_set_num_threads(previous); }
};

// 1024×1024 products, a size OpenBLAS splits over all its threads when it may.
struct big_operands {
  static constexpr i64 n = 1024;
  std::vector<float> a, b, c;
  big_operands()
      : a(std::size_t(n * n), 0.5f), b(std::size_t(n * n), 0.25f), c(std::size_t(n * n), 0.0f) {}
};
#endif

}  // namespace

TEST_CASE("blas: weft::blas::gemm matches the naive product in every transpose, with strides") {
#if WEFT_HAS_BLAS
  check_gemm<float>(1e-5);
  check_gemm<double>(1e-12);
  std::vector<float> x(4);
  CHECK_THROWS_AS(weft::blas::gemm<float>(weft::blas::op::none, weft::blas::op::none, i64(1) << 31,
                                          1, 1, 1.0f, x.data(), 1, x.data(), 1, 0.0f, x.data(), 1),
                  weft::invalid_argument_error);
#else
  MESSAGE("built without BLAS (WEFT_HAS_BLAS = 0): weft's tiles use their own loops");
  CHECK(weft::blas::threads_per_call() == 1);
#endif
}

TEST_CASE(
    "blas: serial_scope makes calls single-threaded, nests, and restores the count it found") {
#if WEFT_BLAS_IS_OPENBLAS
  openblas_threads const user(3);
  int const configured = weft::blas::threads_per_call();  // 3, or 1 for a sequential OpenBLAS
  {
    weft::blas::serial_scope const outer;
    CHECK(weft::blas::threads_per_call() == 1);
    {
      weft::blas::serial_scope const inner;
      CHECK(weft::blas::threads_per_call() == 1);
    }
    CHECK(weft::blas::threads_per_call() == 1);
  }
  CHECK(weft::blas::threads_per_call() == configured);

  // Overlapping scopes on two threads: the count stays 1 until the last one ends.
  std::barrier sync(2);
  std::atomic<int> seen_inside{0};
  std::thread first([&] {
    weft::blas::serial_scope const s;
    sync.arrive_and_wait();  // both scopes alive
    sync.arrive_and_wait();  // the second has ended
    seen_inside = weft::blas::threads_per_call();
  });
  {
    weft::blas::serial_scope const s;
    sync.arrive_and_wait();
  }
  sync.arrive_and_wait();
  first.join();
  CHECK(seen_inside == 1);
  CHECK(weft::blas::threads_per_call() == configured);
#else
  weft::blas::serial_scope const s;
  CHECK(weft::blas::threads_per_call() == 1);
#endif
}

TEST_CASE("blas: weft's GEMM called from thread ranks runs on one thread per call") {
#if WEFT_BLAS_IS_OPENBLAS && defined(__linux__)
  if (openblas_get_parallel() == 0) {
    MESSAGE("sequential OpenBLAS: every call is single-threaded");
    return;
  }
  // The user asked OpenBLAS for 4 threads for their own, big products (more than this machine
  // may have cores: the point is that weft's calls do not use them).
  openblas_threads const user(4);
  big_operands x0, x1;
  std::atomic<int> next{0};
  std::atomic<int> threads_seen{0};
  auto const weft_calls = [&] {
    auto& x = next++ == 0 ? x0 : x1;
    for (int r = 0; r < 3; ++r) {
      weft::blas::gemm<float>(weft::blas::op::none, weft::blas::op::none, x.n, x.n, x.n, 1.0f,
                              x.a.data(), x.n, x.b.data(), x.n, 0.0f, x.c.data(), x.n);
      weft::blas::serial_scope const s;  // what the calls above run under
      threads_seen = std::max(threads_seen.load(), weft::blas::threads_per_call());
    }
  };
  // The control: the same products through cblas directly do use OpenBLAS's worker threads, so
  // the measurement of weft's calls would have seen them.
  auto const raw_calls = [&] {
    auto& x = next++ == 0 ? x0 : x1;
    for (int r = 0; r < 3; ++r)
      cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, int(x.n), int(x.n), int(x.n), 1.0f,
                  x.a.data(), int(x.n), x.b.data(), int(x.n), 0.0f, x.c.data(), int(x.n));
  };
  // CPU ticks are sampled by the scheduler: on a machine loaded by other builds one sample can
  // be off. A regression (weft's calls on OpenBLAS's workers) fails every attempt; noise does not.
  bool split_seen = false;
  for (int attempt = 0; attempt < 3 && !split_seen; ++attempt) {
    next = 0;
    threads_seen = 0;
    auto const weft_split = measure_on_ranks(2, weft_calls);
    CHECK(x0.c[0] == doctest::Approx(0.125 * 1024));
    CHECK(threads_seen == 1);
    CHECK(openblas_get_num_threads() == 4);  // the user's setting is back
    next = 0;
    auto const raw_split = measure_on_ranks(2, raw_calls);
    MESSAGE("attempt " << attempt << ": weft calls on 2 ranks: rank threads " << weft_split.ranks
                       << " ticks, other threads " << weft_split.others
                       << " ticks; raw cblas: rank threads " << raw_split.ranks
                       << " ticks, other threads " << raw_split.others << " ticks");
    split_seen = weft_split.ranks >= 4 &&  // enough work to see a split
                 weft_split.others * 10 <= weft_split.ranks + 20 &&
                 raw_split.others * 10 > raw_split.ranks + 20;
  }
  CHECK(split_seen);
#else
  MESSAGE("no OpenBLAS, or not Linux: nothing to measure");
  CHECK(weft::blas::threads_per_call() == 1);
#endif
}

TEST_CASE("blas: flash attention's BLAS tiles on thread ranks run on one thread per call") {
#if WEFT_BLAS_IS_OPENBLAS && defined(__linux__)
  if (openblas_get_parallel() == 0) {
    MESSAGE("sequential OpenBLAS: every call is single-threaded");
    return;
  }
  openblas_threads const user(4);
  // [1, 1024, 4, 128] f32: 64×128×128 tiles, which OpenBLAS would split over its threads.
  i64 const s = 1024, h = 4, d = 128;
  auto const run_flash = [&] {
    auto q = weft::make_tensor<float>(1, s, h, d), k = weft::make_tensor<float>(1, s, h, d),
         v = weft::make_tensor<float>(1, s, h, d), o = weft::make_tensor<float>(1, s, h, d);
    auto lse = weft::make_tensor<float>(1, h, s);
    for (std::size_t i = 0; i < q.size(); ++i) {
      q.data()[i] = float(int(i % 17) - 8) / 16.0f;
      k.data()[i] = float(int(i % 13) - 6) / 16.0f;
      v.data()[i] = float(int(i % 11) - 5) / 8.0f;
    }
    for (int r = 0; r < 2; ++r)
      weft::attention::flash_forward(q.view(), k.view(), v.view(), o.view(), lse.view(), {});
  };
  // As above: a scheduler sample can be off on a loaded machine; a regression fails every attempt.
  bool one_thread = false;
  for (int attempt = 0; attempt < 3 && !one_thread; ++attempt) {
    auto const split = measure_on_ranks(2, run_flash);
    MESSAGE("attempt " << attempt << ": flash_forward on 2 ranks: rank threads " << split.ranks
                       << " ticks, other threads " << split.others << " ticks");
    one_thread = split.ranks >= 4 && split.others * 10 <= split.ranks + 20;
  }
  CHECK(one_thread);
  CHECK(openblas_get_num_threads() == 4);
#else
  MESSAGE("no OpenBLAS, or not Linux: nothing to measure");
  CHECK(weft::blas::threads_per_call() == 1);
#endif
}
