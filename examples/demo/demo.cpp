// weft demo: exercises the core vocabulary types and prints what it did. Every step checks its own
// result; the program exits non-zero if any check fails.
//
//   1. an owning f32 tensor, initialised from the counter-based generator;
//   2. the same tensor initialised as four 2-D tiles on four threads: bit-identical to (1);
//   3. views: a row slice, a transposed sub-view, a reshape, with their strides;
//   4. bf16 and f16 copies of the tensor and their worst relative rounding error;
//   5. a bad call, and the exception weft throws for it.
#include <weft/weft.hpp>

#include <cmath>
#include <cstdio>
#include <cstring>
#include <iostream>
#include <thread>
#include <vector>

namespace {

int failures = 0;

void check(bool ok, char const* what) {
  std::printf("  [%s] %s\n", ok ? "ok" : "FAILED", what);
  if (!ok) ++failures;
}

}  // namespace

int main() {
  std::printf("weft %s demo\n", WEFT_VERSION_STRING);
  constexpr std::int64_t rows = 6;
  constexpr std::int64_t cols = 8;
  weft::rng const gen{/*seed=*/2026, /*stream=*/0};

  // 1. One owning tensor, filled whole.
  auto whole = weft::make_tensor<float>(rows, cols);
  weft::fill_uniform(whole.view(), gen, -1.0, 1.0);
  std::printf("\n1. make_tensor<float>(%lld, %lld), fill_uniform(seed 2026) in [-1, 1):\n",
              static_cast<long long>(rows), static_cast<long long>(cols));
  std::cout << whole << "\n";
  bool in_range = true;
  for (std::int64_t i = 0; i < rows; ++i)
    for (std::int64_t j = 0; j < cols; ++j)
      in_range &= whole.view()(i, j) >= -1.0f && whole.view()(i, j) < 1.0f;
  check(in_range, "every value lies in [-1, 1)");

  // 2. The same tensor as 2x2 tiles, each filled by its own thread from its global placement.
  auto tiled = weft::make_tensor<float>(rows, cols);
  {
    std::vector<std::thread> workers;
    for (std::int64_t ti = 0; ti < 2; ++ti) {
      for (std::int64_t tj = 0; tj < 2; ++tj) {
        workers.emplace_back([&, ti, tj] {
          std::int64_t const r0 = ti * rows / 2;
          std::int64_t const c0 = tj * cols / 2;
          auto tile = weft::subview(tiled.view(), std::pair{r0, r0 + rows / 2},
                                    std::pair{c0, c0 + cols / 2});
          weft::fill_uniform(tile, gen, -1.0, 1.0, weft::placement{{rows, cols}, {r0, c0}});
        });
      }
    }
    for (auto& w : workers) w.join();
  }
  std::printf("\n2. the same tensor filled as four 2-D tiles on four threads:\n");
  check(std::memcmp(whole.data(), tiled.data(), whole.size_bytes()) == 0,
        "tiled fill is bit-identical to the whole fill");

  // 3. Views share memory and carry their strides.
  auto row2 = weft::select(whole.view(), 0, 2);
  auto block_t =
      weft::transpose(weft::subview(whole.view(), std::pair{0, 3}, std::pair{0, 4}), 0, 1);
  auto flat = weft::reshape(whole.view(), std::array<weft::index_t, 2>{-1, 4});
  std::printf("\n3. views:\n   select(dim 0, 2): extent %lld, stride %lld\n",
              static_cast<long long>(row2.extent(0)), static_cast<long long>(row2.stride(0)));
  std::printf(
      "   transpose(subview rows [0,3) cols [0,4)): extents [%lld, %lld], strides [%lld, %lld]\n",
      static_cast<long long>(block_t.extent(0)), static_cast<long long>(block_t.extent(1)),
      static_cast<long long>(block_t.stride(0)), static_cast<long long>(block_t.stride(1)));
  std::cout << "   " << block_t << "\n";
  std::printf("   reshape to [-1, 4]: extents [%lld, %lld]\n",
              static_cast<long long>(flat.extent(0)), static_cast<long long>(flat.extent(1)));
  check(row2(5) == whole.view()(2, 5), "select aliases the tensor's memory");
  check(block_t(3, 1) == whole.view()(1, 3) && block_t.stride(0) == 1 && block_t.stride(1) == cols,
        "the transposed sub-view reads element (1, 3) at (3, 1) with strides [1, 8]");
  check(flat.extent(0) == rows * cols / 4 && flat(1, 0) == whole.view()(0, 4),
        "reshape infers 12 rows and keeps row-major order");

  // 4. Reduced precision: round-to-nearest-even, as CUDA's conversions do.
  auto as_bf16 = weft::make_tensor<weft::bf16>(rows, cols);
  auto as_f16 = weft::make_tensor<weft::f16>(rows, cols);
  double worst_bf16 = 0.0;
  double worst_f16 = 0.0;
  for (std::int64_t i = 0; i < rows; ++i) {
    for (std::int64_t j = 0; j < cols; ++j) {
      float const x = whole.view()(i, j);
      as_bf16.view()(i, j) = weft::bf16(x);
      as_f16.view()(i, j) = weft::f16(x);
      // Relative bounds hold in the normal range of each format (f16's ends at 2^-14).
      if (std::fabs(x) >= 0x1p-14f) {
        worst_bf16 =
            std::fmax(worst_bf16, std::fabs((static_cast<float>(as_bf16.view()(i, j)) - x) / x));
        worst_f16 =
            std::fmax(worst_f16, std::fabs((static_cast<float>(as_f16.view()(i, j)) - x) / x));
      }
    }
  }
  std::printf("\n4. conversions (%s: %zu bytes, %s: %zu bytes):\n",
              std::string(weft::name(weft::dtype::bf16)).c_str(), weft::size_of(weft::dtype::bf16),
              std::string(weft::name(weft::dtype::f16)).c_str(), weft::size_of(weft::dtype::f16));
  std::cout << "   bf16 copy, first row: " << weft::select(as_bf16.view(), 0, 0) << "\n";
  std::printf("   worst relative rounding error: bf16 %.3g (bound 2^-8 = %.3g), f16 %.3g\n",
              worst_bf16, std::ldexp(1.0, -8), worst_f16);
  check(worst_bf16 <= std::ldexp(1.0, -8),
        "bf16 rounding error within half an ulp (2^-8 relative)");
  check(worst_f16 <= std::ldexp(1.0, -11),
        "f16 rounding error within half an ulp (2^-11 relative)");

  // 5. Bad input is an exception naming the argument, the expected and the actual value.
  std::printf("\n5. reshape([%lld, %lld] -> [5, 5]):\n", static_cast<long long>(rows),
              static_cast<long long>(cols));
  try {
    (void)weft::reshape(whole.view(), std::array<weft::index_t, 2>{5, 5});
    check(false, "reshape with the wrong element count throws");
  } catch (weft::shape_error const& e) {
    std::printf("   caught weft::shape_error: %s\n", e.message().c_str());
    check(true, "reshape with the wrong element count throws weft::shape_error");
  }

  std::printf("\ndemo %s: %d check(s) failed\n", failures == 0 ? "passed" : "FAILED", failures);
  return failures == 0 ? 0 : 1;
}
