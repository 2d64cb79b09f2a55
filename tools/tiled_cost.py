"""Where the tiled NumPy backend's time goes, against torch's fused SDPA, on one thread.

Runs the real problem, (B, H, T, d) = (1, heads, T, d) in float32, four ways, in
turns with SDPA so that a change of load hits them all alike:

- ``tiled``: the backend itself (``attnlib.backends.tiled.forward``);
- ``products``: the same loop over blocks doing only its two matrix products,
  ``q_blk @ k_blk.T`` and ``p @ v_blk`` (not attention: a floor, not a result);
- ``products + exp``: the two products and ``np.exp`` of every score;
- ``+ max, subtract``: also the row maximum and its subtraction.

Each is printed as its median time over SDPA's median. The steps that are left
out cannot be made free, so no NumPy version of the loop can beat the
``products + exp`` row: NumPy runs each step as its own pass over the scores,
while SDPA's C++ loop fuses them.

    .venv/bin/python tools/tiled_cost.py [--T 4096] [--heads 8] [--d 64] [--rounds 9]
"""

import argparse
import time

import numpy as np
import torch
from threadpoolctl import threadpool_limits

from attnlib.backends import tiled


def block_loop(q, k, v, steps, block=tiled.BLOCK_SIZE):
    """The tiled loop over (head, query block, key block) doing only ``steps``."""
    scores = np.empty((block, block), dtype=q.dtype)
    for h in range(q.shape[1]):
        for i0 in range(0, q.shape[2], block):
            q_blk = q[0, h, i0:i0 + block]
            acc = np.zeros((q_blk.shape[0], v.shape[-1]), dtype=q.dtype)
            for j0 in range(0, k.shape[2], block):
                s = np.matmul(q_blk, k[0, h, j0:j0 + block].T, out=scores)
                if "max" in steps:
                    m = s.max(axis=-1)
                    np.subtract(s, m[:, None], out=s)
                if "exp" in steps:
                    np.exp(s, out=s)
                acc += s @ v[0, h, j0:j0 + block]
    return acc


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--T", type=int, default=4096)
    parser.add_argument("--heads", type=int, default=8)
    parser.add_argument("--d", type=int, default=64)
    parser.add_argument("--rounds", type=int, default=9)
    args = parser.parse_args()
    if args.T % tiled.BLOCK_SIZE:
        parser.error(f"--T must be a multiple of the block size, {tiled.BLOCK_SIZE}")
    torch.set_num_threads(1)
    rng = np.random.default_rng(0)
    q, k, v = (rng.standard_normal((1, args.heads, args.T, args.d), dtype=np.float32) for _ in range(3))
    scale = np.float32(args.d**-0.5)
    q_scaled = q * scale
    tq, tk, tv = (torch.from_numpy(x) for x in (q, k, v))
    runs = {
        "torch SDPA": lambda: torch.nn.functional.scaled_dot_product_attention(tq, tk, tv),
        "tiled": lambda: tiled.forward(q, k, v, None, None, float(scale), workers=1),
        "products": lambda: block_loop(q_scaled, k, v, ()),
        "products + exp": lambda: block_loop(q_scaled, k, v, ("exp",)),
        "+ max, subtract": lambda: block_loop(q_scaled, k, v, ("exp", "max")),
    }
    times = {name: [] for name in runs}
    with threadpool_limits(1):
        for fn in runs.values():
            fn()  # warm-up
        for r in range(args.rounds):
            names = list(runs)
            for name in names[r % len(names):] + names[:r % len(names)]:  # rotate the order
                start = time.perf_counter()
                runs[name]()
                times[name].append(time.perf_counter() - start)
    median = {name: float(np.median(t)) for name, t in times.items()}
    print(f"one thread, float32, (B, H, T, d) = (1, {args.heads}, {args.T}, {args.d}), "
          f"blocks of {tiled.BLOCK_SIZE}, {args.rounds} rounds")
    print(f"{'run':<18}{'median ms':>11}{'/ SDPA':>9}{'IQR / median':>14}")
    for name, value in median.items():
        q25, q75 = np.percentile(times[name], [25, 75])
        print(f"{name:<18}{value * 1e3:>11.1f}{value / median['torch SDPA']:>9.2f}"
              f"{(q75 - q25) / value:>14.2f}")


if __name__ == "__main__":
    main()
