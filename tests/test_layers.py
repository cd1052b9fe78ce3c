"""The layering of DESIGN.md section 2, checked on the source: the algorithm package never
imports the model package, except its command line (the users' layer), which nothing in
specjax imports."""

import ast
from pathlib import Path

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
    assert not {n for n in imported_modules(ROOT / "specjax" / "step.py")
                if "draft_model" in n}


def test_the_core_of_the_model_package_never_imports_a_recipe():
    offenders = [str(p.relative_to(ROOT)) for p in sorted((ROOT / "models").glob("*.py"))
                 if any("recipes" in name for name in imported_modules(p))]
    assert offenders == []


def test_every_public_name_loads_lazily_from_the_module_that_defines_it():
    import sys

    import specjax

    assert set(specjax.__all__) == set(specjax._SOURCES) | set(specjax._MODULES)
    for name in specjax.__all__:
        value = getattr(specjax, name)
        defined_in = specjax._SOURCES.get(name)
        if defined_in is not None:
            assert getattr(sys.modules[defined_in], name) is value
    assert specjax.trees is sys.modules["specjax.trees"]  # submodules load on first use
