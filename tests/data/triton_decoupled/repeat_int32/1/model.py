"""repeat_int32: one response per element of IN, each after its DELAY (ms), then the final flag.

Response i holds OUT = IN[i] and IDX = i. ``execute`` hands the request to a thread of its own
and returns after WAIT ms, so with WAIT below the sum of the delays the next request starts
while this one still streams: one instance then serves several requests at once and their
responses interleave. An empty IN sends the final flag alone.
"""

import json
import threading
import time

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
        out = pb_utils.get_output_config_by_name(config, "OUT")
        idx = pb_utils.get_output_config_by_name(config, "IDX")
        self.out_dtype = pb_utils.triton_string_to_numpy(out["data_type"])
        self.idx_dtype = pb_utils.triton_string_to_numpy(idx["data_type"])
        self.senders = []  # threads still sending; finalize waits for them
        self.lock = threading.Lock()

    def execute(self, requests):
        if len(requests) != 1:  # max_batch_size 0: the server never groups requests
            raise pb_utils.TritonModelException(f"expected one request, got {len(requests)}")
        request = requests[0]
        values = pb_utils.get_input_tensor_by_name(request, "IN").as_numpy()
        delays = pb_utils.get_input_tensor_by_name(request, "DELAY").as_numpy()
        wait = pb_utils.get_input_tensor_by_name(request, "WAIT").as_numpy()
        if values.shape != delays.shape:
            raise pb_utils.TritonModelException(
                f"IN and DELAY must have one shape, got {list(values.shape)} and "
                f"{list(delays.shape)}"
            )
        sender = threading.Thread(
            target=self.send, args=(request.get_response_sender(), values, delays), daemon=True
        )
        with self.lock:
            self.senders.append(sender)
        sender.start()
        # Returning (None: a decoupled model answers through its senders) frees the instance
        # for the next request, though this one may still be streaming.
        time.sleep(int(wait[0]) / 1000)

    def send(self, sender, values, delays):
        try:
            for i in range(values.size):
                time.sleep(int(delays[i]) / 1000)
                sender.send(
                    pb_utils.InferenceResponse(
                        output_tensors=[
                            pb_utils.Tensor("IDX", np.array([i], self.idx_dtype)),
                            pb_utils.Tensor("OUT", np.array([values[i]], self.out_dtype)),
                        ]
                    )
                )
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
