#!/usr/bin/python3
"""PyTorch's explicit attention on the CPU, timed on the shapes of benchmarks/attention.bench.cpp.

Explicit attention is the textbook composition with autograd: S = (Q Kᵀ)·τ (+ causal mask),
P = softmax(S), O = P V; forward+backward runs O.backward(dO). It materialises the [S, S]
matrices, which is what weft's flash kernel avoids. GFLOP/s use the same convention as the
C++ benchmark: forward 4·S²·H·D, forward+backward 3.5× that, halved when causal.

Usage: /usr/bin/python3 benchmarks/peers/attention_torch.py [--threads 1] [--heads 4] [--repeat 3]
(Debian: apt-get install python3-torch). Prints one line per shape, like bm_flash's names.
"""
import argparse
import math
import time

import torch


def explicit_attention(q, k, v, causal):
    # q, k, v: [B, H, S, D]
    scale = 1.0 / math.sqrt(q.shape[-1])
    s = torch.matmul(q, k.transpose(-2, -1)) * scale
    if causal:
        n = s.shape[-1]
        mask = torch.ones(n, n, dtype=torch.bool).triu(1)
        s = s.masked_fill(mask, float("-inf"))
    p = torch.softmax(s, dim=-1)
    return torch.matmul(p, v)


def best_time(fn, repeat, clock):
    fn()  # warm-up
    best = float("inf")
    for _ in range(repeat):
        t0 = clock()
        fn()
        best = min(best, clock() - t0)
    return best


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--heads", type=int, default=4)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--seqs", type=int, nargs="*", default=[2048, 4096, 8192])
    ap.add_argument("--dims", type=int, nargs="*", default=[64, 128])
    ap.add_argument("--cpu-time", action="store_true",
                    help="time with the process CPU clock (as the C++ benchmark's single-threaded "
                         "cases; use with --threads 1 on a shared machine)")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    h = args.heads
    print(f"torch {torch.__version__}, {args.threads} thread(s), H = {h}, f32, "
          f"{'CPU' if args.cpu_time else 'wall'} time")
    for s in args.seqs:
        for d in args.dims:
            for causal in (False, True):
                q = torch.randn(1, h, s, d, requires_grad=True)
                k = torch.randn(1, h, s, d, requires_grad=True)
                v = torch.randn(1, h, s, d, requires_grad=True)
                do = torch.randn(1, h, s, d)
                fwd_flop = 4.0 * s * s * h * d * (0.5 if causal else 1.0)

                def fwd():
                    with torch.no_grad():
                        explicit_attention(q, k, v, causal)

                def fwd_bwd():
                    q.grad = k.grad = v.grad = None
                    explicit_attention(q, k, v, causal).backward(do)

                clock = time.process_time if args.cpu_time else time.perf_counter
                tf = best_time(fwd, args.repeat, clock)
                tb = best_time(fwd_bwd, args.repeat, clock)
                print(f"explicit S:{s}/d:{d}/causal:{int(causal)}  fwd {tf * 1e3:8.1f} ms "
                      f"{fwd_flop / tf * 1e-9:6.1f} GFLOP/s   fwd+bwd {tb * 1e3:8.1f} ms "
                      f"{3.5 * fwd_flop / tb * 1e-9:6.1f} GFLOP/s", flush=True)


if __name__ == "__main__":
    main()
