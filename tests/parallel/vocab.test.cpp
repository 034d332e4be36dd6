// Tests of weft/parallel/vocab.hpp on threads-backend ranks: Megatron's padded vocabulary
// (50257 -> 50304 / 50432 / 50688 / 51200 at tp 1/2/4/8), the cross-entropy goldens at tp 1, 2
// and 3 (an uneven split), the embedding and the output layer with its loss against a dense
// single-device f64 reference at tp 1, 2 and 4 with and without sequence parallelism (1e-12; f32
// within 1e-5 relative), ignored targets, and bad ids raising on every rank.
#include "support/checks.hpp"
#include <support/run_ranks.hpp>
#include <weft/comm/threads/communicator.hpp>
#include <weft/core/tensor.hpp>
#include <weft/parallel/vocab.hpp>

#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace {
using weft::index_t;
using weft::tensor_view;
using weft::test::has;
using weft::test::message_of;
using weft::test::run_ranks;
using comm_t = weft::comm::threads::communicator;
namespace par = weft::parallel;

template <class T>
tensor_view<T, 2> mview(std::vector<T>& v, index_t r, index_t c) {
  return tensor_view<T, 2>(v.data(), r, c);
}
template <class T>
tensor_view<T const, 2> cview(std::vector<T> const& v, index_t r, index_t c) {
  return tensor_view<T const, 2>(v.data(), r, c);
}

// Columns [c0, c0 + nc) of a row-major [rows, cols] matrix, converted to T.
template <class T>
std::vector<T> columns(std::vector<double> const& m, index_t rows, index_t cols, index_t c0,
                       index_t nc) {
  std::vector<T> out(static_cast<std::size_t>(rows * nc));
  for (index_t i = 0; i < rows; ++i)
    for (index_t j = 0; j < nc; ++j)
      out[static_cast<std::size_t>(i * nc + j)] =
          static_cast<T>(m[static_cast<std::size_t>(i * cols + c0 + j)]);
  return out;
}
// Rows [r0, r0 + nr) of a row-major [*, cols] matrix, converted to T.
template <class T>
std::vector<T> rows_of(std::vector<double> const& m, index_t cols, index_t r0, index_t nr) {
  return {m.begin() + r0 * cols, m.begin() + (r0 + nr) * cols};
}

std::vector<double> vocab_filled(std::size_t n, double seed) {
  std::vector<double> v(n);
  for (std::size_t k = 0; k < n; ++k)
    v[k] = static_cast<float>(std::sin(seed + 0.91 * static_cast<double>(k)));
  return v;
}

template <class T>
double vocab_rel_err(std::vector<T> const& got, std::vector<double> const& want) {
  if (got.size() != want.size()) return 1e300;
  double worst = 0, scale = 1e-300;
  for (double w : want) scale = std::max(scale, std::abs(w));
  for (std::size_t k = 0; k < got.size(); ++k)
    worst = std::max(worst, std::abs(static_cast<double>(got[k]) - want[k]));
  return worst / scale;
}

// Megatron's test_vocab_parallel_cross_entropy golden.
std::vector<double> const golden_logits{1, 2, 3, 0.5, -0.5, 1};
std::vector<std::int64_t> const golden_targets{2, 0};
double const golden_loss[2] = {0.4076059644443806, 1.1041306053367284};
double const golden_row0_grad[3] = {0.09003057317038046, 0.24472847105479764, -0.3347590442251782};

// The dense output layer and loss: logits = h Wᵀ, loss_k = lse_k - logits[k, t_k], with the
// gradients of Σ_k dloss_k loss_k.
struct dense_head {
  index_t n, h, v;
  std::vector<double> hid, w, loss, dh, dw;
  dense_head(index_t n_, index_t h_, index_t v_, std::vector<std::int64_t> const& t,
             std::vector<double> const& dloss)
      : n(n_),
        h(h_),
        v(v_),
        hid(vocab_filled(static_cast<std::size_t>(n * h), 0.3)),
        w(vocab_filled(static_cast<std::size_t>(v * h), 1.7)) {
    loss.assign(static_cast<std::size_t>(n), 0.0);
    dh.assign(static_cast<std::size_t>(n * h), 0.0);
    dw.assign(static_cast<std::size_t>(v * h), 0.0);
    for (index_t i = 0; i < n; ++i) {
      std::vector<double> z(static_cast<std::size_t>(v));
      double m = -1e300;
      for (index_t c = 0; c < v; ++c) {
        double s = 0;
        for (index_t k = 0; k < h; ++k)
          s += hid[static_cast<std::size_t>(i * h + k)] * w[static_cast<std::size_t>(c * h + k)];
        z[static_cast<std::size_t>(c)] = s;
        m = std::max(m, s);
      }
      double se = 0;
      for (double x : z) se += std::exp(x - m);
      double const lse = m + std::log(se);
      auto const ti = static_cast<std::size_t>(t[static_cast<std::size_t>(i)]);
      loss[static_cast<std::size_t>(i)] = lse - z[ti];
      for (index_t c = 0; c < v; ++c) {
        double const g = (std::exp(z[static_cast<std::size_t>(c)] - lse) -
                          (static_cast<std::size_t>(c) == ti ? 1.0 : 0.0)) *
                         dloss[static_cast<std::size_t>(i)];
        for (index_t k = 0; k < h; ++k) {
          dh[static_cast<std::size_t>(i * h + k)] += g * w[static_cast<std::size_t>(c * h + k)];
          dw[static_cast<std::size_t>(c * h + k)] += g * hid[static_cast<std::size_t>(i * h + k)];
        }
      }
    }
  }
};

}  // namespace

TEST_CASE("vocab: Megatron's padded vocabulary size") {
  CHECK(par::vocab_size_with_padding(50257, 1) == 50304);
  CHECK(par::vocab_size_with_padding(50257, 2) == 50432);
  CHECK(par::vocab_size_with_padding(50257, 4) == 50688);
  CHECK(par::vocab_size_with_padding(50257, 8) == 51200);
  CHECK(par::vocab_size_with_padding(50304, 1) == 50304);  // already a multiple: unchanged
  CHECK(par::vocab_size_with_padding(10, 2, 1) == 10);
  CHECK_THROWS_AS((void)par::vocab_size_with_padding(50257, 0), weft::invalid_argument_error);
  // After padding, the even split is Megatron's [r V/tp, (r+1) V/tp).
  for (int r = 0; r < 8; ++r) {
    auto const s = par::vocab_shard::even(51200, 8, r);
    CHECK(s.begin == r * 6400);
    CHECK(s.size == 6400);
  }
}

TEST_SUITE("threads") {
  TEST_CASE("vocab: cross-entropy goldens at tp 1, 2 and 3 (uneven), loss and row-0 gradient") {
    for (int p : {1, 2, 3}) {
      CAPTURE(p);
      std::vector<std::vector<double>> losses(static_cast<std::size_t>(p));
      std::vector<std::vector<double>> grads(static_cast<std::size_t>(p));
      std::vector<par::vocab_shard> shards(static_cast<std::size_t>(p));
      run_ranks(p, [&](comm_t& tp) {
        auto const shard = par::vocab_shard_of(tp, 3);
        auto const local = columns<double>(golden_logits, 2, 3, shard.begin, shard.size);
        std::vector<double> loss(2), lse(2), dloss{1.0, 1.0};
        std::vector<double> dlogits(local.size());
        par::vocab_parallel_cross_entropy_forward(tp, cview(local, 2, shard.size), shard,
                                                  golden_targets, loss, lse);
        par::vocab_parallel_cross_entropy_backward(cview(local, 2, shard.size), shard,
                                                   golden_targets, lse, dloss,
                                                   mview(dlogits, 2, shard.size));
        losses[static_cast<std::size_t>(tp.rank())] = loss;
        grads[static_cast<std::size_t>(tp.rank())] = dlogits;
        shards[static_cast<std::size_t>(tp.rank())] = shard;
      });
      std::vector<double> row0(3);
      for (int r = 0; r < p; ++r) {
        auto const& l = losses[static_cast<std::size_t>(r)];
        CHECK(std::abs(l[0] - golden_loss[0]) <= 1e-12);
        CHECK(std::abs(l[1] - golden_loss[1]) <= 1e-12);
        CHECK(l == losses[0]);  // the same bits on every rank
        auto const& s = shards[static_cast<std::size_t>(r)];
        for (index_t c = 0; c < s.size; ++c)
          row0[static_cast<std::size_t>(s.begin + c)] =
              grads[static_cast<std::size_t>(r)][static_cast<std::size_t>(c)];
      }
      for (std::size_t c = 0; c < 3; ++c) CHECK(std::abs(row0[c] - golden_row0_grad[c]) <= 1e-12);
    }
  }

  TEST_CASE("vocab: an ignored target gives loss 0 and no gradient") {
    run_ranks(2, [](comm_t& tp) {
      auto const shard = par::vocab_shard_of(tp, 3);
      auto const local = columns<double>(golden_logits, 2, 3, shard.begin, shard.size);
      std::vector<std::int64_t> const targets{-100, 0};
      std::vector<double> loss(2), lse(2), dloss{1.0, 1.0}, dlogits(local.size(), 7.0);
      par::vocab_parallel_cross_entropy_forward(tp, cview(local, 2, shard.size), shard, targets,
                                                loss, lse);
      par::vocab_parallel_cross_entropy_backward(cview(local, 2, shard.size), shard, targets, lse,
                                                 dloss, mview(dlogits, 2, shard.size));
      CHECK(loss[0] == 0.0);
      CHECK_FALSE(std::signbit(loss[0]));
      CHECK(std::abs(loss[1] - golden_loss[1]) <= 1e-12);
      for (index_t c = 0; c < shard.size; ++c) CHECK(dlogits[static_cast<std::size_t>(c)] == 0.0);
    });
  }

  TEST_CASE(
      "vocab: the embedding equals the dense lookup, forward and backward, with and without SP") {
    index_t const V = 10, H = 3, N = 8;
    std::vector<std::int64_t> const ids{3, 9, 0, 3, 7, 4, 9, 5};  // repeats, both ends
    auto const table = vocab_filled(static_cast<std::size_t>(V * H), 2.5);
    auto const dout = vocab_filled(static_cast<std::size_t>(N * H), 4.5);
    std::vector<double> dense_dtable(static_cast<std::size_t>(V * H), 0.5);
    for (index_t k = 0; k < N; ++k)
      for (index_t j = 0; j < H; ++j)
        dense_dtable[static_cast<std::size_t>(ids[static_cast<std::size_t>(k)] * H + j)] +=
            dout[static_cast<std::size_t>(k * H + j)];
    for (int p : {1, 2, 4})
      for (bool sp : {false, true}) {
        CAPTURE(p);
        CAPTURE(sp);
        std::vector<int> ok(static_cast<std::size_t>(p), 0);
        run_ranks(p, [&](comm_t& tp) {
          int const r = tp.rank();
          auto const shard = par::vocab_shard_of(tp, V);  // 3, 3, 2, 2 rows at tp 4
          auto const mine = rows_of<double>(table, H, shard.begin, shard.size);
          std::vector<double> dmine(static_cast<std::size_t>(shard.size * H), 0.5);
          index_t const n = sp ? N / p : N, t0 = sp ? r * n : 0;
          std::vector<double> out(static_cast<std::size_t>(n * H));
          auto const my_dout = rows_of<double>(dout, H, t0, n);
          if (sp) {
            par::vocab_parallel_embedding_forward_sp(tp, ids, shard, cview(mine, shard.size, H),
                                                     mview(out, n, H));
            par::vocab_parallel_embedding_backward_sp(tp, ids, shard, cview(my_dout, n, H),
                                                      mview(dmine, shard.size, H));
          } else {
            par::vocab_parallel_embedding_forward(tp, ids, shard, cview(mine, shard.size, H),
                                                  mview(out, n, H));
            par::vocab_parallel_embedding_backward(ids, shard, cview(my_dout, n, H),
                                                   mview(dmine, shard.size, H));
          }
          bool good = true;
          for (index_t k = 0; k < n; ++k)
            for (index_t j = 0; j < H; ++j)
              good = good && out[static_cast<std::size_t>(k * H + j)] ==
                                 table[static_cast<std::size_t>(
                                     ids[static_cast<std::size_t>(t0 + k)] * H + j)];
          good = good && dmine == rows_of<double>(dense_dtable, H, shard.begin, shard.size);
          ok[static_cast<std::size_t>(r)] = good;
        });
        for (int g : ok) CHECK(g == 1);
      }
  }

  TEST_CASE("vocab: output layer and cross-entropy equal the dense head (f64 and f32, SP or not)") {
    index_t const N = 4, H = 5, V = 11;  // V uneven over 2 and 4
    std::vector<std::int64_t> const targets{10, 0, 4, 7};
    std::vector<double> const dloss{0.25, 0.25, 0.5, 1.0};
    dense_head const d(N, H, V, targets, dloss);
    auto run = [&]<class T>(T, int p, bool sp) {
      std::vector<double> worst(static_cast<std::size_t>(p), 1.0);
      run_ranks(p, [&](comm_t& tp) {
        int const r = tp.rank();
        auto const shard = par::vocab_shard_of(tp, V);
        index_t const n = sp ? N / p : N, t0 = sp ? r * n : 0;
        auto const h = rows_of<T>(d.hid, H, t0, n);
        auto const w = rows_of<T>(d.w, H, shard.begin, shard.size);
        std::vector<T> h_total(static_cast<std::size_t>(N * H)),
            logits(static_cast<std::size_t>(N * shard.size));
        std::vector<T> loss(static_cast<std::size_t>(N)), lse(static_cast<std::size_t>(N)),
            dl(dloss.begin(), dloss.end());
        std::vector<T> dlogits(logits.size()), dh(static_cast<std::size_t>(n * H)),
            dw(w.size(), T(0));
        if (sp) {
          par::vocab_parallel_output_forward_sp(tp, cview(h, n, H), cview(w, shard.size, H),
                                                mview(h_total, N, H), mview(logits, N, shard.size));
        } else {
          par::vocab_parallel_output_forward(tp, cview(h, N, H), cview(w, shard.size, H),
                                             mview(logits, N, shard.size));
        }
        par::vocab_parallel_cross_entropy_forward(tp, cview(logits, N, shard.size), shard, targets,
                                                  loss, lse);
        par::vocab_parallel_cross_entropy_backward(cview(logits, N, shard.size), shard, targets,
                                                   lse, dl, mview(dlogits, N, shard.size));
        if (sp) {
          par::vocab_parallel_output_backward_input_sp(tp, cview(dlogits, N, shard.size),
                                                       cview(w, shard.size, H), mview(dh, n, H));
          par::vocab_parallel_output_backward_weight(
              cview(dlogits, N, shard.size), cview(h_total, N, H), mview(dw, shard.size, H));
        } else {
          par::vocab_parallel_output_backward_input(tp, cview(dlogits, N, shard.size),
                                                    cview(w, shard.size, H), mview(dh, N, H));
          par::vocab_parallel_output_backward_weight(cview(dlogits, N, shard.size), cview(h, N, H),
                                                     mview(dw, shard.size, H));
        }
        double e = vocab_rel_err(loss, d.loss);
        e = std::max(e, vocab_rel_err(dh, rows_of<double>(d.dh, H, t0, n)));
        e = std::max(e, vocab_rel_err(dw, rows_of<double>(d.dw, H, shard.begin, shard.size)));
        worst[static_cast<std::size_t>(r)] = e;
      });
      return *std::max_element(worst.begin(), worst.end());
    };
    for (int p : {1, 2, 4})
      for (bool sp : {false, true}) {
        CAPTURE(p);
        CAPTURE(sp);
        CHECK(run(double{}, p, sp) <= 1e-12);
        CHECK(run(float{}, p, sp) <= 1e-5);
      }
  }

  TEST_CASE("vocab: a bad id or target raises on every rank before anything is written") {
    std::vector<std::string> messages(2);
    run_ranks(2, [&](comm_t& tp) {
      auto const shard = par::vocab_shard_of(tp, 4);
      std::vector<double> table(static_cast<std::size_t>(shard.size * 2), 1.0);
      std::vector<double> out(4, -1.0);
      std::vector<std::int64_t> const ids{0, 4};
      messages[static_cast<std::size_t>(tp.rank())] = message_of([&] {
        par::vocab_parallel_embedding_forward(tp, ids, shard, cview(table, shard.size, 2),
                                              mview(out, 2, 2));
      });
      CHECK(out == std::vector<double>(4, -1.0));
      std::vector<double> logits(static_cast<std::size_t>(2 * shard.size)), loss(2), lse(2);
      std::vector<std::int64_t> const targets{1, 5};
      CHECK_THROWS_AS(par::vocab_parallel_cross_entropy_forward(tp, cview(logits, 2, shard.size),
                                                                shard, targets, loss, lse),
                      weft::invalid_argument_error);
    });
    for (auto const& m : messages) {
      CHECK(has(m, "ids"));
      CHECK(has(m, "[0, 4)"));
      CHECK(has(m, "4 at token 1"));
    }
  }
}
