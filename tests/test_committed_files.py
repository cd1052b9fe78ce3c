"""What the repository commits names no machine: model cards, checkpoint metadata and
benchmark results carry commands and paths relative to the repository (issue 72), and the
commands that write them record portable paths (specjax.cli.common.recorded_command)."""

import re
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
# An absolute POSIX path: a slash that starts a word (not a URL's, not a ratio's "GB/s"),
# followed by at least one folder; or a Windows drive's folder (C:\\Users\\...).
ABSOLUTE = re.compile(r"(?:^|[\s\"'`=(\[,])(/(?:[A-Za-z0-9_.~-]+/)+[A-Za-z0-9_.~-]*"
                      r"|[A-Z]:(?:\\){1,2}[A-Za-z0-9_.-]+(?:\\){1,2})")


def committed_text_files(*folders: str) -> list[Path]:
    listed = subprocess.run(["git", "ls-files", *folders], cwd=ROOT, capture_output=True,
                            text=True, check=False)
    if listed.returncode == 0:
        names = listed.stdout.split()
    else:  # not a git checkout (an unpacked archive): every file in the folders
        names = [str(path.relative_to(ROOT)) for folder in folders
                 for path in sorted((ROOT / folder).rglob("*")) if path.is_file()]
    texts = []
    for name in names:
        path = ROOT / name
        data = path.read_bytes() if path.is_file() else b""
        if b"\0" in data[:4096]:
            continue
        try:
            data.decode("utf-8")
        except UnicodeDecodeError:
            continue
        texts.append(path)
    return texts


def test_cards_metadata_and_results_hold_no_absolute_path():
    files = committed_text_files("models/checkpoints", "benchmarks/results")
    assert len(files) > 50  # the cards, metadata and results were found
    offenders = [f"{path.relative_to(ROOT)}:{number}: {match.group(1)}"
                 for path in files
                 for number, line in enumerate(path.read_text().splitlines(), 1)
                 for match in ABSOLUTE.finditer(line)]
    assert offenders == []


def test_the_check_sees_the_paths_it_must_refuse():
    found = lambda text: [m.group(1) for m in ABSOLUTE.finditer(text)]
    assert found('"out": "/tmp/pard_bundled"') == ["/tmp/pard_bundled"]
    assert found("--work /work/smollm2_head --out=/home/me/x") == ["/work/smollm2_head",
                                                                  "/home/me/x"]
    assert found(r"C:\Users\me") == ["C:\\Users\\"]
    assert found(r'"def f(d):\n    return d\n"') == []
    assert found("59.7 GB/s, tau / (K c + v), https://github.com/a/b, models/checkpoints") == []


def test_recorded_commands_and_options_name_no_machine(tmp_path):
    from argparse import Namespace

    from specjax.cli.common import portable_path, recorded_command, recorded_options

    base = str(tmp_path / "repo")
    inside, outside = f"{base}/models/checkpoints/eagle", "/scratch/me/heads/eagle"
    assert portable_path(inside, base) == "models/checkpoints/eagle"
    assert portable_path(outside, base) == "eagle"
    assert portable_path("runs/a", base) == "runs/a" and portable_path(3, base) == 3
    command = recorded_command(["train-drafter", "--out", inside, f"--work={outside}",
                                "--prompt", "a b"], base)
    assert command == ("specjax train-drafter --out models/checkpoints/eagle --work=eagle "
                       "--prompt 'a b'")
    options = recorded_options(Namespace(out=outside, steps=3, handler=print), base)
    assert options == {"out": "eagle", "steps": 3}


def test_the_benchmarks_readme_maps_every_result_to_a_script_that_exists():
    readme = (ROOT / "benchmarks" / "README.md").read_text()
    results = [path for path in committed_text_files("benchmarks/results")
               if path.suffix == ".md"]
    unnamed = [str(path.relative_to(ROOT / "benchmarks" / "results")) for path in results
               if path.stem not in readme]
    assert unnamed == []
    modules = set(re.findall(r"python -m benchmarks\.([a-z0-9_.]+[a-z0-9_])", readme))
    assert modules and {m for m in modules if not (ROOT / "benchmarks" / (
        m.replace(".", "/") + ".py")).exists()} == set()
    scripts = set(re.findall(r"bash (benchmarks/[a-z0-9_/]+\.sh)", readme))
    assert scripts and {s for s in scripts if not (ROOT / s).exists()} == set()
