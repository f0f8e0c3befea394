"""One Ray Serve replica of one model: infermux's own repository, batcher and runtime for that
model, behind the methods the ingress calls through a deployment handle.

Answers are tagged tuples rather than raised exceptions: an error keeps its code and reason
exactly (``("error", code, reason, message)``) instead of travelling as a ``RayTaskError``.
A decoupled model's responses are streamed (``infer_stream``, ``streams.py``).
"""

from __future__ import annotations

import dataclasses
import logging
import os
from collections.abc import AsyncIterator
from typing import Any

from infermux.dataplane.assembly import build_dataplane, build_repository
from infermux.errors import InfermuxError, UnavailableError
from infermux.ray.streams import Window
from infermux.settings import ServerSettings
from infermux.types import InferRequest

logger = logging.getLogger(__name__)

Reply = tuple[Any, ...]


def error_reply(exc: InfermuxError) -> Reply:
    return ("error", exc.code.value, exc.reason.value, exc.message)


class ModelReplica:
    """The deployment body (``serve.deployment`` wraps it in ``ray/deploy.py``)."""

    async def __init__(  # type: ignore[misc]
        self, settings: ServerSettings, model: str, revision: str = ""
    ) -> None:
        # One model, loaded at start, no metrics port and no front ends of its own: the ingress
        # has them. Explicit mode keeps this replica from loading the rest of the repository.
        self._model = model
        self._settings = dataclasses.replace(
            settings,
            model_control_mode="explicit",
            load_models=(model,),
            allow_metrics=False,
            frontends=1,
            executors=1,
            ray_address="",
        )
        self._repository = build_repository(self._settings)
        self._plane = build_dataplane(self._settings, self._repository)
        await self._repository.start()
        if not self._repository.is_ready(model):
            reasons = [e.reason for e in self._repository.index() if e.name == model and e.reason]
            await self._repository.close()
            raise RuntimeError(f"model '{model}' did not load: {'; '.join(reasons) or 'unknown'}")
        logger.info("replica of model '%s' (files %s) ready, pid %d", model, revision, os.getpid())

    async def infer(self, request: InferRequest, routing_key: str = "") -> Reply:
        try:
            return ("ok", await self._plane.infer(request))
        except InfermuxError as exc:
            return error_reply(exc)

    async def infer_stream(
        self, request: InferRequest, routing_key: str = "", stream: str = "", credits: Any = None
    ) -> AsyncIterator[Reply]:
        """A decoupled model's responses, ``("ok", response)`` each as it comes, within the
        credit of ``stream`` (``credits``: the ingress's StreamCredits actor); a failure is the
        last item. Ray cancels this generator when the ingress gives the request up, which
        closes the data plane's stream: the model sees its request cancelled."""
        window = Window(credits, stream)
        responses = self._plane.infer_stream(request)
        try:
            while await window.spend():
                response = await anext(responses, None)
                if response is None:
                    return
                yield ("ok", response)
                if response.final:
                    return
        except InfermuxError as exc:
            yield error_reply(exc)
        finally:
            aclose = getattr(responses, "aclose", None)  # where it did not end: gives it up
            if aclose is not None:
                await aclose()

    async def describe(self, version: str = "") -> Reply:
        """Metadata and config of a served version (the ingress caches them)."""
        try:
            return (
                "ok",
                await self._plane.model_metadata(self._model, version),
                await self._plane.model_config(self._model, version),
            )
        except InfermuxError as exc:
            return error_reply(exc)

    async def ready(self, version: str = "") -> bool:
        return await self._plane.model_ready(self._model, version)

    async def statistics(self, version: str = "") -> Reply:
        try:
            return ("ok", await self._plane.model_statistics(self._model, version))
        except InfermuxError as exc:
            return error_reply(exc)

    async def check_health(self) -> None:
        """Ray Serve's health check: a replica whose model is no longer ready is replaced."""
        if not self._repository.is_ready(self._model):
            raise UnavailableError(f"model '{self._model}' is not ready on this replica")

    async def __del__(self) -> None:
        # Ray Serve calls this on graceful shutdown, after in-flight requests finished.
        self._plane.begin_shutdown()
        await self._repository.close()
