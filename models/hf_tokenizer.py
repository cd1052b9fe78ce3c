"""A Hugging Face checkpoint's tokenizer (the `tokenizers` package), its special ids and
its chat template: `load_tokenizer(path)` for a local model directory."""

from __future__ import annotations

from pathlib import Path

from specjax.runtime.files import read_json


class HFTokenizer:
    """A checkpoint's tokenizer (the `tokenizers` package), its special ids and chat template.

    encode(text) -> list[int] (adds the BOS token when the checkpoint's tokenizer does);
    decode(ids) -> str; bos_id / eos_id / pad_id (None when absent; eos_ids lists every
    end id of generation_config.json); apply_chat_template(messages,
    add_generation_prompt=True) -> list[int]. Built from a Hugging Face directory
    (`load_tokenizer(path)`) or from a GGUF file's metadata (`specjax_models.gguf`).
    """

    def __init__(self, tokenizer, *, eos_ids: list[int], bos_id: int | None,
                 pad_id: int | None, chat_template: str | None, special_tokens: dict):
        self._tokenizer = tokenizer
        self.eos_ids = list(eos_ids)
        self.eos_id = self.eos_ids[0] if self.eos_ids else None
        self.bos_id, self.pad_id = bos_id, pad_id
        self.chat_template = chat_template
        self._special = dict(special_tokens)  # e.g. {"eos_token": "<|im_end|>"}, for templates
        self.vocab_size = tokenizer.get_vocab_size()

    @classmethod
    def from_directory(cls, path: str | Path) -> HFTokenizer:
        """tokenizer.json, tokenizer_config.json and the special ids of config.json and
        generation_config.json in a Hugging Face model directory."""
        from tokenizers import Tokenizer

        path = Path(path)
        if not (path / "tokenizer.json").exists():
            raise FileNotFoundError(f"{path} has no tokenizer.json")
        try:
            tokenizer = Tokenizer.from_file(str(path / "tokenizer.json"))
        except Exception as error:  # the tokenizers library raises a bare Exception
            raise ValueError(f"{path / 'tokenizer.json'} cannot be read as a tokenizer "
                             f"({error}); download it again") from None
        read = lambda name: read_json(path / name, "download it again") \
            if (path / name).exists() else {}
        config = read("tokenizer_config.json")
        model_config, generation = read("config.json"), read("generation_config.json")

        def token_id(key):
            token = config.get(key)
            if isinstance(token, dict):
                token = token.get("content")
            return None if token is None else tokenizer.token_to_id(token)

        def first(*values):
            for value in values:
                if value is not None:
                    return value
            return None

        eos = first(generation.get("eos_token_id"), model_config.get("eos_token_id"),
                    token_id("eos_token"))
        special = {k: (v.get("content") if isinstance(v, dict) else v)
                   for k, v in config.items() if k.endswith("_token")}
        return cls(tokenizer,
                   eos_ids=eos if isinstance(eos, list) else ([] if eos is None else [eos]),
                   bos_id=first(generation.get("bos_token_id"),
                                model_config.get("bos_token_id"), token_id("bos_token")),
                   pad_id=first(generation.get("pad_token_id"),
                                model_config.get("pad_token_id"), token_id("pad_token")),
                   chat_template=config.get("chat_template"), special_tokens=special)

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        return self._tokenizer.encode(text, add_special_tokens=add_special_tokens).ids

    def decode(self, ids, skip_special_tokens: bool = True) -> str:
        return self._tokenizer.decode(list(ids), skip_special_tokens=skip_special_tokens)

    def stream_decoder(self):
        """A function that takes ids as they arrive and returns the text they complete
        (special tokens dropped; a character whose bytes are split across tokens is held
        back until complete)."""
        ids: list[int] = []
        shown = 0

        def push(new_ids) -> str:
            nonlocal shown
            ids.extend(int(i) for i in new_ids)
            text = self.decode(ids)
            complete = len(text.rstrip("\ufffd"))
            out = text[shown:complete] if complete > shown else ""
            shown = max(shown, complete)
            return out

        return push

    def apply_chat_template(self, messages: list[dict], add_generation_prompt: bool = True,
                            tokenize: bool = True):
        if not self.chat_template:
            raise ValueError("this tokenizer has no chat template")
        import jinja2

        environment = jinja2.Environment(trim_blocks=True, lstrip_blocks=True)
        environment.globals["raise_exception"] = lambda message: (_ for _ in ()).throw(
            jinja2.TemplateError(message))
        text = environment.from_string(self.chat_template).render(
            messages=messages, add_generation_prompt=add_generation_prompt, **self._special)
        return self.encode(text, add_special_tokens=False) if tokenize else text


def load_tokenizer(path: str | Path) -> HFTokenizer:
    """The tokenizer of a Hugging Face model directory (see `HFTokenizer`)."""
    return HFTokenizer.from_directory(path)

