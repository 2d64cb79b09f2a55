import numpy as np
import torch

import attnlib
from attnlib import examples


def test_the_cat_sat_weights_reproduce_its_q_k_v_rows():
    ex = examples.THE_CAT_SAT
    assert ex.tokens == ("the", "cat", "sat") and ex.x.shape == (3, 4)
    q, k, v = attnlib.project_qkv(ex.x, ex.w_q, ex.w_k, ex.w_v)
    np.testing.assert_allclose(q, ex.q, atol=1e-12)
    np.testing.assert_allclose(k, ex.k, atol=1e-12)
    np.testing.assert_allclose(v, ex.v, atol=1e-12)
    np.testing.assert_array_equal(ex.v[ex.index("sat")], [0.7, 0.2, 0.4, 0.8])


def test_the_softmax_illustration_row_is_not_a_row_of_the_running_example():
    ex = examples.THE_CAT_SAT
    scores = attnlib.score_matrix(ex.q, ex.k)
    assert not any(np.allclose(row, examples.SOFTMAX_ILLUSTRATION_SCORES) for row in scores)


def test_animal_sentence_has_its_twelve_tokens_and_seeded_embeddings():
    assert len(examples.ANIMAL_SENTENCE) == 12 and examples.ANIMAL_SENTENCE[7] == "it"
    a = examples.animal_sentence_embeddings(d_model=8, seed=3)
    assert a.shape == (12, 8)
    np.testing.assert_array_equal(a, examples.animal_sentence_embeddings(d_model=8, seed=3))


def test_device_says_cuda_only_when_torch_sees_a_gpu(monkeypatch):
    assert attnlib.device() == ("cuda" if torch.cuda.is_available() else "cpu")
    monkeypatch.setenv("ATTNLIB_FORCE_CPU", "1")
    assert attnlib.device() == "cpu"


def test_numpy_attention_does_not_import_torch():
    import subprocess
    import sys

    code = ("import sys, numpy as np, attnlib; q = np.ones((3, 2)); attnlib.attention(q, q, q); "
            "attnlib.attention(q, q, q, backend='loop'); print('torch' in sys.modules)")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert result.stdout.strip() == "False"
