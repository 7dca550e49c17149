"""Start the gateway: ``areal serve gateway`` and the seed article's
``python -m areal.gateway.server --config configs/taotoken_router.yaml --port 9000 --log-level info``.

In a training run the supervisor starts it with the flags of :mod:`areal.gateway.training_flags`
(the trajectory sink, the staleness budget, the reward discount, the idle-session timeout).

It listens on loopback unless ``--allow-remote`` says otherwise (:mod:`areal.host.bind`), and
speaks HTTPS when given ``--ssl-certfile`` and ``--ssl-keyfile``.
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import os
import secrets
import ssl
import sys
import tempfile
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from aiohttp import web

from areal.core.episode_journal import EpisodeJournal
from areal.core.model_source import resolve_model
from areal.core.queue import TrajectorySink, make_sink
from areal.core.staleness import StalenessBudget
from areal.gateway.access_log import AccessLog
from areal.gateway.app import build_app
from areal.gateway.errors import GatewayError
from areal.gateway.gateway_state import GatewayState
from areal.gateway.middleware import HttpLimits
from areal.gateway.online import OnlineConversations
from areal.gateway.online_groups import DefaultGroups
from areal.gateway.policy import PolicyService
from areal.gateway.router_config import RouterConfig
from areal.gateway.sessions import SessionManager
from areal.gateway.training_flags import (
    DEFAULT_IDLE_TIMEOUT_S,
    DEFAULT_ONLINE_GROUP_SIZE,
    DEFAULT_ONLINE_GROUP_WINDOW_S,
    DEFAULT_ONLINE_GROUPING,
    DEFAULT_ONLINE_IDLE_S,
    DEFAULT_ONLINE_REWARD_WAIT_S,
    TrainingFlags,
    add_training_arguments,
)
from areal.host.bind import remote_bind_refusal
from areal.host.event_loop import loop_choice, loop_name, new_event_loop
from areal.host.gc_tuning import tune_for_serving
from areal.host.heap import keep_freed_memory

log = logging.getLogger("areal.gateway")

TRAJECTORIES_FILE = "trajectories.jsonl"


def gateway_key_from(cli_key: str | None) -> tuple[str, bool]:
    """The key plain calls need: --api-key, else AREAL_GATEWAY_KEY, else a fresh random one."""
    key = cli_key or os.environ.get("AREAL_GATEWAY_KEY")
    if key:
        return key, False
    return "areal-" + secrets.token_urlsafe(24), True


@dataclass(frozen=True)
class OnlineSettings:
    """``--online``'s timeouts (seconds): a conversation's idle end, then its wait for a reward;
    and the default group of a conversation that names none (:mod:`areal.gateway.online_groups`)."""

    idle_timeout: float = DEFAULT_ONLINE_IDLE_S
    reward_wait: float = DEFAULT_ONLINE_REWARD_WAIT_S
    grouping: str = DEFAULT_ONLINE_GROUPING
    group_window: float = DEFAULT_ONLINE_GROUP_WINDOW_S
    group_size: int = DEFAULT_ONLINE_GROUP_SIZE

    @classmethod
    def from_flags(cls, training: TrainingFlags) -> OnlineSettings | None:
        """What ``--online`` and its flags say (``None``: off)."""
        if not training.online:
            return None
        return cls(
            training.online_idle_timeout,
            training.online_reward_wait,
            training.online_grouping,
            training.online_group_window,
            training.online_group_size,
        )

    def conversations(self, sessions: SessionManager) -> OnlineConversations:
        groups = DefaultGroups(self.grouping, window=self.group_window, size=self.group_size)
        return OnlineConversations(
            sessions, idle_timeout=self.idle_timeout, reward_wait=self.reward_wait, groups=groups
        )


def build_state(
    config: RouterConfig,
    engines: Sequence[str],
    *,
    gateway_key: str,
    admin_token: str | None,
    tokenizer: str | None = None,
    log_dir: str | Path | None = None,
    sink: str | None = "jsonl",
    sink_options: dict[str, Any] | None = None,
    discount: float = 1.0,
    budget: StalenessBudget | None = None,
    session_idle_timeout: float | None = DEFAULT_IDLE_TIMEOUT_S,
    episode_journal: str | Path | None = None,
    engine_backend: str | None = None,
    online: OnlineSettings | None = None,
) -> GatewayState:
    """Everything the app needs. Finished RL episodes go to the ``sink`` trajectory queue plugin;
    the default JSONL sink writes ``{log_dir}/trajectories.jsonl`` (no log dir: no sink). RL
    sessions idle for ``session_idle_timeout`` seconds are discarded (``None`` or 0: never).
    ``online`` (``--online``): record plain-key conversations (:mod:`areal.gateway.online`)."""
    policy = PolicyService(
        engines, config.policy, tokenizer_path=tokenizer, engine_backend=engine_backend
    )
    upstream = None
    if config.api_gateway is not None:
        from areal.gateway.upstream import UpstreamChannel

        upstream = UpstreamChannel(config.api_gateway, config.model_routing)
    secrets_to_hide = tuple(
        s
        for s in (
            gateway_key,
            admin_token,
            config.api_gateway.api_key if config.api_gateway else None,
        )
        if s
    )
    access_log = AccessLog(Path(log_dir) / "gateway.log" if log_dir else None, secrets_to_hide)
    records = bool(admin_token) or online is not None  # someone opens sessions
    sessions = SessionManager(
        admin_token,
        sink=_trajectory_sink(sink, sink_options, log_dir) if records else None,
        discount=discount,
        budget=budget,
        idle_timeout=session_idle_timeout or None,
        journal=EpisodeJournal(episode_journal),
    )
    return GatewayState(
        config=config,
        policy=policy,
        sessions=sessions,
        gateway_key=gateway_key,
        admin_token=admin_token,
        upstream=upstream,
        access_log=access_log,
        online=online.conversations(sessions) if online is not None else None,
    )


def _trajectory_sink(
    name: str | None, options: dict[str, Any] | None, log_dir: str | Path | None
) -> TrajectorySink | None:
    options = dict(options or {})
    if name == "jsonl" and "path" not in options:
        if log_dir is None:
            return None
        options["path"] = str(Path(log_dir) / TRAJECTORIES_FILE)
    return make_sink(name, options) if name else None


def listen_settings(
    host: str, *, allow_remote: bool, ssl_certfile: str | None, ssl_keyfile: str | None
) -> ssl.SSLContext | None:
    """Check where the gateway may listen; the TLS context when a certificate is given.
    Raises ValueError with one line saying what to change."""
    refusal = remote_bind_refusal(host, allow_remote, "gateway")
    if refusal:
        raise ValueError(refusal)
    if bool(ssl_certfile) != bool(ssl_keyfile):
        raise ValueError(
            "TLS needs both --ssl-certfile (the certificate chain, PEM) and --ssl-keyfile (its "
            "private key, PEM)"
        )
    if not ssl_certfile:
        return None
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    try:
        context.load_cert_chain(ssl_certfile, ssl_keyfile)
    except (OSError, ssl.SSLError) as err:
        raise ValueError(
            f"cannot load the TLS certificate {ssl_certfile} with the key {ssl_keyfile}: "
            f"{getattr(err, 'strerror', None) or err}"
        ) from None
    return context


def _more_file_descriptors() -> None:
    """Raise the open-files limit to its maximum: every idle client holds one descriptor."""
    with contextlib.suppress(ImportError, ValueError, OSError):
        import resource

        soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
        if hard == resource.RLIM_INFINITY:
            hard = max(soft, 65536)
        if soft != resource.RLIM_INFINITY and soft < hard:
            resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))


@contextlib.contextmanager
def embedded_engine(model_dir: str, log_dir: Path) -> Iterator[str]:
    """``--model DIR``: an embedded engine in its own process, found through the backend registry."""
    from areal.core.plugins import registry
    from areal.host.process import start_on_free_port

    build_command = registry("inference_backends").get("embedded").load_launcher()
    engine = start_on_free_port(
        lambda port: build_command({"model_path": model_dir, "port": port, "log_level": "warning"}),
        log_path=log_dir / "engine.log",
        timeout=180,
        env=dict(os.environ),
        name="engine",
    )
    with engine:
        assert engine.url is not None
        yield engine.url


def serve(
    config_path: str | None,
    *,
    host: str = "127.0.0.1",
    port: int = 9000,
    engines: Sequence[str] = (),
    model: str | None = None,
    tokenizer: str | None = None,
    api_key: str | None = None,
    log_dir: str | None = None,
    log_level: str = "info",
    training: TrainingFlags | None = None,
    engine_backend: str | None = None,
    allow_remote: bool = False,
    ssl_certfile: str | None = None,
    ssl_keyfile: str | None = None,
    limits: HttpLimits | None = None,
) -> None:
    training = (training or TrainingFlags()).check()
    loop_choice()  # a bad AREAL_EVENT_LOOP fails here, before an engine starts
    tls = listen_settings(
        host, allow_remote=allow_remote, ssl_certfile=ssl_certfile, ssl_keyfile=ssl_keyfile
    )
    logging.basicConfig(
        level=log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    config = RouterConfig.load(config_path) if config_path else RouterConfig()
    _warn_about(config, config_path)
    if model and engine_backend not in (None, "embedded"):
        raise SystemExit(
            f"error: --model starts an embedded engine, but --engine-backend is {engine_backend}; "
            "start that engine yourself and pass its --engine URL"
        )
    # Hub ids become their snapshots in the Hugging Face cache (ModelSourceError otherwise).
    model = resolve_model(model, key="--model") if model else None
    tokenizer = resolve_model(tokenizer, key="--tokenizer") if tokenizer else None
    key, generated = gateway_key_from(api_key)
    admin = os.environ.get("AREAL_ADMIN_TOKEN") or None
    logs = Path(log_dir) if log_dir else Path(tempfile.mkdtemp(prefix="areal-gateway-"))
    with contextlib.ExitStack() as stack:
        urls = list(engines)
        if model:
            urls.append(stack.enter_context(embedded_engine(model, logs)))
        state = build_state(
            config,
            urls,
            gateway_key=key,
            admin_token=admin,
            tokenizer=tokenizer,
            log_dir=logs,
            sink=training.sink_name(),
            sink_options=training.sink_options(),
            discount=training.discount,
            budget=training.budget(),
            session_idle_timeout=training.idle_timeout(),
            episode_journal=training.episode_journal,
            engine_backend=engine_backend,
            online=OnlineSettings.from_flags(training),
        )
        if generated:
            print(
                f"gateway key (shown once; set AREAL_GATEWAY_KEY to choose one): {key}",
                file=sys.stderr,
                flush=True,
            )
        if admin is None:
            log.info("AREAL_ADMIN_TOKEN is not set: the session and engine APIs (/rl/...) are off")
        else:
            where = {
                "jsonl": training.sink_address or logs / TRAJECTORIES_FILE,
                "zmq": f"the trainer's queue at {training.sink_address}",
                "none": "no sink (dropped)",
            }.get(training.sink, f"the {training.sink} sink ({training.sink_address})")
            log.info(
                "session API on; finished episodes go to %s; budget %s; idle timeout %s",
                where,
                state.sessions.budget.snapshot().to_json(),
                f"{training.idle_timeout():g} s" if training.idle_timeout() else "off",
            )
        if training.online:
            log.info(
                "online: plain-key conversations are recorded (idle end %g s, reward wait %g s); "
                "unnamed groups: %s (at most %d, within %g s)",
                training.online_idle_timeout,
                training.online_reward_wait,
                training.online_grouping,
                training.online_group_size,
                training.online_group_window,
            )
        if urls:
            where = ", ".join(urls)
        elif admin is None:
            where = (
                "no engine; none can attach without AREAL_ADMIN_TOKEN (the engine API, "
                "/rl/engines, is off), so policy calls answer 503"
            )
        else:
            where = "no engine yet (policy calls answer 503 until one attaches: POST /rl/engines)"
        log.info("policy %s on %s; log %s", config.policy.model_id, where, logs / "gateway.log")
        _more_file_descriptors()
        # Trajectories leave as one payload buffer per queue message (up to ~1 MB): glibc would
        # map each fresh and fault its pages in on every message (areal.host.heap).
        kept = keep_freed_memory()
        log.info("heap: %s", "freed memory kept (glibc)" if kept else "the allocator's defaults")
        scheme = "https" if tls else "http"
        app = build_app(state, limits)
        loop = new_event_loop()
        log.info("event loop: %s", loop_name(loop))
        tune_for_serving()  # after start-up: what it built is frozen (areal.host.gc_tuning)
        web.run_app(
            app,
            host=host,
            port=port,
            ssl_context=tls,
            # aiohttp's "running" message: said once the socket is bound (a bind fails before)
            print=lambda _: log.info("listening on %s://%s:%d", scheme, host, port),
            access_log=None,
            loop=loop,
        )


def _warn_about(config: RouterConfig, path: str | None) -> None:
    """An unset key variable does not stop the gateway (the policy needs none): one warning."""
    host = config.api_gateway.host if config.api_gateway else ""
    for warning in config.warnings():
        log.warning(
            "%s: %s; the gateway starts, and calls routed to the upstream channel %s answer an "
            "error naming it until it is set and the gateway restarted",
            path,
            warning,
            host,
        )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m areal.gateway.server", description="The areal agent gateway."
    )
    parser.add_argument("--config", help="router YAML (api_gateway + model_routing)")
    parser.add_argument("--host", default="127.0.0.1", help="address to bind (default loopback)")
    parser.add_argument(
        "--allow-remote",
        action="store_true",
        help="let --host be an address other machines reach (refused without this flag)",
    )
    parser.add_argument("--ssl-certfile", help="serve HTTPS with this certificate chain (PEM)")
    parser.add_argument("--ssl-keyfile", help="the private key of --ssl-certfile (PEM)")
    parser.add_argument("--port", type=int, default=9000)
    parser.add_argument(
        "--engine", action="append", default=[], help="inference engine URL (repeatable)"
    )
    parser.add_argument(
        "--engine-backend",
        default="embedded",
        help="the inference backend the --engine URLs run (embedded, sglang, vllm, ...)",
    )
    parser.add_argument("--model", help="start an embedded engine on this model dir or Hub id")
    parser.add_argument("--tokenizer", help="tokenizer dir or Hub id (default: the engine's)")
    parser.add_argument(
        "--api-key", help="key for plain calls (default: $AREAL_GATEWAY_KEY, else random)"
    )
    parser.add_argument("--log-dir", help="where gateway.log goes (default: a temp dir)")
    parser.add_argument("--log-level", default="info")
    add_training_arguments(parser)
    args = parser.parse_args(argv)
    try:
        serve(
            args.config,
            host=args.host,
            port=args.port,
            engines=args.engine,
            engine_backend=args.engine_backend,
            model=args.model,
            tokenizer=args.tokenizer,
            api_key=args.api_key,
            log_dir=args.log_dir,
            log_level=args.log_level,
            training=TrainingFlags.from_values(args),
            allow_remote=args.allow_remote,
            ssl_certfile=args.ssl_certfile,
            ssl_keyfile=args.ssl_keyfile,
        )
    except (ValueError, OSError, GatewayError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
