"""Where the tiled NumPy backend's time goes, per score, against torch's fused SDPA.

Times each step of one (query block x key block) iteration of
``attnlib.backends.tiled._attend_query_block`` on its own, in turns with
SDPA over the whole problem, all on one thread, and prints nanoseconds per
score. The sum of the two matrix products and the exp is a floor for any
NumPy version of the loop: each is already one library call at full speed.

    .venv/bin/python tools/tiled_cost.py [--T 4096] [--heads 8] [--d 64] [--block 1024] [--rounds 15]
"""

import argparse
import time

import numpy as np
import torch
from threadpoolctl import threadpool_limits


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--T", type=int, default=4096)
    parser.add_argument("--heads", type=int, default=8)
    parser.add_argument("--d", type=int, default=64)
    parser.add_argument("--block", type=int, default=1024)
    parser.add_argument("--rounds", type=int, default=15)
    args = parser.parse_args()
    torch.set_num_threads(1)
    rng = np.random.default_rng(0)
    n, d = args.block, args.d
    q = rng.standard_normal((n, d), dtype=np.float32) * np.float32(d**-0.5)
    k = rng.standard_normal((n, d), dtype=np.float32)
    v = rng.standard_normal((n, d), dtype=np.float32)
    s = np.empty((n, n), dtype=np.float32)
    np.matmul(q, k.T, out=s)
    m = s.max(axis=-1)
    assert q.dtype == s.dtype == m.dtype == np.float32
    p = np.exp(s - m[:, None])
    ones = np.ones(n, dtype=np.float32)
    work = np.empty_like(s)
    steps = {  # each as the backend does it, on one block of n x n scores
        "scores q @ k.T": lambda: np.matmul(q, k.T, out=work),
        "row max": lambda: s.max(axis=-1),
        "subtract max": lambda: np.subtract(s, m[:, None], out=work),
        "exp": lambda: np.exp(s, out=work),
        "row sum (p @ ones)": lambda: p @ ones,
        "p @ v": lambda: p @ v,
    }
    big = [torch.randn(1, args.heads, args.T, d) for _ in range(3)]
    sdpa = lambda: torch.nn.functional.scaled_dot_product_attention(*big)  # noqa: E731
    per_score = {name: [] for name in [*steps, "torch SDPA (whole problem)"]}
    with threadpool_limits(1):
        for fn in [*steps.values(), sdpa]:
            fn()
        for _ in range(args.rounds):  # in turns, so a change of load hits every step alike
            for name, fn in steps.items():
                start = time.perf_counter()
                fn()
                per_score[name].append((time.perf_counter() - start) / n**2 * 1e9)
            start = time.perf_counter()
            sdpa()
            per_score["torch SDPA (whole problem)"].append(
                (time.perf_counter() - start) / (args.heads * args.T**2) * 1e9)
    median = {name: float(np.median(times)) for name, times in per_score.items()}
    reference = median.pop("torch SDPA (whole problem)")
    print(f"one thread, float32, block {n} x {n}, d = {d}; SDPA at (1, {args.heads}, {args.T}, {d})")
    print(f"{'step':<28}{'ns per score':>14}{'/ SDPA':>9}")
    for name, value in median.items():
        print(f"{name:<28}{value:>14.3f}{value / reference:>9.2f}")
    floor = median["scores q @ k.T"] + median["p @ v"] + median["exp"]
    total = sum(median.values())
    print(f"{'torch SDPA, all of it':<28}{reference:>14.3f}{1:>9.2f}")
    print(f"{'floor: 2 products + exp':<28}{floor:>14.3f}{floor / reference:>9.2f}")
    print(f"{'sum of the steps':<28}{total:>14.3f}{total / reference:>9.2f}")


if __name__ == "__main__":
    main()
