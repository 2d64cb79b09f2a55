"""A Sphinx extension that makes ``hide_solutions: true`` work for gated solutions.

The book's solutions use sphinx-exercise's gated form::

    ```{solution-start} ch4-stable-softmax
    :class: dropdown
    ```
    (a code cell)
    ```{solution-end}
    ```

so that a solution can hold an executed code cell. With ``hide_solutions``
set, sphinx-exercise 1.2.1 drops the ``solution-start`` marker but leaves the
cells after it and the ``solution-end`` marker in the page, and the HTML
writer then fails on the unknown ``solution_end_node``. This extension
replaces ``solution-start`` with a version that, when solutions are hidden,
leaves a marker behind, and a transform removes everything from that marker
to the matching ``solution-end``. With ``hide_solutions: false`` it changes
nothing.

It also numbers exercises per chapter. Sphinx numbers enumerable nodes across
the whole book when the chapters have no section numbers, so the eighth exercise
of the book would read "Exercise 8" wherever it sits. Here the exercises of
``book/11_timing_on_gpu`` become Exercise 11.1, 8.2, ..., in page order, which
matches their ids (``ch11.*``); titles, solution titles and references all read
the same table.

Use it next to sphinx-exercise in ``_config.yml``::

    sphinx:
      extra_extensions:
        - sphinx_exercise
        - attnlib.exercises.sphinx_ext
      config:
        hide_solutions: true   # the instructors' build: no solutions
"""

import re
from pathlib import PurePosixPath

from docutils import nodes
from sphinx.transforms import SphinxTransform
from sphinx.util import logging
from sphinx_exercise.directive import SolutionStartDirective
from sphinx_exercise.nodes import solution_end_node

logger = logging.getLogger(__name__)


class hidden_solution_start(nodes.Element):
    """Where a gated solution began, in a build that hides solutions."""


class HideableSolutionStart(SolutionStartDirective):
    """sphinx-exercise's ``solution-start``, leaving a marker when solutions are hidden."""

    def run(self):
        result = super().run()  # also records the start for sphinx-exercise's structure check
        if self.config.hide_solutions:
            marker = hidden_solution_start()
            self.set_source_info(marker)
            return [marker]
        return result


class RemoveHiddenSolutions(SphinxTransform):
    """Remove each hidden solution: its marker, its content and its ``solution-end``."""

    default_priority = 5  # after sphinx-exercise checks the structure (1), before it merges (10)

    def apply(self):
        for start in list(self.document.findall(hidden_solution_start)):
            parent = start.parent
            siblings = parent.children[parent.index(start) :]
            end = next((i for i, node in enumerate(siblings) if isinstance(node, solution_end_node)), None)
            if end is None:
                logger.warning("solution-start without a solution-end after it", location=start)
                parent.remove(start)
                continue
            for node in siblings[: end + 1]:
                parent.remove(node)


def chapter_number(docname):
    """The chapter a page is, from its file name (``book/11_timing_on_gpu`` -> 8), or None."""
    match = re.match(r"(\d+)_", PurePosixPath(docname).name)
    return int(match.group(1)) if match else None


def number_exercises_per_chapter(app, env):
    """Renumber each chapter's exercises (chapter, 1), (chapter, 2), ... in page order.

    Runs after Sphinx has assigned its book-wide numbers (``env-get-updated``), and
    rewrites the same table sphinx-exercise and the HTML writer read them from.
    """
    for docname, numbers in env.toc_fignumbers.items():
        chapter = chapter_number(docname)
        exercises = numbers.get("exercise")
        if chapter is None or not exercises:
            continue
        in_page_order = sorted(exercises, key=exercises.get)
        numbers["exercise"] = {node_id: (chapter, k) for k, node_id in enumerate(in_page_order, 1)}
    return []


def setup(app):
    app.setup_extension("sphinx_exercise")
    app.add_node(hidden_solution_start)
    app.add_directive("solution-start", HideableSolutionStart, override=True)
    app.add_transform(RemoveHiddenSolutions)
    app.connect("env-get-updated", number_exercises_per_chapter, priority=900)  # after Sphinx's (500)
    return {"parallel_read_safe": True, "parallel_write_safe": True}
