// Tests of weft/parallel/grad_sync.hpp on threads-backend ranks: DP equivalence (replicas with
// unequal token counts and a globally token-weighted loss equal one replica with all the data;
// microbatch means scaled by 1/dp equal an AVG of the means), the sharded plan reducing the owned
// ranges to the same bits, unused parameters (finish() reduces them as zeros, never hangs, and
// buckets are issued in order on every rank), argument checks, and a timestamping communicator
// showing the first bucket's collective starts before a synthetic backward pass ends.
#include "support/checks.hpp"
#include <support/run_ranks.hpp>
#include <weft/comm/collectives.hpp>
#include <weft/comm/threads/communicator.hpp>
#include <weft/parallel/grad_sync.hpp>

#include <doctest/doctest.h>

#include <atomic>
#include <chrono>
#include <cmath>
#include <cstddef>
#include <numeric>
#include <span>
#include <string>
#include <utility>
#include <vector>

namespace {
using weft::parallel::bucket_plan;
using weft::parallel::grad_scaling;
using weft::parallel::grad_sync;
using weft::parallel::param_info;
using weft::test::has;
using weft::test::message_of;
using weft::test::run_ranks;
using comm_t = weft::comm::threads::communicator;
using clock_type = std::chrono::steady_clock;
using sync_f = grad_sync<comm_t, float>;

std::vector<param_info> const model{{.count = 5}, {.count = 7}, {.count = 1}, {.count = 11}};
std::size_t const model_size = 24;

// Token t's gradient (t global across replicas), element j of the flat definition-order buffer.
double token_grad(int t, std::size_t j) {
  return std::sin(0.37 * t + 0.11 * static_cast<double>(j)) + 0.25 * static_cast<double>(j % 3);
}

// Replica r of `counts.size()` holds tokens [first(r), first(r) + counts[r]).
int first_token(std::vector<int> const& counts, int r) {
  return std::accumulate(counts.begin(), counts.begin() + r, 0);
}

// A threads communicator that records when each bucket collective is started on this rank.
struct stamping_communicator : comm_t {
  std::vector<clock_type::time_point> starts;
  explicit stamping_communicator(comm_t&& c) : comm_t(std::move(c)) {}
  weft::comm::work all_reduce(weft::comm::buffer_view in, weft::comm::buffer_view out,
                              weft::comm::reduce_op op = {}, weft::comm::op_options o = {}) {
    starts.push_back(clock_type::now());
    return comm_t::all_reduce(in, out, op, o);
  }
  weft::comm::work reduce_scatter(weft::comm::buffer_view in, weft::comm::buffer_view out,
                                  weft::comm::reduce_op op = {}, weft::comm::op_options o = {}) {
    starts.push_back(clock_type::now());
    return comm_t::reduce_scatter(in, out, op, o);
  }
};
static_assert(weft::comm::CollectiveIn<stamping_communicator, weft::host_space>);
}  // namespace

TEST_SUITE("threads") {
  TEST_CASE("grad_sync: DP replicas with unequal token counts equal one replica (token mean)") {
    std::vector<int> const counts{3, 5, 0, 8};
    int const total = 16;
    // One replica holding all 16 tokens: the token mean.
    std::vector<double> single(model_size, 0.0);
    for (int t = 0; t < total; ++t)
      for (std::size_t j = 0; j < model_size; ++j) single[j] += token_grad(t, j);
    for (auto& x : single) x /= total;

    for (bool shard : {false, true}) {
      CAPTURE(shard);
      run_ranks(4, [&](comm_t& dp) {
        int const r = dp.rank();
        bucket_plan plan(model, {.bucket_size = 8, .dp = 4, .shard = shard});
        grad_sync<comm_t, double> sync(dp, plan, {.scaling = grad_scaling::sum});
        sync.zero();
        // Backward in reverse order; the loss divides by the global token count (16).
        for (std::size_t i = model.size(); i-- > 0;) {
          auto g = sync.grad(i);
          std::size_t const src = plan.slot(i).source;
          for (int t = first_token(counts, r); t < first_token(counts, r) + counts[r]; ++t)
            for (std::size_t k = 0; k < g.size(); ++k) g[k] += token_grad(t, src + k) / total;
          sync.mark_ready(i);
        }
        sync.finish();
        CHECK(sync.unused().empty());
        if (!shard) {
          std::vector<double> flat(model_size);
          sync.unpack(flat);
          for (std::size_t j = 0; j < model_size; ++j)
            CHECK(std::abs(flat[j] - single[j]) <= 1e-13 * std::max(1.0, std::abs(single[j])));
        } else {
          for (auto const& p : plan.owned_pieces(r))
            for (std::size_t k = 0; k < p.count; ++k) {
              double const want = single[p.source + k];
              CHECK(std::abs(sync.buffer()[p.buffer + k] - want) <=
                    1e-13 * std::max(1.0, std::abs(want)));
            }
        }
      });
    }
  }

  TEST_CASE("grad_sync: microbatch means scaled by 1/dp equal AVG, not the token mean") {
    std::vector<int> const counts{2, 6, 3};
    run_ranks(3, [&](comm_t& dp) {
      int const r = dp.rank();
      bucket_plan plan(model, {.bucket_size = 10, .dp = 3});
      grad_sync<comm_t, double> sync(dp, plan);  // grad_scaling::average
      std::vector<double> mean(model_size, 0.0);
      for (int t = first_token(counts, r); t < first_token(counts, r) + counts[r]; ++t)
        for (std::size_t j = 0; j < model_size; ++j) mean[j] += token_grad(t, j) / counts[r];
      sync.zero();
      for (std::size_t i = model.size(); i-- > 0;) {
        auto const s = plan.slot(i);
        sync.mark_ready(i, std::span<double const>(mean).subspan(s.source, s.count));
      }
      sync.finish();
      std::vector<double> got(model_size), avg(model_size);
      sync.unpack(got);
      weft::comm::all_reduce(dp, std::span<double const>(mean), avg, weft::comm::reduce_kind::avg)
          .wait();
      double token_mean_gap = 0.0;
      for (std::size_t j = 0; j < model_size; ++j) {
        CHECK(std::abs(got[j] - avg[j]) <= 1e-15 * std::max(1.0, std::abs(avg[j])));
        double tm = 0.0;
        for (int t = 0; t < 11; ++t) tm += token_grad(t, j) / 11;
        token_mean_gap = std::max(token_mean_gap, std::abs(got[j] - tm));
      }
      // Unequal counts: the mean of means is not the token mean (the pitfall `sum` avoids).
      CHECK(token_mean_gap > 1e-3);
    });
  }

  TEST_CASE("grad_sync: the sharded plan's owned ranges equal the replicated all-reduce bitwise") {
    std::vector<param_info> const params{
        {.count = 37}, {.count = 129}, {.count = 5}, {.count = 300}};
    run_ranks(3, [&](comm_t& dp) {
      int const r = dp.rank();
      auto fill = [&](auto& sync) {
        sync.zero();
        for (std::size_t i = params.size(); i-- > 0;) {
          auto g = sync.grad(i);
          for (std::size_t k = 0; k < g.size(); ++k)
            g[k] = static_cast<float>(std::cos(0.3 * static_cast<double>(k + 7 * i) + r));
          sync.mark_ready(i);
        }
        sync.finish();
      };
      bucket_plan rep_plan(params, {.bucket_size = 100, .dp = 3});
      bucket_plan zero_plan(params, {.bucket_size = 100, .dp = 3, .shard = true});
      grad_sync<comm_t, float> rep(dp, rep_plan), zero(dp, zero_plan);
      fill(rep);
      fill(zero);
      for (auto const& p : zero_plan.owned_pieces(r))
        for (std::size_t k = 0; k < p.count; ++k)
          CHECK(zero.buffer()[p.buffer + k] == rep.grad(p.param)[p.offset + k]);
    });
  }

  TEST_CASE("grad_sync: an unused parameter is reduced as zero by finish(), never a hang") {
    run_ranks(2, [&](comm_t& dp) {
      int const r = dp.rank();
      // Layout: bucket 0 = {3, 2} (11 + 1 >= 12), bucket 1 = {1, 0}.
      bucket_plan plan(model, {.bucket_size = 12, .dp = 2});
      REQUIRE(plan.buckets().size() == 2);
      grad_sync<comm_t, double> sync(dp, plan);
      sync.zero();
      // Rank 1 never uses parameter 2 (in bucket 0); everything else gets 1 + rank.
      // Rank 1 also produces its gradients in definition order, rank 0 in reverse.
      for (std::size_t k = 0; k < model.size(); ++k) {
        std::size_t const i = r == 0 ? model.size() - 1 - k : k;
        if (r == 1 && i == 2) continue;
        for (auto& x : sync.grad(i)) x = 1.0 + r;
        sync.mark_ready(i);
      }
      // Rank 1's bucket 0 is incomplete, so neither bucket is issued before finish(): buckets go
      // out in order on every rank.
      CHECK(sync.issued() == (r == 0 ? 2u : 0u));
      sync.finish();
      CHECK(sync.issued() == 2);
      CHECK(sync.unused() == (r == 0 ? std::vector<std::size_t>{} : std::vector<std::size_t>{2}));
      CHECK(sync.grad(2)[0] == 0.5);  // (1 + 0) / 2
      for (std::size_t i : {0u, 1u, 3u})
        for (auto x : sync.grad(i)) CHECK(x == 1.5);  // (1 + 2) / 2
    });
  }

  TEST_CASE("grad_sync: argument errors name the parameter and change nothing") {
    run_ranks(2, [&](comm_t& dp) {
      bucket_plan plan(model, {.bucket_size = 10, .dp = 2});
      grad_sync<comm_t, float> sync(dp, plan);
      sync.zero();
      sync.mark_ready(3);
      auto const twice = message_of([&] { sync.mark_ready(3); });
      CHECK(has(twice, "parameter 3 marked ready once per step"));
      CHECK_THROWS_AS(sync.mark_ready(4), weft::invalid_argument_error);
      std::vector<float> wrong(3);
      CHECK_THROWS_AS(sync.mark_ready(0, std::span<float const>(wrong)), weft::shape_error);
      CHECK(sync.unused() == std::vector<std::size_t>{0, 1, 2});
      CHECK_THROWS_AS(sync_f(dp, bucket_plan(model, {.dp = 3})), weft::invalid_argument_error);
      sync.finish();
      CHECK(has(message_of([&] { sync.mark_ready(0); }), "after finish()"));
      CHECK_THROWS_AS(sync.finish(), weft::invalid_argument_error);
      // zero() starts the next step.
      sync.zero();
      CHECK(sync.issued() == 0);
      CHECK_FALSE(sync.finished());
      sync.finish();
    });
  }

  TEST_CASE("grad_sync: the first bucket's collective starts before backward ends") {
    // A synthetic backward over 8 layers in reverse order, each about 2 ms of arithmetic, each
    // layer a weight and a bias; 2 layers per bucket. The communicator stamps every collective.
    int const layers = 8;
    std::size_t const width = 256;
    std::vector<param_info> params;
    for (int l = 0; l < layers; ++l) {
      params.push_back({.count = width});
      params.push_back({.count = 16, .decay = false});
    }
    auto const busy = std::chrono::milliseconds(2);
    for (bool shard : {false, true}) {
      CAPTURE(shard);
      std::vector<double> first_start_ms(2), last_layer_start_ms(2), backward_end_ms(2);
      run_ranks(2, [&](comm_t& inner) {
        stamping_communicator dp(std::move(inner));
        int const r = dp.rank();
        bucket_plan plan(params, {.bucket_size = 2 * (width + 16), .dp = 2, .shard = shard});
        REQUIRE(plan.buckets().size() == 4);
        grad_sync<stamping_communicator, float> sync(dp, plan);
        sync.zero();
        auto const t0 = clock_type::now();
        clock_type::time_point last_layer_start{};
        for (int l = layers; l-- > 0;) {
          if (l == 0) last_layer_start = clock_type::now();
          auto w = sync.grad(static_cast<std::size_t>(2 * l));
          auto b = sync.grad(static_cast<std::size_t>(2 * l + 1));
          // Real work until the layer's time is up: a small matrix-vector product per pass.
          auto const until = clock_type::now() + busy;
          double acc = 0.0;
          do {
            for (std::size_t i = 0; i < width; ++i) {
              double s = 0.0;
              for (std::size_t k = 0; k < 16; ++k)
                s += std::sin(static_cast<double>(i * k + static_cast<std::size_t>(l)));
              acc += s;
              w[i] = static_cast<float>(s);
            }
          } while (clock_type::now() < until);
          for (auto& x : b) x = static_cast<float>(acc * 1e-6);
          sync.mark_ready(static_cast<std::size_t>(2 * l));
          sync.mark_ready(static_cast<std::size_t>(2 * l + 1));
        }
        auto const backward_end = clock_type::now();
        sync.finish();
        REQUIRE(dp.starts.size() == plan.buckets().size());
        auto ms = [&](clock_type::time_point t) {
          return std::chrono::duration<double, std::milli>(t - t0).count();
        };
        auto const rr = static_cast<std::size_t>(r);
        first_start_ms[rr] = ms(dp.starts.front());
        last_layer_start_ms[rr] = ms(last_layer_start);
        backward_end_ms[rr] = ms(backward_end);
        // The first bucket (layers 7 and 6) goes out while layers 5..0 still compute.
        CHECK(dp.starts.front() < backward_end);
        CHECK(dp.starts.front() < last_layer_start);
        CHECK(dp.starts[2] < last_layer_start);
      });
      MESSAGE("shard=", shard, ": first bucket collective started at ", first_start_ms[0], " / ",
              first_start_ms[1], " ms; last layer started at ", last_layer_start_ms[0], " / ",
              last_layer_start_ms[1], " ms; backward ended at ", backward_end_ms[0], " / ",
              backward_end_ms[1], " ms (ranks 0 / 1)");
    }
  }
}
