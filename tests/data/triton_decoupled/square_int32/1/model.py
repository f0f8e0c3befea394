"""square_int32: for IN = [n], n responses each holding OUT = [n], then the final flag.

Each request of a batch streams from a thread of its own, so ``execute`` returns at once and
responses of several requests interleave. IN = [0] sends the final flag alone (a gRPC client
that did not ask for empty final responses then receives nothing for that request).
"""

import json
import threading

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        config = json.loads(args["model_config"])
        if not pb_utils.using_decoupled_model_transaction_policy(config):
            raise pb_utils.TritonModelException(
                f"{args['model_name']} sends any number of responses per request: it needs "
                "model_transaction_policy { decoupled: true }"
            )
        for kind, name in (("input", "IN"), ("output", "OUT")):
            if kind == "input":
                tensor = pb_utils.get_input_config_by_name(config, name)
            else:
                tensor = pb_utils.get_output_config_by_name(config, name)
            if list(tensor["dims"]) != [1] or tensor["data_type"] != "TYPE_INT32":
                raise pb_utils.TritonModelException(
                    f"{args['model_name']}: {kind} {name} must be TYPE_INT32 with dims [1], "
                    f"got {tensor['data_type']} {tensor['dims']}"
                )
        self.senders = []
        self.lock = threading.Lock()

    def execute(self, requests):
        for request in requests:
            value = pb_utils.get_input_tensor_by_name(request, "IN").as_numpy()
            sender = threading.Thread(
                target=self.send, args=(request.get_response_sender(), int(value[0])), daemon=True
            )
            with self.lock:
                self.senders.append(sender)
            sender.start()

    def send(self, sender, value):
        try:
            for _ in range(value):
                out = pb_utils.Tensor("OUT", np.array([value], np.int32))
                sender.send(pb_utils.InferenceResponse(output_tensors=[out]))
            sender.send(flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
        finally:
            with self.lock:
                self.senders.remove(threading.current_thread())

    def finalize(self):
        while True:
            with self.lock:
                left = list(self.senders)
            if not left:
                return
            left[0].join()
