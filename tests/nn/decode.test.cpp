// Tests of weft/nn/decode.hpp: the key/value-cache decoder's logits equal nn::gpt::forward's at
// every position (f64 within 1e-12, f32 within 1e-5 of the largest logit) for rows of different
// tokens in one batch, after a prompt prefilled in one row and forked into all, and with GQA;
// a later optimizer step is seen; bad arguments are refused with the value named. And the GPU
// decoder's element functors (weft/nn/detail/decode_ops.hpp) run on the host over a flat cache.
#include <weft/nn/decode.hpp>
#include <weft/nn/detail/decode_ops.hpp>
#include <weft/nn/gpt.hpp>

#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <random>
#include <utility>
#include <vector>

namespace {
namespace nn = weft::nn;
using weft::index_t;

nn::gpt_config config(index_t kv_heads) {
  nn::gpt_config c;
  c.vocab = 14;
  c.context = 12;
  c.d_model = 16;
  c.heads = 4;
  c.kv_heads = kv_heads;
  c.layers = 2;
  return c;
}

// GPT-2's init scaled up so that attention is far from uniform.
template <class T>
nn::param_store<T> params(nn::gpt_config const& c) {
  nn::param_store<T> s(nn::gpt_layout(c));
  nn::gpt_init(s, c, 5);
  for (std::size_t i = 0; i < s.params().size(); ++i)
    s.params()[i] = static_cast<T>(s.params()[i] * 10 + 0.01 * std::sin(0.3 * double(i)));
  return s;
}

// The full forward's logits [len, V] of one sequence.
template <class T>
std::vector<T> full_logits(nn::gpt_config const& c, nn::param_store<T>& s,
                           std::vector<std::int32_t> const& seq) {
  std::vector<std::int32_t> pos, tgt(seq.size(), -1);
  for (std::size_t i = 0; i < seq.size(); ++i) pos.push_back(static_cast<std::int32_t>(i));
  std::vector<std::int64_t> cu{0, static_cast<std::int64_t>(seq.size())};
  nn::gpt<T> model(c, s);
  model.forward({seq, pos, tgt, cu});
  auto const l = model.logits();
  return std::vector<T>(l.data_handle(), l.data_handle() + seq.size() * c.vocab);
}

template <class T>
void check_decoder(index_t kv_heads, double tol) {
  auto const c = config(kv_heads);
  auto s = params<T>(c);
  // Three rows sharing a 4-token prompt, then diverging for 5 tokens.
  std::vector<std::int32_t> const prompt{3, 7, 10, 1};
  std::vector<std::vector<std::int32_t>> seqs(3, prompt);
  for (int r = 0; r < 3; ++r)
    for (int i = 0; i < 5; ++i) seqs[r].push_back(static_cast<std::int32_t>((r * 5 + i * 3) % 14));
  nn::gpt_decoder<T> dec(c, s, 3, 9);
  std::vector<T> logits(3 * 14);
  weft::tensor_view<T, 2> lv(logits.data(), 3, 14);
  // Prefill the prompt once in a batch of one row (a reset before it empties nothing stale), then
  // fork it into three rows.
  dec.reset(3);
  std::vector<std::int32_t> three{1, 2, 3};
  dec.step(three, lv);
  dec.reset(1);
  std::vector<T> one(14);
  for (auto t : prompt) dec.step(std::span(&t, 1), weft::tensor_view<T, 2>(one.data(), 1, 14));
  std::vector<index_t> const sources{0, 0, 0};
  dec.fork(sources);
  CHECK(dec.rows() == 3);
  CHECK(dec.length() == 4);
  std::vector<std::vector<T>> want;
  for (auto const& q : seqs) want.push_back(full_logits(c, s, q));
  double scale = 0;
  for (auto const& w : want)
    for (auto v : w) scale = std::max(scale, std::abs(double(v)));
  double worst = 0;
  // The prompt's last logits (position 3), from the one-row batch.
  for (index_t v = 0; v < 14; ++v)
    worst = std::max(worst, std::abs(double(one[static_cast<std::size_t>(v)]) -
                                     double(want[0][static_cast<std::size_t>(3 * 14 + v)])));
  for (int i = 0; i < 5; ++i) {
    std::vector<std::int32_t> col;
    for (int r = 0; r < 3; ++r) col.push_back(seqs[r][4 + i]);
    dec.step(col, lv);
    for (int r = 0; r < 3; ++r)
      for (index_t v = 0; v < 14; ++v)
        worst =
            std::max(worst, std::abs(double(lv(r, v)) -
                                     double(want[r][static_cast<std::size_t>((4 + i) * 14 + v)])));
  }
  INFO("kv_heads " << kv_heads << ": largest logit " << scale << ", error " << worst);
  CHECK(scale > 1.0);  // the model is not trivial
  CHECK(worst <= tol * scale);
  // A full cache is refused.
  std::vector<std::int32_t> col{1, 1, 1};
  CHECK_THROWS_WITH(dec.step(col, lv), doctest::Contains("max_len"));
}

}  // namespace

TEST_CASE("gpt_decoder: cached decoding equals the full forward at every position") {
  check_decoder<double>(0, 1e-12);
  check_decoder<double>(2, 1e-12);
  check_decoder<float>(0, 1e-5);
  check_decoder<float>(1, 1e-5);
}

TEST_CASE("gpt_decoder: reads the store at every step and refuses bad arguments") {
  auto const c = config(0);
  auto s = params<double>(c);
  nn::gpt_decoder<double> dec(c, s, 2, 4);
  std::vector<double> a(28), b(28);
  weft::tensor_view<double, 2> av(a.data(), 2, 14), bv(b.data(), 2, 14);
  std::vector<std::int32_t> tok{2, 5};
  dec.reset(2);
  dec.step(tok, av);
  for (auto& p : s.params()) p *= 1.5;  // an optimizer step
  dec.reset(2);
  dec.step(tok, bv);
  CHECK(a != b);
  CHECK_THROWS_WITH(dec.reset(3), doctest::Contains("max_rows"));
  std::vector<std::int32_t> bad{2, 14};
  CHECK_THROWS_WITH(dec.step(bad, av), doctest::Contains("tokens[1]"));
  CHECK_THROWS_WITH(nn::gpt_decoder<double>(c, s, 1, 13), doctest::Contains("context"));
  std::vector<std::int32_t> three{1, 2, 3};
  CHECK_THROWS_WITH(dec.step(three, av), doctest::Contains("one per row"));
  std::vector<index_t> const bad_source{0, 2};
  CHECK_THROWS_WITH(dec.fork(bad_source), doctest::Contains("sources[1]"));
}

TEST_CASE("gpt_decoder: fork maps every new row to its source row, which may itself move") {
  auto const c = config(0);
  auto s = params<double>(c);
  // Two prompts prefilled in rows 0 and 1, forked to {1, 0, 1}: row r must continue like a batch
  // that had prefilled prompt sources[r] in its own row.
  std::vector<std::vector<std::int32_t>> const prompts{{3, 7, 10}, {5, 2, 11}};
  nn::gpt_decoder<double> dec(c, s, 3, 6);
  std::vector<double> l2(28), l3(42);
  dec.reset(2);
  for (int t = 0; t < 3; ++t) {
    std::vector<std::int32_t> col{prompts[0][t], prompts[1][t]};
    dec.step(col, weft::tensor_view<double, 2>(l2.data(), 2, 14));
  }
  std::vector<index_t> const sources{1, 0, 1};
  dec.fork(sources);
  std::vector<std::int32_t> next{4, 4, 9};
  dec.step(next, weft::tensor_view<double, 2>(l3.data(), 3, 14));
  for (int r = 0; r < 3; ++r) {
    auto seq = prompts[static_cast<std::size_t>(sources[static_cast<std::size_t>(r)])];
    seq.push_back(next[static_cast<std::size_t>(r)]);
    auto const want = full_logits(c, s, seq);
    for (index_t v = 0; v < 14; ++v)
      CHECK(std::abs(l3[static_cast<std::size_t>(r * 14 + v)] -
                     want[static_cast<std::size_t>(3 * 14 + v)]) <= 1e-12 * 100);
  }
}

// ---- nn::cuda_gpt_decoder's element functors (weft/nn/detail/decode_ops.hpp) on the host -------

namespace {
// Each functor over its index range, as weft::detail::launch_for_each_index runs it.
template <class F>
void for_each(std::int64_t n, F const& f) {
  for (std::int64_t i = 0; i < n; ++i) f(i);
}
}  // namespace

TEST_CASE("cuda_gpt_decoder's cache write, fork and attention functors keep every row's history") {
  // A model of the cache: each layer's rows as lists of (key, value) vectors, appended by a step
  // and copied by fork; the functors run over a flat [layers, max_rows, max_len, kvd] cache as
  // the decoder's kernels do, and the attention must equal a plain softmax over the model's list.
  index_t const layers = 2, max_rows = 5, max_len = 7, heads = 6, kv = 2, hd = 3;
  index_t const kvd = kv * hd, d = heads * hd, group = heads / kv, row_stride = max_len * kvd;
  std::vector<double> cache_k(static_cast<std::size_t>(layers * max_rows * row_stride), -1e300);
  std::vector<double> cache_v(cache_k.size(), -1e300);
  using entry = std::pair<std::vector<double>, std::vector<double>>;
  std::vector<std::vector<std::vector<entry>>> hist(static_cast<std::size_t>(layers));
  std::mt19937_64 rng(3);
  std::uniform_real_distribution<double> u(-1.0, 1.0);
  index_t rows = 3, len = 0;
  for (auto& h : hist) h.assign(static_cast<std::size_t>(rows), {});
  double worst = 0;
  int checked = 0;
  auto const step = [&] {
    for (index_t l = 0; l < layers; ++l) {
      std::vector<double> k(static_cast<std::size_t>(rows * kvd)), v(k.size());
      for (auto& x : k) x = u(rng);
      for (auto& x : v) x = u(rng);
      double* const lk = cache_k.data() + l * max_rows * row_stride;
      double* const lv = cache_v.data() + l * max_rows * row_stride;
      for_each(rows * kvd, nn::kernels::decode_cache_write_op<double>{k.data(), v.data(), lk, lv,
                                                                      kvd, row_stride, len});
      for (index_t r = 0; r < rows; ++r)
        hist[static_cast<std::size_t>(l)][static_cast<std::size_t>(r)].emplace_back(
            std::vector<double>(k.begin() + r * kvd, k.begin() + (r + 1) * kvd),
            std::vector<double>(v.begin() + r * kvd, v.begin() + (r + 1) * kvd));
      std::vector<double> q(static_cast<std::size_t>(rows * d)), out(q.size(), -7.0);
      for (auto& x : q) x = u(rng);
      std::vector<double> scores(static_cast<std::size_t>(rows * heads * max_len));
      std::vector<double> acc(static_cast<std::size_t>(rows * heads * hd));
      double const scale = 1.0 / std::sqrt(static_cast<double>(hd));
      for_each(rows * heads, nn::kernels::decode_attention_op<double>{
                                 q.data(), lk, lv, out.data(), scores.data(), acc.data(), heads,
                                 group, hd, kvd, row_stride, max_len, len + 1, scale});
      for (index_t r = 0; r < rows; ++r)
        for (index_t h = 0; h < heads; ++h) {
          auto const& past = hist[static_cast<std::size_t>(l)][static_cast<std::size_t>(r)];
          index_t const g = h / group;
          std::vector<double> s;
          double mx = -INFINITY, sum = 0;
          for (auto const& [key, val] : past) {
            double dot = 0;
            for (index_t e = 0; e < hd; ++e)
              dot += q[static_cast<std::size_t>(r * d + h * hd + e)] *
                     key[static_cast<std::size_t>(g * hd + e)];
            s.push_back(dot * scale);
            mx = std::max(mx, s.back());
          }
          for (auto& x : s) sum += (x = std::exp(x - mx));
          for (index_t e = 0; e < hd; ++e) {
            double want = 0;
            for (std::size_t j = 0; j < past.size(); ++j)
              want += s[j] * past[j].second[static_cast<std::size_t>(g * hd + e)];
            want /= sum;
            worst =
                std::max(worst, std::abs(out[static_cast<std::size_t>(r * d + h * hd + e)] - want));
            ++checked;
          }
        }
    }
    ++len;
  };
  auto const fork = [&](std::vector<std::int64_t> const& sources) {
    auto const to = static_cast<index_t>(sources.size()), span = len * kvd;
    std::vector<double> packed(static_cast<std::size_t>(layers * rows * span));
    for (auto* cache : {&cache_k, &cache_v}) {
      for_each(layers * rows * span,
               nn::kernels::decode_fork_op<double>{cache->data(), packed.data(), nullptr, rows,
                                                   rows, span, max_rows, row_stride, false});
      for_each(layers * to * span,
               nn::kernels::decode_fork_op<double>{cache->data(), packed.data(), sources.data(), to,
                                                   rows, span, max_rows, row_stride, true});
    }
    for (auto& h : hist) {
      auto const old = h;
      h.clear();
      for (auto src : sources) h.push_back(old[static_cast<std::size_t>(src)]);
    }
    rows = to;
  };
  step();
  step();
  fork({2, 0, 2, 1, 0});  // more rows; row 0 is a source and a destination
  step();
  step();
  fork({4, 3});  // fewer rows, from the highest ones
  step();
  fork({1, 1, 0, 1});
  step();
  step();
  CHECK(len == max_len);
  CHECK(checked == layers * hd * heads * (3 + 3 + 5 + 5 + 2 + 4 + 4));
  INFO("largest attention difference " << worst);
  CHECK(worst <= 1e-14);
}
