// weft/comm/threads/detail/group.hpp — the state the ranks of one threads-backend communicator
// share: per-rank descriptor slots (double-buffered by sequence parity), the arrival word of the
// first barrier, progress counters, the sticky fault record, sub-groups, and point-to-point queues.
#pragma once

#include <weft/comm/concepts.hpp>
#include <weft/comm/detail/describe.hpp>
#include <weft/comm/detail/fault.hpp>
#include <weft/comm/threads/detail/parking.hpp>
#include <weft/comm/threads/options.hpp>
#include <weft/core/error.hpp>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <thread>
#include <utility>
#include <vector>

namespace weft::comm::threads::detail {

//! Why a group is dead (`origin`: the group rank that caused or detected it, -1 if outside).
using fault_info = weft::comm::detail::fault;

//! What a rank posts for one collective; read by peers after the first barrier of that
//! collective. Pointers into caller memory stay valid until the collective's last barrier.
struct descriptor {
  fingerprint fp{};
  double scalar = 1.0;
  std::byte const* send = nullptr;
  std::byte* recv = nullptr;
  std::size_t const* counts = nullptr;  // all_gather_v, reduce_scatter_v; all_to_all_v: send counts
  std::size_t const* counts2 = nullptr;  // all_to_all_v: receive counts
  int color = 0;                         // split
  int key = 0;
};

class group;

struct alignas(64) rank_slot {
  // desc[seq & 1] is written by its owner for collective `seq` before it arrives at barrier A.
  // A peer can be at most one collective ahead, so the other parity is never overwritten early.
  descriptor desc[2];
  std::atomic<std::uint64_t> arrived{0};    // last seq this rank arrived at (for messages only)
  std::atomic<std::uint64_t> progress{0};   // 4 * seq + phase, monotonic: barriers after A
  std::atomic<bool> departed{false};        // its owner is gone: it will never call again
  std::shared_ptr<group> split_out;         // written by a split leader between phases
  std::unique_ptr<std::byte[]> staging[2];  // owner's copy-in buffers of small all_reduce
};

//! One point-to-point message half (a send or a receive) waiting in a queue.
struct p2p_op {
  enum state_t : int { pending, claimed, done, failed, cancelled };
  std::atomic<int> state{pending};
  bool is_send = true;
  int src = 0;
  int dst = 0;
  std::byte* data = nullptr;
  std::size_t count = 0;
  dtype type = dtype::f32;
  std::uint64_t seq = 0;
  // Written before `state` becomes failed (release), read after observing it (acquire).
  errc error_kind = errc::comm;
  std::string error;
};

class group {
 public:
  static constexpr int max_size = (1 << 23) - 1;

  group(int n, options opts, std::vector<int> world_ranks, bool split = false)
      : n_(n),
        split_(split),
        opts_(opts),
        world_ranks_(std::move(world_ranks)),
        slots_(new rank_slot[static_cast<std::size_t>(n)]),
        sends_(static_cast<std::size_t>(n) * static_cast<std::size_t>(n)),
        recvs_(static_cast<std::size_t>(n) * static_cast<std::size_t>(n)) {
    // More rank threads than cores (the world holds at least n and its largest rank + 1): waiters
    // only pause and yield twice before they sleep, since longer yielding takes turns from peers
    // that have work (+10 % on the 8-byte all_reduce at 8 ranks on 2 cores).
    int world = n;
    for (int r : world_ranks_) world = std::max(world, r + 1);
    unsigned const cores = std::thread::hardware_concurrency();
    if (cores != 0 && static_cast<unsigned>(world) > cores)
      park_.set_yield_time(std::chrono::microseconds{0});
  }

  group(group const&) = delete;
  group& operator=(group const&) = delete;

  [[nodiscard]] int size() const noexcept { return n_; }
  [[nodiscard]] options const& opts() const noexcept { return opts_; }
  [[nodiscard]] int world_rank(int r) const noexcept {
    return r >= 0 && r < n_ ? world_ranks_[static_cast<std::size_t>(r)] : -1;
  }
  [[nodiscard]] std::vector<int> const& world_ranks() const noexcept { return world_ranks_; }
  //! Made by split: messages then give world ranks beside group ranks.
  [[nodiscard]] bool is_split() const noexcept { return split_; }
  [[nodiscard]] rank_slot& slot(int r) noexcept { return slots_[static_cast<std::size_t>(r)]; }
  [[nodiscard]] parking& park() noexcept { return park_; }

  // ---- barrier A: the arrival word --------------------------------------------------------
  // arrival_[seq & 1] = seq << 24 | closed << 23 | count. Arriving and closing are both CAS on
  // this one word, so "everyone arrived" and "given up" can never both happen: a rank that
  // leaves with an exception closes the barrier first, and nobody passes a closed barrier, so no
  // peer reads the buffers of a rank that has thrown.

  //! Counts this rank in; false if the barrier was closed by a fault.
  bool arrive(std::uint64_t seq) noexcept {
    auto& w = arrival_[seq & 1u];
    std::uint64_t cur = w.load(std::memory_order_acquire);
    for (;;) {
      std::uint64_t next = 0;
      if ((cur >> seq_shift) == seq) {
        if ((cur & closed_bit) != 0) return false;
        next = cur + 1;
      } else {
        next = (seq << seq_shift) | 1u;  // the first arrival of `seq` recycles the word of seq-2
      }
      if (w.compare_exchange_weak(cur, next, std::memory_order_acq_rel, std::memory_order_acquire))
        break;
    }
    park_.notify_all();
    return true;
  }

  [[nodiscard]] bool all_arrived(std::uint64_t seq) const noexcept {
    return arrival_[seq & 1u].load(std::memory_order_acquire) ==
           ((seq << seq_shift) | static_cast<std::uint64_t>(n_));
  }

  //! Closes barrier `seq` unless everyone has arrived; true if it is (now) closed. `on_close`
  //! runs under the fault lock when this call closes it (to record why).
  template <class OnClose>
  bool close_or_pass(std::uint64_t seq, OnClose&& on_close) {
    bool closed_now = false;
    {
      std::lock_guard<std::mutex> lock(fault_mutex_);
      auto& w = arrival_[seq & 1u];
      std::uint64_t cur = w.load(std::memory_order_acquire);
      for (;;) {
        if (cur == ((seq << seq_shift) | static_cast<std::uint64_t>(n_))) return false;
        if ((cur & closed_bit) != 0) return true;
        if (w.compare_exchange_weak(cur, cur | closed_bit, std::memory_order_acq_rel,
                                    std::memory_order_acquire)) {
          closed_now = true;
          break;
        }
      }
      on_close(*this);
    }
    if (closed_now) park_.notify_all();
    return true;
  }

  // ---- faults ------------------------------------------------------------------------------

  [[nodiscard]] bool faulted() const noexcept { return faulted_.load(std::memory_order_acquire); }

  //! Records the first fault (later ones are ignored) and wakes every waiter.
  void fail(fault_info f) noexcept {
    {
      std::lock_guard<std::mutex> lock(fault_mutex_);
      fail_locked(std::move(f));
    }
    park_.notify_all();
  }

  //! For close_or_pass's callback, which already holds the fault lock.
  void fail_locked(fault_info&& f) noexcept {
    if (faulted_.load(std::memory_order_relaxed)) return;
    fault_ = std::move(f);
    faulted_.store(true, std::memory_order_release);
  }

  [[nodiscard]] fault_info fault() const {
    std::lock_guard<std::mutex> lock(fault_mutex_);
    return fault_;
  }

  //! Poisons this group and every group split from it (transitively): each waiter throws
  //! peer_aborted_error. `origin` is a rank of this group (-1 if none); `reason` says why.
  //! Every group of the tree records its fault before any waiter is woken: a rank woken by one
  //! group then finds the others poisoned too, and cannot return and depart (see depart) in time
  //! for a peer elsewhere in the tree to report that departure instead of the abort.
  void abort_tree(int origin, std::string const& reason) noexcept {
    record_abort_tree(origin, reason);
    wake_tree();
  }

  // ---- departures ----------------------------------------------------------------------------
  // A rank whose function returned (threads::world) or whose communicator was destroyed will
  // never arrive again: a peer waiting for it fails at once with peer_aborted_error instead of
  // waiting for its deadline. Departure is not a fault: groups not waiting on it stay healthy.

  //! Marks rank r of this group (and, with `tree`, its rank in every group split from this one)
  //! as departed and wakes waiters.
  void depart(int r, bool tree) noexcept {
    if (r < 0 || r >= n_) return;
    if (tree) {
      try {
        std::vector<std::pair<std::shared_ptr<group>, int>> kids;
        {
          std::lock_guard<std::mutex> lock(children_mutex_);
          for (auto const& [weak, members] : children_)
            if (auto g = weak.lock())
              for (std::size_t i = 0; i < members.size(); ++i)
                if (members[i] == r) kids.emplace_back(std::move(g), static_cast<int>(i));
        }
        for (auto& [g, child_rank] : kids) g->depart(child_rank, true);
      } catch (...) {
        // Out of memory: the sub-groups fall back to their deadlines.
      }
    }
    if (!slot(r).departed.exchange(true, std::memory_order_seq_cst))
      departed_count_.fetch_add(1, std::memory_order_seq_cst);
    park_.notify_all();
  }

  //! A departed rank that has not arrived at barrier `seq` (it never will), or -1.
  [[nodiscard]] int departed_missing(std::uint64_t seq) noexcept {
    if (departed_count_.load(std::memory_order_acquire) == 0) return -1;
    for (int s = 0; s < n_; ++s) {
      auto& sl = slot(s);
      if (sl.departed.load(std::memory_order_acquire) &&
          sl.arrived.load(std::memory_order_acquire) < seq)
        return s;
    }
    return -1;
  }

  [[nodiscard]] bool departed(int r) noexcept {
    return departed_count_.load(std::memory_order_acquire) != 0 &&
           slot(r).departed.load(std::memory_order_acquire);
  }

  // abort_tree's two passes: record the fault in this group and its descendants, then wake them.
  void record_abort_tree(int origin, std::string const& reason) noexcept {
    try {
      {
        fault_info f;
        f.kind = errc::peer_aborted;
        f.origin = origin;
        f.message = reason;
        std::lock_guard<std::mutex> lock(fault_mutex_);
        fail_locked(std::move(f));
      }
      for (auto& [g, members] : live_children()) {
        int child_origin = -1;
        for (std::size_t i = 0; i < members.size(); ++i)
          if (members[i] == origin) child_origin = static_cast<int>(i);
        g->record_abort_tree(child_origin, reason);
      }
    } catch (...) {
      // Out of memory while describing the fault: still poison, with an empty record.
      faulted_.store(true, std::memory_order_release);
    }
  }
  void wake_tree() noexcept {
    park_.notify_all();
    try {
      for (auto& [g, members] : live_children()) g->wake_tree();
    } catch (...) {
      // Out of memory: the sub-groups' waiters see the poison at their next wake-up or deadline.
    }
  }
  std::vector<std::pair<std::shared_ptr<group>, std::vector<int>>> live_children() {
    std::vector<std::pair<std::shared_ptr<group>, std::vector<int>>> kids;
    std::lock_guard<std::mutex> lock(children_mutex_);
    for (auto const& [weak, members] : children_)
      if (auto g = weak.lock()) kids.emplace_back(std::move(g), members);
    return kids;
  }

  //! Registers a group split from this one; `members[i]` is the rank here of its rank i.
  void add_child(std::shared_ptr<group> const& child, std::vector<int> members) {
    std::lock_guard<std::mutex> lock(children_mutex_);
    std::erase_if(children_, [](auto const& c) { return c.first.expired(); });
    children_.emplace_back(child, std::move(members));
  }

  // ---- point-to-point queues ---------------------------------------------------------------
  // sends(src, dst): sends from src to dst not yet received; recvs(src, dst): receives posted by
  // dst for messages from src not yet matched. Guarded by p2p_mutex.
  std::mutex p2p_mutex;
  std::deque<std::shared_ptr<p2p_op>>& sends(int src, int dst) noexcept {
    return sends_[static_cast<std::size_t>(src) * static_cast<std::size_t>(n_) +
                  static_cast<std::size_t>(dst)];
  }
  std::deque<std::shared_ptr<p2p_op>>& recvs(int src, int dst) noexcept {
    return recvs_[static_cast<std::size_t>(src) * static_cast<std::size_t>(n_) +
                  static_cast<std::size_t>(dst)];
  }

 private:
  static constexpr int seq_shift = 24;
  static constexpr std::uint64_t closed_bit = std::uint64_t{1} << 23;

  int n_;
  bool split_ = false;
  options opts_;
  std::vector<int> world_ranks_;
  std::unique_ptr<rank_slot[]> slots_;
  parking park_;
  std::atomic<std::uint64_t> arrival_[2] = {0, 0};

  std::atomic<bool> faulted_{false};
  std::atomic<int> departed_count_{0};
  mutable std::mutex fault_mutex_;
  fault_info fault_;

  std::mutex children_mutex_;
  std::vector<std::pair<std::weak_ptr<group>, std::vector<int>>> children_;

  std::vector<std::deque<std::shared_ptr<p2p_op>>> sends_;
  std::vector<std::deque<std::shared_ptr<p2p_op>>> recvs_;
};

// ---- how messages name ranks and groups ---------------------------------------------------------

inline weft::comm::detail::group_names names(group const& g, std::string_view name = {}) {
  return {g.is_split(), g.world_ranks(), name};
}
inline std::string who(group const& g, int r) { return names(g).who(r); }
inline std::string ranks(group const& g, std::vector<int> const& v) { return names(g).ranks(v); }
inline std::string group_label(group const& g, std::string const& name) {
  return names(g, name).label();
}

}  // namespace weft::comm::threads::detail
