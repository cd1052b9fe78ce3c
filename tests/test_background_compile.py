"""Compiling the next program in a background thread: the later call finds it compiled,
errors of the background compilation are left to that call, and the prefill's result and
errors come through unchanged."""

import contextlib
import functools
import threading

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import specjax
from specjax.runtime.background_compile import while_compiling


@contextlib.contextmanager
def compilations():
    """The names of the programs compiled (or loaded from the persistent cache) inside."""
    names: list[str] = []

    def listen(event, duration, **kwargs):
        if event == "/jax/core/compile/backend_compile_duration":
            names.append(kwargs.get("fun_name", ""))

    jax.monitoring.register_event_duration_secs_listener(listen)
    try:
        yield names
    finally:
        jax.monitoring.unregister_event_duration_listener(listen)


@functools.partial(jax.jit, static_argnames=("scale",))
def _scaled_sum(x, *, scale):
    return jnp.sum(x * scale, axis=0)


def test_the_next_program_is_compiled_meanwhile_and_not_again():
    x = jnp.arange(12.0).reshape(3, 4)
    threads = []

    def compile_next():
        threads.append(threading.current_thread())
        _scaled_sum.lower(jax.ShapeDtypeStruct(x.shape, x.dtype), scale=3).compile()

    with compilations() as compiled:
        result = while_compiling(compile_next, lambda: "prefilled")
    assert result == "prefilled"
    assert threads and threads[0] is not threading.main_thread()
    assert any("_scaled_sum" in name for name in compiled)
    with compilations() as compiled:
        out = _scaled_sum(x, scale=3)
    assert compiled == []  # the call found the program compiled
    np.testing.assert_allclose(out, np.arange(12.0).reshape(3, 4).sum(0) * 3)


def test_a_failed_background_compilation_is_left_to_the_real_call():
    def compile_next():
        raise RuntimeError("cannot lower")

    assert while_compiling(compile_next, lambda: 7) == 7


def test_the_foreground_error_comes_through_after_the_thread_ends():
    finished = threading.Event()

    def compile_next():
        finished.wait(0.2)
        finished.set()

    def run():
        raise ValueError("bad prompt")

    with pytest.raises(ValueError, match="bad prompt"):
        while_compiling(compile_next, run)
    assert finished.is_set()  # joined before the error left


def test_without_a_next_program_it_just_runs():
    assert while_compiling(None, lambda: 3) == 3


@pytest.mark.parametrize("placed", [False, True], ids=["weights unplaced", "weights on a device"])
def test_speculative_decoding_compiles_each_program_once(tiny_lm, close_draft, placed,
                                                        monkeypatch):
    """Weights committed to a device (as a loaded checkpoint's are) commit the prefill's
    outputs there: the loop compiled meanwhile must be lowered for that placement, or the
    real call compiles it a second time."""
    if placed:
        device = jax.devices()[0]
        tiny_lm = tiny_lm.with_params(jax.device_put(tiny_lm.params, device))
        close_draft = close_draft.with_params(jax.device_put(close_draft.params, device))
    import specjax.decoding.speculative_loop as loop

    monkeypatch.setattr(loop, "_COMPILED_NEXT", set())  # as in a fresh process
    jax.clear_caches()
    with compilations() as compiled:
        out = specjax.speculative_generate(tiny_lm, close_draft, [[1, 2, 3, 4, 5]],
                                           max_new_tokens=9, num_draft_tokens=3,
                                           sampling=specjax.GREEDY)
        chunks = list(specjax.speculative_stream(tiny_lm, close_draft, [[1, 2, 3, 4, 5]],
                                                 max_new_tokens=9, num_draft_tokens=3,
                                                 sampling=specjax.GREEDY))
    for program in ("_init_state", "_speculative_loop", "compiled_step"):
        assert sum(program in name for name in compiled) == 1, (program, compiled)
    streamed = [t for chunk in chunks for t in chunk.tokens[0]]
    assert streamed == np.asarray(out.tokens)[0, : int(out.lengths[0])].tolist()


def test_a_repeated_request_skips_the_background_compilation(tiny_lm, close_draft,
                                                             monkeypatch):
    import specjax.decoding.speculative_loop as loop

    seen = []
    monkeypatch.setattr(loop, "_COMPILED_NEXT", set())  # as in a fresh process
    real = loop.while_compiling
    monkeypatch.setattr(loop, "while_compiling",
                        lambda compile_next, run: seen.append(compile_next) or
                        real(compile_next, run))
    request = dict(max_new_tokens=7, num_draft_tokens=2, sampling=specjax.GREEDY)
    specjax.speculative_generate(tiny_lm, close_draft, [[3, 1, 4]], **request)
    again = specjax.speculative_generate(tiny_lm, close_draft, [[2, 7, 1]], **request)
    sampled = specjax.speculative_generate(tiny_lm, close_draft, [[2, 7, 1]],
                                           **(request | {"sampling": specjax.SamplingConfig(),
                                                         "key": jax.random.key(0)}))
    cooler = specjax.speculative_generate(
        tiny_lm, close_draft, [[2, 7, 1]],
        **(request | {"sampling": specjax.SamplingConfig(temperature=0.5, top_k=3),
                      "key": jax.random.key(0)}))
    assert seen[0] is not None  # the first request compiles the loop meanwhile
    assert seen[1] is None  # same shapes and settings: already compiled
    assert seen[2] is not None  # sampled rows: another loop program
    assert seen[3] is None  # new sampling values are data: the same program
    assert int(again.lengths[0]) == 7 and int(sampled.lengths[0]) == 7
    assert int(cooler.lengths[0]) == 7
