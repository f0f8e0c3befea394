"""`simple` (INT32 add/sub of two 16-vectors) as an MLServer runtime."""

import numpy as np
from mlserver import MLModel
from mlserver.codecs import NumpyCodec
from mlserver.types import InferenceRequest, InferenceResponse


class Simple(MLModel):
    async def predict(self, payload: InferenceRequest) -> InferenceResponse:
        inputs = {i.name: NumpyCodec.decode_input(i) for i in payload.inputs}
        a, b = inputs["INPUT0"].astype(np.int32), inputs["INPUT1"].astype(np.int32)
        return InferenceResponse(
            model_name=self.name,
            outputs=[
                NumpyCodec.encode_output("OUTPUT0", a + b),
                NumpyCodec.encode_output("OUTPUT1", a - b),
            ],
        )
