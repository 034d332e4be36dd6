// Tests for weft/core/exec.hpp: the Executor concept, for_each_index on exec::host (sequential
// and OpenMP, which must agree bit for bit), for_each_chunk (per-worker state on exec::host, a
// fresh state per item on a user's executor), and fill/copy through an executor on strided views.
// In the CUDA twin (nvcc, label gpu) the same functors also run on exec::cuda.
#include <weft/core/exec.hpp>
#include <weft/core/tensor.hpp>

#include <doctest/doctest.h>

#include <cuda/std/cmath>

#include <atomic>
#include <cstdint>
#include <cstring>
#include <type_traits>
#include <utility>
#include <vector>

#if defined(_OPENMP)
#include <omp.h>
#endif

namespace {

// A named WEFT_HD functor, as library code writes them: out[i] = sin(i / 64) * i + 0.5.
struct wave_fn {
  float* out;
  WEFT_HD void operator()(std::int64_t i) const {
    float const x = static_cast<float>(i);
    out[i] = cuda::std::sin(x / 64.0f) * x + 0.5f;
  }
};

// Counts how often each index is visited (each index owns its slot: no race).
struct visit_fn {
  int* hits;
  WEFT_HD void operator()(std::int64_t i) const { hits[i] += 1; }
};

#if defined(_OPENMP)
// Records which OpenMP thread ran each index.
struct thread_id_fn {
  int* ids;
  void operator()(std::int64_t i) const { ids[i] = omp_get_thread_num(); }
};
#endif

// The same formula written as a plain loop, without the executor: the reference.
std::vector<float> wave_reference(std::int64_t n) {
  std::vector<float> out(static_cast<std::size_t>(n));
  for (std::int64_t i = 0; i < n; ++i) {
    float const x = static_cast<float>(i);
    out[static_cast<std::size_t>(i)] = cuda::std::sin(x / 64.0f) * x + 0.5f;
  }
  return out;
}

struct not_an_executor {  // has the members but not the opt-in tag
  using memory_space = weft::host_space;
  void synchronize() const {}
};
struct tagged_without_space {
  using executor_concept = weft::executor_tag;
  void synchronize() const {}
};

static_assert(weft::Executor<weft::exec::host>);
static_assert(!weft::Executor<int>);
static_assert(!weft::Executor<not_an_executor>);
static_assert(!weft::Executor<tagged_without_space>);
static_assert(std::is_same_v<weft::memory_space_t<weft::exec::host>, weft::host_space>);
#if WEFT_HAS_CUDA_RUNTIME
static_assert(weft::Executor<weft::exec::cuda>);
static_assert(std::is_same_v<weft::memory_space_t<weft::exec::cuda>, weft::cuda_space>);
#endif

// Whether fill(exec, view, value) accepts a view: only views in the executor's memory space.
template <class E, class V>
concept can_fill_with = requires(E const& e, V const& v) {
  weft::fill(e, v, 1.0f);
};
static_assert(can_fill_with<weft::exec::host, weft::tensor_view<float, 2>>);
static_assert(can_fill_with<weft::exec::host, weft::strided_view<float, 3>>);
static_assert(!can_fill_with<weft::exec::host, weft::tensor_view<float, 2, weft::cuda_space>>);
static_assert(!can_fill_with<weft::exec::host, weft::tensor_view<float const, 2>>);
#if WEFT_HAS_CUDA_RUNTIME
static_assert(can_fill_with<weft::exec::cuda, weft::tensor_view<float, 2, weft::cuda_space>>);
static_assert(!can_fill_with<weft::exec::cuda, weft::tensor_view<float, 2>>);
#endif

// A user's executor: a plain host loop, found by ADL (hidden friend), with no for_each_chunk of
// its own, so for_each_chunk takes the generic path.
struct user_loop {
  using executor_concept = weft::executor_tag;
  using memory_space = weft::host_space;
  void synchronize() const noexcept {}
  template <class F>
  friend void for_each_index(user_loop const&, std::int64_t n, F f) {
    for (std::int64_t i = 0; i < n; ++i) f(i);
  }
};
static_assert(weft::Executor<user_loop>);

// for_each_chunk's scratch: counts how many were made; `busy` catches two items sharing one.
struct scratch {
  std::vector<std::int64_t> buf;
  bool busy = false;
};
struct make_scratch {
  std::atomic<int>* made;
  scratch operator()() const {
    made->fetch_add(1);
    return scratch{std::vector<std::int64_t>(64), false};
  }
};
// out[i] = sum_{k<64} (i + k), computed in the state's buffer.
struct chunk_item {
  std::int64_t* out;
  std::atomic<int>* shared;
  void operator()(std::int64_t i, scratch& s) const {
    if (s.busy) shared->fetch_add(1);
    s.busy = true;
    std::int64_t sum = 0;
    for (std::size_t k = 0; k < s.buf.size(); ++k) s.buf[k] = i + static_cast<std::int64_t>(k);
    for (std::int64_t v : s.buf) sum += v;
    out[i] = sum;
    s.busy = false;
  }
};

}  // namespace

TEST_CASE("exec: for_each_index on exec::host runs a named WEFT_HD functor once per index") {
  constexpr std::int64_t n = 1000;
  auto out = weft::make_tensor<float>(n);
  weft::fill(out.view(), -1.0f);
  weft::exec::host const seq{};
  weft::for_each_index(seq, n, wave_fn{out.data()});
  seq.synchronize();
  auto const ref = wave_reference(n);
  for (std::int64_t i = 0; i < n; ++i) CHECK(out.data()[i] == ref[static_cast<std::size_t>(i)]);
  // Spot values by hand: i = 0 -> 0.5; i = 64 -> sin(1) * 64 + 0.5.
  CHECK(out.data()[0] == 0.5f);
  CHECK(out.data()[64] == doctest::Approx(0.8414709848 * 64 + 0.5).epsilon(1e-6));

  std::vector<int> hits(n, 0);
  weft::for_each_index(seq, n, visit_fn{hits.data()});
  for (int h : hits) CHECK(h == 1);
}

TEST_CASE("exec: the OpenMP host executor gives bit-identical results") {
  constexpr std::int64_t n = 100003;  // not a multiple of any team size
  auto seq_out = weft::make_tensor<float>(n);
  weft::for_each_index(weft::exec::host{}, n, wave_fn{seq_out.data()});
  for (int threads : {0, 2, 3, 4}) {
    CAPTURE(threads);
    auto par_out = weft::make_tensor<float>(n);
    weft::fill(par_out.view(), -1.0f);
    weft::exec::host const par = weft::exec::host::parallel(threads);
    CHECK(par.num_threads == threads);
    weft::for_each_index(par, n, wave_fn{par_out.data()});
    par.synchronize();
    CHECK(std::memcmp(par_out.data(), seq_out.data(), par_out.size_bytes()) == 0);
    std::vector<int> hits(n, 0);
    weft::for_each_index(par, n, visit_fn{hits.data()});
    int wrong = 0;
    for (int h : hits) wrong += (h != 1);
    CHECK(wrong == 0);
  }
#if defined(_OPENMP)
  // The parallel path really forks: a team of 3 runs indices on threads 0, 1 and 2 (static
  // schedule: contiguous thirds), and the sequential executor stays on the calling thread.
  std::vector<int> ids(n, -1);
  weft::for_each_index(weft::exec::host::parallel(3), n, thread_id_fn{ids.data()});
  CHECK(ids.front() == 0);
  CHECK(ids[n / 2] == 1);
  CHECK(ids.back() == 2);
  weft::for_each_index(weft::exec::host{}, n, thread_id_fn{ids.data()});
  CHECK(ids.back() == 0);
#endif
}

TEST_CASE("exec: for_each_index checks its arguments") {
  std::vector<int> hits(1, 0);
  weft::for_each_index(weft::exec::host{}, 0, visit_fn{hits.data()});  // empty range: no call
  CHECK(hits[0] == 0);
  CHECK_THROWS_WITH_AS(weft::for_each_index(weft::exec::host{}, -1, visit_fn{hits.data()}),
                       doctest::Contains("`n`: expected >= 0, actual -1"),
                       weft::invalid_argument_error);
  CHECK_THROWS_AS(weft::for_each_index(weft::exec::host{-2}, 1, visit_fn{hits.data()}),
                  weft::invalid_argument_error);
  CHECK(hits[0] == 0);
}

TEST_CASE("exec: for_each_chunk runs every item once with a per-worker state") {
  constexpr std::int64_t n = 1001;
  auto want = [](std::int64_t i) { return 64 * i + 63 * 64 / 2; };
  for (int threads : {1, 0, 2, 3}) {
    CAPTURE(threads);
    std::vector<std::int64_t> out(n, -1);
    std::atomic<int> made{0}, shared{0};
    weft::for_each_chunk(weft::exec::host{threads}, n, make_scratch{&made},
                         chunk_item{out.data(), &shared});
    for (std::int64_t i = 0; i < n; ++i) CHECK(out[static_cast<std::size_t>(i)] == want(i));
    CHECK(shared.load() == 0);
    CHECK(made.load() >= 1);
#if defined(_OPENMP)
    if (threads > 1) CHECK(made.load() == threads);  // one state per thread of the team
#endif
    if (threads == 1) CHECK(made.load() == 1);  // one state, a plain loop
  }
  // A user's executor without a for_each_chunk of its own: a fresh state for each item.
  std::vector<std::int64_t> out(n, -1);
  std::atomic<int> made{0}, shared{0};
  weft::for_each_chunk(user_loop{}, n, make_scratch{&made}, chunk_item{out.data(), &shared});
  for (std::int64_t i = 0; i < n; ++i) CHECK(out[static_cast<std::size_t>(i)] == want(i));
  CHECK(made.load() == n);
  // Empty: no state is made; a negative count or thread count throws before anything runs.
  made = 0;
  weft::for_each_chunk(weft::exec::host{3}, 0, make_scratch{&made},
                       chunk_item{out.data(), &shared});
  weft::for_each_chunk(user_loop{}, 0, make_scratch{&made}, chunk_item{out.data(), &shared});
  CHECK(made.load() == 0);
  CHECK_THROWS_WITH_AS(weft::for_each_chunk(weft::exec::host{}, -1, make_scratch{&made},
                                            chunk_item{out.data(), &shared}),
                       doctest::Contains("`n`: expected >= 0, actual -1"),
                       weft::invalid_argument_error);
  CHECK_THROWS_AS(weft::for_each_chunk(weft::exec::host{-2}, 4, make_scratch{&made},
                                       chunk_item{out.data(), &shared}),
                  weft::invalid_argument_error);
  CHECK(made.load() == 0);
}

TEST_CASE("exec: fill and copy through an executor match the host reference on strided views") {
  for (weft::exec::host const ex : {weft::exec::host{}, weft::exec::host::parallel(3)}) {
    CAPTURE(ex.num_threads);
    // fill a column of a [3, 4] matrix: only the viewed elements change.
    auto t = weft::make_tensor<int>(3, 4);
    weft::fill(ex, t.view(), 0);
    weft::fill(ex, weft::select(t.view(), 1, 2), 7);
    int const expected[12] = {0, 0, 7, 0, 0, 0, 7, 0, 0, 0, 7, 0};
    for (int i = 0; i < 12; ++i) CHECK(t.data()[i] == expected[i]);

    // copy the transpose of a [2, 3, 4] iota: element (a, b, c) = 12 c + 4 b + a.
    auto src = weft::make_tensor<float>(2, 3, 4);
    for (int i = 0; i < 24; ++i) src.data()[i] = static_cast<float>(i);
    auto dst = weft::make_tensor<float>(4, 3, 2);
    weft::copy(ex, dst.view(), weft::transpose(std::as_const(src).view(), 0, 2));
    for (int a = 0; a < 4; ++a)
      for (int b = 0; b < 3; ++b)
        for (int c = 0; c < 2; ++c)
          CHECK(dst.view()(a, b, c) == static_cast<float>(12 * c + 4 * b + a));

    // contiguous to contiguous, and strided destination
    auto flat = weft::make_tensor<float>(24);
    weft::copy(ex, flat.view(), weft::flatten(src.view()));
    for (int i = 0; i < 24; ++i) CHECK(flat.data()[i] == static_cast<float>(i));
    auto z = weft::make_tensor<float>(2, 3, 4);
    weft::fill(ex, z.view(), 0.0f);
    weft::copy(ex, weft::select(z.view(), 2, 3), weft::select(src.view(), 2, 0));
    for (int i = 0; i < 24; ++i)
      CHECK(z.data()[i] == (i % 4 == 3 ? static_cast<float>(i - 3) : 0.0f));

    // shape mismatch: shape_error before anything runs
    auto wrong = weft::make_tensor<float>(3, 2, 4);
    weft::fill(ex, wrong.view(), -1.0f);
    CHECK_THROWS_AS(weft::copy(ex, wrong.view(), src.view()), weft::shape_error);
    for (int i = 0; i < 24; ++i) CHECK(wrong.data()[i] == -1.0f);
  }
}

#if WEFT_CUDA_COMPILER && WEFT_HAS_CUDA_RUNTIME
// CUDA twin only (label gpu): the same functors on the device agree with the host loop. sin is
// allowed 2 ulp of difference between libm and CUDA's device sinf.
TEST_CASE("exec: exec::cuda runs the same functor as the host (gpu)") {
  constexpr std::int64_t n = 100003;
  weft::exec::cuda const ex{};
  auto dev = weft::make_tensor<float, weft::cuda_space>(n);
  weft::for_each_index(ex, n, wave_fn{dev.data()});
  ex.synchronize();
  auto host = weft::make_tensor<float>(n);
  weft::copy(host.view(), dev.view());
  auto const ref = wave_reference(n);
  int far = 0;
  for (std::int64_t i = 0; i < n; ++i) {
    float const r = ref[static_cast<std::size_t>(i)];
    float const g = host.data()[i];
    far += !(cuda::std::fabs(g - r) <= 4e-7f * cuda::std::fabs(static_cast<float>(i)) + 1e-6f);
  }
  CHECK(far == 0);

  auto src = weft::make_tensor<float>(2, 3, 4);
  for (int i = 0; i < 24; ++i) src.data()[i] = static_cast<float>(i);
  auto dsrc = weft::make_tensor<float, weft::cuda_space>(2, 3, 4);
  weft::copy(dsrc.view(), src.view());
  auto ddst = weft::make_tensor<float, weft::cuda_space>(4, 3, 2);
  weft::fill(ex, ddst.view(), -1.0f);
  weft::copy(ex, ddst.view(), weft::transpose(dsrc.view(), 0, 2));
  ex.synchronize();
  auto back = weft::make_tensor<float>(4, 3, 2);
  weft::copy(back.view(), ddst.view());
  for (int a = 0; a < 4; ++a)
    for (int b = 0; b < 3; ++b)
      for (int c = 0; c < 2; ++c)
        CHECK(back.view()(a, b, c) == static_cast<float>(12 * c + 4 * b + a));
}
#endif
