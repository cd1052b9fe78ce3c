"""specjax_models.tokenizer: the byte-level tokenizer round-trips every byte."""

import pytest

from specjax_models.tokenizer import BOS_ID, EOS_ID, PAD_ID, VOCAB_SIZE, ByteTokenizer


def test_every_byte_round_trips():
    tok = ByteTokenizer()
    every = bytes(range(256))
    assert tok.decode_bytes(list(every)) == every
    text = "def f(x):\n    return 'héllo wörld ✓ 你好'\n"
    assert tok.decode(tok.encode(text)) == text
    assert len(tok.encode("é")) == 2  # UTF-8 bytes, not characters


def test_special_ids_are_documented_and_dropped_on_decode():
    tok = ByteTokenizer()
    assert (PAD_ID, BOS_ID, EOS_ID, VOCAB_SIZE) == (256, 257, 258, 259)
    assert tok.encode("a", add_bos=True) == [BOS_ID, 97]
    assert tok.decode([BOS_ID, 104, 105, EOS_ID, PAD_ID]) == "hi"
    with pytest.raises(ValueError, match="outside the byte vocabulary"):
        tok.decode([300])
    with pytest.raises(TypeError):
        tok.encode(b"bytes")


def test_stream_decoder_holds_back_split_characters():
    tok = ByteTokenizer()
    decode = tok.stream_decoder()
    ids = tok.encode("a✓b")
    pieces = [decode([i]) for i in ids]
    assert "".join(pieces) == "a✓b"
    assert pieces[1] == "" and pieces[2] == ""  # the 3-byte check mark arrives whole
