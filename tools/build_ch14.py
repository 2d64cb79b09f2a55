"""One-off: write the first draft of chapter 14's notebook (cells only, not executed).

Kept for the record of how the chapter was first laid out; edit the notebook itself from now on.
"""

import sys
from pathlib import Path

import nbformat
import nbformat.v4 as v4

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

PATH = ROOT / "book" / "14_many_sequences.ipynb"


def md(text):
    return v4.new_markdown_cell(text.strip("\n"))


def code(text, *tags, alt=None):
    meta = {}
    if tags:
        meta["tags"] = list(tags)
    if alt:
        meta["mystnb"] = {"image": {"alt": alt}}
    return v4.new_code_cell(text.strip("\n"), metadata=meta)


CELLS = [
    md(r"""
# Many sequences in one batch

*Padding and packing, masks as functions, and the blocks a kernel can skip*

A GPU is fed batches, and the sequences of a batch rarely have one length. This chapter
measures what padding them to the longest wastes, packs them end to end instead, and
writes the mask that keeps packed sequences apart as a *function*, the form PyTorch's
FlexAttention {cite:p}`pytorch_sdpa` uses for every mask: causal, sliding windows,
documents, prefixes. A mask written as a function also tells a tiled kernel which blocks
it may skip.

**What you will be able to do**

- compute what padding a batch wastes, and pack it with `cu_seqlens` instead;
- write a mask or a score change as a function of the query and key positions;
- read a block mask: which tiles a kernel computes, and what skipping them saves;
- say what `empty_rows="zero"` answers, and what it can hide.

**The result in three sentences.** Padded to its longest sequence, a realistic batch
below spends {glue:text}`pair_waste`% of its score entries on padding; packed, it spends
none. Written as functions, the masks of packed documents, windows and prefixes tell a
tiled kernel which tiles to skip, and a gallery of them agrees with FlexAttention. On a
CPU, skipping {glue:text}`sparsest_skipped`% of the tiles cut the time to
{glue:text}`sparsest_ratio` of computing them all, though this teaching path costs
{glue:text}`path_cost` times the plain tiled loop per tile.
"""),
    code(r"""
%matplotlib inline
import textwrap
from importlib.resources import files
from pathlib import Path

import matplotlib.pyplot as plt
import numpy as np
import torch

import attnlib
from attnlib import mods
from attnlib.bench import sparsity

np.set_printoptions(precision=3, suppress=True)
results_dir = Path(files("attnlib") / "data")  # measured results ship with attnlib
"""),
    code(r"""
picture = np.random.default_rng(14)  # the batch of the next section
drawn = picture.lognormal(mean=5.5, sigma=0.9, size=16)
sizes = np.minimum(drawn.astype(int) + 1, 4096)
fig, (ax_pad, ax_pack) = plt.subplots(1, 2, figsize=(10, 3), constrained_layout=True,
                                      gridspec_kw={"width_ratios": [1, 1.6]})
for row, n in enumerate(sizes):
    ax_pad.barh(row, n, color="C0")
    ax_pad.barh(row, sizes.max() - n, left=n, color="0.85")
ax_pad.set(title="padded: 16 rows as long as the longest", xlabel="position",
           ylabel="sequence", yticks=[])
starts = np.concatenate([[0], np.cumsum(sizes)[:-1]])
for i, (start, n) in enumerate(zip(starts, sizes)):
    ax_pack.barh(0, n, left=start, color=f"C{i % 10}", edgecolor="white")
ax_pack.set(title="packed: one row, cu_seqlens marking where each starts",
            xlabel="position in the packed row", yticks=[], ylim=(-2, 2))
plt.show()
""", "hide-input", alt=("Left: sixteen horizontal bars, blue up to each sequence's length and grey "
                       "padding to the longest, most of the area grey. Right: the same sixteen "
                       "sequences end to end in one row of coloured segments, with no grey.")),
    md(r"""
## What padding wastes

Take 16 sequences whose lengths follow a long-tailed distribution, as documents and chat
turns do: most short, a few long. Padded to the longest, the batch is a rectangle;
attention then computes a score for every pair of positions, padding included:
"""),
    code(r"""
rng = np.random.default_rng(14)
lengths = np.minimum(rng.lognormal(mean=5.5, sigma=0.9, size=16).astype(int) + 1, 4096)
longest = int(lengths.max())
padded_tokens, packed_tokens = len(lengths) * longest, int(lengths.sum())
padded_pairs = len(lengths) * longest**2  # every sequence as long as the longest
packed_pairs = int((lengths.astype(np.int64) ** 2).sum())  # each against itself
print("lengths:", sorted(lengths.tolist()))
print(f"tokens: padded {padded_tokens:,}, real {packed_tokens:,}")
print(f"score entries per head: padded {padded_pairs:,}, needed {packed_pairs:,}")
"""),
    code(r"""
from myst_nb import glue  # puts numbers computed below into the prose

glue("n_sequences", len(lengths), display=False)
glue("longest", f"{longest:,}", display=False)
glue("median_length", int(np.median(lengths)), display=False)
glue("token_waste", round(100 * (1 - packed_tokens / padded_tokens)), display=False)
glue("pair_waste", round(100 * (1 - packed_pairs / padded_pairs)), display=False)
""", "remove-cell"),
    md(r"""
The median sequence has {glue:text}`median_length` tokens, the longest
{glue:text}`longest`. Padding makes {glue:text}`token_waste`% of the batch's tokens
padding, and since scores grow with the square of the length,
{glue:text}`pair_waste`% of its score entries, FLOPs and (without a fused kernel)
bytes go to pairs that involve padding.

## Packing

*Packing* lays the sequences end to end in one long row of tokens and keeps, beside it,
the offsets where each starts, `cu_seqlens` (cumulative sequence lengths), the layout of
FlashAttention's variable-length kernels. Each token may attend only within its own
sequence: a *document mask*. Four short sequences, packed:
"""),
    code(r"""
short = [3, 5, 2, 4]  # four sequences
cu_seqlens = np.concatenate([[0], np.cumsum(short)])  # where each starts, and the end
doc_ids = np.repeat(np.arange(len(short)), short)  # the sequence of every packed token
print("cu_seqlens:", cu_seqlens, " doc_ids:", doc_ids)
H, d = 2, 8
total = int(cu_seqlens[-1])
q, k, v = (rng.standard_normal((total, H, d)) for _ in range(3))  # (total, H, d)
packed = attnlib.varlen_attention(q, k, v, cu_seqlens, cu_seqlens, causal=True)
one_by_one = [  # each sequence alone: (H, t, d)
    attnlib.attention(*(x[a:b].swapaxes(0, 1) for x in (q, k, v)), causal=True)
    for a, b in zip(cu_seqlens[:-1], cu_seqlens[1:])
]
separate = np.concatenate([o.swapaxes(0, 1) for o in one_by_one])  # (total, H, d)
print("packed output", packed.shape, "equals the sequences one by one:",
      np.allclose(packed, separate, rtol=0, atol=1e-12))
"""),
    code(r"""
assert np.allclose(packed, separate, rtol=0, atol=1e-12)
""", "remove-cell"),
    md(r"""
`attnlib.varlen_attention` takes flash_attn's layout: queries $(N_{total}, H, d)$, one
row per packed token, and the offsets. Its mask is the document mask combined with the
causal one, here drawn token by token:
"""),
    code(r"""
T = len(doc_ids)
q_idx, kv_idx = np.arange(T)[:, None], np.arange(T)[None, :]
allowed = mods.and_masks(mods.causal(), mods.document(doc_ids))(0, 0, q_idx, kv_idx)
fig, ax = plt.subplots(figsize=(4.2, 4.2), constrained_layout=True)
ax.imshow(allowed, cmap="Blues", vmin=0, vmax=1.3)
ax.set_xticks(range(T), doc_ids)
ax.set_yticks(range(T), doc_ids)
ax.set_xlabel("key (its sequence)")
ax.set_ylabel("query (its sequence)")
ax.set_title("causal and document mask: 4 packed sequences", fontsize=10)
plt.show()
""", "hide-input", alt=("A 14 by 14 grid of query and key positions labelled by sequence: four "
                       "blue triangles on the diagonal, one per packed sequence, each a causal "
                       "mask of its own; everything between sequences is white.")),
    md(r"""
## Masks as functions

The mask above was not stored as a matrix: `mods.document(doc_ids)` is a function of the
positions. FlexAttention's convention, which `attnlib.attention` follows, is
`mask_mod(b, h, q_idx, kv_idx)`: True where the query may attend, for a batch index, a
head and arrays of query and key positions that broadcast. Elementwise operations make
one function serve every size and every backend. Causal attention, as a function:
"""),
    code(r"""
def causal(b, h, q_idx, kv_idx):
    return kv_idx <= q_idx  # a query sees itself and the keys before it


x = rng.standard_normal((2, 6, 8))  # (H, T, d)
as_function = attnlib.attention(x, x, x, mask_mod=causal)
built_in = attnlib.attention(x, x, x, causal=True)
print("the same as causal=True:", np.allclose(as_function, built_in))
"""),
    md(r"""
A *score* can change the same way: `score_mod(score, b, h, q_idx, kv_idx)` returns a new
score before the softmax. ALiBi {cite:p}`press2022train` subtracts a slope times the
distance; Gemma 2 caps scores smoothly with $c \tanh(s / c)$. The book's gallery,
`attnlib.mods`, holds these and the masks: causal, sliding window, document, prefix-LM
(the first tokens seen by all), attention sinks (the first tokens kept beside a window).
PyTorch's `flex_attention` runs on a CPU too; one of the gallery's masks, against it:
"""),
    code(r"""
import warnings

from torch.nn.attention.flex_attention import flex_attention

three_docs = mods.and_masks(mods.causal(), mods.document(np.repeat(np.arange(3), 4)))
qt, kt, vt = (torch.from_numpy(rng.standard_normal((1, 2, 12, 8))) for _ in range(3))


def as_score_mod(score, b, h, q_idx, kv_idx):  # the mask, as flex_attention's score_mod
    return torch.where(three_docs(b, h, q_idx, kv_idx), score, -float("inf"))


with warnings.catch_warnings():
    warnings.simplefilter("ignore")  # flex_attention warns that it runs uncompiled here
    theirs = flex_attention(qt, kt, vt, score_mod=as_score_mod)
ours = attnlib.attention(qt, kt, vt, mask_mod=three_docs)
print("the same as flex_attention, to within 1e-12:",
      torch.allclose(ours, theirs, rtol=0, atol=1e-12))
"""),
    md(r"""
## The blocks a kernel can skip

A tiled kernel ([chapter 12](12_without_the_matrix.ipynb)) works on tiles, here of
128 queries by 128 keys. `attnlib.block_mask` runs the mask function once per
tile and records which tiles hold any allowed key: the others are never loaded. Its
*sparsity* is the share of tiles skipped:
"""),
    code(r"""
T_long, block = 2048, 128
eight_documents = np.repeat(np.arange(8), T_long // 8)
shown = {"causal": mods.causal(), "sliding window of 256": mods.sliding_window(256),
         "8 packed documents": mods.document(eight_documents),
         "prefix-LM, prefix of 512": mods.prefix_lm(512)}
fig, axes = plt.subplots(1, 4, figsize=(10, 3), constrained_layout=True)
for ax, (name, mod) in zip(axes, shown.items()):
    bm = attnlib.block_mask(mod, 1, 1, T_long, T_long, block_size=block)
    ax.imshow(bm.to_dense()[0, 0], cmap="Blues", vmin=0, vmax=1.3)
    ax.set_title(f"{name}\n{bm.sparsity():.1f}% skipped", fontsize=9)
    ax.set_xlabel("key block")
axes[0].set_ylabel("query block")
plt.show()
""", "hide-input", alt=("Four 16 by 16 grids of tiles, blue where computed: causal fills the lower "
                       "triangle; the sliding window a band along the diagonal; eight packed "
                       "documents eight 2 by 2 squares on the diagonal; the prefix-LM the lower "
                       "triangle plus the first four columns.")),
    md(r"""
Does skipping pay on a CPU? The book's sparsity benchmark times the tiled backend on one
thread, with no mask and with the block masks of several mods, in turns:
"""),
    code(r"""
sparsity_stamp, sparsity_rows = sparsity.stored()  # the book's measurement
row = {r["mod"]: r for r in sparsity_rows}
every = row["every tile"]  # the block-mask path with every tile computed
print(f"T = {every['T']:,}, {every['n_heads']} heads of {every['head_dim']}, "
      f"{every['dtype']}, tiles of {every['block_size']}; load average "
      f"{sparsity_stamp['load_average']}")
print(f"{'':<22} {'skipped':>8} {'tiles':>6} {'time / every tile':>18}")
for r in sparsity_rows:
    ratio = r["time_ms"] / every["time_ms"]
    print(f"{r['mod']:<22} {r['sparsity']:>7.1f}% {r['tiles']:>6} {ratio:>18.2f}"
          + ("  (noisy)" if r["flag"] else ""))
"""),
    code(r"""
masked = [r for r in sparsity_rows if not r["mod"].startswith("plain")]
fig, ax = plt.subplots(figsize=(6, 3.8), constrained_layout=True)
ax.plot([0, 1], [0, 1], "k:", lw=1, label="time in proportion to the tiles")
for r in masked:
    s, t = r["tiles"] / r["tiles_total"], r["time_ms"] / every["time_ms"]
    ax.plot(s, t, "x" if r["flag"] else "o", color="C0")
    above = r["mod"].startswith("causal &")  # its neighbour, document(8), labels below
    ax.annotate(r["mod"], (s, t), xytext=(4, 6 if above else -9),
                textcoords="offset points", fontsize=8)
ax.set(xlabel="share of tiles computed", ylabel="time, relative to every tile",
       xlim=(0, 1.15), ylim=(0, 1.15))
ax.legend(fontsize=8, loc="upper left")
plt.show()
""", "hide-input", alt=("Time relative to the run that computes every tile against the share of "
                       "tiles computed, one point per mask: the points fall with the share, most "
                       "of them a little above the dotted diagonal of proportional time.")),
    code(r"""
clean = [r for r in masked if not r["flag"] and r["mod"] != "every tile"]
sparsest = max(clean, key=lambda r: r["sparsity"])
plain, plain_causal = row["plain, no mask"], row["plain, causal=True"]
glue("sparsest_mod", sparsest["mod"], display=False)
glue("sparsest_skipped", round(sparsest["sparsity"], 1), display=False)
glue("sparsest_ratio", round(sparsest["time_ms"] / every["time_ms"], 2), display=False)
share = sparsest["tiles"] / sparsest["tiles_total"]
glue("sparsest_share", round(share, 2), display=False)
glue("n_noisy", sum(bool(r["flag"]) for r in sparsity_rows), display=False)
glue("path_cost", round(every["time_ms"] / plain["time_ms"], 1), display=False)
glue("plain_causal", round(plain_causal["time_ms"] / plain["time_ms"], 2),
     display=False)
# the prose: the time falls with the tiles, but less than in proportion,
# and the block-mask path with every tile is slower than the plain tiled path
assert share < sparsest["time_ms"] / every["time_ms"] < 1
assert every["time_ms"] > plain["time_ms"] and not every["flag"] and not plain["flag"]
""", "remove-cell"),
    md(r"""
With {glue:text}`sparsest_mod`, {glue:text}`sparsest_skipped`% of the tiles are skipped,
and the call took {glue:text}`sparsest_ratio` of the time of computing every tile, for
{glue:text}`sparsest_share` of the tiles ({glue:text}`n_noisy` rows flagged noisy). The
time falls with the tiles computed, though not all the way: part of a call's cost does
not depend on its tiles, and the mask function runs inside every partial tile.

This path is the book's teaching code, not a fast one: computing every tile through a
block mask took {glue:text}`path_cost` times as long as the tiled backend's own loop
without one, whose built-in causal skipping took {glue:text}`plain_causal` of its
unmasked time here. On a GPU, FlexAttention compiles the mask function into the kernel
itself.

## Rows with no key

Padding on the *left*, as batched generation does so that every sequence's last token
lines up, gives the padding queries no key they may see. By default `attnlib` refuses
that, because a mask that leaves a query nothing is usually a mistake. PyTorch's SDPA
answers such a row with zeros instead; `empty_rows="zero"` gives the same answer:
"""),
    code(r"""
pad = 2  # left padding of the second sequence
keep = np.ones((2, 1, 6, 6), dtype=bool) & np.tril(np.ones((6, 6), dtype=bool))
keep[1, :, :, :pad] = False  # no query may look at the padding
x = rng.standard_normal((2, 1, 6, 8))
try:
    attnlib.attention(x, x, x, mask=keep)
except ValueError as error:
    print(textwrap.fill(f"default: {error}", 80))
zeroed = attnlib.attention(x, x, x, mask=keep, empty_rows="zero")
reference = torch.nn.functional.scaled_dot_product_attention(
    *(torch.from_numpy(t) for t in (x, x, x)), attn_mask=torch.from_numpy(keep))
print("padding rows:", zeroed[1, 0, :pad].max(), " equal to SDPA:",
      np.allclose(zeroed, reference.numpy(), atol=1e-12))
"""),
    md(r"""
What it can hide: a mask in the other convention (True for *masked*) empties rows too,
and under `empty_rows="zero"` it returns zeros without a word. Use it where padding is
meant, and keep the default elsewhere.

## Summary

- Padding wastes tokens in proportion to the lengths, and score entries in proportion to
  their squares; packing with `cu_seqlens` and a document mask wastes neither.
- A mask or a score change can be a function of the positions,
  `mask_mod(b, h, q_idx, kv_idx)` and `score_mod(score, b, h, q_idx, kv_idx)`: one function
  for every size and backend.
- A block mask records the tiles that hold any allowed key; a tiled kernel skips the
  rest. Through the book's block-mask path the time fell with the tiles computed (one
  run per mask, on a CPU); the plain tiled loop's own causal skipping saved little.
- `empty_rows="zero"` answers a query with no key as SDPA does, with zeros.
"""),
]


if __name__ == "__main__":
    metadata = nbformat.read(ROOT / "book" / "13_backward_pass.ipynb", as_version=4).metadata
    nb = v4.new_notebook(cells=CELLS, metadata=metadata)
    PATH.write_text(nbformat.writes(nb))
    print("wrote", PATH)
