// Tests of weft/nn/decode.hpp: the key/value-cache decoder's logits equal nn::gpt::forward's at
// every position (f64 within 1e-12, f32 within 1e-5 of the largest logit) for rows of different
// tokens in one batch, after a prompt prefilled in one row and forked into all, and with GQA;
// a later optimizer step is seen; bad arguments are refused with the value named.
#include <weft/nn/decode.hpp>
#include <weft/nn/gpt.hpp>

#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
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
