"""Merge consecutive stream outputs of the same name in executed chapters, as the built book does.

Usage: python tools/merge_streams.py book/NN_name.ipynb [...]

Executing a notebook can split one cell's printed text into several stream outputs (a
flush between prints). The book merges them (``nb_merge_streams``) and nbval compares
them merged, so the stored notebook keeps one output per run of prints.
"""

import sys

from nbedit import editing


def merge(outputs):
    merged = []
    for output in outputs:
        if (merged and output.get("output_type") == "stream" and merged[-1].get("output_type") == "stream"
                and merged[-1].get("name") == output.get("name")):
            merged[-1]["text"] += output["text"]
        else:
            merged.append(output)
    return merged


if __name__ == "__main__":
    for path in sys.argv[1:]:
        with editing(path) as nb:
            for cell in nb.cells:
                if cell.cell_type == "code":
                    cell.outputs = merge(cell.outputs)
