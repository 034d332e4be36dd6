// The local kernel never materialises the [Sq, Sk] score matrix: peak heap growth of forward +
// backward, measured by replacing the global operator new/delete of this test program with
// counting versions, stays far below the size of that matrix.
#include <weft/attention/flash.hpp>

#include "attention_testing.hpp"

#include <doctest/doctest.h>

#include <malloc.h>

#include <atomic>
#include <cstdlib>
#include <new>

namespace {
std::atomic<long long> heap_now{0};
std::atomic<long long> heap_peak{0};

void note_alloc(void* p) {
  if (!p) return;
  long long const now = heap_now += static_cast<long long>(malloc_usable_size(p));
  long long peak = heap_peak.load();
  while (now > peak && !heap_peak.compare_exchange_weak(peak, now)) {}
}
void note_free(void* p) {
  if (p) heap_now -= static_cast<long long>(malloc_usable_size(p));
}
void* counted(std::size_t n) {
  void* p = std::malloc(n ? n : 1);
  if (!p) throw std::bad_alloc();
  note_alloc(p);
  return p;
}
void* counted_aligned(std::size_t n, std::align_val_t a) {
  std::size_t const al = static_cast<std::size_t>(a);
  void* p = std::aligned_alloc(al, (n + al - 1) / al * al);
  if (!p) throw std::bad_alloc();
  note_alloc(p);
  return p;
}
void release(void* p) noexcept {
  note_free(p);
  std::free(p);
}
}  // namespace

void* operator new(std::size_t n) { return counted(n); }
void* operator new[](std::size_t n) { return counted(n); }
void* operator new(std::size_t n, std::nothrow_t const&) noexcept {
  try {
    return counted(n);
  } catch (...) {
    return nullptr;
  }
}
void* operator new[](std::size_t n, std::nothrow_t const&) noexcept {
  try {
    return counted(n);
  } catch (...) {
    return nullptr;
  }
}
void* operator new(std::size_t n, std::align_val_t a) { return counted_aligned(n, a); }
void* operator new[](std::size_t n, std::align_val_t a) { return counted_aligned(n, a); }
void* operator new(std::size_t n, std::align_val_t a, std::nothrow_t const&) noexcept {
  try {
    return counted_aligned(n, a);
  } catch (...) {
    return nullptr;
  }
}
void* operator new[](std::size_t n, std::align_val_t a, std::nothrow_t const&) noexcept {
  try {
    return counted_aligned(n, a);
  } catch (...) {
    return nullptr;
  }
}
void operator delete(void* p) noexcept { release(p); }
void operator delete[](void* p) noexcept { release(p); }
void operator delete(void* p, std::size_t) noexcept { release(p); }
void operator delete[](void* p, std::size_t) noexcept { release(p); }
void operator delete(void* p, std::nothrow_t const&) noexcept { release(p); }
void operator delete[](void* p, std::nothrow_t const&) noexcept { release(p); }
void operator delete(void* p, std::align_val_t) noexcept { release(p); }
void operator delete[](void* p, std::align_val_t) noexcept { release(p); }
void operator delete(void* p, std::size_t, std::align_val_t) noexcept { release(p); }
void operator delete[](void* p, std::size_t, std::align_val_t) noexcept { release(p); }
void operator delete(void* p, std::align_val_t, std::nothrow_t const&) noexcept { release(p); }
void operator delete[](void* p, std::align_val_t, std::nothrow_t const&) noexcept { release(p); }

namespace {

namespace wa = weft::attention;
using namespace attention_testing;

// Peak heap growth (bytes) of forward + backward at sequence length s, head dim 64, one head.
long long peak_growth(std::int64_t s, wa::causal_mode causal) {
  std::int64_t const d = 64;
  auto q = random_tensor<float>(1, 1.0, 1, s, 1, d), k = random_tensor<float>(2, 1.0, 1, s, 1, d),
       v = random_tensor<float>(3, 1.0, 1, s, 1, d), g = random_tensor<float>(4, 1.0, 1, s, 1, d);
  auto o = make_owned<float>(1, s, 1, d), dq = make_owned<float>(1, s, 1, d),
       dk = make_owned<float>(1, s, 1, d), dv = make_owned<float>(1, s, 1, d);
  auto l = make_owned<float>(1, 1, s);
  wa::attention_options const opt{0.0, causal, 1};
  long long const base = heap_now.load();
  heap_peak.store(base);
  wa::flash_forward(q.view(), k.view(), v.view(), o.view(), l.view(), opt);
  wa::flash_backward(q.view(), k.view(), v.view(), o.view(), l.view(), g.view(), dq.view(),
                     dk.view(), dv.view(), opt);
  CHECK(std::isfinite(double(dq.data()[0])));
  return heap_peak.load() - base;
}

}  // namespace

TEST_CASE("the counting allocator sees allocations (self-check)") {
  long long const before = heap_now.load();
  auto* p = new std::vector<float>(1 << 20);
  CHECK(heap_now.load() - before >= (1 << 22));
  delete p;
  CHECK(heap_now.load() == before);
}

TEST_CASE("forward+backward at S = 4096 grows the heap by far less than the [S, S] matrix") {
  long long const grown = peak_growth(4096, wa::causal_mode::top_left);
  MESSAGE("peak heap growth at S = 4096: ", grown / 1024, " KiB (the f32 score matrix: 65536 KiB)");
  CHECK(grown < 8ll << 20);
}

TEST_SUITE("slow") {
  TEST_CASE("forward+backward at S = 16k, d = 64 grows the heap by less than 64 MiB") {
    long long const grown = peak_growth(16384, wa::causal_mode::top_left);
    MESSAGE("peak heap growth at S = 16384: ", grown / 1024, " KiB (the f32 score matrix: 1 GiB)");
    CHECK(grown < 64ll << 20);
  }
}
