"""A Triton Python-backend model whose compute is negligible: OUTPUT0 = INPUT0 * 2 (FP32).

Served unchanged by infermux (in process) and by Triton's Python backend (stub process);
what a request costs beyond the multiply is the server's own overhead.
"""

import json

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        config = json.loads(args["model_config"])
        output = pb_utils.get_output_config_by_name(config, "OUTPUT0")
        self.dtype = pb_utils.triton_string_to_numpy(output["data_type"])

    def execute(self, requests):
        responses = []
        for request in requests:
            x = pb_utils.get_input_tensor_by_name(request, "INPUT0").as_numpy()
            y = np.multiply(x, 2, dtype=self.dtype)
            responses.append(pb_utils.InferenceResponse([pb_utils.Tensor("OUTPUT0", y)]))
        return responses
