"""The atheris harness (``fuzz/request_parsers.py``) runs, from its seed corpus, for a bounded
time without a finding (longer runs: ``docs/reliability.md``)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("atheris")
ROOT = Path(__file__).resolve().parents[2]


def test_the_harness_runs_clean_for_ten_seconds(tmp_path: Path) -> None:
    corpus = tmp_path / "corpus"
    subprocess.run([sys.executable, str(ROOT / "fuzz" / "seeds.py"), str(corpus)], check=True)
    done = subprocess.run(
        [sys.executable, str(ROOT / "fuzz" / "request_parsers.py"), "-max_total_time=10",
         "-print_final_stats=1", str(corpus)],
        capture_output=True, text=True, timeout=120, check=False, cwd=tmp_path,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    runs = int(done.stderr.split("stat::number_of_executed_units:")[1].split()[0])
    assert runs > 1000, done.stderr[-2000:]
    assert not list(tmp_path.glob("crash-*"))


def test_the_shared_memory_harness_runs_clean(tmp_path: Path) -> None:
    """``fuzz/shared_memory.py``: fuzzed reads and writes of a registered region interleaved with
    truncations of its object. On a server that maps regions it dies of SIGBUS within seconds."""
    done = subprocess.run(
        [sys.executable, str(ROOT / "fuzz" / "shared_memory.py"), "-max_total_time=10",
         "-print_final_stats=1"],
        capture_output=True, text=True, timeout=120, check=False, cwd=tmp_path,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    runs = int(done.stderr.split("stat::number_of_executed_units:")[1].split()[0])
    assert runs > 1000, done.stderr[-2000:]
    assert not list(tmp_path.glob("crash-*"))
