"""bls_decoupled_sync: SUM of the OUT of every response square_int32 streams for IN, read
through a BLS call on that decoupled model (``exec(decoupled=True)``); one response per
request. For IN = [n] square_int32 sends n responses of [n]: SUM = [n * n].
"""

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        if len(requests) != 1:  # max_batch_size 0: the server never groups requests
            raise pb_utils.TritonModelException(f"expected one request, got {len(requests)}")
        count = pb_utils.get_input_tensor_by_name(requests[0], "IN")
        call = pb_utils.InferenceRequest(
            model_name="square_int32", inputs=[count], requested_output_names=["OUT"]
        )
        total = np.array([0])  # numpy's default integer, as Triton's example sums
        for response in call.exec(decoupled=True):
            if response.has_error():
                raise pb_utils.TritonModelException(response.error().message())
            if response.output_tensors():  # the last response may be empty: the final flag
                total += pb_utils.get_output_tensor_by_name(response, "OUT").as_numpy()
        return [pb_utils.InferenceResponse(output_tensors=[pb_utils.Tensor("SUM", total)])]
