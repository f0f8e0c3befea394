"""Helpers shared by the test suites: tiny model repositories and a real server subprocess."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType

from infermux.settings import builtin_repository
from infermux.types import DATATYPES

IDENTITY_MODEL = """
from typing import Any


class Model:
    def execute(self, requests: list[Any]) -> list[Any]:
        return [{"OUTPUT0": r.inputs["INPUT0"]} for r in requests]
"""

# Fails requests whose first element is negative, and raises outright when asked to.
PICKY_MODEL = """
from typing import Any

import infermux


class Model:
    def execute(self, requests: list[Any]) -> list[Any]:
        out: list[Any] = []
        for r in requests:
            x = r.inputs["INPUT0"]
            if x.reshape(-1)[0] < 0:
                out.append(infermux.InvalidArgumentError("INPUT0 must not start negative"))
            elif x.reshape(-1)[0] == 13:
                raise RuntimeError("unlucky batch")
            else:
                out.append({"OUTPUT0": x * 2})
        return out
"""

SLOW_MODEL = """
import time
from typing import Any


class Model:
    def execute(self, requests: list[Any]) -> list[Any]:
        time.sleep(float(requests[0].inputs["INPUT0"].reshape(-1)[0]))
        return [{"OUTPUT0": r.inputs["INPUT0"]} for r in requests]
"""


def parameter(key: str, value: str) -> str:
    """One config.pbtxt ``parameters`` entry with a string value."""
    return f'parameters {{ key: "{key}" value {{ string_value: "{value}" }} }}\n'


def config_type(datatype: str) -> str:
    return "TYPE_STRING" if datatype == "BYTES" else f"TYPE_{datatype}"


def write_model(
    repo: Path,
    name: str,
    *,
    datatype: str = "FP32",
    dims: str = "[ -1 ]",
    max_batch_size: int = 8,
    source: str = IDENTITY_MODEL,
    extra: str = "dynamic_batching { }",
    versions: Sequence[int] = (1,),
) -> Path:
    """An identity-shaped python model ``INPUT0 -> OUTPUT0`` in ``repo``."""
    model_dir = repo / name
    model_dir.mkdir(parents=True, exist_ok=True)
    if max_batch_size == 0:
        extra = extra.replace("dynamic_batching { }", "")
    (model_dir / "config.pbtxt").write_text(
        f'name: "{name}"\nbackend: "python"\nmax_batch_size: {max_batch_size}\n'
        f'input [ {{ name: "INPUT0", data_type: {config_type(datatype)}, dims: {dims} }} ]\n'
        f'output [ {{ name: "OUTPUT0", data_type: {config_type(datatype)}, dims: {dims} }} ]\n'
        f"{extra}\n"
    )
    for version in versions:
        (model_dir / str(version)).mkdir(exist_ok=True)
        (model_dir / str(version) / "model.py").write_text(source)
    return model_dir


def write_classifier(
    repo: Path, name: str, labels: Sequence[str], *, datatype: str = "FP32", max_batch_size: int = 8
) -> Path:
    """An identity model (:func:`write_model`) whose OUTPUT0 has ``labels`` as its
    ``label_filename`` (``labels.txt``): the input values are the scores of the classes."""
    model_dir = write_model(repo, name, datatype=datatype, max_batch_size=max_batch_size)
    config = model_dir / "config.pbtxt"
    output = f'output [ {{ name: "OUTPUT0", data_type: {config_type(datatype)}, dims: [ -1 ]'
    config.write_text(config.read_text().replace(output, output + ', label_filename: "labels.txt"'))
    (model_dir / "labels.txt").write_text("".join(f"{label}\n" for label in labels))
    return model_dir


def identity_name(datatype: str) -> str:
    return f"identity_{datatype.lower()}"


def write_datatype_repository(repo: Path) -> None:
    """One identity model per V2 datatype, named ``identity_<datatype>``."""
    for datatype in DATATYPES:
        write_model(repo, identity_name(datatype), datatype=datatype)


_LOG_TAIL_LINES = 60
"""How much of a server's log a failed test shows."""

_READY = re.compile(r"ready: HTTP on https?://([^:]+):(\d+)")
_GRPC = re.compile(r"gRPC on ([0-9.]+):(\d+)")
_METRICS = re.compile(r"metrics on http://([0-9.]+):(\d+)/metrics")


@dataclass
class ServerProcess:
    """A real ``infermux serve`` subprocess; its stderr is collected in ``log``."""

    process: subprocess.Popen[str]
    host: str = ""
    http_port: int = 0
    grpc_port: int = 0
    metrics_port: int = 0
    log: list[str] = field(default_factory=list)
    reader: threading.Thread | None = None

    @property
    def url(self) -> str:
        return f"{self.host}:{self.http_port}"

    @property
    def grpc_url(self) -> str:
        return f"{self.host}:{self.grpc_port}"

    @property
    def metrics_url(self) -> str:
        return f"http://{self.host}:{self.metrics_port}/metrics"

    def children(self) -> list[int]:
        """Process ids of the server's front-end and executor processes (Linux only; not
        multiprocessing's resource tracker, also a child)."""
        pid = self.process.pid
        found = []
        for child in Path(f"/proc/{pid}/task/{pid}/children").read_text().split():
            try:
                command = Path(f"/proc/{child}/cmdline").read_bytes()
            except OSError:  # exited meanwhile
                continue
            if b"spawn_main" in command:
                found.append(int(child))
        return found

    def stop(self, sig: int = signal.SIGTERM, timeout: float = 30) -> int:
        if self.process.poll() is None:
            self.process.send_signal(sig)
        return self.process.wait(timeout)

    def __enter__(self) -> ServerProcess:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if self.process.poll() is None:
            self.process.kill()
            self.process.wait(10)
        if self.reader is not None:
            self.reader.join(10)
        if self.process.stderr is not None:
            self.process.stderr.close()
        if exc is not None:
            # pytest shows a failed test's stderr: the server's side of a failure that is not
            # reproduced on demand (a flake seen once in CI) is then in the CI output.
            tail = "\n".join(self.log[-_LOG_TAIL_LINES:])
            print(f"--- the server's last {_LOG_TAIL_LINES} log lines ---\n{tail}", file=sys.stderr)


def wait_for(condition: Callable[[], bool], timeout: float = 60) -> None:
    """Poll ``condition`` until it holds (AssertionError after ``timeout`` seconds)."""
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError("timed out")
        time.sleep(0.05)


def failures_until_answered(
    call: Callable[[], object], what: str, timeout: float = 120
) -> set[str]:
    """Call ``call`` until it returns; the statuses of the InferenceServerExceptions it raised
    meanwhile (an AssertionError naming ``what`` when it never answers in ``timeout`` seconds)."""
    from tritonclient.utils import InferenceServerException

    statuses: set[str] = set()
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            call()
        except InferenceServerException as exc:
            statuses.add(str(exc.status()))
            time.sleep(0.05)
            continue
        return statuses
    raise AssertionError(f"{what} never came back")


def start_server(*args: str, timeout: float = 120, no_arg_default: bool = False) -> ServerProcess:
    """Start ``infermux serve`` on free ports and wait until it reports ready.

    Without ``--model-repository`` it serves the small built-in examples; ``no_arg_default`` serves
    what a bare ``infermux serve`` serves (which adds the slower-loading embeddings example when
    its extra is installed).
    """
    command = [sys.executable, "-m", "infermux", "serve", "--http-port", "0"]
    command += ["--grpc-port", "0", "--metrics-port", "0", *args]
    if "--frontends" not in args:  # one process unless a test asks otherwise (auto may be more)
        command += ["--frontends", "1"]
    given = {arg.partition("=")[0] for arg in args}
    if not no_arg_default and not given & {"--model-repository", "--model-store"}:
        command += ["--model-repository", str(builtin_repository())]
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    process = subprocess.Popen(
        command, stderr=subprocess.PIPE, stdout=subprocess.DEVNULL, text=True, env=env
    )
    server = ServerProcess(process)
    ready = threading.Event()

    def pump() -> None:
        assert process.stderr is not None
        for line in process.stderr:
            server.log.append(line.rstrip("\n"))
            match = _READY.search(line)
            if match:
                server.host, server.http_port = match.group(1), int(match.group(2))
                grpc = _GRPC.search(line)
                server.grpc_port = int(grpc.group(2)) if grpc else 0
                metrics = _METRICS.search(line)
                server.metrics_port = int(metrics.group(2)) if metrics else 0
                ready.set()

    server.reader = threading.Thread(target=pump, daemon=True)
    server.reader.start()
    deadline = time.monotonic() + timeout
    while not ready.wait(0.05):
        if process.poll() is not None or time.monotonic() > deadline:
            server.__exit__(None, None, None)
            log = "\n".join(server.log)
            raise RuntimeError(f"infermux serve did not become ready:\n{log}")
    return server


# Returns the request's parameters as a JSON string (BYTES output), to see what reached the model.
PARAMETERS_MODEL = """
import json
from typing import Any

import numpy as np


class Model:
    def execute(self, requests: list[Any]) -> list[Any]:
        seen = [json.dumps(r.parameters, sort_keys=True).encode() for r in requests]
        return [{"OUTPUT0": np.array([[s]], dtype=object)} for s in seen]
"""
