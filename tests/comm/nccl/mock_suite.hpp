// tests/comm/nccl/mock_suite.hpp — what the shared suites (tests/support/conformance.hpp and
// faults.hpp) need to run on the NCCL backend over the mock: buffers labelled cuda memory (the
// mock reads "device" pointers as host memory), and a harness that runs n ranks as threads, each
// with an NCCL communicator created over a threads communicator.
#pragma once

#if defined(__CUDACC__)
#include <weft/comm/nccl/communicator.cuh>
#else
#include <weft/comm/nccl/communicator.hpp>  // g++ iteration: the same logic without nvcc
#endif
#include <weft/comm/threads/world.hpp>

#include "mock_nccl.hpp"
#include "support/conformance.hpp"
#include "support/run_ranks.hpp"

#include <chrono>
#include <exception>
#include <span>
#include <utility>

namespace weft::test {

//! Host memory labelled cuda, device -1 (the communicator's own): what the mock accepts.
struct mock_device_memory {
  template <class T>
  [[nodiscard]] static comm::buffer_view view(std::span<T> s) noexcept {
    auto v = comm::host_view(s);
    v.where = comm::memory_kind::cuda;
    v.device = -1;
    return v;
  }
};

template <>
struct memory_of<comm::nccl::communicator> {
  using type = mock_device_memory;
};

namespace nccl_mock {

//! Options of a communicator over the mock: its api table, a deadline, fast polling.
inline comm::nccl::options suite_options(std::chrono::milliseconds timeout, bool fingerprints) {
  comm::nccl::options o;
  o.api = &mock::api();
  o.timeout = timeout;
  o.check_fingerprints = fingerprints;
  o.poll_interval = std::chrono::microseconds(20);
  return o;
}

//! Runs f(comm::nccl::communicator&) on n ranks (threads), each communicator created over a threads
//! communicator on its own (mock) device, in a fresh mock world; rethrows the first failure.
template <class F>
void run_ranks(int n, F&& f, std::chrono::milliseconds timeout = default_test_timeout,
               bool fingerprints = false) {
  mock m;
  comm::threads::world(n, test_options()).run([&](comm::threads::communicator& host) {
    auto c =
        comm::nccl::communicator::create(host, host.rank(), suite_options(timeout, fingerprints));
    f(c);
  });
}

//! The fault suite's harness (tests/support/faults.hpp): fingerprints on.
struct harness {
  using comm_type = comm::nccl::communicator;
  static constexpr bool names_missing_ranks = false;  // see faults.hpp, missing_rank
  static constexpr bool ranks_in_process = true;

  template <class F>
  std::exception_ptr run(int n, std::chrono::milliseconds timeout, F&& body) {
    try {
      nccl_mock::run_ranks(n, std::forward<F>(body), timeout, true);
    } catch (...) {
      return std::current_exception();
    }
    return nullptr;
  }
};

}  // namespace nccl_mock
}  // namespace weft::test
