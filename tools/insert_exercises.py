"""Write each chapter's exercise section from the registry in attnlib/exercises.

Usage: python tools/insert_exercises.py [chapter numbers...]   (default: all)

The task text, starter code and solution code of every exercise live in
attnlib/exercises/ch*.py, next to the checks and the tests that use them. This
script renders them as sphinx-exercise gated blocks (so code cells work inside)
and replaces the chapter's "## Exercises" section, always its last, with them.
Run tools/execute_notebooks.py on the chapter afterwards.
"""

import sys
from pathlib import Path

import nbformat.v4 as v4

import attnlib.exercises as exercises
from attnlib.exercises.core import SETUP_CODE

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
from tools.nbedit import editing  # noqa: E402

BOOK = ROOT / "book"
CHAPTERS = {
    1: "01_query_key_value",
    2: "02_token_by_token",
    3: "03_score_matrix",
    4: "04_scale_and_softmax",
    5: "05_weighted_sum",
    6: "06_matrix_form",
    7: "07_attention_that_learns",
    8: "08_attention_inside_a_transformer",
    9: "09_generating_text",
    10: "10_a_gpt_that_writes",
    11: "11_timing_on_gpu",
    12: "12_without_the_matrix",
    13: "13_backward_pass",
    14: "14_many_sequences",
    15: "15_decoding_at_scale",
}
KIND_LABEL = {"by hand": "By hand", "implement": "Implement", "find the bug": "Find the bug", "predict": "Predict"}
INTRO = (
    "## Exercises\n\n"
    "Each exercise ends with a call to `attnlib.exercises.check`: it runs your answer on hidden cases and "
    "prints what to fix, or that every case passed (`result.passed` is then `True`). Try each one on "
    "your own first."
)


def _with_check(source, exercise):
    last_line = source.rstrip().splitlines()[-1]
    gap = "\n\n\n" if last_line.startswith((" ", "\t")) else "\n\n"
    return source.rstrip() + gap + exercise.check_line()


def exercise_cells(chapter):
    """The cells of one chapter's exercise section, with stable cell ids."""
    cells = [v4.new_markdown_cell(INTRO, id=f"ch{chapter}-exercises"),
             v4.new_code_cell(SETUP_CODE, id=f"ch{chapter}-exercises-setup")]
    for exercise_id in exercises.list(chapter):
        ex = exercises.get(exercise_id)
        label = ex.label
        cells += [
            v4.new_markdown_cell(f"```{{exercise-start}} {ex.title}\n:label: {label}\n```\n\n"
                                 f"**{KIND_LABEL[ex.kind]}.** {ex.task}", id=f"{label}-task"),
            v4.new_code_cell(_with_check(ex.starter, ex), id=f"{label}-starter"),
            v4.new_markdown_cell("```{exercise-end}\n```", id=f"{label}-end"),
            v4.new_markdown_cell(f"```{{solution-start}} {label}\n:class: dropdown\n```", id=f"{label}-solution-start"),
            v4.new_code_cell(_with_check(ex.solution, ex), id=f"{label}-solution"),
        ]
        if ex.explanation:
            cells.append(v4.new_markdown_cell(ex.explanation, id=f"{label}-explanation"))
        cells.append(v4.new_markdown_cell("```{solution-end}\n```", id=f"{label}-solution-end"))
    return cells


def insert(chapter):
    path = BOOK / f"{CHAPTERS[chapter]}.ipynb"
    with editing(path) as nb:
        starts = [i for i, cell in enumerate(nb.cells) if cell.get("id") == f"ch{chapter}-exercises"]
        keep = nb.cells[: starts[0]] if starts else nb.cells
        nb.cells = keep + exercise_cells(chapter)
    print(f"{path.name}: {len(exercises.list(chapter))} exercises")


if __name__ == "__main__":
    for number in sys.argv[1:] or CHAPTERS:
        insert(int(number))
