"""Which ONNX Runtime int8 settings are fast on this CPU (ResNet-50, batch 8)? A probe for the
defaults of ``infermux.backends.onnx_precision``; prints one line per setting."""

from __future__ import annotations

import os
import tempfile
import time
import warnings
from pathlib import Path

import numpy as np
import onnxruntime as ort
import torch
import torchvision
from onnxruntime import quantization
from onnxruntime.quantization.shape_inference import quant_pre_process

work = Path(tempfile.mkdtemp())
net = torchvision.models.resnet50().eval()
x = torch.randn(8, 3, 224, 224)
with warnings.catch_warnings():
    warnings.simplefilter("ignore")
    torch.onnx.export(
        net,
        (x,),
        str(work / "m.onnx"),
        input_names=["x"],
        output_names=["y"],
        dynamic_axes={"x": {0: "n"}, "y": {0: "n"}},
        opset_version=17,
        dynamo=False,
    )
quant_pre_process(str(work / "m.onnx"), str(work / "pre.onnx"))
cal = [
    np.random.default_rng(i).standard_normal((1, 3, 224, 224)).astype(np.float32) for i in range(16)
]


class Reader(quantization.CalibrationDataReader):
    def __init__(self) -> None:
        self.it = iter(cal)

    def get_next(self):
        v = next(self.it, None)
        return None if v is None else {"x": v}


def speed(path: Path) -> float:
    o = ort.SessionOptions()
    o.intra_op_num_threads = len(os.sched_getaffinity(0))
    s = ort.InferenceSession(str(path), o, providers=["CPUExecutionProvider"])
    feed = {"x": x.numpy()}
    for _ in range(3):
        s.run(None, feed)
    n, t = 0, time.perf_counter()
    while time.perf_counter() - t < 3:
        s.run(None, feed)
        n += 1
    return 8 * n / (time.perf_counter() - t)


print("fp32", round(speed(work / "pre.onnx"), 1), flush=True)
for fmt in ("QDQ", "QOperator"):
    for act in ("QInt8", "QUInt8"):
        for pc in (True, False):
            out = work / f"{fmt}{act}{pc}.onnx"
            quantization.quantize_static(
                str(work / "pre.onnx"),
                str(out),
                Reader(),
                quant_format=getattr(quantization.QuantFormat, fmt),
                per_channel=pc,
                activation_type=getattr(quantization.QuantType, act),
                weight_type=quantization.QuantType.QInt8,
            )
            print(fmt, act, "per_channel" if pc else "per_tensor", round(speed(out), 1), flush=True)
