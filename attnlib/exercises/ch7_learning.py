"""Chapter 7, Attention that learns: a swapped adjective, a training loop's bug, a parameter count,
the map of a perfect reversal head.

The checks that need a model import torch and attnlib.learn when they run, so
``import attnlib.exercises`` stays free of torch. The swapped-adjective check
asks the trained model itself (:func:`attnlib.learn.recipes.trained_coreference_model`,
trained once per process in a few seconds).
"""

import numpy as np

from ..learn.coreference import IT_POSITION, SENTENCE_LENGTH, TEMPLATES, VOCAB
from ..learn.recipes import COREFERENCE
from .core import Case, ChoiceExercise, FunctionExercise, Mistake, ValueExercise

# --- Predict: swap the adjective ----------------------------------------------------------

SWAP_NOUNS = {"animal": "dog", "place": "road"}
SWAP_ADJECTIVES = ("lazy", "muddy")  # (animal, road) -> dog; swapped: road. Both pairs are held out.
SWAP_OPTIONS = {
    "a": ("muddy", "road"),
    "b": ("road", "road"),
    "c": ("muddy", "dog"),
    "d": ("dog", "dog"),
}


def swap_sentence(adjective):
    """The exercise's sentence with the given last word, as 12 tokens."""
    return TEMPLATES[0].format(adjective=adjective, **SWAP_NOUNS).split()


def where_it_looks(adjective):
    """``(word, word)``: where the attention layer's head 0 and the pointer put most weight of "it"."""
    from ..learn.recipes import trained_coreference_model

    data, model, _ = trained_coreference_model()
    sentence = swap_sentence(adjective)
    maps = model.attention_maps(data.encode([sentence]))  # [(1, H, T, T), (1, 1, T, T)]
    head_0 = maps[0][0, 0, IT_POSITION]  # (T,) the row of "it"
    pointer = maps[-1][0, 0, IT_POSITION]  # (T,)
    return sentence[int(head_0.argmax())], sentence[int(pointer.argmax())]


def _swap_experiment():
    looks = where_it_looks(SWAP_ADJECTIVES[1])
    return next((key for key, option in SWAP_OPTIONS.items() if option == looks), "e")


def _option_text(key):
    head, pointer = SWAP_OPTIONS[key]
    return f'head 0 of the attention layer on "{head}", the pointer on "{pointer}"'


_swap_sentence_text = " ".join(swap_sentence(SWAP_ADJECTIVES[0])).replace(" .", ".")

swap_adjective = ChoiceExercise(
    id="ch7.swap_adjective",
    title="Swap the adjective",
    kind="predict",
    task=(
        "The trained pointer model reads a held-out sentence the chapter did not show:\n\n"
        f"> {_swap_sentence_text}\n\n"
        f'Head 0 of the attention layer sends "it" to "{SWAP_ADJECTIVES[0]}", and the pointer answers '
        f'"{SWAP_NOUNS["animal"]}". Now swap the last word for "{SWAP_ADJECTIVES[1]}". Where do '
        "the two put most of the weight of \"it\"?\n\n"
        + "\n".join(f"- **{key}**: {_option_text(key)}" for key in SWAP_OPTIONS)
        + "\n- **e**: somewhere else\n\n"
        'Set `answer` to `"a"`, `"b"`, `"c"`, `"d"` or `"e"`.'
    ),
    starter='answer = ...  # "a", "b", "c", "d" or "e"',
    solution=(
        "from attnlib.exercises.ch7_learning import SWAP_ADJECTIVES, swap_sentence\n"
        "from attnlib.learn.coreference import IT_POSITION\n"
        "from attnlib.learn.recipes import trained_coreference_model\n"
        "\n"
        "data, model, _ = trained_coreference_model()  # trained once, then cached\n"
        "for adjective in SWAP_ADJECTIVES:\n"
        "    sentence = swap_sentence(adjective)\n"
        "    maps = model.attention_maps(data.encode([sentence]))\n"
        "    head_0 = maps[0][0, 0, IT_POSITION]  # (T,) head 0 of the layer, row of \"it\"\n"
        "    pointer = maps[-1][0, 0, IT_POSITION]  # (T,) the pointer's row of \"it\"\n"
        "    print(f\"too {adjective}: head 0 -> {sentence[head_0.argmax()]} \"\n"
        "          f\"({head_0.max():.2f}), pointer -> {sentence[pointer.argmax()]} \"\n"
        "          f\"({pointer.max():.2f})\")\n"
        'answer = "a"'
    ),
    answer_name="answer",
    options={key: _option_text(key) for key in SWAP_OPTIONS} | {"e": "somewhere else"},
    expected=_swap_experiment,
    hint="head 0 of the attention layer fetches a word for \"it\"; the pointer then picks a noun",
    mistakes={
        "first_layer_points": Mistake(
            lambda: "b",
            'in the attention layer the query of "it" is the same vector in every sentence, so it '
            "cannot know yet which noun the adjective picks; it fetches the adjective, and the "
            "pointer uses what it fetched",
        ),
        "pointer_stays": Mistake(
            lambda: "c",
            '"muddy" describes a place, not an animal: the pointer follows the adjective to the noun '
            "it can describe",
        ),
        "nothing_changes": Mistake(
            lambda: "d",
            'the adjective is the only word that changed, and it decides the answer: "muddy" '
            "describes a place",
        ),
    },
    explanation=(
        'Head 0 of the attention layer scores the keys with one fixed query, made from "it" and '
        "its position 7, so it applies the same preference in every sentence, and adjectives come "
        "first: it fetches whichever adjective the sentence has. The layer adds what it fetched to "
        "the vector of \"it\", so the pointer's query then carries that adjective, and it matches "
        "the key of the noun the adjective can describe."
    ),
)

# --- Find the bug: a training loop without zero_grad ---------------------------------------

_TRAIN_IMPORTS = "import torch\n\nfrom attnlib.learn.training import classification_loss\n\n\n"

_SHIPPED_NO_ZERO_GRAD = _TRAIN_IMPORTS + """def train(model, optimizer, batches):
    losses = []
    for tokens, targets in batches:
        loss = classification_loss(model(tokens), targets)
        loss.backward()  # d loss / d every parameter, into .grad
        torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm=1.0)
        optimizer.step()
        losses.append(loss.item())
    return losses"""

_FIXED = _TRAIN_IMPORTS + """def train(model, optimizer, batches):
    losses = []
    for tokens, targets in batches:
        optimizer.zero_grad()  # the fix: clear old gradients; clipping only rescales
        loss = classification_loss(model(tokens), targets)
        loss.backward()  # d loss / d every parameter, into .grad
        torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm=1.0)
        optimizer.step()
        losses.append(loss.item())
    return losses"""


def _loop(order, clip=True):
    """A training loop doing its steps in ``order`` (names of the steps), for the typical mistakes."""

    def train(model, optimizer, batches):
        import torch

        from ..learn.training import classification_loss

        losses = []
        for tokens, targets in batches:
            loss = None
            for action in order:
                if action == "zero_grad":
                    optimizer.zero_grad()
                elif action == "loss":
                    loss = classification_loss(model(tokens), targets)
                elif action == "backward":
                    loss.backward()
                    if clip:
                        torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm=1.0)
                elif action == "step":
                    optimizer.step()
            losses.append(loss.item())
        return losses

    return train


def _training_cases():
    import torch

    from ..learn.model import AttentionClassifier
    from ..learn.reversal import N_DIGITS, SEQUENCE_LENGTH, random_sequences

    cases = []
    for seed, (d_model, n_heads, n_batches) in ((701, (16, 2, 6)), (702, (8, 1, 4))):
        model = AttentionClassifier(N_DIGITS, SEQUENCE_LENGTH, d_model, n_heads, 1, N_DIGITS,
                                    n_targets=2, seed=seed)
        optimizer = torch.optim.Adam(model.parameters(), lr=0.01)
        generator = torch.Generator().manual_seed(seed)
        batches = [random_sequences(16, generator) for _ in range(n_batches)]
        cases.append(Case(
            f"Task 2's model with d_model={d_model} and {n_heads} head(s), Adam, "
            f"{n_batches} batches of 16 sequences",
            (model, optimizer, batches),
        ))
    return cases


def _training_expected(case):
    """The losses of the library's own :func:`~attnlib.learn.training.training_step`, step by step."""
    from ..learn.training import training_step

    (model, optimizer, batches), _ = case.fresh()
    return np.array([training_step(model, optimizer, tokens, targets) for tokens, targets in batches])


fix_zero_grad = FunctionExercise(
    id="ch7.fix_zero_grad",
    title="Find the bug: steps that follow old gradients",
    kind="find the bug",
    task=(
        "This loop trains without an error, and its first step is right, but every later step "
        "is steered by the gradients of earlier batches as well as its own. Find the missing line "
        "and add it. A useful check: "
        "print the gradient norm of one parameter after each `backward()`."
    ),
    starter=_SHIPPED_NO_ZERO_GRAD,
    solution=_FIXED,
    answer_name="train",
    cases=_training_cases,
    expected=_training_expected,
    mistakes={
        "accumulates": Mistake(
            _loop(("loss", "backward", "step")),
            "backward() adds each batch's gradient to what .grad already holds, so every step uses "
            "the sum of all the gradients so far: call optimizer.zero_grad() at the start of every "
            "step",
        ),
        "nothing_learns": Mistake(
            _loop(("loss", "backward", "zero_grad", "step")),
            "optimizer.step() sees no gradients (cleared after backward(), or not computed yet), so "
            "the weights never move: the order is zero_grad, loss, backward, step",
        ),
        "no_clip": Mistake(
            _loop(("zero_grad", "loss", "backward", "step"), clip=False),
            "the fix is one added line: keep the gradient clipping that was there",
        ),
    },
    rtol=1e-5,
    atol=1e-6,
    explanation=(
        "`loss.backward()` *adds* the new gradient to each parameter's `.grad`, so that gradients "
        "of several backward passes can be summed on purpose. A training step must therefore start "
        "by clearing them with `optimizer.zero_grad()`. Without it, `.grad` keeps a running sum of "
        "every gradient so far, and step n follows that sum rather than this batch's gradient: a "
        "direction that mixes stale gradients of old batches into this one. The size of the step is not what goes wrong: clipping rescales the "
        "sum in `.grad` to a norm of at most 1, and Adam sizes each parameter's step from its recent "
        "gradients anyway."
    ),
)

# --- By hand: count the parameters ------------------------------------------------------------

BIGGER = dict(COREFERENCE, d_model=64, n_heads=4, n_layers=2)  # the model the exercise asks about


def _parameters(drop=(), extra=0):
    """Parameters of the pointer model :data:`BIGGER`, less the named tensors, plus ``extra``."""
    from ..learn.recipes import coreference_model

    named = dict(coreference_model(BIGGER).named_parameters())
    return sum(p.numel() for name, p in named.items() if not name.startswith(tuple(drop))) + extra


_d, _heads, _layers = BIGGER["d_model"], BIGGER["n_heads"], BIGGER["n_layers"]

parameter_count = ValueExercise(
    id="ch7.parameter_count",
    title="Count the parameters",
    kind="by hand",
    task=(
        "The chapter's pointer model holds one embedding vector per word, one learned position "
        "vector per position, an attention layer ($W_Q$, $W_K$, $W_V$, $W_O$, each "
        "$d_{model} \\times d_{model}$, no biases) and the pointer's own $W_Q$ and $W_K$ "
        f"($d_{{model}} \\times d_{{model}}$). Build a bigger one: the same vocabulary of {len(VOCAB)} "
        f"words and sentences of {SENTENCE_LENGTH} tokens, but $d_{{model}} = {_d}$ and "
        f"{_layers} attention layers of {_heads} heads each. How many numbers does training adjust?"
    ),
    starter="answer = ...  # a whole number",
    solution=(
        "from attnlib.exercises.ch7_learning import BIGGER\n"
        "from attnlib.learn.recipes import coreference_model\n"
        "\n"
        f"V, T, d, layers = {len(VOCAB)}, {SENTENCE_LENGTH}, {_d}, {_layers}\n"
        "# the number of heads does not change the count: the heads split d_model\n"
        "by_hand = V * d + T * d + layers * 4 * d * d + 2 * d * d\n"
        "model = coreference_model(BIGGER)\n"
        "answer = sum(p.numel() for p in model.parameters())\n"
        "assert answer == by_hand\n"
        "print(answer)"
    ),
    answer_name="answer",
    expected=_parameters,
    hint="add up embeddings, positions, four matrices per attention layer and the pointer's two",
    mistakes={
        "per_head": Mistake(
            lambda: _parameters(extra=_layers * 4 * _d * _d * (_heads - 1)),
            "the heads share the four (d_model, d_model) matrices: each head uses a slice of "
            "their columns, so the number of heads does not change the number of weights",
        ),
        "one_layer": Mistake(
            lambda: _parameters(extra=-(_layers - 1) * 4 * _d * _d),
            "each attention layer has four matrices of its own",
        ),
        "no_positions": Mistake(
            lambda: _parameters(drop=("position",)),
            "the learned positions are trained too: one vector per position",
        ),
        "no_pointer": Mistake(
            lambda: _parameters(drop=("pointer",)),
            "the pointer head has weights of its own, W_Q and W_K",
        ),
        "pointer_with_values": Mistake(
            lambda: _parameters(extra=2 * _d * _d),
            "the pointer has no W_V or W_O: its attention weights are its answer, so it mixes no values",
        ),
        "no_embeddings": Mistake(
            lambda: _parameters(drop=("embedding",)),
            "the embedding table is trained too: one vector per word of the vocabulary",
        ),
    },
    explanation=(
        "Embeddings $V d$, positions $T d$, $4 d^2$ per attention layer and $2 d^2$ for the pointer. "
        "The heads split $d_{model}$ between them, so the number of heads does not change the count; "
        "doubling $d_{model}$ quadruples the attention layers' parameters ($4 d^2$ becomes $16 d^2$)."
    ),
)

# --- Implement: the map of a perfect reversal head ----------------------------------------


def _reversal_expected(case):
    from ..learn.reversal import source_positions

    (length,) = case.args
    return np.eye(length)[source_positions(length)[0].numpy()]  # row i: one-hot at T - 1 - i


def _reversal_cases():
    return [
        Case("T=8, the chapter's sequences", (8,)),
        Case("T=5, an odd length: the middle token is its own mirror", (5,)),
        Case("T=2", (2,)),
    ]


reversal_map = FunctionExercise(
    id="ch7.reversal_map",
    title="Draw the reversal map",
    kind="implement",
    task=(
        "Before looking at a trained head, draw the map it needs. Write `reversal_map(T)` that returns "
        "the (T, T) attention matrix of a head that solves *reversed* perfectly: query i (a row) puts "
        "all its weight on the key holding the answer, position T - 1 - i, and none elsewhere."
    ),
    starter="def reversal_map(T):\n    ...  # your code here",
    solution=(
        "def reversal_map(T):\n"
        "    weights = np.zeros((T, T))\n"
        "    for i in range(T):\n"
        "        weights[i, T - 1 - i] = 1.0  # query i reads the mirrored position\n"
        "    return weights"
    ),
    answer_name="reversal_map",
    cases=_reversal_cases,
    expected=_reversal_expected,
    mistakes={
        "identity": Mistake(
            lambda T: np.eye(T),
            "that is the map of a head where every token looks at itself: the diagonal. Reversal "
            "reads the mirrored position, T - 1 - i",
        ),
        "previous": Mistake(
            lambda T: np.eye(T)[(np.arange(T) - 1) % T],
            "that is the map of the other question, *previous* (key i - 1): reversal reads key T - 1 - i",
        ),
        "off_by_one": Mistake(
            lambda T: np.roll(np.eye(T)[::-1], 1, axis=1),
            "one key off: positions count from 0, so query 0 reads the last key, T - 1",
        ),
    },
    explanation=(
        "The ones run from the top-right corner to the bottom-left: the anti-diagonal. For an odd T "
        "the middle token is its own mirror, so the anti-diagonal crosses the main diagonal there."
    ),
)

EXERCISES = (swap_adjective, fix_zero_grad, parameter_count, reversal_map)
