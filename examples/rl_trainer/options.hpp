// examples/rl_trainer/options.hpp — rl_trainer's command line: its options, their parse with
// the checks that name the flag, the expected and the actual value, the usage text, the run's
// fingerprint (what a checkpoint must agree on) and the pipeline schedule a step runs.
#pragma once

#include "common/cli.hpp"

#include <weft/pipeline/schedule.hpp>
#include <weft/pipeline/schedules/controllable_memory.hpp>
#include <weft/pipeline/schedules/dualpipe.hpp>
#include <weft/pipeline/schedules/gpipe.hpp>
#include <weft/pipeline/schedules/interleaved.hpp>
#include <weft/pipeline/schedules/one_f_one_b.hpp>
#include <weft/pipeline/schedules/vocab.hpp>
#include <weft/pipeline/schedules/zero_bubble.hpp>

#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <sstream>
#include <string>
#include <string_view>
#include <system_error>

namespace weft::examples::rl_trainer {

using weft::examples::bad_argument;
using weft::examples::parse_number;

struct options {
  std::string mode = "dapo";  // dapo | grpo
  std::uint64_t seed = 0;
  int rl_steps = 150;
  int sft_max_steps = 2000;
  int sft_steps = 0;  // > 0: exactly this many SFT steps, no accuracy target (tests)
  double sft_target = 0.30;
  int sft_batch = 64, sft_eval_every = 20, sft_eval_prompts = 256;
  double sft_lr = 1e-3, rl_lr = 1e-4;
  int prompts = 32, group = 8, max_rounds = 3, minibatches = 2;
  std::string refill = "whole";  // whole (verl) | sized (from the observed keep rate)
  bool zero_advantage = false;
  int eval_prompts = 1000;
  int dp = 1, pp = 1, tp = 1, cp = 1;
  bool sp = false;
  int layers = 2;  // transformer blocks; pp x (chunks a rank) <= layers
  // The pipeline schedule under --pp > 1: 1f1b | gpipe | zb-h1 | zb-h2 (one chunk a rank) or
  // interleaved | zbv | v-half | v-min | dualpipe-v (two) | vocab-1 | vocab-2 (one chunk, the
  // embedding and output layer sharded over the pipeline ranks).
  std::string schedule = "1f1b";
  std::string out;  // output folder ("" = none)
  bool check = false;
  bool quiet = false;
  bool f64 = false;
  std::string backend = "threads";  // threads | mpi (one process per rank, under mpiexec)
  std::string save;                 // checkpoint folder ("" = none)
  int save_every = 0;               // also every N RL steps (0: only at the end)
  std::string resume;               // checkpoint folder to continue from
  std::string device = "cpu";       // cpu | cpu-engine | cuda: where the model step runs
  bool zero1 = false;               // ZeRO-1: AdamW state sharded over the data group (dp x cp)
};

//! Model chunks a rank holds under a pipeline schedule (0: not a schedule's name).
inline int chunks_of(std::string_view s) {
  if (s == "1f1b" || s == "gpipe" || s == "zb-h1" || s == "zb-h2" || s == "vocab-1" ||
      s == "vocab-2")
    return 1;
  if (s == "interleaved" || s == "zbv" || s == "v-half" || s == "v-min" || s == "dualpipe-v")
    return 2;
  return 0;
}

//! Whether `s` is a vocabulary-balanced schedule (1F1B with the vocabulary passes: the embedding
//! and output layer sharded over the pipeline ranks; one or two barriers).
inline bool vocab_schedule(std::string_view s) { return s == "vocab-1" || s == "vocab-2"; }

//! What a checkpoint must agree on to be resumed: the run (task, seeds, phases, learning rates,
//! batch, evaluation), the element type and the model (--layers), not the step count, the
//! outputs or the layout. A checkpoint holds the whole model (gpt_layout), so any dp x pp x tp x
//! cp, --sp, --schedule, --zero1, --backend and --device resumes it: in exact arithmetic every
//! layout takes the same steps (rl_trainer --check), so only the rounding differs.
inline std::string fingerprint(options const& o) {
  std::ostringstream f;
  f << "--mode " << o.mode << " --seed " << o.seed << " --sft-max-steps " << o.sft_max_steps
    << " --sft-steps " << o.sft_steps << " --sft-target " << o.sft_target << " sft batch "
    << o.sft_batch << " every " << o.sft_eval_every << " on " << o.sft_eval_prompts
    << " prompts, lr " << o.sft_lr << " then " << o.rl_lr << ", --prompts " << o.prompts
    << " --group " << o.group << " --max-rounds " << o.max_rounds << " minibatches "
    << o.minibatches << " --refill " << o.refill << (o.zero_advantage ? " --zero-advantage" : "")
    << " --eval-prompts " << o.eval_prompts << (o.f64 ? " --f64" : " f32") << " --layers "
    << o.layers;
  return f.str();
}

//! The schedule `name` of a step of m microbatches over pp stages. Where m does not suit it, a
//! schedule of the same placement: GPipe for the one-chunk schedules (1F1B, ZB-H1 and ZB-H2 need
//! m >= pp); for interleaved 1F1B the least microbatch group Megatron's rules accept
//! (interleaved_group_for: pp where pp divides m), and below pp microbatches the default group
//! without the rules (every forward is warmup); ZBV for DualPipeV (m >= 2 pp); ZBV, V-Half and
//! V-Min take any m; the vocabulary-balanced 1F1B below pp microbatches without its m >= p rule.
inline weft::pipeline::schedule make_schedule(std::string_view name, int pp, int m) {
  namespace pl = weft::pipeline;
  if (vocab_schedule(name)) {
    pl::vocab_options vo;
    vo.unchecked = m < pp;
    return pl::vocab_one_f_one_b(
        pp, m, name == "vocab-1" ? pl::vocab_variant::one_barrier : pl::vocab_variant::two_barrier,
        vo);
  }
  if (name == "interleaved") {
    pl::interleaved_options io;
    if (m < pp)
      io.unchecked = true;
    else
      io.group = pl::interleaved_group_for(pp, m);
    return pl::interleaved_one_f_one_b(pp, m, 2, io);
  }
  if (name == "zbv" || (name == "dualpipe-v" && m < 2 * pp)) return pl::zero_bubble_v(pp, m);
  if (name == "dualpipe-v") return pl::dualpipe_v(pp, m);
  if (name == "v-half") return pl::v_half(pp, m);
  if (name == "v-min") return pl::v_min(pp, m);
  if (m < pp || name == "gpipe") return pl::gpipe(pp, m);
  if (name == "zb-h1") return pl::zero_bubble_h1(pp, m);
  if (name == "zb-h2") return pl::zero_bubble_h2(pp, m);
  return pl::one_f_one_b(pp, m);
}

inline void usage(std::ostream& os) {
  os << "usage: rl_trainer [--preset NAME] [--mode dapo|grpo] [--seed N] [--rl-steps N]\n"
        "                  [--sft-max-steps N] [--sft-steps N] [--sft-target X] [--prompts N] "
        "[--group G]\n"
        "                  [--max-rounds N] [--refill whole|sized] [--zero-advantage]\n"
        "                  [--eval-prompts N] [--dp N] [--pp N] [--tp N] [--cp N] [--sp]\n"
        "                  [--layers N] [--schedule NAME] [--zero1]\n"
        "                  [--out DIR] [--save DIR] [--save-every N] [--resume DIR]\n"
        "                  [--backend threads|mpi] [--device cpu|cpu-engine|cuda] [--check]\n"
        "                  [--f64] [--quiet] [--help]\n\n"
        "SFT, then RL (DAPO or GRPO) of a small GPT (2 layers) on 2-digit addition; prints a line\n"
        "per RL step and the accuracies after SFT and after RL.\n"
        "  --preset          default (SFT to 30 %), high-accuracy (SFT to 70 %) or smoke (40 SFT\n"
        "                    steps, 3 RL steps, 50 eval prompts); later flags override it\n"
        "  --mode            dapo (default: eps 0.2/0.28, dual clip 10, token-mean, dynamic\n"
        "                    sampling) or grpo (eps 0.2/0.2, seq-mean-token-mean, one round)\n"
        "  --seed            seed of everything random (default 0)\n"
        "  --rl-steps        RL steps (default 150)\n"
        "  --sft-max-steps   SFT step cap (default 2000); SFT stops once the sampled exact match\n"
        "                    of 256 fresh prompts, tested every 20 steps, reaches --sft-target\n"
        "                    (default 0.30)\n"
        "  --sft-steps       exactly N SFT steps, no target (default 0: use the target)\n"
        "  --prompts, --group  prompts per round and samples per prompt (default 32, 8)\n"
        "  --max-rounds      DAPO generation rounds per step (default 3)\n"
        "  --refill          whole: every round draws --prompts prompts (verl); sized: a refill\n"
        "                    round draws ceil(missing / keep rate * 1.1) prompts\n"
        "  --zero-advantage  control: every advantage 0 (nothing should be learned)\n"
        "  --eval-prompts    held-out prompts evaluated after SFT and after RL (default 1000)\n"
        "  --dp --pp --tp --cp  the layout (default 1 each; at most 64 thread ranks); --sp:\n"
        "                    sequence parallelism; tp divides the 4 heads; pp times the chunks\n"
        "                    a rank holds (below) at most --layers\n"
        "  --layers          transformer blocks (default 2, at most 16), split over the stages\n"
        "                    in contiguous ranges (uneven where pp does not divide them)\n"
        "  --schedule        the pipeline schedule under --pp > 1, one chunk a rank: 1f1b\n"
        "                    (default), gpipe, zb-h1 or zb-h2 (the backward split into I and W, W\n"
        "                    deferred); two chunks a rank (virtual stages, 2 x pp <= --layers):\n"
        "                    interleaved (1F1B, looped placement), zbv, v-half, v-min or\n"
        "                    dualpipe-v (V placement). Where a step has too few microbatches for\n"
        "                    the schedule: GPipe (one chunk), interleaved without Megatron's\n"
        "                    microbatch rule, or ZBV (dualpipe-v). The one-chunk schedules give\n"
        "                    the same parameters bit for bit, and so do the V-shape ones (each\n"
        "                    stage adds its microbatches in order). vocab-1, vocab-2: 1F1B with\n"
        "                    the embedding and output layer sharded over the pipeline ranks\n"
        "                    and their tp ranks (vocabulary parallelism, one or two barriers;\n"
        "                    pp x tp at most 14): the same training up to rounding (the softmax\n"
        "                    sums associate differently)\n"
        "  --zero1           ZeRO-1 (Megatron's distributed optimizer): the gradients are\n"
        "                    reduce-scattered in buckets over the data group (dp x cp), each of\n"
        "                    its ranks steps AdamW on its 1/(dp x cp) of the parameters and the\n"
        "                    parameters are all-gathered; the gradient norm is reduced over all\n"
        "                    ranks (with one data rank: as without it). Checkpoints hold the\n"
        "                    whole state: a run with or without --zero1 resumes them\n"
        "  --out DIR         write metrics.csv, summary.json and plots (SVG) to DIR\n"
        "  --check           also run the one-rank trainer and compare: identical rollouts and\n"
        "                    losses within 1e-6 relative in f64, 1e-4 in f32 (dp alone: bit\n"
        "                    for bit, but for the norm's rounding under --zero1; with --layers\n"
        "                    > 4, f32 rounding can exceed it: --f64)\n"
        "  --save DIR        checkpoint into DIR after RL (and every --save-every N steps):\n"
        "                    DIR/step_K/model.bin, the whole model in one layout-free file\n"
        "                    (written by rank 0), DIR/latest written last\n"
        "  --resume DIR      continue from DIR's latest checkpoint (the same run: task, seeds,\n"
        "                    phases, rates, batch, --f64, --layers; any layout, --schedule,\n"
        "                    --zero1, --backend, --device, --rl-steps). On the same layout the\n"
        "                    run goes on bit for bit as if never interrupted; on another, as\n"
        "                    that layout's own run would (the rounding differs, f64: ~1e-12)\n"
        "  --backend         threads (default: one process, a thread per rank) or mpi (one\n"
        "                    process per rank: mpiexec -n <dp*pp*tp*cp> rl_trainer --backend mpi)\n"
        "  --device          where the model step (forward, backward, clipping, AdamW) and\n"
        "                    generation run:\n"
        "                    cpu (default: the layout's ranks), cuda (a GPU; needs the\n"
        "                    rl_trainer_cuda build) or cpu-engine (the CPU behind the interface\n"
        "                    --device cuda uses: bit for bit the default); not cpu: --dp only\n"
        "                    (rank r on GPU r mod the GPUs); the policy loss stays on the host\n"
        "  --f64             train and generate in double precision (layout tests)\n"
        "  --quiet           no per-step lines\n";
}

inline options parse(int argc, char** argv) {
  options o;
  for (int i = 1; i < argc; ++i) {
    std::string_view const a = argv[i];
    auto value = [&] { return weft::examples::flag_value(argc, argv, i); };
    if (a == "--help") {
      usage(std::cout);
      std::exit(0);
    } else if (a == "--preset") {
      // Named settings; flags after it override them.
      auto const name = std::string(value());
      if (name == "default") {
        o.sft_target = 0.30;
      } else if (name == "high-accuracy") {
        o.sft_target = 0.70;  // the ablation's harder regime: most groups all correct
      } else if (name == "smoke") {
        o.sft_steps = 40;
        o.rl_steps = 3;
        o.eval_prompts = 50;
      } else {
        throw bad_argument{
            "argument `--preset`: expected default, high-accuracy or smoke, actual `" + name + "`"};
      }
    } else if (a == "--mode") {
      o.mode = std::string(value());
      if (o.mode != "dapo" && o.mode != "grpo")
        throw bad_argument{"argument `--mode`: expected dapo or grpo, actual `" + o.mode + "`"};
    } else if (a == "--seed") {
      o.seed = parse_number<std::uint64_t>(a, value(), 0, 1ull << 40);
    } else if (a == "--rl-steps") {
      o.rl_steps = parse_number(a, value(), 0, 100000);
    } else if (a == "--sft-max-steps") {
      o.sft_max_steps = parse_number(a, value(), 0, 1000000);
    } else if (a == "--sft-steps") {
      o.sft_steps = parse_number(a, value(), 0, 1000000);
    } else if (a == "--sft-target") {
      o.sft_target = parse_number(a, value(), 0.0, 1.0);
    } else if (a == "--prompts") {
      o.prompts = parse_number(a, value(), 1, 4096);
    } else if (a == "--group") {
      o.group = parse_number(a, value(), 2, 256);
    } else if (a == "--max-rounds") {
      o.max_rounds = parse_number(a, value(), 1, 100);
    } else if (a == "--refill") {
      o.refill = std::string(value());
      if (o.refill != "whole" && o.refill != "sized")
        throw bad_argument{"argument `--refill`: expected whole or sized, actual `" + o.refill +
                           "`"};
    } else if (a == "--zero-advantage") {
      o.zero_advantage = true;
    } else if (a == "--eval-prompts") {
      o.eval_prompts = parse_number(a, value(), 1, 1000000);
    } else if (a == "--dp") {
      o.dp = parse_number(a, value(), 1, 64);
    } else if (a == "--pp") {
      o.pp = parse_number(a, value(), 1, 16);
    } else if (a == "--layers") {
      o.layers = parse_number(a, value(), 1, 16);
    } else if (a == "--tp") {
      o.tp = parse_number(a, value(), 1, 4);
    } else if (a == "--cp") {
      o.cp = parse_number(a, value(), 1, 4);
    } else if (a == "--sp") {
      o.sp = true;
    } else if (a == "--schedule") {
      o.schedule = std::string(value());
      if (chunks_of(o.schedule) == 0)
        throw bad_argument{
            "argument `--schedule`: expected 1f1b, gpipe, zb-h1, zb-h2, interleaved, zbv, v-half, "
            "v-min, dualpipe-v, vocab-1 or vocab-2, actual `" +
            o.schedule + "`"};
    } else if (a == "--out") {
      o.out = std::string(value());
    } else if (a == "--check") {
      o.check = true;
    } else if (a == "--backend") {
      o.backend = std::string(value());
      if (o.backend != "threads" && o.backend != "mpi")
        throw bad_argument{"argument `--backend`: expected threads or mpi, actual `" + o.backend +
                           "`"};
    } else if (a == "--save") {
      o.save = std::string(value());
    } else if (a == "--save-every") {
      o.save_every = parse_number(a, value(), 0, 1000000);
    } else if (a == "--resume") {
      o.resume = std::string(value());
    } else if (a == "--device") {
      o.device = std::string(value());
      if (o.device != "cpu" && o.device != "cpu-engine" && o.device != "cuda")
        throw bad_argument{"argument `--device`: expected cpu, cpu-engine or cuda, actual `" +
                           o.device + "`"};
#if !WEFT_TRAINER_CUDA
      if (o.device == "cuda")
        throw bad_argument{
            "argument `--device`: expected cpu or cpu-engine (this rl_trainer has no CUDA: run "
            "rl_trainer_cuda, built with WEFT_ENABLE_CUDA=ON and WEFT_BUILD_TESTS=ON), actual "
            "`cuda`"};
#endif
    } else if (a == "--zero1") {
      o.zero1 = true;
    } else if (a == "--f64") {
      o.f64 = true;
    } else if (a == "--quiet") {
      o.quiet = true;
    } else {
      throw bad_argument{"unknown argument `" + std::string(a) + "` (see --help)"};
    }
  }
  if (o.dp * o.pp * o.tp * o.cp > 64)
    throw bad_argument{"argument `--dp x --pp x --tp x --cp`: expected at most 64 ranks, actual " +
                       std::to_string(o.dp * o.pp * o.tp * o.cp)};
  if (o.check && !o.resume.empty())
    throw bad_argument{
        "argument `--check`: expected without --resume (the comparison needs the "
        "run's rollouts from step 1)"};
  if (o.save_every > 0 && o.save.empty())
    throw bad_argument{"argument `--save-every`: expected with --save DIR"};
  if (o.sp) {
    int const seq = (6 + 4 + 2 * o.cp - 1) / (2 * o.cp) * (2 * o.cp);  // prompt + answer
    for (int seqs : {o.group, 8})
      if (seqs * seq / o.cp % o.tp != 0)
        throw bad_argument{"argument `--sp`: expected the rows of a microbatch (" +
                           std::to_string(seqs) + " sequences x " + std::to_string(seq) +
                           " tokens / cp) to be a multiple of tp = " + std::to_string(o.tp) +
                           ", actual " + std::to_string(seqs * seq / o.cp)};
  }
  if (o.tp == 3) throw bad_argument{"argument `--tp`: expected a divisor of the 4 heads, actual 3"};
  if (o.pp > 1 && chunks_of(o.schedule) > 1 && 2 * o.pp > o.layers)
    throw bad_argument{
        "argument `--layers`: expected at least 2 x pp = " + std::to_string(2 * o.pp) +
        " under --schedule " + o.schedule + " (two chunks a rank, each at least a block), actual " +
        std::to_string(o.layers)};
  if (o.pp > o.layers)
    throw bad_argument{"argument `--pp`: expected at most --layers = " + std::to_string(o.layers) +
                       " (every stage holds a block), actual " + std::to_string(o.pp)};
  if (o.schedule != "1f1b" && o.pp == 1)
    throw bad_argument{
        "argument `--schedule`: expected 1f1b (the default) with --pp 1 (no "
        "pipeline to schedule), actual `" +
        o.schedule + "`"};
  if (o.pp > 1 && vocab_schedule(o.schedule) && o.pp * o.tp > 14)
    throw bad_argument{std::string("argument `") + (o.tp > 1 ? "--pp x --tp" : "--pp") +
                       "`: expected at most 14 (the vocabulary's tokens: every "
                       "pipeline and tp rank holds one) under --schedule " +
                       o.schedule + ", actual " + std::to_string(o.pp * o.tp)};
  if (o.device != "cpu" && o.zero1)
    throw bad_argument{"argument `--zero1`: expected with --device cpu (the " + o.device +
                       " engine keeps the whole optimizer state), actual --device " + o.device};
  if (o.device != "cpu" && o.pp * o.tp * o.cp != 1)
    throw bad_argument{"argument `--device`: expected cpu with --pp " + std::to_string(o.pp) +
                       " --tp " + std::to_string(o.tp) + " --cp " + std::to_string(o.cp) + " (" +
                       o.device + " runs whole-model steps: data parallelism only), actual `" +
                       o.device + "`"};
  return o;
}

//! The folders a run writes into (--out, and --save's checkpoints), made and probed with a file
//! written and removed again before any training, so that a path the run cannot write fails at
//! once by its flag, not after the run (--out is written at the end) or at its first checkpoint.
inline void check_output_folders(options const& o) {
  namespace fs = std::filesystem;
  auto const check = [](std::string const& flag, std::string const& dir) {
    if (dir.empty()) return;
    std::error_code made;
    fs::create_directories(dir, made);
    bool written = false;
    if (!made) {
      auto const probe = fs::path(dir) / ".rl_trainer_probe";
      {
        std::ofstream f(probe);
        f << "probe\n";
        f.flush();
        written = static_cast<bool>(f);
      }
      std::error_code removed;
      fs::remove(probe, removed);
      written = written && !removed;
    }
    if (made || !written)
      throw bad_argument{"argument `" + flag +
                         "`: expected a folder this process can create and write into, actual `" +
                         dir + "`" + (made ? " (" + made.message() + ")" : std::string())};
  };
  check("--out", o.out);
  check("--save", o.save);
}

}  // namespace weft::examples::rl_trainer
