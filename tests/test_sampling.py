"""attnlib.sampling: the seeded generator, the next-token rule (temperature, top-k, top-p), and generate."""

import numpy as np
import pytest
import torch

from attnlib import sampling


def test_uniform_is_mulberry32():
    """The values JavaScript's mulberry32 gives for these seeds (checked with node)."""
    u = sampling.Uniform(1)
    assert [u.next() for _ in range(3)] == [0.6270739405881613, 0.002735721180215478, 0.5274470399599522]
    u = sampling.Uniform(2**32 - 1)
    assert [u.next() for _ in range(2)] == [0.8964226141106337, 0.189478256739676]
    values = [sampling.Uniform(7).next() for _ in range(3)]
    assert values[0] == values[1] == values[2]  # the same seed, the same number
    stream = sampling.Uniform(7)
    assert all(0 <= stream.next() < 1 for _ in range(10_000))


def test_draws_follow_the_probabilities():
    logits = np.log(np.array([0.5, 0.3, 0.15, 0.05]))
    generator = sampling.Uniform(3)
    draws = np.bincount([sampling.sample_next(logits, generator=generator) for _ in range(20_000)], minlength=4)
    assert np.allclose(draws / draws.sum(), [0.5, 0.3, 0.15, 0.05], atol=0.012)


def test_temperature_sharpens_and_flattens():
    logits = np.log(np.array([0.6, 0.3, 0.1]))

    def share_of_first(temperature):
        generator = sampling.Uniform(11)
        return np.mean([sampling.sample_next(logits, temperature=temperature, generator=generator) == 0
                        for _ in range(5_000)])

    assert share_of_first(0.5) > 0.75 > share_of_first(1.0) > 0.55 > share_of_first(3.0)


def test_temperature_zero_is_the_first_argmax_and_needs_no_generator():
    assert sampling.sample_next(np.array([1.0, 3.0, 3.0, -2.0]), temperature=0) == 1


def kept(logits, **options):
    """The set of tokens a rule can draw: every draw over many uniforms."""
    generator = sampling.Uniform(5)
    return {sampling.sample_next(logits, generator=generator, **options) for _ in range(4_000)}


def test_top_k_keeps_the_k_most_likely_and_ties_go_to_the_lower_id():
    logits = np.log(np.array([0.1, 0.4, 0.2, 0.2, 0.1]))
    assert kept(logits, top_k=1) == {1}
    assert kept(logits, top_k=2) == {1, 2}  # 2 and 3 tie: the lower id
    assert kept(logits, top_k=3) == {1, 2, 3}
    assert kept(logits, top_k=99) == {0, 1, 2, 3, 4}


def test_top_p_keeps_the_fewest_whose_total_reaches_p():
    logits = np.log(np.array([0.5, 0.25, 0.125, 0.125]))  # sums that are exact in binary
    assert kept(logits, top_p=0.5) == {0}  # 0.5 reaches p exactly: no more
    assert kept(logits, top_p=0.51) == {0, 1}
    assert kept(logits, top_p=0.75) == {0, 1}
    assert kept(logits, top_p=0.8) == {0, 1, 2}  # of the tied pair, the lower id
    assert kept(logits, top_p=1.0) == {0, 1, 2, 3}
    assert kept(logits, top_p=0.01) == {0}  # at least one token
    assert kept(logits, top_k=3, top_p=0.8) == {0, 1, 2}


@pytest.mark.parametrize("arguments, words", [
    (dict(logits=np.zeros((2, 3))), "one row of scores"),
    (dict(logits=np.array([0.0, np.nan])), "finite"),
    (dict(logits=np.zeros(3), temperature=-1), "temperature must be"),
    (dict(logits=np.zeros(3), top_k=0), "top_k must be"),
    (dict(logits=np.zeros(3), top_p=0), "top_p must be"),
    (dict(logits=np.zeros(3), top_p=1.5), "top_p must be"),
    (dict(logits=np.zeros(3)), "generator must be"),
])
def test_bad_arguments_are_named(arguments, words):
    generator = None if "generator must be" in words else sampling.Uniform(0)
    with pytest.raises(ValueError, match=words):
        sampling.sample_next(generator=generator, **arguments)


@pytest.mark.parametrize("seed", [-1, 2**32, 1.5, True])
def test_a_bad_seed_is_named(seed):
    with pytest.raises(ValueError, match="seed must be"):
        sampling.Uniform(seed)


@pytest.fixture(scope="module")
def gpt_model():
    from attnlib.learn import gpt

    model, tokenizer, _ = gpt.load(gpt.stored_seeds()[0])
    return model, tokenizer


def test_the_cached_loop_writes_what_recomputing_writes_past_the_trained_context(gpt_model):
    model, tokenizer = gpt_model
    prompt = torch.tensor([tokenizer.encode("And God said")])
    for options in (dict(temperature=0), dict(temperature=0.8, seed=1), dict(temperature=1.0, top_k=5, seed=2),
                    dict(temperature=1.0, top_p=0.9, seed=3)):
        cached = sampling.generate(model, prompt, 120, window=64, **options)
        recomputed = sampling.generate(model, prompt, 120, window=64, cached=False, **options)
        assert torch.equal(cached, recomputed), options
        assert cached.shape == (1, prompt.shape[1] + 120)
    other = sampling.generate(model, prompt, 120, window=64, temperature=0.8, seed=4)
    assert not torch.equal(other, sampling.generate(model, prompt, 120, window=64, temperature=0.8, seed=1))


def test_generate_takes_one_sequence(gpt_model):
    model, _ = gpt_model
    with pytest.raises(ValueError, match="one sequence"):
        sampling.generate(model, torch.zeros(2, 3, dtype=torch.long), 5)
