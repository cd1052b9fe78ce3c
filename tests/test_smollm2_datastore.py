"""specjax_models.recipes.smollm2_datastore: the shipped datastore (SmolLM2's own answers,
none to an evaluation prompt) and the recipe's resumable answer chunks."""

import numpy as np

from benchmarks.real_prompts import PROMPTS
from specjax.drafters.datastore import SEPARATOR, Datastore
from specjax.runtime.files import save_npz_atomically
from specjax_models import SMOLLM2_DATASTORE
from specjax_models.recipes import smollm2_datastore
from specjax_models.recipes.smollm2_prompts import chat_prompts


def test_no_evaluation_prompt_is_among_the_datastores_prompts():
    evaluation = {prompt for prompts in PROMPTS.values() for prompt in prompts}
    assert not evaluation & set(chat_prompts(512))


def test_the_shipped_datastore_holds_smollm2_answers():
    store = Datastore.load(SMOLLM2_DATASTORE)
    assert store.vocab_size == 49152
    assert store.num_documents == 512 + 128 and store.num_tokens > 50_000
    stream = store.stream
    ends = np.flatnonzero(stream == SEPARATOR) - 1
    # About half the answers end at SmolLM2's end-of-turn token (<|im_end|>, id 2), the
    # rest were cut at the recipe's 192 tokens.
    assert np.mean(stream[ends] == 2) > 0.4
    assert np.max(np.diff(np.concatenate([[-1], ends + 1]))) <= 192 + 1


def test_answers_come_from_the_chunks_on_disk(tmp_path):
    first, second = np.array([5, 6, 2], np.int32), np.array([7, 2], np.int32)
    save_npz_atomically(tmp_path / smollm2_datastore.CHUNK.format(stage="chat", index=0),
                        tokens=np.concatenate([first, second]), lengths=np.array([3, 2]))
    # No model: a chunk on disk is read, never generated again.
    found = smollm2_datastore.answers(None, None, tmp_path, "chat", ["a", "b"], 8, batch=2)
    assert [a.tolist() for a in found] == [first.tolist(), second.tolist()]
