"""Count the words of each chapter's main path: the prose a learner reads straight through.

Counted: the markdown cells before the chapter's "## Exercises" heading. Not counted:
collapsed blocks (``{dropdown}`` directives and any directive with ``:class: dropdown``,
the deep dives), display math, code fences, HTML comments, and the code cells.

    python tools/main_path_words.py book/*.ipynb
"""

import json
import re
import sys

FENCE = re.compile(r"^(?P<fence>:{3,}|`{3,})\s*(?P<rest>.*)$")


def strip_collapsed(markdown):
    """The markdown with every collapsed block, code fence and display-math block removed."""
    out, stack = [], []  # stack: (fence, hidden) for each open directive or code block
    lines = markdown.splitlines()
    i = 0
    while i < len(lines):
        line = lines[i]
        match = FENCE.match(line.strip())
        if match:
            fence, rest = match["fence"], match["rest"]
            if stack and fence == stack[-1][0] and not rest:  # closes the innermost block
                stack.pop()
                i += 1
                continue
            if rest or not stack or fence != stack[-1][0]:
                hidden = not rest.startswith("{") or "dropdown" in rest or rest.startswith("{math}")
                if not hidden:  # a directive: hidden if its options say dropdown
                    j = i + 1
                    while j < len(lines) and lines[j].startswith(":"):
                        hidden = hidden or "dropdown" in lines[j]
                        j += 1
                stack.append((fence, hidden))
                i += 1
                continue
        if not any(hidden for _, hidden in stack) and not line.startswith(":"):
            out.append(line)
        i += 1
    text = "\n".join(out)
    text = re.sub(r"\$\$.*?\$\$", " ", text, flags=re.S)
    return re.sub(r"<!--.*?-->", " ", text, flags=re.S)


def main_path_words(notebook_path):
    """Words of prose on the main path of one chapter notebook."""
    with open(notebook_path, encoding="utf-8") as f:
        cells = json.load(f)["cells"]
    words = 0
    for cell in cells:
        if cell["cell_type"] != "markdown":
            continue
        source = "".join(cell["source"])
        if re.match(r"\s*#{1,2} Exercises\b", source):
            break
        words += len(strip_collapsed(source).split())
    return words


if __name__ == "__main__":
    for path in sys.argv[1:]:
        print(f"{main_path_words(path):6d}  {path}")
