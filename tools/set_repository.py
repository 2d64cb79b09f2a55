"""Point the book at another repository: the address a fork publishes from.

Usage: python tools/set_repository.py https://github.com/OWNER/NAME [BRANCH]

Rewrites ``repository.url`` (and ``repository.branch`` when given) in ``_config.yml``,
keeping the rest of the file as it is, then updates each chapter's set-up cell
(tools/colab_setup.py), which installs attnlib from that address. The Pages workflow
runs it in its own checkout with the repository it runs in, so a fork publishes with
no edit; a local build never runs it and reads ``_config.yml`` as committed.
"""

import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
from tools import colab_setup  # noqa: E402

BLOCK = re.compile(r"^repository:[ \t]*\n((?:[ \t]+.*\n|[ \t]*\n)*)", re.MULTILINE)


def set_key(text, key, value):
    """``text`` (a _config.yml) with ``repository.<key>`` set to ``value``."""
    block = BLOCK.search(text)
    if block is None:
        raise SystemExit("_config.yml has no repository: section")
    body, n = re.subn(rf"^([ \t]+{key}:[ \t]*)\S.*$", lambda m: m.group(1) + value, block.group(1),
                      count=1, flags=re.MULTILINE)
    if n != 1:
        raise SystemExit(f"_config.yml has no repository.{key}")
    return text[: block.start(1)] + body + text[block.end(1):]


def main(argv):
    if not 1 <= len(argv) <= 2 or not argv[0].startswith("https://"):
        raise SystemExit(__doc__)
    config = ROOT / "_config.yml"
    text = set_key(config.read_text(), "url", argv[0].rstrip("/"))
    if len(argv) == 2:
        text = set_key(text, "branch", argv[1])
    config.write_text(text)
    print(f"_config.yml: repository {argv[0]}" + (f", branch {argv[1]}" if len(argv) == 2 else ""))
    colab_setup.main([])


if __name__ == "__main__":
    main(sys.argv[1:])
