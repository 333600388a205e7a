"""`ServerConfig`: one validated set of server settings, built by ``specprefill serve`` or from the environment."""

from __future__ import annotations

import argparse
import dataclasses
import re

import pytest

from specprefill_sdk import InvalidRequestError
from specprefill_sdk.server import ServerConfig


def _parse(*argv: str) -> argparse.Namespace:
    from specprefill_sdk.cli.serve import add_arguments

    parser = argparse.ArgumentParser()
    add_arguments(parser)
    return parser.parse_args(list(argv))


def test_the_cli_defaults_are_the_configs_defaults() -> None:
    from specprefill_sdk.cli.serve import config_from_args

    assert config_from_args(_parse(), environ={}) == ServerConfig()


def test_the_cli_builds_the_config_from_its_options_and_the_key_variable() -> None:
    from specprefill_sdk.cli.serve import config_from_args

    args = _parse("--max-queue", "3", "--session-strategy", "refresh", "--port", "0", "--max-body-bytes", "1024")
    config = config_from_args(args, environ={"SPECPREFILL_API_KEY": "a, b"})
    assert (config.max_queue, config.session_strategy, config.port, config.max_body_bytes) == (3, "refresh", 0, 1024)
    assert config.api_keys == ("a", "b")
    assert config_from_args(_parse("--api-key", "c"), environ={"SPECPREFILL_API_KEY": "a"}).api_keys == ("c",)


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("max_concurrency", 0),
        ("max_queue", -1),
        ("max_prompt_tokens", 0),
        ("max_output_tokens", 1.5),
        ("default_max_tokens", 0),
        ("keepalive_interval", 0),
        ("keepalive_interval", float("nan")),
        ("max_body_bytes", True),
        ("session_ttl", 0),
        ("session_ttl", float("inf")),
        ("max_sessions", -1),
        ("max_sessions_per_key", 0),
        ("session_strategy", "forget"),
        ("warmup_tokens", -1),
        ("port", 70000),
        ("model", ""),
        ("compile", "yes"),
        ("log_level", "loud"),
        ("api_keys", 3),
    ],
)
def test_a_bad_setting_is_refused_with_its_name(field: str, value: object) -> None:
    with pytest.raises(InvalidRequestError, match=field) as info:
        ServerConfig(**{field: value})  # type: ignore[arg-type]
    assert info.value.param == field


def test_the_config_is_frozen_and_replace_validates_again() -> None:
    config = ServerConfig(api_keys="one")  # type: ignore[arg-type]
    assert config.api_keys == ("one",)  # one key, not its characters
    with pytest.raises(dataclasses.FrozenInstanceError):
        config.max_queue = 3  # type: ignore[misc]
    assert config.replace(max_queue=3).max_queue == 3
    with pytest.raises(InvalidRequestError, match="max_queue"):
        config.replace(max_queue=-3)
    with pytest.raises(InvalidRequestError, match="unknown server setting 'queue'"):
        config.replace(queue=3)


def test_the_config_reads_specprefill_variables() -> None:
    environ = {
        "SPECPREFILL_MAX_QUEUE": "32",
        "SPECPREFILL_COMPILE": "true",
        "SPECPREFILL_SESSION_TTL": "12.5",
        "SPECPREFILL_MAX_PROMPT_TOKENS": "none",
        "SPECPREFILL_API_KEY": "k1,k2",
        "SPECPREFILL_DRAFT": "smollm2-135m",
        "OTHER": "ignored",
    }
    config = ServerConfig.from_env(environ)
    assert config == ServerConfig(
        max_queue=32, compile=True, session_ttl=12.5, api_keys=("k1", "k2"), draft="smollm2-135m"
    )
    with pytest.raises(InvalidRequestError, match="SPECPREFILL_MAX_QUEUE"):
        ServerConfig.from_env({"SPECPREFILL_MAX_QUEUE": "many"})


def test_the_strategies_are_the_conversations() -> None:
    from specprefill_sdk.conversation import STRATEGIES
    from specprefill_sdk.server.config import STRATEGIES as CONFIG_STRATEGIES

    assert CONFIG_STRATEGIES == STRATEGIES


def test_create_app_refuses_settings_it_does_not_know_and_settings_beside_a_config() -> None:
    from specprefill_sdk.server import create_app

    with (
        pytest.raises(InvalidRequestError, match="unknown server setting 'max_queues'"),
        pytest.warns(DeprecationWarning),
    ):
        create_app(max_queues=3)
    with pytest.raises(InvalidRequestError, match="not both"):
        create_app(ServerConfig(), max_queue=3)
    with pytest.raises(InvalidRequestError, match="takes a ServerConfig"):
        create_app({"max_queue": 3})  # type: ignore[arg-type]


def test_the_keyword_settings_of_earlier_versions_map_onto_the_config() -> None:
    from specprefill_sdk.server.app import _config

    with pytest.warns(DeprecationWarning, match="ServerConfig"):
        config = _config("smollm2-135m", {"api_key": "k", "default_strategy": "refresh", "max_body_bytes": None})
    assert config == ServerConfig(model="smollm2-135m", api_keys=("k",), session_strategy="refresh")


def test_the_wire_name_of_the_dense_below_switch_reaches_the_policy() -> None:
    from specprefill_sdk.policies import load_policy
    from specprefill_sdk.server.schemas import SpecPrefillOptions

    overrides = SpecPrefillOptions(min_prompt_tokens=64).overrides()
    assert load_policy("paper").with_overrides(**overrides).selector.dense_below_tokens == 64


# ------------------------------------------------------------------------------------------ engines
def test_the_vllm_engine_takes_engine_options_and_batches_many_requests_by_default() -> None:
    config = ServerConfig(engine="vllm", engine_args={"max_model_len": 32768, "enforce_eager": True})
    assert config.engine_options == {"enforce_eager": True, "max_model_len": 32768}
    assert config.max_concurrency == 256  # vLLM batches what its scheduler admits
    assert ServerConfig().max_concurrency == 1  # the transformers backend decodes one request at a time
    assert ServerConfig(engine="vllm", engine_args={"max_num_seqs": 48}).max_concurrency == 48
    assert ServerConfig(engine="vllm", max_concurrency=8).max_concurrency == 8
    # pairs and mappings describe the same configuration
    assert ServerConfig(engine="vllm", engine_args=(("enforce_eager", True), ("max_model_len", 32768))) == config


@pytest.mark.parametrize(
    ("settings", "fragment"),
    [
        ({"engine": "tgi"}, "engine must be one of transformers, vllm"),
        ({"engine_args": {"max_model_len": 4096}}, "need engine='vllm'"),
        ({"engine": "vllm", "engine_args": {"dtype": "half"}}, "give dtype instead"),
        ({"engine": "vllm", "engine_args": {"model": "x"}}, "server setting here"),
        ({"engine": "vllm", "engine_args": {"max-model-len": 1}}, "identifier"),
        ({"engine": "vllm", "engine_args": {"max_num_seqs": 0}}, "max_num_seqs"),
        ({"engine": "vllm", "engine_args": {"hf_overrides": object()}}, "plain value"),
        ({"engine": "vllm", "engine_args": [1, 2]}, "mapping of option names"),
    ],
)
def test_bad_engine_settings_are_refused(settings: dict[str, object], fragment: str) -> None:
    with pytest.raises(InvalidRequestError, match=fragment):
        ServerConfig(**settings)  # type: ignore[arg-type]


def test_the_engine_and_its_options_come_from_the_environment() -> None:
    config = ServerConfig.from_env(
        {"SPECPREFILL_ENGINE": "vllm", "SPECPREFILL_ENGINE_ARGS": '{"max_model_len": 4096, "enforce_eager": true}'}
    )
    assert (config.engine, config.engine_options) == ("vllm", {"enforce_eager": True, "max_model_len": 4096})
    with pytest.raises(InvalidRequestError, match="SPECPREFILL_ENGINE_ARGS must be a JSON object"):
        ServerConfig.from_env({"SPECPREFILL_ENGINE": "vllm", "SPECPREFILL_ENGINE_ARGS": "[1]"})


def test_serve_passes_vllm_options_through_under_their_vllm_names() -> None:
    from specprefill_sdk.cli.serve import config_from_args

    args = _parse(
        "--engine", "vllm", "--max-model-len", "32768", "--gpu-memory-utilization", "0.8", "--enforce-eager",
        "--no-enable-prefix-caching", "--tensor-parallel-size", "2", "--max-num-seqs", "64",
        "--engine-arg", "swap_space=8", "--engine-arg", "hf_overrides={\"rope_theta\": 1e6}",
        "--engine-arg", "kv_cache_dtype=fp8", "--seed", "3", "--engine-core", "subprocess",
    )  # fmt: skip
    config = config_from_args(args, environ={})
    assert config.engine_options == {
        "enable_prefix_caching": False,
        "enforce_eager": True,
        "engine_core": "subprocess",
        "gpu_memory_utilization": 0.8,
        "hf_overrides": {"rope_theta": 1e6},
        "kv_cache_dtype": "fp8",
        "max_model_len": 32768,
        "max_num_seqs": 64,
        "seed": 3,
        "swap_space": 8,
        "tensor_parallel_size": 2,
    }
    assert config.max_concurrency == 64


def test_serve_refuses_an_unknown_engine_core_before_starting_anything(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        _parse("--engine", "vllm", "--engine-core", "thread")
    assert "must be one of auto, in-process, subprocess, got thread" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("argv", "fragment"),
    [
        (("--max-model-len", "4096"), "--max-model-len: vLLM engine options, which need --engine vllm"),
        (("--engine-arg", "swap_space=8"), "need --engine vllm"),
        (("--engine", "vllm", "--engine-arg", "swap_space"), "NAME=VALUE"),
        (("--engine", "vllm", "--max-model-len", "9", "--engine-arg", "max_model_len=8"), "given twice"),
    ],
)
def test_serve_refuses_vllm_options_it_cannot_use(argv: tuple[str, ...], fragment: str) -> None:
    from specprefill_sdk.cli.serve import config_from_args

    with pytest.raises(InvalidRequestError, match=fragment):
        config_from_args(_parse(*argv), environ={})


def test_create_app_refuses_a_device_for_the_vllm_engine_and_engine_options_beside_a_backend(smollm) -> None:
    from specprefill_sdk.backends import TransformersBackend
    from specprefill_sdk.server import create_app

    tiny_backend = TransformersBackend(smollm)

    with pytest.raises(InvalidRequestError, match="device='cpu' places the transformers engine's models"):
        create_app(ServerConfig(engine="vllm", device="cpu"))
    with pytest.raises(InvalidRequestError, match="it was given a backend"):
        create_app(ServerConfig(engine="vllm", engine_args={"max_model_len": 64}), backend=tiny_backend)


# ------------------------------------------------------------------------------ serve and the environment
def test_serve_reads_its_defaults_from_the_environment_and_the_command_line_wins() -> None:
    from specprefill_sdk.cli.serve import config_from_args

    environ = {
        "SPECPREFILL_MAX_QUEUE": "5",
        "SPECPREFILL_PORT": "9001",
        "SPECPREFILL_POLICY": "conservative",
        "SPECPREFILL_COMPILE": "yes",
        "SPECPREFILL_SESSION_STRATEGY": "refresh",
        "SPECPREFILL_MAX_BODY_BYTES": "2048",
        "SPECPREFILL_LOG_LEVEL": "warning",
        "SPECPREFILL_API_KEY": "k1,k2",
    }
    config = config_from_args(_parse(), environ=environ)
    assert config == ServerConfig(
        max_queue=5,
        port=9001,
        policy="conservative",
        compile=True,
        session_strategy="refresh",
        max_body_bytes=2048,
        log_level="warning",
        api_keys=("k1", "k2"),
    )
    args = _parse("--max-queue", "7", "--port", "0", "--log-level", "debug", "--api-key", "k3")
    config = config_from_args(args, environ=environ)
    assert (config.max_queue, config.port, config.log_level, config.api_keys) == (7, 0, "debug", ("k3",))
    assert config.policy == "conservative" and config.max_body_bytes == 2048  # the rest still from the environment


def test_each_key_gets_a_share_of_the_conversations_set_by_option_or_variable() -> None:
    from specprefill_sdk.cli.serve import config_from_args

    # By default the store is shared out evenly among the keys (rounded up); all of it without keys.
    assert ServerConfig(max_sessions=32).sessions_per_key == 32
    assert ServerConfig(max_sessions=32, api_keys=("a", "b", "c")).sessions_per_key == 11
    assert ServerConfig(max_sessions=4, max_sessions_per_key=9).sessions_per_key == 4
    environ = {"SPECPREFILL_MAX_SESSIONS_PER_KEY": "3", "SPECPREFILL_API_KEY": "a,b"}
    assert config_from_args(_parse(), environ=environ).sessions_per_key == 3
    args = _parse("--max-sessions-per-key", "5")
    assert config_from_args(args, environ=environ).max_sessions_per_key == 5
    with pytest.raises(InvalidRequestError, match="SPECPREFILL_MAX_SESSIONS_PER_KEY"):
        config_from_args(_parse(), environ={"SPECPREFILL_MAX_SESSIONS_PER_KEY": "0"})


def test_serve_takes_the_engine_and_its_options_from_the_environment_key_by_key() -> None:
    from specprefill_sdk.cli.serve import config_from_args

    environ = {
        "SPECPREFILL_ENGINE": "vllm",
        "SPECPREFILL_ENGINE_ARGS": '{"max_model_len": 4096, "enforce_eager": true, "swap_space": 4}',
    }
    config = config_from_args(_parse(), environ=environ)
    assert config.engine == "vllm"
    assert config.engine_options == {"enforce_eager": True, "max_model_len": 4096, "swap_space": 4}
    config = config_from_args(_parse("--max-model-len", "8192", "--engine-arg", "swap_space=8"), environ=environ)
    assert config.engine_options == {"enforce_eager": True, "max_model_len": 8192, "swap_space": 8}
    # the named vLLM options need the vLLM engine, wherever the engine was chosen
    with pytest.raises(InvalidRequestError, match="need --engine vllm"):
        config_from_args(_parse("--max-model-len", "8192"), environ={})
    assert config_from_args(_parse("--engine", "transformers"), environ={"SPECPREFILL_ENGINE": "vllm"}).engine == (
        "transformers"
    )


@pytest.mark.parametrize(
    ("variable", "value", "fragment"),
    [
        ("SPECPREFILL_MAX_QUEUE", "-1", "SPECPREFILL_MAX_QUEUE: max_queue must be"),
        ("SPECPREFILL_MAX_QUEUE", "many", "SPECPREFILL_MAX_QUEUE must be a number"),
        ("SPECPREFILL_SESSION_STRATEGY", "forget", "SPECPREFILL_SESSION_STRATEGY: session_strategy must be one of"),
        ("SPECPREFILL_COMPILE", "perhaps", "SPECPREFILL_COMPILE must be true or false"),
        ("SPECPREFILL_ENGINE_ARGS", "[1]", "SPECPREFILL_ENGINE_ARGS must be a JSON object"),
        ("SPECPREFILL_API_KEY", " , ", "SPECPREFILL_API_KEY is set but holds no key"),
    ],
)
def test_serve_names_the_variable_of_a_bad_value(variable: str, value: str, fragment: str) -> None:
    from specprefill_sdk.cli.serve import config_from_args

    with pytest.raises(InvalidRequestError, match=re.escape(fragment)):
        config_from_args(_parse(), environ={variable: value})


def test_serve_takes_the_exporter_from_the_environment() -> None:
    from specprefill_sdk.cli.serve import otel_kind

    assert otel_kind(_parse(), environ={}) == "none"
    assert otel_kind(_parse(), environ={"SPECPREFILL_OTEL": "console"}) == "console"
    assert otel_kind(_parse("--otel", "none"), environ={"SPECPREFILL_OTEL": "otlp"}) == "none"
    with pytest.raises(InvalidRequestError, match="SPECPREFILL_OTEL must be one of none, console, otlp"):
        otel_kind(_parse(), environ={"SPECPREFILL_OTEL": "jaeger"})


def test_serve_help_names_the_variable_of_every_option() -> None:
    from specprefill_sdk.cli.serve import add_arguments

    parser = argparse.ArgumentParser()
    add_arguments(parser)
    options = [a for a in parser._actions if a.option_strings and a.dest != "help"]
    assert len(options) > 30
    for action in options:
        assert action.help is not None and "[env: SPECPREFILL_" in action.help, action.option_strings
    text = parser.format_help()
    for variable in ("SPECPREFILL_MAX_QUEUE", "SPECPREFILL_ENGINE]", "SPECPREFILL_OTEL", "SPECPREFILL_API_KEY"):
        assert variable in text
    assert "SPECPREFILL_ENGINE_ARGS key max_model_len" in " ".join(text.split())


def test_a_misspelt_variable_is_named_with_the_closest_setting(caplog: pytest.LogCaptureFixture) -> None:
    from specprefill_sdk.server.config import misspelt_variables

    environ = {
        "SPECPREFILL_MAX_QUEUES": "3",
        "SPECPREFILL_APIKEY": "k",
        "SPECPREFILL_ENGINE_ARG": "{}",
        "SPECPREFILL_VLLM_PLUGINS": "0",
        # valid names the project reads elsewhere, and a deployment's own variable: no warning
        "SPECPREFILL_API_KEY": "k",
        "SPECPREFILL_VLLM_PLUGIN": "0",
        "SPECPREFILL_CACHE": "/tmp/x",
        "SPECPREFILL_OTEL": "none",
        "SPECPREFILL_API_BASE": "http://127.0.0.1:1/v1",
        "SPECPREFILL_TEAM_NAME": "search",
    }
    assert misspelt_variables(environ) == [
        ("SPECPREFILL_APIKEY", "SPECPREFILL_API_KEY"),
        ("SPECPREFILL_ENGINE_ARG", "SPECPREFILL_ENGINE_ARGS"),
        ("SPECPREFILL_MAX_QUEUES", "SPECPREFILL_MAX_QUEUE"),
        ("SPECPREFILL_VLLM_PLUGINS", "SPECPREFILL_VLLM_PLUGIN"),
    ]
    with caplog.at_level("WARNING", logger="specprefill_sdk.server.config"):
        ServerConfig.from_env({"SPECPREFILL_MAX_QUEUES": "3"})
    assert "SPECPREFILL_MAX_QUEUES is not a setting: did you mean SPECPREFILL_MAX_QUEUE?" in caplog.text


def test_every_specprefill_variable_in_the_project_is_a_valid_name() -> None:
    import dataclasses
    from pathlib import Path

    from specprefill_sdk.server.config import OTHER_VARIABLES, env_name

    root = Path(__file__).resolve().parents[1]
    found: set[str] = set()
    for folder in ("specprefill_sdk", "adapters", "examples", "benchmarks"):  # docs show a misspelt one
        for path in (root / folder).rglob("*"):
            if path.suffix in (".py", ".md", ".toml", ".yaml"):
                found.update(re.findall(r"SPECPREFILL_[A-Z0-9_]*[A-Z0-9]", path.read_text(errors="replace")))
    valid = {env_name(f.name) for f in dataclasses.fields(ServerConfig)} | set(OTHER_VARIABLES)
    assert found - valid == set()
