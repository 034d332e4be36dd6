// The one translation unit with doctest's implementation and main(); every test area links it.
#define DOCTEST_CONFIG_IMPLEMENT_WITH_MAIN
#include <doctest/doctest.h>
