"""ResNet-50 served by infermux's backends at reduced precision: speed, memory and agreement.

Variants: PyTorch (TorchScript) at fp32, fp16 and bf16 on cuda:0 with CUDA graphs (on the CPU,
without graphs, when there is no GPU), ONNX Runtime at fp32 and int8 (static QDQ) on the CPU, and
"raw" rows: the same torch model eager in-process at fp32/fp16/bf16, no infermux. Per variant:
load time (int8 loaded twice: calibration, then its cache), images/s at each batch size (median
of repeats of a timed ``execute`` loop), GPU memory, and top-1 agreement and relative L2 error of
the logits against infermux's PyTorch fp32 on seeded standard-normal images.

Random weights (fixed seed, BatchNorm statistics re-estimated on random inputs so that the
activations have realistic scale); no downloads. torchvision is used when present, else an
equivalent definition below.

    python benchmarks/precision/resnet50.py [--tiny] [--out DIR] [--variants a,b] [--seconds S]

Writes ``DIR/resnet50.json`` and ``DIR/resnet50.md``, both rewritten after every variant so that
a run cut short keeps what it measured.
"""

from __future__ import annotations

import argparse
import copy
import dataclasses
import gc
import json
import os
import platform
import shutil
import statistics
import tempfile
import time
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt
import torch
from torch import nn

from infermux.backends import ModelContext, ModelRequest
from infermux.backends.onnxruntime import OnnxRuntimeBackend
from infermux.backends.pytorch import PyTorchBackend
from infermux.repository import load_model_config

ROOT = Path(__file__).resolve().parents[2]
MAX_BATCH = 64
CALIBRATION_ROWS = 32
NPROC = len(os.sched_getaffinity(0))
Array = npt.NDArray[np.float32]
Row = dict[str, Any]
# name -> (backend, precision, on the GPU when there is one); run in this order, fp32 first.
VARIANTS = {
    "pytorch_fp32": ("pytorch", "fp32", True),
    "pytorch_fp16": ("pytorch", "fp16", True),
    "pytorch_bf16": ("pytorch", "bf16", True),
    # fp16 end to end: the config declares FP16 input and output, so clients send half the bytes
    # and nothing is cast at the boundary.
    "pytorch_fp16_io": ("pytorch", "fp16", True),
    "onnxruntime_fp32": ("onnxruntime", "fp32", False),
    "onnxruntime_int8": ("onnxruntime", "int8", False),
    "raw_fp32": ("raw", "fp32", True),
    "raw_fp16": ("raw", "fp16", True),
    "raw_bf16": ("raw", "bf16", True),
}
TORCH_DTYPES = {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}
T0 = time.perf_counter()


def log(message: str) -> None:
    print(f"[{time.perf_counter() - T0:6.1f}s] {message}", flush=True)


class _Block(nn.Module):
    """torchvision's BasicBlock (expansion 1) or Bottleneck (expansion 4, stride on the 3x3)."""

    def __init__(self, cin: int, width: int, stride: int, bottleneck: bool) -> None:
        super().__init__()
        cout = width * (4 if bottleneck else 1)
        if bottleneck:
            shapes = [(cin, width, 1, 1), (width, width, 3, stride), (width, cout, 1, 1)]
        else:
            shapes = [(cin, width, 3, stride), (width, cout, 3, 1)]
        self.convs = nn.ModuleList(
            nn.Conv2d(i, o, k, s, padding=k // 2, bias=False) for i, o, k, s in shapes
        )
        self.bns = nn.ModuleList(nn.BatchNorm2d(o) for _, o, _, _ in shapes)
        self.downsample = (
            nn.Sequential(nn.Conv2d(cin, cout, 1, stride, bias=False), nn.BatchNorm2d(cout))
            if stride != 1 or cin != cout
            else nn.Identity()
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = x
        for i, (conv, bn) in enumerate(zip(self.convs, self.bns, strict=True)):
            out = bn(conv(out))
            out = torch.relu(out) if i < len(self.convs) - 1 else out
        return torch.relu(out + self.downsample(x))


class _ResNet(nn.Module):
    """torchvision's ResNet for ImageNet (1000 classes), used when torchvision is absent."""

    def __init__(self, layers: tuple[int, ...], bottleneck: bool) -> None:
        super().__init__()
        stem = [nn.Conv2d(3, 64, 7, 2, 3, bias=False), nn.BatchNorm2d(64), nn.ReLU()]
        blocks: list[nn.Module] = [*stem, nn.MaxPool2d(3, 2, 1)]
        cin = 64
        for stage, count in enumerate(layers):
            for i in range(count):
                blocks.append(_Block(cin, 64 << stage, 2 if i == 0 and stage else 1, bottleneck))
                cin = (64 << stage) * (4 if bottleneck else 1)
        self.features = nn.Sequential(*blocks, nn.AdaptiveAvgPool2d(1), nn.Flatten())
        self.fc = nn.Linear(cin, 1000)
        for m in self.modules():  # torchvision's initialisation (BatchNorm's default is its own)
            if isinstance(m, nn.Conv2d):
                nn.init.kaiming_normal_(m.weight, mode="fan_out", nonlinearity="relu")

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = self.fc(self.features(x))
        return out


def build_model(tiny: bool, size: int, device: str) -> tuple[nn.Module, str]:
    """The eval-mode model on the CPU, and where its definition came from."""
    torch.manual_seed(0)
    try:
        import torchvision  # type: ignore[import-not-found,unused-ignore]

        make = torchvision.models.resnet18 if tiny else torchvision.models.resnet50
        net: nn.Module = make(weights=None)
        source = f"torchvision {torchvision.__version__}"
    except ImportError:
        net = _ResNet((2, 2, 2, 2), False) if tiny else _ResNet((3, 4, 6, 3), True)
        source = "the script's own definition (no torchvision)"
    # Fresh BatchNorm statistics (mean 0, var 1) let activations grow or vanish layer by layer,
    # which says little about how trained weights round; cumulative batch statistics fix the scale.
    for m in net.modules():
        if isinstance(m, nn.BatchNorm2d):
            m.reset_running_stats()
            m.momentum = None
    net.to(device).train()
    gen = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for _ in range(4):
            net(torch.randn(16, 3, size, size, generator=gen).to(device))
    return net.eval().cpu(), source


def config_text(name: str, device: str, size: int) -> str:
    backend, precision, _ = VARIANTS[name]
    gpu = device.startswith("cuda")
    params = {"precision": precision, "calibration_data": "calibration.npz"}
    params["accuracy_action"] = "warn"  # agreement is measured here, not a reason to refuse
    if backend == "onnxruntime":  # ORT's default is one thread per session
        params["intra_op_thread_count"] = str(NPROC)
    platform_name = "pytorch_libtorch" if backend == "pytorch" else "onnxruntime_onnx"
    io = "TYPE_FP16" if name.endswith("_io") else "TYPE_FP32"
    return (
        f'name: "{name}"\nplatform: "{platform_name}"\nmax_batch_size: {MAX_BATCH}\n'
        f'input [ {{ name: "INPUT__0", data_type: {io}, dims: [ 3, {size}, {size} ] }} ]\n'
        f'output [ {{ name: "OUTPUT__0", data_type: {io}, dims: [ 1000 ] }} ]\n'
        f"instance_group [ {{ kind: {'KIND_GPU' if gpu else 'KIND_CPU'}, count: 1 }} ]\n"
        + ("optimization { cuda { graphs: true } }\n" if gpu else "")
        + "".join(
            f'parameters {{ key: "{k}" value: {{ string_value: "{v}" }} }}\n'
            for k, v in params.items()
        )
    )


def write_repo(repo: Path, net: nn.Module, size: int, names: list[str], gpu: str) -> None:
    example = torch.randn(2, 3, size, size)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # TorchScript and the legacy ONNX exporter are deprecated
        trace: Callable[..., Any] = torch.jit.trace  # unannotated
        traced = trace(net, example)
        traced.save(str(repo / "model.pt"))
        if any(VARIANTS[n][0] == "onnxruntime" for n in names):
            # The legacy exporter: the dynamo one needs onnxscript, which the GPU box may lack.
            torch.onnx.export(
                net, (example,), str(repo / "model.onnx"), input_names=["INPUT__0"],
                output_names=["OUTPUT__0"], opset_version=17, dynamo=False,
                dynamic_axes={"INPUT__0": {0: "batch"}, "OUTPUT__0": {0: "batch"}},
            )  # fmt: skip
    rng = np.random.default_rng(3)  # not the evaluation images' seed
    calibration = rng.standard_normal((CALIBRATION_ROWS, 3, size, size), dtype=np.float32)
    for name in names:
        backend, _, on_gpu = VARIANTS[name]
        if backend == "raw":
            continue
        (repo / name / "1").mkdir(parents=True)
        # A private copy per variant: GPU weights are shared by file path, so variants must differ.
        source = "model.pt" if backend == "pytorch" else "model.onnx"
        shutil.copyfile(repo / source, repo / name / "1" / source)
        np.savez(repo / name / "calibration.npz", INPUT__0=calibration)
        (repo / name / "config.pbtxt").write_text(config_text(name, gpu if on_gpu else "cpu", size))


def images_per_second(call: Callable[[Array], Array], batch: int, args: Any) -> dict[str, Any]:
    x = np.random.default_rng(4).standard_normal((batch, 3, args.size, args.size), np.float32)
    for _ in range(3):  # warm-up: cuDNN algorithm choice, allocator and ORT arena growth
        call(x)
    rates = []
    for _ in range(args.repeats):
        calls, start = 0, time.perf_counter()
        while (elapsed := time.perf_counter() - start) < args.seconds or calls == 0:
            call(x)
            calls += 1
        rates.append(calls * batch / elapsed)
    return {"median": statistics.median(rates), "repeats": rates}


def measure(row: Row, call: Callable[[Array], Array], args: Any, images: Array) -> None:
    """Logits for the agreement images (in max-size batches), then throughput per batch size."""
    chunks = [call(images[i : i + MAX_BATCH]) for i in range(0, len(images), MAX_BATCH)]
    row["logits"] = np.concatenate(chunks)
    row["throughput"] = {str(b): images_per_second(call, b, args) for b in args.batches}


def agreement(out: Array, ref: Array) -> dict[str, float]:
    rel = np.linalg.norm(out - ref, axis=1) / np.linalg.norm(ref, axis=1)
    return {
        "top1_agreement": float(np.mean(out.argmax(axis=1) == ref.argmax(axis=1))),
        "max_rel_l2": float(rel.max()),
        "mean_rel_l2": float(rel.mean()),
    }


def cuda_baseline(device: str) -> int:
    """Allocated bytes now, with the peak counter reset, so that later deltas are this step's."""
    if not device.startswith("cuda"):
        return 0
    gc.collect()
    torch.cuda.synchronize()
    torch.cuda.empty_cache()
    torch.cuda.reset_peak_memory_stats()
    return torch.cuda.memory_allocated()


def cuda_delta(device: str, base: int) -> dict[str, int]:
    if not device.startswith("cuda"):
        return {}
    torch.cuda.synchronize()
    now, peak = torch.cuda.memory_allocated(), torch.cuda.max_memory_allocated()
    return {"allocated_delta": now - base, "peak_delta": peak - base}


def instance_facts(inst: Any) -> Row:
    """What the instance says about itself; every part optional, the API is still moving."""
    facts: Row = {}
    if hasattr(inst, "memory_usage"):
        facts["memory_usage"] = [dataclasses.asdict(use) for use in inst.memory_usage()]
    report = getattr(inst, "precision_report", None)  # precision, guard figures, cache hit
    if dataclasses.is_dataclass(report) and not isinstance(report, type):
        facts["precision_report"] = dataclasses.asdict(report)
    gpu_path = getattr(inst, "gpu", None)
    if gpu_path is not None:
        facts["graph_batch_sizes"] = gpu_path.graphs.batch_sizes if gpu_path.graphs else None
        facts["graph_error"] = gpu_path.graph_error
        facts["graph_replays"] = gpu_path.replays  # how many of the timed batches were replays
    return facts


def run_variant(name: str, repo: Path, device: str, args: Any, images: Array) -> Row:
    backend = VARIANTS[name][0]
    model_dir = repo / name
    maker = PyTorchBackend if backend == "pytorch" else OnnxRuntimeBackend

    def load() -> Any:
        config = load_model_config(model_dir)
        return maker().load(ModelContext(config, 1, model_dir, model_dir / "1", name, device))

    row: Row = {}
    base = cuda_baseline(device)
    start = time.perf_counter()
    inst = load()
    row["load_s"] = time.perf_counter() - start
    row["gpu_memory_load"] = cuda_delta(device, base)
    try:
        half_io = name.endswith("_io")
        sent: dict[tuple[int, tuple[int, ...]], Any] = {}  # fp16 copies of inputs, made once

        def call(x: Array) -> Array:
            if half_io:  # the client's own fp16 pixels: converted once, outside the timing
                key = (x.ctypes.data, x.shape)
                if key not in sent:
                    sent[key] = x.astype(np.float16)
                x = sent[key]
            request = ModelRequest(inputs={"INPUT__0": x}, requested_outputs=("OUTPUT__0",))
            (result,) = inst.execute([request])
            if isinstance(result, Exception):
                raise result
            return np.asarray(result["OUTPUT__0"], dtype=np.float32)

        measure(row, call, args, images)
        row["gpu_memory_run"] = cuda_delta(device, base)
        row.update(instance_facts(inst))
    finally:
        inst.close()
    if VARIANTS[name][1] == "int8":  # a second load should find the first's calibration cached
        start = time.perf_counter()
        again = load()
        row["load_cached_s"] = time.perf_counter() - start
        row["precision_report_cached"] = instance_facts(again).get("precision_report")
        again.close()
    return row


def run_raw(name: str, net: nn.Module, device: str, args: Any, images: Array) -> Row:
    """The model eagerly in-process, numpy in and out as infermux does (no graphs, no pinning)."""
    dtype = TORCH_DTYPES[VARIANTS[name][1]]
    base = cuda_baseline(device)
    model = copy.deepcopy(net).to(device=device, dtype=dtype)

    def call(x: Array) -> Array:
        with torch.inference_mode():
            out: Array = model(torch.from_numpy(x).to(device).to(dtype)).float().cpu().numpy()
            return out

    row: Row = {}
    measure(row, call, args, images)
    row["gpu_memory_run"] = cuda_delta(device, base)
    if device.startswith("cuda"):
        # The model alone: the largest batch already on the GPU, timed to completion. Against the
        # rows above it says how much of a batch's time is the host side (fp32 pixels in, numpy
        # copies), which no precision setting shortens.
        batch = max(args.batches)
        x = torch.randn(batch, 3, args.size, args.size, device=device, dtype=dtype)

        def on_device(_: Array) -> Array:
            with torch.inference_mode():
                model(x)
            torch.cuda.synchronize()
            return images[:0]

        row["device_resident"] = {str(batch): images_per_second(on_device, batch, args)}
    return row


def summarise(results: dict[str, Row]) -> None:
    """Agreement and throughput ratios, recomputed whenever a row is added."""
    ref = results.get("pytorch_fp32", {}).get("logits")
    for name, row in results.items():
        backend, precision, _ = VARIANTS[name]
        fp32, raw = f"{backend}_fp32", f"raw_{precision}" if backend == "pytorch" else ""
        if "logits" not in row:
            continue
        if ref is not None:
            row["accuracy"] = agreement(row["logits"], ref)
        own = results.get(fp32, {}).get("logits")
        if own is not None and name != fp32:
            # Bit-identical to its backend's fp32: the precision parameter was not acted on.
            row["precision_applied"] = bool(np.any(row["logits"] != own))
        for key, other in (("vs_fp32", fp32), ("vs_raw", raw)):
            theirs = results.get(other, {}).get("throughput", {})
            mine = row["throughput"]
            row[key] = {b: mine[b]["median"] / theirs[b]["median"] for b in mine if b in theirs}


def markdown(doc: dict[str, Any]) -> str:
    env, config = doc["environment"], doc["config"]
    batches = [str(b) for b in config["batches"]]

    def mib(n: float) -> str:
        return f"{n / 2**20:.0f}"

    lines = [
        f"# {config['model']} at {config['size']}px: infermux precision variants",
        "",
        f"{env['device']}; torch {env['torch']}, onnxruntime {env['onnxruntime']}, "
        f"{env['nproc']} cores; model from {env['model_source']}. Agreement on "
        f"{config['agreement_images']} standard-normal images against infermux pytorch_fp32, "
        f"whose top-1 picks {doc.get('distinct_top1_classes', '?')} distinct classes.",
        "",
        f"| variant | device | load s | img/s b{' | img/s b'.join(batches)} | x fp32 | x raw "
        "| top-1 agree | max rel L2 | GPU MiB weights/buffers/graphs/workspace; load peak |",
        "|---" * (len(batches) + 8) + "|",
    ]
    for name, row in doc["results"].items():
        if "error" in row:
            lines.append(f"| {name} | {row['device']} | error: {row['error'][:200]} |")
            continue
        load = f"{row['load_s']:.1f}" if "load_s" in row else "-"
        load += f" ({row['load_cached_s']:.1f} cached)" if "load_cached_s" in row else ""
        rates = " | ".join(f"{row['throughput'][b]['median']:.0f}" for b in batches)
        ratio = {k: "/".join(f"{v:.2f}" for v in row.get(k, {}).values()) or "-" for k in ("vs_fp32", "vs_raw")}  # fmt: skip
        acc = row.get("accuracy", {"top1_agreement": float("nan"), "max_rel_l2": float("nan")})
        gpu = {u["component"]: u["byte_size"] for u in row.get("memory_usage", []) if u["kind"] == "GPU"}  # fmt: skip
        parts = ("weights", "buffers", "graphs", "workspace")
        memory = "/".join(mib(gpu.get(c, 0)) for c in parts) if gpu else ""
        peak = row.get("gpu_memory_load", row.get("gpu_memory_run", {})).get("peak_delta")
        memory += f"; {mib(peak)}" if peak is not None else ""
        flag = " (= fp32 bit for bit!)" if row.get("precision_applied") is False else ""
        lines.append(
            f"| {name}{flag} | {row['device']} | {load} | {rates} | {ratio['vs_fp32']} | "
            f"{ratio['vs_raw']} | {acc['top1_agreement']:.3f} | {acc['max_rel_l2']:.2e} | "
            f"{memory or '-'} |"
        )
    lines += [
        "",
        f"Ratios per batch size ({'/'.join(batches)}): x fp32 against the same backend's fp32, "
        "x raw against the same precision run eagerly in-process (numpy in and out, no CUDA "
        "graphs). Raw rows' peak is their whole run's.",
    ]
    resident = {
        name: next(iter(row["device_resident"].items()))
        for name, row in doc["results"].items()
        if "device_resident" in row
    }
    if resident:
        fp32 = resident.get("raw_fp32", (None, {"median": float("nan")}))[1]["median"]
        cells = ", ".join(
            f"{name.removeprefix('raw_')} {rate['median']:.0f} img/s "
            f"({rate['median'] / fp32:.2f}x fp32)"
            for name, (_, rate) in resident.items()
        )
        batch = next(iter(resident.values()))[0]
        lines += [
            "",
            f"The model alone, batch {batch} already on the GPU (eager, no copies): {cells}.",
        ]
    return "\n".join(lines) + "\n"


def environment(gpu: str, source: str) -> dict[str, Any]:
    import onnxruntime

    import infermux

    cpu = f"CPU ({platform.processor() or platform.machine()})"
    return {
        "device": torch.cuda.get_device_name(gpu) if gpu.startswith("cuda") else cpu,
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "cudnn_allow_tf32": torch.backends.cudnn.allow_tf32,  # fp32 convolutions may run as TF32
        "onnxruntime": onnxruntime.__version__,
        "infermux": infermux.__version__,
        "python": platform.python_version(),
        "nproc": NPROC,
        "model_source": source,
    }


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--tiny", action="store_true", help="ResNet-18, 64px: a smoke test")
    parser.add_argument("--out", type=Path, default=ROOT / "benchmarks/results/precision")
    parser.add_argument("--variants", default=",".join(VARIANTS), help="comma-separated")
    parser.add_argument("--seconds", type=float, help="per throughput repeat (1.0; tiny 0.3)")
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    names = args.variants.split(",")
    if set(names) - set(VARIANTS):
        parser.error(f"unknown variants {set(names) - set(VARIANTS)}; known: {', '.join(VARIANTS)}")
    args.size = 64 if args.tiny else 224
    args.batches = (1, 8) if args.tiny else (1, 8, MAX_BATCH)
    args.seconds = args.seconds or (0.3 if args.tiny else 1.0)
    count = 64 if args.tiny else 512
    gpu = "cuda:0" if torch.cuda.is_available() else "cpu"
    args.out.mkdir(parents=True, exist_ok=True)
    net, source = build_model(args.tiny, args.size, gpu)
    log(f"model built ({source}) on {gpu}; {count} agreement images at {args.size}px")
    images = np.random.default_rng(2).standard_normal((count, 3, args.size, args.size), np.float32)
    results: dict[str, Row] = {}
    doc: dict[str, Any] = {
        "config": {"model": "resnet18" if args.tiny else "resnet50", "size": args.size,
                   "batches": args.batches, "agreement_images": count, "seconds": args.seconds,
                   "repeats": args.repeats, "max_batch_size": MAX_BATCH,
                   "calibration_rows": CALIBRATION_ROWS},
        "environment": environment(gpu, source),
    }  # fmt: skip

    def save() -> None:
        summarise(results)
        ref = results.get("pytorch_fp32", {}).get("logits")
        if ref is not None:
            doc["distinct_top1_classes"] = len(np.unique(ref.argmax(axis=1)))
        doc["results"] = {n: {k: v for k, v in r.items() if k != "logits"} for n, r in results.items()}  # fmt: skip
        text = json.dumps(doc, indent=1) + "\n"
        (args.out / "resnet50.json").write_text(text)
        (args.out / "resnet50.md").write_text(markdown(json.loads(text)))  # JSON's str keys

    with tempfile.TemporaryDirectory(prefix="precision-") as tmp:
        write_repo(Path(tmp), net, args.size, names, gpu)
        for name in names:
            backend, precision, on_gpu = VARIANTS[name]
            device = gpu if on_gpu else "cpu"
            log(f"{name} on {device} ...")
            try:
                if backend == "raw":
                    row = run_raw(name, net, device, args, images)
                else:
                    row = run_variant(name, Path(tmp), device, args, images)
            except Exception as exc:  # one variant failing (a refused precision, say) is a result
                row = {"error": f"{type(exc).__name__}: {exc}".strip()[:2000]}
            results[name] = {"backend": backend, "precision": precision, "device": device, **row}
            rates = {b: round(t["median"], 1) for b, t in row.get("throughput", {}).items()}
            load = f"load {row['load_s']:.2f}s, " if "load_s" in row else ""
            log(
                f"{name}: "
                + (f"ERROR {row['error']}" if "error" in row else f"{load}img/s {rates}")
            )
            save()
    print((args.out / "resnet50.md").read_text(), flush=True)
    log(f"wrote {args.out}/resnet50.json and resnet50.md")


if __name__ == "__main__":
    main()
