// Tests of weft/optim/clip.hpp on threads-backend ranks: the note's golden norm at TP = 2
// (13.19090595827292, not the double-counted 13.379088160259652), the clip coefficient
// 0.7580979861076435, no scaling at or below max_norm, a tied secondary copy counted never, the
// same norm over a ZeRO-1-style DP × TP group, the infinity norm, NaN, and argument checks.
#include "support/checks.hpp"
#include <support/run_ranks.hpp>
#include <weft/comm/threads/communicator.hpp>
#include <weft/optim/clip.hpp>

#include <doctest/doctest.h>

#include <cmath>
#include <span>
#include <string>
#include <vector>

namespace {
using weft::optim::grad_norm_kind;
using weft::optim::param_info;
using weft::test::close_rel;
using weft::test::has;
using weft::test::message_of;
using weft::test::run_ranks;
using comm_t = weft::comm::threads::communicator;

double const golden_norm = 13.19090595827292;
double const double_counted = 13.379088160259652;
double const golden_coeff = 0.7580979861076435;

// The note's layout at TP = 2: a sharded gradient [3, 4] on rank 0 and [12, 0] on rank 1, and a
// replicated [1, 2] on both.
std::vector<param_info> const golden_params{{.count = 2, .tp_sharded = true}, {.count = 2}};
template <class T>
std::vector<T> golden_grads(int rank) {
  return rank == 0 ? std::vector<T>{3, 4, 1, 2} : std::vector<T>{12, 0, 1, 2};
}

}  // namespace

TEST_CASE("clip: the coefficient is min(max_norm / (norm + 1e-6), 1)") {
  CHECK(close_rel(weft::optim::clip_coefficient(golden_norm, 10.0), golden_coeff, 1e-15));
  CHECK(weft::optim::clip_coefficient(5.0, 10.0) == 1.0);
  CHECK(weft::optim::clip_coefficient(std::numeric_limits<double>::infinity(), 10.0) == 0.0);
  CHECK(std::isnan(weft::optim::clip_coefficient(std::nan(""), 10.0)));
  CHECK(weft::optim::counts_in_norm(param_info{.tp_sharded = true}, 1));
  CHECK_FALSE(weft::optim::counts_in_norm(param_info{}, 1));
  CHECK(weft::optim::counts_in_norm(param_info{}, 0));
  CHECK_FALSE(
      weft::optim::counts_in_norm(param_info{.tp_sharded = true, .tied_secondary = true}, 0));
}

TEST_SUITE("threads") {
  TEST_CASE("clip: golden norm at TP = 2 counts the replicated gradient once") {
    run_ranks(2, [](comm_t& tp) {
      auto const g = golden_grads<double>(tp.rank());
      double const norm =
          weft::optim::global_grad_norm(tp, golden_params, std::span<double const>(g), tp.rank());
      CHECK(close_rel(norm, golden_norm, 1e-15));
      // Marking the replicated parameter as sharded counts it twice (the known miscount).
      std::vector<param_info> wrong = golden_params;
      wrong[1].tp_sharded = true;
      double const twice =
          weft::optim::global_grad_norm(tp, wrong, std::span<double const>(g), tp.rank());
      CHECK(close_rel(twice, double_counted, 1e-15));
      // f32 gradients give the same norm (accumulated in f64).
      auto const g32 = golden_grads<float>(tp.rank());
      CHECK(weft::optim::global_grad_norm(tp, golden_params, std::span<float const>(g32),
                                          tp.rank()) == norm);
    });
  }

  TEST_CASE("clip: max_norm = 10 scales every gradient by 0.7580979861076435") {
    run_ranks(2, [](comm_t& tp) {
      auto g = golden_grads<double>(tp.rank());
      auto const before = g;
      double const norm =
          weft::optim::clip_grad_norm(tp, golden_params, std::span<double>(g), tp.rank(), 10.0);
      CHECK(close_rel(norm, golden_norm, 1e-15));
      double const coeff = weft::optim::clip_coefficient(norm, 10.0);
      CHECK(close_rel(coeff, golden_coeff, 1e-15));
      for (std::size_t i = 0; i < g.size(); ++i) CHECK(g[i] == before[i] * coeff);
      // The clipped gradients' norm is max_norm up to the 1e-6 guard.
      double const after =
          weft::optim::global_grad_norm(tp, golden_params, std::span<double const>(g), tp.rank());
      CHECK(close_rel(after, 10.0, 1e-6));

      auto f = golden_grads<float>(tp.rank());
      weft::optim::clip_grad_norm(tp, golden_params, std::span<float>(f), tp.rank(), 10.0);
      for (std::size_t i = 0; i < f.size(); ++i)
        CHECK(f[i] == static_cast<float>(before[i]) * static_cast<float>(golden_coeff));
    });
  }

  TEST_CASE("clip: no scaling when the norm is at most max_norm") {
    run_ranks(2, [](comm_t& tp) {
      for (double max_norm : {golden_norm + 1e-6, 14.0, 1e30}) {
        auto g = golden_grads<double>(tp.rank());
        auto const before = g;
        double const norm = weft::optim::clip_grad_norm(tp, golden_params, std::span<double>(g),
                                                        tp.rank(), max_norm);
        CHECK(close_rel(norm, golden_norm, 1e-15));
        CHECK(g == before);
      }
    });
  }

  TEST_CASE("clip: a tied secondary copy is never counted, but is scaled") {
    run_ranks(2, [](comm_t& tp) {
      std::vector<param_info> params = golden_params;
      params.push_back({.count = 3, .tp_sharded = true, .tied_secondary = true});
      auto g = golden_grads<double>(tp.rank());
      for (double x : {100.0, -7.0, 5.0}) g.push_back(x);
      double const norm =
          weft::optim::clip_grad_norm(tp, params, std::span<double>(g), tp.rank(), 10.0);
      CHECK(close_rel(norm, golden_norm, 1e-15));
      CHECK(g[4] == 100.0 * weft::optim::clip_coefficient(norm, 10.0));
    });
  }

  TEST_CASE("clip: ZeRO-1's DP x TP group (disjoint shards on 4 ranks) gives the same norm") {
    // Rank r: tp = r % 2, dp = r / 2; each dp rank owns one element of each parameter.
    run_ranks(4, [](comm_t& group) {
      int const tp = group.rank() % 2, dp = group.rank() / 2;
      auto const full = golden_grads<double>(tp);
      std::vector<double> const g{full[static_cast<std::size_t>(dp)],
                                  full[2 + static_cast<std::size_t>(dp)]};
      std::vector<param_info> const shards{{.count = 1, .tp_sharded = true}, {.count = 1}};
      double const norm =
          weft::optim::global_grad_norm(group, shards, std::span<double const>(g), tp);
      CHECK(close_rel(norm, golden_norm, 1e-15));
      double const inf = weft::optim::global_grad_norm(group, shards, std::span<double const>(g),
                                                       tp, grad_norm_kind::inf);
      CHECK(inf == 12.0);
    });
  }

  TEST_CASE("clip: the infinity norm is the MAX over counted elements") {
    run_ranks(2, [](comm_t& tp) {
      std::vector<param_info> params = golden_params;
      params.push_back({.count = 1, .tied_secondary = true});  // not counted
      auto g = golden_grads<double>(tp.rank());
      g.push_back(-1000.0);
      if (tp.rank() == 1) g[2] = -50.0;  // replicated element off tp rank 0: not counted
      if (tp.rank() == 0) g[1] = -13.0;
      auto const before = g;
      double const inf = weft::optim::global_grad_norm(tp, params, std::span<double const>(g),
                                                       tp.rank(), grad_norm_kind::inf);
      CHECK(inf == 13.0);
      double const n = weft::optim::clip_grad_norm(tp, params, std::span<double>(g), tp.rank(), 6.5,
                                                   grad_norm_kind::inf);
      CHECK(n == 13.0);
      double const coeff = 6.5 / (13.0 + 1e-6);
      for (std::size_t i = 0; i < g.size(); ++i) CHECK(g[i] == before[i] * coeff);
    });
  }

  TEST_CASE("clip: a NaN gradient gives a NaN norm on every rank; clipping then gives NaN") {
    run_ranks(2, [](comm_t& tp) {
      for (auto kind : {grad_norm_kind::l2, grad_norm_kind::inf}) {
        auto g = golden_grads<double>(tp.rank());
        if (tp.rank() == 1) g[1] = std::nan("");  // a counted (sharded) element
        double const norm = weft::optim::clip_grad_norm(tp, golden_params, std::span<double>(g),
                                                        tp.rank(), 10.0, kind);
        CHECK(std::isnan(norm));
        for (double x : g) CHECK(std::isnan(x));
        // A NaN in an element this rank does not count (replicated, tp rank 1) is not seen.
        auto h = golden_grads<double>(tp.rank());
        if (tp.rank() == 1) h[3] = std::nan("");
        double const n2 = weft::optim::global_grad_norm(
            tp, golden_params, std::span<double const>(h), tp.rank(), kind);
        CHECK(n2 == (kind == grad_norm_kind::l2 ? golden_norm : 12.0));
      }
    });
  }

  TEST_CASE("clip: bad arguments throw on every rank before the collective, naming them") {
    run_ranks(2, [](comm_t& tp) {
      std::vector<double> g(3);
      auto const msg = message_of([&] {
        (void)weft::optim::global_grad_norm(tp, golden_params, std::span<double const>(g),
                                            tp.rank());
      });
      CHECK(has(msg, "argument `grads`"));
      CHECK(has(msg, "4 elements"));
      CHECK(has(msg, "3 elements"));
      std::vector<double> g4(4);
      CHECK_THROWS_AS(
          weft::optim::clip_grad_norm(tp, golden_params, std::span<double>(g4), tp.rank(), -1.0),
          weft::invalid_argument_error);
      CHECK(has(message_of([&] {
                  (void)weft::optim::global_grad_norm(tp, golden_params,
                                                      std::span<double const>(g4), -1);
                }),
                "tp_rank"));
      // The group still works afterwards.
      auto const gg = golden_grads<double>(tp.rank());
      CHECK(close_rel(
          weft::optim::global_grad_norm(tp, golden_params, std::span<double const>(gg), tp.rank()),
          golden_norm, 1e-15));
    });
  }
}

TEST_SUITE("threads") {
  TEST_CASE("clip: several buffers (grad_group) count as their concatenation, bit for bit") {
    // The golden layout cut into two groups (the sharded parameter, then the replicated one), as
    // a pipeline rank with two model chunks holds two stores: the same norm to the bit, one
    // collective, and the same scaling of both.
    run_ranks(2, [](comm_t& tp) {
      auto const whole = golden_grads<double>(tp.rank());
      double const want = weft::optim::global_grad_norm(tp, golden_params,
                                                        std::span<double const>(whole), tp.rank());
      std::vector<double> a(whole.begin(), whole.begin() + 2), b(whole.begin() + 2, whole.end());
      std::vector<weft::optim::grad_group<double>> groups{
          {std::span<param_info const>(golden_params).first(1), a},
          {std::span<param_info const>(golden_params).last(1), b}};
      double const got = weft::optim::global_grad_norm(tp, groups, tp.rank());
      CHECK(got == want);
      CHECK(close_rel(got, golden_norm, 1e-15));
      CHECK(weft::optim::global_grad_norm(tp, groups, tp.rank(), grad_norm_kind::inf) == 12.0);
      double const norm = weft::optim::clip_grad_norm(tp, groups, tp.rank(), 10.0);
      CHECK(norm == want);
      double const coeff = weft::optim::clip_coefficient(norm, 10.0);
      CHECK(a[0] == whole[0] * coeff);
      CHECK(a[1] == whole[1] * coeff);
      CHECK(b[0] == whole[2] * coeff);
      CHECK(b[1] == whole[3] * coeff);
      // A buffer that does not match its descriptions is refused before the collective, on
      // every rank alike (each rank checks its own groups before any all-reduce).
      std::vector<double> short_b(1, 0.0);
      std::vector<weft::optim::grad_group<double>> bad{
          {std::span<param_info const>(golden_params).first(1), a},
          {std::span<param_info const>(golden_params).last(1), short_b}};
      CHECK_THROWS_AS((void)weft::optim::global_grad_norm(tp, bad, tp.rank()), weft::shape_error);
      CHECK_THROWS_WITH_AS(weft::optim::clip_grad_norm(tp, groups, tp.rank(), -1.0),
                           doctest::Contains("max_norm"), weft::invalid_argument_error);
    });
  }
}
