// tests/comm/nccl/conformance.test.cu — the shared Communicator conformance suite
// (tests/support/conformance.hpp) on the NCCL backend over the mock, world sizes 1 to 4, exact
// inputs (the mock reduces in its own precision, as NCCL reduces in its own order).
#include "mock_suite.hpp"

#include <doctest/doctest.h>

namespace {

namespace cf = weft::test::conformance;
namespace mk = weft::test::nccl_mock;
using weft::comm::nccl::communicator;

constexpr int max_world = 4;

cf::config mock_config() {
  cf::config cfg;
  cfg.mode = cf::input_mode::exact;
  cfg.counts = {0, 1, 3, 7, 37};
  cfg.rooted_count = 7;
  return cfg;
}

}  // namespace

TEST_CASE_TEMPLATE("nccl mock conformance: all_reduce, reduce, reduce_scatter(_v)", T, weft::f32,
                   weft::f64, weft::bf16, weft::f16, weft::i32, weft::i64, weft::u8) {
  auto const cfg = mock_config();
  for (int n = 1; n <= max_world; ++n) {
    CAPTURE(n);
    mk::run_ranks(n, [&](communicator& c) { cf::reductions<T>(c, cfg); });
  }
}

TEST_CASE_TEMPLATE(
    "nccl mock conformance: broadcast, all_gather(_v), all_to_all(_v), gather, scatter", T,
    weft::f32, weft::f64, weft::bf16, weft::f16, weft::i32, weft::i64, weft::u8) {
  auto const cfg = mock_config();
  for (int n = 1; n <= max_world; ++n) {
    CAPTURE(n);
    mk::run_ranks(n, [&](communicator& c) { cf::data_movement<T>(c, cfg); });
  }
}

TEST_CASE_TEMPLATE("nccl mock conformance: send, recv, isend, irecv", T, weft::f32, weft::bf16,
                   weft::i64, weft::u8) {
  auto const cfg = mock_config();
  for (int n = 1; n <= max_world; ++n) {
    CAPTURE(n);
    mk::run_ranks(n, [&](communicator& c) { cf::point_to_point<T>(c, cfg); });
  }
}

TEST_CASE("nccl mock conformance: barrier waits for the last rank") {
  for (int n : {1, 2, 3}) {
    CAPTURE(n);
    mk::run_ranks(n, [](communicator& c) { cf::check_barrier(c); });
  }
}
