"""Real text for a language model: a public-domain corpus and the tokenizers that cut it up.

``corpus``: the King James Bible as one normalised str, and a held-out split by chapter.
``bpe``: characters as tokens, and byte-pair merges learned from the training text.
"""
