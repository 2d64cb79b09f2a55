"""Training: one step of gradient descent, and a seeded loop around it.

The loop is deterministic on one machine: the batches come from a seeded
``torch.Generator`` and torch runs on one thread, so two runs with the same seed
on the same machine and the same build of torch give the same weights, bit for
bit. Across machines they do not: another CPU (or another torch build) may round
some sums differently, and training amplifies those differences. The models
therefore train in float64, where rounding differences start near 1e-16 and stay
far below the digits the book prints; in float32 they start near 1e-7 and can
reach the third decimal.

:func:`perturb_initial_weights` is how the tests check that margin: with the
environment variable ``ATTNLIB_PERTURB_INITIAL_WEIGHTS`` set (to ``1e-9``, say),
:func:`train` first multiplies every weight by ``1 + 1e-9`` or ``1 - 1e-9`` (a
seeded choice), a change ten million times larger than float64 rounding, and the
chapters must still print the same numbers.
"""

import contextlib
import os
from dataclasses import dataclass, field

import torch
from torch.nn import functional

from .memo import stored


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


@stored  # 81 distances over every training sentence: seconds; make test computes it once
def loss_along_gradient(model, tokens, targets, distances, *, measured_on=None):
    """The loss with every weight moved a distance ``t`` against one batch's gradient, for each ``t``.

    The weights move along ``-g / |g|``, ``g`` the gradient over all of them of
    the loss on ``(tokens, targets)``, so near ``t = 0`` that loss falls with
    slope ``-|g|``. ``measured_on``, a further ``(tokens, targets)``, measures
    the loss of other sentences along the same move instead (how much a step
    fitted to one batch helps the rest). Returns ``(losses, gradient_norm)``;
    the model's weights are left as they were.
    """
    if len(distances) == 0:
        raise ValueError("distances is empty: give at least one distance to move")
    measure_tokens, measure_targets = (tokens, targets) if measured_on is None else measured_on
    if len(measure_tokens) != len(measure_targets):
        raise ValueError(f"measured_on: {len(measure_tokens)} sequences of tokens but "
                         f"{len(measure_targets)} targets")
    params = [p for p in model.parameters() if p.requires_grad]
    model.zero_grad()
    classification_loss(model(tokens), targets).backward()
    grads = [p.grad.detach().clone() for p in params]
    norm = torch.sqrt(sum((g**2).sum() for g in grads))
    start = [p.detach().clone() for p in params]
    losses = []
    with torch.no_grad():
        for t in distances:
            for p, p0, g in zip(params, start, grads):
                p.copy_(p0 - float(t) * g / norm)  # t along the direction of steepest descent
            losses.append(classification_loss(model(measure_tokens), measure_targets).item())
        for p, p0 in zip(params, start):
            p.copy_(p0)
    model.zero_grad()
    return losses, float(norm)


PERTURB_ENV = "ATTNLIB_PERTURB_INITIAL_WEIGHTS"


@torch.no_grad()
def perturb_initial_weights(model, relative=None, seed=0):
    """Multiply every weight of ``model`` by ``1 + relative`` or ``1 - relative``, in place.

    Parameters
    ----------
    model : torch.nn.Module
    relative : float, optional
        The relative size of the change; by default the value of the
        environment variable ``ATTNLIB_PERTURB_INITIAL_WEIGHTS``, and no change
        at all when that is unset or 0.
    seed : int
        Seeds the choice of sign for each weight.

    Returns
    -------
    float
        The relative size used (0.0 when nothing changed).
    """
    if relative is None:
        relative = float(os.environ.get(PERTURB_ENV) or 0.0)
    if relative:
        generator = torch.Generator().manual_seed(seed)
        for parameter in model.parameters():
            signs = torch.randint(2, parameter.shape, generator=generator) * 2 - 1  # +-1 each
            parameter.mul_(1 + relative * signs.to(parameter.dtype))
    return float(relative)


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


def train(model, sample_batch, *, steps, lr=3e-3, seed=0, evaluate=None, eval_every=50, log=None,
          lr_decay=False):
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
    lr_decay : bool
        Lower the learning rate linearly from ``lr`` towards 0 over the run (the
        last step takes ``lr / steps``). Adam's steps keep their full size even
        when the gradients are tiny, so late in a run, with the loss near 0, the
        weights would keep moving; shrinking steps let them settle.

    Returns
    -------
    History
    """
    perturb_initial_weights(model)  # no-op unless asked; nudges weights by 1e-9
    generator = torch.Generator().manual_seed(seed)
    optimizer = torch.optim.Adam(model.parameters(), lr=lr)
    schedule = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda done: 1 - done / steps) if lr_decay else None
    history = History()
    with torch_threads(1):
        for step in range(1, steps + 1):
            tokens, targets = sample_batch(generator)
            history.losses.append(training_step(model, optimizer, tokens, targets))
            if schedule is not None:
                schedule.step()
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
