"""A model sharded over a mesh of 8 virtual CPU devices (a process of its own, so the
suite's devices stay as they are): greedy outputs identical to one device on meshes 8x1,
1x8 and 2x4 for plain and speculative decoding (a replicated draft model, a sharded
draft with a static tree, an EAGLE-3 head with a dynamic tree), logits within float
tolerance, sampled decoding on a mesh exact by the 3-token chi-square, Megatron's two
all-reduces per layer and no all-gather in the compiled forward, and refusals that name
the dimension."""

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import jax
import numpy as np
import pytest
from conftest import build_lm, run_cli, smollm2_or_skip, subprocess_env

import specjax
import specjax_models
from specjax.runtime.sharding import DATA_AND_TENSOR, DATA_PARALLEL, TENSOR_PARALLEL, mesh_from_spec
from specjax_models.sharded import param_axes

TESTS = Path(__file__).resolve().parent

SCRIPT = textwrap.dedent("""
    import json, sys
    import jax
    jax.config.update("jax_num_cpu_devices", 8)
    import jax.numpy as jnp
    import numpy as np
    sys.path.insert(0, TESTS)
    from conftest import build_lm
    import specjax, specjax_models
    from specjax.drafters import Eagle, EarlyExit, FeatureHeadConfig, eagle3_feature_layers
    from specjax.runtime.sharding import (DATA_AND_TENSOR, DATA_PARALLEL, TENSOR_PARALLEL,
                                  ShardingRules, mesh_from_spec)
    from specjax.testing import speculative_joint_pvalues
    from specjax_models.sharded import forward_collectives

    assert len(jax.devices()) == 8
    lm = build_lm(0, num_heads=8, num_kv_heads=8, d_ff=128, num_layers=3)
    draft = build_lm(1, num_layers=1, num_heads=8, num_kv_heads=8, d_ff=128)
    embedding, lm_head = specjax_models.embedding_and_head(lm)
    head_config = FeatureHeadConfig(kind="eagle3", d_model=embedding.shape[1], num_heads=4,
                                    num_kv_heads=2, d_ff=96,
                                    feature_layers=eagle3_feature_layers(3))
    head = Eagle.create(head_config, embedding, lm_head, jax.random.key(2))
    head = head.with_params(jax.tree.map(lambda x: 6.0 * x if x.ndim == 2 else x,
                                         head.params))
    kangaroo = EarlyExit.create(FeatureHeadConfig(
        kind="kangaroo", d_model=embedding.shape[1], num_heads=4, num_kv_heads=2, d_ff=96,
        feature_layers=(1,)), lm_head, jax.random.key(3), stop_below=0.2)
    kangaroo = kangaroo.with_params(jax.tree.map(lambda x: 6.0 * x if x.ndim == 2 else x,
                                                 kangaroo.params))
    tree = specjax.TreeShape.from_paths([[0], [1], [0, 0], [1, 0], [0, 0, 0]])
    prompts = [[1 + (7 * r + i) % 30 for i in range(3 + r)] for r in range(8)]
    greedy = dict(max_new_tokens=12, sampling=specjax.GREEDY, eos_id=5)
    reference = specjax.generate(lm, prompts, **greedy)
    tokens = lambda out: np.asarray(out.tokens).tolist()
    lengths = lambda out: np.asarray(out.lengths).tolist()
    full = jnp.asarray([p[:3] for p in prompts])
    results = {"reference": [tokens(reference), lengths(reference)]}
    for spec, rules in (("data=8", DATA_PARALLEL), ("model=8", TENSOR_PARALLEL),
                        ("data=2,model=4", DATA_AND_TENSOR)):
        mesh = mesh_from_spec(spec)
        sharded = specjax_models.shard(lm, mesh, rules)
        row = {}
        row["placed"] = [list(x.sharding.spec) for x in
                         (sharded.params["layers"][0]["attention"]["q_proj"]["kernel"][...],
                          sharded.params["embed"]["embedding"][...])]
        out = specjax.generate(sharded, prompts, **greedy)
        row["generate"] = [tokens(out), lengths(out)]
        row["logits"] = float(jnp.max(jnp.abs(sharded.logits(full) - lm.logits(full))))
        out = specjax.speculative_generate(sharded, draft, prompts, num_draft_tokens=3,
                                           **greedy)
        row["draft chain"] = [tokens(out), lengths(out)]
        out = specjax.speculative_generate(
            sharded, specjax_models.shard(draft, mesh, rules), prompts, tree=tree, **greedy)
        row["sharded draft, static tree"] = [tokens(out), lengths(out)]
        out = specjax.speculative_generate(
            sharded, head, prompts, tree=specjax.DynamicTree(6, 3, 2), **greedy)
        row["eagle3 dynamic tree"] = [tokens(out), lengths(out)]
        row["accepted"] = int(np.asarray(out.stats.accepted).sum())
        # Kangaroo: the sharded target's first block, then a replicated adapter.
        out = specjax.speculative_generate(sharded, kangaroo, prompts, num_draft_tokens=3,
                                           **greedy)
        row["kangaroo early exit"] = [tokens(out), lengths(out)]
        streamed = [[] for _ in prompts]
        for chunk in specjax.speculative_stream(sharded, draft, prompts, num_draft_tokens=3,
                                                **greedy):
            for b, new in enumerate(chunk.tokens):
                streamed[b] += new
        row["stream"] = streamed

        found = forward_collectives(sharded, 8)
        row["all-reduce"] = found.get("all-reduce", {}).get("count", 0)
        row["all-gather"] = found.get("all-gather", {}).get("count", 0)
        row["all-reduce bytes"] = found.get("all-reduce", {}).get("bytes", 0)
        results[spec] = row
    mesh = mesh_from_spec("data=8")
    sampled = [specjax.SamplingConfig(temperature=1.0),
               specjax.SamplingConfig(temperature=0.7, top_k=8),
               specjax.SamplingConfig(temperature=1.0, top_p=0.8)]
    # 3 x 4001 rows on 8 devices: 5 padding rows (copies of the last row's setting),
    # each row group's chi-square against the target enumerated exactly.
    pvalues, out = speculative_joint_pvalues(specjax_models.shard(lm, mesh, DATA_PARALLEL),
                                             draft, [3, 1, 4], sampled, num_draft_tokens=2,
                                             rows_per_setting=4001)
    results["pvalues"] = pvalues
    # Tensor parallel: the vocabulary is split, so sampling (top-k, top-p) reads logits
    # spread over the devices.
    pvalues, _ = speculative_joint_pvalues(
        specjax_models.shard(lm, mesh_from_spec("model=8"), TENSOR_PARALLEL), draft,
        [3, 1, 4], sampled, num_draft_tokens=2, rows_per_setting=4000, seed=1)
    results["pvalues, model=8"] = pvalues
    results["sampled acceptance"] = float(np.asarray(out.stats.accepted).sum()
                                          / np.asarray(out.stats.proposed).sum())
    # Stepping by hand: the state keeps its layout from the prefill on, so the step
    # compiles once and reuses its donated buffers.
    from specjax.decoding.speculative_loop import init_speculative_state, speculative_config
    from specjax.decoding.step import jitted_step
    from specjax.testing import count_compilations
    sharded = specjax_models.shard(lm, mesh_from_spec("data=2,model=4"), DATA_AND_TENSOR)
    state, drafter = init_speculative_state(sharded, draft, prompts, max_new_tokens=12,
                                            num_draft_tokens=3, sampling=specjax.GREEDY,
                                            key=jax.random.key(0))
    layouts = [x.sharding for x in jax.tree.leaves(state)]
    config = speculative_config(3, specjax.GREEDY, None)
    state = jitted_step(sharded, drafter, state, config)
    with count_compilations() as compiled:  # the later steps take the first one's program
        for _ in range(2):
            state = jitted_step(sharded, drafter, state, config)
    results["layouts kept"] = [b.is_equivalent_to(x.sharding, x.ndim)
                               for b, x in zip(layouts, jax.tree.leaves(state))]
    results["rows split"] = list(state.lengths.sharding.spec)
    results["step compilations"] = len(compiled)
    # speculative_generate on a mesh compiles its loop once: nothing is compiled ahead for
    # layouts the prefill might not give (specjax.runtime.background_compile.placed_as_outputs).
    with count_compilations() as compiled:
        specjax.speculative_generate(sharded, draft, prompts, num_draft_tokens=2, **greedy)
    results["loop compilations"] = sum("_speculative_loop" in name for name in compiled)
    # Training and online distillation of models on the mesh: optimizer.init's fresh
    # counters beside the weights (committed to one device, jit refused them beside the
    # mesh's arrays), the losses as on one device, each step and update compiled once.
    from specjax.training.config import TrainConfig
    from specjax.training.loop import train
    from specjax.training.online import OnlineConfig, OnlineDistiller
    windows = np.asarray([[1 + (3 * r + i) % 30 for i in range(8)] for r in range(4)],
                         np.int32)
    trained = {}
    for name, model, draft_model in (
            ("one device", lm, draft),
            ("mesh", sharded, specjax_models.shard(draft, mesh_from_spec("data=2,model=4"),
                                                   DATA_AND_TENSOR))):
        with count_compilations() as compiled:
            result = train(model, lambda step: windows,
                           TrainConfig(steps=3, warmup_steps=1), progress=False)
            distiller = OnlineDistiller(model, draft_model, OnlineConfig(window=8))
            distiller.observe([[1, 2, 3]], [[4, 5, 6, 7]])
            losses = [distiller.update() for _ in range(2)]
        trained[name] = [result.history[-1]["loss"], *losses,
                         sum("step_fn" in n for n in compiled),
                         sum("_update_step" in n for n in compiled)]
    results["trained"] = trained
    refusals = []
    for make in (lambda: specjax_models.shard(build_lm(0), mesh_from_spec("model=8"),
                                              TENSOR_PARALLEL),
                 lambda: specjax_models.shard(build_lm(0, num_heads=8, num_kv_heads=8,
                                                       d_ff=100),
                                              mesh_from_spec("model=8"), TENSOR_PARALLEL),
                 lambda: specjax_models.shard(lm, mesh_from_spec("data=8"), TENSOR_PARALLEL)):
        try:
            make()
            refusals.append(None)
        except ValueError as error:
            refusals.append(str(error))
    results["refusals"] = refusals
    # Batches the data axis does not divide: padded inside, the caller's rows identical
    # to one device's, per-row settings kept per row (greedy rows among sampled ones).
    mixed = [specjax.SamplingConfig(temperature=0.9), specjax.GREEDY,
             specjax.SamplingConfig(temperature=1.1, top_k=6), specjax.GREEDY,
             specjax.SamplingConfig(temperature=0.7, top_p=0.9)]
    padded = {}
    for spec, rules in (("data=8", DATA_PARALLEL), ("data=2,model=4", DATA_AND_TENSOR)):
        sharded = specjax_models.shard(lm, mesh_from_spec(spec), rules)
        for rows in (3, 5):
            kwargs = dict(max_new_tokens=10, sampling=mixed[:rows], key=jax.random.key(7),
                          eos_id=5)
            for name, decode in (
                    ("generate", lambda m, kw: specjax.generate(m, prompts[:rows], **kw)),
                    ("draft chain", lambda m, kw: specjax.speculative_generate(
                        m, draft, prompts[:rows], num_draft_tokens=3, **kw))):
                one, placed = decode(lm, kwargs), decode(sharded, kwargs)
                padded[f"{spec} {rows} {name}"] = (
                    [tokens(one), lengths(one)] == [tokens(placed), lengths(placed)]
                    and len(tokens(placed)) == rows)
            streamed = list(specjax.speculative_stream(sharded, draft, prompts[:rows],
                                                       num_draft_tokens=3, **kwargs))
            padded[f"{spec} {rows} stream rows"] = all(len(c.tokens) == rows
                                                       for c in streamed)
    results["padded"] = padded
    # A draft model that was never sharded follows its target's rules: its weights split
    # where they divide, its cache split by rows (data) or by heads (model), not a whole
    # copy of every row's cache on every device.
    placed_drafts = {}
    for spec, rules in (("data=8", DATA_PARALLEL), ("model=8", TENSOR_PARALLEL)):
        sharded = specjax_models.shard(lm, mesh_from_spec(spec), rules)
        state, drafter = init_speculative_state(sharded, specjax.DraftModel(draft), prompts,
                                                max_new_tokens=8, num_draft_tokens=3,
                                                sampling=specjax.GREEDY)
        keys = state.drafter_state.cache.keys[0]
        placed_drafts[spec] = [
            list(drafter.lm.params["layers"][0]["attention"]["q_proj"]["kernel"][...]
                 .sharding.spec),
            list(keys.shape), list(keys.addressable_shards[0].data.shape)]
    results["placed drafts"] = placed_drafts
    # A GGUF file loaded straight onto a 4x2 mesh (tensor by tensor) and by one device.
    from test_gguf import TINY, write_gguf
    gguf_lm = build_lm(3, **TINY)
    path = TMP + "/tiny.gguf"
    write_gguf(path, gguf_lm)
    plain = specjax_models.from_gguf(path, cache=False)
    placed = specjax_models.from_gguf(path, cache=False, mesh=mesh_from_spec("data=4,model=2"))
    results["from_gguf"] = [tokens(specjax.generate(m, prompts, **greedy)) for m in (plain, placed)]
    results["from_gguf placed"] = list(
        placed.params["layers"][0]["mlp"]["up_proj"]["kernel"][...].sharding.spec)
    # An orbax checkpoint restored onto the same mesh, array by array.
    from conftest import tiny_config
    specjax_models.save_checkpoint(gguf_lm, tiny_config(**TINY), TMP + "/ckpt")
    restored = specjax_models.load_checkpoint(TMP + "/ckpt", mesh=mesh_from_spec("data=4,model=2"))
    results["load_checkpoint"] = [tokens(specjax.generate(m, prompts, **greedy)) for m in (
        specjax_models.load_checkpoint(TMP + "/ckpt"), restored)]
    results["load_checkpoint placed"] = list(
        restored.params["layers"][1]["attention"]["o_proj"]["kernel"][...].sharding.spec)
    # A mixture of experts (8 experts, top 2, a dense first layer) split by expert and by
    # the experts' columns: greedy generate and a speculative chain as on one device.
    import dataclasses
    from specjax.runtime.sharding import EXPERT_PARALLEL
    moe = build_lm(4, num_heads=8, num_kv_heads=8, num_layers=3, num_experts=8,
                   experts_per_token=2, expert_d_ff=32, dense_layers=(0,))
    moe_draft = specjax_models.first_layers(moe, 2)
    moe_runs = lambda m, d: [tokens(specjax.generate(m, prompts, **greedy)),
                             tokens(specjax.speculative_generate(m, d, prompts,
                                                                 num_draft_tokens=3, **greedy))]
    results["moe reference"] = moe_runs(moe, moe_draft)
    for spec, rules in (("model=8", EXPERT_PARALLEL), ("model=8", TENSOR_PARALLEL),
                        ("data=2,model=4", dataclasses.replace(EXPERT_PARALLEL, batch="data"))):
        name = spec + (" experts" if rules.experts else " columns")
        placed_moe = specjax_models.shard(moe, mesh_from_spec(spec), rules)
        results["moe " + name] = moe_runs(placed_moe, moe_draft)
        results["moe placed " + name] = list(
            placed_moe.params["layers"][1]["mlp"]["gate_kernel"][...].sharding.spec)
    # Multi-head latent attention: up-projections split by head, latent cache replicated.
    mla = build_lm(5, num_heads=8, num_kv_heads=8, num_layers=2, kv_lora_rank=16,
                   q_lora_rank=12, qk_nope_head_dim=8, qk_rope_head_dim=4, v_head_dim=8)
    mla_draft = specjax_models.first_layers(mla, 1)
    results["mla reference"] = moe_runs(mla, mla_draft)
    for spec, rules in (("model=8", TENSOR_PARALLEL), ("data=2,model=4", DATA_AND_TENSOR)):
        placed_mla = specjax_models.shard(mla, mesh_from_spec(spec), rules)
        results["mla " + spec] = moe_runs(placed_mla, mla_draft)
        results["mla placed " + spec] = list(
            placed_mla.params["layers"][0]["attention"]["kv_b_proj"]["kernel"][...]
            .sharding.spec)
    print("RESULT", json.dumps(results))
""").replace("TESTS", repr(str(TESTS)))


@pytest.fixture(scope="module")
def on_eight_devices(tmp_path_factory) -> dict:
    env = subprocess_env(JAX_PLATFORMS="cpu")  # 8 devices: jax_num_cpu_devices, in SCRIPT
    script = SCRIPT.replace("TMP", repr(str(tmp_path_factory.mktemp("sharded"))))
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                          env=env, timeout=900, check=False)
    assert done.returncode == 0, done.stderr[-4000:]
    line = next(line for line in done.stdout.splitlines() if line.startswith("RESULT"))
    return json.loads(line.split(" ", 1)[1])


MESHES = ("data=8", "model=8", "data=2,model=4")


@pytest.mark.slow  # one process of its own on 8 devices: about 75 s
@pytest.mark.parametrize("mesh", MESHES)
def test_outputs_on_a_mesh_equal_one_devices(on_eight_devices, mesh):
    row, reference = on_eight_devices[mesh], on_eight_devices["reference"]
    for decoder in ("generate", "draft chain", "sharded draft, static tree",
                    "eagle3 dynamic tree", "kangaroo early exit"):
        assert row[decoder] == reference, (mesh, decoder)
    reference_tokens, reference_lengths = reference
    assert row["stream"] == [t[:n] for t, n in zip(reference_tokens, reference_lengths,
                                                   strict=True)]
    assert row["logits"] < 1e-4
    assert row["accepted"] > 0  # the head's drafts were accepted: speculation ran


@pytest.mark.slow  # one process of its own on 8 devices: about 75 s
def test_a_stepped_state_keeps_its_layout_and_the_step_compiles_once(on_eight_devices):
    """Per-row arrays are split over the data axis from the prefill on (left to
    propagation they came out of the prefill replicated and out of the first step split,
    and the second step compiled again)."""
    assert all(on_eight_devices["layouts kept"])
    assert on_eight_devices["rows split"] == ["data"]
    assert on_eight_devices["step compilations"] == 0
    assert on_eight_devices["loop compilations"] == 1


@pytest.mark.slow  # one process of its own on 8 devices: about 75 s
def test_models_on_a_mesh_train_and_distil_as_on_one_device(on_eight_devices):
    """`train` and `OnlineDistiller` on a sharded model and draft: the optimizer's fresh
    state is placed beside the weights on the mesh (not on one device, which jit refuses),
    the losses are one device's, and each step or update compiles once."""
    one, mesh = on_eight_devices["trained"]["one device"], on_eight_devices["trained"]["mesh"]
    np.testing.assert_allclose(mesh[:3], one[:3], rtol=1e-4)
    assert mesh[3:] == one[3:] == [1, 1]


@pytest.mark.slow  # one process of its own on 8 devices: about 75 s
def test_parameters_are_placed_by_the_rules(on_eight_devices):
    # q_proj's kernel [D, N * H] and the embedding [V, D]
    assert on_eight_devices["data=8"]["placed"] == [[None, None], [None, None]]
    assert on_eight_devices["model=8"]["placed"] == [[None, "model"], ["model", None]]


@pytest.mark.slow  # one process of its own on 8 devices: about 75 s
def test_tensor_parallel_forward_has_two_all_reduces_per_layer_and_no_gather(
        on_eight_devices):
    assert on_eight_devices["data=8"]["all-reduce"] == 0
    for mesh in ("model=8", "data=2,model=4"):
        # 3 layers x (attention, MLP) + the vocabulary-split embedding's lookup, each of
        # the [rows per data shard, 1, d_model 64] float32 activations
        assert on_eight_devices[mesh]["all-reduce"] == 2 * 3 + 1, mesh
    assert on_eight_devices["model=8"]["all-reduce bytes"] == 7 * 8 * 64 * 4
    assert on_eight_devices["data=2,model=4"]["all-reduce bytes"] == 7 * 4 * 64 * 4
    for mesh in MESHES:
        assert on_eight_devices[mesh]["all-gather"] == 0, mesh


@pytest.mark.slow  # one process of its own on 8 devices: about 75 s
def test_sampled_decoding_on_a_mesh_is_exact(on_eight_devices):
    assert min(on_eight_devices["pvalues"]) > 1e-3, on_eight_devices["pvalues"]
    assert min(on_eight_devices["pvalues, model=8"]) > 1e-3, on_eight_devices[
        "pvalues, model=8"]
    assert 0.0 < on_eight_devices["sampled acceptance"] < 1.0


@pytest.mark.slow  # one process of its own on 8 devices: about 75 s
def test_shapes_that_do_not_divide_are_refused_by_name(on_eight_devices):
    heads, mlp, axis = on_eight_devices["refusals"]
    assert "num_heads (4)" in heads and "'model'" in heads
    assert "mlp dimension (100)" in mlp and "mlp.down_proj.kernel" in mlp
    assert "mesh axes ['model']" in axis


@pytest.mark.slow  # one process of its own on 8 devices: about 75 s
def test_any_batch_runs_on_a_data_parallel_mesh_as_on_one_device(on_eight_devices):
    """3 and 5 rows on data=8 and data=2,model=4: padded to the data axis inside, the
    caller's rows (tokens, lengths, per-row sampling settings) as on one device."""
    padded = on_eight_devices["padded"]
    assert len(padded) == 12 and all(padded.values()), padded


@pytest.mark.slow  # one process of its own on 8 devices: about 75 s
def test_a_gguf_file_loads_onto_a_mesh_tensor_by_tensor(on_eight_devices):
    plain, placed = on_eight_devices["from_gguf"]
    assert plain == placed
    assert on_eight_devices["from_gguf placed"] == [None, "model"]


@pytest.mark.slow  # one process of its own on 8 devices: about 75 s
def test_an_orbax_checkpoint_restores_onto_a_mesh_array_by_array(on_eight_devices):
    plain, placed = on_eight_devices["load_checkpoint"]
    assert plain == placed
    assert on_eight_devices["load_checkpoint placed"] == ["model", None]


@pytest.mark.slow  # two SmolLM2 runs on 3 virtual devices
def test_the_command_line_decodes_smollm2_on_a_mesh():
    smollm2_or_skip()
    # SmolLM2 has 9 heads and 3 KV heads: a model axis of 3 splits them whole.
    env = subprocess_env("--xla_force_host_platform_device_count=3")
    runs = [run_cli("generate", "What is the capital of France?", "--model", "smollm2",
                    "--max-new-tokens", "12", "--json", *extra, env=env)
            for extra in ((), ("--mesh", "model=3"))]
    texts = [json.loads(run.stdout)["text"] for run in runs]
    assert texts[0] == texts[1] and "Paris" in texts[0]
    refused = run_cli("generate", "x", "--mesh", "data=2", env=env)
    assert refused.returncode == 2 and "--mesh data=2" in refused.stderr  # 3 devices
    refused = run_cli("generate", "x", "--mesh", "data=3", env=env)
    assert refused.returncode == 2 and "one prompt, one row" in refused.stderr
    refused = run_cli("generate", "x", "--mesh", "model=3", env=env)  # the bundled target
    assert refused.returncode == 2 and "num_heads (8) does not divide" in refused.stderr


# On this process's one device: the rules' mapping and a one-device mesh.


def test_parameter_names_map_to_their_logical_axes():
    assert param_axes(("layers", 0, "attention", "q_proj", "kernel"), 2) == (
        "embed", "heads")
    assert param_axes(("layers", "mlp", "down_proj", "kernel"), 3) == (  # scanned: [L, ...]
        "layers", "mlp", "embed")
    assert param_axes(("final_norm", "weight"), 1) == (None,)
    with pytest.raises(ValueError, match="no sharding rule for parameter extra.table"):
        param_axes(("extra", "table"), 2)


def test_a_one_device_mesh_changes_nothing():
    lm = build_lm(0)
    mesh = mesh_from_spec("data=1,model=1")
    sharded = specjax_models.shard(lm, mesh, DATA_AND_TENSOR)
    prompts = [[1, 2, 3], [4, 5]]
    a = specjax.generate(lm, prompts, max_new_tokens=6, sampling=specjax.GREEDY)
    b = specjax.generate(sharded, prompts, max_new_tokens=6, sampling=specjax.GREEDY)
    np.testing.assert_array_equal(a.tokens, b.tokens)
    assert isinstance(sharded.params["embed"]["embedding"][...].sharding,
                      jax.sharding.NamedSharding)
    again = specjax_models.shard(sharded, mesh_from_spec("data=1"), DATA_PARALLEL)
    assert tuple(again.params["embed"]["embedding"][...].sharding.spec) == (None, None)
    assert again.init_cache_fn.inner is lm.init_cache_fn  # re-placed, not wrapped twice
    np.testing.assert_array_equal(
        specjax.generate(again, prompts, max_new_tokens=6, sampling=specjax.GREEDY).tokens,
        a.tokens)


def test_shard_refuses_what_is_not_a_transformer():
    with pytest.raises(TypeError, match="CausalLM of a specjax_models.Transformer"):
        specjax_models.shard(specjax.testing.plus_one_lm(), mesh_from_spec("model=1"),
                             TENSOR_PARALLEL)


@pytest.mark.slow  # one process of its own on 8 devices: about 75 s
def test_a_draft_that_was_never_sharded_follows_its_targets_rules(on_eight_devices):
    placed = on_eight_devices["placed drafts"]
    # [B 8, KV heads 8, slots, head dim 8]: one row per device, or one head per device
    assert placed["data=8"][0] == [None, None] and placed["data=8"][2][:2] == [1, 8]
    assert placed["model=8"][0] == [None, "model"] and placed["model=8"][2][:2] == [8, 1]


@pytest.mark.slow  # one process of its own on 8 devices: about 75 s
def test_a_mixture_of_experts_split_by_expert_or_by_column_decodes_as_on_one_device(
        on_eight_devices):
    reference = on_eight_devices["moe reference"]
    assert reference[0] == reference[1]  # the speculative chain is greedy decoding
    for name, placed in (("model=8 experts", ["model", None, None]),
                         ("model=8 columns", [None, None, "model"]),
                         ("data=2,model=4 experts", ["model", None, None])):
        assert on_eight_devices["moe " + name] == reference, name
        assert on_eight_devices["moe placed " + name] == placed, name


@pytest.mark.slow  # one process of its own on 8 devices: about 75 s
def test_latent_attention_split_by_head_decodes_as_on_one_device(on_eight_devices):
    reference = on_eight_devices["mla reference"]
    assert reference[0] == reference[1]
    for spec in ("model=8", "data=2,model=4"):
        assert on_eight_devices["mla " + spec] == reference, spec
        assert on_eight_devices["mla placed " + spec] == [None, "model"], spec

