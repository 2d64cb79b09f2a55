"""Training: one step of gradient descent, and a seeded loop around it.

The loop is deterministic: the batches come from a seeded ``torch.Generator``
and torch runs on one thread, so two runs with the same seed give the same
weights, bit for bit.
"""

import contextlib
from dataclasses import dataclass, field

import torch
from torch.nn import functional


def classification_loss(logits, targets):
    """Mean cross-entropy: logits (B, P, n_targets, n_classes), targets (B, P, n_targets)."""
    return functional.cross_entropy(logits.flatten(0, -2), targets.flatten())


def training_step(model, optimizer, tokens, targets):
    """One step: forward, loss, gradients, update. Returns the loss as a float."""
    optimizer.zero_grad()  # gradients accumulate in .grad unless cleared
    loss = classification_loss(model(tokens), targets)
    loss.backward()  # d loss / d every parameter, into .grad
    torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm=1.0)
    optimizer.step()  # Adam moves every parameter against its gradient
    return loss.item()


@torch.no_grad()
def accuracy(model, tokens, targets):
    """Fraction of answers the model gets right: argmax of the logits against ``targets``."""
    return (model(tokens).argmax(dim=-1) == targets).float().mean().item()


@contextlib.contextmanager
def torch_threads(n):
    """Run torch on ``n`` threads inside the block, then restore the previous count."""
    before = torch.get_num_threads()
    torch.set_num_threads(n)
    try:
        yield
    finally:
        torch.set_num_threads(before)


@dataclass
class History:
    """What a training run recorded: the loss at every step, accuracy every ``eval_every``."""

    losses: list = field(default_factory=list)
    eval_steps: list = field(default_factory=list)
    eval_accuracy: list = field(default_factory=list)


def train(model, sample_batch, *, steps, lr=3e-3, seed=0, evaluate=None, eval_every=50, log=None):
    """Train ``model`` with Adam for ``steps`` steps; deterministic given ``seed``.

    Parameters
    ----------
    model : AttentionModel
    sample_batch : callable
        ``sample_batch(generator) -> (tokens, targets)``: one batch, drawn
        from the seeded generator the loop owns.
    steps : int
    lr : float
        Adam's learning rate.
    seed : int
        Seeds the batch order.
    evaluate : callable, optional
        ``evaluate(model) -> float``, e.g. held-out accuracy, run every
        ``eval_every`` steps and after the last.
    log : callable, optional
        ``log(step, loss, accuracy)`` after each evaluation (e.g. print).

    Returns
    -------
    History
    """
    generator = torch.Generator().manual_seed(seed)
    optimizer = torch.optim.Adam(model.parameters(), lr=lr)
    history = History()
    with torch_threads(1):
        for step in range(1, steps + 1):
            tokens, targets = sample_batch(generator)
            history.losses.append(training_step(model, optimizer, tokens, targets))
            if evaluate is not None and (step % eval_every == 0 or step == steps):
                history.eval_steps.append(step)
                history.eval_accuracy.append(evaluate(model))
                if log is not None:
                    log(step, history.losses[-1], history.eval_accuracy[-1])
    return history


def batches_from(tokens, targets, batch_size):
    """A ``sample_batch`` for :func:`train` drawing ``batch_size`` rows of a fixed dataset."""

    def sample_batch(generator):
        rows = torch.randint(len(tokens), (batch_size,), generator=generator)  # (batch_size,)
        return tokens[rows], targets[rows]

    return sample_batch
