"""The garbage collector settled for serving (``runtime/garbage.py``): start-up's objects frozen,
young collections rarer, and a full collection after an unload still reaching what was frozen.
Each case runs in a fresh interpreter: freezing is the whole process's."""

from __future__ import annotations

import subprocess
import sys
import textwrap


def run(code: str) -> str:
    done = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    return done.stdout.strip()


def test_settling_freezes_what_start_up_built_and_collects_young_objects_less_often() -> None:
    out = run(
        """
        import gc
        from infermux.runtime import garbage
        before = gc.get_threshold()
        garbage.settle()
        after = gc.get_threshold()
        print(gc.get_freeze_count() > 1000, after[0], after[1:] == before[1:])
        """
    )
    assert out == "True 10000 True"


def test_a_model_in_a_reference_cycle_frozen_at_start_is_freed_by_the_unload_collection() -> None:
    # A model's objects sit in cycles (docs/reliability.md); frozen at start, a plain
    # gc.collect() never frees them: the unload's collection must thaw them first.
    out = run(
        """
        import gc, weakref
        from infermux.runtime import garbage

        class Model:
            def __init__(self):
                self.me = self  # a cycle: refcounting alone never frees it

        model = Model()
        alive = weakref.ref(model)
        garbage.settle()
        del model
        gc.collect()
        plain = alive() is not None  # frozen: out of a plain collection's reach
        garbage.collect()
        print(plain, alive() is None, gc.get_freeze_count() > 1000)
        """
    )
    assert out == "True True True"  # and what survived is frozen again


def test_before_settling_the_unload_collection_is_a_plain_one() -> None:
    out = run(
        """
        import gc
        from infermux.runtime import garbage

        class Model:
            def __init__(self):
                self.me = self

        Model()
        print(garbage.collect() >= 1, gc.get_freeze_count(), gc.get_threshold()[0])
        """
    )
    assert out == "True 0 700"
