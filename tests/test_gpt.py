"""The GPT on real text (attnlib.learn.gpt): stored checkpoints, their logs, and the code that made them."""

import math
import re
import shutil

import pytest
import torch

from attnlib.learn import gpt, recipes

EVALUATION_LINE = re.compile(
    r"seed (\d+): held-out (\d+\.\d{3}) nats/char \(unigram (\d+\.\d{3}), bigram (\d+\.\d{3})\)")
GOAL = 0.45  # every stored seed at most this fraction of the unigram baseline


@pytest.fixture(scope="module")
def stored():
    return {seed: gpt.load(folder) for seed, folder in gpt.stored_seeds().items()}


@pytest.fixture(scope="module")
def evaluation_lines():
    return gpt.evaluate()


def test_at_least_three_seeds_are_stored(stored):
    assert sorted(stored)[:3] == [0, 1, 2]


def test_a_fresh_run_replays_the_stored_log_of_seed_0(stored):
    _, _, log = stored[0]
    assert log["recipe"] == recipes.GPT
    assert gpt.replay(0, 3) == log["losses"][:3]  # 30 steps, losses rounded as the log stores them


def test_replay_depends_on_the_seed(stored):
    _, _, log = stored[0]
    assert gpt.replay(1, 1) != log["losses"][:1]


def test_baselines_are_sane():
    baseline = gpt.baselines()
    assert 0 < baseline["bigram"] < baseline["unigram"] < math.log(len(gpt.tokenizer().vocab))


def test_evaluate_prints_one_line_per_stored_seed_in_the_stated_format(evaluation_lines, stored):
    baseline = gpt.baselines()
    assert len(evaluation_lines) == len(stored)
    for line, (seed, (_, _, log)) in zip(evaluation_lines, stored.items()):
        match = EVALUATION_LINE.fullmatch(line)
        assert match, line
        assert int(match[1]) == seed
        assert float(match[2]) == pytest.approx(log["heldout_nats_per_char"], abs=1e-3)  # recomputed = logged
        assert float(match[3]) == round(baseline["unigram"], 3)
        assert float(match[4]) == round(baseline["bigram"], 3)


def test_every_stored_seed_reaches_the_goal(stored):
    unigram = gpt.baselines()["unigram"]
    for seed, (_, _, log) in stored.items():
        assert log["recipe"]["steps"] == recipes.GPT["steps"], f"seed {seed} was not trained with the recipe"
        assert log["heldout_nats_per_char"] <= GOAL * unigram, f"seed {seed}: {log['heldout_nats_per_char']}"


def test_every_log_is_stamped_with_a_commit_seed_and_dtype(stored):
    for seed, (model, _, log) in stored.items():
        assert re.fullmatch(r"[0-9a-f]{40}(-dirty)?", log["stamp"]["git_commit"])
        assert (log["stamp"]["seed"], log["stamp"]["dtype"]) == (seed, recipes.GPT["dtype"])
        assert log["parameters"] == gpt.parameter_count(model)
        assert len(log["losses"]) == recipes.GPT["steps"] // recipes.GPT["log_every"]


def test_save_and_load_round_trip_the_weights_and_the_log(tmp_path):
    model, record = gpt.train(0, stop_after=10)
    gpt.save(model, record, recipes.GPT, 0, tmp_path, "test")
    loaded, tokenizer, log = gpt.load(tmp_path)
    windows = gpt.heldout_windows()[:4]  # (4, context + 1)
    assert torch.equal(loaded(windows), model(windows))  # float32 stored, float32 trained
    assert tokenizer.vocab == gpt.tokenizer().vocab
    assert log["losses"] == record["losses"] and log["seed"] == 0


def test_the_evaluate_command_reads_a_folder_of_checkpoints(tmp_path, capsys):
    shutil.copytree(gpt.stored_seeds()[0], tmp_path / "seed_7")
    gpt.main(["evaluate", "--dir", str(tmp_path)])
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == 1 and lines[0].startswith("seed 7: held-out ")


def test_heldout_loss_is_per_character_when_tokens_hold_several(stored):
    model, tokenizer, _ = stored[0]
    windows = gpt.heldout_windows()[:8]
    per_token = gpt.heldout_loss(model, windows)
    two_characters_each = [token * 2 for token in tokenizer.vocab]
    assert gpt.heldout_loss(model, windows, vocab=two_characters_each) == pytest.approx(per_token / 2)


def test_the_stored_bpe_runs_replay_and_beat_the_character_model_per_character():
    from attnlib.text.bpe import BPE

    runs = {seed: gpt.load(folder) for seed, folder in gpt.stored_seeds(gpt.DEFAULT_DIR / "bpe").items()}
    assert runs, "no stored BPE run"
    model, tokenizer, log = runs[min(runs)]
    assert isinstance(tokenizer, BPE) and log["recipe"] == recipes.GPT_BPE
    assert tokenizer.merges == gpt.recipe_tokenizer(recipes.GPT_BPE).merges  # relearned identically
    assert gpt.replay(min(runs), 2, recipes.GPT_BPE) == log["losses"][:2]
    windows = gpt.heldout_windows(recipes.GPT_BPE)
    again = gpt.heldout_loss(model, windows, tokenizer.vocab)  # nats per character, not per token
    assert again == pytest.approx(log["heldout_nats_per_char"], abs=1e-3)
    assert max(r[2]["heldout_nats_per_char"] for r in runs.values()) < min(
        gpt.load(f)[2]["heldout_nats_per_char"] for f in gpt.stored_seeds().values())
