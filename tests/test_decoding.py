"""attnlib.decoding: generating with a KV cache gives the tokens and logits of recomputing.

The model is chapter 8's decoder (attnlib.learn.transformer.Decoder), untrained:
the cache must not change what any model computes, trained or not.
"""

import pytest
import torch

import attnlib
from attnlib.decoding import forward_step, generate_cached, generate_recompute
from attnlib.kv_cache import KVCache
from attnlib.learn.transformer import Decoder

VOCAB, PROMPT_LEN, N_NEW = 24, 5, 20
TORCH_BACKENDS = [name for name in attnlib.backends() if name in ("torch", "sdpa")]


def _model(positions="rope", **kwargs):
    return Decoder(VOCAB, 32, 2, 2, positions=positions, max_len=64, seed=0, **kwargs)


def _prompt(batch=3):
    return torch.randint(0, VOCAB, (batch, PROMPT_LEN), generator=torch.Generator().manual_seed(0))


@pytest.mark.parametrize("positions", ["learned", "sinusoidal", "rope", "none"])
@pytest.mark.parametrize("backend", TORCH_BACKENDS)
def test_cached_and_recomputed_generation_give_the_same_tokens_and_logits(positions, backend):
    model = _model(positions)
    tokens, logits = generate_recompute(model, _prompt(), N_NEW, backend=backend)
    cached_tokens, cached_logits = generate_cached(model, _prompt(), N_NEW, backend=backend)
    assert tokens.shape == (3, PROMPT_LEN + N_NEW) and logits.shape == (3, N_NEW, VOCAB)
    assert torch.equal(cached_tokens, tokens)
    torch.testing.assert_close(cached_logits, logits, rtol=0, atol=1e-12)


def test_each_step_scores_what_the_full_forward_pass_scores():
    model = _model("learned")
    tokens, logits = generate_cached(model, _prompt(), N_NEW)
    full = model(tokens[:, :-1])  # (B, T - 1, V): row t scores token t + 1
    torch.testing.assert_close(logits, full[:, PROMPT_LEN - 1:], rtol=0, atol=1e-12)
    assert torch.equal(tokens[:, PROMPT_LEN:], full[:, PROMPT_LEN - 1:].argmax(dim=-1))


def test_the_prefill_with_no_cache_is_the_models_forward_pass():
    model, prompt = _model("rope", mlp=False), _prompt()
    positions = torch.arange(PROMPT_LEN)
    torch.testing.assert_close(forward_step(model, prompt, positions), model(prompt), rtol=0, atol=0)


@pytest.mark.parametrize("window", [1, 3, 8])
def test_a_windowed_cache_decodes_as_windowed_attention_over_the_whole_sequence(window):
    model = _model("rope")
    caches = [KVCache(window=window) for _ in model.blocks]
    tokens, logits = generate_recompute(model, _prompt(), N_NEW, window=window)
    cached_tokens, cached_logits = generate_cached(model, _prompt(), N_NEW, window=window, caches=caches)
    assert torch.equal(cached_tokens, tokens)
    torch.testing.assert_close(cached_logits, logits, rtol=0, atol=1e-12)
    assert [len(cache) for cache in caches] == [window] * len(model.blocks)
    assert caches[0].seen == PROMPT_LEN + N_NEW - 1  # the last token is generated, not run


def test_a_window_wider_than_the_sequence_changes_nothing():
    model = _model("rope")
    _, logits = generate_cached(model, _prompt(), N_NEW)
    _, windowed = generate_cached(model, _prompt(), N_NEW, window=PROMPT_LEN + N_NEW)
    torch.testing.assert_close(windowed, logits, rtol=0, atol=0)


def test_learned_positions_past_max_len_are_refused_with_the_position():
    model = Decoder(VOCAB, 16, 2, 1, positions="learned", max_len=8, seed=0)
    with pytest.raises(ValueError, match="position 8 is past max_len=8"):
        generate_cached(model, _prompt(), 8)


@pytest.mark.parametrize("args, error, fragment", [
    ((torch.zeros(5, dtype=torch.long), 3), ValueError, "prompt must be a (B, T_0) LongTensor"),
    ((torch.zeros(2, 3), 3), ValueError, "prompt must be a (B, T_0) LongTensor"),
    ((torch.zeros(2, 0, dtype=torch.long), 3), ValueError, "with T_0 >= 1, got (2, 0)"),
    ((torch.zeros(2, 3, dtype=torch.long), 0), ValueError, "n_new must be a positive int"),
    ((torch.zeros(2, 3, dtype=torch.long), 2.0), ValueError, "n_new must be a positive int"),
])
def test_bad_generation_arguments_are_named(args, error, fragment):
    for generate in (generate_recompute, generate_cached):
        with pytest.raises(error) as caught:
            generate(_model(), *args)
        assert fragment in str(caught.value)


def test_a_model_without_the_decoder_pieces_is_refused():
    with pytest.raises(TypeError, match="has no 'embed'"):
        generate_cached(torch.nn.Linear(2, 2), _prompt(), 2)


def test_caches_given_must_be_empty_one_per_block():
    model = _model()
    used = KVCache()
    used.update(torch.zeros(1, 1, 1, 2), torch.zeros(1, 1, 1, 2))
    with pytest.raises(ValueError, match="2 empty KVCache objects, one per block"):
        generate_cached(model, _prompt(), 2, caches=[KVCache(), used])
    with pytest.raises(ValueError, match="with window=4"):
        generate_cached(model, _prompt(), 2, window=4, caches=[KVCache(), KVCache()])
