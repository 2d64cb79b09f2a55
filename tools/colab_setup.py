"""Give every chapter a first code cell that installs attnlib where it is missing.

Usage: python tools/colab_setup.py [book/NN_name.ipynb ...]   (default: every chapter)

A chapter opened on its own (the Colab button, a downloaded .ipynb) has no attnlib.
The cell written here installs ``attnlib[book]`` (the library and what the chapters
import) from the book's repository with pip, and does nothing where attnlib is
already installed, as in ``make book`` and ``make test``. The address and branch are
read from ``_config.yml`` (``repository.url``, ``repository.branch``), the one place
they live, when this script runs; ``make notebooks`` runs it, and
``tests/test_notebook_hygiene.py`` checks that every chapter's cell matches the
configuration. The cell is tagged ``remove-cell``: the HTML book does not show it.
"""

import sys
from pathlib import Path

import nbformat.v4 as v4
import yaml

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
from tools.nbedit import editing  # noqa: E402

CELL_ID = "colab-setup"
TAGS = ["remove-cell"]


def repository(config_path=ROOT / "_config.yml"):
    """``(url, branch)`` of the book's repository, from ``_config.yml``."""
    config = yaml.safe_load(Path(config_path).read_text())
    return config["repository"]["url"].rstrip("/"), config["repository"].get("branch", "main")


def setup_source(url, branch):
    """The text of the set-up cell for a repository at ``url`` on ``branch``."""
    return (
        "# Running this chapter on its own (in Colab, say)? This installs attnlib and what\n"
        "# the chapter needs. Where attnlib is already installed it does nothing.\n"
        "import importlib\n"
        "import importlib.util\n"
        "import subprocess\n"
        "import sys\n"
        "\n"
        f'REPOSITORY = "{url}"\n'
        'if importlib.util.find_spec("attnlib") is None:\n'
        f'    package = f"attnlib[book] @ git+{{REPOSITORY}}@{branch}"\n'
        '    subprocess.run([sys.executable, "-m", "pip", "install", "-q", package], check=True)\n'
        "    importlib.invalidate_caches()"
    )


def chapters():
    return sorted((ROOT / "book").glob("[0-9][0-9]_*.ipynb"))


def place(path, source):
    """Put the set-up cell first among the code cells of ``path`` (or update it there)."""
    with editing(path) as nb:
        existing = [i for i, cell in enumerate(nb.cells) if cell.get("id") == CELL_ID]
        if existing:
            cell = nb.cells[existing[0]]
            cell.source = source
            cell.metadata["tags"] = sorted(set(cell.metadata.get("tags", [])) | set(TAGS))
            return "updated"
        first_code = next((i for i, cell in enumerate(nb.cells) if cell.cell_type == "code"), len(nb.cells))
        cell = v4.new_code_cell(source, id=CELL_ID)
        cell.metadata["tags"] = list(TAGS)
        nb.cells.insert(first_code, cell)
        return "added"


def main(paths):
    source = setup_source(*repository())
    for path in [Path(p) for p in paths] or chapters():
        print(f"{path.name}: set-up cell {place(path, source)}")


if __name__ == "__main__":
    main(sys.argv[1:])
