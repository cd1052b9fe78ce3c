"""The decoding commands' process handling: garbage collection paused until the first step,
and an exit that skips the interpreter's teardown but not the output or the threads."""

import gc
import subprocess
import sys
import textwrap

from specjax.cli import process


def test_pause_and_resume_garbage_collection_restore_collection():
    assert gc.isenabled()
    frozen = gc.get_freeze_count()
    try:
        process.pause_garbage_collection()
        assert not gc.isenabled()
        process.resume_garbage_collection()
        assert gc.isenabled()
        assert gc.get_freeze_count() >= frozen
    finally:
        gc.unfreeze()
        gc.enable()


def test_resume_without_pause_leaves_the_callers_settings():
    gc.disable()
    try:
        frozen = gc.get_freeze_count()
        process.resume_garbage_collection()
        assert not gc.isenabled()  # the caller turned it off; not ours to turn on
        assert gc.get_freeze_count() == frozen
    finally:
        gc.enable()


def test_exit_now_flushes_output_and_waits_for_threads(tmp_path):
    done = tmp_path / "written"
    script = textwrap.dedent(f"""
        import sys, threading, time
        from specjax.cli.process import exit_now

        def write():
            time.sleep(0.3)
            open({str(done)!r}, "w").write("complete")

        threading.Thread(target=write).start()
        print("buffered line", end="")
        sys.stderr.write("to stderr")
        exit_now(7)
        print("never")
    """)
    finished = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                              timeout=60, check=False)
    assert finished.returncode == 7
    assert finished.stdout == "buffered line"
    assert finished.stderr == "to stderr"
    assert done.read_text() == "complete"


def test_the_script_keeps_the_exit_code_of_a_refused_command():
    finished = subprocess.run([sys.executable, "-m", "specjax.cli", "generate", "x",
                               "--temperature", "-1"], capture_output=True, text=True,
                              timeout=120, check=False)
    assert finished.returncode == 2
    assert "temperature" in finished.stderr
