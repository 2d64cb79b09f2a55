"""A pytest plugin for nbval: start a notebook's kernel again when it died while starting.

nbval starts one Jupyter kernel per notebook. jupyter_client picks the kernel's five TCP ports
on localhost and writes them down; the kernel then binds them. With two pytest workers starting
kernels and opening connections at the same time, another socket can take one of those ports in
between, and the new kernel exits at once: "Kernel died before replying to kernel_info"
(underneath, ZMQError "Address already in use"; see jupyter/nbconvert#1066 and
treebeardtech/nbmake#129). It happened once in a fresh clone's `make test` here. No cell has run
at that point, so starting a kernel again, on new ports, checks exactly what the first would
have. Any other failure, and a third death in a row, is raised as before.

Loaded by the Makefile's nbval runs with ``-p tools.nbval_retry``.
"""

import nbval.kernel

ATTEMPTS = 3
DIED = "Kernel died before replying to kernel_info"
_start_new_kernel = nbval.kernel.start_new_kernel


def start_new_kernel(*args, **kwargs):
    """nbval's ``start_new_kernel``, tried up to ``ATTEMPTS`` times while the kernel dies starting."""
    for attempt in range(1, ATTEMPTS + 1):
        try:
            return _start_new_kernel(*args, **kwargs)
        except RuntimeError as error:
            if DIED not in str(error) or attempt == ATTEMPTS:
                raise


nbval.kernel.start_new_kernel = start_new_kernel  # RunningKernel looks the name up when it starts
