"""`ServerConfig`: one validated set of server settings, built by ``specprefill serve`` or from the environment."""

from __future__ import annotations

import argparse
import dataclasses

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
        ("max_body_bytes", True),
        ("session_ttl", 0),
        ("session_ttl", float("inf")),
        ("max_sessions", -1),
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
