"""The layering of DESIGN.md section 2, checked on the source: the algorithm package never
imports the model package, except its command line (the users' layer), which nothing in
specjax imports."""

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def imported_modules(path: Path) -> set[str]:
    names = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module:
            names.add(node.module)
    return names


def test_only_the_command_line_imports_the_model_package():
    offenders = []
    for path in sorted((ROOT / "specjax").rglob("*.py")):
        models = {n for n in imported_modules(path) if n.split(".")[0] in ("specjax_models",
                                                                            "models")}
        if models and "cli" not in path.relative_to(ROOT / "specjax").parts:
            offenders.append(f"{path.relative_to(ROOT)} imports {sorted(models)}")
    assert offenders == []
    assert any("specjax_models" in imported_modules(p)
               for p in (ROOT / "specjax" / "cli").glob("*.py"))


def test_nothing_in_specjax_imports_the_command_line():
    importers = [str(p.relative_to(ROOT)) for p in (ROOT / "specjax").rglob("*.py")
                 if "cli" not in p.relative_to(ROOT / "specjax").parts
                 and any(n.startswith("specjax.cli") for n in imported_modules(p))]
    assert importers == []


def test_the_speculative_step_does_not_import_draft_model():
    assert not {n for n in imported_modules(ROOT / "specjax" / "decoding" / "step.py")
                if "draft_model" in n}


def test_the_core_of_the_model_package_never_imports_a_recipe():
    offenders = [str(p.relative_to(ROOT)) for p in sorted((ROOT / "models").glob("*.py"))
                 if any("recipes" in name for name in imported_modules(p))]
    assert offenders == []


def test_every_public_name_loads_lazily_from_the_module_that_defines_it():
    import sys

    import specjax
    import specjax_models

    assert set(specjax.__all__) == set(specjax._SOURCES) | set(specjax._MODULES)
    for name in specjax.__all__:
        value = getattr(specjax, name)
        defined_in = specjax._SOURCES.get(name)
        if defined_in is not None:
            assert getattr(sys.modules[defined_in], name) is value
    assert specjax.trees is sys.modules["specjax.trees"]  # submodules load on first use
    assert set(specjax_models.__all__) == set(specjax_models._SOURCES)
    for name in specjax_models.__all__:
        value = getattr(specjax_models, name)
        module = sys.modules[f"specjax_models.{specjax_models._SOURCES[name]}"]
        assert getattr(module, name) is value


@pytest.mark.slow  # a fresh process importing jax
def test_loading_a_gguf_file_does_not_import_orbax():
    import subprocess
    import sys

    probe = ("import sys, specjax_models\n"
             "specjax_models.from_gguf, specjax_models.gguf_tokenizer\n"
             "print(any(m.startswith('orbax') for m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True,
                         timeout=120)
    assert out.stdout.strip() == "False", out.stderr


# Modules whose tests live in a module named after their family, not after the file.
TESTED_IN = {
    # Modules named for their place in their package (specjax/<concern>/), tested under
    # the names they had before the packages.
    "specjax/verification/rules.py": "test_verification.py",
    "specjax/trees/shapes.py": "test_trees.py",
    "specjax/bench/runner.py": "test_bench.py",
    "specjax/bench/journal.py": "test_bench_journal.py",
    "specjax/bench/prompts.py": "test_bench_prompts.py",
    "specjax/bench/report.py": "test_bench_report.py",
    "specjax/drafters/base.py": "test_step.py",  # the drafter contract, as the step checks it
    "specjax/decoding/branches.py": "test_step.py",  # the step's in-place choice of verify width
    "specjax/cli/bench_methods.py": "test_cli_bench.py",  # --methods, as the command parses it
    "specjax/drafters/feature_head.py": "test_eagle.py",  # the block the EAGLE heads run
    "specjax/drafters/head_files.py": "test_eagle.py",  # saving, loading, damaged heads
    "specjax/training/checkpoints.py": "test_training.py",
    "specjax/training/config.py": "test_training.py",
    "specjax/training/loop.py": "test_training.py",
    "specjax/training/losses.py": "test_training.py",
    "specjax/training/progress.py": "test_training.py",
    "specjax/cli/common.py": "test_cli.py",
    "specjax/cli/loading.py": "test_cli.py",
    "specjax/cli/choices.py": "test_cli.py",
    # Chains and trees from per-offset distributions, as both parallel drafters use them.
    "specjax/drafters/offset_proposals.py": "test_parallel_draft.py",
    "specjax/cli/drafter_loading.py": "test_cli_generate.py",  # its refusals, by command
    "specjax/cli/train_parallel.py": "test_cli_train_drafter.py",
    "models/bundled.py": "test_checkpoint.py",
    "models/hf_tokenizer.py": "test_hf.py",
    "models/layer_draft.py": "test_smollm2_draft.py",
    "models/gguf_layout.py": "test_faults.py",  # checks of bad files: fault injection
    "models/safetensors_layout.py": "test_faults.py",
    "specjax/training/heads.py": "test_training_heads.py",
    # The model definition by concern, tested as the model it makes up.
    "models/cache.py": "test_transformer.py",  # writes in place, compaction
    "models/config.py": "test_transformer.py",  # its checks (experts': test_feed_forward)
    "models/norms.py": "test_transformer.py",
    "models/params.py": "test_checkpoint.py",  # ParamFiller, as the loaders fill models
    # Hugging Face translation, by family, against transformers' own models.
    "models/hf_config.py": "test_hf.py",
    "models/hf_moe.py": "test_hf.py",
    "models/hf_deepseek.py": "test_hf.py",
}


def test_the_tests_mirror_the_packages():
    """Every module has its test module: tests/test_<module>.py (test_cli_<command>.py for
    the command line), or the family module named in TESTED_IN; none over 600 lines."""
    tests = ROOT / "tests"
    missing = []
    for package in ("specjax", "models"):
        for path in sorted((ROOT / package).rglob("*.py")):
            if path.name in ("__init__.py", "__main__.py"):
                continue
            relative = str(path.relative_to(ROOT))
            prefix = "cli_" if path.parent.name == "cli" else ""
            expected = TESTED_IN.get(relative, f"test_{prefix}{path.stem}.py")
            if not (tests / expected).exists():
                missing.append(f"{relative} -> tests/{expected}")
    assert missing == []
    too_long = [p.name for p in tests.glob("*.py") if len(p.read_text().splitlines()) > 600]
    assert too_long == []
