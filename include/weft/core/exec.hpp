// weft/core/exec.hpp — executors: where and how per-element work runs. `exec::host` (a plain
// loop, or an OpenMP team), `exec::cuda{stream}` (a kernel on a stream; needs weft::cuda and an
// nvcc translation unit to launch), for_each_index over them, and for_each_chunk (work items with
// per-worker scratch state, scheduled dynamically): the one seam through which weft's parallel
// loops run. fill and copy through an executor are in weft/core/algorithm/{fill,copy}.hpp.
#pragma once

#include <weft/core/config.hpp>
#include <weft/core/error.hpp>
#include <weft/core/memory.hpp>

#include <concepts>
#include <cstddef>
#include <cstdint>
#include <type_traits>

#if WEFT_HAS_CUDA_RUNTIME
#include <cuda_runtime_api.h>
#endif
#if WEFT_CUDA_COMPILER && WEFT_HAS_CUDA_RUNTIME
#include <weft/core/cuda/for_each.cuh>
#endif

namespace weft {

//! Opt-in tag: a type is an executor only if it says so (`using executor_concept = executor_tag`).
struct executor_tag {};

namespace exec {

//! Runs work on the calling host thread, or on an OpenMP team when weft is compiled with OpenMP
//! and num_threads != 1. Results are identical either way: for_each_index calls f(i) once per
//! index and functors write disjoint elements, so the split across threads changes nothing.
struct host {
  using executor_concept = executor_tag;
  using memory_space = host_space;

  //! 1: sequential loop. 0: OpenMP's default team size. n > 1: n OpenMP threads.
  //! Without OpenMP (_OPENMP undefined) every value runs the sequential loop.
  int num_threads = 1;

  //! An executor that uses OpenMP (n threads, or OpenMP's default for 0).
  [[nodiscard]] static constexpr host parallel(int n = 0) noexcept { return host{n}; }

  //! Host work completes before for_each_index returns: nothing to wait for.
  void synchronize() const noexcept {}

  friend constexpr bool operator==(host const&, host const&) = default;
};

#if WEFT_HAS_CUDA_RUNTIME
//! Runs work as CUDA kernels on `stream` (nullptr: the legacy default stream). Launches are
//! asynchronous: call synchronize() before the host reads what a kernel wrote.
//! (Inside namespace weft::exec this struct hides ::cuda; spell CCCL as ::cuda::std there.)
struct cuda {
  using executor_concept = executor_tag;
  using memory_space = cuda_space;

  cudaStream_t stream = nullptr;

  void synchronize() const { WEFT_CUDA_TRY(cudaStreamSynchronize(stream)); }

  friend bool operator==(cuda const&, cuda const&) = default;
};
#endif

}  // namespace exec

//! Calls f(i) for every i in [0, n) on the calling thread or an OpenMP team (see exec::host).
//! f must be callable as a const object (threads share it) and must not throw: an exception
//! escaping an OpenMP region terminates the program. Throws invalid_argument_error for n < 0.
template <class F>
requires std::invocable<F const&, std::int64_t>
void for_each_index(exec::host const& e, std::int64_t n, F f) {
  WEFT_EXPECTS(n >= 0, "n", ">= 0", n);
  WEFT_EXPECTS(e.num_threads >= 0, "exec.num_threads", ">= 0 (0: OpenMP default, 1: sequential)",
               e.num_threads);
  F const& fc = f;
#if defined(_OPENMP)
  if (e.num_threads > 1) {
#pragma omp parallel for schedule(static) num_threads(e.num_threads)
    for (std::int64_t i = 0; i < n; ++i) fc(i);
    return;
  }
  if (e.num_threads == 0) {
#pragma omp parallel for schedule(static)
    for (std::int64_t i = 0; i < n; ++i) fc(i);
    return;
  }
#endif
  for (std::int64_t i = 0; i < n; ++i) fc(i);
}

#if WEFT_HAS_CUDA_RUNTIME
//! Launches f(i) for every i in [0, n) as a grid-stride CUDA kernel on e.stream (asynchronous).
//! f must be a WEFT_HD (or __device__) functor whose operator() is const. The kernel lives in
//! weft/core/cuda/for_each.cuh, which this header includes in nvcc translation units; in a g++
//! or clang++ translation unit this overload stops compilation with a static_assert.
template <class F>
void for_each_index(exec::cuda const& e, std::int64_t n, F f) {
#if WEFT_CUDA_COMPILER
  WEFT_EXPECTS(n >= 0, "n", ">= 0", n);
  detail::launch_for_each_index(e.stream, n, f);
#else
  (void)e;
  (void)n;
  (void)f;
  static_assert(detail::false_for<F>,
                "weft: for_each_index(exec::cuda, ...) launches a CUDA kernel, so it must be "
                "instantiated in a .cu translation unit compiled by nvcc; g++/clang++ translation "
                "units can run functors with exec::host only");
#endif
}
#endif

namespace detail {

// Does nothing for any index: lets the Executor concept ask "can this executor run a functor".
struct index_probe {
  WEFT_HD void operator()(std::int64_t) const noexcept {}
};

}  // namespace detail

//! Executor: a copyable value choosing where and how per-element work runs.
//!  - opts in with `using executor_concept = executor_tag` (a thread pool with a synchronize()
//!    member is not thereby an executor);
//!  - `E::memory_space` is the MemorySpace its work may touch: functions taking an executor and
//!    tensors require TensorIn<memory_space_t<E>>, so host views never reach a CUDA kernel;
//!  - `for_each_index(e, n, f)` calls f(i) exactly once for each i in [0, n), in unspecified
//!    order and possibly concurrently, possibly asynchronously;
//!  - `e.synchronize()` returns once all work submitted through `e` has completed.
template <class E>
concept Executor = std::copyable<E> && requires {
  typename E::executor_concept;
  typename E::memory_space;
} && std::derived_from<typename E::executor_concept, executor_tag> &&
    MemorySpace<typename E::memory_space> &&
    requires(E const& e, std::int64_t n, detail::index_probe f) {
  e.synchronize();
  for_each_index(e, n, f);
};

static_assert(Executor<exec::host>);
#if WEFT_HAS_CUDA_RUNTIME
static_assert(Executor<exec::cuda>);
#endif

// ---- work items with per-worker state -----------------------------------------------------------
// Coarse work items that each need scratch memory (attention's query tiles need a few hundred KiB
// of packed tiles) should not allocate it per item, and items of uneven cost (causal tiles) should
// be handed out one at a time. for_each_chunk(e, n, make_state, f) does both: it calls f(i, s) once
// for every i in [0, n), where `s` is a state made by make_state() and owned by one worker at a
// time. Items run in unspecified order, possibly concurrently; each state is used by one item at
// a time, so f may write to it freely. Results must not depend on which state an item gets.
// Host-accessible executors only (make_state and f run on the host).

//! exec::host: one state per thread of an OpenMP team (num_threads > 1, or OpenMP's default for
//! 0) with items handed out one at a time (schedule(dynamic, 1)); with num_threads 1 or without
//! OpenMP, one state and a plain loop. make_state and f must not throw out of a team (that
//! terminates the program), as for for_each_index. Throws invalid_argument_error for n < 0.
template <class MakeState, class F>
requires std::invocable<MakeState const&> && std::invocable < F const&, std::int64_t,
    std::invoke_result_t<MakeState const&>
& > void for_each_chunk(exec::host const& e, std::int64_t n, MakeState const& make_state,
                        F const& f) {
  WEFT_EXPECTS(n >= 0, "n", ">= 0", n);
  WEFT_EXPECTS(e.num_threads >= 0, "exec.num_threads", ">= 0 (0: OpenMP default, 1: sequential)",
               e.num_threads);
  if (n == 0) return;
#if defined(_OPENMP)
  if (e.num_threads != 1 && n > 1) {
    if (e.num_threads > 1) {
#pragma omp parallel num_threads(e.num_threads)
      {
        auto state = make_state();
#pragma omp for schedule(dynamic, 1)
        for (std::int64_t i = 0; i < n; ++i) f(i, state);
      }
    } else {
#pragma omp parallel
      {
        auto state = make_state();
#pragma omp for schedule(dynamic, 1)
        for (std::int64_t i = 0; i < n; ++i) f(i, state);
      }
    }
    return;
  }
#endif
  auto state = make_state();
  for (std::int64_t i = 0; i < n; ++i) f(i, state);
}

namespace detail {

// The generic for_each_chunk's per-index functor: a fresh state for each item.
template <class MakeState, class F>
struct chunk_with_fresh_state {
  MakeState const* make_state;
  F const* f;
  void operator()(std::int64_t i) const {
    auto state = (*make_state)();
    (*f)(i, state);
  }
};

}  // namespace detail

//! Any other host-accessible Executor: each item gets a fresh state, run through the executor's
//! for_each_index (correct for any executor, but allocating per item). An executor with workers
//! of its own provides a for_each_chunk overload found by ADL, as exec::host does.
template <Executor E, class MakeState, class F>
requires(E::memory_space::host_accessible) &&
    std::invocable<MakeState const&>&& std::invocable<
        F const&, std::int64_t,
        std::invoke_result_t<MakeState const&>&> void for_each_chunk(E const& e, std::int64_t n,
                                                                     MakeState const& make_state,
                                                                     F const& f) {
  WEFT_EXPECTS(n >= 0, "n", ">= 0", n);
  if (n == 0) return;
  for_each_index(e, n, detail::chunk_with_fresh_state<MakeState, F>{&make_state, &f});
  e.synchronize();
}

}  // namespace weft
