// compile-fail: functions taking an executor and a view require the view to live in the
// executor's memory space (TensorIn<memory_space_t<E>>); a cuda_space view given to exec::host
// must not compile. WEFT_COMPILE_FAIL selects the one line that differs from the twin.
#include <weft/core/exec.hpp>
#include <weft/core/tensor.hpp>

void snippet(float* p) {
  weft::tensor_view<float, 2, weft::cuda_space> device(p, 2, 2);
  weft::tensor_view<float, 2> host(p, 2, 2);
  weft::exec::host const ex{};
#if defined(WEFT_COMPILE_FAIL)
  weft::fill(ex, device, 0.0f);
#else
  weft::fill(ex, host, 0.0f);
#endif
  (void)device;
  (void)host;
}
