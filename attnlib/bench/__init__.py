"""attnlib.bench: timing attention properly, on a CPU or a GPU.

Run it as ``python -m attnlib.bench`` (``--help`` lists every option,
``--quick`` runs a small sweep in well under a minute on a CPU). One idea per file:

- :mod:`~attnlib.bench.timing`: timing one call, the pitfalls and their fixes
- :mod:`~attnlib.bench.memory`: the peak extra memory of one call
- :mod:`~attnlib.bench.flops`: FLOPs and bytes moved, naive against fused
- :mod:`~attnlib.bench.devices`: device names and a small table of known peaks
- :mod:`~attnlib.bench.kernels`: what gets timed (each backend, each pinned SDPA kernel)
- :mod:`~attnlib.bench.sweep`: a sweep over configurations, one row each
- :mod:`~attnlib.bench.report`: the row schema, the stamp, CSV and JSON files
- :mod:`~attnlib.bench.plots`: figures of result rows against T
- :mod:`~attnlib.bench.gpu_results`, :mod:`~attnlib.bench.gpu_plots`: the stored GPU
  measurements, read and drawn for chapters 12 and 13 (imported where used)
- :mod:`~attnlib.bench.source_counts`: the matrix products and lines of code in a
  function's source (imported where used)
- :mod:`~attnlib.bench.cli`: the command line
- :mod:`~attnlib.bench.decode`: time per generated token with and without a KV cache,
  and the tiled kernel with a sliding window (its own command, ``python -m
  attnlib.bench.decode``, so it is not imported here)
"""

from . import devices, flops, kernels, memory, plots, report, sweep, timing

__all__ = ["devices", "flops", "kernels", "memory", "plots", "report", "sweep", "timing"]
