// A downstream program: uses weft only through its public headers and CMake targets, and checks
// what it computed, so a consumer test fails if the package hands over a broken library.
#include <weft/core/config.hpp>
#include <weft/core/error.hpp>

#include <cstdio>
#include <string>

int main() {
  int failures = 0;
  try {
    int const count = -1;
    WEFT_EXPECTS(count >= 0, "count", ">= 0", count);
    ++failures;  // must not reach
  } catch (weft::invalid_argument_error const& e) {
    if (std::string(e.what()).find("actual -1") == std::string::npos) ++failures;
  }
#ifdef WEFT_CONSUMER_EXPECT_MPI
  if (WEFT_HAS_MPI != 1) ++failures;
#endif
  std::printf("weft %s consumer (%s): %s\n", WEFT_VERSION_STRING, WEFT_CONSUMER_KIND,
              failures == 0 ? "ok" : "FAILED");
  return failures == 0 ? 0 : 1;
}
