// libFuzzer target: the CSV schedule parser (PyTorch pipelining's format), then validate,
// simulate and lower.
#include "check_input.hpp"

#include <cstddef>
#include <cstdint>
#include <string_view>

extern "C" int LLVMFuzzerTestOneInput(std::uint8_t const* data, std::size_t size) {
  weft_fuzz::check_csv(std::string_view(reinterpret_cast<char const*>(data), size));
  return 0;
}
