// Tests of weft/parallel/buckets.hpp: the reference note's bucket golden (a = 100, b = 300,
// c = 50, d = 200, bucket_size 250; replicated and ZeRO-1 at dp = 4 with bucket 0's owners),
// tied parameters alone in their bucket, ownership covering every element once, pack/unpack, and
// argument checks.
#include <weft/parallel/buckets.hpp>

#include <doctest/doctest.h>

#include <cstddef>
#include <numeric>
#include <span>
#include <vector>

namespace {
using weft::parallel::bucket_options;
using weft::parallel::bucket_plan;
using weft::parallel::param_info;

enum : std::size_t { a, b, c, d };
std::vector<param_info> const golden{{.count = 100}, {.count = 300}, {.count = 50}, {.count = 200}};

struct expected_slot {
  std::size_t param, start, end;
};
void check_bucket(bucket_plan const& plan, std::size_t k, std::size_t start, std::size_t end,
                  std::vector<expected_slot> const& slots) {
  CAPTURE(k);
  auto const& bk = plan.buckets()[k];
  CHECK(bk.start == start);
  CHECK(bk.end == end);
  REQUIRE(bk.params.size() == slots.size());
  for (std::size_t i = 0; i < slots.size(); ++i) {
    CHECK(bk.params[i] == slots[i].param);
    auto const& s = plan.slot(slots[i].param);
    CHECK(s.start == slots[i].start);
    CHECK(s.end() == slots[i].end);
    CHECK(s.bucket == k);
  }
}
}  // namespace

TEST_CASE("buckets: golden, replicated: {d c} {b} {a} in reverse order, no padding") {
  bucket_plan const plan(golden, {.bucket_size = 250, .dp = 4});
  REQUIRE(plan.buckets().size() == 3);
  check_bucket(plan, 0, 0, 250, {{d, 0, 200}, {c, 200, 250}});
  check_bucket(plan, 1, 250, 550, {{b, 250, 550}});
  check_bucket(plan, 2, 550, 650, {{a, 550, 650}});
  CHECK(plan.buffer_size() == 650);
  CHECK(plan.source_size() == 650);
  CHECK(plan.slot(a).source == 0);
  CHECK(plan.slot(d).source == 450);
  CHECK_THROWS_AS((void)plan.owned(0, 0), weft::invalid_argument_error);
}

TEST_CASE("buckets: golden, ZeRO-1 dp = 4: starts padded to 64, bucket ends to lcm(4, 128)") {
  bucket_plan const plan(golden, {.bucket_size = 250, .dp = 4, .shard = true});
  REQUIRE(plan.buckets().size() == 3);
  check_bucket(plan, 0, 0, 384, {{d, 0, 200}, {c, 256, 306}});
  check_bucket(plan, 1, 384, 768, {{b, 384, 684}});
  check_bucket(plan, 2, 768, 896, {{a, 768, 868}});
  CHECK(plan.buckets()[0].data_end == 306);  // unpadded
  CHECK(plan.buffer_size() == 896);
  CHECK(plan.shard_size() == 224);

  // Bucket 0 cut into 4 ranges of 96, ignoring parameter boundaries.
  struct piece {
    std::size_t param, lo, hi;
  };
  std::vector<std::vector<piece>> const owners{
      {{d, 0, 96}}, {{d, 96, 192}}, {{d, 192, 200}, {c, 0, 32}}, {{c, 32, 50}}};
  for (int r = 0; r < 4; ++r) {
    CAPTURE(r);
    auto const o = plan.owned(0, r);
    CHECK(o.start == 96u * static_cast<std::size_t>(r));
    CHECK(o.size() == 96);
    auto const& want = owners[static_cast<std::size_t>(r)];
    REQUIRE(o.pieces.size() == want.size());
    for (std::size_t i = 0; i < want.size(); ++i) {
      CHECK(o.pieces[i].param == want[i].param);
      CHECK(o.pieces[i].offset == want[i].lo);
      CHECK(o.pieces[i].offset + o.pieces[i].count == want[i].hi);
      CHECK(o.pieces[i].buffer == plan.slot(want[i].param).start + want[i].lo);
      CHECK(o.pieces[i].source == plan.slot(want[i].param).source + want[i].lo);
    }
  }
}

TEST_CASE("buckets: every element is owned by exactly one rank, at dp = 1..5") {
  std::vector<param_info> const params{{.count = 37},  {.count = 129}, {.count = 5},
                                       {.count = 300}, {.count = 64},  {.count = 17}};
  for (int dp = 1; dp <= 5; ++dp) {
    CAPTURE(dp);
    bucket_plan const plan(params, {.bucket_size = 200, .dp = dp, .shard = true});
    std::vector<int> owner(plan.source_size(), 0);
    std::size_t total = 0;
    for (int r = 0; r < dp; ++r) {
      std::size_t mine = 0;
      for (auto const& p : plan.owned_pieces(r)) {
        for (std::size_t k = 0; k < p.count; ++k) ++owner[p.source + k];
        mine += p.count;
      }
      CHECK(mine <= plan.shard_size());
      total += mine;
    }
    CHECK(total == plan.source_size());
    for (auto const n : owner) CHECK(n == 1);
    for (auto const& bk : plan.buckets()) {
      CHECK(bk.size() % std::lcm(std::size_t(dp), std::size_t{128}) == 0);
      for (auto const p : bk.params) CHECK(plan.slot(p).start % 64 == 0);
    }
  }
}

TEST_CASE("buckets: a tied parameter has a bucket of its own under ZeRO-1 only") {
  std::vector<param_info> params{{.count = 100, .tied = true}, {.count = 30}, {.count = 40}};
  bucket_plan const sharded(params, {.bucket_size = 1000, .dp = 2, .shard = true});
  REQUIRE(sharded.buckets().size() == 2);
  CHECK(sharded.buckets()[0].params == std::vector<std::size_t>{2, 1});
  CHECK(sharded.buckets()[1].params == std::vector<std::size_t>{0});
  CHECK(sharded.slot(0).start == sharded.buckets()[1].start);
  // The secondary copy too, and in the middle of the order it closes the bucket before it.
  params = {{.count = 30}, {.count = 100, .tied_secondary = true}, {.count = 40}};
  bucket_plan const middle(params, {.bucket_size = 1000, .dp = 2, .shard = true});
  REQUIRE(middle.buckets().size() == 3);
  CHECK(middle.buckets()[1].params == std::vector<std::size_t>{1});
  // Replicated: one bucket (the tied copies are all-reduced whole, nothing to align).
  bucket_plan const replicated(params, {.bucket_size = 1000, .dp = 2});
  CHECK(replicated.buckets().size() == 1);
}

TEST_CASE("buckets: bucket_size 0 is one bucket; high-busbw padding; pack and unpack") {
  bucket_plan const one(golden, {.bucket_size = 0, .dp = 2, .shard = true});
  REQUIRE(one.buckets().size() == 1);
  CHECK(one.buffer_size() == 768);  // a ends at 740 when b starts at 320 -> lcm(2, 128)
  bucket_plan const busbw(
      golden, {.bucket_size = 0, .dp = 3, .shard = true, .pad_for_high_nccl_busbw = true});
  CHECK(busbw.buffer_size() == 3u * 65536u);  // lcm(3, 128, 2^16)

  bucket_plan const plan(golden, {.bucket_size = 250, .dp = 4, .shard = true});
  std::vector<float> flat(plan.source_size());
  std::iota(flat.begin(), flat.end(), 1.0f);
  std::vector<float> buffer(plan.buffer_size(), -1.0f);
  plan.pack(std::span<float const>(flat), std::span<float>(buffer));
  CHECK(buffer[plan.slot(d).start] == flat[plan.slot(d).source]);
  CHECK(buffer[200] == 0.0f);  // padding before c
  CHECK(buffer[895] == 0.0f);
  std::vector<float> back(plan.source_size(), 0.0f);
  plan.unpack(std::span<float const>(buffer), std::span<float>(back));
  CHECK(back == flat);
  CHECK_THROWS_AS(plan.pack(std::span<float const>(flat), std::span<float>(flat)),
                  weft::shape_error);
  CHECK_THROWS_AS(bucket_plan(golden, {.dp = 0}), weft::invalid_argument_error);
  CHECK_THROWS_AS(bucket_plan(golden, {.pad_for_high_nccl_busbw = true}),
                  weft::invalid_argument_error);
  CHECK_THROWS_AS((void)plan.slot(4), weft::invalid_argument_error);
  CHECK_THROWS_AS((void)plan.owned(0, 4), weft::invalid_argument_error);
  CHECK(weft::parallel::megatron_bucket_size(8) == 40'000'000u);
  CHECK(weft::parallel::megatron_bucket_size(64) == 64'000'000u);
}
