"""A small GPT on real text: chapter 8's decoder trained on the King James Bible, one character a token.

    python -m attnlib.learn.gpt train --seed 0 --output attnlib/data/gpt/seed_0
    python -m attnlib.learn.gpt evaluate

The recipe is :data:`attnlib.learn.recipes.GPT`. Training draws batches of random windows of
the training text (:func:`attnlib.text.corpus.split`) from a generator seeded with the run's
seed, on one CPU thread, so a run is reproducible on one machine; the initial weights come from
the same seed. The learning rate rises linearly for ``warmup_steps``, then falls along a cosine
to ``final_lr_fraction`` of its peak at the last step.

Held-out loss is measured on a fixed set of ``eval_windows`` windows of ``context + 1`` characters,
drawn from the held-out text by a generator seeded with ``eval_seed`` (the same windows for
every run): the model predicts characters 2 ... ``context + 1`` of each window from the ones before,
and the loss is the total of their cross-entropies (in nats) divided by the number of
characters predicted. With one character a token this is the mean loss per token; for a
tokenizer whose tokens hold several characters it would be total nats over total characters.

The baselines (:func:`baselines`) predict the same characters from counts of the training
text with add-one (Laplace) smoothing: the unigram model ignores the context, the bigram model
looks at the character before.

``train`` writes two files to its output folder:

- ``checkpoint.pt``: the weights (stored in float32, the dtype the recipe trains in), the
  recipe, the seed and the tokenizer's vocabulary;
- ``log.json``: the training loss every ``log_every`` steps (the mean over those steps,
  rounded to 4 decimals), the held-out loss every ``eval_every`` steps and at the end, the
  wall time, the parameter count, and the stamp (:func:`attnlib.provenance.stamp`) with the
  seed, dtype and wall time added.

:func:`replay` trains the first steps of a fresh run again and returns its first logged
losses, so that a reader (and ``tests/test_gpt.py``) can check that a stored log came from
this code.
"""

import argparse
import functools
import json
import math
import sys
import time
from pathlib import Path

import numpy as np
import torch
from torch.nn import functional

from ..provenance import stamp
from ..text import corpus
from ..text.bpe import BPE, CharTokenizer, train_bpe
from . import recipes
from .training import perturb_initial_weights, torch_threads, training_step
from .transformer import Decoder

DEFAULT_DIR = Path(__file__).resolve().parent.parent / "data" / "gpt"
LOSS_DIGITS = 4  # the log's losses, and the replay's, are rounded to this many decimals


@functools.cache
def text_split():
    """(train, held_out): the corpus split by chapter (:func:`attnlib.text.corpus.split`)."""
    return corpus.split(corpus.load_text())


@functools.cache
def tokenizer(kind="characters", bpe_merges=0):
    """The tokenizer of a recipe, learned from the training text.

    ``kind="characters"``: one token per character (63 characters; the held-out text uses no
    other). ``kind="bpe"``: those characters and ``bpe_merges`` byte-pair merges
    (:func:`attnlib.text.bpe.train_bpe`).
    """
    if kind == "characters":
        return CharTokenizer.from_text(text_split()[0])
    if kind == "bpe":
        return train_bpe(text_split()[0], bpe_merges)
    raise ValueError(f"tokenizer kind must be 'characters' or 'bpe', got {kind!r}")


def recipe_tokenizer(recipe):
    """The tokenizer ``recipe`` names (its ``tokenizer`` and, for BPE, ``bpe_merges``)."""
    return tokenizer(recipe["tokenizer"], recipe.get("bpe_merges", 0))


@functools.cache
def encoded(part, kind="characters", bpe_merges=0):
    """The ids of ``part`` ("train" or "held_out") as a LongTensor (n_tokens,)."""
    train, held_out = text_split()
    return torch.tensor(tokenizer(kind, bpe_merges).encode({"train": train, "held_out": held_out}[part]))


def recipe_encoded(part, recipe):
    return encoded(part, recipe["tokenizer"], recipe.get("bpe_merges", 0))


def random_windows(ids, n, length, generator):
    """``n`` windows of ``length`` consecutive ids, at starts drawn from ``generator``: (n, length)."""
    starts = torch.randint(len(ids) - length + 1, (n,), generator=generator)  # (n,)
    return ids[starts[:, None] + torch.arange(length)]  # (n, 1) + (length,) -> (n, length)


@functools.cache
def _seeded_windows(n, length, seed, kind="characters", bpe_merges=0):
    ids = encoded("held_out", kind, bpe_merges)
    return random_windows(ids, n, length, torch.Generator().manual_seed(seed))


def heldout_windows(recipe=recipes.GPT):
    """The fixed held-out windows every run is scored on: (eval_windows, context + 1), drawn with eval_seed.

    Like a training window, each holds ``context`` inputs and the ``context`` characters they predict.
    """
    return _seeded_windows(recipe["eval_windows"], recipe["context"] + 1, recipe["eval_seed"],
                           recipe["tokenizer"], recipe.get("bpe_merges", 0))


def build_model(recipe=recipes.GPT, seed=0):
    """The recipe's untrained decoder (chapter 8's, MLP and RoPE), weights seeded by ``seed``."""
    vocab_size = len(recipe_tokenizer(recipe).vocab)
    return Decoder(vocab_size, recipe["d_model"], recipe["n_heads"], recipe["n_layers"],
                   positions="rope", mlp=True, embedding_std=recipe["embedding_std"],
                   seed=seed, dtype=getattr(torch, recipe["dtype"]))


def parameter_count(model):
    return sum(p.numel() for p in model.parameters())


@torch.no_grad()
def heldout_loss(model, windows=None, vocab=None, batch=256):
    """Held-out loss in nats per character: total cross-entropy over the characters predicted.

    Parameters
    ----------
    model : Decoder
    windows : LongTensor (n, T), optional
        Token ids; the recipe's fixed held-out windows by default. Tokens 2 ... T of each
        window are predicted from the ones before.
    vocab : list of str, optional
        The tokenizer's vocabulary, to count the characters of each predicted token (1 each
        for characters, the default).
    """
    windows = heldout_windows() if windows is None else windows
    characters = (torch.ones(model.vocab_size) if vocab is None
                  else torch.tensor([len(token) for token in vocab], dtype=torch.float64))  # (V,)
    nats, n_characters = 0.0, 0.0
    with torch_threads(1):
        for rows in windows.split(batch):  # (b, T) each
            logits = model(rows)[:, :-1]  # (b, T - 1, V): row t scores token t + 1
            targets = rows[:, 1:]  # (b, T - 1)
            nats += functional.cross_entropy(logits.flatten(0, 1).double(), targets.flatten(),
                                             reduction="sum").item()
            n_characters += characters[targets].sum().item()
    return nats / n_characters


def baseline_losses(train_ids, windows, vocab_size):
    """Unigram and bigram losses (nats per token) on the windows' predicted tokens, add-one smoothed.

    Counts come from ``train_ids`` (n,); ``windows`` (m, T) are scored at tokens 2 ... T, the
    bigram model conditioning on the token before each.
    """
    train_ids, windows = np.asarray(train_ids), np.asarray(windows)
    unigram = np.bincount(train_ids, minlength=vocab_size) + 1.0  # (V,) counts + 1
    unigram /= unigram.sum()
    pairs = np.zeros((vocab_size, vocab_size))
    np.add.at(pairs, (train_ids[:-1], train_ids[1:]), 1.0)  # (V, V): previous -> next
    bigram = (pairs + 1.0) / (pairs + 1.0).sum(axis=1, keepdims=True)  # each row sums to 1
    previous, targets = windows[:, :-1].ravel(), windows[:, 1:].ravel()
    return -np.log(unigram[targets]).mean(), -np.log(bigram[previous, targets]).mean()


@functools.cache
def baselines():
    """``{"unigram": U, "bigram": B}``, nats per character on the fixed held-out windows."""
    unigram, bigram = baseline_losses(encoded("train").numpy(), heldout_windows().numpy(),
                                      len(tokenizer().vocab))
    return {"unigram": float(unigram), "bigram": float(bigram)}


def learning_rate(step, recipe):
    """The learning rate of step ``step`` (0-based): linear warm-up, then a cosine down to the floor."""
    peak, warmup, steps = recipe["lr"], recipe["warmup_steps"], recipe["steps"]
    if step < warmup:
        return peak * (step + 1) / warmup
    progress = (step - warmup) / max(steps - warmup, 1)  # 0 -> 1 over the rest of the run
    floor = recipe["final_lr_fraction"]
    return peak * (floor + (1 - floor) * 0.5 * (1 + math.cos(math.pi * progress)))


def train(seed, recipe=recipes.GPT, *, stop_after=None, log=None):
    """Train the recipe from scratch with ``seed``; ``(model, record)``.

    ``stop_after`` ends the run after that many steps, with the learning rates of the full
    run (what :func:`replay` needs). ``record`` holds ``losses`` (mean training loss of each
    ``log_every`` steps), ``heldout`` (``[step, nats per character]`` every ``eval_every``
    steps and at the end), ``heldout_nats_per_char`` (the last), ``parameters`` and
    ``wall_seconds``. ``log(text)`` is called at every held-out evaluation.
    """
    start = time.perf_counter()
    model = build_model(recipe, seed)
    perturb_initial_weights(model)  # nothing unless a test asks for it (see attnlib.learn.training)
    optimizer = torch.optim.Adam(model.parameters(), lr=recipe["lr"])
    generator = torch.Generator().manual_seed(seed)  # the batches' order
    train_ids, length = recipe_encoded("train", recipe), recipe["context"] + 1
    vocab = None if recipe["tokenizer"] == "characters" else recipe_tokenizer(recipe).vocab
    steps = recipe["steps"] if stop_after is None else min(stop_after, recipe["steps"])
    record = {"losses": [], "heldout": []}
    recent = []
    with torch_threads(1):
        for step in range(steps):
            for group in optimizer.param_groups:
                group["lr"] = learning_rate(step, recipe)
            windows = random_windows(train_ids, recipe["batch_size"], length, generator)  # (B, T + 1)
            recent.append(training_step(model, optimizer, windows[:, :-1], windows[:, 1:]))
            if len(recent) == recipe["log_every"]:
                record["losses"].append(round(sum(recent) / len(recent), LOSS_DIGITS))
                recent = []
            done = step + 1
            if stop_after is None and (done % recipe["eval_every"] == 0 or done == steps):
                heldout = heldout_loss(model, heldout_windows(recipe), vocab)
                record["heldout"].append([done, round(heldout, LOSS_DIGITS)])
                if log is not None:
                    log(f"step {done}: training loss {record['losses'][-1]:.4f}, held-out "
                        f"{record['heldout'][-1][1]:.4f} nats/char, {time.perf_counter() - start:.0f} s")
    record["heldout_nats_per_char"] = record["heldout"][-1][1] if record["heldout"] else None
    record["parameters"] = parameter_count(model)
    record["wall_seconds"] = round(time.perf_counter() - start, 1)
    return model, record


def replay(seed, steps, recipe=recipes.GPT):
    """The first ``steps`` logged losses of a fresh run with ``seed`` (``steps * log_every`` steps)."""
    _, record = train(seed, recipe, stop_after=steps * recipe["log_every"])
    return record["losses"][:steps]


def save(model, record, recipe, seed, output, command):
    """Write ``checkpoint.pt`` and ``log.json`` (see the module docstring) to the folder ``output``."""
    output = Path(output)
    output.mkdir(parents=True, exist_ok=True)
    weights = {name: tensor.detach().to(torch.float32).clone() for name, tensor in model.state_dict().items()}
    used = recipe_tokenizer(recipe)
    checkpoint = {"state_dict": weights, "recipe": dict(recipe), "seed": seed, "vocab": list(used.vocab)}
    if isinstance(used, BPE):
        checkpoint["merges"] = [list(pair) for pair in used.merges]
    torch.save(checkpoint, output / "checkpoint.pt")
    provenance = dict(stamp(command), seed=seed, dtype=recipe["dtype"], wall_seconds=record["wall_seconds"])
    log = {"stamp": provenance, "recipe": dict(recipe), "seed": seed, "tokenizer": recipe["tokenizer"],
           "heldout_windows": list(heldout_windows(recipe).shape), **record}
    (output / "log.json").write_text(json.dumps(log, indent=None, separators=(",", ":")) + "\n")


def load(directory):
    """``(model, tokenizer, log)`` from a folder ``train`` wrote; the model in float32, in eval mode.

    The tokenizer is a :class:`~attnlib.text.bpe.CharTokenizer`, or a :class:`~attnlib.text.bpe.BPE`
    for a run of the BPE recipe.
    """
    directory = Path(directory)
    checkpoint = torch.load(directory / "checkpoint.pt", weights_only=True)
    recipe = dict(checkpoint["recipe"], dtype="float32")
    if "merges" in checkpoint:
        used = BPE(checkpoint["vocab"], [tuple(pair) for pair in checkpoint["merges"]])
    else:
        used = CharTokenizer(checkpoint["vocab"])
    model = Decoder(len(used.vocab), recipe["d_model"], recipe["n_heads"], recipe["n_layers"],
                    positions="rope", mlp=True, embedding_std=recipe["embedding_std"], dtype=torch.float32)
    model.load_state_dict(checkpoint["state_dict"])
    model.eval()
    return model, used, json.loads((directory / "log.json").read_text())


def stored_seeds(directory=DEFAULT_DIR):
    """``{seed: folder}`` for every ``seed_S`` folder under ``directory`` that holds a checkpoint."""
    folders = Path(directory).glob("seed_*/checkpoint.pt")
    return dict(sorted((int(path.parent.name.removeprefix("seed_")), path.parent) for path in folders))


def evaluation_line(seed, heldout, baseline):
    """``seed S: held-out X nats/char (unigram U, bigram B)``, three decimals."""
    return (f"seed {seed}: held-out {heldout:.3f} nats/char "
            f"(unigram {baseline['unigram']:.3f}, bigram {baseline['bigram']:.3f})")


@functools.cache
def _stored_heldout_losses(directory):
    return {seed: heldout_loss(load(folder)[0]) for seed, folder in stored_seeds(directory).items()}


def stored_heldout_losses(directory=DEFAULT_DIR):
    """``{seed: held-out loss}`` of every stored checkpoint, recomputed once per process (seconds each)."""
    return dict(_stored_heldout_losses(Path(directory).resolve()))


def evaluate(directory=DEFAULT_DIR):
    """One :func:`evaluation_line` per stored checkpoint, its held-out loss recomputed."""
    return [evaluation_line(seed, loss, baselines()) for seed, loss in stored_heldout_losses(directory).items()]


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    commands = parser.add_subparsers(dest="command", required=True)
    train_parser = commands.add_parser("train", help="train the recipe from scratch and write a checkpoint")
    train_parser.add_argument("--seed", type=int, required=True)
    train_parser.add_argument("--output", type=Path, required=True)
    train_parser.add_argument("--steps", type=int, default=None,
                              help="training steps (default: the recipe's)")
    train_parser.add_argument("--tokenizer", choices=["characters", "bpe"], default="characters",
                              help="characters (the recipe GPT, the default) or bpe (GPT_BPE)")
    evaluate_parser = commands.add_parser("evaluate", help="held-out loss of every stored checkpoint")
    evaluate_parser.add_argument("--dir", type=Path, default=DEFAULT_DIR)
    args = parser.parse_args(argv)
    if args.command == "evaluate":
        for line in evaluate(args.dir):
            print(line)
        return
    torch.set_num_threads(1)  # one core per run, as the recipe's time is measured
    base = recipes.GPT if args.tokenizer == "characters" else recipes.GPT_BPE
    recipe = dict(base, steps=args.steps or base["steps"])
    command = "python -m attnlib.learn.gpt " + " ".join(argv if argv is not None else sys.argv[1:])
    model, record = train(args.seed, recipe, log=functools.partial(print, flush=True))
    save(model, record, recipe, args.seed, args.output, command.strip())
    print(f"seed {args.seed}: held-out {record['heldout_nats_per_char']:.3f} nats/char after "
          f"{recipe['steps']} steps in {record['wall_seconds']:.0f} s; wrote {args.output}")


if __name__ == "__main__":
    main()
