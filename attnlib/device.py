"""Which device to compute on."""

import os

from .arrays import torch_available, torch_module


def device():
    """``"cuda"`` when PyTorch sees a GPU, otherwise ``"cpu"``. Nothing requires a GPU.

    Setting the environment variable ``ATTNLIB_FORCE_CPU=1`` forces ``"cpu"``.
    """
    if os.environ.get("ATTNLIB_FORCE_CPU") == "1" or not torch_available():
        return "cpu"
    return "cuda" if torch_module().cuda.is_available() else "cpu"
