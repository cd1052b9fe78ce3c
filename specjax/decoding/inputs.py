"""Host-side input preparation shared by every decoder: checks, prompt packing, capacity.

Everything here runs before anything is traced, so bad input is refused with a message
that names the problem and the fix instead of failing deep inside XLA. Shapes are
bucketed to powers of two so that new prompt lengths or a new `max_new_tokens` reuse the
compiled decoder instead of recompiling.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

import jax
import numpy as np
from jax import Array

from specjax.decoding.sampling import SamplingConfig, SamplingParams, distinct_configs, row_configs
from specjax.lm.causal_lm import CausalLM
from specjax.runtime.distributed import fetch
from specjax.runtime.sharding import model_placement

MIN_PROMPT_BUCKET = 32
# Prompt slots past a row's length hold this id: every vocabulary has it, so the padded
# slots a prefill writes (masked afterwards) always come from a real embedding row.
# A user's `pad_id` only fills outputs.
PROMPT_PAD_ID = 0
MIN_CACHE_BUCKET = 256


def bucket(n: int, minimum: int = MIN_PROMPT_BUCKET) -> int:
    """The smallest power of two >= n, and at least `minimum`."""
    return max(minimum, 1 << max(0, int(n) - 1).bit_length())


@dataclasses.dataclass(frozen=True)
class PromptBatch:
    """Right-padded prompts: `tokens` int32 `[B, P]` and `lengths` int32 `[B]` (host arrays).
    On a data-parallel mesh B may exceed the caller's rows: `real_rows` are theirs, the
    rest padding rows (copies of the last real row, done from the start)."""

    tokens: np.ndarray
    lengths: np.ndarray
    real_rows: int | None = None

    @property
    def batch(self) -> int:
        return self.tokens.shape[0]

    @property
    def rows(self) -> int:
        """The caller's rows (the first `rows` of the batch)."""
        return self.batch if self.real_rows is None else self.real_rows


def data_parallel_rows(lm: CausalLM) -> int:
    """How many devices split a batch's rows: the size of the mesh axis that the model's
    sharding rules map rows to (1 on one device or without a batch rule). The KV cache's
    batch dimension must divide by it."""
    placement = model_placement(lm)
    if placement is None or placement[1].batch is None:
        return 1
    mesh, rules = placement
    return int(mesh.shape[rules.batch])


def count_rows(prompts) -> int | None:
    """The number of prompts (rows) the caller passed; None when it is not a batch (the
    validation that follows says why)."""
    if hasattr(prompts, "shape"):
        return int(prompts.shape[0]) if len(prompts.shape) else None
    try:
        return len(prompts)
    except TypeError:
        return None


def padded_rows(lm: CausalLM, rows: int) -> int:
    """`rows` rounded up to a multiple of the mesh's data axis (tpu-inference pads the
    same way): any batch size runs on any data-parallel mesh."""
    multiple = data_parallel_rows(lm)
    return -(-rows // multiple) * multiple


def settings_for_padded_rows(lm: CausalLM, prompts, sampling):
    """`sampling` for the batch the decoders run: a per-row list is checked against the
    caller's rows, then extended with copies of its last setting for the padding rows a
    data-parallel mesh adds (copies keep the batch's static all-greedy bit as it was; the
    padding rows are done from the start, so their settings never draw a token).
    One `SamplingConfig` is returned as it is."""
    rows = count_rows(prompts)
    if rows is None or rows == 0:
        return sampling
    if not isinstance(sampling, (SamplingConfig, SamplingParams)):
        configs = row_configs(sampling, rows)
        padding = padded_rows(lm, rows) - rows
        if padding:
            return tuple(configs) + (configs[-1],) * padding
    return sampling


def pack_prompts(prompts, prompt_lengths, vocab_size: int, *,
                 pad_to: int | None = None) -> PromptBatch:
    """Validate prompts and pack them into a right-padded `[B, P]` int32 array.

    `prompts` is a list of token-id lists (ragged), or an int array `[B, P]` whose row b
    holds `prompt_lengths[b]` tokens (all P when `prompt_lengths` is None).

    The checks run on whole arrays, not row by row: a batch of tens of thousands of rows
    (the exactness harness's, a dataset's) is packed in milliseconds.
    """
    if isinstance(prompts, np.ndarray) or hasattr(prompts, "shape"):
        tokens = np.asarray(prompts)
        if tokens.ndim != 2:
            raise ValueError(f"prompts array must be 2-D [batch, prompt_len], got shape "
                             f"{tokens.shape}; wrap a single prompt as [prompt]")
        if not np.issubdtype(tokens.dtype, np.integer):
            raise TypeError(f"prompts must hold integer token ids, got dtype {tokens.dtype}")
        if tokens.shape[0] == 0:
            raise ValueError("prompts is empty: pass at least one prompt")
        if tokens.shape[1] == 0:
            raise ValueError("prompts has zero columns: every prompt needs at least one token")
        lengths = _array_prompt_lengths(prompt_lengths, tokens.shape)
    else:
        if isinstance(prompts, (str, bytes)) or not isinstance(prompts, Sequence):
            raise TypeError("prompts must be a list of token-id lists or an int array "
                            f"[batch, prompt_len], got {type(prompts).__name__}")
        if prompt_lengths is not None:
            raise ValueError("prompt_lengths is only for an array of prompts; a list of "
                             "lists already carries its lengths")
        if len(prompts) == 0:
            raise ValueError("prompts is empty: pass at least one prompt")
        tokens, lengths = _rectangular_prompts(prompts)
        if tokens is None:
            tokens, lengths = _ragged_prompts(prompts, vocab_size)
    # Only each row's first `lengths[b]` ids are the prompt (the rest: the array's padding).
    in_prompt_BP = np.arange(tokens.shape[1]) < lengths[:, None]
    outside_BP = in_prompt_BP & ((tokens < 0) | (tokens >= vocab_size))
    if outside_BP.any():
        b, p = np.argwhere(outside_BP)[0]
        raise _outside_vocabulary(b, tokens[b, p], vocab_size)
    width = int(lengths.max()) if pad_to is None else pad_to
    if width < lengths.max():
        raise ValueError(f"pad_to={pad_to} is shorter than the longest prompt ({lengths.max()})")
    packed = np.full((tokens.shape[0], width), PROMPT_PAD_ID, np.int32)
    columns = min(width, tokens.shape[1])
    packed[:, :columns] = np.where(in_prompt_BP[:, :columns], tokens[:, :columns],
                                   PROMPT_PAD_ID)
    return PromptBatch(tokens=packed, lengths=lengths.astype(np.int32))


def _outside_vocabulary(row: int, token, vocab_size: int) -> ValueError:
    return ValueError(f"prompt {row} holds token id {token}, outside the model's vocabulary "
                      f"[0, {vocab_size}); check the tokenizer matches the model")


def _array_prompt_lengths(prompt_lengths, shape: tuple[int, int]) -> np.ndarray:
    """The checked lengths `[B]` of an array of prompts (all P when None)."""
    if prompt_lengths is None:
        return np.full((shape[0],), shape[1], np.int64)
    lengths = np.asarray(prompt_lengths)
    if lengths.shape != (shape[0],):
        raise ValueError(f"prompt_lengths has shape {lengths.shape} but prompts has "
                         f"{shape[0]} rows; pass one length per row")
    if not np.issubdtype(lengths.dtype, np.integer):
        raise TypeError(f"prompt_lengths must be integers, got dtype {lengths.dtype}")
    if lengths.min() < 1:
        bad = int(np.argmin(lengths))
        raise ValueError(f"prompt {bad} is empty (prompt_lengths[{bad}] = "
                         f"{lengths[bad]}); every prompt needs at least one token")
    if lengths.max() > shape[1]:
        bad = int(np.argmax(lengths))
        raise ValueError(f"prompt_lengths[{bad}] = {lengths[bad]} exceeds the prompts "
                         f"array width {shape[1]}")
    return lengths.astype(np.int64)


def _rectangular_prompts(prompts) -> tuple[np.ndarray | None, np.ndarray | None]:
    """A list of equally long, non-empty lists of integer ids as one `[B, P]` array and its
    lengths, converted in one call; `(None, None)` for anything else (ragged rows, a bare
    id, other types), which `_ragged_prompts` checks row by row with its messages."""
    if not all(isinstance(row, (list, tuple, np.ndarray)) for row in prompts):
        return None, None
    try:
        tokens = np.asarray(prompts)
    except (ValueError, TypeError, OverflowError):  # ragged, or not numbers
        return None, None
    if tokens.ndim != 2 or tokens.shape[1] == 0 or not np.issubdtype(tokens.dtype,
                                                                       np.integer):
        return None, None
    return tokens, np.full((tokens.shape[0],), tokens.shape[1], np.int64)


def _ragged_prompts(prompts, vocab_size: int) -> tuple[np.ndarray, np.ndarray]:
    """A list of token-id lists, each checked (with a message naming the row), as an int64
    `[B, P]` array right-padded with `PROMPT_PAD_ID` and its lengths."""
    rows = []
    for b, row in enumerate(prompts):
        if isinstance(row, (int, np.integer)):
            raise TypeError("prompts must be a list of token-id LISTS; wrap a single "
                            "prompt as [prompt]")
        arr = np.asarray(row)
        if arr.size == 0:
            raise ValueError(f"prompt {b} is empty; every prompt needs at least one token")
        if arr.ndim != 1 or not np.issubdtype(arr.dtype, np.integer):
            raise TypeError(f"prompt {b} must be a flat list of int token ids")
        if arr.min() < 0 or arr.max() >= vocab_size:  # before int64 could wrap a uint64 id
            raise _outside_vocabulary(b, arr[(arr < 0) | (arr >= vocab_size)][0], vocab_size)
        rows.append(arr)
    lengths = np.array([len(r) for r in rows], np.int64)
    tokens = np.full((len(rows), int(lengths.max())), PROMPT_PAD_ID, np.int64)
    for b, row in enumerate(rows):
        tokens[b, : len(row)] = row
    return tokens, lengths


def check_max_new_tokens(max_new_tokens) -> int:
    if isinstance(max_new_tokens, (bool, np.bool_)) or not isinstance(max_new_tokens,
                                                                      (int, np.integer)):
        raise TypeError(f"max_new_tokens must be an int, got {max_new_tokens!r}")
    if max_new_tokens < 1:
        raise ValueError(f"max_new_tokens must be >= 1, got {max_new_tokens}")
    return int(max_new_tokens)


def _is_int(value) -> bool:
    return isinstance(value, (int, np.integer)) and not isinstance(value, (bool, np.bool_))


MIN_EOS_SLOTS = 4


def check_eos_id(eos_id, vocab_size: int) -> np.ndarray:
    """The end-of-sequence ids as int32 `[E]`, padded with -1 (never produced).

    `eos_id` is None, one id, or a sequence of ids (Llama 3 and Qwen chat models end on
    several; an empty sequence is None). E is a power of two >= 4, so one to four ids
    share one compiled decoder.
    """
    if eos_id is None:
        ids = []
    elif _is_int(eos_id):
        ids = [eos_id]
    elif isinstance(eos_id, (list, tuple, np.ndarray)) and not isinstance(eos_id, str):
        ids = list(np.asarray(eos_id).reshape(-1)) if isinstance(eos_id, np.ndarray) \
            else list(eos_id)
        if not all(_is_int(i) for i in ids):
            raise TypeError(f"eos_id must be an int, a list of ints (empty: none), or None; "
                            f"got {eos_id!r}")
    else:
        raise TypeError(f"eos_id must be an int, a list of ints, or None; got {eos_id!r}")
    for i in ids:
        if not 0 <= i < vocab_size:
            raise ValueError(f"eos_id={int(i)} is outside the vocabulary [0, {vocab_size})")
    slots = bucket(len(ids), MIN_EOS_SLOTS)
    return np.array([int(i) for i in ids] + [-1] * (slots - len(ids)), np.int32)


INT32 = np.iinfo(np.int32)


def check_pad_id(pad_id) -> int:
    """`pad_id` fills outputs after each row's end: any int32 (it is never fed to a model;
    prompts are padded internally with id 0)."""
    if not _is_int(pad_id):
        raise TypeError(f"pad_id must be an int, got {pad_id!r}")
    if not INT32.min <= pad_id <= INT32.max:
        raise ValueError(f"pad_id={pad_id} does not fit in int32 (token outputs are int32)")
    return int(pad_id)


def plan_capacity(lengths: np.ndarray, max_new_tokens: int, max_seq_len: int | None, *,
                  extra_slots: int = 0, cache_size: int | None = None) -> int:
    """Cache slots for these prompts: a power-of-two bucket of the longest need.

    `extra_slots` is scratch room beyond the last committed token (a speculative step
    writes K+1 tokens past the committed length). Raises when the longest prompt plus
    `max_new_tokens` exceeds the model's `max_seq_len`, or when a given `cache_size` is
    too small. Positions never exceed what plain decoding uses for any kept token.
    """
    longest = int(lengths.max())
    needed = longest + max_new_tokens
    if max_seq_len is not None and longest >= max_seq_len:
        row = int(np.argmax(lengths))
        raise ValueError(
            f"prompt {row} has {longest} tokens, which leaves no room for new tokens in the "
            f"model's max_seq_len={max_seq_len}; shorten the prompt to at most "
            f"{max_seq_len - max_new_tokens} tokens (for max_new_tokens={max_new_tokens})")
    if max_seq_len is not None and needed > max_seq_len:
        row = int(np.argmax(lengths))
        raise ValueError(
            f"prompt {row} has {longest} tokens and max_new_tokens={max_new_tokens}: "
            f"{needed} positions exceed the model's max_seq_len={max_seq_len}; shorten the "
            f"prompt or lower max_new_tokens to at most {max_seq_len - longest}")
    if cache_size is not None:
        if not _is_int(cache_size):
            raise TypeError(f"cache_size must be an int, got {cache_size!r}")
        if cache_size < needed + extra_slots:
            scratch = f" + {extra_slots} scratch slots (K + 1)" if extra_slots else ""
            raise ValueError(
                f"cache_size={cache_size} is too small: the longest prompt ({longest}) + "
                f"max_new_tokens ({max_new_tokens}){scratch} needs {needed + extra_slots} "
                "slots; raise cache_size or leave it None to size the cache automatically")
        return int(cache_size)
    # Short requests share one compiled decoder: caches are at least MIN_CACHE_BUCKET
    # slots (capped by the model's max_seq_len) and otherwise a power of two.
    capacity = bucket(needed + extra_slots, MIN_CACHE_BUCKET)
    if max_seq_len is not None:
        capacity = min(capacity, max(max_seq_len, 0) + extra_slots)
    return max(capacity, needed + extra_slots)


def resolve_key(key, sampling) -> Array:
    """The caller's PRNG key; greedy decoding (every row greedy) may omit it."""
    if key is None:
        if not all(config.greedy for config in distinct_configs(sampling)):
            raise ValueError("sampling with temperature > 0 needs a PRNG key: pass "
                             "key=jax.random.key(seed) (greedy decoding needs none)")
        return jax.random.key(0)
    if not isinstance(key, jax.Array):
        raise TypeError(f"key must be a JAX PRNG key (jax.random.key(seed)), got {type(key)}")
    return key


def prepare_batch(lm: CausalLM, prompts, prompt_lengths, max_new_tokens: int,
                  sampling, eos_id, *, extra_slots: int = 0,
                  cache_size: int | None = None) -> tuple[PromptBatch, int, np.ndarray]:
    """Validate everything on the host; returns `(PromptBatch, capacity, eos_ids [E])`.

    `sampling` is one `SamplingConfig` or a sequence of one per prompt.

    The prompts are right-padded with `PROMPT_PAD_ID` to a power-of-two width (at most
    the capacity), so new prompt lengths inside a bucket reuse the compiled decoder.
    """
    if not isinstance(lm, CausalLM):
        raise TypeError(f"expected a specjax.CausalLM, got {type(lm).__name__}; wrap an NNX "
                        "model with specjax.CausalLM.from_nnx(model)")
    max_new_tokens = check_max_new_tokens(max_new_tokens)
    for config in distinct_configs(sampling):
        config.check_vocab(lm.vocab_size)
    eos = check_eos_id(eos_id, lm.vocab_size)
    unpadded = pack_prompts(prompts, prompt_lengths, lm.vocab_size)
    rows = unpadded.tokens.shape[0]
    batch = padded_rows(lm, rows)
    # One per row, when it is a list (`settings_for_padded_rows` added the padding rows').
    row_configs(sampling, batch)
    capacity = plan_capacity(unpadded.lengths, max_new_tokens, lm.max_seq_len,
                             extra_slots=extra_slots, cache_size=cache_size)
    width = min(bucket(unpadded.tokens.shape[1]), capacity)
    padded = np.pad(unpadded.tokens, ((0, 0), (0, width - unpadded.tokens.shape[1])),
                    constant_values=PROMPT_PAD_ID)
    lengths = unpadded.lengths
    if batch > rows:  # a data-parallel mesh: padding rows, copies of the last real one
        padded = np.concatenate([padded, np.repeat(padded[-1:], batch - rows, axis=0)])
        lengths = np.concatenate([lengths, np.repeat(lengths[-1:], batch - rows)])
    return PromptBatch(padded, lengths, rows), capacity, eos


def running_rows(batch: PromptBatch) -> Array:
    """bool [B]: the rows that decode; padding rows start done (they never run a step's
    drafting, acceptance or counters, and never keep the loop going)."""
    return jax.numpy.asarray(np.arange(batch.batch) < batch.rows)


def first_columns(array_BS: Array, n: int, rows: int | None = None) -> Array:
    """`array_BS[:rows, :n]` cut on the host: slicing a device array compiles a program per
    new `n`, and `max_new_tokens` must change without compiling anything."""
    return jax.device_put(fetch(array_BS)[:rows, :n])


def first_rows(array_B: Array, rows: int) -> Array:
    """`array_B[:rows]` (the caller's rows, without a mesh's padding rows), cut on the host
    when there are padding rows; else `array_B` as it is."""
    if array_B.shape[0] == rows:
        return array_B
    return jax.device_put(fetch(array_B)[:rows])
