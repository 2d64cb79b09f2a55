"""attnlib.learn.transformer (chapter 8): the block's parts, the decoder's shapes and errors, and the
interface a cached decoder (chapter 9) builds on."""

import numpy as np
import pytest

torch = pytest.importorskip("torch")

import attnlib  # noqa: E402
from attnlib.learn.transformer import (  # noqa: E402
    MLP,
    POSITION_SCHEMES,
    Block,
    CausalSelfAttention,
    Decoder,
    LayerNorm,
    next_token_loss,
    without_head,
)

V, D, H = 11, 16, 2


def _tokens(B=3, T=9, seed=1):
    return torch.randint(V, (B, T), generator=torch.Generator().manual_seed(seed))


def _model(positions="learned", **kwargs):
    return Decoder(V, D, H, 2, positions=positions, max_len=16, **kwargs)


# --- The parts -------------------------------------------------------------------------------


def test_layer_norm_gives_each_token_mean_zero_and_variance_one():
    x = torch.randn(2, 5, D, dtype=torch.float64) * 7 + 3
    y = LayerNorm(D).double()(x)
    torch.testing.assert_close(y.mean(-1), torch.zeros(2, 5, dtype=torch.float64), atol=1e-12, rtol=0)
    torch.testing.assert_close(y.var(-1, unbiased=False), torch.ones(2, 5, dtype=torch.float64), atol=1e-4, rtol=0)


def test_layer_norm_matches_torch():
    x = torch.randn(2, 5, D, dtype=torch.float64)
    norm = LayerNorm(D).double()
    with torch.no_grad():
        norm.gain.uniform_(0.5, 2.0)
        norm.bias.uniform_(-1.0, 1.0)
    expected = torch.nn.functional.layer_norm(x, (D,), norm.gain, norm.bias, eps=norm.eps)
    torch.testing.assert_close(norm(x), expected)


def test_the_mlp_treats_every_token_on_its_own():
    mlp = MLP(D, 4 * D, torch.Generator().manual_seed(0)).double()
    x = torch.randn(1, 6, D, dtype=torch.float64)
    whole = mlp(x)
    one_by_one = torch.cat([mlp(x[:, t:t + 1]) for t in range(6)], dim=1)
    torch.testing.assert_close(whole, one_by_one)


def test_causal_self_attention_equals_multi_head_attention_with_the_causal_mask():
    layer = CausalSelfAttention(D, H, torch.Generator().manual_seed(0)).double()
    x = torch.randn(2, 7, D, dtype=torch.float64)
    expected = attnlib.multi_head_attention(x, layer.w_q, layer.w_k, layer.w_v, layer.w_o, H, causal=True)
    torch.testing.assert_close(layer(x), expected)


def test_a_block_is_two_residual_steps():
    block = Block(D, H, torch.Generator().manual_seed(0)).double()
    x = torch.randn(2, 7, D, dtype=torch.float64)
    middle = x + block.attention(block.norm_1(x))
    torch.testing.assert_close(block(x), middle + block.mlp(block.norm_2(middle)))


def test_an_attention_only_block_has_no_mlp():
    block = Block(D, H, torch.Generator().manual_seed(0), mlp=False).double()
    x = torch.randn(2, 7, D, dtype=torch.float64)
    assert block.mlp is None
    torch.testing.assert_close(block(x), x + block.attention(block.norm_1(x)))


# --- The decoder -------------------------------------------------------------------------------


@pytest.mark.parametrize("positions", POSITION_SCHEMES)
def test_logits_have_one_score_per_vocabulary_token_at_every_position(positions):
    model = _model(positions)
    logits = model(_tokens())
    assert logits.shape == (3, 9, V) and logits.dtype == torch.float64


@pytest.mark.parametrize("positions", POSITION_SCHEMES)
def test_a_later_token_never_changes_an_earlier_logit(positions):
    model, tokens = _model(positions), _tokens()
    changed = tokens.clone()
    changed[:, 5] = (changed[:, 5] + 1) % V
    before, after = model(tokens), model(changed)
    torch.testing.assert_close(before[:, :5], after[:, :5])
    assert not torch.allclose(before[:, 5:], after[:, 5:])


def test_the_same_seed_builds_the_same_model_and_another_seed_another():
    a, b, c = _model(seed=3), _model(seed=3), _model(seed=4)
    for (name, p), q, r in zip(a.named_parameters(), b.parameters(), c.parameters()):
        assert torch.equal(p, q), name
        if p.ndim == 2:  # every weight matrix; gains and biases start at 1 and 0 whatever the seed
            assert not torch.equal(p, r), name


def test_the_next_token_loss_scores_token_t_plus_1_with_the_logits_at_t():
    logits = torch.randn(2, 4, V, dtype=torch.float64)
    tokens = _tokens(B=2, T=4)
    by_hand = -np.mean([torch.log_softmax(logits[b, t], -1)[tokens[b, t + 1]].item()
                        for b in range(2) for t in range(3)])
    assert next_token_loss(logits, tokens).item() == pytest.approx(by_hand, rel=1e-12)


def test_an_untrained_model_scores_about_log_v():
    model, tokens = _model(), _tokens(B=64, T=16)
    assert abs(next_token_loss(model(tokens), tokens).item() - np.log(V)) < 1.0


def test_attention_maps_are_causal_and_sum_to_one():
    maps = _model("rope").attention_maps(_tokens())
    assert len(maps) == 2
    for weights in maps:
        assert weights.shape == (3, H, 9, 9)
        torch.testing.assert_close(weights.sum(-1), torch.ones(3, H, 9, dtype=torch.float64))
        assert torch.all(weights.triu(diagonal=1) == 0)


def test_without_head_silences_one_head_and_leaves_the_model_alone():
    model, tokens = _model(), _tokens()
    ablated = without_head(model, layer=1, head=0)
    d_head = D // H
    assert torch.all(ablated.blocks[1].attention.w_o[:d_head] == 0)
    assert torch.all(model.blocks[1].attention.w_o[:d_head] != 0)  # the original is untouched
    torch.testing.assert_close(ablated.blocks[1].attention.w_o[d_head:], model.blocks[1].attention.w_o[d_head:])
    assert not torch.allclose(ablated(tokens), model(tokens))


# --- Bad input ------------------------------------------------------------------------------------


@pytest.mark.parametrize("bad, message", [
    (torch.zeros(9, dtype=torch.long), r"tokens must be a \(B, T\) tensor of token ids, got \(9,\)"),
    (torch.zeros(2, 9), r"tokens must be a \(B, T\) tensor of token ids, got \(2, 9\)"),
    (torch.full((2, 9), V), r"ids in 0 \.\.\. 10 \(vocab_size=11\), got values from 11 to 11"),
])
def test_bad_tokens_are_named_with_their_shape(bad, message):
    with pytest.raises(ValueError, match=message):
        _model()(bad)


def test_a_sequence_past_max_len_is_refused_for_learned_positions():
    with pytest.raises(ValueError, match=r"position 16 is past max_len=16.*tokens \(1, 17\)"):
        _model()(_tokens(B=1, T=17))


def test_rope_needs_no_max_len():
    model = Decoder(V, D, H, 1, positions="rope")
    assert model(_tokens(B=1, T=40)).shape == (1, 40, V)


def test_positions_of_the_wrong_length_are_named():
    with pytest.raises(ValueError, match=r"positions must be a \(9,\) tensor.*tokens \(3, 9\), got \(8,\)"):
        _model()(_tokens(), torch.arange(8))


@pytest.mark.parametrize("kwargs, message", [
    (dict(positions="alibi"), r"positions must be one of .*'alibi'"),
    (dict(positions="learned"), r"positions='learned' needs max_len"),
])
def test_bad_construction_arguments_are_named(kwargs, message):
    with pytest.raises(ValueError, match=message):
        Decoder(V, D, H, 1, **kwargs)


def test_heads_must_divide_the_width():
    with pytest.raises(ValueError, match=r"n_heads=3 must divide d_model=16"):
        Decoder(V, D, 3, 1, positions="rope")


# --- The interface of a cached decoder (chapter 9) -----------------------------------------------


@pytest.mark.parametrize("positions", POSITION_SCHEMES)
@pytest.mark.parametrize("mlp", [True, False])
def test_decoding_token_by_token_from_cached_keys_and_values_gives_the_full_logits(positions, mlp):
    model, tokens = _model(positions, mlp=mlp), _tokens()
    cache = [(None, None) for _ in model.blocks]
    steps = []
    for t in range(tokens.shape[1]):
        position = torch.tensor([t])
        x = model.embed(tokens[:, t:t + 1], position)  # (B, 1, d)
        for i, block in enumerate(model.blocks):
            q, k, v = block.attention.qkv(block.norm_1(x), position)  # (B, H, 1, d_head)
            past_k, past_v = cache[i]
            if past_k is not None:
                k, v = torch.cat([past_k, k], dim=-2), torch.cat([past_v, v], dim=-2)
            cache[i] = (k, v)
            x = x + block.attention.attend(q, k, v)
            x = block.mlp_step(x)
        steps.append(model.logits(x))
    torch.testing.assert_close(torch.cat(steps, dim=1), model(tokens))


def test_a_prompt_then_one_token_gives_the_full_logits():
    model, tokens = _model("rope"), _tokens(T=8)
    prompt, positions = tokens[:, :7], torch.arange(7)
    x = model.embed(prompt, positions)
    caches = []
    for block in model.blocks:
        q, k, v = block.attention.qkv(block.norm_1(x), positions)
        caches.append((k, v))
        x = block.mlp_step(x + block.attention.attend(q, k, v))
    position = torch.tensor([7])
    x = model.embed(tokens[:, 7:], position)
    for block, (past_k, past_v) in zip(model.blocks, caches):
        q, k, v = block.attention.qkv(block.norm_1(x), position)
        keys, values = torch.cat([past_k, k], -2), torch.cat([past_v, v], -2)
        x = block.mlp_step(x + block.attention.attend(q, keys, values))
    torch.testing.assert_close(model.logits(x), model(tokens)[:, 7:])


def test_attend_passes_options_to_attention():
    layer = CausalSelfAttention(D, H, torch.Generator().manual_seed(0)).double()
    q, k, v = layer.qkv(torch.randn(1, 5, D, dtype=torch.float64))
    only_self = torch.eye(5, dtype=torch.bool)  # each query may attend only to itself
    out = layer.attend(q, k, v, mask=only_self)
    torch.testing.assert_close(out, attnlib.merge_heads(v) @ layer.w_o)


# --- The diagram ------------------------------------------------------------------------------------


@pytest.mark.parametrize("mlp", [True, False])
def test_the_block_diagram_writes_the_shapes_of_a_real_forward_pass(mlp):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from attnlib.block_diagram import decoder_shapes, draw_decoder

    model = _model(mlp=mlp)
    shapes = decoder_shapes(model, _tokens(B=3, T=9))
    expected = dict(tokens=(3, 9), x=(3, 9, D), qkv=(3, H, 9, D // H), weights=(3, H, 9, 9), heads=(3, 9, D),
                    logits=(3, 9, V))
    if mlp:
        expected["mlp_hidden"] = (3, 9, 4 * D)
    assert shapes == expected
    figure = draw_decoder(shapes, n_layers=2)
    texts = " ".join(text.get_text() for text in figure.axes[0].texts)
    for shape in expected.values():
        assert str(shape) in texts
    assert "repeated 2 times" in texts
    assert any(text.get_text() == "MLP" for text in figure.axes[0].texts) is mlp
    assert "embedding + position vectors" in texts and "RoPE" not in texts
    plt.close(figure)
    rope_figure = draw_decoder(shapes, n_layers=2, positions="rope")
    rope_texts = [text.get_text() for text in rope_figure.axes[0].texts]
    assert "token embedding" in rope_texts and not any("position vectors" in t for t in rope_texts)
    assert any("RoPE turns q and k" in t for t in rope_texts)
    plt.close(rope_figure)
    with pytest.raises(ValueError, match="positions must be one of"):
        draw_decoder(shapes, n_layers=2, positions="alibi")


def test_a_seed_gives_the_same_initial_decoder_on_any_cpu_code_path():
    """float32 torch.randn rounds differently with and without AVX2; the Decoder's draw must not."""
    import os
    import subprocess
    import sys

    script = ("import torch\nfrom attnlib.learn import recipes\n"
              "m = recipes.induction_model()\n"
              "print(repr([float(p.double().sum()) for p in m.parameters()]))\n")
    sums = set()
    for capability in ("default", "avx2"):
        env = {**os.environ, "ATEN_CPU_CAPABILITY": capability}
        out = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True,
                             timeout=120, check=True).stdout
        sums.add(out.strip())
    assert len(sums) == 1, sums
