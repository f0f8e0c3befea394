"""The peers' MLP (TorchScript file at ``parameters.uri``) as an MLServer runtime."""

import torch
from mlserver import MLModel
from mlserver.codecs import NumpyCodec
from mlserver.types import InferenceRequest, InferenceResponse


class Mlp(MLModel):
    async def load(self) -> bool:
        self.net = torch.jit.load(self.settings.parameters.uri).eval()
        return True

    async def predict(self, payload: InferenceRequest) -> InferenceResponse:
        x = NumpyCodec.decode_input(payload.inputs[0]).astype("float32")
        with torch.inference_mode():
            y = self.net(torch.from_numpy(x)).numpy()
        return InferenceResponse(
            model_name=self.name, outputs=[NumpyCodec.encode_output("OUTPUT__0", y)]
        )
