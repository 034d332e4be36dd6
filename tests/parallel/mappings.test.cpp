// Tests of weft/parallel/mappings.hpp on threads-backend ranks at tp 1, 2 and 4: each map's
// forward and backward against the gathered single-device result, the conjugate pairs as adjoints
// (<fwd x, y> summed over ranks equals <x, bwd y>), no communication at group size 1, and
// divisibility errors that name the argument, the expected and the actual extent.
#include "support/checks.hpp"
#include <support/counting_communicator.hpp>
#include <support/run_ranks.hpp>
#include <weft/comm/threads/communicator.hpp>
#include <weft/core/tensor.hpp>
#include <weft/parallel/mappings.hpp>

#include <doctest/doctest.h>

#include <cmath>
#include <cstddef>
#include <string>
#include <vector>

namespace {
using weft::index_t;
using weft::make_tensor;
using weft::test::has;
using weft::test::message_of;
using weft::test::run_ranks;
using comm_t = weft::comm::threads::communicator;
namespace par = weft::parallel;

// A rank's value at (i, j) of its own [rows, cols] input: distinct across ranks and positions.
double value(int rank, index_t i, index_t j) {
  return std::sin(1.0 + 0.37 * rank + 0.11 * static_cast<double>(i) +
                  0.053 * static_cast<double>(j));
}

weft::tensor<double, 2> mapping_filled(int rank, index_t rows, index_t cols) {
  auto t = make_tensor<double>(rows, cols);
  for (index_t i = 0; i < rows; ++i)
    for (index_t j = 0; j < cols; ++j) t.view()(i, j) = value(rank, i, j);
  return t;
}

double dot(weft::tensor<double, 2> const& a, weft::tensor<double, 2> const& b) {
  double s = 0;
  for (std::size_t k = 0; k < a.size(); ++k) s += a.data()[k] * b.data()[k];
  return s;
}

index_t const n_tokens = 8, hidden = 12;  // both divisible by 1, 2 and 4
}  // namespace

TEST_SUITE("threads") {
  TEST_CASE("mappings: f and g all-reduce SUM exactly where Megatron's do") {
    for (int p : {1, 2, 4}) {
      std::vector<int> ok(static_cast<std::size_t>(p), 0);
      run_ranks(p, [&](comm_t& c) {
        int const r = c.rank();
        auto x = mapping_filled(r, n_tokens, hidden);
        auto y = mapping_filled(r, n_tokens, hidden);
        par::copy_to_tp_forward(c, x);  // identity
        bool good = x.view()(1, 2) == value(r, 1, 2);
        par::copy_to_tp_backward(c, x);  // SUM over ranks
        par::reduce_from_tp_forward(c, y.view());
        par::reduce_from_tp_backward(c, y);  // identity
        for (index_t i = 0; i < n_tokens; ++i)
          for (index_t j = 0; j < hidden; ++j) {
            double want = 0;
            for (int s = 0; s < p; ++s) want += value(s, i, j);  // rank order, as the reference
            good = good && x.view()(i, j) == want && y.view()(i, j) == want;
          }
        ok[static_cast<std::size_t>(r)] = good;
      });
      for (int g : ok) CHECK(g == 1);
    }
  }

  TEST_CASE("mappings: last-dim scatter and gather, and their adjoint identity") {
    for (int p : {1, 2, 4}) {
      std::vector<int> ok(static_cast<std::size_t>(p), 0);
      std::vector<double> lhs(static_cast<std::size_t>(p)), rhs(static_cast<std::size_t>(p));
      run_ranks(p, [&](comm_t& c) {
        int const r = c.rank();
        index_t const w = hidden / p;
        auto part = mapping_filled(r, n_tokens, w);
        auto full = make_tensor<double>(n_tokens, hidden);
        par::gather_from_tp_forward(c, part, full);
        bool good = true;
        for (index_t i = 0; i < n_tokens; ++i)
          for (index_t j = 0; j < hidden; ++j)
            good = good && full.view()(i, j) == value(static_cast<int>(j / w), i, j % w);
        // scatter keeps this rank's columns of a replicated tensor (rank 0's values everywhere).
        auto replicated = mapping_filled(0, n_tokens, hidden);
        auto mine = make_tensor<double>(n_tokens, w);
        par::scatter_to_tp_forward(c, replicated.view(), mine.view());
        for (index_t i = 0; i < n_tokens; ++i)
          for (index_t j = 0; j < w; ++j)
            good = good && mine.view()(i, j) == value(0, i, r * w + j);
        // <gather(x), y> = <x, gather_backward(y)> with y replicated, as a gathered output is.
        auto dx = make_tensor<double>(n_tokens, w);
        par::gather_from_tp_backward(c, replicated, dx);
        lhs[static_cast<std::size_t>(r)] = dot(full, replicated);
        rhs[static_cast<std::size_t>(r)] = dot(part, dx);
        auto back = make_tensor<double>(n_tokens, hidden);
        par::scatter_to_tp_backward(c, part, back);
        good = good && dot(back, back) == dot(full, full);
        ok[static_cast<std::size_t>(r)] = good;
      });
      for (int g : ok) CHECK(g == 1);
      double sum_rhs = 0;
      for (double v : rhs) sum_rhs += v;
      for (double v : lhs) CHECK(v == doctest::Approx(sum_rhs).epsilon(1e-13));
    }
  }

  TEST_CASE("mappings: sequence-parallel maps along dim 0, and their adjoint identity") {
    for (int p : {1, 2, 4}) {
      std::vector<int> ok(static_cast<std::size_t>(p), 0);
      std::vector<double> fwd(static_cast<std::size_t>(p)), bwd(static_cast<std::size_t>(p));
      run_ranks(p, [&](comm_t& c) {
        int const r = c.rank();
        index_t const rows = n_tokens / p;
        auto x_local = mapping_filled(r, rows, hidden);
        auto x_full = make_tensor<double>(n_tokens, hidden);
        par::gather_from_sp_forward(c, x_local, x_full);
        bool good = true;
        for (index_t i = 0; i < n_tokens; ++i)
          for (index_t j = 0; j < hidden; ++j)
            good = good && x_full.view()(i, j) == value(static_cast<int>(i / rows), i % rows, j);
        // gather_from_sp's backward sums the ranks' full-sequence partials, keeping own rows.
        auto partial = mapping_filled(r + 10, n_tokens, hidden);
        auto d_local = make_tensor<double>(rows, hidden);
        par::gather_from_sp_backward(c, partial, d_local);
        for (index_t i = 0; i < rows; ++i)
          for (index_t j = 0; j < hidden; ++j) {
            double want = 0;
            for (int s = 0; s < p; ++s) want += value(s + 10, r * rows + i, j);
            good = good && d_local.view()(i, j) == want;
          }
        // reduce_scatter_to_sp is the same move forward; its backward is the all-gather.
        auto rs = make_tensor<double>(rows, hidden);
        par::reduce_scatter_to_sp_forward(c, partial, rs);
        good = good && dot(rs, rs) == dot(d_local, d_local);
        auto ag = make_tensor<double>(n_tokens, hidden);
        par::reduce_scatter_to_sp_backward(c, x_local, ag);
        good = good && dot(ag, ag) == dot(x_full, x_full);
        auto own = make_tensor<double>(rows, hidden);
        par::scatter_to_sp_forward(c, x_full, own);
        good = good && dot(own, own) == dot(x_local, x_local);
        auto again = make_tensor<double>(n_tokens, hidden);
        par::scatter_to_sp_backward(c, own, again);
        good = good && dot(again, again) == dot(x_full, x_full);
        // Adjoint: sum_r <gather(x)_r, y_r> = sum_r <x_r, gather_backward(y)_r>.
        fwd[static_cast<std::size_t>(r)] = dot(x_full, partial);
        bwd[static_cast<std::size_t>(r)] = dot(x_local, d_local);
        ok[static_cast<std::size_t>(r)] = good;
      });
      for (int g : ok) CHECK(g == 1);
      double f = 0, b = 0;
      for (int r = 0; r < p; ++r) {
        f += fwd[static_cast<std::size_t>(r)];
        b += bwd[static_cast<std::size_t>(r)];
      }
      CHECK(f == doctest::Approx(b).epsilon(1e-13));
    }
  }

  TEST_CASE("mappings: nothing is communicated at group size 1") {
    run_ranks(1, [](comm_t& inner) {
      weft::test::counting_communicator<comm_t> c(std::move(inner));
      auto x = mapping_filled(0, 4, 6);
      auto y = make_tensor<double>(4, 6);
      par::copy_to_tp_backward(c, x);
      par::reduce_from_tp_forward(c, x);
      par::gather_from_tp_forward(c, x, y);
      par::gather_from_sp_forward(c, x, y);
      par::gather_from_sp_backward(c, x, y);
      par::reduce_scatter_to_sp_forward(c, x, y);
      CHECK(c.events().empty());
      CHECK(y.view()(3, 5) == value(0, 3, 5));
    });
  }

  TEST_CASE("mappings: a split extent that does not divide by tp is a shape_error on every rank") {
    std::vector<std::string> messages(2);
    run_ranks(2, [&](comm_t& c) {
      auto x = mapping_filled(c.rank(), 3, 4);  // 3 tokens over 2 ranks
      auto full = make_tensor<double>(6, 4);
      auto local = make_tensor<double>(1, 4);
      messages[static_cast<std::size_t>(c.rank())] =
          message_of([&] { par::reduce_scatter_to_sp_forward(c, x, local); });
      CHECK_THROWS_AS(par::gather_from_sp_forward(c, local, full), weft::shape_error);
      auto cols = mapping_filled(c.rank(), 2, 5);  // 5 hidden over 2 ranks
      auto half = make_tensor<double>(2, 2);
      CHECK_THROWS_AS(par::scatter_to_tp_forward(c, cols, half), weft::shape_error);
      CHECK(c.state() == weft::comm::comm_state::healthy);
    });
    for (auto const& m : messages) {
      CHECK(has(m, "x"));
      CHECK(has(m, "a multiple of the tensor-parallel size 2"));
      CHECK(has(m, "extent(0) 3"));
    }
  }
}
