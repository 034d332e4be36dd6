// Tests for tests/support/counting_communicator.hpp: it is itself a Communicator, forwards every
// operation, and records what each rank issued with its counts and byte volumes (the rule is in
// the header), sharing one log with the communicators split from it.
#include <weft/comm/collectives.hpp>
#include <weft/comm/threads/world.hpp>

#include <support/counting_communicator.hpp>
#include <support/run_ranks.hpp>

#include <doctest/doctest.h>

#include <vector>

namespace {
using weft::comm::op_kind;
using weft::comm::threads::communicator;
using counting = weft::test::counting_communicator<communicator>;
namespace comm = weft::comm;
}  // namespace

static_assert(weft::comm::Communicator<counting>);
static_assert(std::same_as<weft::comm::communicator_space_t<counting>, weft::host_space>);

TEST_SUITE("threads") {
  TEST_CASE("counting_communicator: records every operation and its byte volume per rank") {
    weft::test::run_ranks(3, [](communicator& raw) {
      counting c(std::move(raw));
      int const r = c.rank();
      CHECK(c.size() == 3);
      std::vector<float> v(10, 1.0f);
      comm::all_reduce(c, v);
      CHECK(v[0] == 3.0f);  // forwarded for real
      std::vector<double> g(6);
      comm::all_gather(c, std::vector<double>(2, 1.0), g);
      std::vector<int> b(4, r);
      comm::broadcast(c, b, 2);
      std::vector<int> red(4);
      comm::reduce(c, b, red, 0);
      comm::barrier(c);
      // A ring of sends.
      std::vector<std::uint8_t> msg(5, 1);
      std::vector<std::uint8_t> got(5);
      auto w = comm::isend(c, msg, (r + 1) % 3);
      comm::recv(c, got, (r + 2) % 3);
      w.wait();

      auto const& e = c.events();
      REQUIRE(e.size() == 7);
      CHECK(e[0].op == op_kind::all_reduce);
      CHECK(e[0].send_bytes == 40);
      CHECK(e[0].recv_bytes == 40);
      CHECK(e[0].type == weft::dtype::f32);
      CHECK(e[0].group_size == 3);
      CHECK(e[1].op == op_kind::all_gather);
      CHECK(e[1].send_bytes == 16);
      CHECK(e[1].recv_bytes == 48);
      CHECK(e[2].op == op_kind::broadcast);
      CHECK(e[2].send_bytes == (r == 2 ? 16u : 0u));  // only the root contributes
      CHECK(e[2].root_or_peer == 2);
      CHECK(e[3].op == op_kind::reduce);
      CHECK(e[3].recv_bytes == (r == 0 ? 16u : 0u));  // only the root receives
      CHECK(e[4].op == op_kind::barrier);
      CHECK(e[5].op == op_kind::send);
      CHECK(e[5].send_bytes == 5);
      CHECK(e[5].root_or_peer == (r + 1) % 3);
      CHECK(e[6].op == op_kind::recv);
      CHECK(e[6].recv_bytes == 5);
      CHECK(c.count(op_kind::all_reduce) == 1);
      CHECK(c.bytes_sent() == 40 + 16 + (r == 2 ? 16u : 0u) + 16 + 5);
      CHECK(c.bytes_sent(op_kind::all_gather) == 16);
      // Rejected calls are not counted.
      std::vector<float> wrong(3);
      CHECK_THROWS_AS(comm::all_reduce(c, v, wrong), weft::shape_error);
      CHECK(c.events().size() == 7);
      // Split children share the log under their own id.
      auto sub = c.split(r == 0 ? 0 : 1, r);
      CHECK(sub.id() != c.id());
      comm::all_reduce(sub, v);
      CHECK(sub.count(op_kind::all_reduce) == 1);
      CHECK(c.count(op_kind::all_reduce) == 1);  // the parent's own count is unchanged
      CHECK(c.events().size() == 9);             // split + the child's all_reduce
      CHECK(c.events().back().comm_id == sub.id());
      CHECK(c.events().back().group_size == (r == 0 ? 1 : 2));
      CHECK(c.history().size() >= 5);  // forwarded to the backend's history
      c.clear();
      CHECK(c.events().empty());
    });
  }

}  // TEST_SUITE("threads")
