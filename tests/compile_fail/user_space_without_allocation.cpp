// compile-fail: the set of memory spaces is open, but a space weft cannot allocate in must say so.
// A user's space that is a MemorySpace but has no allocate/deallocate members (not an
// AllocatingSpace) refuses make_tensor with weft's own message; the twin, the same space with the
// two members, compiles (probe A.2 of the style review).
// WEFT_COMPILE_FAIL selects the one line that differs from the twin, which compiles.
#include <weft/core/memory.hpp>
#include <weft/core/tensor.hpp>

#include <cstddef>
#include <new>
#include <string_view>

struct tag_only_space {
  static constexpr std::string_view name = "pinned";
  static constexpr bool host_accessible = true;
  friend constexpr bool operator==(tag_only_space, tag_only_space) noexcept = default;
};
struct pinned_space : tag_only_space {
  friend constexpr bool operator==(pinned_space, pinned_space) noexcept = default;
  static void* allocate(std::size_t bytes) { return ::operator new (bytes, std::align_val_t{64}); }
  static void deallocate(void* p, std::size_t) noexcept {
    ::operator delete (p, std::align_val_t{64});
  }
};

void snippet() {
#if defined(WEFT_COMPILE_FAIL)
  auto t = weft::make_tensor<float, tag_only_space>(4);
#else
  auto t = weft::make_tensor<float, pinned_space>(4);
#endif
  (void)t;
}
