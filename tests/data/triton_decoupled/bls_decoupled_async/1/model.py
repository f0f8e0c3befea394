"""bls_decoupled_async: like bls_decoupled_sync with two BLS calls on square_int32 in flight
at once (``await asyncio.gather`` of two ``async_exec(decoupled=True)``): SUM = [2 * n * n].
"""

import asyncio

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    async def execute(self, requests):
        if len(requests) != 1:
            raise pb_utils.TritonModelException(f"expected one request, got {len(requests)}")
        count = pb_utils.get_input_tensor_by_name(requests[0], "IN")
        calls = [
            pb_utils.InferenceRequest(
                model_name="square_int32", inputs=[count], requested_output_names=["OUT"]
            ).async_exec(decoupled=True)
            for _ in range(2)
        ]
        total = np.array([0])
        for responses in await asyncio.gather(*calls):
            for response in responses:  # each call's responses, read as they come
                if response.has_error():
                    raise pb_utils.TritonModelException(response.error().message())
                if response.output_tensors():
                    total += pb_utils.get_output_tensor_by_name(response, "OUT").as_numpy()
        return [pb_utils.InferenceResponse(output_tensors=[pb_utils.Tensor("SUM", total)])]
