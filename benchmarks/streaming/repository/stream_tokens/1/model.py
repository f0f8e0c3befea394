"""A decoupled token generator for the streaming benchmark, written against Triton's Python
backend API so that infermux and tritonserver serve this very file.

Each request names ``N`` (responses to send) and ``DELAY_US`` (the pause between two of them);
``PROMPT`` is echoed as every response's ``TOKEN`` (the payload). A thread per request sends the
responses, as Triton's decoupled examples do, and ``execute`` returns at once. Response ``i``
carries ``META = [i, exec_ns, sent_ns]``: ``time.monotonic_ns()`` when ``execute`` took the
request and just before this response was handed to the sender. Both clocks are the host's
CLOCK_MONOTONIC, which the benchmark's client reads too, so it can tell the model's own pauses
from the server's delivery. The last response carries the final flag; ``N = 0`` sends the flag
alone.
"""

import threading
import time

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        for request in requests:
            exec_ns = time.monotonic_ns()
            prompt = pb_utils.get_input_tensor_by_name(request, "PROMPT").as_numpy()
            count = int(pb_utils.get_input_tensor_by_name(request, "N").as_numpy()[0])
            delay_us = int(pb_utils.get_input_tensor_by_name(request, "DELAY_US").as_numpy()[0])
            sender = request.get_response_sender()
            thread = threading.Thread(
                target=self.stream, args=(sender, prompt, count, delay_us / 1e6, exec_ns)
            )
            thread.daemon = True
            thread.start()
        # None: a decoupled model answers through the senders, from the threads.

    def stream(self, sender, prompt, count, delay, exec_ns):
        final = pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL
        if count <= 0:
            sender.send(flags=final)
            return
        for i in range(count):
            if i and delay > 0:
                time.sleep(delay)
            meta = np.array([i, exec_ns, time.monotonic_ns()], np.int64)
            response = pb_utils.InferenceResponse(
                output_tensors=[pb_utils.Tensor("TOKEN", prompt), pb_utils.Tensor("META", meta)]
            )
            sender.send(response, flags=final if i == count - 1 else 0)
