// tests/comm/mpi/straggler.test.cpp — straggler detection over MPI processes (comm/monitored.hpp
// with stamp_exchange::all_gather): with one rank 20 % slower from collective 40 on, every rank
// names it within 20 collectives (run with 4 processes), and normal steps raise no alarm.
#include <weft/comm/monitored.hpp>
#include <weft/comm/mpi/communicator.hpp>

#include <doctest/doctest.h>

#include <chrono>
#include <cstdint>
#include <memory>
#include <span>
#include <thread>
#include <vector>

namespace {

namespace wc = weft::comm;
using namespace std::chrono_literals;
using monitored = wc::monitored<wc::mpi::communicator>;

static_assert(wc::Communicator<monitored>);

// Steps of 100 ms (sleeps), and the waiting processes yield their core (the test's environment
// sets OMPI_MCA_mpi_yield_when_idle=1): 4 processes on a loaded 2-core machine delay each other
// by up to ~4 ms, persistently for the one that shares a busy core, so the floor is 10 ms and
// the slow rank's 20 ms lag is over max(10 ms, 10 % of a step).
wc::straggler_options options() {
  wc::straggler_options o;
  o.min_lag = 10ms;
  return o;
}

struct outcome {
  std::vector<wc::straggler_report> named;
  std::uint64_t evaluated = 0;
};

outcome run_steps(int slow_rank, std::uint64_t slow_from, std::uint64_t total) {
  wc::mpi::options mo;
  mo.timeout = 30s;
  monitored m(wc::mpi::communicator::world(mo), nullptr);
  auto mon =
      std::make_shared<wc::straggler_monitor>(m.size(), options(), wc::stamp_exchange::all_gather);
  m = monitored(std::move(m.inner()), mon);
  outcome out;
  mon->set_hook([&](wc::straggler_report const& r) { out.named.push_back(r); });
  float in[2] = {1.0f, 2.0f};
  float res[2] = {};
  for (std::uint64_t k = 0; k < total; ++k) {
    auto d = std::chrono::microseconds(100000);
    if (m.rank() == slow_rank && k >= slow_from) d = d * 12 / 10;
    std::this_thread::sleep_for(d);
    m.all_reduce(wc::host_view(std::span<float>(in)), wc::host_view(std::span<float>(res))).wait();
    REQUIRE(res[0] == float(m.size()));
  }
  out.evaluated = mon->collectives();
  return out;
}

}  // namespace

TEST_SUITE("mpi") {
  TEST_CASE("straggler over MPI: a rank 20 % slower from collective 40 on is named within 20") {
    int n = 0;
    MPI_Comm_size(MPI_COMM_WORLD, &n);
    int const slow = n - 1;
    auto const got = run_steps(slow, 40, 100);
    for (auto const& r : got.named)
      MESSAGE("named rank " << r.rank << " at collective " << r.collective << ", lag "
                            << r.lag * 1e6 << " us, bar " << r.bar * 1e6 << " us, step "
                            << r.step * 1e6 << " us");
    CHECK(got.evaluated == 96);  // exchanged every 8 collectives
    if (n < 3) return;           // two ranks: the median is their mean, both lags are half the gap
    REQUIRE(got.named.size() == 1);
    CHECK(got.named[0].rank == slow);
    CHECK(got.named[0].collective >= 40);
    CHECK(got.named[0].collective - 40 <= 20);
  }

  TEST_CASE("straggler over MPI: equal steps raise no alarm") {
    auto const got = run_steps(-1, 0, 96);
    for (auto const& r : got.named)
      MESSAGE("false alarm: rank " << r.rank << " at collective " << r.collective << ", lag "
                                   << r.lag * 1e6 << " us");
    CHECK(got.named.empty());
  }
}  // TEST_SUITE("mpi")
