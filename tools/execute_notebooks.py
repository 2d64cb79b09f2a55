"""Execute notebooks in place, from their own folder, so their stored outputs are fresh.

Usage: python tools/execute_notebooks.py book/02_token_by_token.ipynb [more.ipynb ...]

nbval later re-runs each notebook and compares its outputs with the stored ones,
so run this after editing a chapter. Execution counts are kept, which nbval needs.
"""

import sys
import time
from pathlib import Path

import nbformat
from nbclient import NotebookClient


def execute(path):
    nb = nbformat.read(path, as_version=4)
    start = time.perf_counter()
    NotebookClient(nb, timeout=600, kernel_name="python3", resources={"metadata": {"path": str(path.parent)}}).execute()
    nbformat.write(nb, path)
    return time.perf_counter() - start


def main(paths):
    for name in paths:
        path = Path(name)
        print(f"{path}: executed in {execute(path):.1f} s", flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])
