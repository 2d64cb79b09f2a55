"""What the device is, and what it could do at best: a small table of known GPUs.

The table holds the dense (no 2:4 sparsity) fp16/bf16 tensor-core peak and the
memory bandwidth of a few GPUs, keyed by the exact name
``torch.cuda.get_device_name()`` reports. A device that is not in it (a CPU, an
unlisted GPU, a MIG slice of a listed one) has no peak here, and the benchmark
then reports no fraction of peak: never a guess.

Sources (vendor numbers; datasheets list fp16 "with sparsity", twice the dense value):

- H100 SXM5 and H100 PCIe: NVIDIA H100 Tensor Core GPU datasheet, FP16/BF16
  tensor core 1,979 (SXM) and 1,513 (PCIe) TFLOP/s with sparsity; HBM3
  3.35 TB/s (SXM), HBM2e 2.0 TB/s (PCIe).
- H200 (SXM): NVIDIA H200 datasheet, FP16/BF16 tensor core 1,979 TFLOP/s with
  sparsity; HBM3e 4.8 TB/s.
- A100: NVIDIA A100 datasheet, FP16/BF16 tensor core 312 TFLOP/s dense (624
  with sparsity) for SXM4 and PCIe; 1,555 GB/s (40 GB), 2,039 GB/s (80 GB SXM4),
  1,935 GB/s (80 GB PCIe).
- GeForce RTX 4090: NVIDIA Ada Lovelace architecture whitepaper (appendix),
  FP16/BF16 tensor with FP32 accumulate 165.2 TFLOP/s dense (330.3 with FP16
  accumulate, which PyTorch's matmuls do not use); 1,008 GB/s GDDR6X.

A peak is SMs x tensor-core FLOPs per SM per clock x clock. The whitepapers give
the per-SM rate: an A100 SM does 1,024 dense fp16 multiply-adds per clock (4 tensor
cores of 256), 2,048 FLOPs; an H100 SM twice that, 4,096 FLOPs (NVIDIA A100 and H100
Tensor Core GPU architecture whitepapers). With 132 SMs (H100 SXM5, H200) and 108
(A100), :func:`datasheet_clock_mhz` recovers the clock each datasheet peak assumes
(1,830 MHz for the H100 SXM5's 989.4, below its 1,980 MHz maximum), and
:func:`peak_at_clock` the peak at the clock a GPU actually ran at.
"""

import os
import platform
import shutil
import subprocess
from dataclasses import dataclass


@dataclass(frozen=True)
class DeviceSpec:
    """Vendor peak numbers for one device."""

    name: str  # as torch.cuda.get_device_name() reports it
    dense_fp16_tflops: float  # dense fp16/bf16 tensor-core peak, TFLOP/s
    memory_tb_per_s: float  # DRAM (HBM/GDDR) bandwidth, TB/s (10**12 bytes/s)
    sm_count: int | None = None  # streaming multiprocessors (torch: multi_processor_count)
    fp16_flop_per_sm_per_clock: int | None = None  # dense fp16/bf16 tensor-core FLOPs of one SM per clock


KNOWN_DEVICES = {
    spec.name: spec
    for spec in [
        DeviceSpec("NVIDIA H100 80GB HBM3", 989.4, 3.35, 132, 4096),  # H100 SXM5
        DeviceSpec("NVIDIA H100 PCIe", 756.5, 2.0),
        DeviceSpec("NVIDIA H200", 989.4, 4.8, 132, 4096),  # H200 SXM; the H200 NVL is not listed
        DeviceSpec("NVIDIA A100-SXM4-40GB", 312.0, 1.555, 108, 2048),
        DeviceSpec("NVIDIA A100-SXM4-80GB", 312.0, 2.039, 108, 2048),
        DeviceSpec("NVIDIA A100-PCIE-40GB", 312.0, 1.555, 108, 2048),
        DeviceSpec("NVIDIA A100 80GB PCIe", 312.0, 1.935, 108, 2048),
        DeviceSpec("NVIDIA GeForce RTX 4090", 165.2, 1.008),
    ]
}

# The dtypes the dense fp16/bf16 peak applies to. A float32 row (with or without
# TF32) has a different peak, so it gets no fraction.
PEAK_DTYPES = ("float16", "bfloat16")


def lookup(device_name):
    """The :class:`DeviceSpec` for ``device_name``, or None when it is not in the table.

    The match is exact (ignoring surrounding spaces and case), so a MIG slice
    ("NVIDIA H100 80GB HBM3 MIG 1g.10gb") or a cut-down variant
    ("NVIDIA GeForce RTX 4090 D") is not mistaken for the full device.
    """
    wanted = device_name.strip().casefold()
    for name, spec in KNOWN_DEVICES.items():
        if name.casefold() == wanted:
            return spec
    return None


def peak_flops(device_name, dtype, override_tflops=None):
    """Dense peak FLOP/s for a row, or None when there is no trustworthy number.

    ``override_tflops`` (the ``--peak-tflops`` option) is a peak the user
    supplies for a device that is not in the table; it applies to fp16/bf16 rows too.
    """
    if dtype not in PEAK_DTYPES:
        return None
    if override_tflops is not None:
        return float(override_tflops) * 1e12
    spec = lookup(device_name)
    return None if spec is None else spec.dense_fp16_tflops * 1e12


def fraction_of_peak(achieved_flops_per_s, device_name, dtype, override_tflops=None):
    """Achieved FLOP/s over the device's dense fp16/bf16 peak; None when unknown."""
    peak = peak_flops(device_name, dtype, override_tflops)
    if peak is None or achieved_flops_per_s is None:
        return None
    return achieved_flops_per_s / peak


def _flop_per_clock(spec):
    if spec.sm_count is None or spec.fp16_flop_per_sm_per_clock is None:
        raise ValueError(f"no SM count or per-SM rate is known for {spec.name}")
    return spec.sm_count * spec.fp16_flop_per_sm_per_clock


def datasheet_clock_mhz(spec):
    """The SM clock, in MHz, at which the device's tensor cores reach its datasheet peak.

    >>> round(datasheet_clock_mhz(KNOWN_DEVICES["NVIDIA H100 80GB HBM3"]))
    1830
    """
    return spec.dense_fp16_tflops * 1e12 / _flop_per_clock(spec) / 1e6


def peak_at_clock(spec, sm_mhz):
    """The dense fp16/bf16 tensor-core peak, in TFLOP/s, of the device running at ``sm_mhz``.

    >>> round(peak_at_clock(KNOWN_DEVICES["NVIDIA H100 80GB HBM3"], 1650), 1)
    892.1
    """
    return _flop_per_clock(spec) * sm_mhz * 1e6 / 1e12


def ridge_point(spec):
    """FLOPs per byte at which the compute peak and the memory bandwidth meet.

    A kernel whose arithmetic intensity is below it cannot reach the compute
    peak however well it is written: memory bandwidth limits it first.
    """
    return (spec.dense_fp16_tflops * 1e12) / (spec.memory_tb_per_s * 1e12)


def _cpu_model():
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def device_name(device):
    """A readable name: the GPU's name, or the CPU model with its number of logical CPUs."""
    if device == "cuda":
        import torch

        return torch.cuda.get_device_name()
    return f"{_cpu_model()} ({os.cpu_count()} CPUs)"


GPU_STATE_FIELDS = ("clocks.sm", "clocks.max.sm", "clocks.mem", "power.draw", "power.limit",
                    "temperature.gpu", "clocks_throttle_reasons.active")


def _nvidia_smi(fields):
    """``nvidia-smi --query-gpu=...`` for the first GPU, as a list of strings; None without it."""
    if shutil.which("nvidia-smi") is None:
        return None
    try:
        result = subprocess.run(["nvidia-smi", f"--query-gpu={','.join(fields)}", "--format=csv,noheader"],
                                capture_output=True, text=True, timeout=20, check=True)
    except (OSError, subprocess.SubprocessError):
        return None
    line = result.stdout.strip().splitlines()[0] if result.stdout.strip() else ""
    values = [v.strip() for v in line.split(",")]
    return values if len(values) == len(fields) else None


def driver_version():
    """The NVIDIA driver's version, from nvidia-smi; None where it cannot be read."""
    values = _nvidia_smi(["driver_version"])
    return None if values is None else values[0]


def gpu_state():
    """``"clocks.sm=1980 MHz; ...; clocks_throttle_reasons.active=0x0000..."``: the GPU now, or None.

    Read at the start and at the end of a run: a clock that fell, a power draw at
    its limit or a throttle reason other than 0 (idle) or 0x1 (GPU idle) says
    that the GPU slowed down while it was measured.
    """
    values = _nvidia_smi(GPU_STATE_FIELDS)
    if values is None:
        return None
    return "; ".join(f"{name}={value}" for name, value in zip(GPU_STATE_FIELDS, values))


def measure_matmul_tflops(dtype, n=8192, budget_s=0.5):
    """TFLOP/s of an (n x n) @ (n x n) product in ``dtype`` on the GPU: a measured peak.

    Datasheet peaks are rarely reached: a large, square matrix product from
    cuBLAS is about the most any kernel on this GPU can do in that dtype, so a
    kernel's fraction of it says how much room is left. Timed like every row
    (CUDA events, warm-up, median), on random inputs. float32 follows
    ``torch.backends.cuda.matmul.allow_tf32``.
    """
    import torch

    from .timing import time_cuda

    generator = torch.Generator(device="cuda").manual_seed(0)
    a, b = (torch.randn((n, n), generator=generator, device="cuda", dtype=getattr(torch, dtype))
            for _ in range(2))
    result = time_cuda(lambda: a @ b, warmup=3, warmup_s=0.2, min_repeats=10, max_repeats=50,
                       budget_s=budget_s, flush_bytes=0)
    return 2 * n**3 / result.median_s / 1e12
