"""errors_int32 (not one of Triton's examples): a decoupled model whose stream holds a failed
response between two good ones, OUT = [0], an INVALID_ARG error, OUT = [1], then the final
flag alone; bls_probe reads it to see how a failure mid-stream reaches a BLS caller."""

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        for request in requests:
            sender = request.get_response_sender()
            sender.send(
                pb_utils.InferenceResponse([pb_utils.Tensor("OUT", np.array([0], np.int32))])
            )
            error = pb_utils.TritonError(
                "an error between two responses", pb_utils.TritonError.INVALID_ARG
            )
            sender.send(pb_utils.InferenceResponse(error=error))
            sender.send(
                pb_utils.InferenceResponse([pb_utils.Tensor("OUT", np.array([1], np.int32))])
            )
            sender.send(flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
