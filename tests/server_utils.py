"""Start real servers on 127.0.0.1 for tests: a `specprefill serve` process, or an app in a thread."""

from __future__ import annotations

import contextlib
import os
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

from specprefill_sdk.types import Prompt, TokenScores

ROOT = Path(__file__).resolve().parents[1]
_SERVE = (
    "import argparse, sys; from specprefill_sdk.cli import serve as cli; p = argparse.ArgumentParser(); "
    "cli.add_arguments(p); sys.exit(cli.main(p.parse_args(sys.argv[1:])))"
)


class ExplodingDraft:
    """A draft scorer whose model fails on every call (e.g. out of memory on its GPU)."""

    name = "draft-attention"
    model_name = "exploding-draft"

    def score(self, prompt: Prompt) -> TokenScores:
        raise RuntimeError("draft exploded")

    def score_batch(self, prompts: Sequence[Prompt]) -> list[TokenScores]:
        raise RuntimeError("draft exploded")


def free_port() -> int:
    """A TCP port that is free on 127.0.0.1 right now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def wait_for_health(base: str, timeout: float = 120.0, proc: subprocess.Popen[bytes] | None = None) -> dict[str, Any]:
    """Poll ``GET {base}/health`` until it answers 200; raise with the server's output if it dies."""
    deadline = time.monotonic() + timeout
    last: Exception | None = None
    while time.monotonic() < deadline:
        if proc is not None and proc.poll() is not None:
            out = proc.stdout.read().decode(errors="replace") if proc.stdout else ""
            raise RuntimeError(f"the server exited with {proc.returncode}:\n{out[-4000:]}")
        try:
            response = httpx.get(f"{base}/health", timeout=2.0)
            if response.status_code == 200:
                return dict(response.json())
        except httpx.HTTPError as exc:
            last = exc
        time.sleep(0.2)
    raise TimeoutError(f"{base}/health did not answer within {timeout}s ({last})")


@dataclass
class ServerProcess:
    """A running server process: ``base`` is ``http://127.0.0.1:PORT``, ``api`` adds ``/v1``."""

    proc: subprocess.Popen[bytes]
    port: int
    log_path: Path

    @property
    def base(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def api(self) -> str:
        return f"{self.base}/v1"

    def alive(self) -> bool:
        return self.proc.poll() is None

    def log(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=5)


def start_server(
    args: Sequence[str], log_path: Path, *, env: dict[str, str] | None = None, timeout: float = 180.0
) -> ServerProcess:
    """Start ``specprefill serve ARGS --port <free>`` on 127.0.0.1 and wait for ``/health``."""
    port = free_port()
    full_env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_VERBOSITY": "error", **(env or {})}
    full_env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), full_env.get("PYTHONPATH")]))
    log = log_path.open("wb")
    proc = subprocess.Popen(
        [sys.executable, "-c", _SERVE, *args, "--host", "127.0.0.1", "--port", str(port), "--log-level", "warning"],
        stdout=log,
        stderr=subprocess.STDOUT,
        env=full_env,
        cwd=str(ROOT),
    )
    server = ServerProcess(proc, port, log_path)
    deadline = time.monotonic() + timeout
    while True:
        if proc.poll() is not None:
            raise RuntimeError(f"the server exited with {proc.returncode}:\n{server.log()[-4000:]}")
        try:
            if httpx.get(f"{server.base}/health", timeout=2.0).status_code == 200:
                return server
        except httpx.HTTPError:
            pass
        if time.monotonic() > deadline:
            server.stop()
            raise TimeoutError(f"the server did not become healthy in {timeout}s:\n{server.log()[-4000:]}")
        time.sleep(0.25)


@contextlib.contextmanager
def serve_in_thread(app: Any) -> Iterator[str]:
    """Serve an ASGI app with uvicorn in a thread on 127.0.0.1; yields ``http://127.0.0.1:PORT``."""
    import uvicorn

    port = free_port()
    config = uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning", lifespan="on")
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    base = f"http://127.0.0.1:{port}"
    try:
        wait_for_health(base, timeout=60.0)
        yield base
    finally:
        server.should_exit = True
        thread.join(timeout=15)
