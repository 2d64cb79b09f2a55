"""Train each recipe once per test session: a training result stored on disk, keyed on everything it depends on.

``make test`` executes the same training many times: chapter 9 retrains chapter 8's
model (a reader may open chapter 9 alone), chapters 5 and 6 retrain chapter 7's, the
reader's edition of every chapter runs again, and the unit tests train the same
recipes. Training here is deterministic on one machine (one thread, seeded
generators; see :mod:`.training`), so a second run with the same inputs gives the
same bits as the first. With the environment variable ``ATTNLIB_TRAINING_CACHE``
naming a folder, a function wrapped in :func:`stored` saves its result there and a
later call with the same inputs, in any process, loads it instead of training again.
Unset (as for every reader), nothing is stored and everything trains.

The key is a hash of the function's name, its arguments (tensors and models by their
values), the source of every ``attnlib`` module, the versions of Python, torch and
NumPy, torch's thread count, and the environment variables that change the
arithmetic (``ATTNLIB_PERTURB_INITIAL_WEIGHTS``, ``ATEN_CPU_CAPABILITY``,
``MKL_CBWR``, ``OMP_NUM_THREADS``): a perturbed run never reuses an unperturbed one's
model. A call whose arguments cannot be hashed, or that changed torch's or NumPy's
global random state, is not stored. A model passed in and trained in place gets the
stored weights loaded into it; calls made to a ``log`` argument are recorded and
replayed in order. A lock file makes a second process wait for the first to finish
the same training, then load it.
"""

import dataclasses
import functools
import hashlib
import inspect
import io
import os
import platform
import random
from contextlib import contextmanager
from pathlib import Path

CACHE_ENV = "ATTNLIB_TRAINING_CACHE"
ARITHMETIC_ENV = ("ATTNLIB_PERTURB_INITIAL_WEIGHTS", "ATEN_CPU_CAPABILITY", "MKL_CBWR", "OMP_NUM_THREADS")
PACKAGE = Path(__file__).resolve().parents[1]


class Unhashable(TypeError):
    """An argument :func:`stored` cannot key on: the call runs without the store."""


@functools.cache
def _source_digest():
    digest = hashlib.sha256()
    for path in sorted(PACKAGE.rglob("*.py")):
        digest.update(str(path.relative_to(PACKAGE)).encode())
        digest.update(path.read_bytes())
    return digest.hexdigest()


def _feed(digest, value):
    """Feed ``value`` into ``digest`` by its contents, tagged with its type."""
    import numpy as np
    import torch

    digest.update(type(value).__qualname__.encode() + b"|")
    if value is None or isinstance(value, (bool, int, float, str, bytes)):
        digest.update(repr(value).encode() + b";")
    elif isinstance(value, torch.Tensor):
        tensor = value.detach().cpu().contiguous()
        digest.update(f"{tensor.dtype}{tuple(tensor.shape)}".encode())
        digest.update(tensor.view(torch.uint8).numpy().tobytes() if tensor.numel() else b"")
    elif isinstance(value, np.ndarray):
        digest.update(f"{value.dtype}{value.shape}".encode())
        digest.update(np.ascontiguousarray(value).tobytes())
    elif isinstance(value, torch.nn.Module):
        digest.update(repr(value).encode())  # the architecture
        _feed(digest, dict(value.state_dict()))
        _feed(digest, {name: getattr(value, name) for name in sorted(vars(value))
                       if not name.startswith("_") and name != "training"})
    elif isinstance(value, dict):
        for key in sorted(value, key=repr):
            _feed(digest, key)
            _feed(digest, value[key])
    elif isinstance(value, (list, tuple, frozenset, set)):
        items = sorted(value, key=repr) if isinstance(value, (set, frozenset)) else value
        digest.update(f"{len(items)}[".encode())
        for item in items:
            _feed(digest, item)
    elif dataclasses.is_dataclass(value) or hasattr(value, "_fields"):
        fields = (value._asdict() if hasattr(value, "_fields")
                  else {f.name: getattr(value, f.name) for f in dataclasses.fields(value)})
        _feed(digest, fields)
    else:
        raise Unhashable(f"cannot key on an argument of type {type(value).__qualname__}")


def key(function, arguments):
    """The store's key for calling ``function`` with ``arguments`` (a name -> value dict) here."""
    import numpy as np
    import torch

    digest = hashlib.sha256()
    _feed(digest, {
        "function": f"{function.__module__}.{function.__qualname__}",
        "arguments": arguments,
        "source": _source_digest(),
        "versions": (platform.python_version(), torch.__version__, np.__version__),
        "threads": torch.get_num_threads(),
        "environment": {name: os.environ.get(name) for name in ARITHMETIC_ENV},
    })
    return digest.hexdigest()[:32]


def _global_random_state():
    import numpy as np
    import torch

    state = np.random.get_state()
    return torch.get_rng_state().numpy().tobytes(), state[1].tobytes(), state[2], repr(random.getstate())


@contextmanager
def _locked(path):
    import fcntl  # POSIX only; readers on other systems never set ATTNLIB_TRAINING_CACHE

    with open(path.with_suffix(".lock"), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


def stored(function):
    """Wrap a training function so that, with ``ATTNLIB_TRAINING_CACHE`` set, equal calls train once.

    The arguments that are ``torch.nn.Module`` objects are taken to be trained in place:
    their weights after the call are stored with the result and loaded into them on a
    later call (what else a call leaves in a module, its ``.grad`` say, is not restored). A
    ``log`` argument is left out of the key; the calls made to it are stored
    and made again, with the same values, on a later call.
    """
    signature = inspect.signature(function)
    takes_log = "log" in signature.parameters

    @functools.wraps(function)
    def wrapper(*args, **kwargs):
        folder = os.environ.get(CACHE_ENV)
        if not folder:
            return function(*args, **kwargs)
        import torch

        bound = signature.bind(*args, **kwargs)
        bound.apply_defaults()
        arguments = dict(bound.arguments)
        log = arguments.pop("log", None)
        try:
            path = Path(folder) / f"{function.__name__}-{key(function, arguments)}.pt"
        except Unhashable:
            return function(*args, **kwargs)
        modules = {name: value for name, value in arguments.items() if isinstance(value, torch.nn.Module)}
        path.parent.mkdir(parents=True, exist_ok=True)
        with _locked(path):
            if path.exists():
                saved = torch.load(path, weights_only=False)
                for name, state in saved["modules"].items():
                    modules[name].load_state_dict(state)
                for call in saved["log"] if log is not None else ():
                    log(*call)
                return saved["result"]
            calls = []
            if takes_log:  # recorded even when no log was given: a later call may give one
                def recording(*call):
                    calls.append(call)
                    return None if log is None else log(*call)
                bound.arguments["log"] = recording
            before = _global_random_state()
            result = function(*bound.args, **bound.kwargs)
            if _global_random_state() != before:
                return result  # it drew from a global generator: a replay could not restore that
            buffer = io.BytesIO()
            torch.save({"result": result, "log": calls,
                        "modules": {name: module.state_dict() for name, module in modules.items()}}, buffer)
            partial = path.with_suffix(f".{os.getpid()}.partial")
            partial.write_bytes(buffer.getvalue())
            partial.replace(path)
            return result

    return wrapper
