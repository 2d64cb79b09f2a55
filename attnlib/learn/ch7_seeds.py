"""Chapter 7's two tasks trained over many seeds, and the numbers the chapter quotes about them.

    python -m attnlib.learn.ch7_seeds --output attnlib/data/learn/ch7_seeds.csv

The chapter trains one seed of each model in front of the reader; a claim about
what training finds needs more than one. For every seed in :data:`SEEDS` this
trains, with the chapter's recipes and only the seed changed:

- ``experiment="pointer"``: Task 1's pointer model (:data:`recipes.COREFERENCE`,
  300 steps), then measures its held-out accuracy with each piece of the
  attention layer taken out (:mod:`attnlib.learn.ablation`), and where head 0
  and head 1 put their weight;
- ``experiment="reversal"``, once with ``n_heads=1`` and once with 2: Task 2's
  model (:data:`recipes.REVERSAL`) for the recipe's 300 steps and, in a second
  run, for :data:`LONG_STEPS`; after the long run, the weight each head puts on
  each answer's position, and the held-out accuracy with the head's weights
  fixed to their average or with the position vectors taken out of the values.

The file is a CSV table, one row per (experiment, seed, n_heads), its columns
:data:`COLUMNS`: a cell is empty where the experiment does not measure that
quantity. The last columns, :data:`STAMP_COLUMNS`, are the stamp of the run
(:func:`attnlib.provenance.stamp`: date, git commit, versions, CPU, load, the
command), the same on every row. :func:`read_seed_runs` reads it back and
:func:`summary` computes what the chapter states: in how many seeds each claim
holds, and the range over seeds.

Training is deterministic given the seed: :func:`attnlib.learn.training.train`
draws the batches from a seeded generator and runs on one thread, in float64.
The runs take about two minutes on one CPU core.
"""

import argparse
import csv
import os
import sys
import time
from pathlib import Path

from ..bench import report
from ..provenance import stamp

SEEDS = tuple(range(8))
LONG_STEPS = 1500  # Task 2's long runs: five times the recipe's 300 steps
TEST_SEQUENCES, TEST_SEED = 1000, 1  # Task 2's held-out sequences, as the chapter draws them
REACHED = 0.95  # "learned": the first evaluation (every 25 steps) at this held-out accuracy or above
ROUTE_NEEDED_BELOW = 0.75  # a route is needed if blocking it leaves less than this held-out accuracy
DEFAULT_OUTPUT = Path(__file__).resolve().parent.parent / "data" / "learn" / "ch7_seeds.csv"

POINTER_COLUMNS = (
    "accuracy",  # held-out accuracy, nothing removed
    "without_head_0_at_it", "without_head_1_at_it",  # that head's output at "it" zeroed
    "without_it_view", "without_nouns_view",  # "it" / the two nouns may not attend to the adjective
    "without_both_views",
    # mean weight on the adjective, held-out sentences, per head: from "it"; from the animal and from
    # the place, in sentences whose adjective describes an animal
    "it_to_adjective_head_0", "it_to_adjective_head_1",
    "animal_to_adjective_head_0", "animal_to_adjective_head_1",
    "place_to_adjective_head_0", "place_to_adjective_head_1",
)
REVERSAL_COLUMNS = (
    "reversed_at_300", "previous_at_300",  # held-out accuracy per question after the recipe's 300 steps
    "reversed", "previous",  # ... after LONG_STEPS
    "first_step_reached",  # first evaluation step with accuracy >= REACHED in the long run (empty: never)
    # at the queries whose two answers sit at different positions (6 of 8), after LONG_STEPS:
    "weight_on_reversed", "weight_on_previous",  # the largest mean weight a head puts on that position
    "head_on_reversed", "head_on_previous",  # ... and which head that is
    "differing_reversed", "differing_previous",  # held-out accuracy there
    "average_weights_reversed", "average_weights_previous",  # ... with each head's weights averaged
    "values_without_positions_reversed", "values_without_positions_previous",  # ... values without positions
)
COLUMNS = ("experiment", "seed", "n_heads", "steps", *POINTER_COLUMNS, *REVERSAL_COLUMNS)
STAMP_COLUMNS = ("date_utc", "git_commit", "python_version", "numpy_version", "torch_version",
                 "attnlib_version", "torch_num_threads", "platform", "cpu", "load_average", "command")
DIGITS = 6  # the file's decimals; every accuracy is a whole number of answers over 2,464 or 8,000


def _rounded(values):
    return {name: round(float(value), DIGITS) for name, value in values.items()}


def pointer_run(seed, data=None):
    """Train Task 1's pointer model with ``seed``; its row of :data:`POINTER_COLUMNS` (a dict)."""
    import torch

    from . import ablation, coreference, recipes

    data = coreference.make_coreference_data() if data is None else data
    recipe = dict(recipes.COREFERENCE, seed=seed)
    model = recipes.coreference_model(recipe)
    recipes.train_coreference(data, model, recipe)
    tokens, targets = data.test.tokens, data.test.targets  # (N, 12), (N, 1, 1)
    it, adjective, nouns = coreference.IT_POSITION, coreference.ADJECTIVE_POSITION, coreference.NOUN_POSITIONS
    removals = {"accuracy": {},
                "without_head_0_at_it": dict(zero_head=0, at=[it]),
                "without_head_1_at_it": dict(zero_head=1, at=[it]),
                "without_it_view": dict(blocked=[([it], adjective)]),
                "without_nouns_view": dict(blocked=[(nouns, adjective)]),
                "without_both_views": dict(blocked=[([it], adjective), (nouns, adjective)])}
    row = {name: ablation.pointer_accuracy(model, tokens, targets, **removed)
           for name, removed in removals.items()}

    maps = model.attention_maps(tokens)[0]  # (N, 2 heads, T, T): the attention layer
    sentence = torch.arange(len(tokens))  # (N,)
    animal_first = torch.tensor([s[nouns[0]] in coreference.ANIMALS for s in data.test.sentences])  # (N,)
    animal_at = torch.where(animal_first, nouns[0], nouns[1])  # (N,) position of the animal
    place_at = sum(nouns) - animal_at
    describes_animal = torch.tensor([s[adjective] in coreference.ANIMAL_ADJECTIVES
                                     for s in data.test.sentences])  # (N,)
    for head in range(maps.shape[1]):
        to_adjective = maps[:, head, :, adjective]  # (N, T): each query's weight on the adjective
        row[f"it_to_adjective_head_{head}"] = to_adjective[:, it].mean()
        row[f"animal_to_adjective_head_{head}"] = to_adjective[sentence, animal_at][describes_animal].mean()
        row[f"place_to_adjective_head_{head}"] = to_adjective[sentence, place_at][describes_animal].mean()
    return _rounded(row)


def reversal_test_data():
    """Task 2's held-out sequences, as the chapter draws them: (1000, 8) tokens, (1000, 8, 2) answers."""
    import torch

    from .reversal import random_sequences

    return random_sequences(TEST_SEQUENCES, torch.Generator().manual_seed(TEST_SEED))


def reversal_accuracy_at_recipe_steps(n_heads, seed, test=None):
    """Train Task 2's model for the recipe's steps; ``{"reversed_at_300": ..., "previous_at_300": ...}``."""
    from . import ablation, recipes

    tokens, answers = reversal_test_data() if test is None else test
    recipe = dict(recipes.REVERSAL, n_heads=n_heads, seed=seed)
    model = recipes.reversal_model(recipe)
    recipes.train_reversal(model, tokens, answers, recipe)
    per_question = ablation.classifier_accuracy(model, tokens, answers).mean(dim=0)  # (2,)
    steps = recipe["steps"]
    return _rounded({f"reversed_at_{steps}": per_question[0], f"previous_at_{steps}": per_question[1]})


def reversal_run(n_heads, seed, test=None):
    """Train Task 2's model with ``n_heads`` heads and ``seed``; its row of :data:`REVERSAL_COLUMNS`."""
    from . import ablation, recipes
    from .reversal import source_positions

    test = reversal_test_data() if test is None else test
    tokens, answers = test
    row = reversal_accuracy_at_recipe_steps(n_heads, seed, test)
    recipe = dict(recipes.REVERSAL, n_heads=n_heads, seed=seed, steps=LONG_STEPS)
    model = recipes.reversal_model(recipe)
    history = recipes.train_reversal(model, tokens, answers, recipe)
    reached = [step for step, accuracy in zip(history.eval_steps, history.eval_accuracy)
               if accuracy >= REACHED]
    row["first_step_reached"] = reached[0] if reached else None

    sources = source_positions()  # (2, T): where each question's answer sits
    differ = sources[0] != sources[1]  # (T,) queries whose two answers sit at different positions
    queries = differ.nonzero()[:, 0]  # (6,)
    mean_maps = model.attention_maps(tokens)[0].mean(dim=0)  # (H, T, T), over the held-out sequences
    for question, name in enumerate(("reversed", "previous")):
        on_answer = mean_maps[:, queries, sources[question, queries]].mean(dim=-1)  # (H,)
        row[f"weight_on_{name}"], row[f"head_on_{name}"] = on_answer.max(), int(on_answer.argmax())
    right = ablation.classifier_accuracy(model, tokens, answers)  # (T, 2): each position, each question
    for question, name in enumerate(("reversed", "previous")):
        row[name] = right[:, question].mean()
    for prefix, removed in (("differing_", {}), ("average_weights_", dict(average_weights=True)),
                            ("values_without_positions_", dict(values_without_positions=True))):
        right = ablation.classifier_accuracy(model, tokens, answers, **removed)[differ]  # (6, 2)
        for question, name in enumerate(("reversed", "previous")):
            row[f"{prefix}{name}"] = right[:, question].mean()
    counts = ("first_step_reached", "head_on_reversed", "head_on_previous")
    return {**_rounded({k: v for k, v in row.items() if k not in counts}), **{k: row[k] for k in counts}}


def run_all(seeds=SEEDS, progress=print):
    """Every run of the file: a list of rows (dicts over :data:`COLUMNS`)."""
    from . import coreference, recipes
    from .training import torch_threads

    rows = []
    data, test = coreference.make_coreference_data(), reversal_test_data()
    with torch_threads(1):
        for seed in seeds:
            start = time.perf_counter()
            rows.append({"experiment": "pointer", "seed": seed, "n_heads": recipes.COREFERENCE["n_heads"],
                         "steps": recipes.COREFERENCE["steps"], **pointer_run(seed, data)})
            progress(f"pointer seed {seed}: {time.perf_counter() - start:.1f} s")
        for n_heads in (1, 2):
            for seed in seeds:
                start = time.perf_counter()
                rows.append({"experiment": "reversal", "seed": seed, "n_heads": n_heads, "steps": LONG_STEPS,
                             **reversal_run(n_heads, seed, test)})
                progress(f"reversal, {n_heads} head(s), seed {seed}: {time.perf_counter() - start:.1f} s")
    return rows


def write_seed_runs(path, run_stamp, rows):
    """Write ``rows`` as CSV, the stamp repeated on every row; atomically (a partial file, then a rename)."""
    report.write_stamped_csv(path, COLUMNS, run_stamp, STAMP_COLUMNS, rows)


def read_seed_runs(path=DEFAULT_OUTPUT):
    """``(stamp, rows)`` from a file :func:`write_seed_runs` wrote.

    ``rows`` is a list of dicts over :data:`COLUMNS`: ``experiment`` a str,
    ``seed``, ``n_heads``, ``steps``, ``first_step_reached`` and ``head_on_*`` ints, every other
    number a float, and None where the cell is empty. ``stamp`` is a dict over
    :data:`STAMP_COLUMNS`, read from the first row.
    """
    with open(path, newline="") as f:
        records = list(csv.DictReader(f))
    missing = [name for name in (*COLUMNS, *STAMP_COLUMNS) if not records or name not in records[0]]
    if missing:
        raise ValueError(f"{path} is not a file of chapter 7's seed runs: no rows, or no columns {missing}")
    integers = {"seed", "n_heads", "steps", "first_step_reached", "head_on_reversed", "head_on_previous"}

    def typed(name, text):
        if text == "":
            return None
        if name == "experiment":
            return text
        return int(text) if name in integers else float(text)

    rows = [{name: typed(name, record[name]) for name in COLUMNS} for record in records]
    return {name: records[0][name] for name in STAMP_COLUMNS}, rows


def _spread(values):
    return {"min": min(values), "max": max(values), "n": len(values)}


def pointer_route(row):
    """Which route the adjective takes to the pointer in one seed, from its ablations.

    A route is *needed* when blocking it leaves less than :data:`ROUTE_NEEDED_BELOW`
    of the held-out sentences right. Returns ``"it"`` (route 1 only), ``"nouns"``
    (route 2 only), ``"both"`` (each needed) or ``"either"`` (neither alone).
    """
    through_it = row["without_it_view"] < ROUTE_NEEDED_BELOW
    through_nouns = row["without_nouns_view"] < ROUTE_NEEDED_BELOW
    return {(True, False): "it", (False, True): "nouns", (True, True): "both", (False, False): "either"}[
        (through_it, through_nouns)]


def summary(rows):
    """What chapter 7 states about the seeds: counts and ranges, from the rows of :func:`read_seed_runs`.

    Returns a dict of three dicts:

    - ``"pointer"``: ``seeds`` (sorted), ``routes`` (seed -> :func:`pointer_route`),
      ``route_seeds`` (route -> sorted seeds), and for every column of
      :data:`POINTER_COLUMNS` its spread (``min``, ``max``, ``n``) over the seeds;
      ``by_route``: route -> the spreads over that route's seeds of ``without_it_view``,
      ``without_nouns_view``, ``carrier_removed`` and ``other_removed`` (the accuracy
      without the output at "it" of the head whose removal costs most, and of the other);
    - ``"reversal_1_head"``, ``"reversal_2_heads"``: ``seeds``, and for every column of
      :data:`REVERSAL_COLUMNS` its spread over the seeds (``first_step_reached``
      over the seeds that reached :data:`REACHED`), ``never_reached``: the seeds that did not,
      ``separate_heads``: the seeds in which different heads serve the two questions.
    """
    pointer = sorted((r for r in rows if r["experiment"] == "pointer"), key=lambda r: r["seed"])
    out = {"pointer": {"seeds": [r["seed"] for r in pointer]}}
    for name in POINTER_COLUMNS:
        out["pointer"][name] = _spread([r[name] for r in pointer])
    routes = {r["seed"]: pointer_route(r) for r in pointer}
    out["pointer"]["routes"] = routes
    out["pointer"]["route_seeds"] = {route: sorted(s for s, r in routes.items() if r == route)
                                     for route in ("it", "nouns", "both", "either")}
    out["pointer"]["by_route"] = {}
    for route, seeds in out["pointer"]["route_seeds"].items():
        group = [r for r in pointer if r["seed"] in seeds]
        if not group:
            continue
        removed = [sorted((r["without_head_0_at_it"], r["without_head_1_at_it"])) for r in group]
        out["pointer"]["by_route"][route] = {
            "without_it_view": _spread([r["without_it_view"] for r in group]),
            "without_nouns_view": _spread([r["without_nouns_view"] for r in group]),
            "carrier_removed": _spread([low for low, _ in removed]),
            "other_removed": _spread([high for _, high in removed])}
    for n_heads, key in ((1, "reversal_1_head"), (2, "reversal_2_heads")):
        runs = sorted((r for r in rows if r["experiment"] == "reversal" and r["n_heads"] == n_heads),
                      key=lambda r: r["seed"])
        out[key] = {"seeds": [r["seed"] for r in runs],
                    "never_reached": [r["seed"] for r in runs if r["first_step_reached"] is None],
                    "separate_heads": [r["seed"] for r in runs
                                       if r["head_on_reversed"] != r["head_on_previous"]]}
        for name in REVERSAL_COLUMNS:
            values = [r[name] for r in runs if r[name] is not None]
            out[key][name] = _spread(values) if values else None
    return out


def main(argv=None):
    parser = argparse.ArgumentParser(
        prog="python -m attnlib.learn.ch7_seeds",
        description="Train chapter 7's pointer model and its reversal model (1 and 2 heads) over seeds "
                    f"{SEEDS[0]}-{SEEDS[-1]}, and write what the chapter quotes as a stamped CSV table.")
    parser.add_argument("--output", type=Path, default=DEFAULT_OUTPUT,
                        help=f"where to write (default {DEFAULT_OUTPUT})")
    args = parser.parse_args(argv)
    from .training import PERTURB_ENV, torch_threads

    if float(os.environ.get(PERTURB_ENV) or 0.0):
        parser.error(f"{PERTURB_ENV} is set: stored runs must start from the seeds' own weights; unset it")
    command = "python -m attnlib.learn.ch7_seeds " + " ".join(argv if argv is not None else sys.argv[1:])
    start = time.perf_counter()
    with torch_threads(1):  # stamped as it runs: one thread
        run_stamp = stamp(command.strip())
        rows = run_all(progress=lambda line: print(line, flush=True))
    write_seed_runs(args.output, run_stamp, rows)
    seconds = time.perf_counter() - start
    print(f"{len(rows)} rows in {seconds:.0f} s, commit {run_stamp['git_commit']}: {args.output}")


if __name__ == "__main__":
    main()
