"""specjax_models.published_weights: a published drafter's weight files, tensors taken by
name and shape, and refusals that name the file and the tensor."""

import numpy as np
import pytest
from safetensors.numpy import save_file

from specjax_models.published_weights import read_weights


def test_tensors_are_taken_by_name_shape_and_transposed(tmp_path):
    w = np.arange(6, dtype=np.float32).reshape(2, 3)
    save_file({"fc.weight": w, "norm.weight": np.ones(3, np.float32)},
              str(tmp_path / "model.safetensors"))
    weights = read_weights(tmp_path)
    np.testing.assert_array_equal(np.asarray(weights.take("fc.weight", (2, 3), True)), w.T)
    with pytest.raises(ValueError, match="tensor 'norm.weight' has no place"):
        weights.finish()
    weights.ignore("norm.weight")
    weights.finish()


def test_a_missing_or_misshapen_tensor_or_no_weights_is_refused_by_name(tmp_path):
    with pytest.raises(FileNotFoundError, match="holds no drafter weights"):
        read_weights(tmp_path)
    save_file({"fc.weight": np.zeros((2, 3), np.float32)}, str(tmp_path / "a.safetensors"))
    weights = read_weights(tmp_path)
    with pytest.raises(ValueError, match=r"lack 'lm_head.weight'; no tensor shares its "
                                         r"prefix .*saved without this tensor"):
        weights.take("lm_head.weight")
    with pytest.raises(ValueError, match=r"shape \(2, 3\), expected \(3, 2\)"):
        weights.take("fc.weight", (3, 2))


def test_a_missing_tensor_of_a_module_lists_the_modules_tensors_not_the_targets(tmp_path):
    """DeepSeek's MTP module inside a target checkpoint: a missing hnorm lists what
    model.layers.3.* holds, not the target's other tensors, and does not advise a download
    of the same files."""
    tensors = {f"model.layers.{i}.mlp.up_proj.weight": np.zeros((2, 2), np.float32)
               for i in range(3)}
    tensors.update({"model.layers.3.enorm.weight": np.ones(2, np.float32),
                    "model.layers.3.eh_proj.weight": np.zeros((2, 4), np.float32),
                    "model.embed_tokens.weight": np.zeros((5, 2), np.float32)})
    save_file(tensors, str(tmp_path / "model.safetensors"))
    with pytest.raises(ValueError) as error:
        read_weights(tmp_path).take("model.layers.3.hnorm.weight")
    message = str(error.value)
    assert "model.layers.3.* holds model.layers.3.eh_proj.weight, " \
           "model.layers.3.enorm.weight" in message
    assert "up_proj" not in message and "embed_tokens" not in message
    assert "download" not in message
