// Tests for the communicator concepts of weft/comm/concepts.hpp, refined step by step (Group ->
// PointToPoint -> Collective -> Communicator, SplittableGroup beside them, the ...In<C, Space>
// forms) with positive and negative models; the public work_state extension point; the typed
// send/recv over a point-to-point-only model; and an open MemorySpace (core/memory.hpp) that
// allocates for itself, so make_tensor works in a user's space (probe A.2 of the style review).
#include <weft/comm/collectives.hpp>
#include <weft/comm/concepts.hpp>
#include <weft/comm/threads/communicator.hpp>
#include <weft/comm/work.hpp>
#include <weft/core/memory.hpp>
#include <weft/core/tensor.hpp>

#include <doctest/doctest.h>

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <deque>
#include <memory>
#include <new>
#include <span>
#include <string_view>
#include <type_traits>
#include <utility>
#include <vector>

namespace concepts_test {

namespace comm = weft::comm;
using weft::cuda_space;
using weft::host_space;

// ---- models, from the weakest up --------------------------------------------------------------

// A one-rank loopback: messages to itself, kept in a FIFO. The smallest PointToPoint: the tag
// and rank, size, isend, irecv. A pending receive is a work_state of its own.
class loopback {
 public:
  using communicator_concept = comm::point_to_point_tag;

  [[nodiscard]] int rank() const noexcept { return 0; }
  [[nodiscard]] int size() const noexcept { return 1; }

  comm::work isend(comm::buffer_view in, int peer, comm::op_options = {}) {
    WEFT_EXPECTS(peer == 0, "peer", 0, peer);
    auto const* p = static_cast<std::byte const*>(in.data);
    q_->emplace_back(p, p + in.bytes());
    ++*sends_;
    return {};
  }
  comm::work irecv(comm::buffer_view out, int peer, comm::op_options = {}) {
    WEFT_EXPECTS(peer == 0, "peer", 0, peer);
    return comm::work(std::make_shared<receive>(q_, out));
  }
  [[nodiscard]] int sends() const noexcept { return *sends_; }

 private:
  using queue = std::deque<std::vector<std::byte>>;
  struct receive final : comm::work_state {
    receive(std::shared_ptr<queue> q, comm::buffer_view o) : qu(std::move(q)), out(o) {}
    bool wait_until(std::chrono::steady_clock::time_point) override {
      if (complete) return true;
      if (qu->empty()) return false;  // one thread: nothing can arrive while we wait
      std::memcpy(out.data, qu->front().data(), out.bytes());
      qu->pop_front();
      complete = true;
      return true;
    }
    [[nodiscard]] bool done() const noexcept override { return complete; }
    std::shared_ptr<queue> qu;
    comm::buffer_view out;
    bool complete = false;
  };
  std::shared_ptr<queue> q_ = std::make_shared<queue>();
  std::shared_ptr<int> sends_ = std::make_shared<int>(0);
};

// The same shape, over device memory: PointToPointIn<C, cuda_space>, not host_space.
struct device_p2p {
  using communicator_concept = comm::point_to_point_tag;
  using memory_space = cuda_space;
  [[nodiscard]] int rank() const noexcept { return 0; }
  [[nodiscard]] int size() const noexcept { return 1; }
  comm::work isend(comm::buffer_view, int, comm::op_options = {}) { return {}; }
  comm::work irecv(comm::buffer_view, int, comm::op_options = {}) { return {}; }
};

// Negative models.
struct untagged {  // every member, but no opt-in: never mistaken for a communicator
  [[nodiscard]] int rank() const noexcept { return 0; }
  [[nodiscard]] int size() const noexcept { return 1; }
  comm::work isend(comm::buffer_view, int, comm::op_options = {}) { return {}; }
  comm::work irecv(comm::buffer_view, int, comm::op_options = {}) { return {}; }
};
struct blocking_only {  // isend that returns nothing
  using communicator_concept = comm::point_to_point_tag;
  [[nodiscard]] int rank() const noexcept { return 0; }
  [[nodiscard]] int size() const noexcept { return 1; }
  void isend(comm::buffer_view, int, comm::op_options = {}) {}
  comm::work irecv(comm::buffer_view, int, comm::op_options = {}) { return {}; }
};
struct throwing_rank {  // rank() may throw
  using communicator_concept = comm::group_tag;
  [[nodiscard]] int rank() const { return 0; }
  [[nodiscard]] int size() const noexcept { return 1; }
};
struct claims_collective : loopback {  // the collective tag, without the collectives
  using communicator_concept = comm::collective_tag;
};
struct splitter {  // rank, size, split: what device_mesh needs
  using communicator_concept = comm::group_tag;
  [[nodiscard]] int rank() const noexcept { return 0; }
  [[nodiscard]] int size() const noexcept { return 1; }
  splitter split(int, int) { return {}; }
};
struct bad_splitter {  // split returns another type
  using communicator_concept = comm::group_tag;
  [[nodiscard]] int rank() const noexcept { return 0; }
  [[nodiscard]] int size() const noexcept { return 1; }
  loopback split(int, int) { return {}; }
};

using threads_comm = comm::threads::communicator;

// The ladder, on weft's own backend: every step holds.
static_assert(comm::Group<threads_comm>);
static_assert(comm::SplittableGroup<threads_comm>);
static_assert(comm::PointToPoint<threads_comm>);
static_assert(comm::Collective<threads_comm>);
static_assert(comm::Communicator<threads_comm>);
static_assert(!comm::StreamCommunicator<threads_comm>);
static_assert(comm::PointToPointIn<threads_comm, host_space>);
static_assert(comm::CollectiveIn<threads_comm, host_space>);
static_assert(comm::CommunicatorIn<threads_comm, host_space>);
static_assert(!comm::CommunicatorIn<threads_comm, cuda_space>);

// A point-to-point model is exactly that.
static_assert(comm::Group<loopback>);
static_assert(comm::PointToPoint<loopback>);
static_assert(comm::PointToPointIn<loopback, host_space>);  // host_space when undeclared
static_assert(!comm::PointToPointIn<loopback, cuda_space>);
static_assert(!comm::Collective<loopback>);
static_assert(!comm::Communicator<loopback>);
static_assert(!comm::SplittableGroup<loopback>);

static_assert(comm::PointToPoint<device_p2p>);
static_assert(comm::PointToPointIn<device_p2p, cuda_space>);
static_assert(!comm::PointToPointIn<device_p2p, host_space>);

static_assert(!comm::Group<untagged>);
static_assert(!comm::PointToPoint<untagged>);
static_assert(!comm::PointToPoint<blocking_only>);
static_assert(!comm::Group<throwing_rank>);
static_assert(comm::PointToPoint<claims_collective>);
static_assert(!comm::Collective<claims_collective>);
static_assert(comm::SplittableGroup<splitter>);
static_assert(!comm::PointToPoint<splitter>);
static_assert(!comm::SplittableGroup<bad_splitter>);
static_assert(!comm::Group<int>);
static_assert(!comm::PointToPoint<std::vector<float>>);
static_assert(!comm::PointToPointIn<loopback, int>);  // not a MemorySpace

// The typed functions ask for the weakest step: send/recv/isend/irecv for PointToPoint, the
// collectives for Collective, synchronize for any Group.
template <class C>
concept typed_send = requires(C& c, std::vector<float>& v) {
  comm::send(c, v, 0);
};
template <class C>
concept typed_all_reduce = requires(C& c, std::vector<float>& v) {
  comm::all_reduce(c, v);
};
static_assert(typed_send<loopback>);
static_assert(!typed_all_reduce<loopback>);
static_assert(typed_send<threads_comm>);
static_assert(typed_all_reduce<threads_comm>);
static_assert(!typed_send<device_p2p>);  // host buffers to a device-memory communicator

// ---- a user memory space that allocates for itself ---------------------------------------------

struct pinned_space {
  static constexpr std::string_view name = "pinned";
  static constexpr bool host_accessible = true;
  friend constexpr bool operator==(pinned_space, pinned_space) noexcept = default;

  static inline int live = 0;  // allocations not yet released
  static void* allocate(std::size_t bytes) {
    ++live;
    return ::operator new (bytes, std::align_val_t{64});
  }
  static void deallocate(void* p, std::size_t) noexcept {
    --live;
    ::operator delete (p, std::align_val_t{64});
  }
};
static_assert(weft::MemorySpace<pinned_space>);
static_assert(weft::AllocatingSpace<pinned_space>);
static_assert(!weft::AllocatingSpace<host_space>);  // weft allocates host and cuda memory itself

}  // namespace concepts_test

using concepts_test::loopback;

TEST_CASE("typed send/recv over a point-to-point-only model go through isend/irecv") {
  loopback c;
  std::vector<float> out{1.0f, 2.0f, 3.0f}, in(3, 0.0f);
  weft::comm::send(c, out, 0).wait();
  CHECK(c.sends() == 1);
  weft::comm::recv(c, in, 0).wait();
  CHECK(in == out);
  // isend/irecv: the receive stays pending until a message is there.
  std::vector<float> late(3, 0.0f);
  auto r = weft::comm::irecv(c, late, 0);
  CHECK_FALSE(r.done());
  CHECK_FALSE(r.wait_for(std::chrono::milliseconds(0)));
  weft::comm::isend(c, std::as_const(out), 0).wait();
  CHECK(r.wait_for(std::chrono::milliseconds(0)));
  CHECK(r.done());
  CHECK(late == out);
  // A host communicator's synchronize is a no-op (nothing is stream-ordered).
  weft::comm::synchronize(c);
}

TEST_CASE("work_state is a public extension point: work forwards wait, wait_for and done") {
  struct countdown final : weft::comm::work_state {
    int polls_left = 2;
    int waits = 0;
    bool wait_until(std::chrono::steady_clock::time_point deadline) override {
      ++waits;
      if (deadline != std::chrono::steady_clock::time_point::max() && polls_left-- > 0)
        return false;
      polls_left = 0;
      return true;
    }
    [[nodiscard]] bool done() const noexcept override { return polls_left <= 0; }
  };
  auto s = std::make_shared<countdown>();
  weft::comm::work w(s);
  CHECK_FALSE(w.done());
  CHECK_FALSE(w.wait_for(std::chrono::milliseconds(1)));
  CHECK_FALSE(w.wait_for(std::chrono::milliseconds(1)));
  CHECK(w.wait_for(std::chrono::milliseconds(1)));
  CHECK(w.done());
  w.wait();
  CHECK(s->waits == 4);
  // The former spelling still names the same type (backends derive from it).
  static_assert(std::is_same_v<weft::comm::detail::work_state, weft::comm::work_state>);
  // Default work is complete.
  weft::comm::work none;
  CHECK(none.done());
  CHECK(none.wait_for(std::chrono::milliseconds(0)));
}

TEST_CASE("a user memory space with allocate/deallocate works in make_tensor") {
  using concepts_test::pinned_space;
  {
    auto t = weft::make_tensor<float, pinned_space>(2, 3);
    CHECK(pinned_space::live == 1);
    CHECK(t.size() == 6);
    CHECK(reinterpret_cast<std::uintptr_t>(t.data()) % 64 == 0);
    t.data()[5] = 4.0f;  // host-accessible: host code may write it
    CHECK(t.data()[5] == 4.0f);
    // Its views carry the user's space, which host_space code refuses.
    auto v = t.view();
    static_assert(weft::TensorIn<decltype(v), pinned_space>);
    static_assert(!weft::TensorIn<decltype(v), weft::host_space>);
  }
  CHECK(pinned_space::live == 0);
  // Raw allocation goes through the same members; zero bytes allocate nothing.
  CHECK(weft::allocate_bytes(pinned_space{}, 0) == nullptr);
  CHECK(pinned_space::live == 0);
  void* p = weft::allocate_bytes(pinned_space{}, 16);
  CHECK(pinned_space::live == 1);
  weft::deallocate_bytes(pinned_space{}, p, 16);
  CHECK(pinned_space::live == 0);
}
