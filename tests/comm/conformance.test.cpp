// tests/comm/conformance.test.cpp — conformance of the threads backend: every collective, every
// op, every dtype, world sizes 1 to 8, every root, zero-length and uneven _v counts, in-place and
// out-of-place, misaligned pointers, against the serial rank-ordered reference, bit for bit
// (tests/support/conformance.hpp holds the checks; the MPI backend, tests/comm/mpi, and the NCCL
// mock, tests/comm/nccl, run the same ones).
#include <weft/comm/threads/world.hpp>

#include <support/conformance.hpp>
#include <support/run_ranks.hpp>

#include <doctest/doctest.h>

namespace {

using weft::bf16;
using weft::f16;
using weft::f32;
using weft::f64;
using weft::i32;
using weft::i64;
using weft::u8;
namespace conf = weft::test::conformance;
using weft::comm::threads::communicator;

constexpr int max_world = 8;

// Messages above 64 bytes take the zero-copy reduce-scatter + all-gather path and smaller ones
// the staged path, so the counts of conf::config exercise both; the zero-copy all_reduce of at
// least 4 KiB writes by non-temporal stores (7919 elements of every type, on buffers shifted by
// one element; 1000 of 8 bytes, aligned), below it by ordinary ones (1000 elements of 1 to 4
// bytes; 37 of every type, shifted). Under ASan and TSan both paths copy by memcpy.
weft::comm::threads::options both_paths() {
  auto o = weft::test::test_options();
  o.small_message_bytes = 64;
  o.streaming_store_bytes = 4096;
  return o;
}

conf::config suite_config() {
  conf::config cfg;
  cfg.counts = {0, 1, 3, 7, 37, 1000, 7919};  // 7919: a prime, uneven over every world size
  return cfg;
}

}  // namespace

TEST_SUITE("threads") {
  TEST_CASE_TEMPLATE(
      "conformance: all_reduce, reduce, reduce_scatter(_v) equal the rank-ordered reference", T,
      f32, f64, bf16, f16, i32, i64, u8) {
    auto const cfg = suite_config();
    for (int n = 1; n <= max_world; ++n) {
      CAPTURE(n);
      weft::test::run_ranks(
          n, [&](communicator& c) { conf::reductions<T>(c, cfg); }, both_paths());
    }
  }

  TEST_CASE_TEMPLATE("conformance: broadcast, all_gather(_v), all_to_all(_v), gather, scatter", T,
                     f32, f64, bf16, f16, i32, i64, u8) {
    auto const cfg = suite_config();
    for (int n = 1; n <= max_world; ++n) {
      CAPTURE(n);
      weft::test::run_ranks(
          n, [&](communicator& c) { conf::data_movement<T>(c, cfg); }, both_paths());
    }
  }

  TEST_CASE_TEMPLATE("conformance: send, recv, isend, irecv", T, f32, f64, bf16, f16, i32, i64,
                     u8) {
    auto const cfg = suite_config();
    for (int n = 1; n <= max_world; ++n) {
      CAPTURE(n);
      weft::test::run_ranks(n, [&](communicator& c) { conf::point_to_point<T>(c, cfg); });
    }
  }

  TEST_CASE("conformance: barrier waits for the last rank") {
    for (int n : {1, 2, 3, 8}) {
      CAPTURE(n);
      weft::test::run_ranks(n, [](communicator& c) { conf::check_barrier(c); });
    }
  }

  TEST_CASE("conformance: exact inputs (the MPI backend's mode) also match bit for bit") {
    conf::config cfg;
    cfg.mode = conf::input_mode::exact;
    cfg.counts = {0, 5, 100};
    for (int n : {2, 3, 5}) {
      CAPTURE(n);
      weft::test::run_ranks(
          n,
          [&](communicator& c) {
            conf::reductions<f32>(c, cfg);
            conf::reductions<bf16>(c, cfg);
            conf::reductions<f16>(c, cfg);
          },
          both_paths());
    }
  }

  TEST_CASE(
      "conformance: default options (staged all_reduce up to 64 KiB) and a multi-block size") {
    // 40000 f32 = 160 KB: above the staging threshold and many reduction blocks per slice.
    for (int n : {2, 3, 4}) {
      CAPTURE(n);
      weft::test::run_ranks(n, [](communicator& c) {
        for (std::size_t count : {std::size_t{1000}, std::size_t{16384}, std::size_t{40000}})
          for (auto kind : conf::all_reduce_kinds) {
            conf::check_all_reduce<f32>(c, count, kind, false);
            conf::check_all_reduce<bf16>(c, count, kind, true);
          }
      });
    }
  }

}  // TEST_SUITE("threads")
