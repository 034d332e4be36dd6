// weft/comm/threads/world.hpp — starting N ranks as threads: threads::world runs a callable on
// every rank with its communicator, joins them, and rethrows the first failure (after aborting the
// world so that no peer is left waiting for the rank that failed).
#pragma once

#include <weft/comm/threads/communicator.hpp>
#include <weft/comm/threads/options.hpp>
#include <weft/core/error.hpp>

#include <exception>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <type_traits>
#include <utility>
#include <vector>

namespace weft::comm::threads {

namespace detail {
inline std::string describe_exception(std::exception_ptr const& e) {
  try {
    std::rethrow_exception(e);
  } catch (std::exception const& x) {
    return x.what();
  } catch (...) {
    return "an exception not derived from std::exception";
  }
}
}  // namespace detail

//! N ranks as threads of this process.
//!
//!   weft::comm::threads::world w(4);
//!   w.run([&](weft::comm::threads::communicator& comm) { ... comm.all_reduce(...) ... });
//!
//! run() creates fresh communicators (one group), starts one thread per rank, calls f(comm) on
//! each (concurrently: f must be safe to call from n threads at once), and joins them all. If f
//! throws on some rank, that rank aborts the world: every peer's pending and later calls on any
//! communicator of this world (split ones included) throw peer_aborted_error naming it. After the
//! join, run() rethrows the first exception thrown by any f (the original failure, not the
//! peer_aborted_errors it caused). Nothing outlives run(). A rank whose f returns has finished: a
//! peer that waits for it (in a collective or a point-to-point message of any communicator of this
//! world that it belongs to) throws peer_aborted_error naming it at once, without waiting for the
//! deadline. Ranks that multiply matrices should run BLAS single-threaded
//! (openblas_set_num_threads(1)), or N ranks times M BLAS threads oversubscribe the cores.
class world {
 public:
  explicit world(int size, options opts = {}) : size_(size), opts_(opts) {
    WEFT_EXPECTS(size >= 1 && size <= detail::group::max_size, "size",
                 weft::detail::concat("a world size in [1, ", detail::group::max_size, "]"), size);
    WEFT_EXPECTS(opts.timeout.count() > 0, "opts.timeout", "> 0 ms", opts.timeout.count());
  }

  [[nodiscard]] int size() const noexcept { return size_; }
  [[nodiscard]] options const& opts() const noexcept { return opts_; }

  template <class F>
  requires std::invocable<F&, communicator&>
  void run(F&& f) const {
    auto comms = make_communicators(size_, opts_);
    // Kept here, not taken from comms[r] when a rank fails: f may have moved its communicator.
    std::shared_ptr<detail::group> const root = comms[0].group_;
    std::mutex m;
    std::exception_ptr first;
    auto body = [&](int r) {
      try {
        std::invoke(f, comms[static_cast<std::size_t>(r)]);
        // This rank will never call again: peers waiting for it fail now (peer_aborted_error),
        // not at their deadline.
        root->depart(r, true);
      } catch (...) {
        auto e = std::current_exception();
        {
          std::lock_guard<std::mutex> lock(m);
          if (!first) first = e;
        }
        std::string reason;
        try {
          // "world rank": the reason reaches every group split from the world too.
          reason =
              weft::detail::concat("world rank ", r, " failed: ", detail::describe_exception(e));
        } catch (...) {}
        root->abort_tree(r, reason);
      }
    };
    std::vector<std::thread> threads;
    threads.reserve(static_cast<std::size_t>(size_));
    try {
      for (int r = 0; r < size_; ++r) threads.emplace_back(body, r);
    } catch (...) {
      // Could not start every rank: release the started ones, then report.
      root->abort_tree(-1, "threads::world could not start all its threads");
      for (auto& t : threads) t.join();
      throw;
    }
    for (auto& t : threads) t.join();
    if (first) std::rethrow_exception(first);
  }

 private:
  int size_;
  options opts_;
};

//! world(n, opts).run(f).
template <class F>
requires std::invocable<F&, communicator&>
void run(int n, F&& f, options opts = {}) { world(n, opts).run(std::forward<F>(f)); }

}  // namespace weft::comm::threads
