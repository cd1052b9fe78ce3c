"""specjax_models.recipes.head_cards: the bundled heads' committed MODEL_CARDs are what the
recipe writes from their metadata and the committed benchmark rows (a card edited by hand,
or metadata that no longer matches it, fails here)."""

import json

import pytest

from specjax_models.bundled import HEAD_NAMES, bundled_path
from specjax_models.recipes.head_cards import RESULTS, card


@pytest.mark.parametrize("name", HEAD_NAMES)
def test_the_committed_card_is_the_recipes_output(name):
    if not (bundled_path(name) / "metadata.json").exists():
        pytest.skip(f"this checkout has no trained {name} head")
    rows = json.loads((RESULTS / "feature_drafters_cpu.json").read_text())["rows"]
    written = card(name, rows)
    assert written == (bundled_path(name) / "MODEL_CARD.md").read_text()
    assert f'load_bundled("{name}")' in written and "acceptance" in written
