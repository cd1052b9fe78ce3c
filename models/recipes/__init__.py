"""How the shipped models were made: recipes that train, not what a user imports to decode.

- `stdlib_corpus`: the byte-level corpus of this Python's standard library (held-out files
  split by name) that the bundled pair and its heads train on;
- `train_bundled.sh`, `train_heads.sh`: the bundled pair and its four feature heads, from
  scratch, resumable (`bash models/recipes/train_bundled.sh WORK_DIR`);
- `head_cards`: the bundled heads' MODEL_CARDs, from their metadata and benchmarks;
- `smollm2_prompts`, `smollm2_head`, `smollm2_draft`: SmolLM2-135M-Instruct's EAGLE-3 head
  and distilled layer draft, trained on its own answers to prompts written for this
  project (`specjax train-drafter --model smollm2`).

The core of the model package never imports a recipe (tests/test_layers.py checks it).
"""
