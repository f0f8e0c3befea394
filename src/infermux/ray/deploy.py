"""The repository's models as Ray Serve applications, one per model, kept current.

Each model is its own application (``infermux-<model>``, one deployment, no HTTP route: Ray's
proxy is not used), so that a model is deployed, rolled or deleted on its own. The deployment's
``version`` is a digest of the model's files: a changed model rolls through its replicas (Ray
Serve starts new ones, moves traffic once they are healthy, and drains the old ones), and an
unchanged one is left alone.
"""

from __future__ import annotations

import hashlib
import logging
import time
from dataclasses import dataclass
from typing import Any

import ray
from ray import serve
from ray.serve.api import RunTarget, _run_many
from ray.serve.config import RequestRouterConfig

from infermux.errors import ConfigError, ErrorCode, ModelLoadError, NotFoundError
from infermux.model_config import ModelConfig
from infermux.ray.affinity import AffinityRouter
from infermux.ray.options import deployment_options
from infermux.ray.replica import ModelReplica
from infermux.repository import load_model_config
from infermux.repository.layout import ModelSource, discover_models, fingerprint
from infermux.settings import ServerSettings
from infermux.types import RepositoryIndexEntry

logger = logging.getLogger(__name__)

APP_PREFIX = "infermux-"
DEPLOYMENT = "model"
NAMESPACE = "infermux"
CONSTRUCTOR_RETRIES = 3  # a model that cannot load fails its deploy instead of retrying forever
DEPLOY_WAIT_S = 300.0  # how long start-up and a load call wait for an application to run
WAIT_POLL_S = 0.25

_STATES = {
    "RUNNING": "READY",
    "DEPLOYING": "LOADING",
    "NOT_STARTED": "LOADING",
    "DEPLOY_FAILED": "UNAVAILABLE",
    "UNHEALTHY": "UNAVAILABLE",
    "DELETING": "UNLOADING",
}


def app_name(model: str) -> str:
    return APP_PREFIX + model


@dataclass
class Deployed:
    config: ModelConfig
    version: str


class Deployer:
    """Deploys models to the Ray cluster at ``settings.ray_address``. Blocking calls: the ingress
    runs them in a thread."""

    def __init__(self, settings: ServerSettings) -> None:
        self._settings = settings
        self.deployed: dict[str, Deployed] = {}
        self.failures: dict[str, str] = {}

    def connect(self) -> None:
        ray.init(
            address=self._settings.ray_address,
            namespace=NAMESPACE,
            ignore_reinit_error=True,
            log_to_driver=False,
            logging_level=logging.WARNING,
        )
        serve.start(proxy_location="Disabled")  # the ingress is infermux's own front ends

    def models(self) -> dict[str, ModelSource]:
        return discover_models(self._settings.model_repositories)

    def wanted(self) -> list[str]:
        """The models to deploy at start (every one, or ``--load-model`` in explicit mode)."""
        found = self.models()
        if self._settings.model_control_mode != "explicit":
            return sorted(found)
        if "*" in self._settings.load_models:
            return sorted(found)
        return [m for m in self._settings.load_models if m in found]

    def submit(self, name: str, config_override: str | None = None) -> None:
        """Send ``name``'s application to Ray Serve (deploy, or roll to its current files) without
        waiting for it to run (``wait`` does). Raises NotFoundError or ConfigError naming the
        parameter."""
        source = self.models().get(name)
        if source is None:
            raise NotFoundError(f"failed to load '{name}', no version is available")
        try:
            config = load_model_config(source.path, config_override)
            options = deployment_options(config)
        except ConfigError as exc:
            self.failures[name] = str(exc)
            raise
        version = _version(source, config_override)
        deployment: Any = serve.deployment(
            ModelReplica,
            name=DEPLOYMENT,
            request_router_config=RequestRouterConfig(
                request_router_class=AffinityRouter  # type: ignore[arg-type]
            ),
            max_constructor_retry_count=CONSTRUCTOR_RETRIES,
            **options.as_kwargs(),
        )
        logger.info("deploying model '%s' to Ray (%s)", name, _describe(options.as_kwargs()))
        # The files' digest is an argument of the replicas: Serve rolls a deployment whose
        # arguments changed and leaves an unchanged one alone.
        app = deployment.bind(self._settings, name, version)
        # serve.run would block until the application runs, forever when the cluster lacks the
        # resources; its non-waiting form lets the ingress bound the wait and keep serving.
        _run_many(
            [RunTarget(target=app, name=app_name(name), route_prefix=None)],
            wait_for_applications_running=False,
        )
        self.deployed[name] = Deployed(config, version)

    def state(self, name: str) -> tuple[str, str]:
        """Ray's status of ``name``'s application (``RUNNING``, ``DEPLOYING``, ...) and its
        message. The controller takes a deploy before ``submit`` returns, so a roll reads
        ``DEPLOYING`` from then until its new replicas serve (an unchanged model stays
        ``RUNNING``: there is nothing to roll)."""
        app = serve.status().applications.get(app_name(name))
        if app is None:
            return "NOT_STARTED", ""
        return _status(app), app.message

    def wait(self, name: str, timeout_s: float) -> None:
        """Block until ``name`` runs; ModelLoadError when its deploy failed or is still going
        after ``timeout_s`` (it keeps going: Ray places it when resources appear)."""
        deadline = time.monotonic() + timeout_s
        while True:
            status, message = self.state(name)
            if status == "RUNNING":
                self.failures.pop(name, None)
                return
            if status in ("DEPLOY_FAILED", "UNHEALTHY"):
                self.failures[name] = f"Ray deploy failed: {message}"
                raise ModelLoadError(f"model '{name}': {self.failures[name]}")
            if time.monotonic() > deadline:  # waiting for resources: no fault of the model's
                self.failures[name] = f"not running after {timeout_s:g} s: {message or status}"
                raise ModelLoadError(
                    f"model '{name}': {self.failures[name]}", ErrorCode.UNAVAILABLE
                )
            time.sleep(WAIT_POLL_S)

    def deploy(self, name: str, config_override: str | None = None) -> None:
        """Submit and wait (up to ``DEPLOY_WAIT_S``)."""
        self.submit(name, config_override)
        self.wait(name, DEPLOY_WAIT_S)

    def undeploy(self, name: str) -> None:
        if name not in self.models():
            raise NotFoundError(f"failed to unload '{name}', no model by that name")
        serve.delete(app_name(name))
        self.deployed.pop(name, None)

    def undeploy_all(self, timeout_s: float = 60.0) -> None:
        """Delete every application this ingress deployed, together (each finishes what its
        replicas hold), waiting up to ``timeout_s``."""
        names = [app_name(n) for n in self.deployed]
        for name in names:
            serve.delete(name, _blocking=False)
        self.deployed.clear()
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if not set(names) & set(serve.status().applications):
                return
            time.sleep(WAIT_POLL_S)

    def changed(self) -> list[str]:
        """Deployed models whose files changed since their deploy (poll mode rolls them)."""
        sources = self.models()
        return [
            name
            for name, deployed in self.deployed.items()
            if name in sources and _version(sources[name], None) != deployed.version
        ]

    def index(self) -> list[RepositoryIndexEntry]:
        applications: dict[str, Any] = serve.status().applications
        rows = []
        for name in sorted(self.models()):
            app = applications.get(app_name(name))
            if app is not None:
                state = _STATES.get(_status(app), "UNAVAILABLE")
                reason = app.message if state != "READY" else ""
                rows.append(RepositoryIndexEntry(name, "", state, reason))
            elif name in self.failures:
                rows.append(RepositoryIndexEntry(name, "", "UNAVAILABLE", self.failures[name]))
            else:
                rows.append(RepositoryIndexEntry(name, "", "", ""))
        return rows

    def all_running(self) -> bool:
        """Every deployed model's application runs (one status call for all of them)."""
        applications = serve.status().applications
        return all(
            (app := applications.get(app_name(name))) is not None and _status(app) == "RUNNING"
            for name in list(self.deployed)  # a copy: loads may change it meanwhile
        )


def _status(app: Any) -> str:
    return str(getattr(app.status, "value", app.status))


def _version(source: ModelSource, override: str | None) -> str:
    digest = hashlib.blake2b(repr(fingerprint(source.path)).encode(), digest_size=8)
    if override is not None:
        digest.update(override.encode())
    return digest.hexdigest()


def _describe(kwargs: dict[str, Any]) -> str:
    replicas = kwargs.get("autoscaling_config") or kwargs.get("num_replicas")
    return f"replicas {replicas}, per replica {kwargs['ray_actor_options']}"
