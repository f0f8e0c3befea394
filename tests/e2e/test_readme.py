"""The README's examples run as written against a real server."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import httpx
import numpy as np
import pytest

from tests.support import ServerProcess

pytestmark = pytest.mark.e2e

README = (Path(__file__).parents[2] / "README.md").read_text()


def blocks(language: str) -> list[str]:
    return re.findall(rf"```{language}\n(.*?)```", README, flags=re.DOTALL)


def test_readme_set_up_is_two_commands() -> None:
    commands = blocks("bash")[:2]
    assert commands == ["pip install . && infermux serve\n", "scripts/test\n"]
    ci = (Path(__file__).parents[2] / ".ci" / "run").read_text()
    assert "exec scripts/test" in ci


def test_readme_metrics_example(examples_server: ServerProcess) -> None:
    curl = next(b for b in blocks("bash") if "/metrics" in b)
    address = f"127.0.0.1:{examples_server.metrics_port}"
    url = shlex.split(curl)[2].replace("localhost:8002", address)
    pattern = re.search(r"grep '\^?([^']+)'", curl)
    assert pattern is not None
    text = httpx.get(f"http://{url}").text
    lines = [line for line in text.splitlines() if line.startswith(pattern.group(1))]
    assert any('model="simple"' in line for line in lines), text[:500]


def test_readme_curl_example(examples_server: ServerProcess) -> None:
    curl = next(b for b in blocks("bash") if b.startswith("curl"))
    args = shlex.split(curl)
    url = args[2].replace("localhost:8000", examples_server.url)
    body = args[args.index("-d") + 1]
    reply = httpx.post(f"http://{url}", content=body)
    assert reply.status_code == 200, reply.text
    assert reply.json()["outputs"][0]["data"] == list(range(1, 17))


def test_readme_python_example(
    examples_server: ServerProcess, capsys: pytest.CaptureFixture[str]
) -> None:
    (code,) = blocks("python")
    namespace: dict[str, object] = {}
    exec(code.replace("localhost:8000", examples_server.url), namespace)
    printed = capsys.readouterr().out
    assert str(np.arange(1, 17).reshape(1, 16)).split("\n")[0] in printed
    client = namespace["client"]
    client.close()  # type: ignore[attr-defined]
