// tests/comm/mpi/conformance.test.cpp — the shared Communicator conformance suite on the MPI
// backend, one process per rank (exact inputs: MPI combines in its own order), plus the same checks
// with every message cut into chunks of 5 elements, which drives the paths used above INT_MAX.
#include "support/conformance.hpp"

#include <weft/comm/mpi/communicator.hpp>

#include <doctest/doctest.h>

#include <chrono>

namespace cf = weft::test::conformance;
using weft::comm::mpi::communicator;

namespace {

weft::comm::mpi::options test_options(std::size_t max_count = static_cast<std::size_t>(INT_MAX)) {
  weft::comm::mpi::options o;
  o.timeout = std::chrono::seconds(10);  // a broken collective fails the run instead of hanging it
  o.max_count = max_count;
  return o;
}

cf::config exact_config() {
  cf::config cfg;
  cfg.mode = cf::input_mode::exact;
  return cfg;
}

}  // namespace

TEST_SUITE("mpi") {
  TEST_CASE_TEMPLATE("mpi conformance: reductions (every op, root, count, in/out of place)", T,
                     weft::f32, weft::f64, weft::bf16, weft::f16, weft::i32, weft::i64, weft::u8) {
    auto c = communicator::world(test_options());
    cf::reductions<T>(c, exact_config());
    CHECK(c.state() == weft::comm::comm_state::healthy);
  }

  TEST_CASE_TEMPLATE("mpi conformance: general inputs are bitwise exact up to 2 ranks", T,
                     weft::f32, weft::f64, weft::bf16, weft::f16) {
    // With two contributions every order of combination gives the same bits (IEEE addition and
    // multiplication commute), so inputs whose rounding depends on the order must match too: this
    // catches double rounding of 16-bit floats and scaling done in the wrong type.
    auto c = communicator::world(test_options());
    if (c.size() > 2) return;
    cf::config cfg;
    cfg.mode = cf::input_mode::general;
    cf::reductions<T>(c, cfg);
  }

  TEST_CASE_TEMPLATE("mpi conformance: data movement (every root, uneven and zero _v counts)", T,
                     weft::f32, weft::f64, weft::bf16, weft::f16, weft::i32, weft::i64, weft::u8) {
    auto c = communicator::world(test_options());
    cf::data_movement<T>(c, exact_config());
  }

  TEST_CASE_TEMPLATE("mpi conformance: point to point", T, weft::f32, weft::bf16, weft::i64,
                     weft::u8) {
    auto c = communicator::world(test_options());
    cf::point_to_point<T>(c, exact_config());
  }

  TEST_CASE("mpi conformance: barrier waits for the last rank") {
    auto c = communicator::world(test_options());
    cf::check_barrier(c);
  }

  TEST_CASE_TEMPLATE("mpi conformance: chunked paths (max_count 5)", T, weft::f32, weft::bf16,
                     weft::i64) {
    // Every count above 5 elements (or 5 in total for the _v and rooted data movements) takes the
    // chunked route: several MPI calls per reduction, point-to-point fallbacks for data movement.
    auto c = communicator::world(test_options(5));
    cf::config cfg = exact_config();
    cfg.counts = {0, 1, 3, 7, 37};
    cf::reductions<T>(c, cfg);
    cf::data_movement<T>(c, cfg);
    cf::point_to_point<T>(c, cfg);
  }

}  // TEST_SUITE
