from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from infermux.backends import BackendRegistry
from infermux.repository import ControlMode, ModelRepository
from tests.support import write_model

# Records the shape and dtype of every request it sees; refuses negative data.
RECORDER = """
from typing import Any

import infermux


class Model:
    def initialize(self, context: Any) -> None:
        self.log = context.model_path / "seen.log"

    def execute(self, requests: list[Any]) -> list[Any]:
        out: list[Any] = []
        for r in requests:
            x = r.inputs["INPUT0"]
            with open(self.log, "a") as log:
                log.write(f"{r.id} {x.shape} {x.dtype} {float(x.sum())}\\n")
            if (x < 0).any():
                out.append(infermux.InvalidArgumentError("negative"))
            else:
                out.append({"OUTPUT0": x})
        return out
"""


async def load(tmp_path: Path, warmup: str, datatype: str = "FP32") -> ModelRepository:
    write_model(tmp_path, "m", source=RECORDER, datatype=datatype, extra=warmup)
    repository = ModelRepository(
        [tmp_path], BackendRegistry(), control_mode=ControlMode.EXPLICIT, startup_models=["m"]
    )
    await repository.start()
    return repository


def seen(tmp_path: Path) -> list[str]:
    path = tmp_path / "m" / "seen.log"
    return path.read_text().splitlines() if path.exists() else []


async def test_zero_random_and_file_samples_run_before_ready(tmp_path: Path) -> None:
    (tmp_path / "m" / "warmup").mkdir(parents=True)
    np.full((2, 3), 2.0, np.float32).tofile(tmp_path / "m" / "warmup" / "twos.bin")
    warmup = """
    model_warmup [
      { name: "zeros" batch_size: 4 count: 2
        inputs { key: "INPUT0" value { data_type: TYPE_FP32 dims: [ 3 ] zero_data: true } } },
      { name: "file" batch_size: 2
        inputs { key: "INPUT0"
                 value { data_type: TYPE_FP32 dims: [ 3 ] input_data_file: "twos.bin" } } },
      { name: "random" batch_size: 1
        inputs { key: "INPUT0" value { data_type: TYPE_FP32 dims: [ 5 ] random_data: true } } }
    ]
    """
    repository = await load(tmp_path, "dynamic_batching { }\n" + warmup)
    assert repository.is_ready("m")
    rows = seen(tmp_path)
    assert rows[:3] == [
        "warmup-zeros (4, 3) float32 0.0",
        "warmup-zeros (4, 3) float32 0.0",
        "warmup-file (2, 3) float32 12.0",
    ]
    assert rows[3].startswith("warmup-random (1, 5) float32")
    await repository.close()


@pytest.mark.parametrize(
    ("warmup", "reason"),
    [
        (
            'model_warmup [ { name: "neg" batch_size: 1 inputs { key: "INPUT0" value { '
            'data_type: TYPE_INT32 dims: [ 2 ] input_data_file: "neg.bin" } } } ]',
            "warm-up sample 'neg' failed: negative",
        ),
        (
            'model_warmup [ { name: "missing" batch_size: 1 inputs { key: "INPUT0" value { '
            'data_type: TYPE_INT32 dims: [ 2 ] input_data_file: "nope.bin" } } } ]',
            "cannot read",
        ),
        (
            'model_warmup [ { name: "big" batch_size: 99 inputs { key: "INPUT0" value { '
            "data_type: TYPE_INT32 dims: [ 2 ] zero_data: true } } } ]",
            "batch_size 99 must be in [1, max_batch_size=8]",
        ),
    ],
)
async def test_a_failing_sample_fails_the_load(tmp_path: Path, warmup: str, reason: str) -> None:
    (tmp_path / "m" / "warmup").mkdir(parents=True)
    np.array([-1, -2], np.int32).tofile(tmp_path / "m" / "warmup" / "neg.bin")
    repository = await load(tmp_path, warmup, datatype="INT32")
    assert not repository.is_ready("m")
    (row,) = repository.index()
    assert row.state == "UNAVAILABLE"
    assert reason in row.reason
    await repository.close()
