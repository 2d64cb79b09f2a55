"""The live figures (attnlib.live): their Python side, and their page in headless Chromium.

The browser tests write the figures into a page of their own, open it offline, type
into the fields (tests/live_driver.py) and compare every number the page computes
with the Python functions, to 1e-6, for random inputs, held-out sequences and bad input.
"""

import html
import re

import numpy as np
import pytest
import torch

from attnlib import live
from attnlib.examples import THE_CAT_SAT
from attnlib.learn import induction, recipes
from tools.browser import Chromium, find_chromium

import live_driver

LETTERS = "abcdefghijklmnopqrstuvwx"


@pytest.fixture(scope="module")
def small_model():
    """Chapter 8's decoder, trained for a few steps only (the page's arithmetic is what is tested)."""
    recipe = dict(recipes.INDUCTION, steps=30, eval_every=30, eval_sequences=8)
    model = recipes.induction_model(recipe)
    recipes.train_induction(model, recipe)
    return model


def test_typed_scores_state_is_the_softmax_of_the_scaled_row():
    state = live.typed_scores_state([2.0, 4.0, 6.0], 0.5)
    e = np.exp(np.array([1.0, 2.0, 3.0]) - 3.0)
    assert np.allclose(state["weights"], e / e.sum()) and state["sum"] == pytest.approx(1.0)
    assert not state["saturated"] and live.typed_scores_state([0.0, 10.0], 1.0)["saturated"]


@pytest.mark.parametrize("bad, words", [
    (dict(scores=[1.0, 2.0], tokens=["a"]), "one score per token"),
    (dict(scores=[[1.0, 2.0]], tokens=["a", "b"]), "one row"),
    (dict(scores=[1.0, np.nan], tokens=["a", "b"]), "finite"),
    (dict(scores=[1.0, 2.0], tokens=["a", "b"], factor=np.inf), "finite"),
])
def test_typed_scores_refuses_bad_input_by_name(bad, words):
    with pytest.raises(ValueError, match=words):
        live.typed_scores(**bad)


def test_pick_query_matches_attnlib_attention():
    import attnlib

    for i, token in enumerate(THE_CAT_SAT.tokens):
        state = live.pick_query_state(THE_CAT_SAT, i)
        out = attnlib.attention(THE_CAT_SAT.q[i:i + 1], THE_CAT_SAT.k, THE_CAT_SAT.v)
        assert np.allclose(state["output"], out[0], atol=1e-12)
    with pytest.raises(ValueError, match="one of the example's tokens"):
        live.pick_query(THE_CAT_SAT, "dog")


def test_the_exported_model_is_the_model_to_1e_6(small_model):
    """Rounding every weight to 9 significant digits moves the logits by about 1e-7 to 1e-6."""
    data = live.export_decoder(small_model)
    twin = live.exported_model(data)
    tokens = torch.randint(induction.VOCAB_SIZE, (3, 20), generator=torch.Generator().manual_seed(5))
    with torch.no_grad():
        difference = (twin(tokens) - small_model(tokens)).abs().max().item()
    assert 0 < difference < 1e-6  # rounded (not the same tensors), and only by the rounding
    with pytest.raises(ValueError, match="attention-only decoder with RoPE"):
        live.export_decoder(recipes.induction_model(dict(recipes.INDUCTION, positions="learned")))


@pytest.mark.parametrize("text, words", [("ab!", "is not a token"), ("a", "at least 2"), ("y" * 3, "not a token"),
                                         ("a" * 33, "at most 32")])
def test_parse_letters_says_what_is_wrong(text, words):
    with pytest.raises(ValueError, match=words):
        live.parse_letters(text, LETTERS, 32)
    assert live.parse_letters("A b,c  D", LETTERS, 32) == [0, 1, 2, 3]


def test_a_figure_is_self_contained_and_deterministic(small_model):
    for make in (lambda: live.typed_scores([1, 2, 3], "abc"), lambda: live.pick_query(THE_CAT_SAT),
                 lambda: live.induction_live(small_model, LETTERS, "abcdabcd")):
        first, second = make(), make()
        assert first.html == second.html  # nbval compares the stored HTML with a fresh run
        assert not re.search(r"\bsrc=|href=|https?://", first.html)
    assert len(live.induction_live(small_model, LETTERS, "abcd").html) < 300_000


def held_out_sequences():
    """Sequences the model never trained on (another seed), as letters, and a few typed by hand."""
    data = induction.induction_sequences(3, torch.Generator().manual_seed(1234))
    typed = ["abcdefabcdef", "Q R S T q r s", "hello, hello"]
    return ["".join(LETTERS[t] for t in row[:n]) for row, n in zip(data.tokens, (32, 20, 9))] + typed


needs_chromium = pytest.mark.skipif(find_chromium() is None, reason="no Chromium (apt-get install chromium)")


@pytest.fixture(scope="module")
def small_pointer():
    """Chapter 7's pointer model, trained for a few steps only."""
    from attnlib.learn.coreference import make_coreference_data

    recipe = dict(recipes.COREFERENCE, steps=20)
    model = recipes.coreference_model(recipe)
    recipes.train_coreference(make_coreference_data(), model, recipe)
    return model


def held_out_pointer_sentences():
    """Random (template, animal, place, adjective) choices, the book's held-out pairs among them."""
    from attnlib.learn import coreference as task

    rng = np.random.default_rng(7)
    adjectives = task.ANIMAL_ADJECTIVES + task.PLACE_ADJECTIVES
    picks = [(int(rng.integers(2)), str(rng.choice(task.ANIMALS)), str(rng.choice(task.PLACES)),
              str(rng.choice(adjectives))) for _ in range(6)]
    return [(0, "animal", "street", "tired"), (1, "animal", "street", "wide")] + picks


@pytest.fixture(scope="module")
def page(tmp_path_factory, small_model, small_pointer):
    if find_chromium() is None:
        pytest.skip("no Chromium")
    figures = {"typed": live.typed_scores([2.0, 4.0, 6.0], ["the", "cat", "sat"], 0.5, query_token="sat"),
               "pick": live.pick_query(THE_CAT_SAT, "cat"),
               "induction": live.induction_live(small_model, LETTERS, "abcdabcd", head=(1, 1)),
               "pointer": live.pointer_live(small_pointer, animal="dog", adjective="wide")}
    path = tmp_path_factory.mktemp("live") / "figures.html"
    path.write_text("<!doctype html><html><head><meta charset='utf-8'><meta name='viewport' "
                    "content='width=device-width, initial-scale=1'></head><body>"
                    + "".join(f.html for f in figures.values()) + "</body></html>", encoding="utf-8")
    with Chromium() as browser:
        tab = browser.open_page(path.as_uri(), 390, 844)
        yield tab, figures
        assert tab.console_errors() == []
        tab.close()


@needs_chromium
def test_typed_scores_in_the_browser_agree_with_python(page):
    tab, figures = page
    figure = figures["typed"]
    data = {"tokens": ["the", "cat", "sat"]}
    assert live_driver.check_typed_scores(tab, figure.id, data, np.random.default_rng(0)) == []


@needs_chromium
def test_pick_query_in_the_browser_agrees_with_python(page):
    tab, figures = page
    assert live_driver.check_pick_query(tab, figures["pick"].id, {"tokens": list(THE_CAT_SAT.tokens)},
                                        THE_CAT_SAT) == []


@needs_chromium
def test_the_decoder_in_the_browser_agrees_with_python_on_held_out_sequences(page):
    tab, figures = page
    figure = figures["induction"]
    data = tab.evaluate(live_driver.FIGURES_JS, await_promise=False)
    data = next(f["data"] for f in data if f["id"] == figure.id)
    assert live_driver.check_induction(tab, figure.id, data, held_out_sequences()) == []


@needs_chromium
def test_the_controls_are_labelled_and_reachable_by_keyboard(page):
    tab, _ = page
    unlabelled = tab.evaluate("""[...document.querySelectorAll(".attn-live input, .attn-live select, .attn-live textarea")]
        .filter(e => !e.closest("label") || e.tabIndex < 0).length""", await_promise=False)
    assert unlabelled == 0
    too_wide = tab.evaluate("""[...document.querySelectorAll(".attn-live")]
        .filter(e => e.getBoundingClientRect().width > document.documentElement.clientWidth).length""",
                            await_promise=False)
    assert too_wide == 0


@needs_chromium
def test_the_pointer_model_in_the_browser_agrees_with_python(page):
    tab, figures = page
    figure = figures["pointer"]
    data = next(f["data"] for f in tab.evaluate(live_driver.FIGURES_JS, await_promise=False) if f["id"] == figure.id)
    assert live_driver.check_pointer(tab, figure.id, data, held_out_pointer_sentences()) == []


def test_pointer_live_refuses_words_outside_the_task(small_pointer):
    with pytest.raises(ValueError, match="animal must be one of"):
        live.pointer_live(small_pointer, animal="unicorn")
    with pytest.raises(ValueError, match="template must be"):
        live.pointer_live(small_pointer, template=2)


def test_the_model_figures_name_a_wrong_model_or_alphabet(small_model, small_pointer):
    with pytest.raises(TypeError, match="model must be an attnlib.learn.transformer.Decoder"):
        live.induction_live(small_pointer, LETTERS, "abab")
    with pytest.raises(TypeError, match="model must be an attnlib.learn.model.AttentionPointer"):
        live.pointer_live(small_model)
    with pytest.raises(ValueError, match="one different character per token id"):
        live.induction_live(small_model, LETTERS[:-1], "abab")
    with pytest.raises(ValueError, match="one different character per token id"):
        live.induction_live(small_model, "a" + LETTERS[1:-1] + "a", "abab")
    with pytest.raises(ValueError, match="head must be"):
        live.induction_live(small_model, LETTERS, "abab", head=(2, 0))


@needs_chromium
def test_every_control_fits_a_phone_screen(page):
    tab, _ = page
    wide = tab.evaluate("""[...document.querySelectorAll(".attn-live input, .attn-live select, .attn-live textarea")]
        .filter(e => e.getBoundingClientRect().right > document.documentElement.clientWidth + 1)
        .map(e => e.className + " " + Math.round(e.getBoundingClientRect().width))""", await_promise=False)
    assert wide == []


# -- the GPT that writes (chapter 10) ----------------------------------------------------------

@pytest.fixture(scope="module")
def gpt_seed_0():
    from attnlib.learn import gpt

    model, tokenizer, _ = gpt.load(gpt.stored_seeds()[0])
    return model, tokenizer.vocab


def writer_cases():
    """Prompts from the held-out text and typed by hand, each temperature, several seeds and heads."""
    from attnlib.learn import gpt

    held_out = gpt.text_split()[1]
    starts = (1000, 50_000, 200_000)
    prompts = [held_out[s:s + n] for s, n in zip(starts, (40, 64, 7))] + ["And God said", "Jesus wept.\n"]
    temperatures = (0.0, 0.5, 0.8, 1.0, 1.5)
    return [(p, temperatures[i % 5], 17 * i, (i % 2, i % 4)) for i, p in enumerate(prompts)]


def test_the_writers_python_twin_writes_what_attnlib_sampling_writes(gpt_seed_0):
    from attnlib import live_writer, sampling

    model, vocab = gpt_seed_0
    data = dict(live_writer.export_writer(model, vocab), n_new=60)
    for prompt, temperature, seed, _ in writer_cases():
        ids = torch.tensor([[vocab.index(c) for c in prompt]])
        want = sampling.generate(model, ids, 60, temperature=temperature, seed=seed, window=live_writer.WINDOW)
        state = live_writer.writer_state(data, prompt, temperature, seed, 60)
        assert state["tokens"] == want[0].tolist(), (prompt, temperature, seed)


def test_the_writers_python_twin_computes_the_models_windowed_logits(gpt_seed_0):
    """Same text is a weak check of the window (a 65-position cache writes the same greedy text): the
    twin's last logits equal the float32 model's over the whole text with a 64-position window, to 1e-4,
    and those of a 65-position window differ by far more."""
    from attnlib import live_writer
    from attnlib.decoding import forward_step

    model, vocab = gpt_seed_0
    data = dict(live_writer.export_writer(model, vocab), n_new=60)
    for prompt, temperature, seed, _ in writer_cases():
        state = live_writer.writer_state(data, prompt, temperature, seed, 60)
        seen = torch.tensor([state["tokens"][:-1]])  # the last logits are computed over all but the last
        positions, w = torch.arange(seen.shape[1]), live_writer.WINDOW
        with torch.no_grad():
            model_logits = {n: forward_step(model, seen, positions, window=n)[0, -1].double().numpy()
                            for n in (w, w + 1)}
        gap = {n: np.abs(state["logits"] - model_logits[n]).max() for n in (w, w + 1)}
        assert gap[w] < 1e-4, (prompt, temperature, gap)
        if seen.shape[1] > w:
            assert gap[w + 1] > 1e-3, (prompt, temperature, gap)


@pytest.mark.parametrize("prompt, words", [("café", "not in the model's alphabet: “é”"),
                                           ("", "at least one"), ("a" * 65, "at most 64")])
def test_the_writer_names_a_bad_prompt(gpt_seed_0, prompt, words):
    from attnlib import live_writer

    with pytest.raises(ValueError, match=words):
        live_writer.parse_prompt(prompt, gpt_seed_0[1])


BAD_PROMPTS = ("Xerxes", "Psalm 23:1", "Zo\U0001F600 and \U0001F600", "it\u2019s", "a\u00a0b\tc", "caf\u00e9",
               "", "a" * 65)


def test_the_writer_names_the_characters_it_lacks_and_what_it_knows(gpt_seed_0):
    """The alphabet of the stored model lacks "X" (the text has none): the message says so, names an emoji
    as one character and an invisible one by its code point."""
    from attnlib import live_writer

    vocab = gpt_seed_0[1]
    assert "X" not in vocab and "x" in vocab
    knows = "it knows the letters a-z and A-Z but \u201cX\u201d, space, newline and ! ' ( ) , - . : ; ?"
    assert live_writer.describe_alphabet(vocab) == knows
    assert live_writer.describe_alphabet(list("ab c")) == "it knows space and a b c"
    with pytest.raises(ValueError) as error:
        live_writer.parse_prompt(BAD_PROMPTS[2], vocab)
    assert str(error.value) == f"not in the model's alphabet: \u201c\U0001F600\u201d ({knows})"
    with pytest.raises(ValueError, match="the invisible U\\+00A0, the invisible U\\+0009 "):
        live_writer.parse_prompt(BAD_PROMPTS[4], vocab)


@pytest.mark.parametrize("options, words", [({"n_new": 0}, "n_new must be an int in 1"),
                                            ({"n_new": 2.5}, "n_new must be an int"),
                                            ({"seed": -1, "temperature": 0.0}, "seed must be an int"),
                                            ({"seed": 2**32}, "seed must be an int")])
def test_the_writer_figure_names_a_bad_option(gpt_seed_0, options, words):
    from attnlib import live_writer

    with pytest.raises(ValueError, match=words):
        live_writer.writer_live(*gpt_seed_0, **options)


def test_the_writer_figure_is_small_self_contained_and_deterministic(gpt_seed_0):
    from attnlib import live_writer

    first, second = (live_writer.writer_live(*gpt_seed_0, n_new=40) for _ in range(2))
    assert first.html == second.html
    assert len(first.html) < 1_000_000
    assert not re.search(r"\bsrc=|href=|https?://", first.html)
    with pytest.raises(ValueError, match="temperature must be one of"):
        live_writer.writer_live(*gpt_seed_0, temperature=0.7)
    with pytest.raises(ValueError, match="head must be"):
        live_writer.writer_live(*gpt_seed_0, head=(2, 0))


def test_the_writers_page_text_names_the_settings_it_was_written_at(gpt_seed_0):
    from attnlib import live_writer

    for temperature, seed in ((0.8, 1), (0.0, 7)):
        figure = live_writer.writer_live(*gpt_seed_0, temperature=temperature, seed=seed, n_new=20)
        text = live_writer.writer_state(dict(live_writer.export_writer(*gpt_seed_0), n_new=20),
                                        "And God said", temperature, seed, 20)["text"]
        settings = f"temperature {temperature:g}, sampling seed {seed}</span>: "
        assert settings in figure.html  # before the text, read without scripts
        assert figure.html.index(settings) < figure.html.index(html.escape(text))


def test_the_writers_static_figure_shows_the_text_and_the_heads_weights(gpt_seed_0):
    import matplotlib.pyplot as plt

    from attnlib import live_writer

    figure = live_writer.writer_live(*gpt_seed_0, "Jesus wept.\n", n_new=100, head=(0, 2))
    data = dict(live_writer.export_writer(*gpt_seed_0), n_new=100)
    state = live_writer.writer_state(data, "Jesus wept.\n", 0.8, 1, 100)
    fig = figure.static_figure()
    top, bottom = fig.axes
    written = "".join(t.get_text() for t in top.texts).replace("\n", "")
    assert state["text"].replace("\n", "\u21b5")[:60] in written
    shaded = bottom.images[0].get_array()
    assert np.allclose(shaded[0] * np.max(state["maps"][0][2]), state["maps"][0][2])
    assert len(bottom.texts) == len(state["maps"][0][2]) == live_writer.WINDOW
    plt.close(fig)


@needs_chromium
def test_the_writer_in_the_browser_writes_what_python_writes(tmp_path, gpt_seed_0):
    from attnlib import live_writer

    figure = live_writer.writer_live(*gpt_seed_0, n_new=60)
    path = tmp_path / "writer.html"
    path.write_text("<!doctype html><html><head><meta charset='utf-8'></head><body>" + figure.html
                    + "</body></html>", encoding="utf-8")
    with Chromium() as browser:
        tab = browser.open_page(path.as_uri(), 390, 844)
        data = next(f["data"] for f in tab.evaluate(live_driver.FIGURES_JS, await_promise=False)
                    if f["id"] == figure.id)
        assert live_driver.check_writer(tab, figure.id, data, writer_cases()) == []
        assert live_driver.check_writer_messages(tab, figure.id, data, BAD_PROMPTS + ("And God said",)) == []
        assert tab.console_errors() == []
        tab.close()
