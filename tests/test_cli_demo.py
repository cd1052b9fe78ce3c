"""specjax.cli.demo: `specjax demo` streams the bundled pair and explains its speed."""

import pytest
from conftest import run_cli


@pytest.mark.slow
def test_demo_streams_and_explains_its_speed():
    out = run_cli("demo", "--max-new-tokens", "24", "--prompts", "1", "--color", "never",
              "--reps", "1")
    assert out.returncode == 0, out.stderr
    assert "(held out)" in out.stdout and " >>> " in out.stdout  # where the prompt ends
    assert "\033[" not in out.stdout and "Colours:" not in out.stdout  # not a terminal
    for line in ("[draft model] acceptance rate", "[prompt lookup] acceptance rate",
                 "[speed] decode phase:", "[speed] end to end:", "[speed] why:"):
        assert line in out.stdout, line
    assert "v = " in out.stdout and "ideal is tau / (K c + v)" in out.stdout
