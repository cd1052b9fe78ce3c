"""specjax.runtime.lazy: names load from their module on first use and are kept; submodules load
by name; an unknown name is an AttributeError, a broken submodule's own import error is
not hidden."""

import json
import sys

import pytest

from specjax.runtime.lazy import lazy_attributes


def test_names_and_submodules_load_on_first_use_and_are_kept():
    namespace = {"__all__": ["dumps"]}
    get, names = lazy_attributes("specjax", {"dumps": "json"}, namespace)
    assert get("dumps") is json.dumps and namespace["dumps"] is json.dumps
    assert get("trees") is sys.modules["specjax.trees"]
    assert "dumps" in names() and "trees" in names()
    with pytest.raises(AttributeError, match="has no attribute 'nope'"):
        get("nope")


def test_an_import_error_inside_a_module_is_not_turned_into_a_missing_name(tmp_path,
                                                                          monkeypatch):
    package = tmp_path / "lazypkg"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "broken.py").write_text("import a_module_that_does_not_exist\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    get, _ = lazy_attributes("lazypkg", {}, {})
    with pytest.raises(ModuleNotFoundError, match="a_module_that_does_not_exist"):
        get("broken")
