"""What runs the programs, apart from what they compute: sharding over a mesh and
several hosts, the persistent compilation cache, background compiles and XLA options,
files that survive a kill, timing with compilation kept apart, content fingerprints of
weights, lowering for TPU and CUDA from any machine (`portability`), and the lazy public
names of `specjax` and `specjax_models`."""

from __future__ import annotations

from specjax.runtime.lazy import lazy_attributes

__getattr__, __dir__ = lazy_attributes(__name__, {}, globals())  # submodules on first use
