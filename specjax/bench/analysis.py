"""Analytical speed model of speculative decoding (Leviathan et al. 2022, section 3).

With an i.i.d. per-position acceptance rate alpha and K drafts per step, the expected
tokens per target forward is tau = (1 - alpha^(K+1)) / (1 - alpha) (K+1 when alpha = 1).
If a draft step costs c target steps and a (K+1)-token verify forward costs v target
steps (v ~ 1 when decoding is memory-bound), the ideal speedup over plain decoding is
tau / (K c + v).

Block verification keeps more than the token rule from the same drafts: its
per-position rates come from `block_acceptance_by_position(p, q, K)` (exact for i.i.d.
drafts), and tau = 1 + their sum.

A parallel draft (PARD, `specjax.drafters.ParallelDraft`) drafts all K tokens in one
forward whose cost C(K) hardly grows with K where the forward is memory-bound, but its
later offsets guess from fewer tokens, so the acceptance differs per offset:
`parallel_ideal_speedup(alphas, C, v)` = tau / (C + v) with tau = 1 + sum_j prod_{i<=j}
alpha_i.

A mixture-of-experts target (`moe_verify_cost_ratio`) reads, per MoE layer, only the
experts its tokens are routed to: one token reads k of E experts, and n verified tokens
touch E (1 - (1 - k/E)^n) of them on average (uniform routing), so v grows with K where
a dense model's stays near 1 while memory-bound.
"""

from __future__ import annotations

import numpy as np


def _check_alpha(alpha):
    alpha = np.asarray(alpha, np.float64)
    if np.any((alpha < 0) | (alpha > 1)) or np.any(np.isnan(alpha)):
        raise ValueError(f"acceptance rate alpha must be in [0, 1], got {alpha}")
    return alpha


def _check_k(num_draft_tokens):
    k = np.asarray(num_draft_tokens)
    if not np.issubdtype(k.dtype, np.integer) or np.any(k < 1):
        raise ValueError(f"num_draft_tokens must be integers >= 1, got {num_draft_tokens}")
    return k


def expected_tokens_per_forward(alpha, num_draft_tokens):
    """E[tokens per target forward] = (1 - alpha^(K+1)) / (1 - alpha); broadcasts."""
    alpha, k = _check_alpha(alpha), _check_k(num_draft_tokens)
    safe = np.where(alpha == 1.0, 0.5, alpha)
    result = np.where(alpha == 1.0, k + 1.0, (1 - safe ** (k + 1)) / (1 - safe))
    return float(result) if np.ndim(result) == 0 else result


def expected_acceptance_rate(p, q) -> float:
    """Per-position acceptance probability of speculative sampling: sum_x min(p, q)
    (= 1 - total variation distance)."""
    p, q = np.asarray(p, np.float64), np.asarray(q, np.float64)
    if p.shape != q.shape:
        raise ValueError(f"p and q must have the same shape, got {p.shape} and {q.shape}")
    return float(np.minimum(p, q).sum(-1)) if p.ndim == 1 else np.minimum(p, q).sum(-1)


def block_acceptance_by_position(p, q, num_draft_tokens: int, *,
                                 max_states: int = 200_000) -> np.ndarray:
    """P(a step keeps at least j drafts), j = 1..K, under block verification
    (specjax.verification.block_verification) in the i.i.d. model: every draft drawn from q, the
    target's distribution p at every position. Exact, by dynamic programming over the
    distinct values of the running weight w_j = min(1, w_{j-1} p(x_j) / q(x_j)); their
    number grows with K and the vocabulary, and more than `max_states` is refused. The
    token rule's counterpart is alpha^j with alpha = `expected_acceptance_rate(p, q)`;
    for a deterministic draft, pass q one-hot at its token."""
    p, q = np.asarray(p, np.float64), np.asarray(q, np.float64)
    if p.ndim != 1 or p.shape != q.shape:
        raise ValueError(f"p and q must be 1-D distributions of the same size, got shapes "
                         f"{p.shape} and {q.shape}")
    for name, dist in (("p", p), ("q", q)):
        if np.any(~np.isfinite(dist)) or np.any(dist < 0) or abs(dist.sum() - 1) > 1e-6:
            raise ValueError(f"{name} must be a probability distribution (non-negative, "
                             f"summing to 1), got {dist}")
    k = int(_check_k(num_draft_tokens))
    drawn = np.flatnonzero(q > 0)
    ratio, q_drawn = p[drawn] / q[drawn], q[drawn]

    def keep(w: float) -> float:  # h(w): the probability that a prefix of weight w is kept
        residual = np.maximum(w * p - q, 0.0).sum()
        return 1.0 if residual + 1.0 - w <= 0 else residual / (residual + 1.0 - w)

    # Forward: the distribution of w_j (values rounded to merge equal products).
    layers = [{1.0: 1.0}]
    for _ in range(k):
        nxt: dict = {}
        for w, mass in layers[-1].items():
            for r, qx in zip(ratio, q_drawn, strict=True):
                key = round(min(1.0, w * r), 12)
                nxt[key] = nxt.get(key, 0.0) + mass * qx
        if len(nxt) > max_states:
            raise ValueError(f"block_acceptance_by_position: more than {max_states} distinct "
                             f"weights by draft {len(layers)}; pass a smaller K or vocabulary "
                             "(or raise max_states)")
        layers.append(nxt)
    # Backward: none_after[j](w) = P(no prefix j..K is kept | w_j = w).
    none_after = [None] * (k + 1)
    none_after[k] = {w: 1.0 - w for w in layers[k]}
    for j in range(k - 1, 0, -1):
        none_after[j] = {w: (1.0 - keep(w)) * sum(
            qx * none_after[j + 1][round(min(1.0, w * r), 12)]
            for r, qx in zip(ratio, q_drawn, strict=True)) for w in layers[j]}
    return np.array([1.0 - sum(mass * none_after[j][w] for w, mass in layers[j].items())
                     for j in range(1, k + 1)])


def ideal_speedup(alpha, num_draft_tokens, cost_ratio, verify_cost_ratio=1.0):
    """tau / (K c + v): speedup over plain decoding if nothing but forwards costs time."""
    if np.any(np.asarray(cost_ratio) < 0) or np.any(np.asarray(verify_cost_ratio) <= 0):
        raise ValueError("cost_ratio must be >= 0 and verify_cost_ratio > 0, got "
                         f"{cost_ratio} and {verify_cost_ratio}")
    k = _check_k(num_draft_tokens)
    return expected_tokens_per_forward(alpha, k) / (k * np.asarray(cost_ratio)
                                                    + np.asarray(verify_cost_ratio))


def expected_tokens_by_position(alphas) -> float:
    """tau = 1 + sum_j prod_{i<=j} alpha_i: the token rule's expected tokens per step when
    offset i's draft is accepted with its own rate alpha_i (a parallel draft's)."""
    alphas = _check_alpha(alphas)
    if alphas.ndim != 1 or alphas.size < 1:
        raise ValueError(f"alphas must be a 1-D sequence of per-offset rates, got shape "
                         f"{alphas.shape}")
    return float(1.0 + np.sum(np.cumprod(alphas)))


def parallel_ideal_speedup(alphas, block_cost_ratio, verify_cost_ratio=1.0) -> float:
    """tau / (C + v) for K = len(alphas) drafts from ONE draft forward costing C target
    steps (the whole block's cost, measured: it does not grow like K c), per-offset
    acceptance `alphas`, and a (K+1)-token verify costing v."""
    if not block_cost_ratio >= 0 or not verify_cost_ratio > 0:
        raise ValueError("block_cost_ratio must be >= 0 and verify_cost_ratio > 0, got "
                         f"{block_cost_ratio} and {verify_cost_ratio}")
    return expected_tokens_by_position(alphas) / (block_cost_ratio + verify_cost_ratio)


def best_num_draft_tokens(alpha: float, cost_ratio: float, verify_cost_ratio: float = 1.0,
                          max_num_draft_tokens: int = 32) -> tuple[int, float]:
    """The K in [1, max] that maximises `ideal_speedup`, and that speedup."""
    ks = np.arange(1, max_num_draft_tokens + 1)
    speedups = np.array([ideal_speedup(alpha, int(k), cost_ratio, verify_cost_ratio)
                         for k in ks])
    best = int(np.argmax(speedups))
    return int(ks[best]), float(speedups[best])


def measure_rank_acceptance(target, draft, prompts, sampling, *, num_ranks: int = 8,
                            max_new_tokens: int = 64, key=None,
                            method: str = "greedy") -> np.ndarray:
    """The per-rank acceptance vector of a draft/target pair, for
    `TreeShape.sequoia`: decode `prompts` with a one-level tree of the draft's top
    `num_ranks` children (`DraftModel(draft, method)`) and return, for each rank r, the
    fraction of steps whose accepted child had rank r."""
    from specjax.decoding.speculative_loop import speculative_generate
    from specjax.drafters.draft_model import DraftModel
    from specjax.trees.shapes import TreeShape

    star = TreeShape.from_paths([[r] for r in range(num_ranks)])
    out = speculative_generate(target, DraftModel(draft, method), prompts,
                               max_new_tokens=max_new_tokens, sampling=sampling, key=key,
                               tree=star)
    return np.asarray(out.stats.accepted_per_position, np.float64)


def moe_experts_touched(num_tokens, experts_per_token: int, num_experts: int):
    """Expected distinct experts a layer reads for `num_tokens` tokens each routed to
    `experts_per_token` of `num_experts` (uniformly, independently across tokens):
    E (1 - (1 - k/E)^n). 1 token: k; many: E."""
    k, experts = int(experts_per_token), int(num_experts)
    if not 1 <= k <= experts:
        raise ValueError(f"experts_per_token must be in [1, num_experts={experts}], got {k}")
    tokens = np.asarray(num_tokens, np.float64)
    if np.any(tokens < 1):
        raise ValueError(f"num_tokens must be >= 1, got {num_tokens}")
    return experts * (1.0 - (1.0 - k / experts) ** tokens)


def moe_verify_cost_ratio(num_tokens, experts_per_token: int, num_experts: int,
                          routed_fraction: float):
    """v(n): the cost of an n-token forward of a memory-bound mixture-of-experts model over
    a one-token forward's, when each touched expert's weights are read once (a grouped
    matmul): (1 - f) + f * touched(n) / k, with f = `routed_fraction`, the share of a
    one-token forward's weight bytes in its k routed experts (1 - f: attention, shared
    experts, dense layers, embeddings; `moe_routed_fraction`). A dense model is f = 0:
    v = 1 whatever n."""
    if not 0.0 <= routed_fraction <= 1.0:
        raise ValueError(f"routed_fraction must be in [0, 1], got {routed_fraction}")
    touched = moe_experts_touched(num_tokens, experts_per_token, num_experts)
    return (1.0 - routed_fraction) + routed_fraction * touched / experts_per_token


def moe_routed_fraction(other_params: int, params_per_expert: int,
                        experts_per_token: int) -> float:
    """f of `moe_verify_cost_ratio`: a one-token forward reads `other_params` (everything
    but the routed experts) and k experts of `params_per_expert` each (summed over the
    MoE layers)."""
    if other_params < 0 or params_per_expert <= 0 or experts_per_token < 1:
        raise ValueError("other_params must be >= 0, params_per_expert > 0 and "
                         "experts_per_token >= 1")
    routed = experts_per_token * params_per_expert
    return routed / (routed + other_params)

