"""A model directory made of a load request's files (Triton's ``file:<version>/<name>`` override).

A client may send the files of a model with its load request instead of placing them in a
repository. The model is then loaded from a new temporary directory that holds exactly those
files (the request's ``config`` is the configuration; Triton requires one with files). Every path
is checked before anything is written: relative, no ``.`` or ``..`` component, no component
longer than the file system allows (NAME_MAX), nothing outside the directory; a bad one refuses
the whole request (INVALID_ARG) naming it, and the server's files are never touched.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
from collections.abc import Mapping
from pathlib import Path, PurePosixPath

from infermux.errors import InvalidArgumentError

FILE_PREFIX = "file:"
"""How a load parameter names an override file: ``file:1/model.onnx``."""

NAME_MAX = 255  # bytes in one path component (Linux's NAME_MAX)


def parameter_name(path: str) -> str:
    """The load parameter that carried the file at ``path`` (for error messages)."""
    return f"{FILE_PREFIX}{path}"


def check_name(name: str) -> None:
    """Refuse a model name that cannot be a directory name of its own (the override's)."""
    if not name or name in (".", "..") or "/" in name or "\0" in name:
        raise InvalidArgumentError(f"model name '{name}' cannot be loaded from override files")
    if len(name.encode()) > NAME_MAX:
        raise InvalidArgumentError(
            f"model name is longer than {NAME_MAX} bytes: it cannot be loaded from override files"
        )


def check_path(path: str) -> PurePosixPath:
    """``path`` as a relative path inside a model directory; InvalidArgumentError naming the
    parameter when it is absolute, empty, has ``.`` / ``..`` / empty components or one longer
    than NAME_MAX bytes."""
    what = f"load parameter '{parameter_name(path)}'"
    if not path or "\0" in path or "\\" in path:
        raise InvalidArgumentError(f"{what}: not a valid file path")
    if path.startswith("/"):
        raise InvalidArgumentError(f"{what}: the path must be relative to the model directory")
    parts = path.split("/")
    for part in parts:
        if part in ("", ".", ".."):
            raise InvalidArgumentError(
                f"{what}: the path must stay inside the model directory "
                "(no empty, '.' or '..' component)"
            )
        if len(part.encode()) > NAME_MAX:
            raise InvalidArgumentError(f"{what}: a path component is longer than {NAME_MAX} bytes")
    return PurePosixPath(*parts)


def materialize(name: str, files: Mapping[str, bytes]) -> Path:
    """Write ``files`` (path relative to the model directory -> content) into a new temporary
    directory and return the model directory in it (named ``name``); remove it with
    :func:`discard`. Raises InvalidArgumentError naming the first bad parameter, having written
    nothing (or removed what it wrote)."""
    check_name(name)
    checked = [(check_path(path), path, data) for path, data in files.items()]
    root = Path(tempfile.mkdtemp(prefix="infermux-override-"))
    model_dir = root / name
    try:
        model_dir.mkdir()
        for relative, path, data in checked:
            _write(model_dir, relative, path, data)
    except BaseException:
        discard(model_dir)
        raise
    return model_dir


def _write(model_dir: Path, relative: PurePosixPath, path: str, data: bytes) -> None:
    target = model_dir.joinpath(*relative.parts)
    # Only directories made here lie below model_dir (no symlinks), and no component is '..':
    # the target cannot be elsewhere. Checked anyway, as the write is the harm to prevent.
    inside = os.path.realpath(model_dir)
    if os.path.commonpath([os.path.realpath(target.parent), inside]) != inside:
        raise InvalidArgumentError(
            f"load parameter '{parameter_name(path)}': the path leaves the model directory"
        )
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | getattr(os, "O_CLOEXEC", 0)
        fd = os.open(target, flags, 0o600)
        with open(fd, "wb") as out:
            out.write(data)
    except OSError as exc:  # e.g. "1/x" and "1/x/y" both sent: a file where a directory goes
        raise InvalidArgumentError(
            f"load parameter '{parameter_name(path)}': cannot write the file: {exc.strerror}"
        ) from exc


def discard(model_dir: Path | None) -> None:
    """Remove an override's temporary directory (the parent :func:`materialize` made)."""
    if model_dir is None:
        return
    with contextlib.suppress(OSError):
        shutil.rmtree(model_dir.parent)
