"""Several processes decoding together (`specjax.distributed`): two processes of two
virtual CPU devices each, joined by `jax.distributed.initialize` (gloo collectives on
localhost), decode one batch whose prompts arrive split by process, on a mesh whose data
axis spans the processes (data=2, model=2) and on one whose model axis does (model=4).
Each process gets back its own rows, equal to one device's greedy outputs for plain,
speculative (chain and tree) and streamed decoding, and both processes read the same
whole batch of a sampled run. In one process everything there is the identity."""

import json
import socket
import subprocess
import sys
import textwrap
from pathlib import Path

import jax
import numpy as np
import pytest
from conftest import build_lm, subprocess_env

import specjax
from specjax.runtime.distributed import fetch, gather_prompts, process_local

TESTS = Path(__file__).resolve().parent

# Process 0 holds three prompts, process 1 one (different lengths): four rows in all.
PROMPTS = [[[3, 1, 4, 1], [5, 9], [2, 6, 5, 3, 5]], [[8, 9, 7, 9, 3, 2]]]
GREEDY = dict(max_new_tokens=10, sampling=specjax.GREEDY, eos_id=5)
TREE = [[0], [1], [0, 0], [1, 0], [0, 0, 0]]
MESHES = ("data=2,model=2", "model=4")

WORKER = textwrap.dedent("""
    import json, sys
    import jax
    jax.config.update("jax_num_cpu_devices", 2)
    jax.config.update("jax_cpu_collectives_implementation", "gloo")
    port, process_id, out_path, tests = sys.argv[1:5]
    jax.distributed.initialize(f"localhost:{port}", num_processes=2,
                               process_id=int(process_id))
    sys.path.insert(0, tests)
    import numpy as np
    from conftest import build_lm
    from test_distributed import GREEDY, MESHES, PROMPTS, TREE
    import specjax, specjax_models
    from specjax.runtime.sharding import default_rules, mesh_from_spec

    assert jax.process_count() == 2 and len(jax.devices()) == 4
    prompts, mine = specjax.distributed.gather_prompts(PROMPTS[jax.process_index()])
    results = {"prompts": prompts, "rows": [mine.start, mine.stop]}
    tree = specjax.TreeShape.from_paths(TREE)
    for spec in MESHES:
        mesh = mesh_from_spec(spec)
        lm = specjax_models.shard(build_lm(0, num_heads=4, num_kv_heads=4, d_ff=64), mesh,
                                  default_rules(mesh))
        draft = specjax_models.shard(build_lm(1, num_layers=1, num_heads=4, num_kv_heads=4,
                                              d_ff=64), mesh,
                                  default_rules(mesh))
        plain = specjax.generate(lm, prompts, **GREEDY)
        chain = specjax.speculative_generate(lm, draft, prompts, num_draft_tokens=3, **GREEDY)
        trees = specjax.speculative_generate(lm, draft, prompts, tree=tree, **GREEDY)
        streamed = [[] for _ in prompts]
        for chunk in specjax.speculative_stream(lm, draft, prompts, num_draft_tokens=3,
                                                **GREEDY):
            for row, tokens in enumerate(chunk.tokens):
                streamed[row] += tokens
        sampled = specjax.speculative_generate(
            lm, draft, prompts, num_draft_tokens=3, max_new_tokens=10,
            sampling=specjax.SamplingConfig(temperature=1.0), key=jax.random.key(7))
        own = lambda out: [np.asarray(out.tokens)[r, : int(out.lengths[r])].tolist()
                           for r in range(mine.start, mine.stop)]
        results[spec] = {
            "generate": own(plain), "chain": own(chain), "tree": own(trees),
            "stream": streamed[mine],
            "chain_emitted": chain.stats.emitted.tolist(),
            "sampled_all_rows": np.asarray(sampled.tokens).tolist(),
        }
    with open(out_path, "w") as f:
        json.dump(results, f)
""")


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("localhost", 0))
        return sock.getsockname()[1]


@pytest.fixture(scope="module")
def two_processes(tmp_path_factory):
    """Both processes' results (the worker above, run twice under jax.distributed)."""
    folder = tmp_path_factory.mktemp("distributed")
    port = _free_port()
    env = subprocess_env()  # 2 devices: jax_num_cpu_devices, in WORKER
    workers = [subprocess.Popen(
        [sys.executable, "-c", WORKER, str(port), str(i), str(folder / f"{i}.json"),
         str(TESTS)], env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        for i in range(2)]
    outputs = []
    try:
        for worker in workers:
            outputs.append(worker.communicate(timeout=600)[0])
    finally:
        for worker in workers:
            worker.kill()
    for worker, output in zip(workers, outputs, strict=True):
        assert worker.returncode == 0, output[-4000:]
    return [json.loads((folder / f"{i}.json").read_text()) for i in range(2)]


@pytest.mark.slow
def test_every_process_gets_the_whole_batch_and_its_own_rows(two_processes):
    everything = PROMPTS[0] + PROMPTS[1]
    for process, result in enumerate(two_processes):
        assert result["prompts"] == everything
        start = sum(len(p) for p in PROMPTS[:process])
        assert result["rows"] == [start, start + len(PROMPTS[process])]


@pytest.mark.slow
@pytest.mark.parametrize("mesh", MESHES)
def test_each_process_decodes_its_rows_as_one_device_does(two_processes, mesh):
    lm = build_lm(0, num_heads=4, num_kv_heads=4, d_ff=64)
    draft = build_lm(1, num_layers=1, num_heads=4, num_kv_heads=4, d_ff=64)
    prompts = PROMPTS[0] + PROMPTS[1]
    rows = lambda out: [np.asarray(out.tokens)[r, : int(out.lengths[r])].tolist()
                        for r in range(len(prompts))]
    expected = rows(specjax.generate(lm, prompts, **GREEDY))
    chain = specjax.speculative_generate(lm, draft, prompts, num_draft_tokens=3, **GREEDY)
    assert rows(chain) == expected
    for result in two_processes:
        mine = slice(*result["rows"])
        got = result[mesh]
        assert got["generate"] == expected[mine]
        assert got["chain"] == expected[mine]
        assert got["tree"] == expected[mine]
        assert got["stream"] == expected[mine]
        # The stats cover the whole batch on every process.
        assert got["chain_emitted"] == chain.stats.emitted.tolist()
    # One program: both processes read the same sampled batch.
    assert two_processes[0][mesh]["sampled_all_rows"] == two_processes[1][mesh][
        "sampled_all_rows"]


def test_in_one_process_gathering_is_the_identity():
    prompts, mine = gather_prompts([[1, 2], np.array([3, 4, 5])])
    assert prompts == [[1, 2], [3, 4, 5]] and mine == slice(0, 2)
    assert gather_prompts([]) == ([], slice(0, 0))
    x = jax.numpy.arange(6).reshape(2, 3)
    assert process_local(x) is x
    host = fetch({"a": x, "b": 3})
    assert isinstance(host["a"], np.ndarray) and host["a"].tolist() == [[0, 1, 2], [3, 4, 5]]
    assert host["b"] == 3
