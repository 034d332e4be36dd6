// libFuzzer target: weft's text schedule parser, then validate, simulate and lower.
#include "check_input.hpp"

#include <cstddef>
#include <cstdint>
#include <string_view>

extern "C" int LLVMFuzzerTestOneInput(std::uint8_t const* data, std::size_t size) {
  weft_fuzz::check_text(std::string_view(reinterpret_cast<char const*>(data), size));
  return 0;
}
