#!/usr/bin/python3
"""PyTorch eager peer of benchmarks/nn.bench.cpp: one GPT training step on one thread.

The same two models as the C++ benchmark, built the way nanoGPT builds them: token and learned
position embeddings, pre-LayerNorm blocks (causal attention as explicit matmul-softmax-matmul,
since torch 1.13 has no scaled_dot_product_attention; a tanh-GELU MLP), final LayerNorm and an
untied output head without bias; GPT-2's initialisation. A step is what nn.bench.cpp times:
zero_grad, forward with the mean token cross-entropy, backward, AdamW (lr 3e-4, betas 0.9/0.95,
weight decay 0.1 on matrices, foreach=False) on B = 4 sequences of T = 64 tokens.

  gpt2-small  12 layers, d 768, 12 heads, MLP 3072, vocabulary 50257, context 1024 (124M)
  tiny        2 layers, d 64, 4 heads, MLP 256, vocabulary 256, context 64

Usage: OPENBLAS_NUM_THREADS=1 /usr/bin/python3 benchmarks/peers/gpt_torch.py [--threads 1]
       [--repeat 5] [--models tiny,gpt2-small] [--cpu-time]
(Debian: apt-get install python3-torch). Prints, per model, the best step time and tokens/s.
"""
import argparse
import math
import time

import torch
import torch.nn as tnn
import torch.nn.functional as F


class Block(tnn.Module):
    def __init__(self, d, heads, hidden, layers):
        super().__init__()
        self.heads = heads
        self.ln1 = tnn.LayerNorm(d, eps=1e-5)
        self.q = tnn.Linear(d, d)
        self.k = tnn.Linear(d, d)
        self.v = tnn.Linear(d, d)
        self.o = tnn.Linear(d, d)
        self.ln2 = tnn.LayerNorm(d, eps=1e-5)
        self.fc = tnn.Linear(d, hidden)
        self.proj = tnn.Linear(hidden, d)
        for lin in (self.q, self.k, self.v, self.fc):
            tnn.init.normal_(lin.weight, 0.0, 0.02)
            tnn.init.zeros_(lin.bias)
        for lin in (self.o, self.proj):
            tnn.init.normal_(lin.weight, 0.0, 0.02 / math.sqrt(2 * layers))
            tnn.init.zeros_(lin.bias)

    def forward(self, x, mask):
        b, t, d = x.shape
        h = self.heads
        y = self.ln1(x)
        q = self.q(y).view(b, t, h, d // h).transpose(1, 2)
        k = self.k(y).view(b, t, h, d // h).transpose(1, 2)
        v = self.v(y).view(b, t, h, d // h).transpose(1, 2)
        s = torch.matmul(q, k.transpose(-2, -1)) * (1.0 / math.sqrt(d // h))
        s = s.masked_fill(mask, float("-inf"))
        a = torch.matmul(torch.softmax(s, dim=-1), v).transpose(1, 2).reshape(b, t, d)
        x = x + self.o(a)
        x = x + self.proj(F.gelu(self.fc(self.ln2(x)), approximate="tanh"))
        return x


class GPT(tnn.Module):
    def __init__(self, vocab, context, d, heads, layers, hidden):
        super().__init__()
        self.wte = tnn.Embedding(vocab, d)
        self.wpe = tnn.Embedding(context, d)
        self.blocks = tnn.ModuleList(Block(d, heads, hidden, layers) for _ in range(layers))
        self.lnf = tnn.LayerNorm(d, eps=1e-5)
        self.head = tnn.Linear(d, vocab, bias=False)
        for emb in (self.wte, self.wpe):
            tnn.init.normal_(emb.weight, 0.0, 0.02)
        tnn.init.normal_(self.head.weight, 0.0, 0.02)

    def forward(self, tokens, targets):
        b, t = tokens.shape
        pos = torch.arange(t)
        mask = torch.ones(t, t, dtype=torch.bool).triu(1)
        x = self.wte(tokens) + self.wpe(pos)
        for blk in self.blocks:
            x = blk(x, mask)
        logits = self.head(self.lnf(x))
        return F.cross_entropy(logits.view(-1, logits.size(-1)), targets.view(-1), ignore_index=-1)


MODELS = {
    "gpt2-small": dict(vocab=50257, context=1024, d=768, heads=12, layers=12, hidden=3072),
    "tiny": dict(vocab=256, context=64, d=64, heads=4, layers=2, hidden=256),
}


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--models", default="tiny,gpt2-small")
    ap.add_argument("--cpu-time", action="store_true",
                    help="time with the process's CPU time (on a shared machine) instead of wall")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    clock = time.process_time if args.cpu_time else time.perf_counter
    b, t = 4, 64
    print(f"torch {torch.__version__}, {torch.get_num_threads()} thread(s), "
          f"{'CPU' if args.cpu_time else 'wall'} time, B = {b}, T = {t}")
    for name in args.models.split(","):
        cfg = MODELS[name]
        model = GPT(**cfg)
        decay = [p for n, p in model.named_parameters() if p.dim() >= 2]
        no_decay = [p for n, p in model.named_parameters() if p.dim() < 2]
        opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.1},
                                 {"params": no_decay, "weight_decay": 0.0}],
                                lr=3e-4, betas=(0.9, 0.95), eps=1e-8, foreach=False)
        g = torch.Generator().manual_seed(12345)
        tokens = torch.randint(0, cfg["vocab"], (b, t), generator=g)
        targets = torch.cat([tokens.view(-1)[1:], torch.tensor([-1])]).view(b, t)

        def step():
            opt.zero_grad(set_to_none=False)
            loss = model(tokens, targets)
            loss.backward()
            opt.step()
            return loss.item()

        step()  # warm-up: allocations and the optimizer state
        reps = args.repeat if name != "tiny" else args.repeat * 40
        times = []
        for _ in range(reps):
            t0 = clock()
            step()
            times.append(clock() - t0)
        best = min(times)
        med = sorted(times)[len(times) // 2]
        params = sum(p.numel() for p in model.parameters()) / 1e6
        print(f"{name:11s} params {params:8.3f}M  step best {best * 1e3:10.2f} ms  median "
              f"{med * 1e3:10.2f} ms  tokens/s (median) {b * t / med:10.1f}")


if __name__ == "__main__":
    main()
