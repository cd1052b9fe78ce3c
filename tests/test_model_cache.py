"""specjax_models.model_cache: a converted GGUF model and its tokenizer are stored once and
loaded back identical (either layer layout, each dtype its own entry); a changed source
file or a damaged entry is rebuilt, never used; concurrent writers leave one whole entry;
the cache can be turned off; a sharded or cast Hugging Face checkpoint is cached too."""

from __future__ import annotations

import json
import os

import jax
import numpy as np
import pytest
from conftest import build_lm
from test_gguf import TINY, write_gguf

import specjax_models
from specjax_models import gguf as gguf_module
from specjax_models import model_cache

pytest.importorskip("gguf")


@pytest.fixture
def cache_dir(tmp_path, monkeypatch):
    folder = tmp_path / "models"
    monkeypatch.setenv(model_cache.ENV_VAR, str(folder))
    return folder


@pytest.fixture(scope="module")
def source_file(tmp_path_factory):
    path = tmp_path_factory.mktemp("src") / "tiny.gguf"
    write_gguf(path, build_lm(5, **TINY))
    return path


def conversions(monkeypatch) -> list:
    """Counts the real conversions (cache misses) of GGUF models and tokenizers."""
    calls = []
    for name in ("_convert_gguf", "_build_tokenizer"):
        original = getattr(gguf_module, name)

        def counted(*args, original=original, name=name):
            calls.append(name)
            return original(*args)
        monkeypatch.setattr(gguf_module, name, counted)
    return calls


def leaves(lm) -> list[np.ndarray]:
    return [np.asarray(x) for x in jax.tree.leaves(lm.params)]


def test_a_cached_model_and_tokenizer_load_back_identical(cache_dir, source_file,
                                                          monkeypatch):
    calls = conversions(monkeypatch)
    fresh = specjax_models.from_gguf(source_file)
    tokenizer = specjax_models.gguf_tokenizer(source_file)
    assert calls == ["_convert_gguf", "_build_tokenizer"]
    again = specjax_models.from_gguf(source_file)
    tokenizer_again = specjax_models.gguf_tokenizer(source_file)
    assert calls == ["_convert_gguf", "_build_tokenizer"]  # both from the cache
    for a, b in zip(leaves(fresh), leaves(again), strict=True):
        np.testing.assert_array_equal(a, b)
    text = "hello <|im_end|> hell"
    assert tokenizer_again.encode(text) == tokenizer.encode(text)
    messages = [{"role": "user", "content": "hello"}]
    assert tokenizer_again.apply_chat_template(messages) == \
        tokenizer.apply_chat_template(messages)
    assert (tokenizer_again.eos_ids, tokenizer_again.bos_id) == \
        (tokenizer.eos_ids, tokenizer.bos_id)
    scanned = specjax_models.from_gguf(source_file, scan_layers=True)  # from the cache
    assert calls == ["_convert_gguf", "_build_tokenizer"]
    tokens = np.array([[3, 1, 4, 1, 5]])
    np.testing.assert_allclose(np.asarray(scanned.logits(tokens)),
                               np.asarray(fresh.logits(tokens)), rtol=1e-5, atol=1e-5)
    bf16 = specjax_models.from_gguf(source_file, dtype="bfloat16")  # its own entry
    assert calls.count("_convert_gguf") == 2
    assert {str(x.dtype) for x in jax.tree.leaves(bf16.params)} == {"bfloat16"}


def test_a_changed_source_or_a_damaged_entry_is_rebuilt(cache_dir, source_file, tmp_path,
                                                        monkeypatch):
    calls = conversions(monkeypatch)
    source = tmp_path / "model.gguf"
    source.write_bytes(source_file.read_bytes())
    first = leaves(specjax_models.from_gguf(source))
    for damage in ("flip", "truncate", "record"):
        model_cache.wait_for_writes()  # entries are written by a background thread
        (entry,) = [p for p in cache_dir.iterdir() if p.name.startswith("gguf-")]
        weights = entry / "weights.safetensors"
        data = bytearray(weights.read_bytes())
        if damage == "flip":
            data[-5] ^= 0xFF
            weights.write_bytes(bytes(data))
        elif damage == "truncate":
            weights.write_bytes(bytes(data[: len(data) // 2]))
        else:
            (entry / model_cache.ENTRY).write_text('{"format": 1, "files": {')
        before = calls.count("_convert_gguf")
        rebuilt = leaves(specjax_models.from_gguf(source))
        assert calls.count("_convert_gguf") == before + 1, damage  # detected, rebuilt
        for a, b in zip(first, rebuilt, strict=True):
            np.testing.assert_array_equal(a, b)
    os.utime(source, ns=(0, 10**9))  # the same bytes, another modification time
    specjax_models.from_gguf(source)
    assert calls.count("_convert_gguf") == 5
    model_cache.wait_for_writes()
    assert len([p for p in cache_dir.iterdir() if p.name.startswith("gguf-")]) == 2


def test_concurrent_writers_leave_one_whole_entry(cache_dir):
    folder = cache_dir / "demo-entry"
    write = lambda text: lambda staging: (staging / "x.txt").write_text(text)
    model_cache._publish(folder, write("first"))
    model_cache._publish(folder, write("second"))  # lost the race: the first one stays
    assert (folder / "x.txt").read_text() == "first"
    assert model_cache._verified(folder) is not None
    assert sorted(p.name for p in cache_dir.iterdir()) == ["demo-entry"]  # no staging left


def test_the_cache_can_be_turned_off(cache_dir, source_file, monkeypatch):
    specjax_models.from_gguf(source_file, cache=False)
    model_cache.wait_for_writes()
    assert not cache_dir.exists()
    monkeypatch.setenv(model_cache.ENV_VAR, "off")
    specjax_models.gguf_tokenizer(source_file)
    assert not cache_dir.exists() and not model_cache.model_cache_enabled(None)


def test_a_sharded_or_cast_checkpoint_is_cached_and_a_plain_one_is_not(cache_dir, tmp_path):
    model = tmp_path / "hf"
    specjax_models.save_pretrained(build_lm(2), model)
    plain = specjax_models.from_pretrained(model)
    assert not cache_dir.exists()  # nothing converted: read as it is
    cast = specjax_models.from_pretrained(model, dtype="bfloat16")
    model_cache.wait_for_writes()
    (entry,) = cache_dir.iterdir()
    assert json.loads((entry / "config.json").read_text())["param_dtype"] == "bfloat16"
    again = specjax_models.from_pretrained(model, dtype="bfloat16")
    for a, b in zip(leaves(cast), leaves(again), strict=True):
        np.testing.assert_array_equal(a, b)
    assert len(leaves(plain)) == len(leaves(again))


def test_the_weights_digest_is_computed_once_and_kept_beside_the_entry(cache_dir, source_file,
                                                                       monkeypatch):
    from specjax.runtime import fingerprints
    fresh = specjax_models.from_gguf(source_file)  # built; the entry written meanwhile
    digest = fingerprints.params_fingerprint(fresh)
    assert digest == fingerprints.hash_arrays(fresh.params)
    model_cache.wait_for_writes()
    again = specjax_models.from_gguf(source_file)  # from the entry
    stored = [p for e in cache_dir.iterdir() for p in e.glob("params-unrolled.blake2b")]
    assert [p.read_text().strip() for p in stored] == [digest]

    def refuse(tree):
        raise AssertionError("the digest was computed again")

    monkeypatch.setattr(fingerprints, "hash_arrays", refuse)
    assert fingerprints.params_fingerprint(again) == digest  # read from beside the entry
    # Other weights of the same shapes have another digest.
    other = build_lm(6, **TINY)
    monkeypatch.undo()
    assert fingerprints.params_fingerprint(other) != fingerprints.params_fingerprint(
        build_lm(5, **TINY))
