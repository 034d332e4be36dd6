// weft/nn/nn.hpp — the model-layer area: a flat parameter store, linear, LayerNorm/RMSNorm, GELU
// and SwiGLU, embeddings, RoPE, residual add, cross-entropy and the attention core, each with a
// hand-written backward on host memory, and gpt.hpp, a GPT decoder composed from them.
#pragma once

#include <weft/nn/activation.hpp>
#include <weft/nn/attention.hpp>
#include <weft/nn/cross_entropy.hpp>
#include <weft/nn/decode.hpp>
#include <weft/nn/embedding.hpp>
#include <weft/nn/gpt.hpp>
#include <weft/nn/linear.hpp>
#include <weft/nn/norm.hpp>
#include <weft/nn/params.hpp>
#include <weft/nn/residual.hpp>
#include <weft/nn/rope.hpp>
