"""Compile every Triton attention kernel configuration for the H100 (sm_90), with no GPU.

``python -m attnlib.bench.sm90`` compiles each autotune configuration of the
three Triton kernels, ``_attn_fwd`` (:data:`~attnlib.backends.triton_flash.FWD_TILES`),
``_attn_bwd_dkdv`` and ``_attn_bwd_dq`` (:data:`~attnlib.backends.triton_backward.DKDV_TILES`,
``DQ_TILES``), ahead of time for ``GPUTarget("cuda", 90, 32)``, with the ``ptxas``
that the triton wheel bundles. No GPU and no CUDA driver are needed; the
variable ``TRITON_INTERPRET`` must be unset (under the interpreter there is
nothing to compile). Each configuration is compiled for fp16, bf16, fp32 with
exact products (``"ieee"``) and with TF32 (what ``--tf32 on`` gives the bench),
and fp64; at head dimensions 64 and 128; causal or not, with no mask; and the
fp16 configurations once more with a boolean mask. The arguments are those of
a (4, 32, 4096, d) call, contiguous, the bench's GPU shape, and go through the
JIT's own binder, so that the kernel is specialised (alignment, strides of 1)
as a real call would specialise it.

One row per configuration gives:

- ``regs``: registers per thread;
- ``spill``: bytes per thread of local memory (``LOCAL``/``STACK`` in
  ``cuobjdump --dump-resource-usage``); a Triton kernel has no local arrays, so
  any is a register spill;
- ``shared``: bytes of shared memory per block (the compiled kernel's
  ``metadata.shared``, which the launch checks) against the H100's 232,448
  (the 1 KB that ptxas reserves per block on sm_90 is not part of either);
- ``pick``: whether autotuning may pick the configuration for that dtype and
  head dimension (:func:`~attnlib.backends.triton_flash.usable_configs`).

The output ends with ``N configurations compiled for sm_90: S spill, M over
shared memory, F failed``. The exit status is 1 when a compile fails, or when a
configuration spills or needs more shared memory than the H100 has where it
must not (:func:`is_required`): where autotuning may pick it for fp16 or bf16
with no mask, and in the "fp32" and "any" tiles for each dtype they are offered to (exact
fp32 gets both, fp64 only "any").
Everything else is reported, not failed: the tensor-core tiles for exact fp32
and fp64 (they would run on the FMA units), a tile beyond its head-dim limit
(these rows show why the limits are where they are), the TF32 rows and the
boolean-mask rows. ``--required`` compiles only the configurations that must be
clean (what ``tests/test_sm90.py`` runs).

Supported Triton versions: 3.6 and 3.9. The script ran with 3.6.0 (the GPU
machine's, ptxas 12.8) when it was written and runs with 3.9.0 (ptxas 13.4,
which 3.9 uses for sm_90 too) in ``make test``; the tile limits in
``triton_flash.FWD_TILES`` and ``triton_backward.DKDV_TILES``/``DQ_TILES`` follow
3.9's ptxas, which spills where 3.6's did not. Besides public API (``triton.compile``, ``triton.compiler.ASTSource``,
``triton.backends.compiler.GPUTarget``, ``triton.knobs``), it uses the JIT's own
binder, which is internal: ``triton.compiler.make_backend``,
``triton.runtime.jit.create_function_from_signature`` and
``JITFunction._pack_args``, the same in both versions. Under another version
these may change; every compile then fails and is reported as failed, never
passed. Compiled kernels land in Triton's own cache (``~/.triton/cache`` or
``TRITON_CACHE_DIR``), none in the repository, so a second run takes seconds.
"""

import argparse
import contextlib
import multiprocessing
import os
import re
import subprocess
import sys
import tempfile
import time
import warnings
from dataclasses import dataclass

H100_SHARED_MEMORY = 232_448  # bytes of shared memory one block may use on sm_90
BATCH, HEADS, SEQ_LEN = 4, 32, 4096  # the shape whose strides and sizes the kernels see
HEAD_DIMS = (64, 128)
DTYPES = ("fp16", "bf16", "fp32-ieee", "fp32-tf32", "fp64")
HALF_DTYPES = ("fp16", "bf16")
NO_MASK, BOOL_MASK = 0, 1
KERNELS = {  # name -> (module, kernel, tile list)
    "fwd": ("attnlib.backends.triton_flash", "_attn_fwd", "FWD_TILES"),
    "dkdv": ("attnlib.backends.triton_backward", "_attn_bwd_dkdv", "DKDV_TILES"),
    "dq": ("attnlib.backends.triton_backward", "_attn_bwd_dq", "DQ_TILES"),
}
STRIDE_AXES = {"z": 0, "h": 1, "m": 2, "n": 2, "d": 3}  # stride_<tensor><axis> -> axis of (B, H, T, d)


@dataclass(frozen=True)
class Case:
    """One configuration to compile: a tile of one kernel for one dtype, head dim and mask."""

    kernel: str  # "fwd", "dkdv" or "dq"
    tile_index: int  # position in the kernel's tile list
    dtype: str  # one of DTYPES
    head_dim: int
    causal: bool
    mask_kind: int = NO_MASK


@dataclass
class Result:
    case: Case
    tile: str  # e.g. "128x64 w8 s3 (tc, d<=128)"
    pickable: bool  # autotuning may pick it
    kind: str  # "tc" (tensor-core dtypes only), "fp32" (and exact fp32) or "any" (fp64 too)
    registers: int = 0
    spill_bytes: int = 0
    shared_bytes: int = 0
    error: str = ""
    seconds: float = 0.0

    @property
    def spills(self):
        return not self.error and self.spill_bytes > 0

    @property
    def over_shared(self):
        return not self.error and self.shared_bytes > H100_SHARED_MEMORY

    @property
    def required(self):
        """Whether it must compile clean: see :func:`is_required`."""
        return is_required(self.case, self.pickable, self.kind)

    @property
    def fails(self):
        """A failed compile always fails the check; a spill or overflow only where it is required."""
        return bool(self.error) or (self.required and (self.spills or self.over_shared))


def is_required(case, pickable, kind):
    """Whether a spill or overflow in this configuration fails the check.

    It must be clean where autotuning may pick it with no mask, for fp16 and
    bf16, and for every dtype it is offered to if it is an "fp32" or "any" tile
    (exact fp32 and fp64 get only those). TF32 tensor-core tiles and the
    boolean-mask rows are reported: the tile lists hold one head-dim limit per
    tile for all tensor-core dtypes and every mask.
    """
    return pickable and case.mask_kind == NO_MASK and (case.dtype in HALF_DTYPES or kind in ("fp32", "any"))


def _tiles(kernel):
    import importlib

    module, _, tiles = KERNELS[kernel]
    return getattr(importlib.import_module(module), tiles)


def _kernel_function(kernel):
    import importlib

    module, name, _ = KERNELS[kernel]
    return getattr(importlib.import_module(module), name)


def tile_label(config, max_d, kind):
    """``"128x64 w8 s3 (tc, d<=128)"``: the tile, warps, stages, and where it is offered."""
    return (f"{config.kwargs['BLOCK_M']}x{config.kwargs['BLOCK_N']} w{config.num_warps} "
            f"s{config.num_stages} ({kind}, d<={max_d})")


@contextlib.contextmanager
def _tf32(enabled):
    """``torch.backends.cuda.matmul.allow_tf32`` set to ``enabled`` (what ``--tf32`` sets)."""
    import torch

    saved = torch.backends.cuda.matmul.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = enabled
    try:
        yield
    finally:
        torch.backends.cuda.matmul.allow_tf32 = saved


def _torch_dtype(dtype):
    import torch

    return {"fp16": torch.float16, "bf16": torch.bfloat16, "fp32-ieee": torch.float32,
            "fp32-tf32": torch.float32, "fp64": torch.float64}[dtype]


def kernel_dtypes(dtype):
    """``(UPCAST, ACC_DTYPE, DOT_PRECISION)`` as the library chooses them for ``dtype``."""
    from ..backends import triton_flash

    with _tf32(dtype == "fp32-tf32"):
        return triton_flash.kernel_dtypes(_torch_dtype(dtype))


def is_pickable(case):
    """Whether autotuning may pick ``case``'s tile for its dtype and head dimension."""
    from ..backends import triton_flash

    config = _tiles(case.kernel)[case.tile_index][0]
    _, acc_dtype, precision = kernel_dtypes(case.dtype)
    usable = triton_flash.usable_configs(_tiles(case.kernel), triton_flash.padded_head_dim(case.head_dim),
                                         triton_flash.uses_tensor_cores(acc_dtype, precision),
                                         fp64=case.dtype == "fp64")
    return any(config is c for c in usable)


def kernel_arguments(fn, case):
    """Every argument of kernel ``fn`` by name, as a (BATCH, HEADS, SEQ_LEN, d) call passes them.

    Tensors are one-element stand-ins of the right dtype: the binder reads only
    their dtype and alignment. Strides and sizes are those of contiguous
    (B, H, T, d) tensors; the mask, when there is one, a (T, T) boolean one.
    """
    import torch

    from ..backends import triton_flash

    config = _tiles(case.kernel)[case.tile_index][0]
    dtype = _torch_dtype(case.dtype)
    upcast, acc_dtype, precision = kernel_dtypes(case.dtype)
    stats_dtype = torch.float64 if dtype == torch.float64 else torch.float32  # lse and delta
    data = torch.empty(16, dtype=dtype)
    stats = torch.empty(16, dtype=stats_dtype)
    d = case.head_dim
    shape = (BATCH, HEADS, SEQ_LEN, d)
    strides = (HEADS * SEQ_LEN * d, SEQ_LEN * d, d, 1)
    if case.mask_kind == BOOL_MASK:  # a (T_q, T_k) mask broadcast over batch and heads, as uint8
        mask, mask_strides = torch.empty(16, dtype=torch.uint8), (0, 0, SEQ_LEN, 1)
    else:  # no mask: q stands in for the pointer, which is never read
        mask, mask_strides = data, (0, 0, 0, 0)
    scale = d ** -0.5
    qk_scale, scale = triton_flash.scale_arguments(dtype, "cpu", scale * triton_flash.LOG2_E, scale)
    values = {
        "Q": data, "K": data, "V": data, "DO": data, "Out": data, "DQ": data, "DK": data, "DV": data,
        "Lse": stats, "Delta": stats, "Mask": mask,
        "H": HEADS, "T_q": shape[2], "T_k": shape[2], "offset": 0, "qk_scale": qk_scale, "scale": scale,
        "T_Q_BUCKET": shape[2], "T_K_BUCKET": shape[2],
        "HEAD_DK": d, "HEAD_DV": d,
        "BLOCK_DK": triton_flash.padded_head_dim(d), "BLOCK_DV": triton_flash.padded_head_dim(d),
        "CAUSAL": case.causal, "MASK_KIND": case.mask_kind,
        "UPCAST": upcast, "ACC_DTYPE": acc_dtype, "DOT_PRECISION": precision,
        "SCALES_IN_MEMORY": dtype == torch.float64,
        **config.kwargs,
    }
    arguments = {}
    for name in fn.arg_names:
        if name.startswith("stride_"):
            tensor, axis = name[len("stride_"):-1], name[-1]
            arguments[name] = (mask_strides if tensor == "m" else strides)[STRIDE_AXES[axis]]
        elif name in values:
            arguments[name] = values[name]
        else:
            raise KeyError(f"attnlib.bench.sm90 does not know what to pass as argument {name!r} "
                           f"of {fn.__name__}; add it to kernel_arguments")
    return arguments


def _resource_usage(cubin):
    """``(registers, spill bytes per thread)`` from ``cuobjdump --dump-resource-usage``."""
    import triton

    with tempfile.TemporaryDirectory() as folder:
        path = os.path.join(folder, "kernel.cubin")
        with open(path, "wb") as f:
            f.write(cubin)
        text = subprocess.run([triton.knobs.nvidia.cuobjdump.path, "--dump-resource-usage", path],
                              capture_output=True, text=True, check=True).stdout
    usage = dict(re.findall(r"\b(REG|STACK|LOCAL):(\d+)", text))
    if "REG" not in usage:
        raise RuntimeError(f"no resource usage in cuobjdump's output: {text.strip()[:200]}")
    return int(usage["REG"]), max(int(usage.get("STACK", 0)), int(usage.get("LOCAL", 0)))


def compile_case(case):
    """Compile ``case`` for sm_90; a :class:`Result`, with ``error`` set if the compile failed."""
    config, max_d, kind = _tiles(case.kernel)[case.tile_index]
    result = Result(case, tile_label(config, max_d, kind), is_pickable(case), kind)
    start = time.perf_counter()
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", UserWarning)  # 3.9: TRITON_DEFAULT_FP_FUSION is unset
            _compile_into(result, case, config)
    except Exception as error:  # noqa: BLE001  a failed compile is a result row, not a crash
        lines = [line for line in str(error).strip().splitlines() if line.strip()]
        result.error = f"{type(error).__name__}: {lines[-1] if lines else ''}"[:160]
    result.seconds = time.perf_counter() - start
    return result


def _compile_into(result, case, config):
    """Compile ``case`` with tile ``config``; fill ``result``'s registers, spill and shared memory."""
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource, make_backend
    from triton.runtime.jit import create_function_from_signature

    fn = _kernel_function(case.kernel)
    target = GPUTarget("cuda", 90, 32)
    backend = make_backend(target)
    binder = create_function_from_signature(fn.signature, fn.params, backend)
    launch_options = {"num_warps": config.num_warps, "num_stages": config.num_stages}
    arguments = kernel_arguments(fn, case)
    bound, specialization, options = binder(**arguments, **launch_options)
    options, signature, constexprs, attrs = fn._pack_args(backend, launch_options, bound,
                                                          specialization, options)
    compiled = triton.compile(ASTSource(fn, signature, constexprs, attrs), target=target,
                              options=options.__dict__)
    result.registers, result.spill_bytes = _resource_usage(compiled.asm["cubin"])
    result.shared_bytes = compiled.metadata.shared


def all_cases(required_only=False):
    """Every :class:`Case`: each tile x dtype x head dim x causal, and fp16 with a boolean mask.

    ``required_only``: only those that must compile clean (:func:`is_required`).
    """
    cases = []
    for kernel in KERNELS:
        for index in range(len(_tiles(kernel))):
            for dtype in DTYPES:
                for d in HEAD_DIMS:
                    for causal in (False, True):
                        cases.append(Case(kernel, index, dtype, d, causal))
                    if dtype == "fp16":
                        cases.append(Case(kernel, index, dtype, d, False, BOOL_MASK))
    if required_only:
        cases = [case for case in cases
                 if is_required(case, is_pickable(case), _tiles(case.kernel)[case.tile_index][2])]
    return cases


HEADER = (f"{'kernel':6} {'dtype':9} {'d':>3} {'causal':6} {'mask':4}  {'tile':28} {'pick':4} "
          f"{'regs':>4} {'spill':>6} {'shared':>7}  status")


def format_row(result):
    case = result.case
    head = (f"{case.kernel:6} {case.dtype:9} {case.head_dim:>3} {'yes' if case.causal else 'no':6} "
            f"{'bool' if case.mask_kind == BOOL_MASK else 'none':4}  {result.tile:28} "
            f"{'yes' if result.pickable else 'no':4} ")
    if result.error:
        return head + f"{'':>4} {'':>6} {'':>7}  FAILED {result.error}"
    notes = ", ".join(note for note, bad in (("spills", result.spills),
                                             ("over shared memory", result.over_shared)) if bad)
    if not notes:
        status = "ok"
    elif result.required:
        status = f"FAIL: {notes} where autotuning may pick it"
    elif result.pickable:
        status = f"{notes}; autotuning may pick it (reported, not failed)"
    else:
        status = f"{notes} (not offered here)"
    return head + f"{result.registers:>4} {result.spill_bytes:>6} {result.shared_bytes:>7}  {status}"


def summary(results):
    """The last line: ``N configurations compiled for sm_90: S spill, M over shared memory, F failed``."""
    spill = sum(r.spills for r in results)
    over = sum(r.over_shared for r in results)
    failed = sum(bool(r.error) for r in results)
    return (f"{len(results)} configurations compiled for sm_90: {spill} spill, "
            f"{over} over shared memory, {failed} failed")


def run(cases, jobs, out=sys.stdout):
    """Compile ``cases`` on ``jobs`` processes, print a row for each as it comes; the results."""
    results = []
    print(HEADER, file=out, flush=True)
    if jobs <= 1:
        outcomes = map(compile_case, cases)
        pool = contextlib.nullcontext()
    else:  # fork: the workers inherit the imported kernels instead of importing torch again
        method = "fork" if "fork" in multiprocessing.get_all_start_methods() else "spawn"
        pool = multiprocessing.get_context(method).Pool(jobs)
        outcomes = pool.imap(compile_case, cases, chunksize=1)
    with pool:
        for result in outcomes:
            results.append(result)
            print(format_row(result), file=out, flush=True)
    return results


def ptxas_version():
    """``"ptxas 12.8 (ptxas)"``: the release of the ptxas that Triton runs for sm_90, and its name."""
    import triton

    try:  # 3.6 and 3.9: 3.9 runs its newer "ptxas-blackwell" for sm_90 too
        from triton.backends.nvidia.compiler import get_ptxas

        path = get_ptxas(90).path
    except (ImportError, AttributeError):
        path = triton.knobs.nvidia.ptxas.path
    text = subprocess.run([path, "--version"], capture_output=True, text=True).stdout
    release = re.search(r"release ([\d.]+)", text)
    return f"ptxas {release.group(1) if release else '?'} ({os.path.basename(path)})"


def check_environment():
    """Raise if the kernels cannot be compiled here (interpreter on, triton or its ptxas missing)."""
    import triton
    from triton.runtime.jit import JITFunction

    if not isinstance(_kernel_function("fwd"), JITFunction):
        raise RuntimeError("the Triton kernels were defined under TRITON_INTERPRET=1, which has nothing "
                           "to compile; run `python -m attnlib.bench.sm90` with TRITON_INTERPRET unset")
    for tool in ("ptxas", "cuobjdump"):
        path = getattr(triton.knobs.nvidia, tool).path
        if not path or not os.path.exists(path):
            raise RuntimeError(f"no {tool} found (the triton wheel bundles one; got {path!r})")


def main(argv=None):
    parser = argparse.ArgumentParser(prog="python -m attnlib.bench.sm90",
                                     description=__doc__.split("\n\n")[0])
    parser.add_argument("--jobs", type=int, default=min(2, os.cpu_count() or 1),
                        help="compiles run in parallel (default: 2, or 1 on one core)")
    parser.add_argument("--required", action="store_true",
                        help="compile only the configurations that must be clean: those autotuning may "
                             "pick for fp16 and bf16, and the 'any' tiles, with no mask")
    args = parser.parse_args(argv)
    try:
        check_environment()
    except (ImportError, RuntimeError) as error:
        print(f"attnlib.bench.sm90: {error}", file=sys.stderr)
        return 2
    import triton

    start = time.perf_counter()
    cases = all_cases(args.required)
    print(f"triton {triton.__version__}, {ptxas_version()}, {args.jobs} process(es), "
          f"{len(cases)} configurations; arguments of a ({BATCH}, {HEADS}, {SEQ_LEN}, d) call")
    results = run(cases, args.jobs)
    bad = [r for r in results if r.fails]
    print(f"{time.perf_counter() - start:.0f} s; {len(bad)} row(s) fail the check (a failed compile, or "
          f"a spill or overflow where autotuning may pick it for fp16/bf16 or an 'any' tile)")
    print(summary(results))
    return 1 if bad else 0


if __name__ == "__main__":
    raise SystemExit(main())
