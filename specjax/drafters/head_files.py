"""Trained heads on disk (EAGLE/MTP heads, Medusa heads, Kangaroo adapters): `head.json`
(kind and config) and `head.npz` (float32 parameters, a draft vocabulary), each written
atomically; loading refuses a damaged or incomplete head by naming the file and the fix.
The target's own embedding and LM head are never stored: a head is loaded onto its
target, whose rows a reduced draft vocabulary selects (`restrict_lm_head`)."""

from __future__ import annotations

from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
from jax import Array

from specjax.drafters.base import draft_vocab_ids
from specjax.drafters.feature_head import FeatureHeadConfig, init_head_params
from specjax.runtime.files import (
    check_arrays,
    damaged,
    load_npz,
    read_json,
    save_npz_atomically,
    write_json_atomically,
)

DRAFT_VOCAB_KEY = "draft_vocab"
OWN_LM_HEAD_KEY, OWN_EMBEDDING_KEY = "own_lm_head", "own_embedding"

# A saved head's kind -> the drafter class that loads it.
HEAD_LOADERS = {"eagle": "Eagle", "medusa": "Medusa", "early_exit": "EarlyExit"}

HEAD_REMEDY = "train the head again (specjax train-drafter) or copy a complete one"


def save_head(directory: str | Path, kind: str, config: dict, params: dict) -> None:
    """`head.npz` (the parameters) then `head.json` ({"kind", "config"}) in `directory`,
    each written atomically (a killed save leaves the previous head or none)."""
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    save_npz_atomically(directory / "head.npz", **_weights_dict(params))
    write_json_atomically(directory / "head.json", {"kind": kind, "config": config})


def load_head(directory: str | Path) -> tuple[str, dict, dict]:
    """`(kind, config dict, params as numpy arrays)` saved by `save_head`; a damaged or
    incomplete head is a ValueError naming the file."""
    directory = Path(directory)
    if not (directory / "head.json").exists():
        raise FileNotFoundError(f"no trained head at {directory} (expected head.json and "
                                "head.npz, as `specjax train-drafter` writes)")
    meta = read_json(directory / "head.json", HEAD_REMEDY)
    if meta.get("kind") not in HEAD_LOADERS or not isinstance(meta.get("config"), dict):
        raise damaged(directory / "head.json", f"names kind {meta.get('kind')!r} with config "
                      f"{type(meta.get('config')).__name__}, expected a kind of "
                      f"{tuple(HEAD_LOADERS)} and a config object", HEAD_REMEDY)
    if not (directory / "head.npz").exists():
        raise FileNotFoundError(f"{directory} has head.json but no head.npz (an incomplete "
                                f"copy?); {HEAD_REMEDY}")
    return meta["kind"], meta["config"], load_npz(directory / "head.npz", HEAD_REMEDY)


def check_head_arrays(directory: Path, config: FeatureHeadConfig, params: dict,
                      draft_vocab) -> None:
    """Refuse a saved head whose arrays are not the ones `config` builds (by name, shape
    and dtype kind) or whose draft vocabulary is not a list of ids, naming the file."""
    expected = {name: value.shape for name, value in
                jax.eval_shape(lambda: init_head_params(config, jax.random.key(0))).items()}
    check_arrays(directory / "head.npz", params, expected, HEAD_REMEDY)
    if draft_vocab is not None and (draft_vocab.ndim != 1 or
                                    not np.issubdtype(draft_vocab.dtype, np.integer)):
        raise damaged(directory / "head.npz", f"its draft vocabulary is {draft_vocab.dtype}"
                      f" {draft_vocab.shape}, expected a list of token ids", HEAD_REMEDY)


def head_config_from(directory: Path, fields: dict) -> FeatureHeadConfig:
    try:
        return FeatureHeadConfig.from_dict(fields)
    except (TypeError, ValueError) as error:
        raise damaged(directory / "head.json", f"holds a config this version cannot build "
                      f"({error})", HEAD_REMEDY) from None


def restrict_lm_head(lm_head_VD: Array, draft_vocab) -> tuple[Array, Array | None]:
    """`(lm_head rows, draft_vocab int32)` for a draft vocabulary of target ids (sorted,
    unique), or the full head and None."""
    if draft_vocab is None:
        return lm_head_VD, None
    ids = draft_vocab_ids(draft_vocab, lm_head_VD.shape[0])
    return lm_head_VD[ids], ids


def _weights_dict(params: dict) -> dict:
    """numpy arrays to save: floating ones as float32 (a bfloat16 array has no .npz type;
    jnp.issubdtype, unlike numpy's, knows bfloat16 is floating)."""
    arrays = {name: np.asarray(value) for name, value in params.items()}
    return {name: array.astype(np.float32) if jnp.issubdtype(array.dtype, jnp.floating)
            else array for name, array in arrays.items()}
