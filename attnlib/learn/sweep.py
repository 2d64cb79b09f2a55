"""Train chapter 8's recipe over many seeds, and store what each run learned.

    python -m attnlib.learn.sweep --output attnlib/data/learn/induction_seeds.json

One seed shows what *can* happen; a claim about a trained model needs the
spread over seeds. For each seed this trains

- the chapter's model (:data:`attnlib.learn.recipes.INDUCTION`, with that seed
  for the initial weights and the batches) for ``--steps`` steps, scoring it
  every ``eval_every`` steps on the chapter's held-out sequences: the accuracy
  and loss on the repeated tokens, and every head's previous-token and induction
  scores (:func:`attnlib.learn.induction.head_scores`); at the end, every head
  zero-ablated and mean-ablated, and the patching experiment
  (:mod:`attnlib.learn.patching`);
- the one-block control, the same recipe with ``n_layers=1``, for the same
  steps and for ``--control-steps`` more (trained to convergence).

The file holds the stamp (:func:`attnlib.provenance.stamp`), both recipes and
one record per run; :func:`load` reads it and :func:`summary` says, per seed,
when each head formed (:data:`FORMED`). Runs are deterministic given the seed
(one CPU thread each); ``--jobs 2`` trains two seeds at a time.
"""

import argparse
import json
import multiprocessing
import sys
from pathlib import Path

import torch

from ..provenance import stamp
from . import recipes
from .induction import head_scores, repeat_scores
from .patching import ablation_accuracies, patching_experiment
from .training import torch_threads, train

FORMED = 0.3  # a head has formed once its mean weight on the key its rule needs reaches this
CIRCUIT_ACCURACY = 0.5  # ... and the circuit, once both heads have and the repeats are this well predicted
DEFAULT_OUTPUT = Path(__file__).resolve().parent.parent / "data" / "learn" / "induction_seeds.json"


def _round(values, digits=4):
    return [round(float(v), digits) for v in values]


def train_seed(recipe, seed, steps, *, experiments=True):
    """Train ``recipe`` with ``seed`` for ``steps`` steps; a dict of its curves and final experiments."""
    recipe = dict(recipe, seed=seed, steps=steps)
    model = recipes.induction_model(recipe)
    data = recipes.induction_eval_data(recipe)
    curves = {
        "step": [],
        "repeat_accuracy": [],
        "repeat_loss": [],
        "other_loss": [],
        "previous": [],
        "induction": [],
    }

    def record(step, trained):
        scores = repeat_scores(trained, data)
        induction, previous = head_scores(trained.attention_maps(data.tokens), data)  # (L, H) each
        curves["step"].append(step)
        for name in ("repeat_accuracy", "repeat_loss", "other_loss"):
            curves[name].append(round(scores[name], 4))
        curves["previous"].append(_round(previous.flatten()))
        curves["induction"].append(_round(induction.flatten()))
        return scores["repeat_accuracy"]

    record(0, model)
    done = {"step": 0}

    def evaluate(trained):
        done["step"] += recipe["eval_every"]
        return record(min(done["step"], steps), trained)

    train(
        model,
        recipes.induction_batches(recipe),
        steps=steps,
        lr=recipe["lr"],
        seed=seed,
        evaluate=evaluate,
        eval_every=recipe["eval_every"],
    )
    run = {
        "seed": seed,
        "n_layers": recipe["n_layers"],
        "n_heads": recipe["n_heads"],
        "steps": steps,
        "curves": curves,
    }
    if experiments:
        run["experiments"] = final_experiments(model, recipe, data, seed)
    return run


def final_experiments(model, recipe, data, seed):
    """Zero and mean ablation of every head, and (two blocks or more) the patching experiment."""
    with torch_threads(1):
        ablations = ablation_accuracies(model, data)
        result = {
            "ablation": [
                {"kind": key[0], "layer": key[1], "head": key[2], "repeat_accuracy": round(v, 4)}
                for key, v in ablations.items()
                if key != "none"
            ]
        }
        if recipe["n_layers"] >= 2:
            induction, previous = head_scores(model.attention_maps(data.tokens), data)
            previous_head = int(previous[0].argmax())
            other = 1 - previous_head if recipe["n_heads"] == 2 else int(previous[0].argmin())
            patch = patching_experiment(
                model, data, previous_head, other, torch.Generator().manual_seed(1000 + seed)
            )
            result["patching"] = {
                "previous_head": previous_head,
                "other_head": other,
                "induction_head": int(induction[1].argmax()),
                **{
                    k: (round(v, 4) if isinstance(v, float) else {n: round(x, 4) for n, x in v.items()})
                    for k, v in patch.items()
                },
            }
    return result


def _job(args):
    recipe, seed, steps, experiments = args
    return train_seed(recipe, seed, steps, experiments=experiments)


def sweep(seeds, steps, control_steps, *, jobs=1, log=print):
    """Every run of the sweep: the chapter's model, then the one-block control, for each seed."""
    control = dict(recipes.INDUCTION, n_layers=1)
    tasks = [(recipes.INDUCTION, s, steps, True) for s in seeds]
    tasks += [(control, s, control_steps, True) for s in seeds]
    runs = []
    if jobs > 1:
        with multiprocessing.get_context("spawn").Pool(jobs) as pool:
            for run in pool.imap(_job, tasks):
                runs.append(run)
                log(describe(run))
    else:
        for task in tasks:
            runs.append(_job(task))
            log(describe(runs[-1]))
    return {
        "recipe": recipes.INDUCTION,
        "control_recipe": control,
        "budget": recipes.INDUCTION["steps"],
        "formed_threshold": FORMED,
        "circuit_accuracy": CIRCUIT_ACCURACY,
        "runs": runs,
    }


def formed_at(run, rule, layer):
    """The first scored step at which some head of ``layer`` reaches :data:`FORMED` for ``rule``; None if never.

    ``rule`` is ``"previous"`` or ``"induction"``.
    """
    heads = run["n_heads"]
    for step, scores in zip(run["curves"]["step"], run["curves"][rule]):
        if max(scores[layer * heads : (layer + 1) * heads]) >= FORMED:
            return step
    return None


def accuracy_at(run, step):
    """Accuracy on the repeated tokens at the last scored step <= ``step``."""
    curves = run["curves"]
    index = max(i for i, s in enumerate(curves["step"]) if s <= step)
    return curves["repeat_accuracy"][index]


def circuit_formed_at(run):
    """The first scored step at which both heads have formed and the accuracy reaches :data:`CIRCUIT_ACCURACY`."""
    if run["n_layers"] < 2:
        return None
    previous, induction = formed_at(run, "previous", 0), formed_at(run, "induction", 1)
    if previous is None or induction is None:
        return None
    for step, accuracy in zip(run["curves"]["step"], run["curves"]["repeat_accuracy"]):
        if step >= max(previous, induction) and accuracy >= CIRCUIT_ACCURACY:
            return step
    return None


def summary(result):
    """One dict per seed: when each head and the circuit formed, accuracies at the budget and at the end."""
    budget = result["budget"]
    by_seed = {}
    for run in result["runs"]:
        entry = by_seed.setdefault(run["seed"], {"seed": run["seed"]})
        if run["n_layers"] >= 2:
            entry.update(
                previous_at=formed_at(run, "previous", 0),
                induction_at=formed_at(run, "induction", 1),
                circuit_at=circuit_formed_at(run),
                accuracy_budget=accuracy_at(run, budget),
                accuracy_end=run["curves"]["repeat_accuracy"][-1],
                steps=run["steps"],
            )
        else:
            entry.update(
                control_budget=accuracy_at(run, budget),
                control_end=run["curves"]["repeat_accuracy"][-1],
                control_steps=run["steps"],
            )
    return [by_seed[s] for s in sorted(by_seed)]


def describe(run):
    """A line about one run, for the log."""
    c = run["curves"]
    line = (
        f"seed {run['seed']} layers {run['n_layers']} steps {run['steps']}: repeat accuracy "
        f"{c['repeat_accuracy'][0]:.2f} -> {c['repeat_accuracy'][-1]:.2f}"
    )
    if run["n_layers"] >= 2:
        line += (
            f", previous-token head at {formed_at(run, 'previous', 0)}, induction head at "
            f"{formed_at(run, 'induction', 1)}, circuit at {circuit_formed_at(run)}"
        )
    return line


def load(path=DEFAULT_OUTPUT):
    """The stored sweep: a dict with ``stamp``, ``recipe``, ``control_recipe``, ``budget`` and ``runs``."""
    return json.loads(Path(path).read_text())


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seeds", default="0-7", help="seeds, e.g. 0-7 or 0,3,5 (default 0-7)")
    parser.add_argument(
        "--steps",
        type=int,
        default=None,
        help="training steps of the two-block model (default: 3 x the recipe's)",
    )
    parser.add_argument(
        "--control-steps",
        type=int,
        default=None,
        help="training steps of the one-block control (default: 2 x --steps)",
    )
    parser.add_argument("--jobs", type=int, default=1, help="seeds trained at once, one CPU thread each")
    parser.add_argument("--output", type=Path, default=DEFAULT_OUTPUT)
    args = parser.parse_args(argv)
    if "-" in args.seeds:
        low, high = (int(s) for s in args.seeds.split("-"))
        seeds = list(range(low, high + 1))
    else:
        seeds = [int(s) for s in args.seeds.split(",")]
    steps = args.steps or 3 * recipes.INDUCTION["steps"]
    control_steps = args.control_steps or 2 * steps
    command = "python -m attnlib.learn.sweep " + " ".join(argv if argv is not None else sys.argv[1:])
    provenance = stamp(command.strip())
    result = sweep(seeds, steps, control_steps, jobs=args.jobs)
    args.output.parent.mkdir(parents=True, exist_ok=True)
    args.output.write_text(
        json.dumps({"stamp": provenance, **result}, indent=None, separators=(",", ":")) + "\n"
    )
    print(f"wrote {args.output}")


if __name__ == "__main__":
    main()
