// Tests for weft/mesh/device_mesh.hpp over real threads worlds: every rank builds the mesh, then
// checks each axis group and flattened group by its size, this rank's rank in it, an all_gather
// of global ranks (which must return exactly the group's members, in order) and an all_reduce of
// global ranks (which catches swapped colors and keys). The expectations come from the pure
// mesh::layout functions, themselves checked against PyTorch's and Megatron's rules in
// layout.test.cpp. Everything here runs under ThreadSanitizer in CI (suite "threads").
#include <weft/comm/threads/communicator.hpp>
#include <weft/mesh/mesh.hpp>

#include <support/run_ranks.hpp>

#include <doctest/doctest.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <memory>
#include <stdexcept>
#include <numeric>
#include <span>
#include <string>
#include <thread>
#include <vector>

namespace mesh_threads_test {

namespace comm = weft::comm;
using weft::i64;
using names_t = std::vector<std::string>;

// What one rank saw of one group.
struct group_seen {
  int size = -1;
  int rank = -1;
  int local_rank = -1;  // mesh.local_rank(axis) for one-axis groups
  std::vector<i64> members;
  i64 sum = -1;
};

struct rank_seen {
  int global_rank = -1;
  std::vector<int> coord;
  std::vector<group_seen> groups;  // one per entry of the `lists` argument, in order
};

template <class C>
group_seen look_at(weft::device_mesh<C>& mesh, names_t const& axes, i64 me) {
  C& g = axes.size() == 1 ? mesh.group(axes[0]) : mesh.group(axes);
  group_seen s;
  s.size = g.size();
  s.rank = g.rank();
  if (axes.size() == 1) s.local_rank = mesh.local_rank(axes[0]);
  s.members.assign(static_cast<std::size_t>(g.size()), -1);
  g.all_gather(comm::host_view(std::span<i64>(&me, 1)), comm::host_view(std::span<i64>(s.members)),
               {})
      .wait();
  g.all_reduce(comm::host_view(std::span<i64>(&me, 1)), comm::host_view(std::span<i64>(&s.sum, 1)),
               comm::reduce_kind::sum, {})
      .wait();
  return s;
}

// Builds the mesh on every rank of an n-rank threads world and records what each rank sees of the
// groups in `lists`, twice over (the second round interleaves collectives on different groups
// after the first, in the same program order on every rank).
template <class Make>
std::vector<rank_seen> observe(int n, Make make_mesh, std::vector<names_t> const& lists) {
  std::vector<rank_seen> seen(static_cast<std::size_t>(n));
  weft::test::run_ranks(n, [&](comm::threads::communicator& world) {
    auto mesh = make_mesh(world);
    rank_seen& mine = seen[static_cast<std::size_t>(world.rank())];
    mine.global_rank = mesh.global_rank();
    mine.coord.assign(mesh.coordinate().begin(), mesh.coordinate().end());
    for (int round = 0; round < 2; ++round) {
      mine.groups.clear();
      for (auto const& axes : lists) mine.groups.push_back(look_at(mesh, axes, world.rank()));
    }
  });
  return seen;
}

// Checks what every rank saw against the pure layout functions.
void check_against(weft::mesh::layout const& l, std::vector<names_t> const& lists,
                   std::vector<rank_seen> const& seen) {
  REQUIRE(static_cast<int>(seen.size()) == l.size());
  for (int r = 0; r < l.size(); ++r) {
    CAPTURE(r);
    rank_seen const& s = seen[static_cast<std::size_t>(r)];
    CHECK(s.global_rank == r);
    CHECK(s.coord == l.coordinate(r));
    REQUIRE(s.groups.size() == lists.size());
    for (std::size_t i = 0; i < lists.size(); ++i) {
      CAPTURE(weft::mesh::detail::format_names(lists[i]));
      auto const groups = l.groups_along(lists[i]);
      auto const sk = l.split_along(r, lists[i]);
      auto const& expected = groups[static_cast<std::size_t>(sk.color)];
      group_seen const& g = s.groups[i];
      CHECK(g.size == static_cast<int>(expected.size()));
      CHECK(g.rank == sk.key);
      if (lists[i].size() == 1) CHECK(g.local_rank == sk.key);
      CHECK(g.members == std::vector<i64>(expected.begin(), expected.end()));
      CHECK(g.sum == std::accumulate(expected.begin(), expected.end(), i64{0}));
    }
  }
}

// A threads communicator seen only as a SplittableGroup (rank, size, split): the shape of a
// stream communicator over device memory as far as device_mesh is concerned, so the mesh takes its
// space-neutral agreement path (a split keyed by the layout hash) instead of a host all_gather.
class split_only {
 public:
  using communicator_concept = comm::group_tag;
  explicit split_only(weft::comm::threads::communicator c) : c_(std::move(c)) {}
  [[nodiscard]] int rank() const noexcept { return c_.rank(); }
  [[nodiscard]] int size() const noexcept { return c_.size(); }
  split_only split(int color, int key) { return split_only(c_.split(color, key)); }
  [[nodiscard]] weft::comm::threads::communicator& inner() noexcept { return c_; }

 private:
  weft::comm::threads::communicator c_;
};
static_assert(comm::SplittableGroup<split_only>);
static_assert(!comm::CollectiveIn<split_only, weft::host_space>);

}  // namespace mesh_threads_test

using mesh_threads_test::check_against;
using mesh_threads_test::names_t;
using mesh_threads_test::observe;
using weft::i64;
using weft::comm::threads::communicator;

TEST_SUITE("threads") {
  TEST_CASE("device_mesh over threads: 8 ranks as (dp, cp, tp) = (2, 2, 2), flattened groups") {
    weft::mesh::layout const l({2, 2, 2}, {"dp", "cp", "tp"});
    std::vector<names_t> const lists = {{"dp"},       {"cp"},       {"tp"},
                                        {"dp", "cp"}, {"cp", "dp"}, {"dp", "cp", "tp"}};
    auto const seen = observe(
        8,
        [](communicator& world) {
          // CTAD: the communicator type comes from `world`.
          return weft::device_mesh(world, {2, 2, 2}, {"dp", "cp", "tp"},
                                   {{"dp", "cp"}, {"cp", "dp"}, {"dp", "cp", "tp"}});
        },
        lists);
    check_against(l, lists, seen);
    // The golden table, read straight off what the ranks gathered.
    CHECK(seen[1].groups[2].members == std::vector<i64>{0, 1});
    CHECK(seen[1].groups[1].members == std::vector<i64>{1, 3});
    CHECK(seen[1].groups[0].members == std::vector<i64>{1, 5});
    CHECK(seen[6].groups[3].members == std::vector<i64>{0, 2, 4, 6});
    CHECK(seen[6].groups[4].members == std::vector<i64>{0, 4, 2, 6});
  }

  TEST_CASE("device_mesh over threads: 4 ranks as (2, 2) and 6 ranks as (2, 3)") {
    {
      weft::mesh::layout const l({2, 2}, {"dp", "tp"});
      std::vector<names_t> const lists = {{"dp"}, {"tp"}, {"tp", "dp"}};
      check_against(l, lists,
                    observe(
                        4,
                        [&](communicator& world) {
                          return weft::device_mesh<communicator>(world, l, {{"tp", "dp"}});
                        },
                        lists));
    }
    {
      weft::mesh::layout const l({2, 3}, {"pp", "tp"});
      std::vector<names_t> const lists = {{"pp"}, {"tp"}, {"pp", "tp"}};
      auto const seen = observe(
          6,
          [&](communicator& world) {
            return weft::device_mesh<communicator>(world, {2, 3}, {"pp", "tp"}, {{"pp", "tp"}});
          },
          lists);
      check_against(l, lists, seen);
      CHECK(seen[4].groups[1].members == std::vector<i64>{3, 4, 5});
      CHECK(seen[4].groups[0].members == std::vector<i64>{1, 4});
    }
  }

  TEST_CASE("device_mesh over threads: Megatron order strings") {
    {
      // The reference note's table: tp=2 cp=1 dp=2 pp=2, order tp-cp-dp-pp.
      weft::mesh::axis_sizes const sizes = {{"tp", 2}, {"cp", 1}, {"dp", 2}, {"pp", 2}};
      auto const l = weft::mesh::layout::from_megatron("tp-cp-dp-pp", sizes);
      std::vector<names_t> const lists = {{"tp"}, {"cp"}, {"dp"}, {"pp"}, {"dp", "cp"}};
      auto const seen = observe(
          8,
          [&](communicator& world) {
            return weft::device_mesh<communicator>::from_megatron(world, "tp-cp-dp-pp", sizes,
                                                                  {{"dp", "cp"}});
          },
          lists);
      check_against(l, lists, seen);
      std::vector<std::vector<i64>> tp, dp, pp;
      for (auto const& s : seen) {
        if (s.groups[0].rank == 0) tp.push_back(s.groups[0].members);
        if (s.groups[2].rank == 0) dp.push_back(s.groups[2].members);
        if (s.groups[3].rank == 0) pp.push_back(s.groups[3].members);
      }
      CHECK(tp == std::vector<std::vector<i64>>{{0, 1}, {2, 3}, {4, 5}, {6, 7}});
      CHECK(dp == std::vector<std::vector<i64>>{{0, 2}, {1, 3}, {4, 6}, {5, 7}});
      CHECK(pp == std::vector<std::vector<i64>>{{0, 4}, {1, 5}, {2, 6}, {3, 7}});
    }
    {
      // A non-default order, with a size-1 axis appended (ep) and Megatron's tp-pp group.
      weft::mesh::axis_sizes const sizes = {{"tp", 2}, {"pp", 3}, {"dp", 1}, {"ep", 1}};
      auto const l = weft::mesh::layout::from_megatron("tp-pp-dp", sizes);
      std::vector<names_t> const lists = {{"tp"}, {"pp"}, {"dp"}, {"ep"}, {"pp", "tp"}};
      check_against(l, lists,
                    observe(
                        6,
                        [&](communicator& world) {
                          return weft::device_mesh<communicator>::from_megatron(
                              world, "tp-pp-dp", sizes, {{"pp", "tp"}});
                        },
                        lists));
      CHECK(l.groups_along("pp") == std::vector<std::vector<int>>{{0, 2, 4}, {1, 3, 5}});
    }
  }

  TEST_CASE("device_mesh over threads: a permuted rank map and a one-rank world") {
    // jax.make_mesh's ring order for 8 devices as a (2, 4) mesh.
    weft::mesh::layout const l({2, 4}, {"x", "y"}, {0, 1, 2, 3, 6, 7, 4, 5});
    std::vector<names_t> const lists = {{"x"}, {"y"}, {"x", "y"}};
    auto const seen = observe(
        8,
        [&](communicator& world) {
          return weft::device_mesh<communicator>(world, l, {{"x", "y"}});
        },
        lists);
    check_against(l, lists, seen);
    CHECK(seen[6].coord == std::vector{1, 0});
    CHECK(seen[6].groups[1].members == std::vector<i64>{6, 7, 4, 5});
    CHECK(seen[4].groups[0].members == std::vector<i64>{2, 4});

    weft::mesh::layout const one({1, 1}, {"dp", "tp"});
    std::vector<names_t> const one_lists = {{"dp"}, {"tp"}, {"dp", "tp"}};
    check_against(one, one_lists,
                  observe(
                      1,
                      [&](communicator& world) {
                        return weft::device_mesh<communicator>(world, one, {{"dp", "tp"}});
                      },
                      one_lists));
  }

  TEST_CASE("device_mesh over threads: ranks that disagree on the mesh all throw mismatch_error") {
    // Rank 2 asks for (4, 2) where the others ask for (2, 4): same volume, different groups.
    std::vector<std::string> caught(8);
    weft::test::run_ranks(8, [&](communicator& world) {
      std::vector<int> shape = world.rank() == 2 ? std::vector{4, 2} : std::vector{2, 4};
      try {
        weft::device_mesh<communicator> m(world, shape, {"dp", "tp"});
      } catch (weft::mismatch_error const& e) {
        // Nothing but the agreement check was communicated: the world is still usable.
        world.barrier({}).wait();
        caught[static_cast<std::size_t>(world.rank())] = e.what();
      }
    });
    for (auto const& what : caught)
      CHECK(what.find("device_mesh: rank 2 built the mesh with a different layout") !=
            std::string::npos);

    // A different flatten list on one rank is caught the same way.
    std::vector<std::string> caught4(4);
    weft::test::run_ranks(4, [&](communicator& world) {
      weft::device_mesh<communicator>::flatten_list f;
      if (world.rank() != 0) f = {{"dp", "tp"}};
      try {
        weft::device_mesh<communicator> m(world, {2, 2}, {"dp", "tp"}, f);
      } catch (weft::mismatch_error const& e) {
        caught4[static_cast<std::size_t>(world.rank())] = e.what();
      }
    });
    for (auto const& what : caught4)
      CHECK(what.find("ranks 1, 2, 3 built the mesh") != std::string::npos);
  }

  TEST_CASE("device_mesh over a split-only group: groups match, disagreement throws everywhere") {
    using mesh_threads_test::split_only;
    // Agreeing ranks: the groups are the threads backend's own, ordered as over the full API.
    std::vector<int> dp_rank(8, -1), tp_size(8, -1);
    weft::test::run_ranks(8, [&](communicator& world) {
      split_only w(world.split(0, world.rank()));
      weft::device_mesh<split_only> m(w, {2, 4}, {"dp", "tp"});
      auto const r = static_cast<std::size_t>(world.rank());
      dp_rank[r] = m.group("dp").rank();
      tp_size[r] = m.group("tp").size();
      // The groups are real communicators: an all_reduce over tp sums its 4 members' ranks.
      std::vector<i64> v{world.rank()};
      weft::comm::all_reduce(m.group("tp").inner(), v).wait();
      CHECK(v[0] == (world.rank() < 4 ? 0 + 1 + 2 + 3 : 4 + 5 + 6 + 7));
    });
    CHECK(dp_rank == std::vector<int>{0, 0, 0, 0, 1, 1, 1, 1});
    CHECK(tp_size == std::vector<int>(8, 4));

    // Rank 2 disagrees: every rank throws mismatch_error (no rank builds a group that would hang).
    std::vector<std::string> caught(8);
    weft::test::run_ranks(8, [&](communicator& world) {
      split_only w(world.split(0, world.rank()));
      std::vector<int> shape = world.rank() == 2 ? std::vector{4, 2} : std::vector{2, 4};
      try {
        weft::device_mesh<split_only> m(w, shape, {"dp", "tp"});
      } catch (weft::mismatch_error const& e) {
        caught[static_cast<std::size_t>(world.rank())] = e.what();
      }
    });
    for (std::size_t r = 0; r < caught.size(); ++r) {
      INFO("rank " << r << ": " << caught[r]);
      CHECK(caught[r].find("device_mesh: ranks built the mesh with different layouts") !=
            std::string::npos);
      CHECK(caught[r].find(r == 2 ? "1 of 8 ranks agree" : "7 of 8 ranks agree") !=
            std::string::npos);
    }
  }

  TEST_CASE(
      "device_mesh over threads: a bad mesh throws on every rank and leaves the world healthy") {
    std::vector<std::string> caught(6);
    std::vector<i64> sums(6, -1);
    weft::test::run_ranks(6, [&](communicator& world) {
      auto const r = static_cast<std::size_t>(world.rank());
      try {
        weft::device_mesh<communicator> m(world, {2, 2}, {"dp", "tp"});
      } catch (weft::invalid_argument_error const& e) {
        caught[r] = e.what();
      }
      // Every rank threw before communicating, so the world's next collective lines up.
      i64 me = world.rank();
      world
          .all_reduce(weft::comm::host_view(std::span<i64>(&me, 1)),
                      weft::comm::host_view(std::span<i64>(&sums[r], 1)),
                      weft::comm::reduce_kind::sum, {})
          .wait();
    });
    for (std::size_t r = 0; r < 6; ++r) {
      CHECK(caught[r].find("argument `world`: expected a communicator of 4 ranks (mesh (dp=2, "
                           "tp=2)), actual 6 ranks") != std::string::npos);
      CHECK(sums[r] == 15);
    }
  }

  TEST_CASE("device_mesh over threads: errors in an axis group name the axis and both ranks") {
    // (dp, tp) = (2, 2): world ranks 2 and 3 form the tp group of dp = 1. In it, world rank 3
    // never calls (timeout), then the dp = 0 tp group calls mismatched collectives.
    using namespace std::chrono_literals;
    std::vector<std::string> timeout_what(4);
    std::vector<std::string> mismatch_what(4);
    std::vector<int> world_missing(4, -2);
    std::atomic<bool> rank2_done{false};
    weft::test::run_ranks(4, [&](communicator& world) {
      weft::device_mesh<communicator> m(world, {2, 2}, {"dp", "tp"});
      auto const r = static_cast<std::size_t>(world.rank());
      auto& tp = m.group("tp");
      std::vector<float> v(4, 1.0f);
      std::vector<float> all(8, 0.0f);
      auto const in = weft::comm::host_view(std::span<float>(v));
      if (world.rank() == 2) {
        try {
          tp.all_reduce(in, in, {}, {.timeout = 100ms}).wait();
        } catch (weft::timeout_error const& e) {
          timeout_what[r] = e.what();
          world_missing[r] = e.missing_ranks().empty() ? -1 : e.missing_ranks()[0];
        }
        rank2_done = true;
      }
      // Late, not finished (a finished rank would fail its peers at once instead).
      if (world.rank() == 3)
        for (int i = 0; i < 500 && !rank2_done; ++i) std::this_thread::sleep_for(10ms);
      if (world.rank() < 2) {
        try {
          if (world.rank() == 0)
            tp.all_reduce(in, in, {}, {}).wait();
          else
            tp.all_gather(in, weft::comm::host_view(std::span<float>(all)), {}).wait();
        } catch (weft::mismatch_error const& e) {
          mismatch_what[r] = e.what();
        }
      }
    });
    std::string const& t = timeout_what[2];
    INFO(t);
    CHECK(t.find("all_reduce on rank 0 (world rank 2) of group `tp`") != std::string::npos);
    CHECK(t.find("on rank 0 (world rank 2): ranks [1] (world ranks [3]) did not arrive") !=
          std::string::npos);
    CHECK(world_missing[2] == 1);  // missing_ranks() are group ranks
    // The location is short: file from weft/, function without its template signature. (The
    // fault is raised by the shared front end in comm/detail/ or by the backend itself.)
    CHECK(t.find("[at weft/comm/") != std::string::npos);
    CHECK(t.find("with ") == std::string::npos);
    CHECK(t.back() == ']');
    for (std::size_t r = 0; r < 2; ++r) {
      std::string const& w = mismatch_what[r];
      INFO(w);
      CHECK(w.find("of group `tp`") != std::string::npos);
      CHECK(w.find("rank 0 (world rank 0) called all_reduce") != std::string::npos);
      CHECK(w.find("but rank 1 (world rank 1) called all_gather") != std::string::npos);
    }
  }

  TEST_CASE("device_mesh over threads: a failing rank is named by its world rank in every group") {
    std::vector<std::string> what(4);
    // The meshes outlive the ranks' functions: rank 3's groups stay alive while it fails.
    std::vector<std::unique_ptr<weft::device_mesh<communicator>>> meshes(4);
    auto body = [&](communicator& world) {
      auto const r = static_cast<std::size_t>(world.rank());
      meshes[r] = std::make_unique<weft::device_mesh<communicator>>(
          world, std::vector<int>{2, 2}, std::vector<std::string>{"dp", "tp"});
      if (world.rank() == 3) throw std::runtime_error("boom");
      std::vector<float> v(4, 1.0f);
      auto const in = weft::comm::host_view(std::span<float>(v));
      try {
        meshes[r]->group("dp").all_reduce(in, in, {}, {}).wait();
      } catch (weft::peer_aborted_error const& e) {
        what[r] = e.what();
        throw;
      }
    };
    CHECK_THROWS_WITH(weft::test::run_ranks(4, body), "boom");
    // World rank 1 shares the dp group with world rank 3 (its dp rank 1).
    INFO(what[1]);
    CHECK(what[1].find("all_reduce on rank 0 (world rank 1) of group `dp`") != std::string::npos);
    CHECK(what[1].find("world rank 3 failed: boom") != std::string::npos);
  }
}
