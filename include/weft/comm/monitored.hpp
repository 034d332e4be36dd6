// weft/comm/monitored.hpp — straggler and fault detection around any host communicator:
// straggler_monitor (per-rank arrival stamps, a bounded lag history, the detector, a hook and a
// query), monitored<C> (a Communicator that stamps each rank's arrival at its collectives and feeds
// the monitor) and straggler_watchdog (an opt-in thread that names silent ranks before the
// deadline).
#pragma once

#include <weft/comm/concepts.hpp>
#include <weft/comm/detail/ticks.hpp>
#include <weft/comm/straggler.hpp>
#include <weft/comm/work.hpp>
#include <weft/core/error.hpp>
#include <weft/core/memory.hpp>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <span>
#include <stop_token>
#include <thread>
#include <utility>
#include <vector>

namespace weft::comm {

//! How the ranks' arrival stamps reach the detector.
enum class stamp_exchange : std::uint8_t {
  //! One monitor shared by every rank of one process (the threads backend): each rank writes its
  //! arrival on the one steady clock, rank 0 evaluates each collective as it completes, exactly;
  //! a watchdog can see who has not arrived yet.
  shared_clock,
  //! One monitor per rank (MPI processes): each rank keeps how long it waited in each collective
  //! (and the interval since its previous one), and every straggler_options::exchange_every
  //! collectives the ranks all_gather them. Every rank then evaluates the same rows and reaches
  //! the same verdict. A rank that arrives d late waits d less than its peers, so lag = median
  //! wait - own wait needs no clock alignment.
  all_gather,
};

using straggler_hook = std::function<void(straggler_report const&)>;

//! The state behind monitored<C>: arrival stamps per rank, the detector, the current suspects.
//! Thread-safe: ranks, a watchdog and user threads may call it concurrently. The hook is called
//! with a report each time a rank is named (slow: by the thread that evaluated the collective:
//! rank 0 with a shared clock, or the watchdog when it evaluates (set_offload), every rank with
//! all_gather; silent: by the thread calling poll()), one call at a time, never under the
//! monitor's lock (it may call suspects()).
class straggler_monitor {
 public:
  using clock = std::chrono::steady_clock;

  straggler_monitor(int ranks, straggler_options const& o = {},
                    stamp_exchange x = stamp_exchange::shared_clock)
      : n_(ranks), o_(o), x_(x), det_(ranks, o) {
    auto const n = static_cast<std::size_t>(ranks);
    slots_.reset(new slot[n]);
    if (x == stamp_exchange::shared_clock) {
      stamps_.reset(new stamp_line[n * ring / per_line]);
      ticks_ = detail::tick_clock::get();
      epoch_ = ticks_.now();
    }
    row_.resize(n);
  }
  straggler_monitor(straggler_monitor const&) = delete;
  straggler_monitor& operator=(straggler_monitor const&) = delete;

  [[nodiscard]] int ranks() const noexcept { return n_; }
  [[nodiscard]] straggler_options const& options() const noexcept { return o_; }
  [[nodiscard]] stamp_exchange exchange() const noexcept { return x_; }

  //! The hook runs under the hook's own lock: it may call suspects(), collectives() and
  //! lag_history(), but not evaluate(), poll() or set_offload(), nor destroy a watchdog (they
  //! would wait for that lock).
  void set_hook(straggler_hook h) {
    std::lock_guard<std::mutex> lock(hook_mu_);
    hook_ = std::move(h);
  }

  //! The ranks named now: slow ones (still over the bar) and silent ones (still missing).
  [[nodiscard]] std::vector<straggler_report> suspects() const {
    std::lock_guard<std::mutex> lock(mu_);
    std::vector<straggler_report> v = slow_;
    v.insert(v.end(), silent_.begin(), silent_.end());
    return v;
  }
  //! Collectives evaluated so far (shared_clock: in batches of 8 by rank 0, or by whoever calls
  //! poll() or evaluate() when offloaded; all_gather: at each exchange).
  [[nodiscard]] std::uint64_t collectives() const {
    std::lock_guard<std::mutex> lock(mu_);
    return det_.rows();
  }

  //! shared_clock: whether the evaluation is offloaded. Off (the default), rank 0 evaluates each
  //! batch of 8 collectives as it completes, on the collectives' critical path. On, the ranks only
  //! stamp their arrivals and poll() (a straggler_watchdog's thread) evaluates what has completed;
  //! rank 0 evaluates only when `ring / 2` collectives are pending, so no stamp is ever lost.
  //! Turning it off evaluates what is pending. Ignored with all_gather.
  void set_offload(bool on) {
    offload_.store(on && x_ == stamp_exchange::shared_clock, std::memory_order_release);
    if (!on) evaluate();
  }
  [[nodiscard]] bool offloaded() const noexcept { return offload_.load(std::memory_order_acquire); }

  //! shared_clock: evaluates every collective that all ranks have entered and the detector has
  //! not seen yet (what poll() does when offloaded); returns how many. 0 with all_gather.
  std::uint64_t evaluate() {
    if (x_ != stamp_exchange::shared_clock) return 0;
    std::vector<straggler_report> fresh;
    std::uint64_t done = 0;
    {
      std::lock_guard<std::mutex> lock(mu_);
      done = evaluate_locked(fresh);
    }
    fire(fresh);
    return done;
  }

  //! shared_clock: collectives that every rank has entered and the detector has not evaluated.
  [[nodiscard]] std::uint64_t pending() const noexcept {
    if (x_ != stamp_exchange::shared_clock) return 0;
    // evaluated_ first: both only grow, and evaluated_ never passes entered_by_all(), so a later
    // read of the ranks' counts is at least it.
    std::uint64_t const done = evaluated_.load(std::memory_order_acquire);
    return entered_by_all() - done;
  }

  //! Arrival stamps kept per rank (shared_clock): offloaded evaluation may fall this many
  //! collectives behind before rank 0 evaluates on its own path (at half of it).
  static constexpr std::uint64_t ring = 4096;
  //! Rank r's last lags in seconds (arrival - median arrival), oldest first.
  [[nodiscard]] std::vector<double> lag_history(int r) const {
    WEFT_EXPECTS(r >= 0 && r < n_, "r", weft::detail::concat("a rank in [0, ", n_, ")"), r);
    std::lock_guard<std::mutex> lock(mu_);
    return det_.lag_history(r);
  }

  //! Names (hook and suspects()) every rank that has not arrived at a collective that a peer
  //! entered more than silent_fraction of that peer's deadline ago; returns how many are silent.
  //! shared_clock only (a process cannot see its peers' arrivals while they are blocked): with
  //! all_gather it returns 0. Call it from a thread that does not take part (straggler_watchdog).
  //! When the evaluation is offloaded (set_offload), it first evaluates what has completed.
  std::size_t poll() {
    if (x_ != stamp_exchange::shared_clock || stopped_.load(std::memory_order_acquire)) return 0;
    if (offload_.load(std::memory_order_acquire)) evaluate();
    std::int64_t const now = ticks_.now();
    std::vector<std::uint64_t> seen(static_cast<std::size_t>(n_));
    std::uint64_t top = 0;
    for (int s = 0; s < n_; ++s) {
      seen[static_cast<std::size_t>(s)] = slot_of(s).seq.load(std::memory_order_acquire);
      top = std::max(top, seen[static_cast<std::size_t>(s)]);
    }
    std::vector<straggler_report> fresh;
    {
      std::lock_guard<std::mutex> lock(mu_);
      std::erase_if(silent_, [&](straggler_report const& r) {
        return slot_of(r.rank).seq.load(std::memory_order_acquire) > r.collective;
      });
      if (top == 0) return silent_.size();
      // The first peer that entered collective top-1, and its deadline.
      double waited = 0;
      double limit = 0;
      for (int s = 0; s < n_; ++s) {
        if (seen[static_cast<std::size_t>(s)] != top) continue;
        auto const& sl = slot_of(s);
        auto const t = stamp(s, top - 1).load(std::memory_order_relaxed);
        auto const d = sl.timeout_ns.load(std::memory_order_relaxed);
        if (sl.seq.load(std::memory_order_acquire) != top || d <= 0) continue;  // moved on
        double const w = double(now - t) * ticks_.seconds_per_tick;
        if (w > waited) {
          waited = w;
          limit = o_.silent_fraction * double(d) * 1e-9;
        }
      }
      if (limit > 0 && waited > limit) {
        for (int s = 0; s < n_; ++s) {
          if (seen[static_cast<std::size_t>(s)] >= top) continue;
          if (slot_of(s).seq.load(std::memory_order_acquire) >= top) continue;  // just arrived
          bool const known = std::any_of(silent_.begin(), silent_.end(), [&](auto const& r) {
            return r.rank == s && r.collective == top - 1;
          });
          if (known) continue;
          straggler_report rep;
          rep.rank = s;
          rep.kind = straggler_kind::silent;
          rep.collective = top - 1;
          rep.lag = waited;
          rep.bar = limit;
          rep.step = det_.step();
          silent_.push_back(rep);
          fresh.push_back(rep);
        }
      }
    }
    fire(fresh);
    std::lock_guard<std::mutex> lock(mu_);
    return silent_.size();
  }

  // ---- what monitored<C> calls ------------------------------------------------------------

  //! shared_clock: rank r enters its collective k now, with deadline `timeout` (0: none known).
  void arrive(int r, std::uint64_t k, std::chrono::nanoseconds timeout) {
    auto& sl = slot_of(r);
    stamp(r, k).store(ticks_.now(), std::memory_order_relaxed);
    if (sl.timeout_ns.load(std::memory_order_relaxed) != timeout.count())
      sl.timeout_ns.store(timeout.count(), std::memory_order_relaxed);
    sl.seq.store(k + 1, std::memory_order_release);
  }

  //! shared_clock: collective k has completed on the calling rank, so every rank's stamp for k is
  //! posted (a collective completes on no rank before all have entered it). Evaluates the last
  //! `batch` collectives once k closes a batch: reading the peers' stamps moves their cache lines,
  //! which costs more than the evaluation itself, so it is done once per batch. Offloaded, it
  //! evaluates only when ring / 2 collectives are pending (the poller has fallen behind).
  void completed(std::uint64_t k) {
    if (offload_.load(std::memory_order_relaxed)) {
      if (k + 1 - evaluated_.load(std::memory_order_relaxed) >= ring / 2 && !stopped()) evaluate();
      return;
    }
    if ((k + 1) % batch != 0) return;
    std::vector<straggler_report> fresh;
    {
      std::lock_guard<std::mutex> lock(mu_);
      evaluate_locked(fresh, k + 1);
    }
    fire(fresh);
  }

  //! all_gather: rows of offsets (row-major, `ranks()` per row) in collective order.
  void observe_rows(std::span<double const> rows) {
    std::vector<straggler_report> fresh;
    {
      std::lock_guard<std::mutex> lock(mu_);
      auto const n = static_cast<std::size_t>(n_);
      for (std::size_t i = 0; i + n <= rows.size(); i += n)
        observe_locked(rows.subspan(i, n), fresh);
      evaluated_.store(det_.rows(), std::memory_order_release);
    }
    fire(fresh);
  }

  //! A monitored collective failed: the communicator is dead, nothing more is evaluated or named.
  void stop() noexcept { stopped_.store(true, std::memory_order_release); }
  [[nodiscard]] bool stopped() const noexcept { return stopped_.load(std::memory_order_acquire); }

 private:
  // shared_clock: collectives evaluated together by rank 0, and the stamps kept per rank (a batch,
  // plus the next collective, which a peer may already have entered).
  static constexpr std::uint64_t batch = 8;
  static constexpr std::uint64_t per_line = 8;  // stamps per 64-byte line
  static_assert(ring >= 2 * batch && ring % per_line == 0);

  struct alignas(64) slot {
    std::atomic<std::uint64_t> seq{0};  // 1 + the last collective this rank entered
    std::atomic<std::int64_t> timeout_ns{0};
  };
  // A rank's entry times (ticks_ readings) for its last `ring` collectives, in lines of its own: a
  // rank writes its stamps in order, so a reader takes a line only after the rank has left it.
  struct alignas(64) stamp_line {
    std::atomic<std::int64_t> t[per_line] = {};
  };
  slot& slot_of(int r) const noexcept { return slots_[static_cast<std::size_t>(r)]; }
  std::atomic<std::int64_t>& stamp(int r, std::uint64_t k) const noexcept {
    std::uint64_t const i = static_cast<std::uint64_t>(r) * ring + k % ring;
    return stamps_[i / per_line].t[i % per_line];
  }
  // Collectives every rank has entered (so every stamp of them is posted).
  [[nodiscard]] std::uint64_t entered_by_all() const noexcept {
    std::uint64_t m = slot_of(0).seq.load(std::memory_order_acquire);
    for (int s = 1; s < n_; ++s) m = std::min(m, slot_of(s).seq.load(std::memory_order_acquire));
    return m;
  }

  // Evaluates collectives [det_.rows(), min(entered_by_all(), limit)): a rank can be at most two
  // collectives ahead of rank 0, which evaluates before it falls ring / 2 behind, so these stamps
  // are intact.
  std::uint64_t evaluate_locked(std::vector<straggler_report>& fresh,
                                std::uint64_t limit = ~std::uint64_t{0}) {
    if (stopped_.load(std::memory_order_acquire)) return 0;
    std::uint64_t const first = det_.rows();
    std::uint64_t const end = std::min(entered_by_all(), limit);
    if (end <= first) return 0;
    auto const n = static_cast<std::size_t>(n_);
    for (std::uint64_t j = first; j < end; ++j) {
      for (std::size_t s = 0; s < n; ++s)
        row_[s] = double(stamp(static_cast<int>(s), j).load(std::memory_order_relaxed) - epoch_) *
                  ticks_.seconds_per_tick;
      observe_locked(std::span<double const>(row_).first(n), fresh);
    }
    evaluated_.store(det_.rows(), std::memory_order_release);
    return end - first;
  }

  void observe_locked(std::span<double const> row, std::vector<straggler_report>& fresh) {
    if (stopped_.load(std::memory_order_acquire)) return;
    det_.observe(
        row,
        [&](straggler_report const& rep) {
          slow_.push_back(rep);
          fresh.push_back(rep);
        },
        [&](int r) { std::erase_if(slow_, [&](auto const& x) { return x.rank == r; }); });
  }

  void fire(std::vector<straggler_report> const& fresh) {
    if (fresh.empty()) return;
    std::lock_guard<std::mutex> lock(hook_mu_);
    if (!hook_) return;
    for (auto const& r : fresh) hook_(r);
  }

  int n_;
  straggler_options o_;
  stamp_exchange x_;
  std::unique_ptr<slot[]> slots_;
  std::unique_ptr<stamp_line[]> stamps_;  // shared_clock: [rank][ring]
  std::atomic<bool> offload_{false};
  std::atomic<std::uint64_t> evaluated_{0};  // det_.rows(), readable without the lock
  mutable std::mutex mu_;                    // guards det_, row_, slow_, silent_
  straggler_detector det_;
  std::vector<double> row_;
  std::vector<straggler_report> slow_;
  std::vector<straggler_report> silent_;
  std::mutex hook_mu_;
  straggler_hook hook_;
  std::atomic<bool> stopped_{false};
  detail::tick_clock ticks_{};  // shared_clock: arrival stamps (the TSC where the kernel uses it)
  std::int64_t epoch_ = 0;      // ticks_ at construction
};

//! An opt-in thread that calls monitor.poll() every `period`, so that a rank that stops answering
//! is named (hook and suspects()) while its peers still wait, before their deadline raises. weft
//! starts no thread of its own: the watchdog runs from construction to destruction (which joins).
//!
//! With `evaluate` (the default) it also takes the slow-rank evaluation off the ranks' path
//! (monitor.set_offload(true)): the ranks only stamp their arrivals, and each poll evaluates the
//! collectives completed since the last. While collectives come faster than it keeps up with, the
//! watchdog halves its period (down to `period / 64`, at least 100 us), and lengthens it back
//! once it has caught up; if it still falls ring / 2 collectives behind, rank 0 evaluates on its
//! own path, so nothing is lost. Slow ranks are then named from the watchdog's thread, up to a
//! period after the collective that decided it (report.collective is that collective).
//! Destruction evaluates what is pending and gives the evaluation back to rank 0.
class straggler_watchdog {
 public:
  explicit straggler_watchdog(std::shared_ptr<straggler_monitor> m,
                              std::chrono::milliseconds period = std::chrono::milliseconds(10),
                              bool evaluate = true)
      : m_(std::move(m)) {
    WEFT_EXPECTS(m_ != nullptr, "monitor", "a monitor", "nullptr");
    WEFT_EXPECTS(period.count() > 0, "period", "> 0 ms", period.count());
    evaluating_ = evaluate && m_->exchange() == stamp_exchange::shared_clock;
    thread_ = std::jthread([this, period](std::stop_token st) {
      using us = std::chrono::microseconds;
      us const longest = std::chrono::duration_cast<us>(period);
      us const shortest = std::max(us(100), longest / 64);
      us wait = longest;
      std::mutex mu;
      std::condition_variable_any cv;
      std::unique_lock<std::mutex> lock(mu);
      while (!st.stop_requested()) {
        if (evaluating_) {
          // What piled up in one period, against the ring's room: between a sixteenth and a
          // quarter of it, so that each wake-up has enough to do and rank 0 never has to.
          std::uint64_t const behind = m_->evaluate();
          if (behind > straggler_monitor::ring / 4)
            wait = std::max(shortest, wait / 2);
          else if (behind < straggler_monitor::ring / 16)
            wait = std::min(longest, wait * 2);
        }
        m_->poll();
        cv.wait_for(lock, st, wait, [] { return false; });
      }
    });
    // Only once the thread runs: a watchdog that failed to start leaves the evaluation to rank 0.
    if (evaluating_) m_->set_offload(true);
  }
  straggler_watchdog(straggler_watchdog const&) = delete;
  straggler_watchdog& operator=(straggler_watchdog const&) = delete;
  ~straggler_watchdog() {
    thread_.request_stop();
    thread_.join();
    if (evaluating_) m_->set_offload(false);  // evaluates what is pending
  }

 private:
  std::shared_ptr<straggler_monitor> m_;
  bool evaluating_ = false;
  std::jthread thread_;
};

//! A Communicator that behaves exactly as the C it wraps and reports each rank's arrival at its
//! symmetric collectives (all_reduce, all_gather(_v), reduce_scatter(_v), all_to_all(_v),
//! barrier) to a straggler_monitor. Rooted collectives, point-to-point calls and no-op calls
//! (count 0) pass through unobserved: only symmetric collectives release every rank together,
//! which is what makes arrival lags comparable. split() returns an unmonitored communicator (a
//! sub-group needs a monitor of its own size). One thread uses it at a time, as any communicator.
//!
//!   auto mon = std::make_shared<weft::comm::straggler_monitor>(n);   // threads: one for all ranks
//!   weft::comm::monitored<threads::communicator> comm(std::move(rank_comm), mon);
//! Aligned to a cache line: a rank's wrapper counts its collectives, and two ranks' wrappers side
//! by side (a vector of them) would otherwise share that line.
template <class C>
requires CommunicatorIn<C, host_space>
class alignas(64) monitored {
 public:
  using communicator_concept = communicator_tag;
  using memory_space = communicator_space_t<C>;
  using clock = straggler_monitor::clock;

  monitored() = default;
  //! A null monitor makes a plain pass-through. The monitor's ranks() must equal c.size().
  monitored(C c, std::shared_ptr<straggler_monitor> m) : c_(std::move(c)), m_(std::move(m)) {
    if (!m_) return;
    WEFT_EXPECTS(m_->ranks() == c_.size(), "monitor->ranks()",
                 weft::detail::concat("the communicator's size ", c_.size()), m_->ranks());
    if (m_->exchange() == stamp_exchange::all_gather)
      waits_.assign(2 * static_cast<std::size_t>(m_->options().exchange_every), 0.0);
    // What every watched call asks, read once: a communicator's rank and size never change.
    rank_ = c_.rank();
    watched_ = c_.size() > 1;
    shared_ = m_->exchange() == stamp_exchange::shared_clock;
  }

  [[nodiscard]] C& inner() noexcept { return c_; }
  [[nodiscard]] C const& inner() const noexcept { return c_; }
  [[nodiscard]] std::shared_ptr<straggler_monitor> const& monitor() const noexcept { return m_; }

  [[nodiscard]] int rank() const noexcept { return c_.rank(); }
  [[nodiscard]] int size() const noexcept { return c_.size(); }
  [[nodiscard]] comm_state state() const noexcept { return c_.state(); }
  [[nodiscard]] std::vector<op_record> history() const { return c_.history(); }
  void set_hook(op_hook h) { c_.set_hook(std::move(h)); }
  void abort() noexcept { c_.abort(); }
  [[nodiscard]] std::chrono::milliseconds timeout() const noexcept requires requires(C const& x) {
    x.timeout();
  }
  { return c_.timeout(); }
  void set_timeout(std::chrono::milliseconds t) requires requires(C& x) { x.set_timeout(t); }
  { c_.set_timeout(t); }

  work all_reduce(buffer_view in, buffer_view out, reduce_op op = {}, op_options o = {}) {
    return watch(in.count != 0, o, [&] { return c_.all_reduce(in, out, op, o); });
  }
  work all_gather(buffer_view in, buffer_view out, op_options o = {}) {
    return watch(in.count != 0, o, [&] { return c_.all_gather(in, out, o); });
  }
  work all_gather_v(buffer_view in, buffer_view out, std::span<std::size_t const> counts,
                    op_options o = {}) {
    return watch(any(counts), o, [&] { return c_.all_gather_v(in, out, counts, o); });
  }
  work reduce_scatter(buffer_view in, buffer_view out, reduce_op op = {}, op_options o = {}) {
    return watch(out.count != 0, o, [&] { return c_.reduce_scatter(in, out, op, o); });
  }
  work reduce_scatter_v(buffer_view in, buffer_view out, std::span<std::size_t const> counts,
                        reduce_op op = {}, op_options o = {}) {
    return watch(any(counts), o, [&] { return c_.reduce_scatter_v(in, out, counts, op, o); });
  }
  work all_to_all(buffer_view in, buffer_view out, op_options o = {}) {
    return watch(in.count != 0, o, [&] { return c_.all_to_all(in, out, o); });
  }
  work all_to_all_v(buffer_view in, buffer_view out, std::span<std::size_t const> send_counts,
                    std::span<std::size_t const> recv_counts, op_options o = {}) {
    return watch(true, o, [&] { return c_.all_to_all_v(in, out, send_counts, recv_counts, o); });
  }
  work barrier(op_options o = {}) {
    return watch(true, o, [&] { return c_.barrier(o); });
  }

  work reduce(buffer_view in, buffer_view out, reduce_op op, int root, op_options o = {}) {
    return c_.reduce(in, out, op, root, o);
  }
  work broadcast(buffer_view in, buffer_view out, int root, op_options o = {}) {
    return c_.broadcast(in, out, root, o);
  }
  work gather(buffer_view in, buffer_view out, int root, op_options o = {}) {
    return c_.gather(in, out, root, o);
  }
  work scatter(buffer_view in, buffer_view out, int root, op_options o = {}) {
    return c_.scatter(in, out, root, o);
  }
  work isend(buffer_view in, int peer, op_options o = {}) { return c_.isend(in, peer, o); }
  work irecv(buffer_view out, int peer, op_options o = {}) { return c_.irecv(out, peer, o); }
  work send(buffer_view in, int peer, op_options o = {}) { return c_.send(in, peer, o); }
  work recv(buffer_view out, int peer, op_options o = {}) { return c_.recv(out, peer, o); }

  //! Splits the wrapped communicator; the result is not monitored (wrap it with a monitor of its
  //! own size to watch it).
  monitored split(int color, int key) { return monitored(c_.split(color, key), nullptr); }

 private:
  static bool any(std::span<std::size_t const> counts) noexcept {
    return std::any_of(counts.begin(), counts.end(), [](std::size_t x) { return x != 0; });
  }

  [[nodiscard]] std::chrono::nanoseconds deadline_of(op_options const& o) const noexcept {
    if (o.timeout.count() > 0) return o.timeout;
    if constexpr (requires { c_.timeout(); }) {
      return c_.timeout();
    } else {
      return std::chrono::nanoseconds{0};
    }
  }

  template <class F>
  work watch(bool observed, op_options const& o, F&& f) {
    if (!watched_ || !observed) return f();
    std::uint64_t const k = k_++;
    bool const shared = shared_;
    clock::time_point entered{};
    if (shared)
      m_->arrive(rank_, k, deadline_of(o));
    else
      entered = clock::now();
    work w;
    try {
      w = f();
    } catch (...) {
      m_->stop();
      throw;
    }
    if (shared) {
      if (rank_ == 0) m_->completed(k);
      return w;
    }
    // [waits | intervals between this rank's exits]: both local differences, free of offsets.
    auto const every = waits_.size() / 2;
    auto const left = clock::now();
    auto const j = static_cast<std::size_t>(k % every);
    waits_[j] = std::chrono::duration<double>(left - entered).count();
    waits_[every + j] = k == 0 ? 0.0 : std::chrono::duration<double>(left - last_exit_).count();
    last_exit_ = left;
    if ((k + 1) % every == 0) exchange(every);
    return w;
  }

  // all_gather: one collective of 2 * exchange_every doubles per rank; then every rank builds the
  // same rows: offset_r = T - wait_r, where T advances by the median interval between exits (so
  // the detector sees the step), and every rank leaves a symmetric collective at about the same
  // time (so a late arrival is a short wait).
  void exchange(std::size_t every) {
    auto const n = static_cast<std::size_t>(c_.size());
    gathered_.resize(n * 2 * every);
    try {
      c_.all_gather(host_view(std::span<double const>(waits_)), host_view(std::span(gathered_)),
                    op_options{})
          .wait();
    } catch (...) {
      m_->stop();
      throw;
    }
    rows_.resize(n * every);
    median_.resize(n);
    for (std::size_t j = 0; j < every; ++j) {
      for (std::size_t r = 0; r < n; ++r) median_[r] = gathered_[r * 2 * every + every + j];
      std::nth_element(median_.begin(), median_.begin() + static_cast<std::ptrdiff_t>(n / 2),
                       median_.end());
      t_ += median_[n / 2];
      for (std::size_t r = 0; r < n; ++r) rows_[j * n + r] = t_ - gathered_[r * 2 * every + j];
    }
    m_->observe_rows(rows_);
  }

  C c_{};
  std::shared_ptr<straggler_monitor> m_;
  int rank_ = -1;
  bool watched_ = false;  // a monitor and more than one rank
  bool shared_ = false;   // stamp_exchange::shared_clock
  std::uint64_t k_ = 0;
  std::vector<double> waits_;     // all_gather: this rank's waits, then its exit intervals
  std::vector<double> gathered_;  // [rank][2 * exchange_every]
  std::vector<double> rows_;      // [collective][rank]
  std::vector<double> median_;    // scratch: one collective's exit intervals
  double t_ = 0;                  // the common time line of the rows (sum of median intervals)
  clock::time_point last_exit_{};
};

}  // namespace weft::comm
