"""Forward and gradients of the Triton kernels on ragged shapes, against SDPA in float64.

Usage: python tools/gpu_check.py OUT.csv [--dry-run]

For fp16 and bf16, d = 64 and 128, no mask or causal in both alignments, and
shapes whose T_q and T_k are not multiples of any tile (and differ), runs
``attnlib.attention(..., backend="triton")`` forward and backward and
compares the output and dq, dk, dv with SDPA's math kernel in float64 on the
same inputs. ``triton-simple`` is checked forward. Each case is one line of
OUT.csv, written as soon as it is measured. The error is
``max |got - expected| / max(1, max |expected|)``; a case fails above the
benchmark's tolerance for its dtype (attnlib.bench.kernels.CHECK_TOLERANCE).
Exits 1 if any case fails. ``--dry-run`` lists the cases without running them
(no GPU needed).
"""

import csv
import itertools
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

SHAPES = [(1, 1), (17, 33), (100, 1000), (1000, 100), (777, 777), (4097, 4097), (2049, 130)]
CASES = list(itertools.product(["float16", "bfloat16"], [64, 128], [None, "top-left", "bottom-right"], SHAPES))


def reference(q, k, v, causal, d_out):
    """Float64 output and gradients from SDPA's math kernel, with an explicit mask for either alignment."""
    import torch
    from torch.nn.attention import SDPBackend, sdpa_kernel

    from attnlib.masks import causal_offset

    leaves = [x.detach().double().requires_grad_() for x in (q, k, v)]
    mask = None
    if causal:
        t_q, t_k = q.shape[-2], k.shape[-2]
        offset = causal_offset(t_q, t_k, causal)
        rows = torch.arange(t_q, device=q.device)[:, None]
        mask = torch.arange(t_k, device=q.device)[None, :] <= rows + offset  # True = may attend
    with sdpa_kernel(SDPBackend.MATH), torch.enable_grad():
        out = torch.nn.functional.scaled_dot_product_attention(*leaves, attn_mask=mask)
        grads = torch.autograd.grad(out, leaves, d_out.double())
    return [out.detach(), *grads]


def relative_error(got, want):
    return float((got.double() - want).abs().max()) / max(1.0, float(want.abs().max()))


def run_case(dtype_name, d, causal, t_q, t_k):
    import torch

    import attnlib

    dtype = getattr(torch, dtype_name)
    generator = torch.Generator(device="cuda").manual_seed(t_q * 1000 + t_k)
    q = torch.randn((2, 3, t_q, d), generator=generator, device="cuda", dtype=dtype)
    k, v = (torch.randn((2, 3, t_k, d), generator=generator, device="cuda", dtype=dtype) for _ in range(2))
    d_out = torch.randn((2, 3, t_q, d), generator=generator, device="cuda", dtype=dtype)
    expected = reference(q, k, v, causal, d_out)
    leaves = [x.detach().requires_grad_() for x in (q, k, v)]
    out = attnlib.attention(*leaves, causal=causal or False, backend="triton")
    grads = torch.autograd.grad(out, leaves, d_out)
    errors = {name: relative_error(got, want)
              for name, got, want in zip(("out", "dq", "dk", "dv"), [out, *grads], expected)}
    if not (causal == "bottom-right" and t_q > t_k):
        simple = attnlib.attention(q, k, v, causal=causal or False, backend="triton-simple")
        errors["simple_out"] = relative_error(simple, expected[0])
    return errors


def main(argv):
    dry_run = "--dry-run" in argv
    paths = [a for a in argv if not a.startswith("--")]
    if len(paths) != 1:
        print(__doc__, file=sys.stderr)
        return 2
    cases = [c for c in CASES if not (c[2] == "bottom-right" and c[3][0] > c[3][1])]
    if dry_run:
        for dtype, d, causal, (t_q, t_k) in cases:
            print(f"would check {dtype} d={d} causal={causal} T_q={t_q} T_k={t_k}")
        print(f"{len(cases)} cases")
        return 0
    from attnlib.bench.kernels import CHECK_TOLERANCE

    failed = 0
    out_path = Path(paths[0])
    out_path.parent.mkdir(parents=True, exist_ok=True)
    columns = ["dtype", "d", "causal", "T_q", "T_k", "out", "dq", "dk", "dv", "simple_out", "tolerance", "status"]
    with open(out_path, "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=columns)
        writer.writeheader()
        for dtype, d, causal, (t_q, t_k) in cases:
            try:
                errors = run_case(dtype, d, causal, t_q, t_k)
                worst = max(errors.values())
                status = "ok" if worst <= CHECK_TOLERANCE[dtype] else "FAIL"
            except Exception as exc:  # noqa: BLE001 - record and go on
                errors, status = {}, f"error: {type(exc).__name__}: {str(exc).splitlines()[0][:200]}"
            failed += status != "ok"
            row = {"dtype": dtype, "d": d, "causal": causal, "T_q": t_q, "T_k": t_k,
                   "tolerance": CHECK_TOLERANCE[dtype], "status": status,
                   **{name: f"{value:.2e}" for name, value in errors.items()}}
            writer.writerow(row)
            f.flush()
            print(" ".join(f"{key}={value}" for key, value in row.items()), flush=True)
    print(f"{len(cases)} cases, {failed} failed")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
