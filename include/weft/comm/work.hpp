// weft/comm/work.hpp — the handle every communication call returns (`work`) and the one extension
// point behind it (`work_state`): a communicator that completes operations later derives its
// pending-operation state from work_state and wraps it in a work.
#pragma once

#include <chrono>
#include <memory>
#include <utility>

namespace weft::comm {

//! work_state: the state behind one pending operation. A communicator model (weft's backends, a
//! test double, a user's transport) derives from it and returns `work(std::make_shared<S>(...))`
//! from an operation that may still be running when the call returns.
//!
//! Semantics every derived state guarantees:
//! - `wait_until(deadline)` blocks until the operation completes or `deadline` passes, and returns
//!   whether it completed. If the operation failed, it throws the operation's error (a
//!   weft::comm_error or a subclass) instead of returning, and keeps throwing it on later calls.
//!   `time_point::max()` means "no deadline of the caller's own": the model may still enforce its
//!   own (threads and NCCL throw timeout_error past their default deadline).
//! - `done()` is a non-blocking, non-throwing poll: true once the operation completed (or failed).
//! - Once `wait_until` returned true, the operation's buffers belong to the caller again.
//! - A state is used from the thread that owns the `work` (a `work` is not shared between threads
//!   without the caller's own synchronisation).
//! A model that completes every call before returning needs no state at all: it returns `work{}`.
class work_state {
 public:
  virtual ~work_state() = default;
  //! Waits until done or the deadline; returns whether done. Throws the operation's error.
  virtual bool wait_until(std::chrono::steady_clock::time_point deadline) = 0;
  [[nodiscard]] virtual bool done() const noexcept = 0;
};

namespace detail {
//! The former spelling; backends written before work_state became public use it.
using work_state = ::weft::comm::work_state;
}  // namespace detail

//! Handle to an operation. Host backends return completed work from blocking calls; isend/irecv
//! and stream-ordered backends return pending work. wait() rethrows the operation's error.
class work {
 public:
  work() = default;  // already complete
  explicit work(std::shared_ptr<work_state> s) : state_(std::move(s)) {}

  //! Blocks until complete (bounded by the communicator's deadline); throws its comm_error.
  void wait() {
    if (state_) state_->wait_until(std::chrono::steady_clock::time_point::max());
  }
  //! Waits at most `d`; false if still pending (no throw for the deadline itself).
  bool wait_for(std::chrono::milliseconds d) {
    return !state_ || state_->wait_until(std::chrono::steady_clock::now() + d);
  }
  [[nodiscard]] bool done() const noexcept { return !state_ || state_->done(); }

 private:
  std::shared_ptr<work_state> state_;
};

}  // namespace weft::comm
