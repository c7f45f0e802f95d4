#!/usr/bin/env python3
"""The anchor of bench/gpu/run.sh: PyTorch's scaled_dot_product_attention on the shapes of
bench_cuda_attention (B = 2, S = 8192 or 2048 with --quick, H = 16, D = 128, bf16, the
[batch, seq, heads, dim] layout that baton takes), through the flash and the cuDNN backends,
full and causal, forward and forward+backward, timed with CUDA events on the same GPU.

Prints, per backend and mask (TAG = S<seq>_D128_bf16[_causal]):
  torch_<backend>_fwd_ms_<TAG>:     median (min, max, n) of one forward
  torch_<backend>_fwdbwd_ms_<TAG>:  of one forward followed by its backward
and a `SKIPPED_<backend>_<TAG>: reason` line where a backend refuses the case. run.sh divides
these times by baton's (cuda_fwd_ms_<TAG>, cuda_bwd_ms_<TAG>).
"""
import statistics
import sys

import torch
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.nn.functional import scaled_dot_product_attention


def timed(fn, reps):
    start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    for _ in range(2):
        fn()
    torch.cuda.synchronize()
    samples = []
    for _ in range(reps):
        start.record()
        fn()
        stop.record()
        stop.synchronize()
        samples.append(start.elapsed_time(stop))
    return samples


def show(name, samples):
    print(f"{name}: {statistics.median(samples):.4g} (min {min(samples):.4g}, max {max(samples):.4g}, n {len(samples)})",
          flush=True)


def main():
    quick = "--quick" in sys.argv
    batch, seq, heads, dim, reps = 2, 2048 if quick else 8192, 16, 128, 10
    print(f"device: {torch.cuda.get_device_name(0)}; torch {torch.__version__}", flush=True)
    gen = torch.Generator(device="cuda").manual_seed(1)

    def tensor():  # [batch, seq, heads, dim] storage seen as [batch, heads, seq, dim]
        return (torch.rand(batch, seq, heads, dim, device="cuda", dtype=torch.bfloat16, generator=gen) * 2 - 1).transpose(1, 2)

    q, k, v, dout = tensor(), tensor(), tensor(), tensor()
    qg, kg, vg = (t.detach().clone().requires_grad_(True) for t in (q, k, v))
    for backend, label in ((SDPBackend.FLASH_ATTENTION, "flash"), (SDPBackend.CUDNN_ATTENTION, "cudnn")):
        for causal in (False, True):
            tag = f"S{seq}_D{dim}_bf16" + ("_causal" if causal else "")
            try:
                with sdpa_kernel(backend):
                    show(f"torch_{label}_fwd_ms_{tag}",
                         timed(lambda: scaled_dot_product_attention(q, k, v, is_causal=causal), reps))

                    def forward_backward():
                        out = scaled_dot_product_attention(qg, kg, vg, is_causal=causal)
                        out.backward(dout)
                        qg.grad = kg.grad = vg.grad = None

                    show(f"torch_{label}_fwdbwd_ms_{tag}", timed(forward_backward, reps))
            except RuntimeError as e:  # a backend this GPU or build does not have
                print(f"SKIPPED_{label}_{tag}: {str(e).splitlines()[0][:200]}", flush=True)


if __name__ == "__main__":
    main()
