"""The router config: the seed article's YAML loads as written, and every mistake is reported
with the key (and the environment variable) to fix."""

from __future__ import annotations

from pathlib import Path

import pytest

from areal.core.config import ConfigError
from areal.gateway.router_config import RouterConfig

CONFIGS = Path(__file__).resolve().parents[2] / "configs"


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "router.yaml"
    path.write_text(text)
    return path


def test_seed_router_yaml_loads(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TAOTOKEN_API_KEY", "sk-test-0123456789")
    config = RouterConfig.load(CONFIGS / "taotoken_router.yaml")
    gateway = config.api_gateway
    assert gateway is not None
    assert gateway.base_url == "https://taotoken.net/api" and gateway.host == "taotoken.net"
    assert gateway.api_key == "sk-test-0123456789"
    assert gateway.api_key_env == "TAOTOKEN_API_KEY"  # remembered for "check TAOTOKEN_API_KEY"
    assert (gateway.timeout, gateway.max_retries) == (60, 3)
    assert config.policy.model_id == "your-policy-model-id" and config.policy.max_tokens == 4096
    assert config.policy.temperature == 0.7
    routes = config.model_routing.routes()
    assert list(routes) == ["your-policy-model-id", "your-reward-model-id", "your-judge-model-id"]
    reward, judge = routes["your-reward-model-id"], routes["your-judge-model-id"]
    assert (reward.temperature, reward.max_tokens) == (0.0, 1024)
    assert (judge.temperature, judge.max_tokens) == (0.0, 2048)
    assert config.warnings() == []
    # The key is never shown by the config's own repr (which ends up in logs and tracebacks).
    assert "sk-test" not in repr(config) and "sk-test" not in str(config)


def test_local_router_yaml_loads() -> None:
    config = RouterConfig.load(CONFIGS / "router.yaml")
    assert config.api_gateway is None and config.policy.model_id == "areal-tiny"


def test_unset_key_variable_loads_with_a_warning(monkeypatch: pytest.MonkeyPatch) -> None:
    """The policy needs no key, so the file loads; the warning names the key and the variable."""
    monkeypatch.delenv("TAOTOKEN_API_KEY", raising=False)
    config = RouterConfig.load(CONFIGS / "taotoken_router.yaml")
    gateway = config.api_gateway
    assert gateway is not None and gateway.api_key is None
    assert gateway.unset_key_env == gateway.api_key_env == "TAOTOKEN_API_KEY"
    assert config.warnings() == [
        "api_gateway.api_key: environment variable TAOTOKEN_API_KEY is not set "
        "(export TAOTOKEN_API_KEY=...)"
    ]


def test_other_unset_variables_are_errors(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.delenv("AREAL_TEST_UPSTREAM", raising=False)
    path = write(tmp_path, "api_gateway:\n  base_url: ${AREAL_TEST_UPSTREAM}\n")
    with pytest.raises(ConfigError) as err:
        RouterConfig.load(path)
    message = str(err.value)
    assert "api_gateway.base_url" in message and "export AREAL_TEST_UPSTREAM=" in message
    assert "router.yaml" in message


def test_default_after_colon_dash(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.delenv("AREAL_TEST_UPSTREAM", raising=False)
    monkeypatch.setenv("AREAL_TEST_KEY", "sk-from-env-000000")
    path = write(
        tmp_path,
        "api_gateway:\n"
        "  base_url: ${AREAL_TEST_UPSTREAM:-http://127.0.0.1:8001/v1/}\n"
        "  api_key: ${AREAL_TEST_KEY:-unused}\n"
        "  timeout: 5\n",
    )
    config = RouterConfig.load(path)
    assert config.api_gateway is not None
    assert config.api_gateway.base_url == "http://127.0.0.1:8001/v1"  # trailing slash dropped
    assert config.api_gateway.host == "127.0.0.1:8001"
    assert config.api_gateway.api_key == "sk-from-env-000000"
    assert config.api_gateway.api_key_env == "AREAL_TEST_KEY"
    monkeypatch.setenv("AREAL_TEST_UPSTREAM", "https://example.test/v1")
    assert RouterConfig.load(path).api_gateway.base_url == "https://example.test/v1"  # type: ignore[union-attr]


def test_unknown_keys_are_named(tmp_path: Path) -> None:
    path = write(tmp_path, "api_gateway:\n  base_url: http://x/v1\n  retires: 3\n")
    with pytest.raises(ConfigError, match=r"api_gateway\.retires: unknown key"):
        RouterConfig.load(path)
    path = write(tmp_path, "model_routing:\n  policy_model:\n    model_id: p\n    temprature: 1\n")
    with pytest.raises(ConfigError, match=r"model_routing\.policy_model\.temprature: unknown key"):
        RouterConfig.load(path)
    path = write(tmp_path, "routing: {}\n")
    with pytest.raises(ConfigError, match=r"routing: unknown key"):
        RouterConfig.load(path)


def test_bad_types_are_named(tmp_path: Path) -> None:
    path = write(tmp_path, "api_gateway:\n  base_url: http://x/v1\n  timeout: soon\n")
    with pytest.raises(ConfigError, match=r"api_gateway\.timeout: "):
        RouterConfig.load(path)
    path = write(tmp_path, "model_routing:\n  judge_model:\n    model_id: j\n    max_tokens: -1\n")
    with pytest.raises(ConfigError, match=r"model_routing\.judge_model\.max_tokens: .*greater"):
        RouterConfig.load(path)
    path = write(tmp_path, "api_gateway:\n  base_url: taotoken.net/api\n")
    with pytest.raises(ConfigError, match=r"api_gateway\.base_url: .*not an http\(s\) URL"):
        RouterConfig.load(path)


def test_more_roles_are_routes_and_are_checked(tmp_path: Path) -> None:
    path = write(
        tmp_path,
        "model_routing:\n"
        "  policy_model: {model_id: p}\n"
        "  critic_model: {model_id: c, temperature: 0.2, max_tokens: 64}\n",
    )
    routes = RouterConfig.load(path).model_routing.routes()
    assert routes["c"].max_tokens == 64 and routes["c"].temperature == 0.2
    path = write(tmp_path, "model_routing:\n  critic_model: {model_id: c, max_tokens: 0}\n")
    with pytest.raises(ConfigError, match=r"critic_model\.max_tokens"):
        RouterConfig.load(path)
    path = write(tmp_path, "model_routing:\n  default_timeout: 5\n")
    with pytest.raises(
        ConfigError, match=r"default_timeout: each entry of model_routing is a route"
    ):
        RouterConfig.load(path)


def test_key_variable_is_remembered_without_a_file(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AREAL_TEST_KEY", "sk-plain-000000")
    from_template = RouterConfig.model_validate(
        {"api_gateway": {"base_url": "http://x/v1", "api_key": "${AREAL_TEST_KEY}"}}
    )
    assert from_template.api_gateway is not None
    assert from_template.api_gateway.api_key == "sk-plain-000000"
    assert from_template.api_gateway.api_key_env == "AREAL_TEST_KEY"
    by_name = RouterConfig.model_validate(
        {"api_gateway": {"base_url": "http://x/v1", "api_key_env": "AREAL_TEST_KEY"}}
    )
    assert by_name.api_gateway is not None and by_name.api_gateway.api_key == "sk-plain-000000"
    monkeypatch.delenv("AREAL_TEST_KEY")
    for gateway in (
        {"base_url": "http://x/v1", "api_key_env": "AREAL_TEST_KEY"},
        {"base_url": "http://x/v1", "api_key": "${AREAL_TEST_KEY}"},
    ):
        unset = RouterConfig.model_validate({"api_gateway": gateway})
        assert unset.api_gateway is not None and unset.api_gateway.api_key is None
        assert unset.api_gateway.unset_key_env == "AREAL_TEST_KEY"
        assert "AREAL_TEST_KEY is not set" in unset.warnings()[0]
