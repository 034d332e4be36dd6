// compile-fail: weft::fill(view, value) runs on the host, so it is constrained
// TensorIn<host_space>; a view of cuda_space memory must be rejected at compile time with a
// diagnostic naming weft's concept. WEFT_COMPILE_FAIL selects the one line that differs from
// the twin, which compiles.
#include <weft/core/tensor.hpp>

void snippet(float* p) {
  weft::tensor_view<float, 1, weft::cuda_space> device(p, 4);
  weft::tensor_view<float, 1> host(p, 4);
#if defined(WEFT_COMPILE_FAIL)
  weft::fill(device, 1.0f);
#else
  weft::fill(host, 1.0f);
#endif
  (void)device;
  (void)host;
}
