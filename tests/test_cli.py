"""The ``specprefill`` command, run as a real process: JSON output, tables, and one-line errors."""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
JSON_KEYS = {
    "text",
    "finish_reason",
    "prompt_tokens",
    "kept_tokens",
    "completion_tokens",
    "keep_ratio",
    "timings_ms",
    "model",
    "draft",
    "policy",
    "selector",
    "reason",
    "fallback",
    "warmup_s",
}
TIMING_KEYS = {"score", "select", "prefill", "ttft", "total"}


def cli(*args: str, stdin: str | bytes | None = None, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    """Run ``python -m specprefill_sdk ARGS`` from the repository root."""
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "PYTHONUNBUFFERED": "1"}
    data = stdin.decode("latin-1") if isinstance(stdin, bytes) else stdin
    return subprocess.run(
        [sys.executable, "-m", "specprefill_sdk", *args],
        cwd=ROOT,
        env=env,
        input=data if data is not None else "",
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def assert_one_line_error(result: subprocess.CompletedProcess[str], *fragments: str) -> None:
    assert result.returncode != 0, result.stdout
    assert "Traceback" not in result.stderr, result.stderr
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith("error:"), lines[0]
    for fragment in fragments:
        assert fragment in lines[0], lines[0]
    assert result.stdout == ""


# ---------------------------------------------------------------------------------------------- bad input
@pytest.mark.parametrize(
    ("args", "fragments"),
    [
        (("run", "--prompt", "   "), ("prompt is empty",)),
        (("run", "--prompt", ""), ("prompt is empty",)),
        (("run",), ("no prompt given",)),
        (("run", "--prompt", "hi", "--keep", "0"), ("--keep", "(0, 1]")),
        (("run", "--prompt", "hi", "--keep", "1.5"), ("--keep", "(0, 1]")),
        (("run", "--prompt", "hi", "--keep", "-0.2"), ("--keep",)),
        (("run", "--prompt", "hi", "--keep", "lots"), ("--keep", "'lots'")),
        (("run", "--prompt", "hi", "--keep", "nan"), ("--keep",)),
        (("run", "--prompt", "hi", "--keep", "0.2", "--policy", "paper"), ("not allowed with",)),
        (("run", "--prompt", "hi", "--policy", "fastest"), ("unknown policy 'fastest'", "paper", "conservative")),
        (("run", "--prompt", "hi", "--max-tokens", "0"), ("--max-tokens",)),
        (("run", "--prompt", "hi", "--temperature", "-1"), ("--temperature",)),
        (("run", "--prompt-file", "/nonexistent/prompt.txt"), ("prompt file not found",)),
        (("run", "--prompt-file", "/"), ("is a folder",)),
        (("run", "--messages-file", "/nonexistent/chat.json"), ("messages file not found",)),
        (("run", "--prompt", "hi", "--unknown-flag"), ("unrecognized arguments",)),
        (("run", "--prompt", "hi", "--dtype", "int3"), ("unknown dtype 'int3'",)),
        (("frobnicate",), ("invalid choice",)),
        (("policies", "fastest"), ("unknown policy",)),
        (("serve", "--max-model-len", "4096"), ("--max-model-len: vLLM engine options", "--engine vllm")),
        (("serve", "--engine", "vllm", "--gpu-memory-utilization", "1.5"), ("--gpu-memory-utilization", "(0, 1]")),
    ],
)
def test_bad_arguments_give_one_error_line(args: tuple[str, ...], fragments: tuple[str, ...]) -> None:
    assert_one_line_error(cli(*args), *fragments)


def test_the_vllm_engine_without_vllm_says_what_to_install() -> None:
    pytest.importorskip("torch")
    if importlib.util.find_spec("vllm") is not None:
        pytest.skip("vLLM is installed here")
    assert_one_line_error(cli("serve", "--engine", "vllm", "--port", "0"), "vLLM is not installed", "[vllm]")


def test_non_utf8_prompt_file(tmp_path: Path) -> None:
    path = tmp_path / "latin1.txt"
    path.write_bytes("Café crème, naïve façade".encode("latin-1"))
    assert_one_line_error(cli("run", "--prompt-file", str(path)), "not UTF-8", "0xe9")


def test_empty_prompt_file_and_stdin(tmp_path: Path) -> None:
    path = tmp_path / "empty.txt"
    path.write_text("\n\n  \n")
    assert_one_line_error(cli("run", "--prompt-file", str(path)), "prompt is empty")
    assert_one_line_error(cli("run", "--prompt-file", "-", stdin="   "), "prompt is empty")


@pytest.mark.parametrize(
    ("content", "fragments"),
    [
        ('[{"role": "user", "content": "hi"}', ("not valid JSON", "line 1")),
        ('{"role": "user", "content": "hi"}', ("JSON list",)),
        ("[]", ("must not be empty",)),
        ('[{"role": "user"}]', ("'content'",)),
        ('[{"content": "hi"}]', ("'role'",)),
        ('["hello"]', ("mapping",)),
        ('[{"role": "user", "content": "  "}]', ("empty",)),
    ],
)
def test_bad_messages_files(tmp_path: Path, content: str, fragments: tuple[str, ...]) -> None:
    path = tmp_path / "chat.json"
    path.write_text(content)
    assert_one_line_error(cli("run", "--messages-file", str(path)), *fragments)


def test_unknown_model() -> None:
    assert_one_line_error(cli("run", "--prompt", "hi", "--model", "no-such-model-xyz"), "unknown model", "smollm2")


def test_missing_optional_dependency_and_missing_command_module() -> None:
    code = (
        "import sys; sys.modules['uvicorn'] = None; sys.modules['fastapi'] = None;"
        "sys.modules['specprefill_sdk.cli.eval'] = None;"
        "from specprefill_sdk.cli import main; raise SystemExit(main(sys.argv[1:]))"
    )
    for args, fragments in (
        (["serve", "--port", "0"], ("needs the module", "which is not installed", "specprefill-sdk[server]")),
        (["eval"], ("'eval' command is not available",)),
    ):
        result = subprocess.run(
            [sys.executable, "-c", code, *args], cwd=ROOT, capture_output=True, text=True, timeout=120
        )
        assert result.returncode == 2
        assert_one_line_error(result, *fragments)


def test_interrupt_exits_cleanly() -> None:
    proc = subprocess.Popen(
        [sys.executable, "-m", "specprefill_sdk", "run", "--prompt-file", "-"],
        cwd=ROOT,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        # A test run started in the background inherits an ignored SIGINT, and Python keeps it ignored:
        # give the command the default disposition a terminal user has.
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )
    try:
        wchan = Path(f"/proc/{proc.pid}/wchan")
        deadline = time.monotonic() + 120
        blocked_since = None
        while time.monotonic() < deadline:  # wait until the command blocks reading its prompt
            try:
                reading = "pipe_read" in wchan.read_text()
            except OSError:
                pytest.skip("no /proc/PID/wchan to see when the process waits for input")
            # Start-up may wait on pipes briefly too; the prompt read is the wait that lasts.
            if not reading:
                blocked_since = None
            elif blocked_since is None:
                blocked_since = time.monotonic()
            elif time.monotonic() - blocked_since > 1.0:
                break
            time.sleep(0.1)
        else:
            pytest.fail("the command never waited for its prompt")
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=60)
    finally:
        proc.kill()
    assert proc.returncode == 130, err
    assert "Traceback" not in err
    assert err.strip() == "interrupted"
    assert out == ""


# ---------------------------------------------------------------------------------------------- listings
def test_policies_listing_and_one_policy() -> None:
    result = cli("policies", "--json")
    assert result.returncode == 0, result.stderr
    rows = json.loads(result.stdout)
    names = {r["name"] for r in rows}
    assert {"paper", "conservative", "auto"} <= names and "adaptive" not in names
    result = cli("policies", "paper", "--json")
    data = json.loads(result.stdout)
    assert data["selector"]["keep_rate"] == 0.1 and data["scorer"]["look_ahead"] == 8
    assert data["selector_built"] == "DenseBelow(Protect(Chunked(KeepRate(0.1), 32)), 256)"
    assert data["selector"]["dense_below_tokens"] == 256
    table = cli("policies")
    assert table.returncode == 0 and "paper" in table.stdout and "conservative" in table.stdout
    assert "auto" in table.stdout
    old = cli("policies", "adaptive", "--json")  # the earlier name still shows what it now loads
    assert old.returncode == 0 and json.loads(old.stdout)["name"] == "auto"
    assert "replaced by 'auto'" in old.stderr


def test_run_and_serve_default_to_auto() -> None:
    from specprefill_sdk.cli import serve

    assert "(default: auto)" in " ".join(cli("run", "--help").stdout.split())
    parser = argparse.ArgumentParser()
    serve.add_arguments(parser)
    assert "(default: auto)" in " ".join(parser.format_help().split())


def test_models_listing() -> None:
    result = cli("models", "--json")
    assert result.returncode == 0, result.stderr
    rows = {r["name"]: r for r in json.loads(result.stdout)}
    assert rows["smollm2-135m"]["installed"] is True and rows["smollm2-135m"]["default"] is True
    assert "qwen2.5-coder-0.5b" in rows


def test_help_and_version() -> None:
    result = cli("--help")
    assert result.returncode == 0
    for command in ("run", "serve", "eval", "policies", "models"):
        assert command in result.stdout
    assert cli("--version").stdout.startswith("specprefill-sdk ")
    run_help = cli("run", "--help")
    assert run_help.returncode == 0 and "--messages-file" in run_help.stdout and "--json" in run_help.stdout


# ---------------------------------------------------------------------------------------------- real model
QUESTION = "\n\nQuestion: in one sentence, what is this text about?"


@pytest.mark.slow
def test_run_json_prints_exactly_one_object(tmp_path: Path, essay: str) -> None:
    path = tmp_path / "prompt.txt"
    path.write_text(essay[:1000] + QUESTION)
    result = cli("run", "--prompt-file", str(path), "--keep", "0.2", "--max-tokens", "6", "--json", "--device", "cpu")
    assert result.returncode == 0, result.stderr
    assert "Traceback" not in result.stderr
    assert result.stdout.endswith("\n") and result.stdout.count("\n") == 1
    data = json.loads(result.stdout)
    assert set(data) == JSON_KEYS
    assert set(data["timings_ms"]) == TIMING_KEYS
    assert all(isinstance(v, float) and v >= 0 for v in data["timings_ms"].values())
    assert data["timings_ms"]["score"] > 0 and data["timings_ms"]["ttft"] > 0
    assert isinstance(data["text"], str) and data["text"]
    assert data["model"] == "smollm2-135m" and data["draft"] == "smollm2-135m"
    assert 0 < data["kept_tokens"] < data["prompt_tokens"]
    assert data["keep_ratio"] == pytest.approx(data["kept_tokens"] / data["prompt_tokens"])
    assert 0.15 < data["keep_ratio"] < 0.35
    assert data["finish_reason"] == "length" and data["completion_tokens"] == 6 and data["policy"] == "paper"
    assert "KeepRate(0.2)" in data["selector"] and "keep-rate 0.2" in data["reason"] and data["fallback"] is None


@pytest.mark.slow
def test_run_prefills_a_short_chat_whole_by_default() -> None:
    from specprefill_sdk.policies import load_policy

    below = load_policy("auto").selector.dense_below_tokens
    question = "What is the capital of France, and which river runs through it? Answer in one sentence."
    result = cli("run", "--prompt", question, "--max-tokens", "4", "--json", "--device", "cpu")
    assert result.returncode == 0, result.stderr
    data = json.loads(result.stdout)
    assert 16 < data["prompt_tokens"] < below and data["kept_tokens"] == data["prompt_tokens"]
    assert data["policy"] == "auto" and "Adaptive(" in data["selector"]  # the default policy
    assert f"adaptive: dense below {below} tokens" in data["reason"] and data["timings_ms"]["score"] == 0


@pytest.mark.slow
def test_prompt_longer_than_the_context() -> None:
    long_text = "lorem ipsum dolor sit amet " * 2000  # about 10,000 tokens; SmolLM2's context is 8192
    result = cli("run", "--prompt-file", "-", "--max-tokens", "4", "--device", "cpu", stdin=long_text)
    assert_one_line_error(result, "exceeds the model's context of 8192 tokens")


@pytest.mark.slow
def test_run_human_output_streams_the_answer_then_statistics(smollm, tmp_path: Path, essay: str, capsys) -> None:
    from specprefill_sdk.cli import main

    path = tmp_path / "chat.json"
    messages = [{"role": "system", "content": "Answer briefly."}, {"role": "user", "content": essay[:800] + QUESTION}]
    path.write_text(json.dumps({"messages": messages}))
    status = main(
        [
            "run",
            "--messages-file",
            str(path),
            "--policy",
            "conservative",
            "--max-tokens",
            "6",
            "--device",
            "cpu",
            "--dtype",
            "auto",
        ]
    )
    out, err = capsys.readouterr()
    assert status == 0, err
    assert out.strip()  # the answer, alone on stdout
    assert "kept tokens" not in out
    assert "kept tokens" in err and "TTFT" in err and "conservative" in err


@pytest.mark.slow
def test_serve_takes_its_settings_from_the_environment_and_logs_one_format(tmp_path: Path) -> None:
    import re

    import httpx

    sys.path.insert(0, str(ROOT / "tests"))
    from server_utils import free_port, wait_for_health

    port = free_port()
    env = {
        **os.environ,
        "HF_HUB_OFFLINE": "1",
        "PYTHONUNBUFFERED": "1",
        "SPECPREFILL_HOST": "127.0.0.1",
        "SPECPREFILL_PORT": str(port),
        "SPECPREFILL_DEVICE": "cpu",
        "SPECPREFILL_LOG_LEVEL": "info",
        "SPECPREFILL_MAX_QUEUE": "3",
        "SPECPREFILL_MAX_CONCURRENCY": "2",
        "SPECPREFILL_MAX_QUEUES": "4",  # misspelt: a warning, not a setting
    }
    env.pop("SPECPREFILL_API_KEY", None)
    log_path = tmp_path / "serve.log"
    with log_path.open("wb") as log:
        proc = subprocess.Popen(
            [sys.executable, "-m", "specprefill_sdk", "serve", "--max-concurrency", "1"],
            stdout=log,
            stderr=subprocess.STDOUT,
            env=env,
            cwd=ROOT,
        )
        try:
            health = wait_for_health(f"http://127.0.0.1:{port}", timeout=180, proc=proc)
            assert (health["max_queue"], health["max_concurrency"]) == (3, 1)  # the command line wins
            assert httpx.get(f"http://127.0.0.1:{port}/v1/models", timeout=10).status_code == 200
        finally:
            proc.send_signal(signal.SIGINT)
            proc.wait(timeout=30)
    lines = [line for line in log_path.read_text().splitlines() if line.strip()]
    line_format = re.compile(r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3} (DEBUG|INFO|WARNING|ERROR|CRITICAL) [\w.]+: ")
    assert lines and all(line_format.match(line) for line in lines), "\n".join(lines)
    text = "\n".join(lines)
    assert "SPECPREFILL_MAX_QUEUES is not a setting: did you mean SPECPREFILL_MAX_QUEUE?" in text
    assert re.search(r"INFO uvicorn\.access: 127\.0\.0\.1:\d+ - \"GET /v1/models HTTP/1\.1\" 200", text), text
    assert "INFO uvicorn.error: Uvicorn running on http://127.0.0.1:" in text
    assert "Loading weights" not in text and "loaded smollm2-135m" in text
