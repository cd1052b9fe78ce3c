"""Byte-level tokenizer of the bundled models.

Ids 0..255 are the bytes of the UTF-8 text; three special ids follow:
PAD = 256 (never a training target), BOS = 257 (starts every document), EOS = 258 (ends
every document). The vocabulary size is 259. Every byte sequence round-trips exactly;
`decode` turns bytes that are not valid UTF-8 into U+FFFD and drops special ids.
"""

from __future__ import annotations

import codecs

import numpy as np

PAD_ID, BOS_ID, EOS_ID = 256, 257, 258
VOCAB_SIZE = 259


class ByteTokenizer:
    """`encode(str) -> list[int]` and `decode(list[int]) -> str` over UTF-8 bytes."""

    pad_id, bos_id, eos_id, vocab_size = PAD_ID, BOS_ID, EOS_ID, VOCAB_SIZE

    def encode(self, text: str, *, add_bos: bool = False) -> list[int]:
        if not isinstance(text, str):
            raise TypeError(f"encode expects a str, got {type(text).__name__}")
        ids = list(text.encode("utf-8"))
        return [BOS_ID] + ids if add_bos else ids

    def decode(self, ids) -> str:
        return self.decode_bytes(ids).decode("utf-8", errors="replace")

    def decode_bytes(self, ids) -> bytes:
        ids = np.asarray(list(ids) if not isinstance(ids, np.ndarray) else ids, np.int64)
        if ids.size and (ids.min() < 0 or ids.max() >= VOCAB_SIZE):
            bad = ids[(ids < 0) | (ids >= VOCAB_SIZE)][0]
            raise ValueError(f"token id {bad} is outside the byte vocabulary [0, {VOCAB_SIZE})")
        return bytes(ids[ids < 256].astype(np.uint8).tolist())

    def stream_decoder(self):
        """A function that takes ids as they arrive and returns the text completed so far
        (a multi-byte character split across calls is held back until complete)."""
        decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
        return lambda ids: decoder.decode(self.decode_bytes(ids))
