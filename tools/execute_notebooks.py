"""Execute notebooks in place, from their own folder, so their stored outputs are fresh.

Usage: python tools/execute_notebooks.py book/02_token_by_token.ipynb [more.ipynb ...]

nbval later re-runs each notebook and compares its outputs with the stored ones,
so run this after editing a chapter. Execution counts are kept, which nbval needs.
Each notebook is locked (see tools/nbedit.py) while it runs, so no edit made
meanwhile is lost.
"""

import sys
import time
from pathlib import Path

from nbclient import NotebookClient

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from tools.nbedit import editing  # noqa: E402


def execute(path):
    start = time.perf_counter()
    with editing(path) as nb:
        NotebookClient(nb, timeout=600, kernel_name="python3", resources={"metadata": {"path": str(path.parent)}}).execute()
    return time.perf_counter() - start


def main(paths):
    for name in paths:
        path = Path(name)
        print(f"{path}: executed in {execute(path):.1f} s", flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])
