#!/usr/bin/python3
"""PyTorch eager peer of the tiny RL trainer: SFT warm start, then GRPO or DAPO on 2-digit addition.

Task: 14 symbols (digits 0-9 = ids 0-9, '+' 10, '=' 11, EOS 12, PAD 13). Prompt "a1 a0 + b1 b0 ="
(6 tokens, no BOS) for operands 0..99; target the sum as 3 digits then EOS. Generation samples at
most 4 new tokens with a batched KV cache (all prompts have length 6, so the rows step in lockstep;
finished rows keep stepping and their tokens are discarded); a sample's valid tokens are its
generated tokens up to and including the first EOS. Reward +1 for the exact answer, else -1.

Model: GPT-2 style, 2 layers, d 64, 4 heads, tanh-GELU MLP 256, pre-LayerNorm, final LayerNorm,
learned positions (context 16), untied embeddings, head without bias; GPT-2's initialisation.

SFT: teacher-forced cross-entropy on the 4 answer tokens, Adam lr 1e-3, 64 fresh prompts a step;
every 20 steps 256 fresh prompts are sampled at temperature 1 and SFT stops at exact match >= 30 %
(at most --sft-max-steps steps).
RL: a round is 32 fresh prompts x G = 8 samples at temperature 1; advantage (R - mean_g) /
(std_g + 1e-6) (unbiased std); the trained groups are split into 2 contiguous mini-batches of whole
groups, one Adam step each (lr 1e-4, fresh state, grad-norm clip 1.0); PPO-clip with
r = exp(clamp(l - l_old, +-20)).
  grpo: eps 0.2/0.2, no dual clip, seq-mean-token-mean, one round.
  dapo: eps 0.2/0.28, dual clip 10, token-mean, dynamic sampling (drop groups whose rewards are all
        equal, up to 3 rounds until 32 groups are kept; keep the first 32 in generation order).
Evaluation: 1000 fixed prompts per seed, sampled (temperature 1) and greedy, after SFT and after RL.

Usage: /usr/bin/python3 benchmarks/peers/rl_trainer_torch.py [--mode dapo|grpo] [--seed 0]
       [--rl-steps 150] [--sft-max-steps 2000] [--threads 1]
(Debian: apt-get install python3-torch). Ends with a line
RESULT s_per_rl_step=<f> s_per_sft_step=<f> acc_sft=<f> acc_rl=<f>  (accuracies: sampled, eval set).
"""
import argparse
import math
import time

import torch
import torch.nn as tnn
import torch.nn.functional as F

PLUS, EQ, EOS, PAD, VOCAB = 10, 11, 12, 13, 14
PROMPT, NEW = 6, 4


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

    def forward(self, x, mask, cache):
        b, t, d = x.shape
        h = self.heads
        y = self.ln1(x)
        q = self.q(y).view(b, t, h, d // h).transpose(1, 2)
        k = self.k(y).view(b, t, h, d // h).transpose(1, 2)
        v = self.v(y).view(b, t, h, d // h).transpose(1, 2)
        if cache is not None:  # KV cache: append this call's keys and values
            if "k" in cache:
                k = torch.cat([cache["k"], k], dim=2)
                v = torch.cat([cache["v"], v], dim=2)
            cache["k"], cache["v"] = k, v
        s = torch.matmul(q, k.transpose(-2, -1)) * (1.0 / math.sqrt(d // h))
        s = s.masked_fill(mask, float("-inf"))
        a = torch.matmul(torch.softmax(s, dim=-1), v).transpose(1, 2).reshape(b, t, d)
        x = x + self.o(a)
        x = x + self.proj(F.gelu(self.fc(self.ln2(x)), approximate="tanh"))
        return x


class GPT(tnn.Module):
    def __init__(self, vocab=VOCAB, context=16, d=64, heads=4, layers=2, hidden=256):
        super().__init__()
        self.wte = tnn.Embedding(vocab, d)
        self.wpe = tnn.Embedding(context, d)
        self.blocks = tnn.ModuleList(Block(d, heads, hidden, layers) for _ in range(layers))
        self.lnf = tnn.LayerNorm(d, eps=1e-5)
        self.head = tnn.Linear(d, vocab, bias=False)
        for emb in (self.wte, self.wpe):
            tnn.init.normal_(emb.weight, 0.0, 0.02)
        tnn.init.normal_(self.head.weight, 0.0, 0.02)

    def forward(self, tokens, caches=None, pos0=0):
        """Logits for tokens at positions pos0.. ; with caches (one dict per block) keys and
        values of earlier calls are attended to and this call's are appended."""
        t = tokens.shape[1]
        pos = torch.arange(pos0, pos0 + t)
        mask = torch.arange(pos0 + t)[None, :] > pos[:, None]  # causal over all keys so far
        x = self.wte(tokens) + self.wpe(pos)
        for i, blk in enumerate(self.blocks):
            x = blk(x, mask, None if caches is None else caches[i])
        return self.head(self.lnf(x))


def make_prompts(n):
    a, b = torch.randint(0, 100, (n,)), torch.randint(0, 100, (n,))
    prompts = torch.stack([a // 10, a % 10, torch.full_like(a, PLUS), b // 10, b % 10,
                           torch.full_like(a, EQ)], dim=1)
    s = a + b
    targets = torch.stack([s // 100, s // 10 % 10, s % 10, torch.full_like(s, EOS)], dim=1)
    return prompts, targets


@torch.no_grad()
def generate(model, prompts, greedy=False):
    """Up to 4 tokens per row, temperature 1 (or argmax). Returns the tokens (PAD where never
    generated), the sampling policy's log-probs of them, per-token entropies and the valid mask."""
    b = prompts.shape[0]
    caches = [{} for _ in model.blocks]
    logits = model(prompts, caches, 0)[:, -1]
    toks, lps, ents = [], [], []
    done = torch.zeros(b, dtype=torch.bool)
    for step in range(NEW):
        logp = torch.log_softmax(logits, dim=-1)
        tok = logp.argmax(-1) if greedy else torch.multinomial(logp.exp(), 1).squeeze(1)
        toks.append(tok)
        lps.append(logp.gather(1, tok[:, None]).squeeze(1))
        ents.append(-(logp.exp() * logp).sum(-1))
        done |= tok == EOS
        if step == NEW - 1 or bool(done.all()):
            break
        logits = model(tok[:, None], caches, PROMPT + step)[:, -1]
    gen = torch.full((b, NEW), PAD, dtype=torch.long)
    old_lp, ent = torch.zeros(b, NEW), torch.zeros(b, NEW)
    n = len(toks)
    gen[:, :n], old_lp[:, :n], ent[:, :n] = (torch.stack(x, 1) for x in (toks, lps, ents))
    eos = gen == EOS
    valid = (torch.cumsum(eos.long(), 1) - eos.long()) == 0  # up to and including first EOS
    valid[:, n:] = False
    return gen, old_lp, ent, valid


def rewards(gen, targets):
    # The exact answer is 3 digits then EOS, so it matches iff all 4 generated tokens match.
    return (gen == targets).all(1).float() * 2 - 1


def accuracy(model, prompts, targets, greedy):
    return (rewards(generate(model, prompts, greedy)[0], targets) > 0).float().mean().item()


def answer_logits(model, prompts, answer):
    """Teacher-forced logits predicting the 4 answer tokens: (B, 4, V)."""
    seq = torch.cat([prompts, answer[:, :NEW - 1]], dim=1)
    return model(seq)[:, PROMPT - 1:]


MODES = {
    "grpo": dict(eps_low=0.2, eps_high=0.2, dual_clip=None, agg="seq-mean-token-mean", rounds=1),
    "dapo": dict(eps_low=0.2, eps_high=0.28, dual_clip=10.0, agg="token-mean", rounds=3),
}


def policy_loss(model, prompts, gen, old_lp, valid, adv, cfg):
    logp = torch.log_softmax(answer_logits(model, prompts, gen), dim=-1)
    lp = logp.gather(2, gen[:, :, None]).squeeze(2)
    r = torch.exp(torch.clamp(lp - old_lp, -20.0, 20.0))
    a = adv[:, None]
    loss = torch.max(-a * r, -a * torch.clamp(r, 1 - cfg["eps_low"], 1 + cfg["eps_high"]))
    if cfg["dual_clip"] is not None:
        loss = torch.where(a < 0, torch.min(loss, -a * cfg["dual_clip"]), loss)
    m = valid.float()
    if cfg["agg"] == "token-mean":
        return (loss * m).sum() / m.sum()
    return ((loss * m).sum(1) / m.sum(1)).mean()  # seq-mean-token-mean


def rl_step(model, opt, cfg, n_groups=32, g=8):
    """One RL step: sample round(s), compute advantages, 2 mini-batch Adam steps."""
    kept, n_samples, rew_all, ent_sum, ent_cnt = [], 0, [], 0.0, 0
    for _ in range(cfg["rounds"]):
        prompts, targets = make_prompts(n_groups)
        prompts, targets = prompts.repeat_interleave(g, 0), targets.repeat_interleave(g, 0)
        gen, old_lp, ent, valid = generate(model, prompts)
        rew = rewards(gen, targets)
        n_samples += gen.shape[0]
        rew_all.append(rew)
        ent_sum += (ent * valid).sum().item()
        ent_cnt += int(valid.sum())
        rg = rew.view(n_groups, g)
        adv = ((rg - rg.mean(1, keepdim=True)) / (rg.std(1, keepdim=True) + 1e-6)).view(-1)
        for i in range(n_groups):
            if cfg["rounds"] == 1 or bool(rg[i].max() > rg[i].min()):  # dapo: drop flat groups
                sl = slice(i * g, (i + 1) * g)
                kept.append((prompts[sl], gen[sl], old_lp[sl], valid[sl], adv[sl]))
        if len(kept) >= n_groups:
            break
    kept = kept[:n_groups]
    half = (len(kept) + 1) // 2
    for mb in (kept[:half], kept[half:]):
        if not mb:
            continue
        p, gn, olp, v, a = (torch.cat(x, 0) for x in zip(*mb))
        opt.zero_grad(set_to_none=False)
        policy_loss(model, p, gn, olp, v, a, cfg).backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
    rew = torch.cat(rew_all)
    return rew.mean().item(), (rew > 0).float().mean().item(), ent_sum / max(ent_cnt, 1), \
        n_samples, len(kept)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--mode", choices=sorted(MODES), default="dapo")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--rl-steps", type=int, default=150)
    ap.add_argument("--sft-max-steps", type=int, default=2000)
    ap.add_argument("--threads", type=int, default=1)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    cfg = MODES[args.mode]
    print(f"torch {torch.__version__}, {torch.get_num_threads()} thread(s), mode {args.mode}, "
          f"seed {args.seed}")
    eval_prompts, eval_targets = make_prompts(1000)
    model = GPT()

    def evaluate(tag):
        s = accuracy(model, eval_prompts, eval_targets, greedy=False)
        g = accuracy(model, eval_prompts, eval_targets, greedy=True)
        print(f"{tag}: eval accuracy sampled {s:.3f} greedy {g:.3f}")
        return s

    # SFT warm start. The timed part of a step is the batch, forward, backward and Adam step; the
    # check every 20 steps is not timed.
    opt = torch.optim.Adam(model.parameters(), lr=1e-3, betas=(0.9, 0.999), eps=1e-8,
                           foreach=False)
    sft_time, sft_steps = 0.0, 0
    for step in range(1, args.sft_max_steps + 1):
        t0 = time.perf_counter()
        prompts, targets = make_prompts(64)
        logits = answer_logits(model, prompts, targets)
        loss = F.cross_entropy(logits.reshape(-1, VOCAB), targets.reshape(-1))
        opt.zero_grad(set_to_none=False)
        loss.backward()
        opt.step()
        sft_time += time.perf_counter() - t0
        sft_steps = step
        if step % 20 == 0:
            acc = accuracy(model, *make_prompts(256), greedy=False)
            print(f"sft step {step:5d} loss {loss.item():.4f} sampled exact match {acc:.3f}")
            if acc >= 0.3:
                break
    print(f"SFT: {sft_steps} steps, {sft_time / sft_steps * 1e3:.3f} ms/step")
    acc_sft = evaluate("after SFT")

    # RL with a fresh Adam.
    opt = torch.optim.Adam(model.parameters(), lr=1e-4, betas=(0.9, 0.999), eps=1e-8,
                           foreach=False)
    rl_time = 0.0
    for step in range(1, args.rl_steps + 1):
        t0 = time.perf_counter()
        mean_r, acc, ent, n, kept = rl_step(model, opt, cfg)
        dt = time.perf_counter() - t0
        rl_time += dt
        print(f"rl step {step:4d} reward {mean_r:+.3f} acc {acc:.3f} entropy {ent:.4f} "
              f"samples {n:4d} groups {kept:2d} s/step {dt:.4f}")
    acc_rl = evaluate("after RL")
    s_rl = rl_time / max(args.rl_steps, 1)
    s_sft = sft_time / sft_steps
    print(f"mean s/step: SFT {s_sft:.6f}  RL {s_rl:.6f}")
    print(f"RESULT s_per_rl_step={s_rl:.6f} s_per_sft_step={s_sft:.6f} acc_sft={acc_sft:.4f} "
          f"acc_rl={acc_rl:.4f}")


if __name__ == "__main__":
    main()
