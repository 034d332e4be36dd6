#!/usr/bin/env python3
"""PyTorch's scaled_dot_product_attention at the shapes of benchmarks/cuda/flash.bench.cu, the peer
figure for weft's CUDA flash attention (issue 14). bf16, [B, S, H, D] inputs transposed to PyTorch's
[B, H, S, D]; each backend that PyTorch offers on this GPU (FlashAttention-2, cuDNN, efficient);
CUDA-event timing, median of 20 after 5 warm-ups. FLOPs as weft's benchmark counts them: forward
4*B*H*S*S*D (half when causal), backward 2.5x the forward. Prints one line per case:
  sdpa <backend> <fwd|bwd> B=.. S=.. H=.. D=.. causal=.. ms=.. TFLOP/s=..
Run on the GPU machine: python3 benchmarks/peers/sdpa_bench.py
"""
import statistics
import sys

import torch
from torch.nn.attention import SDPBackend, sdpa_kernel
import torch.nn.functional as F

SHAPES = [(4, 4096, 16, 128, True), (4, 4096, 16, 128, False), (4, 4096, 16, 64, True),
          (4, 4096, 16, 64, False)]
BACKENDS = [("flash", SDPBackend.FLASH_ATTENTION), ("cudnn", SDPBackend.CUDNN_ATTENTION),
            ("efficient", SDPBackend.EFFICIENT_ATTENTION)]


def timed(fn, reps=20, warm=5):
    for _ in range(warm):
        fn()
    torch.cuda.synchronize()
    out = []
    for _ in range(reps):
        a = torch.cuda.Event(enable_timing=True)
        b = torch.cuda.Event(enable_timing=True)
        a.record()
        fn()
        b.record()
        b.synchronize()
        out.append(a.elapsed_time(b))
    return statistics.median(out)


def main():
    if not torch.cuda.is_available():
        print("sdpa: no GPU")
        return 1
    print("sdpa: torch", torch.__version__, "on", torch.cuda.get_device_name(0), flush=True)
    for (B, S, H, D, causal) in SHAPES:
        q, k, v = (torch.randn(B, H, S, D, device="cuda", dtype=torch.bfloat16, requires_grad=True)
                   for _ in range(3))
        do = torch.randn(B, H, S, D, device="cuda", dtype=torch.bfloat16)
        flops = 4.0 * B * H * S * S * D * (0.5 if causal else 1.0)
        for name, be in BACKENDS:
            try:
                with sdpa_kernel([be]):
                    o = F.scaled_dot_product_attention(q, k, v, is_causal=causal)
                    fwd = timed(lambda: F.scaled_dot_product_attention(q, k, v, is_causal=causal))

                    def bwd():
                        q.grad = k.grad = v.grad = None
                        o.backward(do, retain_graph=True)

                    o = F.scaled_dot_product_attention(q, k, v, is_causal=causal)
                    bwd_ms = timed(bwd)
            except Exception as e:  # a backend this GPU or build does not offer
                print(f"sdpa {name} unavailable B={B} S={S} H={H} D={D} causal={causal}: "
                      f"{type(e).__name__}", flush=True)
                continue
            for kind, ms, f in (("fwd", fwd, flops), ("bwd", bwd_ms, 2.5 * flops)):
                print(f"sdpa {name} {kind} B={B} S={S} H={H} D={D} causal={int(causal)} "
                      f"ms={ms:.3f} TFLOP/s={f / ms * 1e-9:.1f}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
