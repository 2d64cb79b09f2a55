"""attnlib.serving: continuous batching over a paged cache writes, for every request, the tokens it
gets decoded alone; pages are never shared at once and all come back; bad requests are refused."""

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from attnlib import sampling, serving  # noqa: E402
from attnlib.learn.transformer import Decoder  # noqa: E402

VOCAB = 11


def _model(positions="rope", seed=0):
    options = {"max_len": 64} if positions == "learned" else {}
    return Decoder(VOCAB, 16, 4, 2, positions=positions, seed=seed, **options).eval()  # float64


def _requests(rng, n, temperature=1.0, top_k=None):
    return [serving.Request(f"q{i}", tuple(int(t) for t in rng.integers(0, VOCAB, rng.integers(1, 9))),
                            n_new=int(rng.integers(1, 12)), arrival=int(rng.integers(0, 10)), seed=i,
                            temperature=temperature, top_k=top_k)
            for i in range(n)]


def _alone(model, r):
    return sampling.generate(model, torch.tensor([r.prompt]), r.n_new, temperature=r.temperature,
                             top_k=r.top_k, top_p=r.top_p, seed=r.seed)[0].tolist()


@pytest.mark.parametrize("page_size, num_blocks, num_splits", [(1, 40, 1), (3, 12, 2), (8, 5, 0), (4, 9, 3)])
def test_every_request_writes_what_it_writes_alone(page_size, num_blocks, num_splits):
    rng = np.random.default_rng(page_size)
    model = _model()
    requests = _requests(rng, 7)
    written, trace = serving.serve(model, requests, num_blocks=num_blocks, page_size=page_size,
                                   num_splits=num_splits)
    assert list(written) == [r.name for r in requests]
    for r in requests:
        assert written[r.name] == _alone(model, r), r
        assert len(written[r.name]) == len(r.prompt) + r.n_new
    assert max(len(t["decoded"]) for t in trace) >= 2  # sequences really were batched


@pytest.mark.parametrize("positions", ["learned", "none"])
def test_greedy_and_other_position_schemes(positions):
    rng = np.random.default_rng(7)
    model = _model(positions, seed=3)
    requests = _requests(rng, 5, temperature=0.0)
    written, _ = serving.serve(model, requests, num_blocks=30, page_size=2)
    for r in requests:
        assert written[r.name] == _alone(model, r)


def test_top_k_sampling_matches_too():
    rng = np.random.default_rng(11)
    model = _model(seed=5)
    requests = _requests(rng, 6, temperature=0.7, top_k=3)
    written, _ = serving.serve(model, requests, num_blocks=16, page_size=4)
    for r in requests:
        assert written[r.name] == _alone(model, r)


def test_pages_are_held_by_one_sequence_at_a_time_never_exceed_the_pool_and_are_reused():
    rng = np.random.default_rng(3)
    model = _model()
    requests = _requests(rng, 10)
    num_blocks, page_size = 8, 4
    _, trace = serving.serve(model, requests, num_blocks=num_blocks, page_size=page_size)
    owners = {}
    for t in trace:
        held = [p for pages in t["pages"].values() for p in pages]
        assert len(held) == len(set(held)) <= num_blocks  # no page in two sequences at once
        assert all(0 <= p < num_blocks for p in held)
        for name, pages in t["pages"].items():
            for p in pages:
                owners.setdefault(p, set()).add(name)
    assert any(len(names) > 1 for names in owners.values())  # a released page served another request
    assert trace[-1]["finished"] and not trace[-1]["waiting"]
    admitted = [name for t in trace for name in t["admitted"]]
    finished = [name for t in trace for name in t["finished"]]
    assert sorted(admitted) == sorted(finished) == sorted(r.name for r in requests)


def test_nobody_starts_before_arriving_and_first_come_first_served():
    rng = np.random.default_rng(5)
    requests = _requests(rng, 8)
    _, trace = serving.serve(_model(), requests, num_blocks=6, page_size=4)
    start = {name: t["step"] for t in trace for name in t["admitted"]}
    by_arrival = sorted(requests, key=lambda r: r.arrival)
    for r in requests:
        assert start[r.name] >= r.arrival
    starts = [start[r.name] for r in by_arrival]
    assert starts == sorted(starts)


def test_paged_forward_step_gives_the_full_forward_pass_logits():
    """Prefill two sequences of different lengths, then decode them together: each step's logits are
    the full model's over the whole sequence."""
    model = _model(seed=2)
    rng = np.random.default_rng(0)
    tokens = {"a": rng.integers(0, VOCAB, 9).tolist(), "b": rng.integers(0, VOCAB, 4).tolist()}
    caches = [serving.PagedKVCache(20, 3, 4, 4, dtype=torch.float64) for _ in model.blocks]
    for name, ids in tokens.items():
        for cache in caches:
            cache.add(name)
        serving.paged_forward_step(model, torch.tensor([ids]), torch.arange(len(ids))[None], caches, [name])
    for _ in range(3):
        new = [int(rng.integers(0, VOCAB)) for _ in tokens]
        positions = torch.tensor([[len(ids)] for ids in tokens.values()])
        logits = serving.paged_forward_step(model, torch.tensor([[t] for t in new]), positions, caches,
                                            list(tokens))
        for b, (name, ids) in enumerate(tokens.items()):
            ids.append(new[b])
            full = model(torch.tensor([ids]))[0, -1]
            assert torch.allclose(logits[b, 0], full, rtol=0, atol=1e-12)


def test_bad_requests_are_refused_with_their_names():
    model = _model()
    good = serving.Request("ok", (1, 2), n_new=3)
    with pytest.raises(ValueError, match="names must differ"):
        serving.serve(model, [good, good], num_blocks=4, page_size=4)
    with pytest.raises(ValueError, match="'empty'.*prompt"):
        serving.serve(model, [serving.Request("empty", (), n_new=2)], num_blocks=4, page_size=4)
    with pytest.raises(ValueError, match="'big'.*0 ... 10"):
        serving.serve(model, [serving.Request("big", (1, VOCAB), n_new=2)], num_blocks=4, page_size=4)
    with pytest.raises(ValueError, match="'none'.*n_new"):
        serving.serve(model, [serving.Request("none", (1,), n_new=0)], num_blocks=4, page_size=4)
    with pytest.raises(ValueError, match="'late'.*arrival"):
        serving.serve(model, [serving.Request("late", (1,), n_new=1, arrival=-1)], num_blocks=4, page_size=4)
    with pytest.raises(ValueError, match="'long' needs 3 pages.*num_blocks=2"):
        serving.serve(model, [serving.Request("long", (1,) * 8, n_new=2)], num_blocks=2, page_size=4)
    with pytest.raises(TypeError, match="Request objects, got tuple"):
        serving.serve(model, [((1, 2), 3)], num_blocks=4, page_size=4)
