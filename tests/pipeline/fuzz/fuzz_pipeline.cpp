// libFuzzer target: the input read as either form, so one corpus drives parse -> validate ->
// simulate -> lower through both parsers (the first byte picks which is tried first).
#include "check_input.hpp"

#include <cstddef>
#include <cstdint>
#include <string_view>

extern "C" int LLVMFuzzerTestOneInput(std::uint8_t const* data, std::size_t size) {
  std::string_view const bytes(reinterpret_cast<char const*>(data), size);
  if (size > 0 && (data[0] & 1)) {
    weft_fuzz::check_csv(bytes);
    weft_fuzz::check_text(bytes);
  } else {
    weft_fuzz::check_text(bytes);
    weft_fuzz::check_csv(bytes);
  }
  return 0;
}
