// Tests for weft/mesh/device_mesh.hpp that need no threads: argument validation (which must throw
// before anything is communicated) and the one-rank mesh, over a recording one-rank group that
// models only what device_mesh needs (rank, size, split).
#include <weft/mesh/mesh.hpp>

#include <doctest/doctest.h>

#include <memory>
#include <string>
#include <utility>
#include <vector>

// A named namespace, not an anonymous one: nvcc warns about every unused member of a class in an
// anonymous namespace.
namespace mesh_test {

namespace comm = weft::comm;

// A group that claims `size` ranks and is rank `rank`, counts every call, and can really split
// only a one-rank group. It models what device_mesh asks for and nothing more: rank, size and
// split (comm::SplittableGroup). For validation tests: a mesh that throws before communicating
// leaves `calls` at zero.
class recording_comm {
 public:
  using communicator_concept = comm::group_tag;

  explicit recording_comm(int size = 1, int rank = 0) : rank_(rank), size_(size) {}

  [[nodiscard]] int rank() const noexcept { return rank_; }
  [[nodiscard]] int size() const noexcept { return size_; }
  [[nodiscard]] int calls() const noexcept { return *calls_; }
  [[nodiscard]] std::vector<std::pair<int, int>> const& splits() const noexcept { return *splits_; }

  recording_comm split(int color, int key) {
    ++*calls_;
    REQUIRE(size_ == 1);
    splits_->emplace_back(color, key);
    recording_comm sub(1, 0);
    sub.calls_ = calls_;
    sub.splits_ = splits_;
    return sub;
  }

 private:
  int rank_;
  int size_;
  std::shared_ptr<int> calls_ = std::make_shared<int>(0);
  std::shared_ptr<std::vector<std::pair<int, int>>> splits_ =
      std::make_shared<std::vector<std::pair<int, int>>>();
};
static_assert(comm::SplittableGroup<recording_comm>);
static_assert(!comm::PointToPoint<recording_comm>);
static_assert(!comm::Communicator<recording_comm>);

using mesh_t = weft::device_mesh<recording_comm>;

}  // namespace mesh_test

using mesh_test::mesh_t;
using mesh_test::recording_comm;

TEST_CASE("device_mesh: bad arguments throw before anything is communicated") {
  using doctest::Contains;
  using weft::invalid_argument_error;
  recording_comm world(8, 3);
  CHECK_THROWS_WITH_AS(mesh_t(world, {2, 2}, {"dp", "tp"}),
                       Contains("argument `world`: expected a communicator of 4 ranks (mesh (dp=2, "
                                "tp=2)), actual 8 ranks"),
                       invalid_argument_error);
  CHECK_THROWS_WITH_AS(mesh_t(world, {2, 4}, {"dp", "dp"}),
                       Contains("argument `names`: expected distinct axis names"),
                       invalid_argument_error);
  CHECK_THROWS_WITH_AS(
      mesh_t(world, {2, 2, 2}, {"dp", "cp", "tp"}, {{"dp", "xp"}}),
      Contains("argument `flatten`: expected axis names among (dp, cp, tp), actual `xp` "
               "in group (dp, xp)"),
      invalid_argument_error);
  CHECK_THROWS_WITH_AS(mesh_t(world, {2, 2, 2}, {"dp", "cp", "tp"}, {{"dp"}}),
                       Contains("argument `flatten`: expected groups of at least two axis names"),
                       invalid_argument_error);
  CHECK_THROWS_WITH_AS(mesh_t(world, {2, 2, 2}, {"dp", "cp", "tp"}, {{"dp", "dp"}}),
                       Contains("`dp` repeated"), invalid_argument_error);
  CHECK_THROWS_WITH_AS(
      mesh_t(world, {2, 2, 2}, {"dp", "cp", "tp"}, {{"dp", "cp"}, {"cp", "tp"}, {"dp", "cp"}}),
      Contains(
          "argument `flatten`: expected each flattened group once, actual (dp, cp) given twice"),
      invalid_argument_error);
  CHECK_THROWS_WITH_AS(
      (void)mesh_t::from_megatron(world, "tp-cp-dp-pp",
                                  {{"tp", 2}, {"cp", 1}, {"dp", 2}, {"pp", 1}}),
      Contains(
          "expected a communicator of 4 ranks (mesh (pp=1, dp=2, cp=1, tp=2)), actual 8 ranks"),
      invalid_argument_error);
  CHECK_THROWS_WITH_AS(
      (void)mesh_t::from_megatron(world, "tp-cp--pp", {{"tp", 2}, {"cp", 2}, {"pp", 2}}),
      Contains("argument `order`"), invalid_argument_error);
  CHECK(world.calls() == 0);
}

TEST_CASE("device_mesh: a one-rank mesh has size-1 groups, flattened ones included") {
  recording_comm world(1, 0);
  mesh_t m(world, {1, 1, 1}, {"dp", "cp", "tp"}, {{"dp", "cp"}});
  // One agreement split (a group without a host all_gather compares the layout hash as the split
  // color, keyed by rank), then one split per axis and one per flattened group.
  CHECK(world.calls() == 1 + 3 + 1);
  REQUIRE(world.splits().size() == 5);
  CHECK(world.splits()[0].first >= 0);
  CHECK(world.splits()[0].second == 0);
  CHECK(std::vector<std::pair<int, int>>(world.splits().begin() + 1, world.splits().end()) ==
        std::vector<std::pair<int, int>>{{0, 0}, {0, 0}, {0, 0}, {0, 0}});
  CHECK(m.ndim() == 3);
  CHECK(m.size() == 1);
  CHECK(m.global_rank() == 0);
  CHECK(std::vector<int>(m.coordinate().begin(), m.coordinate().end()) == std::vector{0, 0, 0});
  for (char const* axis : {"dp", "cp", "tp"}) {
    CHECK(m.group(axis).size() == 1);
    CHECK(m.local_rank(axis) == 0);
    CHECK(m.size(axis) == 1);
  }
  CHECK(m.group({"dp", "cp"}).size() == 1);
  CHECK(m.group(std::vector<std::string>{"dp", "cp"}).size() == 1);
  CHECK(m.group({"tp"}).size() == 1);
  // Undeclared flattened groups, including a declared one in another order, are refused.
  CHECK_THROWS_WITH_AS((void)m.group({"cp", "dp"}),
                       doctest::Contains("argument `axes`: expected one axis, or a flattened group "
                                         "declared at construction (in the same order): "
                                         "[(dp, cp)], actual (cp, dp)"),
                       weft::invalid_argument_error);
  CHECK_THROWS_AS((void)m.group({"dp", "tp"}), weft::invalid_argument_error);
  CHECK_THROWS_AS((void)m.group("pp"), weft::invalid_argument_error);
  // A moved mesh keeps its groups.
  mesh_t moved = std::move(m);
  CHECK(moved.group({"dp", "cp"}).size() == 1);
  CHECK(moved.groups_along({"dp", "cp"}) == std::vector<std::vector<int>>{{0}});
  CHECK(mesh_t::ravel(std::vector{1, 2}, std::vector{2, 3}) == 5);
  CHECK(mesh_t::unravel(5, std::vector{2, 3}) == std::vector{1, 2});
}
