"""Which dK/dV tile should the Triton backward offer at head dim 128? An A/B on one GPU.

The sm_90 check with Triton 3.9's ptxas found the dK/dV tile 32x64 (4 warps, 3 stages)
spilling 8-64 bytes at causal d = 128, so its head-dim limit was lowered to 64 and
autotuning at d = 128 now picks 32x128 (8 warps). Triton 3.6, which the GPU machines run,
compiled 32x64 clean. This script times forward + backward at B=4, H=32, d=128, fp16 with
the forward and dQ tiles fixed and each candidate dK/dV tile, interleaved round by round,
against SDPA's flash backend in the same rounds, and checks the gradients first.

    python tools/gpu_dkdv_tiles.py OUT.csv [--rounds 5]

Each row: tile, T, causal, median ms over rounds (each round one triton.testing.do_bench
median), the spread of the rounds, and the ratio to SDPA-flash's median.
"""
import argparse
import csv
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

CANDIDATES = {  # the dK/dV tiles that compile at d = 128 under some ptxas
    "32x64 w4 s3": {"BLOCK_M": 32, "BLOCK_N": 64, "num_warps": 4, "num_stages": 3},
    "32x128 w8 s3": {"BLOCK_M": 32, "BLOCK_N": 128, "num_warps": 8, "num_stages": 3},
    "64x128 w8 s2": {"BLOCK_M": 64, "BLOCK_N": 128, "num_warps": 8, "num_stages": 2},
}
FWD = {"BLOCK_M": 64, "BLOCK_N": 64, "num_warps": 4, "num_stages": 3}
DQ = {"BLOCK_M": 64, "BLOCK_N": 32, "num_warps": 4, "num_stages": 3}


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("output")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--seq-lens", default="4096,16384")
    args = parser.parse_args()

    import torch
    import triton
    from torch.nn.attention import SDPBackend, sdpa_kernel
    from triton.testing import do_bench

    from attnlib.backends import triton_backward

    if not torch.cuda.is_available():
        sys.exit("gpu_dkdv_tiles.py needs a CUDA GPU")
    rows = []
    for t in map(int, args.seq_lens.split(",")):
        for causal in (False, True):
            torch.manual_seed(0)
            q, k, v, d_out = (torch.randn(4, 32, t, 128, device="cuda", dtype=torch.float16) for _ in range(4))
            scale = 128 ** -0.5

            def sdpa():
                leaves = [x.detach().requires_grad_() for x in (q, k, v)]
                with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
                    out = torch.nn.functional.scaled_dot_product_attention(*leaves, is_causal=causal)
                out.backward(d_out)
                return [x.grad for x in leaves]

            runs = {"sdpa-flash": sdpa}
            for name, tile in CANDIDATES.items():
                tiles = {"fwd": FWD, "dq": DQ, "dkdv": tile}
                runs[name] = (lambda tiles=tiles: triton_backward.backward(q, k, v, d_out, None, causal, scale,
                                                                           tiles=tiles))
            reference = sdpa()
            errors = {}
            for name, fn in list(runs.items()):
                try:
                    grads = fn()
                    errors[name] = max((g.float() - r.float()).abs().max().item()
                                       for g, r in zip(grads, reference))
                except Exception as error:  # a tile that does not compile or fit: reported, not timed
                    print(f"T={t} causal={causal} {name}: {type(error).__name__}: {error}"[:300], flush=True)
                    del runs[name]
            times = {name: [] for name in runs}
            for _ in range(args.rounds):
                for name, fn in runs.items():
                    times[name].append(do_bench(fn, warmup=25, rep=100))
            base = statistics.median(times["sdpa-flash"])
            for name, ts in times.items():
                row = {"tile": name, "T": t, "causal": causal, "median_ms": round(statistics.median(ts), 4),
                       "min_ms": round(min(ts), 4), "max_ms": round(max(ts), 4),
                       "over_sdpa_flash_time": round(statistics.median(ts) / base, 4),
                       "max_grad_error_vs_sdpa_flash": errors[name],
                       "device": torch.cuda.get_device_name(), "torch": torch.__version__,
                       "triton": triton.__version__}
                rows.append(row)
                print(row, flush=True)
            with open(args.output, "w", newline="") as f:  # rewritten after each shape
                writer = csv.DictWriter(f, fieldnames=list(rows[0]))
                writer.writeheader()
                writer.writerows(rows)


if __name__ == "__main__":
    main()
