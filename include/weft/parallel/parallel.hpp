// weft/parallel/parallel.hpp — the parallel area: tensor-, sequence- and vocabulary-parallel
// layers over a tensor-parallel group (maps, column/row linear, vocabulary shards, shard
// initialisation), data parallelism (gradient buckets, grad_sync, ZeRO-1) and the GPT decoder
// composed from them over tp and cp.
#pragma once

#include <weft/parallel/mappings.hpp>  // copy_to_tp, reduce_from_tp, scatter/gather, SP maps
#include <weft/parallel/linear.hpp>    // column/row-parallel linear, sum_sequence_parallel_grads
#include <weft/parallel/vocab.hpp>     // padding, vocabulary-parallel embedding, output, loss
#include <weft/parallel/sharding.hpp>  // tp_shard_pieces, fill_normal_shard, fill_uniform_shard
#include <weft/parallel/dp.hpp>        // bucket_plan, grad_sync, zero1
#include <weft/parallel/gpt.hpp>       // nn::gpt over tp (+SP) and cp, shard init
#include <weft/parallel/gpt_pipeline.hpp>  // the GPT cut into pipeline stages (a Stage)
#include <weft/parallel/gpt_vocab.hpp>  // its vocabulary shard for the vocabulary-balanced schedules
