"""py-spy, failing soft (no py-spy, or ptrace not permitted): a speedscope recording of a whole
process group, its text summary, and the Python names of a process's threads.

``record`` samples the group leader with ``--subprocesses`` (so with ``--frontends N`` every front
end, the executor(s) and the supervisor are in one file) and ``--nonblocking`` (the server is not
stopped to be sampled, so it keeps its throughput). py-spy leaves idle threads out, so a thread's
sample count is the time it was running or waiting for the GIL.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from collections import Counter
from pathlib import Path
from typing import Any

INCLUSIVE_SHOWN = 25
SELF_SHOWN = 10
MIN_SHARE = 0.01  # threads with fewer samples than this share of all get one line together
_PROFILE = re.compile(r'Process (\d+) Thread (\d+)(?: "(.*)")?')
_DUMP_THREAD = re.compile(r'^Thread (0x[0-9A-Fa-f]+|\d+) \((\w+)\): "(.*)"', re.MULTILINE)


def executable() -> str | None:
    # Wheels installed with `pip --target DIR` put the binary in DIR/bin, which is not on PATH.
    candidates = [shutil.which("py-spy"), str(Path(sys.executable).parent / "py-spy")]
    candidates += [
        str(Path(entry) / "bin" / "py-spy")
        for entry in os.environ.get("PYTHONPATH", "").split(os.pathsep)
        if entry
    ]
    return next((c for c in candidates if c and Path(c).is_file()), None)


def start(
    pid: int, path: Path, seconds: float, rate: int = 100, *, native: bool = False
) -> dict[str, Any]:
    exe = executable()
    if exe is None:
        return {"error": "py-spy not found"}
    command = [
        exe,
        "record",
        "--pid",
        str(pid),
        "--duration",
        str(max(1, round(seconds))),
        "--rate",
        str(rate),
        "--format",
        "speedscope",
        "--subprocesses",
        "--output",
        str(path),
    ]
    # --native (where a Python line's time goes inside C: a CUDA call, a syscall, uvloop) has to
    # pause each process to unwind its stack; without it, sampling does not stop the server.
    command.append("--native" if native else "--nonblocking")
    path.parent.mkdir(parents=True, exist_ok=True)
    proc = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    return {"process": proc, "path": path, "command": " ".join(command), "seconds": seconds}


def finish(handle: dict[str, Any]) -> dict[str, Any]:
    if "error" in handle:
        return handle
    proc: subprocess.Popen[str] = handle["process"]
    try:
        output, _ = proc.communicate(timeout=handle["seconds"] + 30)
    except subprocess.TimeoutExpired:
        proc.kill()
        output, _ = proc.communicate()
    path: Path = handle["path"]
    result = {"command": handle["command"], "rc": proc.returncode, "output": output[-1000:]}
    if proc.returncode == 0 and path.exists():
        result["file"] = path.name
    return result


def thread_names(pid: int) -> dict[int, str]:
    """Native thread id -> Python thread name, from ``py-spy dump`` (empty when it fails)."""
    exe = executable()
    if exe is None:
        return {}
    try:
        done = subprocess.run(
            [exe, "dump", "--pid", str(pid), "--nonblocking"],
            capture_output=True,
            text=True,
            timeout=20,
        )
    except (OSError, subprocess.TimeoutExpired):
        return {}
    names = {}
    for tid, _state, name in _DUMP_THREAD.findall(done.stdout):
        if not tid.startswith("0x"):  # a pthread id, not the native one: no /proc match
            names[int(tid)] = name
    return names


def summarize(path: Path, roles: dict[int, str], title: str) -> str:
    """Per process and thread of a speedscope file: samples, then the top frames by inclusive
    share (on the stack at all) and by self share (the leaf), as in a collapsed-stack view."""
    doc = json.loads(path.read_text())
    frames = doc["shared"]["frames"]

    def label(index: int) -> str:
        f = frames[index]
        where = Path(f.get("file") or "?").name
        return f"{f['name']} ({where}:{f.get('line')})"

    # --subprocesses roots every stack in a frame per process ("process PID:<command line>")
    pseudo = {
        i
        for i, f in enumerate(frames)
        if str(f.get("name", "")).startswith("process ") and not f.get("file")
    }
    profiles = []
    for profile in doc["profiles"]:
        samples = profile.get("samples", [])
        if not samples:
            continue
        m = _PROFILE.match(profile.get("name", ""))
        pid, tid, thread = (int(m.group(1)), int(m.group(2)), m.group(3) or "") if m else (0, 0, "")
        profiles.append((len(samples), pid, tid, thread, samples, profile.get("name", "")))
    total = sum(p[0] for p in profiles)
    rate_note = ""
    if profiles:
        seconds = max(float(p.get("endValue", 0)) for p in doc["profiles"])
        rate_note = f" (non-idle samples; the longest thread: {seconds:.1f} s of samples)"
    lines = [f"# {title}", f"# {path.name}: {total} samples in {len(profiles)} threads{rate_note}"]
    profiles.sort(key=lambda p: (roles.get(p[1], "?"), p[1], -p[0]))
    small = [p for p in profiles if p[0] < MIN_SHARE * total]
    for count, pid, tid, thread, samples, name in profiles:
        if count < MIN_SHARE * total:
            continue
        inclusive: Counter[int] = Counter()
        leaf: Counter[int] = Counter()
        for stack in samples:
            inclusive.update(set(stack) - pseudo)
            if stack:
                leaf[stack[-1]] += 1
        head = f"{roles.get(pid, '?')} pid {pid} thread {tid} {thread!r}" if pid else name
        lines += [
            "",
            f"## {head}: {count} samples ({100 * count / total:.1f}% of all)",
            "  inclusive:",
        ]
        lines += [
            f"    {100 * n / count:5.1f}%  {label(i)}"
            for i, n in inclusive.most_common(INCLUSIVE_SHOWN)
        ]
        lines.append("  self (leaf):")
        lines += [
            f"    {100 * n / count:5.1f}%  {label(i)}" for i, n in leaf.most_common(SELF_SHOWN)
        ]
    if small:
        lines += [
            "",
            f"## {len(small)} threads under {100 * MIN_SHARE:.0f}% each, "
            f"{sum(p[0] for p in small)} samples: "
            + ", ".join(f"{roles.get(p[1], '?')}/{p[3] or p[2]} {p[0]}" for p in small[:20]),
        ]
    return "\n".join(lines) + "\n"
