// The CI canary: a test that fails on purpose when WEFT_CI_CANARY=1, so that a test of .ci/run
// (tests/ci/canary.sh) can prove a failing test turns CI red.
#include <doctest/doctest.h>

#include <cstdlib>
#include <string_view>

TEST_CASE("ci canary: fails when WEFT_CI_CANARY=1") {
  char const* planted = std::getenv("WEFT_CI_CANARY");
  INFO("WEFT_CI_CANARY=1 plants this failure on purpose");
  CHECK_FALSE((planted != nullptr && std::string_view(planted) == "1"));
}
