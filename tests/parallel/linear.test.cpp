// Tests of weft/parallel/linear.hpp on threads-backend ranks at tp 1, 2 and 4: column- and
// row-parallel layers and a column -> tanh -> row MLP, with and without sequence parallelism,
// against a dense single-device f64 reference (forward, input and weight gradients, 1e-12; f32
// within 1e-5 relative), the MLP's communication (one SUM all-reduce forward and one backward
// without SP), the SP norm-weight gradient sum (and that skipping it leaves the ranks apart),
// shape errors raised before anything is communicated, and shard initialisation (even and
// partition_stride pieces) equal to the whole fill bit for bit.
#include "support/checks.hpp"
#include <support/counting_communicator.hpp>
#include <support/run_ranks.hpp>
#include <weft/comm/threads/communicator.hpp>
#include <weft/core/tensor.hpp>
#include <weft/parallel/linear.hpp>
#include <weft/parallel/sharding.hpp>

#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <string>
#include <vector>

namespace {
using weft::index_t;
using weft::tensor_view;
using weft::comm::op_kind;
using weft::test::has;
using weft::test::message_of;
using weft::test::run_ranks;
using comm_t = weft::comm::threads::communicator;
namespace par = weft::parallel;

// A dense row-major matrix in f64 (the reference), or in T (what a rank holds).
template <class T>
struct mat {
  index_t rows = 0, cols = 0;
  std::vector<T> v;
  mat() = default;
  mat(index_t r, index_t c, T fill = T(0))
      : rows(r), cols(c), v(static_cast<std::size_t>(r * c), fill) {}
  T& operator()(index_t i, index_t j) { return v[static_cast<std::size_t>(i * cols + j)]; }
  T operator()(index_t i, index_t j) const { return v[static_cast<std::size_t>(i * cols + j)]; }
  tensor_view<T, 2> view() { return tensor_view<T, 2>(v.data(), rows, cols); }
  tensor_view<T const, 2> cview() const { return tensor_view<T const, 2>(v.data(), rows, cols); }
  // Rows [r0, r0 + nr) and columns [c0, c0 + nc), converted to U.
  template <class U = T>
  mat<U> block(index_t r0, index_t nr, index_t c0, index_t nc) const {
    mat<U> b(nr, nc);
    for (index_t i = 0; i < nr; ++i)
      for (index_t j = 0; j < nc; ++j) b(i, j) = static_cast<U>((*this)(r0 + i, c0 + j));
    return b;
  }
};

template <class T>
tensor_view<T, 1> vec(std::vector<T>& x) {
  return tensor_view<T, 1>(x.data(), static_cast<index_t>(x.size()));
}
template <class T>
tensor_view<T const, 1> cvec(std::vector<T> const& x) {
  return tensor_view<T const, 1>(x.data(), static_cast<index_t>(x.size()));
}

// Values of f32 precision, so that the f32 runs and the f64 reference see the same inputs.
mat<double> linear_filled(index_t r, index_t c, double seed) {
  mat<double> m(r, c);
  for (index_t i = 0; i < r; ++i)
    for (index_t j = 0; j < c; ++j)
      m(i, j) = static_cast<float>(
          0.5 * std::sin(seed + 0.7 * static_cast<double>(i) + 1.3 * static_cast<double>(j)));
  return m;
}
std::vector<double> filled_vec(index_t n, double seed) { return linear_filled(1, n, seed).v; }

// y = x wᵀ + b, dx = dy w, dw = dyᵀ x, db = Σ dy: the dense layer, in f64, by loops.
mat<double> affine(mat<double> const& x, mat<double> const& w, std::vector<double> const& b) {
  mat<double> y(x.rows, w.rows);
  for (index_t i = 0; i < x.rows; ++i)
    for (index_t o = 0; o < w.rows; ++o) {
      double s = b.empty() ? 0.0 : b[static_cast<std::size_t>(o)];
      for (index_t k = 0; k < x.cols; ++k) s += x(i, k) * w(o, k);
      y(i, o) = s;
    }
  return y;
}
mat<double> times(mat<double> const& dy, mat<double> const& w) {
  mat<double> dx(dy.rows, w.cols);
  for (index_t i = 0; i < dy.rows; ++i)
    for (index_t k = 0; k < w.cols; ++k) {
      double s = 0;
      for (index_t o = 0; o < w.rows; ++o) s += dy(i, o) * w(o, k);
      dx(i, k) = s;
    }
  return dx;
}
mat<double> outer(mat<double> const& dy, mat<double> const& x) {
  mat<double> dw(dy.cols, x.cols);
  for (index_t o = 0; o < dy.cols; ++o)
    for (index_t k = 0; k < x.cols; ++k) {
      double s = 0;
      for (index_t i = 0; i < dy.rows; ++i) s += dy(i, o) * x(i, k);
      dw(o, k) = s;
    }
  return dw;
}
std::vector<double> col_sums(mat<double> const& dy) {
  std::vector<double> s(static_cast<std::size_t>(dy.cols), 0.0);
  for (index_t i = 0; i < dy.rows; ++i)
    for (index_t o = 0; o < dy.cols; ++o) s[static_cast<std::size_t>(o)] += dy(i, o);
  return s;
}

// Largest |got - want| relative to max(max|want|, 1e-300), over every element.
template <class T>
double linear_rel_err(std::vector<T> const& got, std::vector<double> const& want) {
  if (got.size() != want.size()) return 1e300;
  double worst = 0, scale = 1e-300;
  for (double w : want) scale = std::max(scale, std::abs(w));
  for (std::size_t k = 0; k < got.size(); ++k)
    worst = std::max(worst, std::abs(static_cast<double>(got[k]) - want[k]));
  return worst / scale;
}
template <class T>
double linear_rel_err(mat<T> const& got, mat<double> const& want) {
  return got.rows == want.rows && got.cols == want.cols ? linear_rel_err(got.v, want.v) : 1e300;
}
std::vector<double> slice(std::vector<double> const& v, index_t begin, index_t n) {
  return {v.begin() + begin, v.begin() + begin + n};
}

index_t const N = 8, D = 6, F = 8;  // tokens, model width, MLP width (N and F divide by 4)

// The single-device MLP y = tanh(x w1ᵀ + b1) w2ᵀ + b2 and its gradients for the output
// gradient dy.
struct dense_mlp {
  mat<double> x = linear_filled(N, D, 0.1), w1 = linear_filled(F, D, 0.2),
              w2 = linear_filled(D, F, 0.3), dy = linear_filled(N, D, 0.4);
  std::vector<double> b1 = filled_vec(F, 0.5), b2 = filled_vec(D, 0.6);
  mat<double> a, y, dx, dw1, dw2;
  std::vector<double> db1, db2;
  dense_mlp() {
    a = affine(x, w1, b1);
    for (auto& e : a.v) e = std::tanh(e);
    y = affine(a, w2, b2);
    mat<double> dh = times(dy, w2);
    for (std::size_t k = 0; k < dh.v.size(); ++k) dh.v[k] *= 1 - a.v[k] * a.v[k];
    dx = times(dh, w1);
    dw2 = outer(dy, a);
    db2 = col_sums(dy);
    dw1 = outer(dh, x);
    db1 = col_sums(dh);
  }
};

// What one rank computed, in its own layout.
template <class T>
struct mlp_rank {
  mat<T> y, dx, dw1, dw2;
  std::vector<T> db1, db2;
  std::vector<weft::test::comm_event> forward_events, backward_events;
};

// The MLP on one rank: column(D -> F) -> tanh -> row(F -> D), gradients accumulated onto ones
// (so the test also sees that backward_weight adds).
template <class T>
mlp_rank<T> run_mlp(weft::test::counting_communicator<comm_t>& tp, dense_mlp const& d, bool sp) {
  int const p = tp.size(), r = tp.rank();
  index_t const f = F / p, n = sp ? N / p : N;
  auto const x = d.x.block<T>(sp ? r * n : 0, n, 0, D);
  auto const w1 = d.w1.block<T>(r * f, f, 0, D);
  auto const w2 = d.w2.block<T>(0, D, r * f, f);
  std::vector<T> b1(f), b2(d.b2.begin(), d.b2.end());
  for (index_t k = 0; k < f; ++k)
    b1[static_cast<std::size_t>(k)] = static_cast<T>(d.b1[static_cast<std::size_t>(r * f + k)]);
  auto const dy = d.dy.block<T>(sp ? r * n : 0, n, 0, D);

  mlp_rank<T> out;
  mat<T> x_total(N, D), a(N, f), dy_total(N, D), da(N, f);
  out.y = mat<T>(n, D);
  out.dx = mat<T>(n, D);
  out.dw1 = mat<T>(f, D, T(1));
  out.dw2 = mat<T>(D, f, T(1));
  out.db1.assign(static_cast<std::size_t>(f), T(1));
  out.db2.assign(static_cast<std::size_t>(D), T(1));
  tp.clear();
  if (sp) {
    par::column_parallel_forward_sp(tp, x.cview(), w1.cview(), cvec(b1), x_total.view(), a.view());
  } else {
    par::column_parallel_forward(tp, x.cview(), w1.cview(), cvec(b1), a.view());
  }
  for (auto& e : a.v) e = std::tanh(e);
  if (sp) {
    par::row_parallel_forward_sp(tp, a.cview(), w2.cview(), cvec(b2), out.y.view());
  } else {
    par::row_parallel_forward(tp, a.cview(), w2.cview(), cvec(b2), out.y.view());
  }
  out.forward_events = tp.events();
  tp.clear();
  if (sp) {
    par::row_parallel_backward_input_sp(tp, dy.cview(), w2.cview(), dy_total.view(), da.view());
    par::row_parallel_backward_weight(dy_total.cview(), a.cview(), out.dw2.view(), vec(out.db2));
  } else {
    par::row_parallel_backward_input(tp, dy.cview(), w2.cview(), da.view());
    par::row_parallel_backward_weight(dy.cview(), a.cview(), out.dw2.view(), vec(out.db2));
  }
  for (std::size_t k = 0; k < da.v.size(); ++k) da.v[k] *= T(1) - a.v[k] * a.v[k];
  if (sp) {
    par::column_parallel_backward_input_sp(tp, da.cview(), w1.cview(), out.dx.view());
    par::column_parallel_backward_weight(da.cview(), x_total.cview(), out.dw1.view(), vec(out.db1));
  } else {
    par::column_parallel_backward_input(tp, da.cview(), w1.cview(), out.dx.view());
    par::column_parallel_backward_weight(da.cview(), x.cview(), out.dw1.view(), vec(out.db1));
  }
  out.backward_events = tp.events();
  return out;
}

// The worst relative error of every rank's results against the dense MLP's slices.
template <class T>
double mlp_error(std::vector<mlp_rank<T>> const& ranks, dense_mlp const& d, bool sp) {
  int const p = static_cast<int>(ranks.size());
  index_t const f = F / p, n = sp ? N / p : N;
  auto ones = [](mat<double> m) {
    for (auto& e : m.v) e += 1;
    return m;
  };
  auto ones_v = [](std::vector<double> v) {
    for (auto& e : v) e += 1;
    return v;
  };
  double worst = 0;
  for (int r = 0; r < p; ++r) {
    auto const& k = ranks[static_cast<std::size_t>(r)];
    index_t const t0 = sp ? r * n : 0;
    worst = std::max(worst, linear_rel_err(k.y, d.y.block(t0, n, 0, D)));
    worst = std::max(worst, linear_rel_err(k.dx, d.dx.block(t0, n, 0, D)));
    worst = std::max(worst, linear_rel_err(k.dw1, ones(d.dw1.block(r * f, f, 0, D))));
    worst = std::max(worst, linear_rel_err(k.dw2, ones(d.dw2.block(0, D, r * f, f))));
    worst = std::max(worst, linear_rel_err(k.db1, ones_v(slice(d.db1, r * f, f))));
    worst = std::max(worst, linear_rel_err(k.db2, ones_v(d.db2)));
  }
  return worst;
}

std::size_t count(std::vector<weft::test::comm_event> const& ev, op_kind op) {
  return static_cast<std::size_t>(
      std::count_if(ev.begin(), ev.end(), [&](auto const& e) { return e.op == op; }));
}

template <class T>
std::vector<mlp_rank<T>> mlp_on(int p, dense_mlp const& d, bool sp) {
  std::vector<mlp_rank<T>> ranks(static_cast<std::size_t>(p));
  run_ranks(p, [&](comm_t& c) {
    weft::test::counting_communicator<comm_t> tp(std::move(c));
    ranks[static_cast<std::size_t>(tp.rank())] = run_mlp<T>(tp, d, sp);
  });
  return ranks;
}

}  // namespace

TEST_SUITE("threads") {
  TEST_CASE("linear: a column-parallel layer equals the dense one (f64, with and without SP)") {
    mat<double> const x = linear_filled(N, D, 1.0), w = linear_filled(F, D, 2.0),
                      dy = linear_filled(N, F, 3.0);
    std::vector<double> const b = filled_vec(F, 4.0);
    auto const y = affine(x, w, b), dx = times(dy, w), dw = outer(dy, x);
    auto const db = col_sums(dy);
    for (int p : {1, 2, 4})
      for (bool sp : {false, true}) {
        CAPTURE(p);
        CAPTURE(sp);
        std::vector<double> err(static_cast<std::size_t>(p), 1.0);
        run_ranks(p, [&](comm_t& tp) {
          int const r = tp.rank();
          index_t const f = F / p, n = sp ? N / p : N;
          auto const xr = x.block(sp ? r * n : 0, n, 0, D), wr = w.block(r * f, f, 0, D);
          auto const dyr = dy.block(0, N, r * f, f);
          auto br = slice(b, r * f, f);
          mat<double> yr(N, f), dxr(n, D), xt(N, D), dwr(f, D);
          std::vector<double> dbr(static_cast<std::size_t>(f), 0.0);
          if (sp) {
            par::column_parallel_forward_sp(tp, xr.cview(), wr.cview(), cvec(br), xt.view(),
                                            yr.view());
            par::column_parallel_backward_input_sp(tp, dyr.cview(), wr.cview(), dxr.view());
          } else {
            par::column_parallel_forward(tp, xr.cview(), wr.cview(), cvec(br), yr.view());
            par::column_parallel_backward_input(tp, dyr.cview(), wr.cview(), dxr.view());
          }
          par::column_parallel_backward_weight(dyr.cview(), sp ? xt.cview() : xr.cview(),
                                               dwr.view(), vec(dbr));
          double e = linear_rel_err(yr, y.block(0, N, r * f, f));
          e = std::max(e, linear_rel_err(dxr, dx.block(sp ? r * n : 0, n, 0, D)));
          e = std::max(e, linear_rel_err(dwr, dw.block(r * f, f, 0, D)));
          e = std::max(e, linear_rel_err(dbr, slice(db, r * f, f)));
          if (sp) e = std::max(e, linear_rel_err(xt, x));
          err[static_cast<std::size_t>(r)] = e;
        });
        for (double e : err) CHECK(e <= 1e-12);
      }
  }

  TEST_CASE("linear: a row-parallel layer equals the dense one, bias added once after the sum") {
    mat<double> const x = linear_filled(N, F, 5.0), w = linear_filled(D, F, 6.0),
                      dy = linear_filled(N, D, 7.0);
    std::vector<double> const b = filled_vec(D, 8.0);
    auto const y = affine(x, w, b), dx = times(dy, w), dw = outer(dy, x);
    auto const db = col_sums(dy);
    for (int p : {1, 2, 4})
      for (bool sp : {false, true}) {
        CAPTURE(p);
        CAPTURE(sp);
        std::vector<double> err(static_cast<std::size_t>(p), 1.0);
        run_ranks(p, [&](comm_t& tp) {
          int const r = tp.rank();
          index_t const f = F / p, n = sp ? N / p : N;
          auto const xr = x.block(0, N, r * f, f), wr = w.block(0, D, r * f, f);
          auto const dyr = dy.block(sp ? r * n : 0, n, 0, D);
          mat<double> yr(n, D), dxr(N, f), gt(N, D), dwr(D, f);
          std::vector<double> dbr(static_cast<std::size_t>(D), 0.0);
          if (sp) {
            par::row_parallel_forward_sp(tp, xr.cview(), wr.cview(), cvec(b), yr.view());
            par::row_parallel_backward_input_sp(tp, dyr.cview(), wr.cview(), gt.view(), dxr.view());
          } else {
            par::row_parallel_forward(tp, xr.cview(), wr.cview(), cvec(b), yr.view());
            par::row_parallel_backward_input(tp, dyr.cview(), wr.cview(), dxr.view());
          }
          par::row_parallel_backward_weight(sp ? gt.cview() : dyr.cview(), xr.cview(), dwr.view(),
                                            vec(dbr));
          double e = linear_rel_err(yr, y.block(sp ? r * n : 0, n, 0, D));
          e = std::max(e, linear_rel_err(dxr, dx.block(0, N, r * f, f)));
          e = std::max(e, linear_rel_err(dwr, dw.block(0, D, r * f, f)));
          e = std::max(
              e, linear_rel_err(dbr, db));  // the whole bias gradient on every rank, SP or not
          err[static_cast<std::size_t>(r)] = e;
        });
        for (double e : err) CHECK(e <= 1e-12);
      }
  }

  TEST_CASE("linear: an MLP equals the dense one; one SUM all-reduce forward and one backward") {
    dense_mlp const d;
    for (int p : {1, 2, 4}) {
      CAPTURE(p);
      auto const ranks = mlp_on<double>(p, d, false);
      CHECK(mlp_error(ranks, d, false) <= 1e-12);
      for (auto const& k : ranks) {
        std::size_t const want = p == 1 ? 0 : 1;
        CHECK(k.forward_events.size() == want);
        CHECK(count(k.forward_events, op_kind::all_reduce) == want);
        CHECK(k.backward_events.size() == want);
        CHECK(count(k.backward_events, op_kind::all_reduce) == want);
      }
    }
  }

  TEST_CASE("linear: an MLP under sequence parallelism equals the dense one") {
    dense_mlp const d;
    for (int p : {1, 2, 4}) {
      CAPTURE(p);
      auto const ranks = mlp_on<double>(p, d, true);
      CHECK(mlp_error(ranks, d, true) <= 1e-12);
      for (auto const& k : ranks) {
        std::size_t const want = p == 1 ? 0 : 1;
        // An all-gather before the column GEMM and a reduce-scatter after the row GEMM; the
        // backward mirrors them. No all-reduce at all.
        CHECK(count(k.forward_events, op_kind::all_gather) == want);
        CHECK(count(k.forward_events, op_kind::reduce_scatter) == want);
        CHECK(count(k.backward_events, op_kind::all_gather) == want);
        CHECK(count(k.backward_events, op_kind::reduce_scatter) == want);
        CHECK(count(k.forward_events, op_kind::all_reduce) +
                  count(k.backward_events, op_kind::all_reduce) ==
              0);
      }
    }
  }

  TEST_CASE("linear: the f32 MLP is within 1e-5 of the f64 dense one, with and without SP") {
    dense_mlp const d;
    for (int p : {1, 2, 4})
      for (bool sp : {false, true}) {
        CAPTURE(p);
        CAPTURE(sp);
        CHECK(mlp_error(mlp_on<float>(p, d, sp), d, sp) <= 1e-5);
      }
  }

  TEST_CASE("linear: SP norm-weight gradients are partial per rank until summed over tp") {
    // A norm-like scale g [D] (replicated, flagged sequence_parallel_grad) applied to each rank's
    // token slice, y = x ⊙ g, followed by a tp-sharded parameter. dg = Σ_tokens dy ⊙ x.
    mat<double> const x = linear_filled(N, D, 9.0), dy = linear_filled(N, D, 10.0);
    std::vector<double> dense(static_cast<std::size_t>(D), 0.0);
    for (index_t i = 0; i < N; ++i)
      for (index_t j = 0; j < D; ++j) dense[static_cast<std::size_t>(j)] += dy(i, j) * x(i, j);
    std::vector<weft::optim::param_info> const params{
        {.count = static_cast<std::size_t>(D), .sequence_parallel_grad = true},
        {.count = 3, .tp_sharded = true}};
    for (bool summed : {false, true})
      for (int p : {2, 4}) {
        CAPTURE(p);
        CAPTURE(summed);
        std::vector<std::vector<double>> grads(static_cast<std::size_t>(p));
        run_ranks(p, [&](comm_t& tp) {
          int const r = tp.rank();
          index_t const n = N / p;
          std::vector<double> g(static_cast<std::size_t>(D) + 3, 0.0);
          for (index_t i = r * n; i < (r + 1) * n; ++i)
            for (index_t j = 0; j < D; ++j) g[static_cast<std::size_t>(j)] += dy(i, j) * x(i, j);
          for (std::size_t k = 0; k < 3; ++k)
            g[static_cast<std::size_t>(D) + k] = 100.0 * r + static_cast<double>(k);
          if (summed) par::sum_sequence_parallel_grads(tp, params, g);
          grads[static_cast<std::size_t>(r)] = g;
        });
        bool ranks_agree = true;
        for (auto const& g : grads)
          ranks_agree = ranks_agree && std::equal(g.begin(), g.begin() + D, grads[0].begin());
        CHECK(ranks_agree == summed);  // skipping the sum leaves different gradients per rank
        for (int r = 0; r < p; ++r) {
          auto const& g = grads[static_cast<std::size_t>(r)];
          if (summed) CHECK(linear_rel_err(slice(g, 0, D), dense) <= 1e-12);
          for (std::size_t k = 0; k < 3; ++k)  // the sharded parameter is never touched
            CHECK(g[static_cast<std::size_t>(D) + k] == 100.0 * r + static_cast<double>(k));
        }
      }
  }

  TEST_CASE("linear: bad shapes throw shape_error naming the argument before communicating") {
    std::vector<std::string> bias_msg(2), total_msg(2);
    run_ranks(2, [&](comm_t& tp) {
      mat<double> x(4, 3), w(5, 3), y(4, 5), xt(8, 3), xl(4, 3);
      std::vector<double> b(4);  // row bias must be [5]
      bias_msg[static_cast<std::size_t>(tp.rank())] = message_of(
          [&] { par::row_parallel_forward(tp, x.cview(), w.cview(), cvec(b), y.view()); });
      mat<double> xt_bad(6, 3), ycol(8, 5);
      total_msg[static_cast<std::size_t>(tp.rank())] = message_of([&] {
        par::column_parallel_forward_sp(tp, xl.cview(), w.cview(), weft::nn::no_bias<double>(),
                                        xt_bad.view(), ycol.view());
      });
      std::vector<weft::optim::param_info> const params{
          {.count = 3, .sequence_parallel_grad = true}};
      std::vector<double> g(4);
      CHECK_THROWS_AS(par::sum_sequence_parallel_grads(tp, params, g), weft::shape_error);
      CHECK(tp.state() == weft::comm::comm_state::healthy);
    });
    for (auto const& m : bias_msg) {
      CHECK(has(m, "bias"));
      CHECK(has(m, "[5] or [0]"));
      CHECK(has(m, "[4]"));
    }
    for (auto const& m : total_msg) {
      CHECK(has(m, "x_local"));
      CHECK(has(m, "[3, 3]"));
    }
  }
}

TEST_CASE("sharding: Megatron's partition_stride pieces") {
  using par::shard_piece;
  CHECK(par::tp_shard(12, 4, 1) == shard_piece{0, 3, 3});
  auto const qkv = par::tp_shard_pieces(12, 2, 1, 3);  // [q; k; v], 2 rows of each per rank
  REQUIRE(qkv.size() == 3);
  CHECK(qkv[0] == shard_piece{0, 2, 2});
  CHECK(qkv[1] == shard_piece{2, 6, 2});
  CHECK(qkv[2] == shard_piece{4, 10, 2});
  CHECK_THROWS_AS((void)par::tp_shard_pieces(12, 4, 0, 2),
                  weft::shape_error);  // 8 does not divide 12
  CHECK_THROWS_AS((void)par::tp_shard_pieces(12, 2, 2), weft::invalid_argument_error);
}

TEST_CASE(
    "sharding: shards linear_filled through placement equal the whole fill's slices bit for bit") {
  index_t const out = 12, in = 5;
  weft::rng const gen(1234, /*stream*/ 7);
  for (int dim : {0, 1})  // column-parallel rows, row-parallel columns
    for (int tp : {1, 2, 4})
      for (int stride : {1, 3}) {
        CAPTURE(dim);
        CAPTURE(tp);
        CAPTURE(stride);
        index_t const rows = dim == 0 ? out : in, cols = dim == 0 ? in : out;
        mat<double> whole(rows, cols);
        weft::fill_normal(whole.view(), gen, 0.0, 0.02);
        std::vector<index_t> const global{rows, cols};
        bool same = true;
        for (int r = 0; r < tp; ++r) {
          auto const pieces = par::tp_shard_pieces(out, tp, r, stride);
          index_t const held = out / tp;
          mat<double> mine(dim == 0 ? held : rows, dim == 0 ? cols : held);
          par::fill_normal_shard(mine.view(), gen, 0.0, 0.02, global, dim, pieces);
          for (auto const& pc : pieces)
            for (index_t k = 0; k < pc.size; ++k)
              for (index_t o = 0; o < (dim == 0 ? cols : rows); ++o)
                same = same &&
                       (dim == 0 ? mine(pc.local_begin + k, o) == whole(pc.global_begin + k, o)
                                 : mine(o, pc.local_begin + k) == whole(o, pc.global_begin + k));
        }
        CHECK(same);
      }
  // A vocabulary shard's rows of an embedding (uniform this time), uneven at tp 4.
  mat<float> table(10, 3);
  weft::fill_uniform(table.view(), gen, -1.0, 1.0);
  for (int r = 0; r < 4; ++r) {
    auto const shard = weft::rl::vocab_shard::even(10, 4, r);
    mat<float> mine(shard.size, 3);
    std::vector<index_t> const global{10, 3};
    std::vector<par::shard_piece> const pieces{par::vocab_rows(shard)};
    par::fill_uniform_shard(mine.view(), gen, -1.0, 1.0, global, 0, pieces);
    CHECK(mine.v == table.block(shard.begin, shard.size, 0, 3).v);
  }
}
