"""The sparsity benchmark labels each row with the blocks it ran (attnlib.bench.sparsity)."""

from attnlib.backends import tiled
from attnlib.bench import sparsity


def test_plain_tiles_count_the_tiled_loops_blocks():
    assert sparsity.plain_tiles(2048, 1024, causal=False) == (4, 4)
    assert sparsity.plain_tiles(2048, 1024, causal=True) == (3, 4)  # one block above the diagonal
    assert sparsity.plain_tiles(2048, 128, causal=True) == (16 * 17 // 2, 256)
    assert sparsity.plain_tiles(300, 128, causal=True) == (6, 9)  # a short last block


def test_rows_carry_the_block_size_each_path_ran():
    rows = sparsity.run(T=256, n_heads=1, head_dim=8, block_size=64, budget_s=0.05, progress=lambda *_: None)
    row = {r["mod"]: r for r in rows}
    for name in ("plain, no mask", "plain, causal=True"):  # attention() runs the backend's own blocks
        assert row[name]["block_size"] == tiled.BLOCK_SIZE
        assert (row[name]["tiles"], row[name]["tiles_total"]) == (1, 1)  # T = 256 fits in one block
    assert row["causal"]["block_size"] == 64
    assert (row["causal"]["tiles"], row["causal"]["tiles_total"]) == (10, 16)
    assert row["causal"]["sparsity"] == 100 * (1 - 10 / 16)


def test_stored_plain_rows_ran_the_backends_blocks():
    _, rows = sparsity.stored()
    for r in rows:
        expected = tiled.BLOCK_SIZE if r["mod"].startswith("plain") else 128
        assert r["block_size"] == expected, r["mod"]
        assert r["sparsity"] == round(100 * (1 - r["tiles"] / r["tiles_total"]), 3)


def test_partial_tiles_are_the_ones_the_mask_cuts_through():
    def row(mod, block_size=128):
        return {"mod": mod, "T": 2048, "block_size": block_size}

    assert sparsity.partial_tiles(row("every tile")) == 0
    assert sparsity.partial_tiles(row("document(8)")) == 0  # documents of 256: whole tiles
    assert sparsity.partial_tiles(row("causal")) == 16  # the diagonal
    assert sparsity.partial_tiles(row("causal & document(8)")) == 16  # each document's diagonal
    assert sparsity.partial_tiles(row("plain, no mask", 1024)) == 0
    assert sparsity.partial_tiles(row("plain, causal=True", 1024)) == 2
