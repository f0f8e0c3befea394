"""CUDA shared memory on a GPU: inputs in a client's GPU memory reach a PyTorch instance without a
host copy (gathered device to device, into graph inputs too), and the extension works end to end
with tritonclient's CUDA shared-memory utilities against a real ``infermux serve``, in one
process and with several front-end processes."""

from __future__ import annotations

import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from infermux.backends import ModelRequest
from infermux.types import DeviceArray
from tests.gpu.torch_models import WIDTH, Wide, close, load, rows, run, write
from tests.support import ServerProcess, start_server

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA"),
]

GRAPHS = "optimization { cuda { graphs: true } }\n"


def on_device(x: np.ndarray[Any, Any]) -> tuple[DeviceArray, torch.Tensor]:
    tensor = torch.from_numpy(x).cuda()
    torch.cuda.synchronize()  # as a client must before it sends the request
    return DeviceArray(tensor.data_ptr(), tuple(x.shape), x.dtype, 0, tensor), tensor


@pytest.mark.parametrize("parameters", ["", GRAPHS])
def test_device_inputs_are_gathered_on_the_gpu(tmp_path: Path, parameters: str) -> None:
    (instance,) = load(write(tmp_path, Wide(), parameters), "cuda:0", 1)
    (reference,) = load(write(tmp_path / "ref", Wide()), "cuda:0", 1)
    try:
        xs = [rows(2, 1), rows(3, 2)]
        parts = [on_device(x) for x in xs]
        requests = [
            ModelRequest({}, ("OUTPUT__0",), device_inputs={"INPUT__0": array})
            for array, _ in parts
        ]
        gpu = instance.gpu
        assert gpu is not None

        def no_host_copies(*args: object) -> None:
            raise AssertionError("a device input went through host memory")

        gpu.staging.upload = no_host_copies  # type: ignore[method-assign,assignment]
        gpu.staging.upload_into = no_host_copies  # type: ignore[method-assign,assignment]
        results = instance.execute(requests)
        for x, result in zip(xs, results, strict=True):
            assert not isinstance(result, Exception), result
            np.testing.assert_allclose(
                np.asarray(result["OUTPUT__0"]), run(reference, x), rtol=1e-5, atol=1e-6
            )
        assert gpu.replays == (1 if parameters else 0)
    finally:
        close([instance, reference])


CONFIG = """name: "wide"
platform: "pytorch_libtorch"
max_batch_size: 8
input [ {{ name: "INPUT__0", data_type: TYPE_FP32, dims: [ {width} ] }} ]
output [ {{ name: "OUTPUT__0", data_type: TYPE_FP32, dims: [ 8 ] }} ]
instance_group [ {{ kind: KIND_GPU, count: 2 }} ]
dynamic_batching {{ }}
{graphs}
"""


@pytest.fixture(scope="module", params=[1, 2], ids=["frontends1", "frontends2"])
def server(
    tmp_path_factory: pytest.TempPathFactory, request: pytest.FixtureRequest
) -> Iterator[ServerProcess]:
    """The server in one process, and as two front ends over an executor (the regions are
    then opened by the executor, which owns the model)."""
    repo = tmp_path_factory.mktemp("repo")
    (repo / "wide" / "1").mkdir(parents=True)
    (repo / "wide" / "config.pbtxt").write_text(CONFIG.format(width=WIDTH, graphs=GRAPHS))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        scripted: torch.jit.ScriptModule = torch.jit.script(Wide().eval())
        scripted.save(str(repo / "wide" / "1" / "model.pt"))
    with start_server(
        "--model-repository",
        str(repo),
        "--allow-client-shm",
        "true",
        "--frontends",
        str(request.param),
    ) as server:
        yield server
        assert server.stop() == 0


@pytest.mark.parametrize("protocol", ["grpc", "http"])
def test_tritonclient_cuda_shared_memory_round_trip(server: ServerProcess, protocol: str) -> None:
    import tritonclient.grpc as grpcclient
    import tritonclient.http as httpclient
    import tritonclient.utils.cuda_shared_memory as cudashm

    module: Any = grpcclient if protocol == "grpc" else httpclient
    client = module.InferenceServerClient(server.grpc_url if protocol == "grpc" else server.url)
    x = rows(4, 9)
    expected = Wide().eval()(torch.from_numpy(x)).detach().numpy()
    inputs_region = cudashm.create_shared_memory_region(f"in_{protocol}", x.nbytes, 0)
    outputs_region = cudashm.create_shared_memory_region(f"out_{protocol}", 4 * 8 * 4, 0)
    try:
        cudashm.set_shared_memory_region(inputs_region, [x])
        client.register_cuda_shared_memory(
            f"in_{protocol}", cudashm.get_raw_handle(inputs_region), 0, x.nbytes
        )
        client.register_cuda_shared_memory(
            f"out_{protocol}", cudashm.get_raw_handle(outputs_region), 0, 4 * 8 * 4
        )
        status = client.get_cuda_shared_memory_status()
        assert status, status
        infer_input = module.InferInput("INPUT__0", list(x.shape), "FP32")
        infer_input.set_shared_memory(f"in_{protocol}", x.nbytes)
        output = module.InferRequestedOutput("OUTPUT__0")
        output.set_shared_memory(f"out_{protocol}", 4 * 8 * 4)
        result = client.infer("wide", [infer_input], outputs=[output])
        meta = result.get_output("OUTPUT__0")
        shape = meta.shape if protocol == "grpc" else meta["shape"]
        answer = cudashm.get_contents_as_numpy(outputs_region, np.float32, list(shape))
        np.testing.assert_allclose(answer, expected, rtol=1e-4, atol=1e-5)
    finally:
        client.unregister_cuda_shared_memory()
        cudashm.destroy_shared_memory_region(inputs_region)
        cudashm.destroy_shared_memory_region(outputs_region)
        client.close()


@pytest.mark.parametrize("protocol", ["grpc", "http"])
def test_a_cuda_region_larger_than_its_allocation_is_refused(
    server: ServerProcess, protocol: str
) -> None:
    """A client's byte_size is a claim: the server holds it to the allocation the driver says the
    handle maps, since a copy past it is an illegal address that poisons the CUDA context of
    every model on the device (issue 23). The server keeps serving CUDA shm afterwards."""
    import tritonclient.grpc as grpcclient
    import tritonclient.http as httpclient
    import tritonclient.utils.cuda_shared_memory as cudashm
    from tritonclient.utils import InferenceServerException

    module: Any = grpcclient if protocol == "grpc" else httpclient
    client = module.InferenceServerClient(server.grpc_url if protocol == "grpc" else server.url)
    name = f"small_{protocol}"
    region = cudashm.create_shared_memory_region(name, 1024, 0)
    try:
        with pytest.raises(InferenceServerException) as refused:
            client.register_cuda_shared_memory(name, cudashm.get_raw_handle(region), 0, 1 << 20)
        assert name in str(refused.value), refused.value
        assert "exceeds" in str(refused.value), refused.value
        status = client.get_cuda_shared_memory_status()
        listed = status.regions if protocol == "grpc" else status
        assert len(listed) == 0, f"a refused region must not be listed: {status}"
        # The honest claim registers and serves an inference.
        x = rows(1, 3)
        cudashm.set_shared_memory_region(region, [x])
        client.register_cuda_shared_memory(name, cudashm.get_raw_handle(region), 0, 1024)
        infer_input = module.InferInput("INPUT__0", list(x.shape), "FP32")
        infer_input.set_shared_memory(name, x.nbytes)
        result = client.infer("wide", [infer_input])
        expected = Wide().eval()(torch.from_numpy(x)).detach().numpy()
        np.testing.assert_allclose(result.as_numpy("OUTPUT__0"), expected, rtol=1e-4, atol=1e-5)
    finally:
        client.unregister_cuda_shared_memory()
        cudashm.destroy_shared_memory_region(region)
        client.close()
