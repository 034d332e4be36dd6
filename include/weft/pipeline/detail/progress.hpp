// weft/pipeline/detail/progress.hpp — the executor's progress thread for the vocabulary
// collectives: it runs the tasks posted to it one after another, in the order they were posted
// (every rank posts its collectives in the schedule's one global order), while the rank's own
// thread goes on with its compute; that thread waits only where an action reads a collective's
// result. A failed task fails every later wait; the tasks after it are not run.
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <deque>
#include <exception>
#include <functional>
#include <mutex>
#include <thread>
#include <utility>
#include <vector>

namespace weft::pipeline::detail {

class progress_thread {
 public:
  using clock = std::chrono::steady_clock;
  struct span {
    clock::time_point start{}, end{};
  };

  progress_thread() = default;
  progress_thread(progress_thread const&) = delete;
  progress_thread& operator=(progress_thread const&) = delete;
  //! Drops the tasks not started and joins. The task running then must be able to finish: its
  //! owner aborts the communicator it blocks in before the destructor runs (run() does).
  ~progress_thread() { stop(); }

  //! Queues `task` and returns its ordinal (0, 1, ... in posting order). Starts the thread at the
  //! first call.
  int post(std::function<void()> task) {
    std::lock_guard lock(m_);
    if (!thread_.joinable()) thread_ = std::thread([this] { loop(); });
    queue_.push_back(std::move(task));
    spans_.emplace_back();
    cv_.notify_all();
    return posted_++;
  }

  //! Blocks until task k has run; rethrows the failure of task k or of an earlier one.
  void wait(int k) {
    std::unique_lock lock(m_);
    cv_.wait(lock, [&] { return completed_ > k || error_; });
    if (completed_ > k) return;
    std::rethrow_exception(error_);
  }

  //! The ordinal of the task that failed, or -1.
  [[nodiscard]] int failed() const {
    std::lock_guard lock(m_);
    return error_ ? completed_ : -1;
  }

  //! When task k started and ended on the progress thread (valid once wait(k) returned).
  [[nodiscard]] span times(int k) const {
    std::lock_guard lock(m_);
    return spans_[static_cast<std::size_t>(k)];
  }

  void stop() noexcept {
    {
      std::lock_guard lock(m_);
      stopping_ = true;
      cv_.notify_all();
    }
    if (thread_.joinable()) thread_.join();
  }

 private:
  void loop() {
    std::unique_lock lock(m_);
    for (;;) {
      cv_.wait(lock, [&] { return stopping_ || (!queue_.empty() && !error_); });
      if (stopping_ || error_) return;
      auto task = std::move(queue_.front());
      queue_.pop_front();
      auto const k = static_cast<std::size_t>(completed_);
      lock.unlock();
      auto const t0 = clock::now();
      std::exception_ptr failure;
      try {
        task();
      } catch (...) {
        failure = std::current_exception();
      }
      auto const t1 = clock::now();
      lock.lock();
      spans_[k] = {t0, t1};
      if (failure)
        error_ = failure;
      else
        ++completed_;
      cv_.notify_all();
    }
  }

  mutable std::mutex m_;
  std::condition_variable cv_;
  std::deque<std::function<void()>> queue_;
  std::vector<span> spans_;
  int posted_ = 0;
  int completed_ = 0;
  bool stopping_ = false;
  std::exception_ptr error_;
  std::thread thread_;
};

}  // namespace weft::pipeline::detail
