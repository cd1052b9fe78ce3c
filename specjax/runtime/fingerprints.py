"""Content fingerprints of weights: what tells two models apart when their shapes agree
(two fine-tunes of one architecture, `runs/a` and `runs/b`).

`params_fingerprint(tree)` is a BLAKE2b digest of every array leaf's path, shape, dtype and
bytes, read to the host one leaf at a time (a sharded leaf is gathered alone, never the
whole model). Hashing reads every weight once (about a second per GB on one core), so each
model's digest is computed once per process and kept beside the model object
(`remember`); a loader that can keep it on disk (the model cache beside its entry,
`specjax_models.model_cache`) registers a provider that reads it from there and writes it
after the first computation.
"""

from __future__ import annotations

import hashlib
import weakref
from collections.abc import Callable

import jax
import numpy as np

# Model object -> its digest, or a provider that returns it (set by loaders).
_KNOWN: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def hash_arrays(tree) -> str:
    """The BLAKE2b digest (hex) of the array leaves of `tree`: each leaf's path, shape,
    dtype and bytes in tree order."""
    digest = hashlib.blake2b(digest_size=20)
    for path, leaf in jax.tree_util.tree_flatten_with_path(tree)[0]:
        if not hasattr(leaf, "shape") or not hasattr(leaf, "dtype"):
            digest.update(f"{jax.tree_util.keystr(path)}={leaf!r};".encode())
            continue
        if jax.dtypes.issubdtype(leaf.dtype, jax.dtypes.prng_key):
            leaf = jax.random.key_data(leaf)
        host = np.ascontiguousarray(jax.device_get(leaf))
        digest.update(f"{jax.tree_util.keystr(path)}:{host.shape}:{host.dtype};".encode())
        digest.update(host.view(np.uint8).reshape(-1).data if host.size else b"")
    return digest.hexdigest()


def remember(model, value: str | Callable[[], str]) -> None:
    """Keep `model`'s digest (or a provider of it, called once on first use) beside the
    model object, for `params_fingerprint`."""
    _KNOWN[model] = value


def params_fingerprint(model) -> str:
    """The digest of a model's weights (a `CausalLM`'s params, or any pytree of arrays):
    remembered for the model object after the first call."""
    try:
        known = _KNOWN.get(model)
    except TypeError:  # not weakly referable (a dict of arrays): computed each time
        return hash_arrays(getattr(model, "params", model))
    if callable(known):
        known = known()
    if known is None:
        known = hash_arrays(getattr(model, "params", model))
    _KNOWN[model] = known
    return known
