"""Exercises are numbered per chapter, from the page's file name: the 2nd of chapter 11 is 8.2."""

import re

import pytest

PAGE = """# Chapter {n}

{exercises}
"""

EXERCISE = """```{{exercise-start}} Task {k}
:label: ch{n}-task-{k}
```

Do thing {k}.

```{{exercise-end}}
```

```{{solution-start}} ch{n}-task-{k}
:class: dropdown
```

Answer {k}.

```{{solution-end}}
```
"""


@pytest.mark.parametrize("hide", [False, True])
def test_exercises_are_numbered_within_their_chapter(tmp_path, hide):
    pytest.importorskip("sphinx_exercise")
    from sphinx.cmd.build import build_main

    src = tmp_path / "src"
    (src / "book").mkdir(parents=True)
    (src / "conf.py").write_text(
        'extensions = ["myst_parser", "sphinx_exercise", "attnlib.exercises.sphinx_ext"]\n'
        f"hide_solutions = {hide}\n"
    )
    chapters = {3: 3, 8: 2}  # chapter -> how many exercises
    (src / "index.md").write_text("# Book\n\n```{toctree}\n" + "".join(
        f"book/{n:02d}_chapter\n" for n in chapters) + "```\n")
    for n, count in chapters.items():
        exercises = "\n".join(EXERCISE.format(n=n, k=k) for k in range(1, count + 1))
        (src / "book" / f"{n:02d}_chapter.md").write_text(PAGE.format(n=n, exercises=exercises))
    out = tmp_path / "html"
    assert build_main(["-b", "html", "-W", "-q", "-E", str(src), str(out)]) == 0
    for n, count in chapters.items():
        page = (out / "book" / f"{n:02d}_chapter.html").read_text()
        numbers = re.findall(r"Exercise (\d+(?:\.\d+)?)", page)
        expected = [f"{n}.{k}" for k in range(1, count + 1)]
        assert sorted(set(numbers)) == expected
        assert ("Solution to" in page) is not hide
