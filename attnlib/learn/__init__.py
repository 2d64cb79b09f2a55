"""Attention that learns: small models trained on CPU in seconds (chapter 7).

One idea per file; import the one you need (this package imports nothing, so
``import attnlib`` stays free of torch):

- :mod:`.coreference`: Task 1's sentences ("... because it was too tired / wide"),
  split by held-out (noun, adjective) pairs;
- :mod:`.reversal`: Task 2's digit sequences (reverse them, name each left neighbour);
- :mod:`.layers`: a trainable multi-head attention layer and a pointer head, both
  computing with :func:`attnlib.multi_head_attention` and
  :func:`attnlib.attention_weights` on torch tensors;
- :mod:`.model`: embeddings + positions + layers, read out by a linear layer
  (:class:`~.model.AttentionClassifier`) or by pointing
  (:class:`~.model.AttentionPointer`);
- :mod:`.training`: one training step and a seeded, single-threaded loop;
- :mod:`.recipes`: the book's models, their sizes, steps and seeds, and
  :func:`~.recipes.trained_coreference_model`, the trained Task 1 model;
- :mod:`.ablation`: chapter 7's ablations (a head's output zeroed, a key blocked);
- :mod:`.transformer`, :mod:`.induction`: chapter 8's decoder and its copying task;
- :mod:`.patching`: chapter 8's zero and mean ablation and activation patching;
- :mod:`.ch7_seeds`, :mod:`.sweep`: chapters 7 and 8 trained over many seeds, stored,
  stamped data (``attnlib/data/learn/``) that the chapters read;
- :mod:`.gpt`: a character-level GPT on the King James Bible (:mod:`attnlib.text`), trained
  and evaluated from the command line, its checkpoints stored in ``attnlib/data/gpt/``
  (the foundation of a chapter not yet written).
"""
