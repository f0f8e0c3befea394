"""bls_probe (not one of Triton's examples): what BLS calls give back, reported as JSON in
REPORT, so that a test compares infermux's answers with those real Triton gave: each response
of a decoupled call (outputs, error code), a second iteration, a single-response call on a
decoupled model, a decoupled call on a model that answers once, on an unknown model, on a
stream with a failure in it, and from a thread of the model's; for IN = [-1], the same
through async_exec in an async execute.
"""

import asyncio
import json
import threading

import numpy as np
import triton_python_backend_utils as pb_utils


def describe(response):
    error = response.error() if response.has_error() else None
    return {
        "error": None if error is None else int(error.code()),
        "outputs": {t.name(): t.as_numpy().tolist() for t in response.output_tensors()},
    }


def call(model, inputs, outputs):
    return pb_utils.InferenceRequest(
        model_name=model, inputs=inputs, requested_output_names=outputs
    )


def single(response):
    error = response.error() if response.has_error() else None
    return {
        "error": None if error is None else int(error.code()),
        "names_decoupled": error is not None and "decoupled" in error.message(),
        "outputs": {t.name(): t.as_numpy().tolist() for t in response.output_tensors()},
    }


class TritonPythonModel:
    def execute(self, requests):
        request = requests[0]
        count = pb_utils.get_input_tensor_by_name(request, "IN")
        if int(count.as_numpy()[0]) < 0:
            report = asyncio.run(self.async_report())
        else:
            report = self.report(count)
        text = np.array([json.dumps(report, sort_keys=True).encode()], dtype=np.object_)
        return [pb_utils.InferenceResponse([pb_utils.Tensor("REPORT", text)])]

    def report(self, count):
        stream = call("square_int32", [count], ["OUT"]).exec(decoupled=True)
        report = {
            "type": type(stream).__name__,
            "square": [describe(r) for r in stream],
            "square_again": [describe(r) for r in stream],
            "square_single": single(call("square_int32", [count], ["OUT"]).exec()),
            "once": [
                describe(r)
                for r in call("bls_decoupled_sync", [count], ["SUM"]).exec(decoupled=True)
            ],
            "errors": [
                describe(r) for r in call("errors_int32", [count], ["OUT"]).exec(decoupled=True)
            ],
        }
        missing = list(call("no_such_model", [count], ["OUT"]).exec(decoupled=True))
        report["missing"] = [r.has_error() for r in missing]
        # From a thread the model started, as a decoupled model's sender thread would call.
        seen = []
        stream = call("square_int32", [count], ["OUT"])
        worker = threading.Thread(target=lambda: seen.extend(stream.exec(decoupled=True)))
        worker.start()
        worker.join()
        report["from_thread"] = [describe(r) for r in seen]
        return report

    async def async_report(self):
        three = pb_utils.Tensor("IN", np.array([3], np.int32))
        square, errors = await asyncio.gather(
            call("square_int32", [three], ["OUT"]).async_exec(decoupled=True),
            call("errors_int32", [three], ["OUT"]).async_exec(decoupled=True),
        )
        once = await call("square_int32", [three], ["OUT"]).async_exec()
        return {
            "type": type(square).__name__,
            "square": [describe(r) for r in square],
            "errors": [describe(r) for r in errors],
            "square_single": single(once),
        }
