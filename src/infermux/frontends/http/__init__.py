"""KServe V2 / Triton HTTP front end (raw ASGI on uvicorn)."""

from infermux.frontends.http.app import HttpApp
from infermux.frontends.http.server import HttpServer

__all__ = ["HttpApp", "HttpServer"]
