"""Writes the four notebooks of colab/ from the cells below (the notebooks are generated so
their code can be reviewed, linted and diffed as Python). Run from the repository root:

    python colab/build_notebooks.py [--execute]

`--execute` also runs each notebook (full size, about N minutes on 2 CPU cores) and saves
it with its outputs, as they are committed.

The notebooks read SPECJAX_NOTEBOOK_SMALL=1 to run in a small-size mode (CI executes
them that way with nbclient: tests/test_notebooks.py).
"""

from __future__ import annotations

from pathlib import Path

import nbformat
from nbformat.v4 import new_code_cell, new_markdown_cell, new_notebook

HERE = Path(__file__).resolve().parent

INSTALL = '''\
# Install specjax once per runtime. SPECJAX_SOURCE says where from, in one place: a pip
# requirement such as "git+https://github.com/YOUR_NAME/specjax" (your fork or the
# upstream repository) or "specjax @ https://.../specjax-0.1.0.tar.gz", or the path of a
# checkout (cloned or uploaded, e.g. /content/specjax). Set it in the cell below or as
# an environment variable. Inside a checkout it is found without setting anything.
import importlib, importlib.util, os, pathlib, subprocess, sys
SPECJAX_SOURCE = os.environ.get("SPECJAX_SOURCE", "")
if importlib.util.find_spec("specjax") is None:
    checkouts = [pathlib.Path(c) for c in (SPECJAX_SOURCE, pathlib.Path.cwd().parent,
                                           pathlib.Path.cwd(), "/content/specjax") if c]
    checkout = next((c for c in checkouts if (c / "pyproject.toml").exists()), None)
    if checkout is not None:
        requirement = ["-e", f"{checkout}[colab]"]
    elif SPECJAX_SOURCE:
        requirement = [f"specjax[colab] @ {SPECJAX_SOURCE}" if "://" in SPECJAX_SOURCE
                       and not SPECJAX_SOURCE.startswith("specjax") else SPECJAX_SOURCE]
    else:
        raise RuntimeError("specjax is not installed: set SPECJAX_SOURCE to a pip "
                           "requirement (git+https://github.com/YOUR_NAME/specjax) or to "
                           "the path of a checkout, then run this cell again")
    subprocess.run([sys.executable, "-m", "pip", "install", "-q", *requirement], check=True)
    # This kernel started before the install: read the new .pth files (an editable
    # install maps specjax_models to the checkout's models/ folder through one).
    import site
    for directory in site.getsitepackages() + [site.getusersitepackages()]:
        site.addsitedir(directory)
    importlib.invalidate_caches()
'''

SETUP = '''\
import os, time
import jax, jax.numpy as jnp, numpy as np
import specjax
import specjax_models

SMALL = os.environ.get("SPECJAX_NOTEBOOK_SMALL") == "1"  # CI's quick mode
SEED = 0                                                # every draw below derives from it
print("backend:", jax.default_backend(), "| devices:", jax.devices(), "| small mode:", SMALL)
'''

PLOTS = """\
import matplotlib.pyplot as plt
# Figures as SVG text: readable in diffs and reviews, no base64 blobs in the notebook.
%config InlineBackend.figure_formats = ['svg']
plt.rcParams['svg.hashsalt'] = 'specjax'  # stable element ids, so re-runs diff cleanly
"""

COLOUR_HTML = '''\
from IPython.display import HTML, display

def coloured(chunks, tokenizer):
    """HTML of streamed chunks: accepted draft tokens green, target tokens orange."""
    spans = []
    for chunk in chunks:
        for token, drafted in zip(chunk.tokens[0], chunk.from_draft[0]):
            text = tokenizer.decode([token]).replace("&", "&amp;").replace("<", "&lt;")
            colour = "#1a7f37" if drafted else "#bc4c00"
            spans.append(f'<span style="color:{colour}">{text}</span>')
    return "<pre>" + "".join(spans) + "</pre>"
'''


def quickstart():
    return [
        new_markdown_cell(
            "# specjax quickstart: speculative decoding by hand, then in one call\n\n"
            "The bundled byte-level pair (a 4.9M-parameter target, a 0.46M-parameter "
            "distilled draft, both trained on the Python standard library) continues "
            "held-out code. Runtime: about a minute on a CPU, compile included; seconds on "
            "a GPU or TPU. Every number is seeded and identical on re-run on the same "
            "hardware."),
        new_code_cell(INSTALL),
        new_code_cell(SETUP),
        new_code_cell(
            "target = specjax_models.load_bundled('target')\n"
            "draft = specjax_models.load_bundled('draft')\n"
            "tok = specjax_models.ByteTokenizer()\n"
            "prompt_text = specjax_models.bundled_prompts()[0]['text']\n"
            "prompt = tok.encode(prompt_text)\n"
            "print(target, draft, sep='\\n')\n"
            "print(prompt_text[-200:])"),
        new_markdown_cell(
            "## `speculative_step` by hand\n\nGreedy, K = 4. Each step the draft proposes "
            "4 tokens, the target checks the last committed token plus the 4 drafts in ONE "
            "forward, and the longest prefix that matches the target's argmax is kept, plus "
            "the target's own token at the first mismatch (or a bonus token)."),
        new_code_cell(
            "K = 4\n"
            "config = specjax.SpeculativeConfig(num_draft_tokens=K, sampling=specjax.GREEDY)\n"
            "state, drafter = specjax.init_speculative_state(\n"
            "    target, draft, [prompt], max_new_tokens=64, num_draft_tokens=K,\n"
            "    sampling=specjax.GREEDY)\n"
            "propose = jax.jit(lambda s: drafter.propose(\n"
            "    s.drafter_state, specjax.drafters.DraftContext(s.sequence, s.lengths),\n"
            "    jax.random.key(SEED), num_draft_tokens=K, sampling=specjax.GREEDY,\n"
            "    vocab_size=target.vocab_size)[1].tokens)\n"
            "for step in range(3 if SMALL else 6):\n"
            "    drafted = np.asarray(propose(state))[0]  # greedy drafts are deterministic\n"
            "    before = int(state.lengths[0])\n"
            "    state = specjax.jitted_step(target, drafter, state, config)\n"
            "    n_acc = int(state.step_accepted[0]); n_new = int(state.step_emitted[0])\n"
            "    new = np.asarray(state.sequence)[0, before:before + n_new]\n"
            "    print(f'step {step}: drafted {tok.decode(drafted)!r} | accepted {n_acc} | '\n"
            "          f'target added {tok.decode(new[n_acc:])!r} | committed '\n"
            "          f'{tok.decode(new)!r}')"),
        new_markdown_cell("## `speculative_generate`: the whole loop in one jit"),
        new_code_cell(
            "n_new = 48 if SMALL else 160\n"
            "out = specjax.speculative_generate(target, draft, [prompt], max_new_tokens=n_new,\n"
            "                                   num_draft_tokens=6, sampling=specjax.GREEDY)\n"
            "plain = specjax.generate(target, [prompt], max_new_tokens=n_new,\n"
            "                         sampling=specjax.GREEDY)\n"
            "assert np.array_equal(out.tokens, plain.tokens)  # greedy: the very same tokens\n"
            "s = out.stats\n"
            "print(f'acceptance rate {s.acceptance_rate:.3f}, per checked position '\n"
            "      f'{s.position_acceptance_rate:.3f}, tokens per target forward '\n"
            "      f'{s.mean_accepted_length:.2f}, target forwards {s.target_forwards[0]}, '\n"
            "      f'draft forwards {s.draft_forwards[0]}')\n"
            "print('acceptance per position:', np.round(s.accepted_per_position, 3))\n"
            "print(tok.decode(np.asarray(out.tokens[0]).tolist()))"),
        new_markdown_cell("## Streamed, coloured: draft tokens green, target tokens orange\n\n"
                          "Sampling at temperature 0.8 (exact: the output follows the "
                          "target's own temperature-0.8 distribution)."),
        new_code_cell(COLOUR_HTML),
        new_code_cell(
            "chunks = list(specjax.speculative_stream(\n"
            "    target, draft, [prompt], max_new_tokens=n_new, num_draft_tokens=6,\n"
            "    sampling=specjax.SamplingConfig(temperature=0.8), key=jax.random.key(SEED)))\n"
            "display(HTML(coloured(chunks, tok)))\n"
            "print(f'{len(chunks)} steps, acceptance {chunks[-1].stats.acceptance_rate:.3f}')"),
    ]


def exactness():
    return [
        new_markdown_cell(
            "# Exactness: the draft changes the speed, never the distribution\n\n"
            "1. The seed's worked example, computed with the library's own rejection code.\n"
            "2. Empirical distribution of speculative samples against the exactly "
            "enumerated target distribution on a tiny model, for a good and a bad draft.\n"
            "3. Acceptance against K and temperature on the bundled pair, with the "
            "analytical curve.\n\nRuntime: about a minute on a CPU."),
        new_code_cell(INSTALL),
        new_code_cell(SETUP + PLOTS + "from scipy import stats\n"
                      "from specjax.verification.rejection import (accept_sampled, "
                      "residual_distribution)\n"),
        new_markdown_cell(
            "## 1. q = {mat 0.6, sat 0.3, ran 0.1}, p = {mat 0.5, sat 0.4, ran 0.1}\n\n"
            "The draft proposed 'mat': accept with probability min(1, 0.5/0.6) = 0.83; on "
            "rejection, sample from normalise((p - q)+) = all on 'sat'."),
        new_code_cell(
            "words = ['mat', 'sat', 'ran']\n"
            "q = jnp.array([[0.6, 0.3, 0.1]]); p = jnp.array([[0.5, 0.4, 0.1]])\n"
            "print('residual:', dict(zip(words, np.round(np.asarray(\n"
            "    residual_distribution(p, q))[0], 3).tolist())))\n"
            "rows = 20_000 if SMALL else 200_000\n"
            "target_p = jnp.broadcast_to(jnp.stack([p[0], p[0]])[None], (rows, 2, 3))\n"
            "draft_q = jnp.broadcast_to(q[:, None], (rows, 1, 3))\n"
            "# The draft proposed 'mat' (token 0) in every row: how often is it accepted?\n"
            "res = accept_sampled(jax.random.key(SEED), jax.random.key(SEED + 1),\n"
            "                     jnp.zeros((rows, 1), jnp.int32), draft_q, target_p)\n"
            "accepted = np.asarray(res.num_accepted) == 1\n"
            "print(f'P(accept | mat proposed): {accepted.mean():.4f} (exact 0.8333); '\n"
            "      f'corrections: {set(np.asarray(res.next_token)[~accepted].tolist())} '\n"
            "      '(1 = sat)')\n"
            "# Now the draft samples from q, as it really does: the emitted token follows p.\n"
            "drafts = jax.random.choice(jax.random.key(SEED + 2), 3, (rows, 1), p=q[0])\n"
            "res = accept_sampled(jax.random.key(SEED + 3), jax.random.key(SEED + 4),\n"
            "                     drafts.astype(jnp.int32), draft_q, target_p)\n"
            "emitted = np.where(np.asarray(res.num_accepted) == 1, np.asarray(drafts[:, 0]),\n"
            "                   np.asarray(res.next_token))\n"
            "print('emitted distribution:', dict(zip(words, np.round(np.bincount(\n"
            "    emitted, minlength=3) / rows, 3).tolist())), '(target p: 0.5, 0.4, 0.1)')"),
        new_markdown_cell(
            "## 2. Speculative samples vs the exact target distribution\n\n"
            "A vocab-8 transformer; the joint distribution of the first two generated tokens "
            "is enumerated exactly (64 cells) and compared with thousands of speculative "
            "samples, drawn in one batched call, for a good draft (the target with its "
            "weights nudged) and a bad one (an unrelated model)."),
        new_code_cell(
            "from flax import nnx\n"
            "def tiny(seed, scale=1.0):\n"
            "    cfg = specjax_models.TransformerConfig(vocab_size=8, num_layers=1, d_model=16,\n"
            "        num_heads=2, num_kv_heads=1, d_ff=32, max_seq_len=64)\n"
            "    model = specjax_models.Transformer(cfg, rngs=nnx.Rngs(seed))\n"
            "    lm = specjax.CausalLM.from_nnx(model)\n"
            "    return lm.with_params(jax.tree.map(lambda x: scale * x, lm.params))\n"
            "tiny_target = tiny(3)\n"
            "good = tiny_target.with_params(jax.tree.map(\n"
            "    lambda x: x * 1.05, tiny_target.params))\n"
            "bad = tiny(11, scale=3.0)\n"
            "sampling = specjax.SamplingConfig(temperature=1.0)\n"
            "prefix = [1, 5, 2]\n"
            "def exact_joint(lm):\n"
            "    p1 = specjax.probabilities(lm.logits(jnp.array([prefix]))[:, -1], sampling)[0]\n"
            "    seqs = jnp.array([prefix + [x] for x in range(8)])\n"
            "    p2 = specjax.probabilities(lm.logits(seqs)[:, -1], sampling)\n"
            "    joint = np.asarray(p1, np.float64)[:, None] * np.asarray(p2, np.float64)\n"
            "    return (joint / joint.sum()).reshape(-1)\n"
            "joint = exact_joint(tiny_target)\n"
            "rows = 8_000 if SMALL else 40_000\n"
            "fig, axes = plt.subplots(1, 2, figsize=(12, 3), sharey=True)\n"
            "for ax, (name, d) in zip(axes, [('good draft', good), ('bad draft', bad)]):\n"
            "    out = specjax.speculative_generate(tiny_target, d, [prefix] * rows,\n"
            "        max_new_tokens=2, num_draft_tokens=2, sampling=sampling,\n"
            "        key=jax.random.key(SEED))\n"
            "    t = np.asarray(out.tokens)\n"
            "    observed = np.bincount(t[:, 0] * 8 + t[:, 1], minlength=64) / rows\n"
            "    big = joint * rows >= 5\n"
            "    obs, exp = observed[big] * rows, joint[big] * rows\n"
            "    if (~big).any():  # pool the rare cells into one\n"
            "        obs = np.append(obs, observed[~big].sum() * rows)\n"
            "        exp = np.append(exp, joint[~big].sum() * rows)\n"
            "    pvalue = stats.chisquare(obs, exp).pvalue\n"
            "    ax.bar(np.arange(64) - 0.2, joint, width=0.4, label='exact target')\n"
            "    ax.bar(np.arange(64) + 0.2, observed, width=0.4, label='speculative samples')\n"
            "    ax.set_title(f'{name}: acceptance {out.stats.acceptance_rate:.2f}, '\n"
            "                 f'chi-square p = {pvalue:.2f}')\n"
            "    ax.set_xlabel('(first token, second token) cell')\n"
            "    print(f'{name}: acceptance {out.stats.acceptance_rate:.3f}, '\n"
            "          f'tokens per forward {out.stats.mean_accepted_length:.2f}, '\n"
            "          f'chi-square p-value {pvalue:.3f}')\n"
            "axes[0].legend(); plt.tight_layout(); plt.show()"),
        new_markdown_cell(
            "Both drafts give samples consistent with the target (large p-values); only "
            "the acceptance rate, the speed, differs.\n\n"
            "## 3. Acceptance against K and temperature (bundled pair)\n\nMeasured tokens "
            "per target forward, next to the analytical (1 - b^(K+1)) / (1 - b) at the "
            "measured per-position acceptance b."),
        new_code_cell(
            "target = specjax_models.load_bundled('target')\n"
            "draft = specjax_models.load_bundled('draft')\n"
            "tok = specjax_models.ByteTokenizer()\n"
            "prompts = [tok.encode(p['text']) for p in specjax_models.bundled_prompts()\n"
            "           if p['kind'] == 'continue'][: 4 if SMALL else 16]\n"
            "ks = [1, 2, 4] if SMALL else [1, 2, 3, 4, 6, 8]\n"
            "temperatures = [0.0, 1.0] if SMALL else [0.0, 0.7, 1.0]\n"
            "plt.figure(figsize=(6, 4))\n"
            "for temperature in temperatures:\n"
            "    sampling = specjax.SamplingConfig(temperature=temperature)\n"
            "    taus, models_ = [], []\n"
            "    for k in ks:\n"
            "        s = specjax.speculative_generate(target, draft, prompts,\n"
            "            max_new_tokens=32 if SMALL else 96, num_draft_tokens=k,\n"
            "            sampling=sampling, key=jax.random.key(SEED)).stats\n"
            "        taus.append(s.mean_accepted_length)\n"
            "        models_.append(specjax.analysis.expected_tokens_per_forward(\n"
            "            s.position_acceptance_rate, k))\n"
            "    line, = plt.plot(ks, taus, 'o-', label=f'measured, T={temperature}')\n"
            "    plt.plot(ks, models_, '--', color=line.get_color(),\n"
            "             label=f'model, T={temperature}')\n"
            "    print(f'T={temperature}: tau', np.round(taus, 2), 'model', np.round(models_, 2))\n"
            "plt.xlabel('K (draft tokens per step)'); plt.ylabel('tokens per target forward')\n"
            "plt.legend(); plt.grid(alpha=0.3); plt.show()"),
    ]


def real_models():
    return [
        new_markdown_cell(
            "# Real models: a Qwen2.5 pair and a published EAGLE-3 head on a GPU or TPU\n\n"
            "On a GPU or TPU runtime with network access this downloads "
            "Qwen2.5-1.5B-Instruct (target) and Qwen2.5-0.5B-Instruct (draft), loads them "
            "with `specjax_models.from_pretrained` (bfloat16, no PyTorch), and compares greedy and "
            "sampled speculative decoding with plain decoding, then drafts with a published "
            "parallel draft (PARD) for the same family. On a CPU, or without "
            "network, it falls back to the bundled pair and says so. Runtime: a few minutes "
            "on a GPU (download included), under a minute on the CPU fallback."),
        new_code_cell(INSTALL),
        new_code_cell(SETUP),
        new_code_cell(
            "import socket\n"
            "def hub_reachable(host='huggingface.co'):\n"
            "    try:\n"
            "        socket.create_connection((host, 443), timeout=3).close(); return True\n"
            "    except OSError:\n"
            "        return False\n"
            "accelerator = jax.default_backend() in ('gpu', 'tpu')\n"
            "use_hub = accelerator and not SMALL and hub_reachable()\n"
            "if use_hub:\n"
            "    from huggingface_hub import snapshot_download\n"
            "    target_dir = snapshot_download('Qwen/Qwen2.5-1.5B-Instruct')\n"
            "    draft_dir = snapshot_download('Qwen/Qwen2.5-0.5B-Instruct')\n"
            "    target = specjax_models.from_pretrained(target_dir)\n"
            "    draft = specjax_models.from_pretrained(draft_dir)\n"
            "    tok = specjax_models.load_tokenizer(target_dir)\n"
            "    prompts = [tok.apply_chat_template([{'role': 'user', 'content': q}]) for q in [\n"
            "        'Explain speculative decoding in three sentences.',\n"
            "        'Write a Python function that merges two sorted lists.']]\n"
            "    eos, decode, n_new = tok.eos_id, tok.decode, 128\n"
            "else:\n"
            "    print('No GPU/TPU with network access: using the bundled byte-level pair.')\n"
            "    target = specjax_models.load_bundled('target')\n"
            "    draft = specjax_models.load_bundled('draft')\n"
            "    tok = specjax_models.ByteTokenizer()\n"
            "    prompts = [tok.encode(p['text']) for p in specjax_models.bundled_prompts()\n"
            "               if p['kind'] == 'continue'][:2]\n"
            "    eos, decode, n_new = None, tok.decode, 48 if SMALL else 128\n"
            "print(target); print(draft)"),
        new_code_cell(
            "def timed(call, reps=3):\n"
            "    out = call(); jax.block_until_ready(out.tokens)  # compile\n"
            "    times = []\n"
            "    for _ in range(reps):\n"
            "        start = time.perf_counter(); out = call(); jax.block_until_ready(out.tokens)\n"
            "        times.append(time.perf_counter() - start)\n"
            "    return out, float(np.median(times))\n"
            "rows = []\n"
            "for name, sampling in [('greedy', specjax.GREEDY),\n"
            "                       ('t=0.7', specjax.SamplingConfig(temperature=0.7))]:\n"
            "    key = jax.random.key(SEED)\n"
            "    for ids in prompts:  # batch 1: the latency setting speculation is for\n"
            "        plain, t_plain = timed(lambda: specjax.generate(\n"
            "            target, [ids], max_new_tokens=n_new, sampling=sampling, key=key,\n"
            "            eos_id=eos))\n"
            "        spec, t_spec = timed(lambda: specjax.speculative_generate(\n"
            "            target, draft, [ids], max_new_tokens=n_new, num_draft_tokens=4,\n"
            "            sampling=sampling, key=key, eos_id=eos))\n"
            "        if sampling.greedy:\n"
            "            assert np.array_equal(plain.tokens, spec.tokens)\n"
            "        n_spec, n_plain = int(spec.lengths[0]), int(plain.lengths[0])\n"
            "        rows.append((name, n_spec / t_spec, n_plain / t_plain,\n"
            "                     (n_spec / t_spec) / (n_plain / t_plain),\n"
            "                     spec.stats.acceptance_rate, spec.stats.mean_accepted_length))\n"
            "print(f\"{'mode':8s} {'spec tok/s':>10s} {'plain tok/s':>11s} {'speedup':>8s} \"\n"
            "      f\"{'accept':>7s} {'tau':>5s}\")\n"
            "for r in rows:\n"
            "    print(f'{r[0]:8s} {r[1]:10.1f} {r[2]:11.1f} {r[3]:8.2f} {r[4]:7.3f} '\n"
            "          f'{r[5]:5.2f}')\n"
            "print(decode(np.asarray(spec.tokens[0, : int(spec.lengths[0])]).tolist())[:400])"),
        new_markdown_cell(
            "## A published parallel draft (PARD): every draft of a step in one forward\n\n"
            "AMD publishes PARD drafts (An et al., ICLR 2026): small models of a family "
            "adapted to read the committed text followed by K - 1 mask tokens and to guess "
            "all K drafts in ONE forward, target-independent (one draft serves the whole "
            "family). `specjax_models.load_parallel_draft` reads them (the Hugging Face "
            "layout with the mask named by config.json's `pard_token`) and returns an exact "
            "`specjax.ParallelDraft`. On an accelerator with network access, "
            "`amd/PARD-Qwen2.5-0.5B` drafts for the Qwen2.5-1.5B target above; elsewhere the "
            "bundled pair's parallel draft is written in that published layout and read "
            "back through the same loader. One draft forward per step, whatever K: "
            "`draft_forwards` counts them."),
        new_code_cell(
            "pard = None\n"
            "if use_hub:\n"
            "    try:\n"
            "        pard = specjax_models.load_parallel_draft(\n"
            "            snapshot_download('amd/PARD-Qwen2.5-0.5B'), dtype='bfloat16')\n"
            "        pard_target, pard_prompts, pard_eos = target, prompts, eos\n"
            "    except Exception as error:  # network, memory\n"
            "        print('PARD-Qwen2.5-0.5B not available here:', type(error).__name__,\n"
            "              str(error)[:200]); pard = None\n"
            "if pard is None:\n"
            "    import json, pathlib, tempfile\n"
            "    bundled_parallel = specjax_models.load_bundled('parallel')\n"
            "    written = pathlib.Path(specjax_models.save_pretrained(bundled_parallel.lm,\n"
            "                                                          tempfile.mkdtemp()))\n"
            "    config = json.loads((written / 'config.json').read_text())\n"
            "    config['pard_token'] = bundled_parallel.mask_id  # as PARD's training writes it\n"
            "    (written / 'config.json').write_text(json.dumps(config))\n"
            "    pard = specjax_models.load_parallel_draft(written)\n"
            "    pard_target = specjax_models.load_bundled('target')\n"
            "    bytes_tok = specjax_models.ByteTokenizer()\n"
            "    pard_prompts = [bytes_tok.encode(p['text'])\n"
            "                    for p in specjax_models.bundled_prompts()\n"
            "                    if p['kind'] == 'continue'][:2]\n"
            "    pard_eos = None\n"
            "print(f'a parallel draft with mask token {pard.mask_id}')\n"
            "n_pard = 48 if SMALL else 128\n"
            "plain, t_plain = timed(lambda: specjax.generate(\n"
            "    pard_target, pard_prompts[:1], max_new_tokens=n_pard, sampling=specjax.GREEDY,\n"
            "    eos_id=pard_eos))\n"
            "for k in (4, 8):\n"
            "    spec, t_spec = timed(lambda: specjax.speculative_generate(\n"
            "        pard_target, pard, pard_prompts[:1], max_new_tokens=n_pard,\n"
            "        num_draft_tokens=k, sampling=specjax.GREEDY, eos_id=pard_eos))\n"
            "    assert np.array_equal(plain.tokens, spec.tokens)  # greedy: the target's text\n"
            "    n_spec, n_plain = int(spec.lengths[0]), int(plain.lengths[0])\n"
            "    steps = int(spec.stats.target_forwards.sum())\n"
            "    print(f'PARD, K = {k}: {(n_spec / t_spec) / (n_plain / t_plain):.2f}x plain '\n"
            "          f'decoding, tau {spec.stats.mean_accepted_length:.2f}, '\n"
            "          f'{int(spec.stats.draft_forwards.sum()) / steps:.0f} draft forward '\n"
            "          'per step')"),
        new_markdown_cell(
            "## A published EAGLE-3 head: Llama-3.1-8B-Instruct\n\n"
            "Practitioners download a head instead of training one. "
            "`specjax_models.load_drafter` reads the EAGLE authors' layout and the "
            "`speculators` layout that vLLM reads (also EAGLE-1/2, Medusa-1 and MiMo's MTP "
            "module) and returns an exact drafter; here the authors' EAGLE-3 head for "
            "Llama-3.1-8B-Instruct drafts an EAGLE-2 dynamic tree. It needs an accelerator "
            "with about 24 GB (A100, L4 at a squeeze, a TPU v5e-8 host) and a Hugging Face "
            "token that may read the gated Llama repository; elsewhere it falls back to the "
            "bundled target with its shipped EAGLE-3 head, after reading a random head "
            "written in the published layout (the same loading path; random drafts are "
            "rarely accepted, and the output is the target's all the same)."),
        new_code_cell(
            "# EAGLE-3's own setting on an accelerator; a CPU pays for each verified node.\n"
            "tree = (specjax.DynamicTree(num_nodes=60, max_depth=7, top_k=8) if accelerator\n"
            "        else specjax.DynamicTree(num_nodes=10, max_depth=6, top_k=2))\n"
            "llama = None\n"
            "if use_hub:\n"
            "    try:\n"
            "        llama_dir = snapshot_download('meta-llama/Llama-3.1-8B-Instruct')\n"
            "        head_dir = snapshot_download('yuhuili/EAGLE3-LLaMA3.1-Instruct-8B')\n"
            "        llama = specjax_models.from_pretrained(llama_dir, dtype='bfloat16')\n"
            "        head = specjax_models.load_drafter(head_dir, llama)\n"
            "        llama_tok = specjax_models.load_tokenizer(llama_dir)\n"
            "        questions = [llama_tok.apply_chat_template([{'role': 'user', 'content': q}])\n"
            "                     for q in ['Explain speculative decoding in three sentences.']]\n"
            "        llama_eos, llama_decode = llama_tok.eos_ids, llama_tok.decode\n"
            "    except Exception as error:  # gated repository, memory, network\n"
            "        print('Llama-3.1-8B + EAGLE-3 not available here:', type(error).__name__,\n"
            "              str(error)[:200]); llama = None\n"
            "if llama is None:\n"
            "    import tempfile\n"
            "    from specjax_models.published_layouts import (SyntheticShape,\n"
            "                                                  write_synthetic_drafter)\n"
            "    llama = specjax_models.load_bundled('target')\n"
            "    vocab, width = specjax_models.embedding_and_head(llama)[0].shape\n"
            "    written = write_synthetic_drafter(tempfile.mkdtemp(), 'eagle3-speculators',\n"
            "        SyntheticShape(d_model=int(width), vocab_size=int(vocab),\n"
            "                       num_layers=llama.num_layers, draft_vocab_size=200))\n"
            "    random_head = specjax_models.load_drafter(written, llama)\n"
            "    bytes_tok = specjax_models.ByteTokenizer()\n"
            "    questions = [bytes_tok.encode(p['text'])\n"
            "                 for p in specjax_models.bundled_prompts()\n"
            "                 if p['kind'] == 'continue'][:1]\n"
            "    check = specjax.speculative_generate(llama, random_head, questions,\n"
            "        max_new_tokens=24, sampling=specjax.GREEDY, tree=tree)\n"
            "    plain = specjax.generate(llama, questions, max_new_tokens=24,\n"
            "                             sampling=specjax.GREEDY)\n"
            "    assert np.array_equal(check.tokens, plain.tokens)\n"
            "    print('a random head in the speculators layout: the target\\'s greedy text, '\n"
            "          f'acceptance {check.stats.acceptance_rate:.2f}')\n"
            "    head = specjax_models.load_bundled('eagle3')  # trained on this target\n"
            "    llama_eos, llama_decode = None, bytes_tok.decode\n"
            "n_head = 48 if SMALL else 256\n"
            "plain, t_plain = timed(lambda: specjax.generate(\n"
            "    llama, questions, max_new_tokens=n_head, sampling=specjax.GREEDY,\n"
            "    eos_id=llama_eos))\n"
            "spec, t_spec = timed(lambda: specjax.speculative_generate(\n"
            "    llama, head, questions, max_new_tokens=n_head, sampling=specjax.GREEDY,\n"
            "    eos_id=llama_eos, tree=tree))\n"
            "assert np.array_equal(plain.tokens, spec.tokens)\n"
            "n_spec, n_plain = int(spec.lengths[0]), int(plain.lengths[0])\n"
            "print(f'EAGLE-3 dynamic tree: {n_spec / t_spec:.1f} tokens/s against '\n"
            "      f'{n_plain / t_plain:.1f} plain '\n"
            "      f'({(n_spec / t_spec) / (n_plain / t_plain):.2f}x), '\n"
            "      f'tau {spec.stats.mean_accepted_length:.2f}')\n"
            "print(llama_decode(np.asarray(spec.tokens[0, : n_spec]).tolist())[:400])"),
    ]


def train_a_draft():
    return [
        new_markdown_cell(
            "# Train a draft: DistillSpec with optax\n\n"
            "A fresh draft is first trained briefly on next-token prediction, then "
            "distilled towards the bundled target (forward KL of the target's distribution, "
            "`specjax.training.distill`). Acceptance is measured on held-out prompts before "
            "and after distillation. Runtime: about a minute on a CPU in the notebook's "
            "small mode, longer at full size (more steps; a GPU/TPU makes it quick)."),
        new_code_cell(INSTALL),
        new_code_cell(SETUP + PLOTS + "from flax import nnx\n"
                      "from specjax_models.recipes import stdlib_corpus as corpus_lib\n"
                      "from specjax.training import DistillConfig, TrainConfig, distill, train\n"),
        new_code_cell(
            "target = specjax_models.load_bundled('target')\n"
            "tok = specjax_models.ByteTokenizer()\n"
            "corpus = corpus_lib.build_corpus(max_files=60 if SMALL else None)\n"
            "steps = 30 if SMALL else 1500\n"
            "batch, seq = (8, 128) if SMALL else (32, 256)\n"
            "batches = lambda step: corpus_lib.sample_windows(corpus.train, batch, seq + 1,\n"
            "                                                 SEED, step)\n"
            "heldout = [corpus_lib.sample_windows(corpus.train, batch, seq + 1, SEED + 99, 0)]\n"
            "draft_config = specjax_models.TransformerConfig(\n"
            "    vocab_size=tok.vocab_size, num_layers=1,\n"
            "    d_model=96, num_heads=3, num_kv_heads=1, d_ff=256, max_seq_len=2048)\n"
            "fresh = specjax.CausalLM.from_nnx(specjax_models.Transformer(draft_config,\n"
            "                                                     rngs=nnx.Rngs(SEED)))\n"
            "pretrained = train(fresh, batches, TrainConfig(steps=steps, learning_rate=3e-3,\n"
            "    warmup_steps=steps // 10, log_every=max(1, steps // 10), eval_every=steps),\n"
            "    heldout=heldout, pad_id=tok.pad_id, progress=False)\n"
            "print(f'pre-trained draft: held-out '\n"
            "      f'{pretrained.heldout_bits_per_token:.2f} bits/byte')"),
        new_code_cell(
            "distilled = distill(pretrained.lm, target, batches,\n"
            "    TrainConfig(steps=steps, learning_rate=2e-3, warmup_steps=steps // 10,\n"
            "                log_every=max(1, steps // 10), eval_every=steps),\n"
            "    DistillConfig(divergence='fkl'), heldout=heldout, pad_id=tok.pad_id,\n"
            "    progress=False)\n"
            "print(f'distilled: held-out forward KL {distilled.heldout_loss:.3f} nats/position')"),
        new_code_cell(
            "prompts = [tok.encode(p['text']) for p in specjax_models.bundled_prompts()\n"
            "           if p['kind'] == 'continue'][: 4 if SMALL else 16]\n"
            "ks = [1, 2, 4] if SMALL else [1, 2, 4, 6, 8]\n"
            "result = {}\n"
            "for name, d in [('before distillation', pretrained.lm), ('after', distilled.lm)]:\n"
            "    result[name] = [specjax.speculative_generate(target, d, prompts,\n"
            "        max_new_tokens=32 if SMALL else 96, num_draft_tokens=k,\n"
            "        sampling=specjax.SamplingConfig(temperature=1.0),\n"
            "        key=jax.random.key(SEED)).stats.acceptance_rate for k in ks]\n"
            "    print(name, np.round(result[name], 3))\n"
            "for name, values in result.items():\n"
            "    plt.plot(ks, values, 'o-', label=name)\n"
            "plt.xlabel('K'); plt.ylabel('acceptance rate (T=1)'); plt.legend()\n"
            "plt.grid(alpha=0.3)\n"
            "plt.title('Draft acceptance before and after distillation'); plt.show()"),
    ]


SHARDED_SETUP = """\
import os  # before jax starts: 8 virtual devices when the backend is a CPU
os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=8")
"""

SHARDED_DECODING = """\
n = len(jax.devices())  # 8 heads: a model axis of 1, 2, 4 or 8 devices splits them whole
meshes = {"one device": None, f"data={n}": f"data={n}"}
if 8 % n == 0:
    meshes[f"model={n}"] = f"model={n}"
if n > 4 and n % 4 == 0:
    meshes[f"data={n // 4},model=4"] = f"data={n // 4},model=4"
config = specjax_models.TransformerConfig(
    vocab_size=8192, num_layers=4 if SMALL else 12, d_model=512, num_heads=8,
    num_kv_heads=8, d_ff=1536, max_seq_len=512)
model = specjax_models.Transformer(config, rngs=nnx.Rngs(SEED))
target = specjax.CausalLM.from_nnx(model)
draft = specjax.CausalLM.from_nnx(specjax_models.first_layers(model, 1))
prompts = [[1 + (13 * r + i) % 8000 for i in range(24)] for r in range(n)]
greedy = dict(max_new_tokens=16 if SMALL else 64, sampling=specjax.GREEDY)
reference = np.asarray(specjax.generate(target, prompts, **greedy).tokens)
for name, spec in meshes.items():
    mesh = spec and mesh_from_spec(spec)
    lm = target if not mesh else specjax_models.shard(target, mesh, default_rules(mesh))
    start = time.perf_counter()
    out = specjax.speculative_generate(lm, draft, prompts, num_draft_tokens=4, **greedy)
    seconds = time.perf_counter() - start
    same = bool(np.array_equal(np.asarray(out.tokens), reference))
    print(f"{name:>16}: the same tokens as plain decoding on one device: {same}; "
          f"{seconds:.1f} s with compilation")
    assert same
"""

SHARDED_COLLECTIVES = """\
# What the partitioner put in a one-token forward on a model axis of all the devices.
from specjax_models.sharded import forward_collectives

if config.num_heads % n == 0:
    mesh = mesh_from_spec(f"model={n}")
    found = forward_collectives(specjax_models.shard(target, mesh, default_rules(mesh)), n)
    print(found, f"for {config.num_layers} layers: one all-reduce after attention and one "
          "after the MLP per layer, one for the vocabulary-split embedding")
"""


SEVERAL_HOSTS = """\
## Several hosts

A pod slice larger than one host (v4-16 and up, v5e-16 and up) runs one Python process
per host, each with this notebook's code as a script, joined by
`jax.distributed.initialize()` (no arguments on a TPU pod). `jax.devices()` then lists
every host's chips, so `mesh_from_spec("data=4,model=4")` spans them (rows across hosts,
a model's shards within one). Each host passes its own prompts through
`specjax.distributed.gather_prompts`, which returns the whole batch and the rows that are
this host's; every decoder returns every row on every host:

```python
jax.distributed.initialize()
mesh = mesh_from_spec("data=4,model=4")
target = specjax_models.shard(target, mesh, default_rules(mesh))
prompts, mine = specjax.distributed.gather_prompts(my_prompts)
out = specjax.speculative_generate(target, draft, prompts, max_new_tokens=64,
                                   key=jax.random.key(0))   # the same key on every host
my_tokens = out.tokens[mine]
```
"""


def several_devices():
    return [
        new_markdown_cell(
            "# Several devices: a model sharded over a mesh\n\n"
            "A TPU slice has 4-8 chips and a GPU machine several GPUs. "
            "`specjax_models.shard` places a model on a `jax.sharding.Mesh` by "
            "`specjax.sharding` rules (data parallel rows, Megatron tensor parallel heads "
            "and MLP columns, or both) and every decoder runs under it unchanged, each row's "
            "tokens the same as on one device. On a CPU runtime the first cell makes 8 "
            "virtual devices (they share the cores: correct, not faster)."),
        new_code_cell(INSTALL),
        new_code_cell(SHARDED_SETUP + SETUP + "from flax import nnx\n"
                      "from specjax.runtime.sharding import default_rules, mesh_from_spec\n"),
        new_code_cell(SHARDED_DECODING),
        new_code_cell(SHARDED_COLLECTIVES),
        new_markdown_cell(SEVERAL_HOSTS),
    ]


NOTEBOOKS = {"01_quickstart.ipynb": quickstart, "02_exactness.ipynb": exactness,
             "03_real_models.ipynb": real_models, "04_train_a_draft.ipynb": train_a_draft,
             "05_several_devices.ipynb": several_devices}


def execute(name: str, timeout: int = 1200) -> None:
    """Run a written notebook top to bottom and save it with its outputs (the committed
    notebooks carry them, so their plots show in a GitHub preview)."""
    import nbclient

    notebook = nbformat.read(HERE / name, as_version=4)
    nbclient.NotebookClient(notebook, timeout=timeout, kernel_name="python3",
                            resources={"metadata": {"path": str(HERE)}}).execute()
    nbformat.write(notebook, HERE / name)
    print(f"executed {HERE / name}")


def main():
    import sys

    for name, cells in NOTEBOOKS.items():
        notebook = new_notebook(cells=cells(), metadata={
            "kernelspec": {"name": "python3", "display_name": "Python 3", "language": "python"},
            "language_info": {"name": "python"},
            "accelerator": "GPU", "colab": {"provenance": []}})
        nbformat.write(notebook, HERE / name)
        if "--execute" in sys.argv:
            execute(name)
        print("wrote", HERE / name)


if __name__ == "__main__":
    main()
