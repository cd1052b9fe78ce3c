"""specjax_models.recipes.stdlib_corpus: the stdlib corpus, its stable split, and
reproducible batches."""

import numpy as np

from specjax_models.recipes import stdlib_corpus as corpus
from specjax_models.tokenizer import BOS_ID, EOS_ID


def test_split_is_by_file_and_stable():
    files = corpus.stdlib_files()
    assert len(files) > 100 and "ast.py" in files
    assert not any("/test/" in f or f.startswith("test/") for f in files)
    heldout = [f for f in files if corpus.is_heldout(f)]
    assert 0.02 < len(heldout) / len(files) < 0.1
    assert corpus.is_heldout("ast.py") == corpus.is_heldout("ast.py")


def test_build_and_save_round_trip(tmp_path):
    built = corpus.build_corpus(max_files=12)
    assert built.train[0] == BOS_ID and EOS_ID in built.train
    assert built.manifest["python"] and len(built.manifest["train_files"]) + len(
        built.manifest["heldout_files"]) == 12
    built.save(tmp_path)
    loaded = corpus.Corpus.load(tmp_path)
    np.testing.assert_array_equal(loaded.train, built.train)
    assert loaded.manifest == built.manifest


def test_windows_are_a_pure_function_of_seed_and_step():
    stream = np.arange(1000, dtype=np.uint16)
    a = corpus.sample_windows(stream, 4, 17, seed=3, step=5)
    np.testing.assert_array_equal(a, corpus.sample_windows(stream, 4, 17, seed=3, step=5))
    assert not np.array_equal(a, corpus.sample_windows(stream, 4, 17, seed=3, step=6))
    assert a.shape == (4, 17) and a.dtype == np.int32
    np.testing.assert_array_equal(np.diff(a, axis=1), 1)  # contiguous windows


def test_shipped_prompts_come_from_heldout_files():
    import json
    from pathlib import Path

    import specjax_models

    shipped = Path(specjax_models.__file__).parent / "checkpoints/prompts.json"
    prompts = json.loads(shipped.read_text())
    assert {p["kind"] for p in prompts} == {"continue", "copy"}
    assert all(corpus.is_heldout(p["file"]) for p in prompts)
