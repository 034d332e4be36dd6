// Tests for weft/pipeline/cost_model.hpp and the communication side of simulate.hpp: the output
// layer's cost in transformer layers against the VP artifact's table, the layer partitions, the
// default model's per-stage times and per-rank bytes written out by hand, and P2P and collective
// latencies in closed form.
#include <weft/pipeline/cost_model.hpp>
#include <weft/pipeline/lower.hpp>
#include <weft/pipeline/schedules/gpipe.hpp>
#include <weft/pipeline/schedules/one_f_one_b.hpp>
#include <weft/pipeline/schedules/vocab.hpp>
#include <weft/pipeline/simulate.hpp>

#include "pipeline/note_costs.hpp"

#include <doctest/doctest.h>

#include <numeric>
#include <vector>

using namespace weft::pipeline;

TEST_CASE("cost_model: output layer = 2V/(8h+4s+4ffn) layers (VP artifact table, §4.1)") {
  struct row {
    int vocab;
    double s2k, s4k;
  };
  for (auto const& r : {row{32000, 0.78, 0.71}, row{64000, 1.56, 1.42}, row{128000, 3.13, 2.84},
                        row{256000, 6.25, 5.68}}) {
    model_shape m{};
    m.vocab = r.vocab;
    CHECK(output_layer_equivalents(m) == doctest::Approx(r.s2k).epsilon(0.005));
    m.seq = 4096;
    CHECK(output_layer_equivalents(m) == doctest::Approx(r.s4k).epsilon(0.005));
  }
}

TEST_CASE("cost_model: partitions cover every layer once") {
  CHECK(partition_uniform(32, 8) == std::vector<int>(8, 4));
  CHECK(partition_uniform(30, 4) == std::vector<int>{7, 7, 8, 8});  // remainder on later stages
  CHECK(partition_redistribute(32, 8, 0) == std::vector<int>{4, 4, 4, 5, 5, 5, 5, 0});
  CHECK(partition_redistribute(32, 8, 4) == std::vector<int>(8, 4));
  CHECK(partition_redistribute(32, 8, 2) == std::vector<int>{4, 4, 4, 4, 4, 5, 5, 2});
  for (int L : {7, 30, 61})
    for (int st : {2, 4, 8}) {
      auto const u = partition_uniform(L, st);
      CHECK(std::accumulate(u.begin(), u.end(), 0) == L);
      CHECK(*std::max_element(u.begin(), u.end()) - *std::min_element(u.begin(), u.end()) <= 1);
    }
  CHECK_THROWS_AS(partition_uniform(8, 0), weft::schedule_error);
  CHECK_THROWS_WITH_AS(partition_redistribute(8, 4, 9),
                       doctest::Contains("argument `last_stage_layers`"), weft::schedule_error);
}

TEST_CASE("cost_model: the default model, term by term") {
  model_shape const shape{};  // 32 layers, h 3072, ffn 12288, s 2048, V 256000
  double const h = 3072, ffn = 12288, s = 2048, V = 256000, E = 6.25;
  double const layer_params = 4 * h * h + 2 * h * ffn, layer_act = s * (18 * h + 4 * ffn);
  SUBCASE("1F1B: the last stage runs the output layer, stage 0 holds the embedding") {
    auto const sched = one_f_one_b(8, 16);
    auto const c = make_cost_model(sched, shape, partition_uniform(32, 8));
    CHECK(c.forward[0] == doctest::Approx(4.0));
    CHECK(c.backward_input[3] + c.backward_weight[3] == doctest::Approx(8.0));
    CHECK(c.forward[7] == doctest::Approx(4.0 + E));
    CHECK(c.backward_input[7] + c.backward_weight[7] == doctest::Approx(2 * (4.0 + E)));
    CHECK(c.parameter_bytes[0] == doctest::Approx(16 * (4 * layer_params + V * h)));
    CHECK(c.parameter_bytes[3] == doctest::Approx(16 * 4 * layer_params));
    CHECK(c.parameter_bytes[7] == doctest::Approx(16 * (4 * layer_params + V * h)));
    CHECK(c.activation_bytes[3] == doctest::Approx(4 * layer_act));
    CHECK(c.activation_bytes[7] == doctest::Approx(4 * layer_act + 4 * s * V));
    CHECK(c.p2p_bytes == doctest::Approx(2 * s * h));
    // Peak memory of rank 0 = parameters + 8 in-flight microbatches of its activations.
    auto const sim = simulate(sched, c);
    CHECK(sim.peak_memory_bytes[0] ==
          doctest::Approx(c.parameter_bytes[0] + 8 * c.activation_bytes[0]));
  }
  SUBCASE("vocabulary parallelism: S and T split 3E over the ranks, the embeddings are sharded") {
    schedule const one(8, 8, 16, placement::loop, vocab_variant::one_barrier);
    schedule const two(8, 8, 16, placement::loop, vocab_variant::two_barrier);
    auto const c1 = make_cost_model(one, shape, partition_uniform(32, 8));
    auto const c2 = make_cost_model(two, shape, partition_uniform(32, 8));
    CHECK(c1.forward[7] == doctest::Approx(4.0));
    CHECK(c1.vocab_forward == doctest::Approx(2 * E / 8));
    CHECK(c1.vocab_backward == doctest::Approx(E / 8));
    CHECK(c2.vocab_forward == doctest::Approx(E / 8));
    CHECK(c2.vocab_backward == doctest::Approx(2 * E / 8));
    CHECK(c1.parameter_bytes[5] == doctest::Approx(16 * (4 * layer_params + 2 * V * h / 8)));
    CHECK(c1.vocab_activation_bytes == doctest::Approx(4 * s * (V / 8 + h)));
    auto const k = plan_costs(c1);
    CHECK(k.forward == doctest::Approx(4.0));
    CHECK(k.backward == doctest::Approx(8.0));
    CHECK(k.vocab_forward == doctest::Approx(2 * E / 8));
  }
  SUBCASE("bad input") {
    auto const sched = one_f_one_b(4, 8);
    CHECK_THROWS_WITH_AS(make_cost_model(sched, shape, {8, 8, 8}),
                         doctest::Contains("layers_per_stage.size()"), weft::schedule_error);
    CHECK_THROWS_WITH_AS(make_cost_model(sched, shape, {8, 8, 8, 7}),
                         doctest::Contains("actual 31"), weft::schedule_error);
    auto costs = unit_costs(sched);
    costs.forward.pop_back();
    CHECK_THROWS_AS(simulate(sched, costs), weft::schedule_error);
  }
}

TEST_CASE("cost_model: point-to-point and collective latencies in closed form") {
  // One microbatch through p stages: p forwards, p backwards, 2(p-1) transfers.
  for (int p : {2, 3, 5}) {
    auto const s = one_f_one_b(p, 1, {true});
    auto c = note_costs(s);
    c.p2p_latency = 0.25;
    c.p2p_bandwidth = 4.0;
    c.p2p_bytes = 1.0;  // + 0.25 per message
    CHECK(simulate(s, c).makespan == doctest::Approx(3.0 * p + 2 * (p - 1) * 0.5));
    CHECK(simulate(lower(s), c).makespan == doctest::Approx(3.0 * p + 2 * (p - 1) * 0.5));
  }
  // GPipe p=2, m=4 with latency d: rank 1 starts d late and the backwards return d late.
  auto const g = gpipe(2, 4);
  auto c = note_costs(g);
  c.p2p_latency = 0.5;
  CHECK(simulate(g, c).makespan == doctest::Approx(15.0 + 2 * 0.5));
  // Collectives run one after another on their own stream.
  auto const v = vocab_one_f_one_b(2, 2, vocab_variant::one_barrier);
  auto cv = unit_costs(v);
  cv.collective_latency = 0.125;
  auto const sim = simulate(v, cv);
  REQUIRE(sim.collective_times.size() == sim.collective_order.size());
  for (std::size_t k = 0; k < sim.collective_times.size(); ++k) {
    CHECK(sim.collective_times[k].finish - sim.collective_times[k].start == doctest::Approx(0.125));
    if (k > 0) CHECK(sim.collective_times[k].start >= sim.collective_times[k - 1].finish - 1e-12);
  }
}
