"""`specjax bench --methods`: the method list's language. Methods are named in one list,
each with its own settings in brackets (`plain,draft[k=4],eagle3[tree=16/6/4]`);
`parse_methods` reads it into `MethodSpec`s and refuses, in one line, an unknown method
or setting, a setting given twice, a yes/no setting with another word, brackets that do
not close, and two methods with one label."""

from __future__ import annotations

import dataclasses

from specjax.cli.common import CliError

# Method name -> (what it is, for --help; the --drafter value it builds on).
METHODS = {
    "plain": ("plain autoregressive decoding (the baseline; always run)", None),
    "draft": ("the draft model: the bundled pair's, SmolLM2's distilled draft, or dir=DIR",
              "model"),
    "parallel": ("a parallel draft (PARD): the bundled pair's, or dir=DIR", "parallel"),
    "prompt-lookup": ("n-gram lookup in the prompt and output (ngram=N: longest n-gram)",
                      "prompt-lookup"),
    "lookahead": ("lookahead (Jacobi) decoding (lookahead=W/N/G)", "lookahead"),
    "retrieval": ("retrieval from a datastore (dir=FILE; SmolLM2: its shipped one) and "
                  "the row's own text", "retrieval"),
    "layer-skip": ("the target skipping blocks (skip=4/6/8, or skip=auto: searched on the "
                   "first prompt)", "layer-skip"),
    "kangaroo": ("Kangaroo: an adapter over the target's first blocks, early exit "
                 "(dir=HEAD; the bundled target's and SmolLM2's ship)", "kangaroo"),
    "medusa": ("Medusa heads (dir=HEAD; the bundled target's ship)", "medusa"),
    "eagle": ("an EAGLE-1 head (dir=HEAD; the bundled target's ships)", "eagle"),
    "eagle3": ("an EAGLE-3 head (dir=HEAD; the bundled target's and SmolLM2's ship)",
               "eagle3"),
    "mtp": ("an MTP head (dir=HEAD; the bundled target's ships)", "mtp"),
    "p-eagle": ("a P-EAGLE head: every draft of a step from one head forward (dir=HEAD; "
                "the bundled target's ships)", "p-eagle"),
    "published": ("a published drafter directory (dir=DIR: EAGLE-1/2/3, Medusa-1, MiMo "
                  "or DeepSeek-V3 MTP, read by specjax_models.load_drafter)", "published"),
}
# Setting -> help. Values hold no commas (lists use "/").
SETTINGS = {
    "k": "drafts per step (default: --num-draft-tokens)",
    "tree": "an EAGLE-2 dynamic tree NODES/DEPTH/TOP_K instead of a chain",
    "verification": "block, traversal or token (default: --verification, else the shape's)",
    "greedy": "draft argmax tokens (one-hot q): greedy or greedy=true; greedy=false samples",
    "confidence": "verify only the leading confident drafts (--min-confidence)",
    "dir": "the method's checkpoint, head, drafter directory or datastore file",
    "skip": "layer-skip's blocks (4/6/8) or auto",
    "lookahead": "lookahead's W/N/G",
    "ngram": "prompt lookup's longest n-gram",
    "as": "the method's name in the tables (to run one method twice)",
}


@dataclasses.dataclass(frozen=True)
class MethodSpec:
    kind: str
    settings: tuple[tuple[str, str], ...]

    @property
    def label(self) -> str:
        given = dict(self.settings)
        if "as" in given:
            return given["as"]
        shown = [f"{k}={v}" if v else k for k, v in self.settings
                 if (k, v) != ("greedy", "off")]
        return self.kind + (f"[{','.join(shown)}]" if shown else "")

    def get(self, name: str, default=None):
        return dict(self.settings).get(name, default)


def _split_top_level(text: str) -> list[str]:
    parts, depth, current = [], 0, ""
    for char in text:
        if char == "[":
            depth += 1
        elif char == "]":
            depth -= 1
            if depth < 0:
                raise CliError(f"--methods {text!r}: a ']' without its '['")
        if char == "," and depth == 0:
            parts.append(current)
            current = ""
        else:
            current += char
    if depth != 0:
        raise CliError(f"--methods {text!r}: a '[' without its ']'")
    return [*parts, current]


ON_WORDS, OFF_WORDS = ("", "true", "yes", "on", "1"), ("false", "no", "off", "0")


def _switch(kind: str, name: str, value: str) -> str:
    """A yes/no setting as "" (on: written bare in labels) or "off"; other words refused."""
    word = value.lower()
    if word in ON_WORDS:
        return ""
    if word in OFF_WORDS:
        return "off"
    raise CliError(f"--methods: {kind}[{name}={value}]: {name} is on or off ({name}, "
                   f"{name}=true or {name}=false), got {value!r}")


def parse_methods(text: str) -> list[MethodSpec]:
    """`--methods` as method specs: NAME or NAME[setting=value,...], comma-separated."""
    specs = []
    for part in _split_top_level(text):
        part = part.strip()
        if not part:
            raise CliError(f"--methods {text!r}: an empty method name (two commas in a row?)")
        kind, _, rest = part.partition("[")
        kind = kind.strip()
        if kind not in METHODS:
            raise CliError(f"--methods: unknown method {kind!r}; the methods are "
                           f"{', '.join(METHODS)} (see specjax bench --help)")
        settings = []
        if rest:
            if not rest.endswith("]"):
                raise CliError(f"--methods: {part!r} has text after its ']'")
            for item in _split_top_level(rest[:-1]):
                name, equals, value = item.strip().partition("=")
                name, value = name.strip(), value.strip()
                if name not in SETTINGS:
                    raise CliError(f"--methods: {kind} has no setting {name!r}; the settings "
                                   f"are {', '.join(SETTINGS)}")
                if name in dict(settings):
                    raise CliError(f"--methods: {part!r} sets {name} twice; give it once (to "
                                   "run both values, name the method twice, the second with "
                                   "other settings or as=NAME)")
                if name == "greedy":
                    value = _switch(kind, name, value if equals else "")
                elif not value:
                    raise CliError(f"--methods: {kind}[{name}] needs a value ({name}=...)")
                settings.append((name, value))
        specs.append(MethodSpec(kind, tuple(settings)))
    labels = [s.label for s in specs]
    if len(set(labels)) != len(labels):
        raise CliError(f"--methods names a method twice ({', '.join(labels)}); give the "
                       "second other settings or as=NAME")
    if any(s.kind == "plain" and s.settings for s in specs):
        raise CliError("--methods: plain takes no settings")
    return specs
