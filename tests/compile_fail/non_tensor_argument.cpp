// compile-fail: sub-view functions take a Tensor (a non-owning mdspan view carrying its memory
// space); a std::vector is not one, and the diagnostic must name weft's Tensor concept.
// WEFT_COMPILE_FAIL selects the one line that differs from the twin, which compiles.
#include <weft/core/tensor.hpp>

#include <vector>

void snippet(float* p) {
  std::vector<float> values(6);
  weft::tensor_view<float, 2> view(p, 2, 3);
#if defined(WEFT_COMPILE_FAIL)
  auto t = weft::transpose(values, 0, 1);
#else
  auto t = weft::transpose(view, 0, 1);
#endif
  (void)t;
  (void)values;
  (void)view;
}
