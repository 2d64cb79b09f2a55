"""Chapter 11, Timing attention: FLOPs, bytes, a correct timer, and the slope of time vs T.

Every check here runs on a CPU. The timer exercise stands in for a GPU with
a fake device whose work, like a CUDA kernel's, only finishes when you
synchronize; its checks count calls and use bounds far wider than any timing
noise.
"""

import math
import statistics
import time
from dataclasses import dataclass

import numpy as np

from .core import (
    Exercise,
    Failure,
    Mistake,
    ValueExercise,
    call_safely,
    describe_error,
    describe_value,
    fmt_number,
)

# The configurations the by-hand exercises ask about.
FLOPS_CONFIG = {"B": 8, "H": 16, "T": 4096, "d": 64}
BYTES_CONFIG = {"T": 32_768, "bytes_per_entry": 2}  # one head, one sequence, fp16


def forward_flops(B, H, T, d, causal=False):
    """Floating-point operations of the attention forward pass.

    Two matrix products, Q K^T and A V, each ``2 * T * T * d`` per head and
    sequence (a multiply and an add per term); a causal mask skips about half.
    The softmax's O(T^2) work is left out.
    """
    flops = 4 * B * H * T * T * d
    return flops / 2 if causal else flops


attention_flops = ValueExercise(
    id="ch11.attention_flops",
    title="Count the FLOPs",
    kind="by hand",
    task=(
        "How many floating-point operations (FLOPs) does a **causal** forward pass of attention "
        "take for $B = 8$ sequences, $H = 16$ heads, $T = 4096$ tokens and head width $d = 64$? "
        "Count the two matrix products only (a multiply-add is two FLOPs) and leave out the "
        "softmax, as this chapter does. Three significant figures are enough."
    ),
    starter="answer = ...  # a number, e.g. 1.23e12",
    solution=(
        "B, H, T, d = 8, 16, 4096, 64\n"
        "full = 4 * B * H * T**2 * d  # Q K^T and A V, 2 T^2 d each, per head and sequence\n"
        "answer = full / 2  # a causal mask skips the upper triangle: about half\n"
        'print(f"{answer:.3e} FLOPs")'
    ),
    answer_name="answer",
    expected=lambda: forward_flops(**FLOPS_CONFIG, causal=True),
    rtol=5e-3,
    tolerance_text="to 3 significant figures",
    hint=("count the multiply-adds of $QK^\\top$ and of $AV$ for one head and one sequence, "
          "as the section *What one forward pass costs* does, then scale up and ask what a "
          "causal mask skips"),
    mistakes={
        "not_halved": Mistake(
            lambda: forward_flops(**FLOPS_CONFIG),
            "that is the full pass: a causal mask lets each query skip the keys after it, "
            "about half the work",
        ),
        "linear_in_t": Mistake(
            lambda: forward_flops(**FLOPS_CONFIG, causal=True) / FLOPS_CONFIG["T"],
            "T appears squared: every query meets every key",
        ),
    },
    explanation=(
        "The count grows with $T^2$: the time of a compute-bound attention kernel does too, "
        "which is what this chapter measures."
    ),
)


def _score_bytes(T, bytes_per_entry):
    return T * T * bytes_per_entry


score_matrix_bytes = ValueExercise(
    id="ch11.score_matrix_bytes",
    title="The memory of one score matrix",
    kind="by hand",
    task=(
        "How many bytes does one $T \\times T$ score matrix take in fp16 (2 bytes per entry) for "
        "$T = 32{,}768$ tokens, for one head of one sequence? Give the answer in bytes."
    ),
    starter="answer = ...  # a number of bytes",
    solution=(
        "T, bytes_per_entry = 32_768, 2  # fp16\n"
        "answer = T * T * bytes_per_entry\n"
        'print(f"{answer:,} bytes = {answer / 2**30:g} GiB, for one head of one sequence")'
    ),
    answer_name="answer",
    expected=lambda: _score_bytes(**BYTES_CONFIG),
    rtol=1e-3,
    tolerance_text="in bytes",
    hint="count the entries, T times T, then the bytes of each",
    mistakes={
        "fp32": Mistake(
            lambda: _score_bytes(BYTES_CONFIG["T"], 4), "that counts 4 bytes per entry (fp32): fp16 takes 2"
        ),
        "gib": Mistake(
            lambda: _score_bytes(**BYTES_CONFIG) / 2**30,
            "that looks like GiB: give the answer in bytes (1 GiB = 2**30 bytes)",
        ),
        "entries": Mistake(
            lambda: _score_bytes(BYTES_CONFIG["T"], 1),
            "that is the number of entries: multiply by the bytes of each",
        ),
    },
    explanation=(
        "Multiply by the heads and the batch and the score matrices alone outgrow a GPU's memory, "
        "which is why fused kernels (chapter 12) never store them."
    ),
)


class FakeDevice:
    """A stand-in for a GPU: work is queued by ``launch`` and only done by ``sync``.

    ``costs[n]`` is how long (in seconds) the n-th launch's work takes; a launch
    itself returns at once, as a CUDA kernel launch does. ``busy_at_launch[n]``
    records whether earlier work was still queued when the n-th launch came.
    """

    def __init__(self, costs):
        self.costs = list(costs)
        self.launches = 0
        self.busy_at_launch = []
        self._pending = 0.0

    def launch(self):
        cost = self.costs[min(self.launches, len(self.costs) - 1)]
        self.busy_at_launch.append(self._pending > 0)
        self.launches += 1
        self._pending += cost

    def sync(self):
        if self._pending:
            time.sleep(self._pending)
            self._pending = 0.0


@dataclass(frozen=True)
class _TimerCase:
    description: str
    warmup: int
    repeats: int
    costs: tuple


_FAST = 0.002  # seconds of queued work per ordinary launch
_SLOW = 0.25  # the occasional slow launch (a first call that compiles, a hiccup)
_HICCUP = 0.15  # another slow launch, told apart from _SLOW by its length


def _timer_cases():
    return [
        _TimerCase("warmup=2, repeats=3, each launch queues 2 ms of work", 2, 3, (_FAST,)),
        _TimerCase("warmup=0, repeats=1: no warm-up, a single timed call", 0, 1, (_FAST,)),
        _TimerCase(  # the first and the last timed calls are slow: either alone is the wrong answer
            "warmup=1, repeats=5: the first launch takes 250 ms, and so does the first timed one; "
            "the last timed one takes 150 ms",
            1,
            5,
            (_SLOW, _SLOW, _FAST, _FAST, _FAST, _HICCUP),
        ),
    ]


@dataclass(frozen=True, eq=False, kw_only=True)
class TimerExercise(Exercise):
    """Checks a timing function against a :class:`FakeDevice`, with structural checks and wide bounds."""

    def check(self, answer):
        refusal = self.refuse_non_function(answer)
        if refusal is not None:
            return refusal
        cases = _timer_cases()
        for number, case in enumerate(cases, start=1):
            device = FakeDevice(case.costs)
            outcome = call_safely(
                answer, (device.launch, device.sync), {"warmup": case.warmup, "repeats": case.repeats}
            )
            if number == 1 and outcome.error is None and (outcome.value is None or outcome.value is Ellipsis):
                return self.returned_stub(answer, outcome.value)
            failure = self._judge(case, device, outcome)
            if failure is not None:
                headline = f"hidden case {number} of {len(cases)} failed: {case.description}."
                return self.failed(headline, failure, case.description)
        return self.passed(len(cases))

    def _judge(self, case, device, outcome):
        if outcome.error is not None:
            return Failure(
                (f"raised {describe_error(outcome.error)}",), "call fn() and sync() with no arguments"
            )
        value = outcome.value
        calls = case.warmup + case.repeats
        if device.launches != calls:
            hint = (
                "you skipped the warm-up calls: call fn() `warmup` times before timing"
                if device.launches == case.repeats
                else "call fn() exactly warmup + repeats times"
            )
            return Failure(
                (f"expected: fn() called {calls} times", f"given:    {device.launches} calls"), hint
            )
        if isinstance(value, (list, tuple, np.ndarray)):
            return Failure(
                ("expected: one number, the median time in seconds", f"given:    {describe_value(value)}"),
                "return the median of the times (statistics.median), not the list of times",
            )
        seconds = _as_seconds(value)
        if seconds is None:
            given = (
                describe_value(value)
                if isinstance(value, bool) or not isinstance(value, (int, float, np.number))
                else fmt_number(value)
            )
            return Failure(("expected: one finite number of seconds", f"given:    {given}"))
        value = seconds
        if value < _FAST / 2:
            return Failure(
                (
                    f"expected: at least {_FAST / 2 * 1e3:g} ms, the work each call queues",
                    f"given:    {value * 1e3:.3g} ms",
                ),
                "you stopped the clock before the work finished: call sync() after fn() and before reading "
                "the clock (GPU kernels run asynchronously)",
            )
        if case.warmup and device.busy_at_launch[case.warmup]:
            return Failure(
                (
                    "expected: an idle device when the first timed call starts",
                    "given:    the warm-up's work was still queued, so the first timed call "
                    "waited for it too",
                ),
                _WARMUP_SYNC_HINT,
            )
        one_call = _one_timed_call(case, value)
        if one_call is not None:
            return Failure(
                (f"expected: about {_FAST * 1e3:g} ms, the median of the {case.repeats} timed calls",
                 f"given:    {value * 1e3:.3g} ms, the time of the {one_call} timed call alone"),
                f"you returned the {one_call} call's time only: keep the time of every timed call in a "
                "list and return the median of that list",
            )
        if value > _SLOW / 5:
            return Failure(
                (f"expected: about {_FAST * 1e3:g} ms, the typical call", f"given:    {value * 1e3:.3g} ms"),
                "your result includes the slow calls: skip them with the warm-up and return the median of "
                "the repeats, not their mean or total",
            )
        return None


def _one_timed_call(case, seconds):
    """"first" or "last" when ``seconds`` is that timed call's own, slow time; else None."""
    timed = [case.costs[min(n, len(case.costs) - 1)] for n in range(case.warmup, case.warmup + case.repeats)]
    if case.repeats < 2 or statistics.median(timed) > _FAST:
        return None
    for which, cost in (("first", timed[0]), ("last", timed[-1])):
        if cost > _FAST and abs(seconds - cost) < cost / 4:
            return which
    return None


def _as_seconds(value):
    """A returned time as a finite float, or None (a bool, a string, NaN, inf, 10**400)."""
    if isinstance(value, bool) or not isinstance(value, (int, float, np.integer, np.floating)):
        return None
    try:
        seconds = float(value)
    except OverflowError:  # an integer too large for a float
        return None
    return seconds if math.isfinite(seconds) else None


_WARMUP_SYNC_HINT = (
    "call sync() after the warm-up calls, before the first timed call: the warm-up only launched its "
    "work, and without a sync that work is still running when the clock starts"
)


def _sync_after(fn, sync, warmup=1, repeats=5):
    for _ in range(warmup):
        fn()
    sync()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        sync()
        times.append(time.perf_counter() - start)
    return times


def _no_sync(fn, sync, warmup=1, repeats=5):
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    sync()
    return statistics.median(times)


def _no_warmup(fn, sync, warmup=1, repeats=5):
    return statistics.median(_sync_after(fn, sync, warmup=0, repeats=repeats))


def _no_sync_after_warmup(fn, sync, warmup=1, repeats=5):
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        sync()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


median_timer = TimerExercise(
    id="ch11.median_timer",
    title="A timer that tells the truth",
    kind="implement",
    task=(
        "Write `time_it(fn, sync, warmup=1, repeats=5)` that returns how long one call of `fn` takes, "
        "in seconds. `fn()` may only *launch* work, as a CUDA kernel launch does, and `sync()` waits "
        "until all launched work is done (on a GPU, `torch.cuda.synchronize`; on a CPU, a function "
        "that does nothing). Call `fn` `warmup` times untimed, then time `repeats` calls one by one "
        "and return the median. The device must be idle when each timed call starts and when its clock "
        "stops: call `sync()` once after the warm-up, before the first timed call, and after each timed "
        "call, before reading the clock. The check runs your timer on a pretend GPU whose work only "
        "finishes at `sync()`, and whose first call is slow."
    ),
    starter="def time_it(fn, sync, warmup=1, repeats=5):\n    ...  # your code here",
    solution=(
        "import statistics\n"
        "import time\n"
        "\n"
        "\n"
        "def time_it(fn, sync, warmup=1, repeats=5):\n"
        "    for _ in range(warmup):  # first calls compile, allocate, fill caches\n"
        "        fn()\n"
        "    sync()  # start from an idle device\n"
        "    times = []\n"
        "    for _ in range(repeats):\n"
        "        start = time.perf_counter()\n"
        "        fn()\n"
        "        sync()  # the launch returns at once: wait for the work itself\n"
        "        times.append(time.perf_counter() - start)\n"
        "    return statistics.median(times)  # robust to the odd slow call"
    ),
    answer_name="time_it",
    mistakes={
        "no_sync": Mistake(_no_sync, "you stopped the clock before the work finished: call sync()"),
        "mean": Mistake(
            lambda fn, sync, warmup=1, repeats=5: statistics.mean(_sync_after(fn, sync, warmup, repeats)),
            "your result includes the slow calls",
        ),
        "no_warmup": Mistake(_no_warmup, "you skipped the warm-up calls"),
        "no_sync_after_warmup": Mistake(_no_sync_after_warmup, _WARMUP_SYNC_HINT),
        "first_call_only": Mistake(
            lambda fn, sync, warmup=1, repeats=5: _sync_after(fn, sync, warmup, repeats)[0],
            "you returned the first call's time only",
        ),
        "last_call_only": Mistake(
            lambda fn, sync, warmup=1, repeats=5: _sync_after(fn, sync, warmup, repeats)[-1],
            "you returned the last call's time only",
        ),
        "list": Mistake(_sync_after, "not the list of times"),
    },
    explanation=(
        "Without `sync()` the clock measures only the launch, microseconds, however long the kernel "
        "runs. Without the `sync()` after the warm-up, the first timed call also waits for the warm-up's "
        "work. The warm-up keeps one-off costs (compilation, memory allocation) out of the numbers, "
        "and the median ignores the odd slow repeat that a mean would absorb."
    ),
)


# The predict exercise: a training run that keeps the tokens per batch fixed.
TOKENS_PER_BATCH = 65_536
SLOPE_LENGTHS = (1024, 2048, 4096, 8192, 16384)


def _log_log_slope(tokens_per_batch=TOKENS_PER_BATCH):
    """The slope of log(FLOPs) against log(T) with B = tokens_per_batch / T (B = 1 when None)."""
    lengths = np.array(SLOPE_LENGTHS)
    batches = [1 if tokens_per_batch is None else tokens_per_batch // int(T) for T in lengths]
    flops = [forward_flops(B, 8, int(T), 64) for B, T in zip(batches, lengths)]
    return float(np.polyfit(np.log(lengths), np.log(flops), 1)[0])


_TOKENS_TEXT = f"{TOKENS_PER_BATCH:,}".replace(",", "{,}")  # a thousands comma in LaTeX

time_vs_t_slope = ValueExercise(
    id="ch11.time_vs_t_slope",
    title="The slope of time against T, at a fixed number of tokens",
    kind="predict",
    task=(
        "A training run keeps the number of tokens per batch fixed, "
        f"$B \\cdot T = {_TOKENS_TEXT}$: doubling the sequence length $T$ halves the batch $B$. "
        "For long sequences, attention's forward time is dominated by its FLOPs. On a log-log plot "
        "of the forward time of one batch against $T$ (with $H$ and $d$ fixed), what slope do you "
        "expect? Set `answer` to the slope."
    ),
    starter="answer = ...  # a number",
    solution=(
        f"T = np.array({list(SLOPE_LENGTHS)})\n"
        f"B = {TOKENS_PER_BATCH:_} // T  # fewer sequences per batch as they get longer\n"
        "flops = 4 * B * 8 * T.astype(float)**2 * 64  # H=8, d=64\n"
        "slope = np.polyfit(np.log(T), np.log(flops), 1)[0]  # the exponent of T\n"
        'print(f"slope {slope:.2f}")\n'
        "answer = 1"
    ),
    answer_name="answer",
    expected=_log_log_slope,
    atol=0.02,
    tolerance_text="within 0.02",
    hint="write the FLOPs 4 B H T^2 d with B = (tokens per batch) / T, and read off the power of T",
    mistakes={
        "batch_fixed": Mistake(
            lambda: _log_log_slope(tokens_per_batch=None),
            "that is the slope for a fixed batch: here B = (tokens per batch) / T shrinks as T grows",
        ),
        "no_growth": Mistake(
            lambda: _log_log_slope() - 1,
            "the number of tokens is fixed, but each query is scored against T keys, and T grows",
        ),
    },
    explanation=(
        "The FLOPs are $4 B H T^2 d$ with $B \\propto 1/T$, so they grow like $T$: slope 1. "
        "At a fixed token budget, longer sequences cost more attention work per token, because "
        "each query meets more keys."
    ),
)

EXERCISES = (attention_flops, score_matrix_bytes, median_timer, time_vs_t_slope)
