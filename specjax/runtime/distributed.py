"""Several processes (hosts) decoding together: `jax.distributed`, one process per host.

With `jax.distributed.initialize()` every process runs the same program over a global
mesh (`specjax.sharding.mesh_from_spec` over `jax.devices()`, which lists every
process's devices). The decoders take the same arguments on every process; their
results are read back on each one (`fetch`), so `speculative_generate` and its relatives
return ordinary arrays on every process. Prompts usually arrive split by process (each
host reads its own share of a file or a queue): `gather_prompts` hands every process the
whole batch and the rows that are its own.

    jax.distributed.initialize()                  # on each host (TPU pods, SLURM: no args)
    mesh = specjax.sharding.mesh_from_spec("data=8,model=4")
    target = specjax_models.from_pretrained(path, mesh=mesh)  # each host reads its shards
    prompts, mine = specjax.distributed.gather_prompts(my_prompts)
    out = specjax.speculative_generate(target, draft, prompts, max_new_tokens=64, key=key)
    my_tokens = out.tokens[mine]

Every process must pass the same key and settings (they are one program's inputs);
per-row settings (one `SamplingConfig` per row) cover the whole gathered batch, in its
order. In one process everything here is the identity.
"""

from __future__ import annotations

from collections.abc import Sequence

import jax
import numpy as np


def fetch(tree):
    """`jax.device_get(tree)` that also reads arrays spanning other processes' devices (a
    row-split decode state on a multi-host mesh): those are all-gathered, so every process
    gets every row. A collective when any leaf spans processes: all processes call it."""
    leaves, treedef = jax.tree.flatten(tree)
    spans = [isinstance(x, jax.Array) and not x.is_fully_addressable for x in leaves]
    if not any(spans):
        return jax.device_get(tree)
    from jax.experimental import multihost_utils

    global_leaves = [x for x, span in zip(leaves, spans, strict=True) if span]
    gathered = iter(multihost_utils.process_allgather(global_leaves, tiled=True))
    host = [np.asarray(next(gathered)) if span else jax.device_get(x)
            for x, span in zip(leaves, spans, strict=True)]
    return jax.tree.unflatten(treedef, host)


def process_local(x):
    """`x` unchanged when this process can read all of it, else its whole value on this
    process's default device (`fetch`): what a decoder returns to its caller."""
    if isinstance(x, jax.Array) and not x.is_fully_addressable:
        return jax.device_put(fetch(x))
    return x


def gather_prompts(local_prompts: Sequence[Sequence[int]]) -> tuple[list[list[int]], slice]:
    """Every process's prompts, in process order, and the slice of rows that are this
    process's own: `(prompts, rows)`. Each process passes its own list (any length, zero
    included; prompts of any lengths); a collective, so all processes call it. With one
    process: `(list(local_prompts), slice(0, len(local_prompts)))`."""
    rows = [[int(t) for t in prompt] for prompt in local_prompts]
    if jax.process_count() == 1:
        return rows, slice(0, len(rows))
    from jax.experimental import multihost_utils

    # A collective needs the same shapes everywhere: first each process's (count, longest
    # prompt) [processes, 2], then its rows padded to the largest of both.
    sizes = np.asarray(multihost_utils.process_allgather(
        np.asarray([len(rows), max((len(r) for r in rows), default=0)], np.int32)))
    counts = sizes[:, 0]
    height, width = (max(int(n), 1) for n in sizes.max(axis=0))
    padded = np.zeros((height, width), np.int32)
    lengths = np.zeros((height,), np.int32)
    for i, row in enumerate(rows):
        padded[i, : len(row)] = row
        lengths[i] = len(row)
    all_padded, all_lengths = (np.asarray(a) for a in multihost_utils.process_allgather(
        (padded, lengths)))  # [processes, height, width], [processes, height]
    prompts = [all_padded[p, i, : all_lengths[p, i]].tolist()
               for p in range(len(counts)) for i in range(counts[p])]
    start = int(counts[: jax.process_index()].sum())
    return prompts, slice(start, start + len(rows))
