// examples/rl_trainer/task.hpp — rl_trainer's task and rollouts: 2-digit addition over 14
// symbols (prompts, answers, the random streams every draw is keyed by, the model's shape), a
// generated sample and its packing for the all-reduce that shares it, generation with a
// key/value-cache decoder, the per-step metrics and the parameter hash.
#pragma once

#include "rl_trainer/engine.hpp"

#include <weft/core/random.hpp>
#include <weft/core/tensor.hpp>
#include <weft/nn/gpt.hpp>
#include <weft/rl/sampling.hpp>

#include <algorithm>
#include <array>
#include <cstdint>
#include <cstring>
#include <limits>
#include <span>
#include <string>
#include <utility>
#include <vector>

namespace weft::examples::rl_trainer {

namespace nn = weft::nn;
namespace rl = weft::rl;
using weft::index_t;

// ---- the task: 2-digit addition over 14 symbols -------------------------------------------------

constexpr std::int32_t kPlus = 10, kEq = 11, kEos = 12, kPad = 13;
constexpr index_t kVocab = 14, kPrompt = 6, kMaxNew = 4, kContext = 16;

struct problem {
  int a = 0, b = 0;
};

inline std::array<std::int32_t, kPrompt> prompt_of(problem p) {
  return {p.a / 10, p.a % 10, kPlus, p.b / 10, p.b % 10, kEq};
}
inline std::array<std::int32_t, kMaxNew> answer_of(problem p) {
  int const s = p.a + p.b;
  return {s / 100, s / 10 % 10, s % 10, kEos};
}

// Random streams: each purpose its own, each draw a pure function of its index.
enum stream : std::uint64_t {
  sft_prompts = 1,
  sft_eval_prompts = 2,
  sft_eval_sampling = 3,
  rl_prompts = 4,
  rl_sampling = 5,
  eval_prompts = 6,
  eval_sampling = 7,
};

inline problem draw_problem(std::uint64_t seed, stream s, std::uint64_t index) {
  weft::rng const g(seed, s);
  return {static_cast<int>(g.uniform_int(2 * index, 100)),
          static_cast<int>(g.uniform_int(2 * index + 1, 100))};
}

inline nn::gpt_config model_config(int layers) {
  nn::gpt_config c;
  c.vocab = kVocab;
  c.context = kContext;
  c.d_model = 64;
  c.heads = 4;
  c.layers = layers;
  c.mlp_hidden = 256;
  c.ln_eps = 1e-5;
  return c;
}

// ---- rollouts -----------------------------------------------------------------------------------

//! One generated response: the problem, up to 4 tokens, the sampler's log-probs and entropies.
struct sample {
  problem p;
  std::array<std::int32_t, kMaxNew> tokens{kPad, kPad, kPad, kPad};
  int length = 0;  // valid tokens: through the first EOS, or all 4 (truncated)
  std::array<double, kMaxNew> logp{}, entropy{};
  bool truncated = false, correct = false;
  double reward = -1.0;
};
constexpr std::size_t kSampleWords = 2 + 4 + 1 + 4 + 4 + 2 + 1;

inline void pack(sample const& s, double* w) {
  w[0] = s.p.a;
  w[1] = s.p.b;
  for (int t = 0; t < 4; ++t) {
    w[2 + t] = s.tokens[t];
    w[7 + t] = s.logp[t];
    w[11 + t] = s.entropy[t];
  }
  w[6] = s.length;
  w[15] = s.truncated ? 1 : 0;
  w[16] = s.correct ? 1 : 0;
  w[17] = s.reward;
}
inline sample unpack(double const* w) {
  sample s;
  s.p = {static_cast<int>(w[0]), static_cast<int>(w[1])};
  for (int t = 0; t < 4; ++t) {
    s.tokens[t] = static_cast<std::int32_t>(w[2 + t]);
    s.logp[t] = w[7 + t];
    s.entropy[t] = w[11 + t];
  }
  s.length = static_cast<int>(w[6]);
  s.truncated = w[15] != 0;
  s.correct = w[16] != 0;
  s.reward = w[17];
  return s;
}

//! Samples `per` responses to each of `prompts` with the decoder (row r answers prompt r / per):
//! temperature 1, or greedy; row r's coin at position t is gen.uniform_double(keys[r] * 4 + t).
//! Each prompt is prefilled once, in one row, and forked into its `per` rows.
template <class T>
inline void generate(model_decoder<T>& dec, std::span<problem const> prompts, index_t per,
                     std::span<std::uint64_t const> keys, weft::rng gen, bool greedy,
                     std::span<sample> out) {
  auto const n = static_cast<index_t>(prompts.size());
  auto const rows = n * per;
  std::vector<problem> probs;
  std::vector<index_t> sources;
  for (index_t r = 0; r < rows; ++r) {
    probs.push_back(prompts[static_cast<std::size_t>(r / per)]);
    sources.push_back(r / per);
  }
  dec.reset(n);
  std::vector<std::int32_t> pcol(static_cast<std::size_t>(n));
  for (index_t t = 0; t < kPrompt; ++t) {
    for (index_t k = 0; k < n; ++k)
      pcol[static_cast<std::size_t>(k)] = prompt_of(prompts[static_cast<std::size_t>(k)])[t];
    dec.step(pcol);
  }
  dec.fork(sources);  // the prompt's cache and last logits into its `per` rows
  std::vector<std::int32_t> col(static_cast<std::size_t>(rows));
  std::vector<bool> done(static_cast<std::size_t>(rows), false);
  std::vector<std::uint64_t> coins(static_cast<std::size_t>(rows));
  std::vector<rl::token_sample> drawn(static_cast<std::size_t>(rows));
  for (index_t t = 0; t < kMaxNew; ++t) {
    for (index_t r = 0; r < rows; ++r)
      coins[static_cast<std::size_t>(r)] = keys[static_cast<std::size_t>(r)] * 4 + t;
    dec.sample(gen, coins, rl::sample_options{1.0, greedy}, drawn);
    for (index_t r = 0; r < rows; ++r) {
      auto& s = out[static_cast<std::size_t>(r)];
      auto const& d = drawn[static_cast<std::size_t>(r)];
      col[static_cast<std::size_t>(r)] = d.token;
      if (done[static_cast<std::size_t>(r)]) continue;
      s.tokens[t] = d.token;
      s.logp[t] = d.logp;
      s.entropy[t] = d.entropy;
      s.length = static_cast<int>(t) + 1;
      if (d.token == kEos) done[static_cast<std::size_t>(r)] = true;
    }
    if (t + 1 < kMaxNew) dec.step(col);
  }
  for (index_t r = 0; r < rows; ++r) {
    auto& s = out[static_cast<std::size_t>(r)];
    s.p = probs[static_cast<std::size_t>(r)];
    s.truncated = !done[static_cast<std::size_t>(r)];
    auto const want = answer_of(s.p);
    s.correct = !s.truncated && s.length == kMaxNew &&
                std::equal(want.begin(), want.end(), s.tokens.begin());
    s.reward = s.correct ? 1.0 : -1.0;
  }
}

// ---- metrics and outputs
// --------------------------------------------------------------------------

struct step_metrics {
  std::vector<std::pair<std::string, double>> values;
  void set(std::string const& k, double v) {
    for (auto& [n, x] : values)
      if (n == k) {
        x = v;
        return;
      }
    values.emplace_back(k, v);
  }
  [[nodiscard]] double get(std::string const& k) const {
    for (auto const& [n, x] : values)
      if (n == k) return x;
    return std::numeric_limits<double>::quiet_NaN();
  }
};

struct run_result {
  int sft_steps = 0;
  double acc_sft_sampled = 0, acc_sft_greedy = 0, acc_rl_sampled = 0, acc_rl_greedy = 0;
  std::vector<step_metrics> steps;
  std::vector<std::uint64_t> rollout_hashes;  // per RL step, over every generated sample
  std::vector<double> losses;                 // per RL mini-batch: the policy loss
  std::vector<double> final_params;           // the replica after RL
  double seconds_sft = 0, seconds_rl = 0;
};

// 64-bit FNV-1a over the values' bytes (little-endian), continuing from `h` (start with the
// offset basis 0xcbf29ce484222325).
inline std::uint64_t hash_words(std::span<double const> w, std::uint64_t h) {
  for (double x : w) {
    std::uint64_t bits = 0;
    std::memcpy(&bits, &x, 8);
    for (int b = 0; b < 8; ++b) h = (h ^ ((bits >> (8 * b)) & 0xffu)) * 0x100000001b3ull;
  }
  return h;
}

}  // namespace weft::examples::rl_trainer
