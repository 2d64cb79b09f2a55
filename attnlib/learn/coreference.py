"""Task 1 data: "The animal didn't cross the street because it was too tired / wide".

Every sentence has 12 tokens and one of two templates, so "it" is always token 7
while the two nouns trade places:

    The {animal} didn't cross the {place} because it was too {adjective} .
    The {place} didn't suit the {animal} because it was too {adjective} .

"it" refers to the noun its adjective can describe: an animal can be *tired*, a
place can be *wide*. The target is that noun: its position (1 or 5) for a model
that answers by pointing, its token id for one that names a word.

The split holds out combinations, not words: a random fifth of all
(noun, adjective) pairs, plus the two pairs of the book's own sentences
("animal" with "tired", "street" with "wide"), never occur together in a
training sentence. Held-out sentences are those whose referent and adjective
form a held-out pair; every word in them was seen in training, only never in
that combination.

The word lists import without torch (the exercises read them); the tensors are
built when the data is.
"""

import itertools
from dataclasses import dataclass

import numpy as np

ANIMALS = (
    "animal", "dog", "cat", "horse", "cow", "fox", "goat", "sheep",
    "bear", "deer", "rabbit", "pig", "wolf", "duck", "mouse", "lion",
)
PLACES = (
    "street", "road", "river", "bridge", "field", "yard", "lake", "path",
    "square", "track", "highway", "canal", "stream", "valley", "hill", "forest",
)
ANIMAL_ADJECTIVES = (
    "tired", "old", "young", "small", "weak", "nervous", "timid", "slow", "shy", "sleepy", "lazy", "hungry",
)
PLACE_ADJECTIVES = (
    "wide", "deep", "busy", "long", "icy", "steep", "dark", "muddy", "crowded", "noisy", "wet", "cold",
)
TEMPLATES = (
    "The {animal} didn't cross the {place} because it was too {adjective} .",
    "The {place} didn't suit the {animal} because it was too {adjective} .",
)
SENTENCE_LENGTH = 12
IT_POSITION = 7  # "it" is token 7 in both templates
NOUN_POSITIONS = (1, 5)  # the two nouns, in either order
ADJECTIVE_POSITION = 10
BOOK_PAIRS = (("animal", "tired"), ("street", "wide"))  # always held out
VOCAB = tuple(sorted(  # token id -> word: the templates' fixed words, every noun and adjective
    {word for template in TEMPLATES for word in template.split() if "{" not in word}
    | set(ANIMALS + PLACES + ANIMAL_ADJECTIVES + PLACE_ADJECTIVES)
))


def book_sentence(adjective):
    """The book's sentence with the given last word, as a list of 12 tokens."""
    return TEMPLATES[0].format(animal="animal", place="street", adjective=adjective).split()


def referent(animal, place, adjective):
    """The noun "it" refers to: the one the adjective can describe."""
    if adjective in ANIMAL_ADJECTIVES:
        return animal
    if adjective in PLACE_ADJECTIVES:
        return place
    raise ValueError(f"unknown adjective {adjective!r}: not in ANIMAL_ADJECTIVES or PLACE_ADJECTIVES")


@dataclass(frozen=True)
class Split:
    """One side of the split: sentences as words, and as tensors for the model.

    Attributes
    ----------
    sentences : list of list of str
        N sentences of 12 tokens.
    referents : list of str
        The noun "it" refers to in each.
    tokens : torch.LongTensor, shape (N, 12)
    targets : torch.LongTensor, shape (N, 1, 1)
        The referent's position: one read-out position ("it"), one answer there.
    word_targets : torch.LongTensor, shape (N, 1, 1)
        The referent's token id, for a model that names the word.
    """

    sentences: list
    referents: list
    tokens: object
    targets: object
    word_targets: object

    def __len__(self):
        return len(self.sentences)


@dataclass(frozen=True)
class CoreferenceData:
    """The vocabulary, the held-out pairs and both splits."""

    vocab: tuple  # token id -> word
    held_out_pairs: frozenset  # {(noun, adjective), ...}
    train: Split
    test: Split

    def encode(self, sentences):
        """Words -> token ids: list of B sentences of 12 words -> LongTensor (B, 12)."""
        import torch

        index = {word: i for i, word in enumerate(self.vocab)}
        unknown = sorted({w for s in sentences for w in s if w not in index})
        if unknown:
            raise ValueError(f"words not in the vocabulary: {unknown}")
        return torch.tensor([[index[w] for w in s] for s in sentences], dtype=torch.long)


def all_sentences():
    """Every (sentence, animal, place, adjective) the two templates make: 2 * 16 * 16 * 24."""
    adjectives = ANIMAL_ADJECTIVES + PLACE_ADJECTIVES
    for template, animal, place, adjective in itertools.product(TEMPLATES, ANIMALS, PLACES, adjectives):
        sentence = template.format(animal=animal, place=place, adjective=adjective).split()
        yield sentence, animal, place, adjective


def make_coreference_data(held_out_fraction=0.2, seed=0):
    """Generate the corpus and split it by held-out (noun, adjective) pairs.

    Parameters
    ----------
    held_out_fraction : float
        Fraction of all (noun, adjective) pairs held out, drawn with ``seed``.
    seed : int

    Returns
    -------
    CoreferenceData
        ``train`` holds the sentences in which no held-out pair occurs;
        ``test`` those whose (referent, adjective) pair is held out.
    """
    if not 0 < held_out_fraction < 1:
        raise ValueError(f"held_out_fraction must be between 0 and 1, got {held_out_fraction!r}")
    adjectives = ANIMAL_ADJECTIVES + PLACE_ADJECTIVES
    pairs = list(itertools.product(ANIMALS + PLACES, adjectives))
    rng = np.random.default_rng(seed)
    drawn = rng.choice(len(pairs), size=round(held_out_fraction * len(pairs)), replace=False)
    held_out = frozenset(pairs[i] for i in drawn) | frozenset(BOOK_PAIRS)

    sides = {"train": ([], []), "test": ([], [])}
    for sentence, animal, place, adjective in all_sentences():
        noun = referent(animal, place, adjective)
        if (noun, adjective) in held_out:
            side = "test"
        elif (animal, adjective) in held_out or (place, adjective) in held_out:
            continue  # a held-out pair occurs, but not as the answer: in neither split
        else:
            side = "train"
        sides[side][0].append(sentence)
        sides[side][1].append(noun)

    import torch

    data = CoreferenceData(VOCAB, held_out, None, None)
    splits = {}
    for side, (sentences, referents) in sides.items():
        positions = torch.tensor([s.index(noun) for s, noun in zip(sentences, referents)])  # (N,)
        word_ids = data.encode([[noun] for noun in referents])  # (N, 1)
        splits[side] = Split(sentences, referents, data.encode(sentences), positions.reshape(-1, 1, 1),
                             word_ids.reshape(-1, 1, 1))
    return CoreferenceData(VOCAB, held_out, splits["train"], splits["test"])
