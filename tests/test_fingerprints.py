"""specjax.runtime.fingerprints: a content digest of weights that tells apart models of the same
shapes, covers dtypes and tree paths, and is computed once per model object."""

import jax
import jax.numpy as jnp
import numpy as np
from conftest import build_lm

from specjax.runtime import fingerprints


def test_the_digest_follows_content_dtype_and_paths():
    a = {"w": jnp.arange(6, dtype=jnp.float32).reshape(2, 3), "b": jnp.zeros(3)}
    same = {"w": np.arange(6, dtype=np.float32).reshape(2, 3), "b": np.zeros(3, np.float32)}
    assert fingerprints.hash_arrays(a) == fingerprints.hash_arrays(same)
    nudged = {"w": a["w"].at[1, 2].add(1e-6), "b": a["b"]}
    assert fingerprints.hash_arrays(nudged) != fingerprints.hash_arrays(a)
    assert fingerprints.hash_arrays({"w": a["w"].astype(jnp.bfloat16), "b": a["b"]}) != \
        fingerprints.hash_arrays(a)
    assert fingerprints.hash_arrays({"v": a["w"], "b": a["b"]}) != fingerprints.hash_arrays(a)
    keyed = {"key": jax.random.key(3)}
    assert fingerprints.hash_arrays(keyed) != fingerprints.hash_arrays({"key": jax.random.key(4)})


def test_a_models_digest_is_computed_once(monkeypatch):
    lm = build_lm(0)
    digest = fingerprints.params_fingerprint(lm)
    assert digest == fingerprints.hash_arrays(lm.params)
    monkeypatch.setattr(fingerprints, "hash_arrays", lambda tree: 1 / 0)
    assert fingerprints.params_fingerprint(lm) == digest
    calls = []
    other = build_lm(1)
    fingerprints.remember(other, lambda: calls.append(1) or "from-a-loader")
    assert fingerprints.params_fingerprint(other) == "from-a-loader"
    assert fingerprints.params_fingerprint(other) == "from-a-loader" and calls == [1]
