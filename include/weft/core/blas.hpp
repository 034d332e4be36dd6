// weft/core/blas.hpp — weft's one door to BLAS: the GEMM its CPU tiles call when WEFT_HAS_BLAS is
// 1, and the rule that keeps those calls single-threaded. weft parallelises above its tiles (ranks
// as threads, OpenMP teams over tiles), so a threaded BLAS beneath them oversubscribes the cores.
#pragma once

#include <weft/core/config.hpp>
#include <weft/core/error.hpp>

#include <climits>
#include <cstdint>
#include <mutex>
#include <type_traits>

#if WEFT_HAS_BLAS
#include <cblas.h>
#endif
#if defined(_OPENMP)
#include <omp.h>
#endif

// OpenBLAS's cblas.h includes openblas_config.h, which defines OPENBLAS_VERSION; weft controls
// OpenBLAS's threads. Another BLAS keeps its own rule (reference BLAS is serial; see the docs).
#if WEFT_HAS_BLAS && defined(OPENBLAS_VERSION)
#define WEFT_BLAS_IS_OPENBLAS 1
#else
#define WEFT_BLAS_IS_OPENBLAS 0
#endif

// 1 (default): every BLAS call weft makes runs single-threaded (serial_scope below). 0: weft's
// calls use whatever threading the BLAS is set to, for a program that runs one rank and no OpenMP
// team and wants BLAS's threads inside each tile.
#ifndef WEFT_BLAS_SERIAL_CALLS
#define WEFT_BLAS_SERIAL_CALLS 1
#endif

namespace weft::blas {

//! True when weft's tiles call BLAS (WEFT_HAS_BLAS = 1; weft::weft sets it when CMake finds BLAS).
inline constexpr bool enabled = WEFT_HAS_BLAS != 0;

//! The number of threads a BLAS call made now, from this thread, would use as the linked BLAS
//! reports it: 1 without BLAS, for a sequential build or inside an OpenMP parallel region of an
//! OpenMP build; OpenBLAS's current thread count otherwise. Another BLAS than OpenBLAS: 1 (weft
//! does not know its threads).
[[nodiscard]] inline int threads_per_call() noexcept {
#if WEFT_BLAS_IS_OPENBLAS
  int const parallel = openblas_get_parallel();  // 0 sequential, 1 pthreads, 2 OpenMP
  if (parallel == 0) return 1;
#if defined(_OPENMP)
  if (parallel == 2) return omp_in_parallel() ? 1 : omp_get_max_threads();
#endif
  return openblas_get_num_threads();
#else
  return 1;
#endif
}

namespace detail {

// OpenBLAS's pthreads build keeps one thread count for the whole process, so "single-threaded for
// weft's calls" is a count of the scopes alive on all threads: the first sets 1, the last puts back
// what it found, unless someone changed it in between.
struct serial_state {
  std::mutex mutex;
  int active = 0;
  int saved = 1;
};
inline serial_state& process_serial_state() noexcept {
  static serial_state state;
  return state;
}
inline thread_local int serial_depth = 0;

}  // namespace detail

//! While a serial_scope lives, BLAS calls made from its thread run on that one thread.
//!
//! - OpenBLAS, OpenMP build: this thread's OpenMP thread count is 1 for the scope (per thread; no
//!   other thread is affected).
//! - OpenBLAS, pthreads build (Debian's default): the library has only a process-wide count, so
//!   while a scope is alive on any thread OpenBLAS's count is 1 *for the whole process*; the last
//!   scope to end restores the count it found (openblas_set_num_threads), unless the count was
//!   changed meanwhile. A BLAS call of yours made from another thread at that time runs serial.
//! - A sequential BLAS, another BLAS, or no BLAS: nothing to do.
//! Nested scopes on one thread cost a thread-local increment. Not copyable or movable: a scope
//! ends on the thread that began it.
class serial_scope {
 public:
  serial_scope() noexcept {
    if (detail::serial_depth++ > 0) return;
#if WEFT_BLAS_IS_OPENBLAS
    int const parallel = openblas_get_parallel();
    if (parallel == 0) return;
#if defined(_OPENMP)
    if (parallel == 2) {
      omp_saved_ = omp_get_max_threads();
      omp_set_num_threads(1);
      return;
    }
#endif
    auto& s = detail::process_serial_state();
    std::lock_guard<std::mutex> const lock(s.mutex);
    if (s.active++ == 0) {
      s.saved = openblas_get_num_threads();
      if (s.saved != 1) openblas_set_num_threads(1);
    }
    global_ = true;
#endif
  }
  serial_scope(serial_scope const&) = delete;
  serial_scope& operator=(serial_scope const&) = delete;
  ~serial_scope() {
    if (--detail::serial_depth > 0) return;
#if WEFT_BLAS_IS_OPENBLAS
#if defined(_OPENMP)
    if (omp_saved_ > 0) omp_set_num_threads(omp_saved_);
#endif
    if (!global_) return;
    auto& s = detail::process_serial_state();
    std::lock_guard<std::mutex> const lock(s.mutex);
    if (--s.active == 0 && s.saved != 1 && openblas_get_num_threads() == 1)
      openblas_set_num_threads(s.saved);
#endif
  }

 private:
  [[maybe_unused]] int omp_saved_ = 0;
  [[maybe_unused]] bool global_ = false;
};

//! Whether the operand enters the product as stored or transposed.
enum class op : bool { none, transpose };

#if WEFT_HAS_BLAS
//! C[m×n] = alpha · op(A) · op(B) + beta · C, row-major (cblas_sgemm / cblas_dgemm), run
//! single-threaded per serial_scope unless WEFT_BLAS_SERIAL_CALLS is 0. op(A) is m×k, op(B) k×n;
//! lda, ldb, ldc are the row strides as stored. Every extent must fit the BLAS's int.
template <class T>
void gemm(op op_a, op op_b, std::int64_t m, std::int64_t n, std::int64_t k, T alpha, T const* a,
          std::int64_t lda, T const* b, std::int64_t ldb, T beta, T* c, std::int64_t ldc) {
  static_assert(std::is_same_v<T, float> || std::is_same_v<T, double>,
                "weft::blas::gemm: BLAS multiplies float or double");
  auto const fits = [](std::int64_t v) { return v >= 0 && v <= INT_MAX; };
  WEFT_EXPECTS(fits(m) && fits(n) && fits(k), "m, n, k", "extents in [0, INT_MAX]",
               weft::detail::concat(m, ", ", n, ", ", k));
  WEFT_EXPECTS(fits(lda) && fits(ldb) && fits(ldc), "lda, ldb, ldc", "strides in [0, INT_MAX]",
               weft::detail::concat(lda, ", ", ldb, ", ", ldc));
  auto const ta = op_a == op::transpose ? CblasTrans : CblasNoTrans;
  auto const tb = op_b == op::transpose ? CblasTrans : CblasNoTrans;
#if WEFT_BLAS_SERIAL_CALLS
  serial_scope const serial;
#endif
  if constexpr (std::is_same_v<T, float>)
    cblas_sgemm(CblasRowMajor, ta, tb, int(m), int(n), int(k), alpha, a, int(lda), b, int(ldb),
                beta, c, int(ldc));
  else
    cblas_dgemm(CblasRowMajor, ta, tb, int(m), int(n), int(k), alpha, a, int(lda), b, int(ldb),
                beta, c, int(ldc));
}
#endif

}  // namespace weft::blas
