"""deploy/kserve: the ServingRuntime and InferenceService manifests and the container file are
valid (a schema check, no cluster here) and agree with what infermux actually serves."""

from __future__ import annotations

import json
import re
import shlex
from pathlib import Path
from typing import Any, cast

import jsonschema
import yaml

from infermux.cli.serve_options import build_serve_parser
from infermux.dataplane import Operations
from infermux.frontends.http.app import HttpApp

KSERVE = Path(__file__).parents[2] / "deploy" / "kserve"


def runtime() -> dict[str, Any]:
    document: dict[str, Any] = yaml.safe_load((KSERVE / "servingruntime.yaml").read_text())
    return document


def test_the_serving_runtime_matches_the_schema() -> None:
    schema = json.loads((KSERVE / "servingruntime.schema.json").read_text())
    jsonschema.Draft202012Validator.check_schema(schema)
    jsonschema.validate(runtime(), schema)
    bad = runtime()
    bad["spec"]["protocolVersions"] = ["v3"]
    errors = list(jsonschema.Draft202012Validator(schema).iter_errors(bad))
    assert errors, "the schema must refuse what KServe refuses"


def test_the_runtime_speaks_v2_and_its_container_flags_are_infermux_flags() -> None:
    spec = runtime()["spec"]
    assert {"v2", "grpc-v2"} <= set(spec["protocolVersions"])
    (container,) = spec["containers"]
    args = container["args"]
    assert args[0] == "serve"
    flags = build_serve_parser().parse_args(args[1:])  # exits (fails the test) on a bad flag
    assert str(flags.model_repository[0]) == "/mnt/models"  # where KServe mounts storageUri
    assert flags.host == "0.0.0.0"
    assert [p["containerPort"] for p in container["ports"]] == [flags.http_port]
    annotations = runtime()["metadata"]["annotations"]
    assert int(annotations["prometheus.kserve.io/port"]) == flags.metrics_port
    routes = HttpApp(cast(Operations, object())).route_patterns
    for probe in ("readinessProbe", "livenessProbe"):
        get = container[probe]["httpGet"]
        assert get["port"] == flags.http_port
        assert any(route.match(get["path"]) for route in routes), get["path"]


def test_the_inference_service_names_the_runtime_and_a_format_it_supports() -> None:
    service = yaml.safe_load((KSERVE / "inferenceservice.yaml").read_text())
    model = service["spec"]["predictor"]["model"]
    assert model["runtime"] == runtime()["metadata"]["name"]
    formats = {f["name"] for f in runtime()["spec"]["supportedModelFormats"]}
    assert model["modelFormat"]["name"] in formats
    assert model["protocolVersion"] in runtime()["spec"]["protocolVersions"]


def test_the_container_file_runs_infermux_serve_with_valid_flags() -> None:
    text = (KSERVE / "Dockerfile").read_text()
    entrypoint = json.loads(re.search(r"^ENTRYPOINT (.*)$", text, re.M).group(1))  # type: ignore[union-attr]
    command = json.loads(re.search(r"^CMD (.*)$", text, re.M).group(1))  # type: ignore[union-attr]
    assert entrypoint == ["infermux"]
    assert command[0] == "serve"
    flags = build_serve_parser().parse_args(command[1:])
    exposed = {int(p) for p in shlex.split(re.search(r"^EXPOSE (.*)$", text, re.M).group(1))}  # type: ignore[union-attr]
    assert {flags.http_port, flags.grpc_port, flags.metrics_port} == exposed
    runtime_flags = build_serve_parser().parse_args(runtime()["spec"]["containers"][0]["args"][1:])
    assert (runtime_flags.http_port, runtime_flags.grpc_port) == (flags.http_port, flags.grpc_port)
