// pipeline_planner — compares every weft pipeline schedule for one configuration: p ranks,
// m microbatches, v chunks (interleaved), a transformer's shape and the cost knobs. Prints a
// Markdown table (makespan, bubble, throughput against 1F1B, peak activations and memory per
// rank) and writes one SVG timeline per schedule. Defaults: the VP paper's 8-GPU 4B model.
//
//   pipeline_planner [--p 8] [--m 128] [--v 2] [--layers 32] [--hidden 3072] [--ffn 12288]
//                    [--seq 2048] [--vocab 256000] [--last-stage-layers 0]
//                    [--collective-latency 0] [--p2p-latency 0] [--memory-gb G] [--out DIR]
//                    [--text]
// --memory-gb G also names the fastest schedule whose peak memory fits G GB on every rank.
#include <weft/pipeline/plan/compare.hpp>
#include <weft/pipeline/render.hpp>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <iostream>
#include <string>
#include <string_view>

namespace {

struct options {
  weft::pipeline::plan::config config;
  std::string out = ".";
  bool text = false;
  double memory_gb = 0;  // 0: no budget
};

void usage(char const* argv0) {
  std::cerr
      << "usage: " << argv0
      << " [--p N] [--m N] [--v N] [--layers N] [--hidden N] [--ffn N] [--seq N] [--vocab N]\n"
         "       [--last-stage-layers K] [--collective-latency T] [--p2p-latency T] [--memory-gb "
         "G]\n"
         "       [--out DIR] [--text]\n"
         "  --memory-gb G  also name the fastest schedule whose peak memory fits G GB per rank\n";
}

bool parse_number(std::string_view text, double& out) {
  char* end = nullptr;
  std::string const s(text);
  out = std::strtod(s.c_str(), &end);
  return !s.empty() && end == s.c_str() + s.size();
}

// Returns false (after saying why) on a bad command line.
bool parse(int argc, char** argv, options& o) {
  auto& c = o.config;
  for (int i = 1; i < argc; ++i) {
    std::string_view const flag = argv[i];
    if (flag == "--text") {
      o.text = true;
      continue;
    }
    if (flag == "--help" || flag == "-h") return false;
    if (i + 1 >= argc) {
      std::cerr << "argument `" << flag << "`: expected a value, actual none\n";
      return false;
    }
    std::string_view const value = argv[++i];
    if (flag == "--out") {
      o.out = value;
      continue;
    }
    double x = 0;
    if (!parse_number(value, x)) {
      std::cerr << "argument `" << flag << "`: expected a number, actual `" << value << "`\n";
      return false;
    }
    // Every flag is a non-negative finite number; the counts are whole numbers below 2^31.
    bool const is_count =
        flag != "--collective-latency" && flag != "--p2p-latency" && flag != "--memory-gb";
    if (!std::isfinite(x) || x < 0 || (is_count && (x != std::floor(x) || x > 2147483647.0))) {
      std::cerr << "argument `" << flag << "`: expected "
                << (is_count ? "a whole number in [0, 2147483647]" : "a finite number >= 0")
                << ", actual `" << value << "`\n";
      return false;
    }
    int const n = is_count ? static_cast<int>(x) : 0;
    if (flag == "--p")
      c.p = n;
    else if (flag == "--m")
      c.m = n;
    else if (flag == "--v")
      c.v = n;
    else if (flag == "--layers")
      c.shape.layers = n;
    else if (flag == "--hidden")
      c.shape.hidden = n;
    else if (flag == "--ffn")
      c.shape.ffn = n;
    else if (flag == "--seq")
      c.shape.seq = n;
    else if (flag == "--vocab")
      c.shape.vocab = n;
    else if (flag == "--last-stage-layers")
      c.last_stage_layers = n;
    else if (flag == "--collective-latency")
      c.costs.collective_latency = x;
    else if (flag == "--p2p-latency")
      c.costs.p2p_latency = x;
    else if (flag == "--memory-gb") {
      if (x == 0) {
        std::cerr << "argument `--memory-gb`: expected > 0, actual " << value << "\n";
        return false;
      }
      o.memory_gb = x;
    } else {
      std::cerr << "argument `" << flag << "`: expected one of the flags below, actual unknown\n";
      return false;
    }
  }
  return true;
}

std::string file_name(weft::pipeline::plan::kind k) {
  using weft::pipeline::plan::kind;
  switch (k) {
    case kind::gpipe: return "gpipe";
    case kind::one_f_one_b: return "1f1b";
    case kind::redistribution: return "1f1b_redistribution";
    case kind::interleaved: return "interleaved";
    case kind::zero_bubble_h1: return "zb_h1";
    case kind::zero_bubble_h2: return "zb_h2";
    case kind::zero_bubble_v: return "zbv";
    case kind::v_half: return "v_half";
    case kind::v_min: return "v_min";
    case kind::dualpipe_v: return "dualpipe_v";
    case kind::vocab_one_barrier: return "vocab_1_barrier";
    case kind::vocab_two_barrier: return "vocab_2_barriers";
  }
  return "schedule";
}

}  // namespace

int main(int argc, char** argv) {
  options o;
  if (!parse(argc, argv, o)) {
    usage(argv[0]);
    return 2;
  }
  auto const& c = o.config;
  std::cout << "p=" << c.p << " m=" << c.m << " v=" << c.v << " layers=" << c.shape.layers
            << " hidden=" << c.shape.hidden << " ffn=" << c.shape.ffn << " seq=" << c.shape.seq
            << " vocab=" << c.shape.vocab
            << " (output layer = " << weft::pipeline::output_layer_equivalents(c.shape)
            << " layer-equivalents)\n\n";
  std::vector<weft::pipeline::plan::row> rows;
  try {
    rows = weft::pipeline::plan::compare(c);
  } catch (weft::error const& e) {  // a configuration no schedule can take (e.g. layers < p)
    std::cerr << e.message() << "\n";
    return 2;
  }
  std::cout << weft::pipeline::plan::markdown_table(rows) << "\n";
  if (o.memory_gb > 0) {
    if (auto const* best = weft::pipeline::plan::fastest_within(rows, o.memory_gb * 1e9))
      std::printf(
          "fastest within %g GB per rank: %s (makespan %.1f, throughput %.3f vs 1F1B, %.1f "
          "GB)\n\n",
          o.memory_gb, best->name.c_str(), best->sim->makespan, best->throughput,
          ranges::max(best->sim->peak_memory_bytes) / 1e9);
    else
      std::printf("no schedule fits %g GB per rank\n\n", o.memory_gb);
  }
  for (auto const& r : rows) {
    if (!r.sim) continue;
    auto const path = o.out + "/pipeline_" + file_name(r.which) + ".svg";
    std::ofstream svg(path);
    svg << weft::pipeline::render_svg(*r.sched, *r.sim, {r.name, 1200, 24, true});
    if (!svg) {
      std::cerr << "cannot write " << path << "\n";
      return 1;
    }
    std::cout << "wrote " << path << "\n";
    if (o.text)
      std::cout << weft::pipeline::render_text(*r.sched, *r.sim, {r.name, 0, 150}) << "\n";
  }
  return 0;
}
