"""Instances placed on two GPUs (`count: 2, kind: KIND_GPU, gpus: [ 0, 1 ]`): the weights
load once per GPU, each instance runs on its own GPU's streams, answers agree. A GPU group
without `gpus` gets an instance on each GPU, and `--executors 2` drives each GPU from its own
executor process."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
import tritonclient.http as httpclient

from infermux.backends.pytorch import PyTorchBackend, PyTorchInstance
from infermux.repository import load_model_config
from infermux.repository.loader import _create_instances, instance_makers
from infermux.repository.placement import placements
from infermux.runtime import WEIGHTS, total_by_device
from infermux.runtime.memory import instance_memory
from tests.gpu.torch_models import WIDTH, Wide, close, load, rows, run, write
from tests.support import start_server

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(
        not torch.cuda.is_available() or torch.cuda.device_count() < 2, reason="needs 2 GPUs"
    ),
]

TWO_GPUS = "optimization { cuda { graphs: true } }\n"


def test_two_instances_on_each_of_two_gpus(tmp_path: Path) -> None:
    model = Wide()
    one_copy = sum(p.numel() * p.element_size() for p in model.parameters())
    model_dir = write(tmp_path, model, TWO_GPUS)
    text = (model_dir / "config.pbtxt").read_text()
    (model_dir / "config.pbtxt").write_text(
        text.replace(
            "instance_group [ { kind: KIND_GPU, count: 1 } ]",
            "instance_group [ { kind: KIND_GPU, count: 2, gpus: [ 0, 1 ] } ]",
        )
    )
    config = load_model_config(model_dir)
    torch.cuda.synchronize(0)
    torch.cuda.synchronize(1)
    before = [torch.cuda.memory_allocated(d) for d in (0, 1)]
    makers = instance_makers(PyTorchBackend().load, config, model_dir, 1, placements(config))
    created = _create_instances(makers)
    instances = [i for i in created if isinstance(i, PyTorchInstance)]
    (cpu,) = load(model_dir, "cpu", 1)
    try:
        assert len(instances) == 4
        devices = [i.stream.device.index for i in instances if i.stream is not None]
        assert sorted(devices) == [0, 0, 1, 1]
        assert len({i.stream.cuda_stream for i in instances if i.stream is not None}) == 4
        held = [key for key in WEIGHTS.held() if key[0].startswith(str(tmp_path))]
        assert sorted(key[2] for key in held) == ["cuda:0", "cuda:1"]
        uses = instance_memory(instances)
        totals = {(m.type, m.id): m.byte_size for m in total_by_device(uses)}
        for device in (0, 1):
            grown = torch.cuda.memory_allocated(device) - before[device]
            here = [u for u in uses if u.kind == "GPU" and u.device_id == device]
            assert [u.byte_size for u in here if u.component == "weights"] == [one_copy] * 2
            pools = sum(u.byte_size for u in here if u.component == "graphs")
            # As on one GPU: everything but the graph pools is allocated tensors (one copy of
            # the weights, two cuBLAS workspaces, buffers); the pools are reserved segments.
            assert 0 <= totals[("GPU", device)] - grown <= pools, (device, grown, totals)
        for n in (1, 3, 8):
            x = rows(n, n)
            expected = run(cpu, x)
            for instance in instances:
                np.testing.assert_allclose(run(instance, x), expected, rtol=1e-3, atol=1e-4)
        assert all(i.gpu is not None and i.gpu.replays == 3 for i in instances)
    finally:
        close([*instances, cpu])


def test_a_gpu_group_without_gpus_gets_an_instance_on_each_gpu(tmp_path: Path) -> None:
    config = load_model_config(write(tmp_path, Wide()))  # KIND_GPU, count 1, no gpus
    devices = [p.device for p in placements(config)]
    assert devices == [f"cuda:{g}" for g in range(torch.cuda.device_count())]


def test_two_executors_each_drive_their_own_gpu(tmp_path: Path) -> None:
    model_dir = write(tmp_path, Wide())
    (cpu,) = load(model_dir, "cpu", 1)
    server = start_server("--model-repository", str(tmp_path), "--executors", "2",
                          "--frontends", "1", "--ipc-arena-mb", "16")  # fmt: skip
    try:
        with server, httpclient.InferenceServerClient(server.url, concurrency=4) as client:
            x = rows(2, 3)
            tensor = httpclient.InferInput("INPUT__0", [2, WIDTH], "FP32")
            tensor.set_data_from_numpy(x)
            pending = [client.async_infer("m", [tensor]) for _ in range(32)]
            for handle in pending:
                out = handle.get_result().as_numpy("OUTPUT__0")
                np.testing.assert_allclose(out, run(cpu, x), rtol=1e-3, atol=1e-4)
            (stats,) = client.get_inference_statistics("m")["model_stats"]
            assert int(stats["inference_count"]) == 64
            on = {(m["type"], int(m["id"])) for m in stats["memory_usage"]}
            assert {("GPU", 0), ("GPU", 1)} <= on  # one executor per GPU, each with its copy
            assert any("executor pids" in line for line in server.log)
            assert server.stop() == 0
    finally:
        close([cpu])
