// weft/comm/detail/history.hpp — a communicator's post-mortem memory: the ring of the last N
// op_records and the hook called with each record once its operation completes or fails. One
// policy for every backend: a hook that throws on success reaches the caller; on failure it is
// ignored, so the communication error is the one reported.
#pragma once

#include <weft/comm/concepts.hpp>

#include <cstddef>
#include <cstdint>
#include <mutex>
#include <type_traits>
#include <utility>
#include <vector>

namespace weft::comm::detail {

//! A lock that does nothing: the history of a communicator used by one thread at a time.
struct no_lock {
  void lock() noexcept {}
  void unlock() noexcept {}
};

//! Ring of op_records plus hook. `Mutex` = std::mutex where work completes on another thread than
//! the one issuing (NCCL's waiting thread); no_lock otherwise (no cost on the threads hot path).
template <class Mutex = no_lock>
class basic_op_history {
 public:
  explicit basic_op_history(std::size_t capacity = 0) : capacity_(capacity) {}

  [[nodiscard]] std::size_t capacity() const noexcept { return capacity_; }
  //! Whether a record is kept or seen (a ring, or a hook): when not, the caller need not time its
  //! operations. Unlocked: for a history one thread uses (no_lock).
  [[nodiscard]] bool observed() const noexcept {
    return capacity_ != 0 || static_cast<bool>(hook_);
  }
  //! Keeps the last `n` records from now on (set before the first record).
  void set_capacity(std::size_t n) {
    std::lock_guard<Mutex> lock(m_);
    capacity_ = n;
    ring_.clear();
    recorded_ = 0;
  }

  //! Adds a record; returns its number (for update()).
  std::uint64_t add(op_record const& r) {
    std::lock_guard<Mutex> lock(m_);
    std::uint64_t const id = recorded_++;
    if (capacity_ == 0) return id;
    if (ring_.size() < capacity_) {
      ring_.push_back(r);
    } else {
      ring_[static_cast<std::size_t>(id % capacity_)] = r;
    }
    return id;
  }

  //! Replaces record `id` if it is still kept.
  void update(std::uint64_t id, op_record const& r) {
    std::lock_guard<Mutex> lock(m_);
    if (capacity_ == 0 || id >= recorded_ || id + capacity_ < recorded_) return;
    ring_[static_cast<std::size_t>(id % capacity_)] = r;
  }

  //! The kept records, oldest first.
  [[nodiscard]] std::vector<op_record> records() const {
    std::lock_guard<Mutex> lock(m_);
    std::vector<op_record> out;
    if (capacity_ == 0) return out;
    out.reserve(ring_.size());
    std::uint64_t const first = recorded_ - ring_.size();
    for (std::uint64_t id = first; id < recorded_; ++id)
      out.push_back(ring_[static_cast<std::size_t>(id % capacity_)]);
    return out;
  }

  void set_hook(op_hook hook) {
    std::lock_guard<Mutex> lock(m_);
    hook_ = std::move(hook);
  }

  //! Calls the hook with `r`. ok: its exception propagates; failed: it is swallowed.
  void call_hook(op_record const& r, bool ok) {
    if constexpr (std::is_same_v<Mutex, no_lock>) {
      invoke(hook_, r, ok);
    } else {
      op_hook h;
      {
        std::lock_guard<Mutex> lock(m_);
        h = hook_;
      }
      invoke(h, r, ok);
    }
  }

  //! An operation that finished during its call: recorded and reported at once.
  void finished(op_record const& r) {
    add(r);
    call_hook(r, r.ok);
  }

  //! Operation `id`, added while pending, has finished as `r`.
  void completed(std::uint64_t id, op_record const& r) {
    update(id, r);
    call_hook(r, r.ok);
  }

 private:
  static void invoke(op_hook const& h, op_record const& r, bool ok) {
    if (!h) return;
    if (ok) {
      h(r);
      return;
    }
    try {
      h(r);
    } catch (...) {  // the communication error is the one reported
    }
  }

  mutable Mutex m_;
  std::size_t capacity_ = 0;
  std::vector<op_record> ring_;
  std::uint64_t recorded_ = 0;
  op_hook hook_;
};

using op_history = basic_op_history<>;

//! A failed record: `r` with ok = false, the error text and its end time. Never throws (it runs
//! while an exception is on its way out); out of memory leaves the text empty.
inline void mark_failed(op_record& r, char const* what) noexcept {
  r.ok = false;
  r.end = std::chrono::steady_clock::now();
  try {
    r.error = what;
  } catch (...) {}
}

}  // namespace weft::comm::detail
