// compile-fail: for_each_index(exec::cuda, ...) launches a kernel, which only nvcc can compile;
// instantiated in a g++/clang++ translation unit (built with weft::cuda, so exec::cuda exists) it
// must stop with weft's static_assert message. WEFT_COMPILE_FAIL selects the one line that
// differs from the twin, which runs the same functor on exec::host and compiles.
#include <weft/core/exec.hpp>

#include <cstdint>

namespace {
struct set_one {
  float* out;
  WEFT_HD void operator()(std::int64_t i) const { out[i] = 1.0f; }
};
}  // namespace

void snippet(float* p) {
  weft::exec::cuda const device{};
  weft::exec::host const host{};
#if defined(WEFT_COMPILE_FAIL)
  weft::for_each_index(device, 4, set_one{p});
#else
  weft::for_each_index(host, 4, set_one{p});
#endif
  (void)device;
  (void)host;
}
