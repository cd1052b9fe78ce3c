"""Decoding: the speculative step (draft K, verify in ONE target forward, accept the
longest valid prefix per row), its counters, the in-place choice of verify width, the
batch loops (`speculative_generate`, plain `generate`), streaming, the host-side input
checks and capacity plan, the statistics read from a finished state, and the sampling
settings with the ONE logits warper every sampler and verifier shares (DESIGN.md sections
3-5 and 7). The verification rules live in `specjax.verification`, proposal shapes in
`specjax.trees`."""

from __future__ import annotations

from specjax.runtime.lazy import lazy_attributes

# Public name -> the module that defines it; any other name loads as a submodule.
_SOURCES = {
}

__getattr__, __dir__ = lazy_attributes(__name__, _SOURCES, globals())
