"""Tokenizers: one token per character, and byte-pair encoding (BPE) over those characters.

BPE (Sennrich et al. 2016, "Neural Machine Translation of Rare Words with Subword Units",
after Gage 1994) starts from single characters and repeatedly merges the most frequent
adjacent pair of tokens into a new token. Encoding replays the merges in the order they
were learned; decoding concatenates each token's string.

Rules of this implementation:

- The base vocabulary is the set of characters of the training text, sorted by code point:
  ids ``0 .. n_chars - 1``. Merge number m creates id ``n_chars + m``. Any str made only of
  those characters round-trips, ``decode(encode(s)) == s``; any other character raises a
  ``ValueError`` that names it.
- Merges never cross a word boundary. The text is first cut into pieces by ``PIECE``: a word
  with the space before it (``" heaven"``), a run of punctuation with the space before it
  (``" ("``), or one whitespace character (a newline, or a space not followed by a word).
  Pairs are counted inside pieces only, as GPT-2 does, so no token spans two words.
- A pair's count is the number of times it occurs inside pieces, overlapping ones included
  (``"aaa"`` counts ``(a, a)`` twice). Ties go to the pair with the smallest
  ``(left id, right id)``, so training is deterministic.
"""

import collections
import functools
import re
from dataclasses import dataclass

PIECE = re.compile(r" ?\w+| ?[^\w\s]+|\s")   # the pre-tokenization: merges stay inside one piece


def check_known(text, index):
    """Raise a ValueError naming the characters of ``text`` that ``index`` (char -> id) lacks."""
    unknown = sorted(set(text) - index.keys())
    if unknown:
        raise ValueError(f"text holds characters outside the vocabulary: {unknown!r}")


@dataclass
class CharTokenizer:
    """One token per character. ``vocab[i]`` is the character with id ``i`` (sorted)."""

    vocab: list

    @classmethod
    def from_text(cls, text):
        """The tokenizer whose vocabulary is the characters of ``text``."""
        return cls(sorted(set(text)))

    @functools.cached_property
    def char_index(self):
        """character -> id."""
        return {ch: i for i, ch in enumerate(self.vocab)}

    def encode(self, text):
        """str of length n -> list of n ids."""
        check_known(text, self.char_index)
        return [self.char_index[ch] for ch in text]

    def decode(self, ids):
        """list of ids -> str."""
        return "".join(self.vocab[i] for i in ids)


def merge_pair(ids, pair, new_id):
    """Replace every (left-to-right, non-overlapping) occurrence of ``pair`` in ``ids``."""
    out, i = [], 0
    while i < len(ids):
        if i + 1 < len(ids) and (ids[i], ids[i + 1]) == pair:
            out.append(new_id)
            i += 2
        else:
            out.append(ids[i])
            i += 1
    return out


@dataclass
class BPE:
    """A trained byte-pair encoder.

    ``vocab[i]`` is the str of token ``i``: first the characters, then one token per merge.
    ``merges[m] = (left, right)`` is merge number m, which created token ``n_chars + m``.
    """

    vocab: list
    merges: list

    @property
    def n_chars(self):
        return len(self.vocab) - len(self.merges)

    @functools.cached_property
    def rank(self):
        """(left, right) -> merge number: lower means learned earlier."""
        return {pair: m for m, pair in enumerate(self.merges)}

    def merge_steps(self, ids):
        """Replay the merges on one piece's ids; yield (pair, ids) after each merge applied.

        At each step the earliest-learned merge whose pair occurs in ``ids`` is applied, to
        every occurrence, left to right. This is the same as going through all merges in
        training order, since a merge can only create pairs that were learned later.
        """
        while len(ids) > 1:
            pair = min(zip(ids, ids[1:]), key=lambda p: self.rank.get(p, len(self.merges)))
            if pair not in self.rank:
                return                                   # no learned merge applies
            ids = merge_pair(ids, pair, self.n_chars + self.rank[pair])
            yield pair, ids

    def encode_piece(self, piece):
        """One piece (see ``PIECE``) -> its ids after every merge that applies."""
        ids = [self.char_index[ch] for ch in piece]
        for _, ids in self.merge_steps(ids):
            pass                                         # keep the ids of the last step
        return ids

    def merges_of(self, word):
        """The merges that encoding ``word`` (one piece, e.g. ``" heaven"``) applies, in order.

        Returns a list of ``(left, right, tokens)``: the two token strings merged, and the
        word's tokens after that merge. An empty list means the word stays as characters.
        """
        if PIECE.fullmatch(word) is None:
            raise ValueError(f"merges_of takes one word (a piece), got {word!r}, "
                             f"which is the pieces {PIECE.findall(word)!r}")
        check_known(word, self.char_index)
        ids = [self.char_index[ch] for ch in word]
        return [(self.vocab[left], self.vocab[right], [self.vocab[i] for i in ids])
                for (left, right), ids in self.merge_steps(ids)]

    def encode(self, text):
        """str -> list of token ids. Each distinct piece is encoded once, then looked up."""
        check_known(text, self.char_index)
        cache, ids = {}, []
        for piece in PIECE.findall(text):
            if piece not in cache:
                cache[piece] = self.encode_piece(piece)
            ids.extend(cache[piece])
        return ids

    def decode(self, ids):
        """list of token ids -> str."""
        return "".join(self.vocab[i] for i in ids)

    @functools.cached_property
    def char_index(self):
        """character -> id, for the base vocabulary."""
        return {ch: i for i, ch in enumerate(self.vocab[:self.n_chars])}


def train_bpe(text, n_merges):
    """Learn ``n_merges`` merges from ``text`` (see the module docstring for the rules).

    Pairs are counted once over the distinct pieces, weighted by how often each piece occurs.
    After a merge only the pieces that hold the merged pair are recounted.

    Returns
    -------
    BPE
    """
    vocab = sorted(set(text))
    index = {ch: i for i, ch in enumerate(vocab)}
    piece_counts = collections.Counter(PIECE.findall(text))
    words = [[index[ch] for ch in piece] for piece in piece_counts]        # each piece as ids
    weights = list(piece_counts.values())                                  # how often it occurs

    pair_counts = collections.Counter()        # (left, right) -> occurrences in the text
    where = collections.defaultdict(set)       # (left, right) -> which words hold it
    for w, ids in enumerate(words):
        for pair in zip(ids, ids[1:]):
            pair_counts[pair] += weights[w]
            where[pair].add(w)

    merges = []
    for _ in range(n_merges):
        if not pair_counts:
            break                                  # every piece is one token already
        best = min(pair_counts, key=lambda pair: (-pair_counts[pair], pair))
        new_id = len(vocab)
        merges.append(best)
        vocab.append(vocab[best[0]] + vocab[best[1]])
        for w in sorted(where.pop(best)):
            ids = words[w]
            for pair in zip(ids, ids[1:]):         # forget this word's old pairs ...
                pair_counts[pair] -= weights[w]
                if pair_counts[pair] == 0:
                    del pair_counts[pair]
                where[pair].discard(w)
            words[w] = ids = merge_pair(ids, best, new_id)
            for pair in zip(ids, ids[1:]):         # ... and count its new ones
                pair_counts[pair] += weights[w]
                where[pair].add(w)
    return BPE(vocab, merges)
