"""The model as the algorithm sees it: `CausalLM` (a pytree of parameters with a pure
apply function, the contract every decoder and drafter consumes), attention over a KV cache
whose cost follows the tokens in it, and rotary position embeddings shared with the model
package and the feature heads. Nothing here knows a checkpoint format or a model family:
those live in `specjax_models`, which builds CausalLMs."""

from __future__ import annotations

from specjax.runtime.lazy import lazy_attributes

# Public name -> the module that defines it; any other name loads as a submodule.
_SOURCES = {
}

__getattr__, __dir__ = lazy_attributes(__name__, _SOURCES, globals())
