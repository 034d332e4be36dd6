// weft/pipeline/cost_model.hpp — what the simulator charges: per-stage compute times, the
// vocabulary passes, point-to-point and collective costs, per-stage activation and per-rank
// parameter bytes; the documented default model built from a transformer's shape, and the layer
// partitioning helpers (uniform, and the "redistribute layers off the last stage" baseline).
#pragma once

#include <weft/pipeline/detail/check.hpp>
#include <weft/pipeline/detail/deps.hpp>
#include <weft/pipeline/schedule.hpp>

#include <cstddef>
#include <numeric>
#include <vector>

namespace weft::pipeline {

//! Times are in any unit (the default model: one transformer layer's forward = 1); bytes in bytes.
struct cost_model {
  std::vector<double> forward;           //!< per global stage, one microbatch
  std::vector<double> backward_input;    //!< per stage (I); a full backward B costs I + W
  std::vector<double> backward_weight;   //!< per stage (W)
  double vocab_forward = 0;              //!< S, per rank and microbatch
  double vocab_backward = 0;             //!< T
  double input_forward = 0;              //!< IF
  double input_backward = 0;             //!< IB
  double p2p_latency = 0;                //!< per point-to-point message
  double p2p_bandwidth = 0;              //!< bytes per time unit; 0 = infinite
  double p2p_bytes = 0;                  //!< bytes per point-to-point message
  double collective_latency = 0;         //!< per collective, on its own stream
  std::vector<double> activation_bytes;  //!< per stage and microbatch, held from F to B (or W)
  std::vector<double> parameter_bytes;   //!< per rank (weights, grads, optimizer state)
  double vocab_activation_bytes = 0;     //!< per rank and microbatch, held from S to T
  double input_activation_bytes = 0;     //!< per rank and microbatch, held from IF to IB
  //! How a rank runs a collective. false: it issues the collective to a stream of its own and goes
  //! on (a GPU runtime with a communication stream; the vocabulary schedules are planned so).
  //! true: the rank waits until the collective has completed, as weft's executor does over host
  //! communicators (fit_costs sets it).
  bool collectives_block = false;

  [[nodiscard]] double p2p_time() const noexcept {
    return p2p_latency + (p2p_bandwidth > 0 ? p2p_bytes / p2p_bandwidth : 0.0);
  }
};

//! The unit-cost model in which the published bubble formulas hold exactly (Narayanan et al.,
//! "Efficient Large-Scale Language Model Training on GPU Clusters Using Megatron-LM", SC'21,
//! arXiv:2104.04473, §2.2: (p-1)/m for 1F1B, (p-1)/(v·m) interleaved; Qi et al., "Zero Bubble
//! Pipeline Parallelism", ICLR'24, arXiv:2401.10241, for F = I = W): a full stage costs F = f,
//! I = i, W = w (default 1, so B = 2), chunks of an interleaved or V schedule 1/v of that; no
//! communication cost; one byte of activation per chunk-microbatch, so peak activation bytes
//! equal the in-flight count in stage units.
//!
//! The output layer costs `output_layer` stage forwards (its backward twice that, I and W alike)
//! and is placed as each schedule runs it, so that schedules compare fairly: without vocabulary
//! parallelism on the last stage (F += E·f, I += E·i, W += E·w); with it as the S and T passes of
//! every rank, its F + B = E(f + i + w) split evenly over the p ranks, S = E(f + i)/p and T = E·w/p
//! for one barrier (S also forms the input-gradient partial), S = E·f/p and T = E(i + w)/p for
//! two. IF and IB (lookups) cost 0. Those papers' bubble formulas, and the makespans
//! tests/pipeline/generators.test.cpp checks ((m + p - 1)(F + B) for 1F1B), model no output layer:
//! pass output_layer = 0 to reproduce them. The model is sized by `num_stages()`, which is bounded
//! first by the schedule's own actions (stages × microbatches at most its action count, the rule
//! `validate` calls completeness): a parsed header's `stages=` cannot make it allocate more than
//! the input's size, and such a schedule gets a schedule_error.
inline cost_model unit_costs(schedule const& s, double f = 1.0, double i = 1.0, double w = 1.0,
                             double output_layer = 1.0) {
  detail::require(output_layer >= 0.0, "output_layer", ">= 0", output_layer, "output_layer >= 0");
  detail::require_indexable(s);
  cost_model c;
  auto const stages = static_cast<std::size_t>(s.num_stages());
  double const v = static_cast<double>(s.num_chunks());
  c.forward.assign(stages, f / v);
  c.backward_input.assign(stages, i / v);
  c.backward_weight.assign(stages, w / v);
  c.activation_bytes.assign(stages, 1.0 / v);
  c.parameter_bytes.assign(static_cast<std::size_t>(s.num_ranks()), 0.0);
  double const E = output_layer;
  if (s.vocab() == vocab_variant::none) {
    c.forward.back() += E * f;
    c.backward_input.back() += E * i;
    c.backward_weight.back() += E * w;
  } else {
    double const p = static_cast<double>(s.num_ranks());
    bool const one = s.vocab() == vocab_variant::one_barrier;
    c.vocab_forward = E * (one ? f + i : f) / p;
    c.vocab_backward = E * (one ? w : i + w) / p;
  }
  return c;
}

//! A decoder-only transformer, the inputs of the default cost model.
struct model_shape {
  int layers = 32;
  int hidden = 3072;
  int ffn = 12288;
  int seq = 2048;
  int vocab = 256000;
  int micro_batch = 1;
};

//! Output layer (LM head + softmax cross-entropy) forward cost in transformer-layer forwards:
//! 2V / (8h + 4s + 4 ffn), from the MFU formula flop = 3(2bshV + L(8bsh^2 + 4bs^2h + 4bsh ffn))
//! (VocabularyParallelism artifact). 6.25 at V=256k, h=3072, s=2048, ffn=12288.
inline double output_layer_equivalents(model_shape const& m) {
  return 2.0 * m.vocab / (8.0 * m.hidden + 4.0 * m.seq + 4.0 * m.ffn);
}

//! `layers` split over `stages` as evenly as possible, the remainder on the later stages
//! (Megatron's layer redistribution spreads its remainder the same way).
inline std::vector<int> partition_uniform(int layers, int stages) {
  detail::require(stages >= 1, "stages", ">= 1", stages, "stages >= 1");
  detail::require(layers >= 0, "layers", ">= 0", layers, "layers >= 0");
  std::vector<int> out(static_cast<std::size_t>(stages), layers / stages);
  int const rest = layers % stages;
  for (int i = 0; i < rest; ++i) ++out[static_cast<std::size_t>(stages - 1 - i)];
  return out;
}

//! The "redis" baseline of the VP paper (--enable-layer-redistribution --final-stage-num-layers
//! K): K layers on the last stage, the other L-K spread over the first stages (remainder on the
//! later ones).
inline std::vector<int> partition_redistribute(int layers, int stages, int last_stage_layers) {
  detail::require(stages >= 2, "stages", ">= 2", stages, "stages >= 2");
  detail::require(last_stage_layers >= 0 && last_stage_layers <= layers, "last_stage_layers",
                  ::weft::detail::concat("in [0, layers = ", layers, "]"), last_stage_layers,
                  "0 <= last_stage_layers <= layers");
  auto out = partition_uniform(layers - last_stage_layers, stages - 1);
  out.push_back(last_stage_layers);
  return out;
}

//! Knobs of the default cost model (docs/pipeline.md writes it out).
struct cost_options {
  double forward_per_layer = 1.0;     //!< time of one layer's forward
  double backward_per_layer = 2.0;    //!< full backward, split evenly into I and W
  double bytes_per_parameter = 16.0;  //!< bf16 weight + grad, fp32 master + Adam moments
  double p2p_latency = 0.0;
  double p2p_bandwidth = 0.0;  //!< bytes per time unit; 0 = infinite
  double collective_latency = 0.0;
};

//! The default cost model for schedule `s` running `shape` with `layers_per_stage[st]` transformer
//! layers on global stage st:
//!  - time: a layer's F = 1, B = 2 (I = W = 1); without vocabulary parallelism the last stage also
//!    runs the output layer (E = output_layer_equivalents: F = E, B = 2E) and stage 0 the
//!    embedding (free); with it, every rank runs S and T with the 3E of the output layer split as
//!    S = 2E/p, T = E/p (1 barrier: S also computes the input-gradient partial) or S = E/p,
//!    T = 2E/p (2 barriers), and IF/IB are free (lookups);
//!  - parameters: (4h^2 + 2h ffn) per layer, V h per embedding/output layer (untied), or 2Vh/p per
//!    rank with vocabulary parallelism; 16 bytes each;
//!  - activations per layer and microbatch: s b (18h + 4 ffn) bytes (Korthikanti et al.'s 34sbh at
//!    ffn = 4h, with flash attention); the output layer keeps fp32 logits (4sbV) from F to B;
//!    with vocabulary parallelism each rank keeps its fp32 softmax shard and X (4sb(V/p + h)) from
//!    S to T and its partial embedding (2sbh) from IF to IB; a P2P message is 2sbh bytes.
inline cost_model make_cost_model(schedule const& s, model_shape const& shape,
                                  std::vector<int> const& layers_per_stage,
                                  cost_options const& o = {}) {
  int const stages = s.num_stages();
  int const p = s.num_ranks();
  detail::require(static_cast<int>(layers_per_stage.size()) == stages, "layers_per_stage.size()",
                  ::weft::detail::concat("num_stages (", stages, ")"), layers_per_stage.size(),
                  "layers_per_stage.size() == num_stages");
  detail::require(shape.hidden > 0 && shape.seq > 0 && shape.vocab > 0 && shape.ffn > 0 &&
                      shape.micro_batch > 0,
                  "shape", "positive hidden, ffn, seq, vocab and micro_batch", shape.hidden,
                  "all sizes positive");
  int const total_layers = std::accumulate(layers_per_stage.begin(), layers_per_stage.end(), 0);
  detail::require(total_layers == shape.layers, "sum(layers_per_stage)",
                  ::weft::detail::concat("shape.layers (", shape.layers, ")"), total_layers,
                  "every layer assigned exactly once");
  double const h = shape.hidden, ffn = shape.ffn, sb = double(shape.seq) * shape.micro_batch;
  double const V = shape.vocab;
  double const E = output_layer_equivalents(shape);
  double const layer_params = 4.0 * h * h + 2.0 * h * ffn;
  double const layer_act = sb * (18.0 * h + 4.0 * ffn);
  bool const vp = s.vocab() != vocab_variant::none;
  double const half_b = o.backward_per_layer / 2.0;

  cost_model c;
  c.forward.resize(static_cast<std::size_t>(stages));
  c.backward_input.resize(static_cast<std::size_t>(stages));
  c.backward_weight.resize(static_cast<std::size_t>(stages));
  c.activation_bytes.resize(static_cast<std::size_t>(stages));
  c.parameter_bytes.assign(static_cast<std::size_t>(p), 0.0);
  for (int st = 0; st < stages; ++st) {
    auto const i = static_cast<std::size_t>(st);
    double const L = layers_per_stage[i];
    double layers_eq = L;
    double act = L * layer_act;
    double params = L * layer_params;
    if (!vp && st == stages - 1) {
      layers_eq += E;
      act += 4.0 * sb * V;
      params += V * h;
    }
    if (!vp && st == 0) {
      act += 2.0 * sb * h;
      params += V * h;
    }
    c.forward[i] = layers_eq * o.forward_per_layer;
    c.backward_input[i] = layers_eq * half_b;
    c.backward_weight[i] = layers_eq * half_b;
    c.activation_bytes[i] = act;
    c.parameter_bytes[static_cast<std::size_t>(s.stage_to_rank(st))] +=
        params * o.bytes_per_parameter;
  }
  if (vp) {
    detail::require(shape.vocab % p == 0, "shape.vocab",
                    ::weft::detail::concat("a multiple of the ranks (", p, ")"), shape.vocab,
                    "vocab % ranks == 0 (each rank holds V/p rows)");
    double const share = E / p;
    bool const one = s.vocab() == vocab_variant::one_barrier;
    c.vocab_forward = (one ? 2.0 : 1.0) * share * o.forward_per_layer;
    c.vocab_backward = (one ? 1.0 : 2.0) * share * o.forward_per_layer;
    c.vocab_activation_bytes = 4.0 * sb * (V / p + h);
    c.input_activation_bytes = 2.0 * sb * h;
    for (auto& b : c.parameter_bytes) b += 2.0 * V * h / p * o.bytes_per_parameter;
  }
  c.p2p_latency = o.p2p_latency;
  c.p2p_bandwidth = o.p2p_bandwidth;
  c.p2p_bytes = 2.0 * sb * h;
  c.collective_latency = o.collective_latency;
  return c;
}

}  // namespace weft::pipeline
