"""Verification: what a step keeps of its drafts and what it emits after them.

The exact rules: token-level rejection sampling on a chain (`rejection`) and on a tree
(`tree_acceptance`), block verification of a chain (`block_verification`), traversal
verification of a tree (`traversal_verification`); the lossy one, typical acceptance
(`typical_acceptance`, never a default); and `rules`, which resolves a decoder's
`verification=` name to the rule that runs and names the rule that ran. The package's
attributes are `rules`' public names (`specjax.verification.rule_that_ran`, ...)."""

from __future__ import annotations

from specjax.runtime.lazy import lazy_attributes

# Public name -> the module that defines it; any other name loads as a submodule.
_SOURCES = {
    "EXACT_RULES": "specjax.verification.rules",
    "RULE_NAMES": "specjax.verification.rules",
    "GREEDY_RULE": "specjax.verification.rules",
    "Verification": "specjax.verification.rules",
    "resolve_verification": "specjax.verification.rules",
    "verification_name": "specjax.verification.rules",
    "rule_that_ran": "specjax.verification.rules",
    "is_lossy_rule_name": "specjax.verification.rules",
    "offered_drafts": "specjax.verification.rules",
    "verify_chain": "specjax.verification.rules",
    "verify_tree": "specjax.verification.rules",
}

__getattr__, __dir__ = lazy_attributes(__name__, _SOURCES, globals())
