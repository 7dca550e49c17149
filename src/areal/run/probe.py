"""``areal probe``: one episode of a wrapped agent against a running gateway, explained.

Before spending hours of compute on a new agent a user needs to know that it reaches the policy
through the gateway (not some other endpoint), which model name it asks for, how many calls it
makes, whether the tool calls it expects were parsed, whether its turns merge into one training
sample token for token or split (and where the prefix broke), and what reward came back. The
probe runs the agent exactly as a rollout worker would (the same adapter, the same session API),
reads the session's trace before ending it, and ends it *discarded*, so probing a gateway that is
feeding a training run adds nothing to the training data.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from typing import Any

from areal.core.episode import Episode, gateway_root
from areal.core.rewards import RewardFn
from areal.run.gateway_client import GatewayAdmin, GatewayAdminError, GatewayRefused
from areal.run.rollout import RolloutWorker

DEFAULT_TASK: dict[str, Any] = {
    "task_id": "probe",
    "question": "What is 2 + 3?",
    "prompt": "What is 2 + 3? Answer with the number only.",
    "answer": "5",
}


@dataclass
class Check:
    name: str
    status: str  # "ok" | "warn" | "fail"
    detail: str


@dataclass
class ProbeReport:
    """What one probed episode did; :meth:`checks` turns it into verdicts."""

    gateway: str
    policy_model: str = ""
    session_id: str = ""
    outcome: str = "not started"  # finished | failed | timed_out | not started
    error: str | None = None
    answer: str | None = None
    reward: float | None = None
    calls: list[dict[str, Any]] = field(default_factory=list)
    turns: list[dict[str, Any]] = field(default_factory=list)
    aborted: int = 0
    seconds: float = 0.0

    @property
    def samples(self) -> int:
        return len({t["sample"] for t in self.turns})

    def checks(self) -> list[Check]:
        return [
            self._base_url(),
            self._models(),
            self._calls(),
            self._tool_calls(),
            self._merging(),
            self._reward(),
        ]

    def ok(self) -> bool:
        return all(c.status != "fail" for c in self.checks())

    def to_json(self) -> dict[str, Any]:
        checks = self.checks()
        return {
            **asdict(self),
            "samples": self.samples,
            "ok": all(c.status != "fail" for c in checks),
            "checks": [asdict(c) for c in checks],
        }

    # --- the verdicts ---------------------------------------------------------------------------

    def _base_url(self) -> Check:
        if self.calls:
            return Check("base URL", "ok", f"the agent called the gateway ({self.gateway}/v1)")
        return Check(
            "base URL",
            "fail",
            "no call reached the gateway with the episode's key: the agent ignores the base URL "
            "or key it is given (a hard-coded base_url or api_key? a client built before the "
            "episode started? a CLI reading its own config?)",
        )

    def _models(self) -> Check:
        asked = sorted({str(c["model"]) for c in self.calls if c.get("model")})
        if not asked:
            return Check("model", "warn" if self.calls else "fail", "no model name was seen")
        others = [m for m in asked if m not in (self.policy_model, "default")]
        if others:
            return Check(
                "model",
                "warn",
                f"asked for {', '.join(asked)}; the policy is {self.policy_model!r}: calls for "
                "other models go to the api_gateway channel (or fail) and are not trained on",
            )
        return Check("model", "ok", f"asked for {', '.join(asked)} (the policy)")

    def _calls(self) -> Check:
        refused = [c for c in self.calls if int(c.get("status", 0)) >= 400]
        detail = f"{len(self.calls)} call(s), {len(self.turns)} recorded completion(s)"
        if self.aborted:
            detail += f", {self.aborted} aborted"
        if refused:
            codes = ", ".join(f"{c['path']} -> {c['status']}" for c in refused[:3])
            return Check("calls", "fail", f"{detail}; refused: {codes}")
        return Check("calls", "ok" if self.turns else "fail", detail)

    def _tool_calls(self) -> Check:
        names = [name for t in self.turns for name in t.get("tool_calls", [])]
        if not names:
            return Check("tool calls", "ok", "none parsed (fine for an agent without tools)")
        return Check("tool calls", "ok", f"{len(names)} parsed: {', '.join(names)}")

    def _merging(self) -> Check:
        splits = [t for t in self.turns if t["join"] == "split"]
        if not self.turns:
            return Check("turns", "warn", "nothing recorded")
        if len(self.turns) == 1:
            return Check("turns", "ok", "one turn: one sample")
        if not splits:
            return Check(
                "turns",
                "ok",
                f"{len(self.turns)} turns merged token-exactly into {self.samples} sample(s)",
            )
        first = splits[0]
        expected, got = first["expected"], first["got"]
        if got["after"].startswith(expected["after"]) or expected["after"].startswith(got["after"]):
            why = (
                f"the same text but other tokens (ids {expected['ids']} were generated, "
                f"{got['ids']} re-rendered): the earlier output did not survive decode -> "
                "re-encode (a character split across tokens, or tokens the tokenizer never "
                "produces itself)"
            )
        else:
            why = f"expected {json.dumps(expected['after'])}, got {json.dumps(got['after'])}"
        return Check(
            "turns",
            "warn",
            f"{len(splits)} of {len(self.turns)} turn(s) split into new samples (costs a prefix "
            f"recompute each); turn {first['turn']} broke at token {first['diverged_at']} "
            f"after {json.dumps(got['before'])}: {why}",
        )

    def _reward(self) -> Check:
        if self.outcome != "finished":
            return Check("reward", "fail", f"the episode {self.outcome}: {self.error}")
        if self.reward is not None:
            return Check("reward", "ok", f"{self.reward:g}")
        if self.answer is not None:
            return Check(
                "reward",
                "warn",
                f"the agent answered {self.answer[:80]!r} but no reward plugin scores it "
                "(--reward exact_match, say)",
            )
        return Check(
            "reward",
            "warn",
            "none: the agent returned None and set no reward through the session API",
        )


class ProbeWorker(RolloutWorker):
    """A rollout worker for one episode that keeps what it saw and trains on nothing."""

    def __init__(self, *args: Any, report: ProbeReport, **kwargs: Any) -> None:
        super().__init__(*args, train=False, concurrency=1, **kwargs)
        self.report = report

    async def _before_end(self, admin: GatewayAdmin, episode: Episode) -> None:
        self.report.session_id = episode.session_id
        try:
            trace = await admin.trace(episode.session_id)
        except GatewayRefused as err:  # reported; the episode still ends
            self.report.error = f"the gateway's trace answered HTTP {err.status}"
            return
        except GatewayAdminError as err:
            raise self._failure(err) from err
        self.report.policy_model = trace["policy_model"]
        self.report.calls = trace["calls"]
        self.report.turns = trace["turns"]
        self.report.aborted = trace["aborted"]

    async def _play(self, episode: Episode) -> float | None:
        try:
            out = await self._run_agent(episode)
            if isinstance(out, str):
                self.report.answer = out
                if self.reward_fn is None:
                    out = None  # an answer nothing scores: reported, not a failure
            self.report.reward = await self._reward(out, episode)
            self.report.outcome = "finished"
            return self.report.reward
        except TimeoutError:
            raise
        except asyncio.CancelledError:
            self.report.outcome = "timed_out"
            self.report.error = f"ran past --timeout {self.episode_timeout_s:g}s"
            raise
        except Exception as err:
            self.report.outcome = "failed"
            self.report.error = f"{type(err).__name__}: {err}"
            raise


async def probe(
    agent: Any,
    *,
    gateway_url: str,
    admin_token: str,
    task: Mapping[str, Any] | None = None,
    model: str = "default",
    reward_fn: RewardFn | None = None,
    timeout_s: float = 300.0,
    max_turns: int = 8,
    session_fields: Mapping[str, Any] | None = None,
) -> ProbeReport:
    """Run one episode of ``agent`` (an :data:`~areal.run.rollout.AgentFn`) and explain it."""
    url = gateway_root(gateway_url)
    report = ProbeReport(gateway=url)
    worker = ProbeWorker(
        url,
        admin_token,
        agent,
        report=report,
        reward_fn=reward_fn,
        episode_timeout_s=timeout_s,
        max_turns=max_turns,
        model=model,
        max_wait_s=30.0,
        session_fields=session_fields,
        metadata={"probe": True},
    )
    started = time.monotonic()
    stats = await worker.run([dict(task or DEFAULT_TASK)])
    if stats.timed_out:
        report.outcome = "timed_out"
        report.error = report.error or f"ran past the probe's timeout of {timeout_s:g}s"
    report.seconds = time.monotonic() - started
    return report
