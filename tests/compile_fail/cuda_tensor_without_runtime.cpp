// compile-fail: allocating cuda_space memory needs the CUDA runtime; in a build without
// WEFT_HAS_CUDA_RUNTIME (plain weft::weft) make_tensor<T, cuda_space> must stop with weft's
// static_assert message instead of failing at run time. WEFT_COMPILE_FAIL selects the one line
// that differs from the twin, which allocates host memory and compiles.
#include <weft/core/tensor.hpp>

#include <cstddef>

std::size_t snippet() {
#if defined(WEFT_COMPILE_FAIL)
  auto t = weft::make_tensor<float, weft::cuda_space>(4);
#else
  auto t = weft::make_tensor<float, weft::host_space>(4);
#endif
  return t.size();
}
