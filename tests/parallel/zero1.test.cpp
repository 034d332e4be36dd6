// Tests of weft/parallel/zero1.hpp on threads-backend ranks: ZeRO-1 AdamW equals replicated
// optim::adamw bit for bit over 10 f32 steps at dp = 2, 3, 4 with padding and mixed decay flags,
// holding 1/dp of the state; global-norm clipping over the DP group equals the replicated norm;
// a tied weight on two pipeline stages under ZeRO-1 equals the untied weight with the summed
// gradient; the gathered state equals the replicated state and resumes at another dp bit for bit;
// argument checks.
#include <support/run_ranks.hpp>
#include <weft/comm/threads/communicator.hpp>
#include <weft/optim/adamw.hpp>
#include <weft/optim/clip.hpp>
#include <weft/parallel/grad_sync.hpp>
#include <weft/parallel/zero1.hpp>

#include <doctest/doctest.h>

#include <array>
#include <atomic>
#include <cmath>
#include <cstddef>
#include <span>
#include <vector>

namespace {
using weft::optim::adamw_options;
using weft::parallel::bucket_plan;
using weft::parallel::grad_sync;
using weft::parallel::param_info;
using weft::parallel::zero1;
using weft::test::run_ranks;
using comm_t = weft::comm::threads::communicator;

// Odd sizes, so every bucket and most parameter starts are padded; biases do not decay.
std::vector<param_info> const zero1_model{{.count = 37}, {.count = 129, .decay = false},
                                          {.count = 5},  {.count = 300},
                                          {.count = 64}, {.count = 17, .decay = false}};
std::size_t const zero1_model_size = 552;

float grad_of(int rank, int step, std::size_t j) {
  return static_cast<float>(std::sin(0.37 * static_cast<double>(j) + 1.3 * rank + 0.7 * step) *
                            (1.0 + 0.1 * step));
}
float init_of(std::size_t j) { return static_cast<float>(std::cos(0.01 * static_cast<double>(j))); }

// Writes this rank's step gradients (flat element j of parameter i at source + k) and reduces.
template <class Sync>
void backward(Sync& sync, int rank, int step) {
  sync.zero();
  auto const& plan = sync.plan();
  for (std::size_t i = plan.params().size(); i-- > 0;) {
    auto g = sync.grad(i);
    for (std::size_t k = 0; k < g.size(); ++k) g[k] = grad_of(rank, step, plan.slot(i).source + k);
    sync.mark_ready(i);
  }
  sync.finish();
}

adamw_options const options{.lr = 1e-2, .weight_decay = 0.1};
double lr_at(int step) { return 1e-2 * (1.0 - 0.05 * step); }
}  // namespace

TEST_SUITE("threads") {
  TEST_CASE("zero1: AdamW on owned shards equals replicated AdamW bitwise at dp = 2, 3, 4") {
    for (int dp : {2, 3, 4}) {
      CAPTURE(dp);
      std::vector<std::size_t> state(static_cast<std::size_t>(dp));
      run_ranks(dp, [&](comm_t& group) {
        int const r = group.rank();
        std::vector<float> init(zero1_model_size);
        for (std::size_t j = 0; j < zero1_model_size; ++j) init[j] = init_of(j);

        // Replicated: all-reduce (1/dp, SUM), then optim::adamw over the whole buffer.
        bucket_plan rep_plan(zero1_model, {.bucket_size = 200, .dp = dp});
        grad_sync<comm_t, float> rep_sync(group, rep_plan);
        weft::optim::adamw<float> rep_opt(zero1_model, options);
        std::vector<float> rep_params = init, rep_grads(zero1_model_size);

        // ZeRO-1: reduce-scatter, AdamW on the owned pieces, all-gather.
        bucket_plan zero_plan(zero1_model, {.bucket_size = 200, .dp = dp, .shard = true});
        grad_sync<comm_t, float> zero_sync(group, zero_plan);
        zero1<float> zero_opt(zero_plan, r, options);
        std::vector<float> zero_params = init;

        for (int step = 0; step < 10; ++step) {
          backward(rep_sync, r, step);
          rep_sync.unpack(rep_grads);
          rep_opt.step(rep_params, rep_grads, lr_at(step));

          backward(zero_sync, r, step);
          zero_opt.step(group, std::span<float>(zero_params),
                        std::span<float const>(zero_sync.buffer()), lr_at(step));
        }
        std::size_t mismatches = 0;
        for (std::size_t j = 0; j < zero1_model_size; ++j)
          mismatches += zero_params[j] != rep_params[j];
        CHECK(mismatches == 0);
        CHECK(zero_params != init);
        CHECK(zero_opt.optimizer().steps() == 10);
        // 1/dp of the state: at most the padded shard, and the ranks' states add up to the model.
        CHECK(zero_opt.state_size() <= zero_plan.shard_size());
        CHECK(zero_opt.state_size() * static_cast<std::size_t>(dp) <= zero_plan.buffer_size());
        CHECK(zero_opt.optimizer().m().size() == zero_opt.state_size());
        state[static_cast<std::size_t>(r)] = zero_opt.state_size();
      });
      std::size_t total = 0;
      for (auto s : state) total += s;
      CHECK(total == zero1_model_size);
    }
  }

  TEST_CASE("zero1: clipping over the DP group equals the replicated norm over TP x PP") {
    run_ranks(3, [&](comm_t& group) {
      int const r = group.rank();
      // With tp = pp = 1 the replicated optimizer's group (TP x PP) is this rank alone.
      comm_t alone = group.split(r, 0);
      bucket_plan rep_plan(zero1_model, {.bucket_size = 200, .dp = 3});
      bucket_plan zero_plan(zero1_model, {.bucket_size = 200, .dp = 3, .shard = true});
      grad_sync<comm_t, double> rep_sync(group, rep_plan), zero_sync(group, zero_plan);
      backward(rep_sync, r, 1);
      backward(zero_sync, r, 1);
      std::vector<double> rep_grads(zero1_model_size);
      rep_sync.unpack(rep_grads);
      double const rep_norm = weft::optim::clip_grad_norm(
          alone, zero1_model, std::span<double>(rep_grads), 0, /*max_norm*/ 1.0);
      zero1<double> opt(zero_plan, r, options);
      opt.load_grads(zero_sync.buffer());
      double const zero_norm = opt.clip_grad_norm(group, 0, 1.0);
      CHECK(rep_norm > 1.0);  // clipping is active
      CHECK(std::abs(zero_norm - rep_norm) <= 1e-13 * rep_norm);
      // The shard's gradients were scaled like the replicated ones.
      std::size_t k = 0;
      for (auto const& p : opt.pieces())
        for (std::size_t e = 0; e < p.count; ++e, ++k)
          CHECK(std::abs(opt.shard_grads()[k] - rep_grads[p.source + e]) <=
                1e-14 * std::abs(rep_grads[p.source + e]) + 1e-300);
      // The infinity norm too (MAX over the group; of gradients clipped by factors that may
      // differ in the last bit, as the 2-norms summed in different orders may).
      double const inf_zero = opt.grad_norm(group, 0, weft::optim::grad_norm_kind::inf);
      double const inf_rep =
          weft::optim::global_grad_norm(alone, zero1_model, std::span<double const>(rep_grads), 0,
                                        weft::optim::grad_norm_kind::inf);
      CHECK(std::abs(inf_zero - inf_rep) <= 1e-14 * inf_rep);
    });
  }

  TEST_CASE("zero1: a tied weight on two pipeline stages equals the untied weight, summed") {
    // dp = 2 x pp = 2 on 4 ranks (world rank = 2 * pp + dp). Stage 0 holds the embedding E (tied)
    // and A; stage 1 holds B and the output layer H (the tied secondary copy of E).
    std::size_t const n = 100;
    std::array<std::vector<param_info>, 2> const stage{
        std::vector<param_info>{{.count = n, .tied = true}, {.count = 60}},
        std::vector<param_info>{{.count = 70}, {.count = n, .tied_secondary = true}}};
    auto g = [](int pp, int dp, std::size_t j) {
      return static_cast<float>(std::sin(0.1 * static_cast<double>(j) + pp + 2.0 * dp));
    };
    // Untied and summed: one weight whose gradient is the DP mean of stage 0's plus stage 1's, in
    // the order the collectives fold (dp ranks, then pp ranks).
    std::vector<float> want(n, 0.5f);
    {
      std::vector<float> sum(n);
      for (std::size_t j = 0; j < n; ++j)
        sum[j] = (0.5f * g(0, 0, j) + 0.5f * g(0, 1, j)) + (0.5f * g(1, 0, j) + 0.5f * g(1, 1, j));
      weft::optim::adamw<float> ref(n, options);
      ref.step(want, sum, options.lr);
    }
    std::array<std::vector<float>, 4> tied_after;
    run_ranks(4, [&](comm_t& world) {
      int const pp = world.rank() / 2, dp = world.rank() % 2;
      comm_t dp_group = world.split(pp, dp);
      comm_t embedding_group = world.split(dp, pp);
      auto const& params = stage[static_cast<std::size_t>(pp)];
      std::size_t const tied = pp == 0 ? 0 : 1;
      // A bucket size that would put the tied weight together with its neighbour.
      bucket_plan plan(params, {.bucket_size = 1000, .dp = 2, .shard = true});
      grad_sync<comm_t, float> sync(dp_group, plan);
      zero1<float> opt(plan, dp, options);
      std::vector<float> theta(plan.source_size(), 0.5f);
      sync.zero();
      for (std::size_t i = params.size(); i-- > 0;) {
        auto gi = sync.grad(i);
        for (std::size_t k = 0; k < gi.size(); ++k) gi[k] = i == tied ? g(pp, dp, k) : 1.0f;
        sync.mark_ready(i);
      }
      sync.finish();
      sync.sum_tied(embedding_group);
      opt.step(dp_group, std::span<float>(theta), std::span<float const>(sync.buffer()),
               options.lr);
      auto const src = plan.slot(tied).source;
      tied_after[static_cast<std::size_t>(world.rank())].assign(
          theta.begin() + static_cast<std::ptrdiff_t>(src),
          theta.begin() + static_cast<std::ptrdiff_t>(src + n));
    });
    for (auto const& t : tied_after) CHECK(t == want);
  }

  TEST_CASE("zero1: gather_state is the replicated state, and load_state resumes at another dp") {
    // 6 steps at dp = 3 and the whole state gathered; then 4 more steps at dp = 2 from it, against
    // a replicated optim::adamw given the same reduced gradients, bit for bit throughout.
    std::vector<float> init(zero1_model_size);
    for (std::size_t j = 0; j < zero1_model_size; ++j) init[j] = init_of(j);
    // The reduced gradient of a step at dp ranks: the threads backend folds ranks in order.
    auto reduced = [](int dp, int step, std::size_t j) {
      float s = grad_of(0, step, j);
      for (int r = 1; r < dp; ++r) s += grad_of(r, step, j);
      return s;
    };
    weft::optim::adamw<float> ref(zero1_model, options);
    std::vector<float> ref_params = init, g(zero1_model_size), ref_m6, ref_v6;
    for (int step = 0; step < 10; ++step) {
      for (std::size_t j = 0; j < zero1_model_size; ++j) g[j] = reduced(step < 6 ? 3 : 2, step, j);
      ref.step(ref_params, g, lr_at(step));
      if (step == 5) {
        ref_m6.assign(ref.m().begin(), ref.m().end());
        ref_v6.assign(ref.v().begin(), ref.v().end());
      }
    }
    weft::parallel::grad_sync_options const sum{.scaling = weft::parallel::grad_scaling::sum};
    std::array<std::vector<float>, 3> m6, v6;
    std::vector<float> params6;
    run_ranks(3, [&](comm_t& group) {
      int const r = group.rank();
      bucket_plan plan(zero1_model, {.bucket_size = 200, .dp = 3, .shard = true});
      grad_sync<comm_t, float> sync(group, plan, sum);
      zero1<float> opt(plan, r, options);
      std::vector<float> params = init;
      for (int step = 0; step < 6; ++step) {
        backward(sync, r, step);
        opt.step(group, std::span<float>(params), std::span<float const>(sync.buffer()),
                 lr_at(step));
      }
      auto& m = m6[static_cast<std::size_t>(r)];
      auto& v = v6[static_cast<std::size_t>(r)];
      m.assign(zero1_model_size, -1.0f);
      v.assign(zero1_model_size, -1.0f);
      opt.gather_state(group, std::span<float>(m), std::span<float>(v));
      if (r == 0) params6 = params;
    });
    for (auto const& m : m6) CHECK(m == ref_m6);  // every rank holds the whole state
    for (auto const& v : v6) CHECK(v == ref_v6);
    CHECK(m6[0] != std::vector<float>(zero1_model_size, 0.0f));

    std::array<std::vector<float>, 2> after;
    run_ranks(2, [&](comm_t& group) {
      int const r = group.rank();
      bucket_plan plan(zero1_model, {.bucket_size = 200, .dp = 2, .shard = true});
      grad_sync<comm_t, float> sync(group, plan, sum);
      zero1<float> opt(plan, r, options);
      opt.load_state(m6[0], v6[0], 6);
      CHECK(opt.optimizer().steps() == 6);
      std::vector<float> params = params6;
      for (int step = 6; step < 10; ++step) {
        backward(sync, r, step);
        opt.step(group, std::span<float>(params), std::span<float const>(sync.buffer()),
                 lr_at(step));
      }
      after[static_cast<std::size_t>(r)] = params;
    });
    for (auto const& p : after) CHECK(p == ref_params);
  }

  TEST_CASE("zero1: argument checks") {
    run_ranks(2, [&](comm_t& group) {
      bucket_plan rep(zero1_model, {.dp = 2});
      CHECK_THROWS_AS(zero1<float>(rep, 0, options), weft::invalid_argument_error);
      bucket_plan plan(zero1_model, {.dp = 2, .shard = true});
      CHECK_THROWS_AS(zero1<float>(plan, 2, options), weft::invalid_argument_error);
      CHECK_THROWS_AS(zero1<float>(plan, 0, adamw_options{.beta1 = 1.0}),
                      weft::invalid_argument_error);
      zero1<float> opt(plan, group.rank(), options);
      std::vector<float> short_params(zero1_model_size - 1), grads(plan.buffer_size() + 1);
      CHECK_THROWS_AS(opt.load_grads(grads), weft::shape_error);
      CHECK_THROWS_AS(opt.step(group, std::span<float>(short_params), 1e-3), weft::shape_error);
      comm_t alone = group.split(group.rank(), 0);
      std::vector<float> params(zero1_model_size);
      CHECK_THROWS_AS(opt.step(alone, std::span<float>(params), 1e-3),
                      weft::invalid_argument_error);
      CHECK(opt.optimizer().steps() == 0);
      // The state functions: whole-model sizes and a non-negative step count, checked before
      // anything is communicated or changed.
      std::vector<float> whole(zero1_model_size, 1.0f), short_state(zero1_model_size - 1);
      CHECK_THROWS_AS(
          opt.gather_state(group, std::span<float>(short_state), std::span<float>(whole)),
          weft::shape_error);
      CHECK_THROWS_AS(opt.gather_state(alone, std::span<float>(whole), std::span<float>(whole)),
                      weft::invalid_argument_error);
      CHECK_THROWS_AS(opt.load_state(whole, short_state, 1), weft::shape_error);
      CHECK_THROWS_AS(opt.load_state(whole, whole, -1), weft::invalid_argument_error);
      CHECK(opt.optimizer().steps() == 0);
      for (float x : opt.optimizer().m()) CHECK(x == 0.0f);
    });
  }
}
