"""Files a model config names, confined to the model's directory.

A config is not trusted input: in explicit mode any client that may load models can send one
(the repository API's ``config`` override), so a file name in it (``default_model_filename``,
``label_filename``, the ``calibration_data`` parameter, a warm-up ``input_data_file``) must not
reach outside ``<repository>/<model>/``: an absolute path replaces the base of a join and ``..``
climbs out of it, and for a Python model the file named is imported and run. Every such path is
built by :func:`model_path_of`, which resolves it (symlinks followed) and refuses what lands
outside, naming the field.
"""

from __future__ import annotations

from pathlib import Path

from infermux.errors import ModelLoadError


def model_path_of(model_dir: Path, base: Path, value: str, field: str, *, where: str) -> Path:
    """``base / value``, resolved, once it is known to lie inside ``model_dir``.

    ``base`` is where ``value`` is relative to (the version directory for a model file, the
    model directory for the others); ``where`` (the model) and ``field`` (the config field) start
    the refusal. A missing file is not refused here: callers say "not found" in their own words.

    Raises :class:`~infermux.errors.ModelLoadError` when the path resolves outside ``model_dir``
    or cannot be resolved at all (a NUL byte, a symlink loop).
    """
    try:
        root = model_dir.resolve()
        path = (base / value).resolve()
    except (OSError, RuntimeError, ValueError) as exc:  # RuntimeError: a loop, before 3.13
        raise ModelLoadError(f"{where}: {field} {value!r} cannot be resolved: {exc}") from None
    if not path.is_relative_to(root):
        raise ModelLoadError(
            f"{where}: {field} {value!r} resolves outside the model directory; a model config "
            "may only name files inside it (symlinks included)"
        )
    return path
