"""The RL session API against a real gateway and engine: keys, recording token for token, rewards,
the trajectory line in the JSONL sink, and the staleness budget's 429."""

from __future__ import annotations

import asyncio
import threading
import time
from typing import Any

import httpx
import numpy as np

from areal.core.staleness import StalenessBudget
from areal.core.trajectory import merge_completions
from areal.core.types import Trajectory
from areal.gateway.policy import Generation
from support import eventually
from support.gateway import trajectories
from support.http import error_of


def generate(gw: Any, prompt_ids: list[int], max_tokens: int = 6) -> Generation:
    policy = gw.state.policy
    sampling = policy.sampling(len(prompt_ids), max_tokens=max_tokens, temperature=1.0)
    gen: Generation = gw.run(policy.generate(prompt_ids, sampling))
    assert gen.finished and gen.finish_reason != "abort"
    return gen


def record(gw: Any, session_id: str, gen: Generation) -> str:
    session = gw.state.sessions.get(session_id)
    cid = gw.run(gw.state.sessions.record(session, model=gw.model, generation=gen))
    assert isinstance(cid, str)
    return cid


def by_session(gw: Any) -> dict[str, Trajectory]:
    """The trajectories the gateway has sent, by session id."""
    return {t.session_id: t for t in trajectories(gw.log_dir)}


def post(
    gw: Any, path: str, key: str | None, body: Any = None, timeout: float = 5.0
) -> httpx.Response:
    headers = gw.headers(key) if key else {}
    return httpx.post(f"{gw.url}{path}", json=body, headers=headers, timeout=timeout)


def long_poll(gw: Any, wait_s: float) -> tuple[threading.Thread, list[httpx.Response]]:
    """``POST /rl/sessions`` with ``wait_s``, in a thread; its answer lands in the list."""
    answers: list[httpx.Response] = []
    body = {"wait_s": wait_s}
    poll = threading.Thread(
        target=lambda: answers.append(post(gw, "/rl/sessions", gw.admin, body, wait_s + 30))
    )
    poll.start()
    eventually(lambda: gw.state.sessions.waiting == 1, 30, "the long poll held for a slot")
    return poll, answers


def test_lifecycle_records_token_exact_merges_and_discounts(start_gateway: Any) -> None:
    with start_gateway(discount=0.5) as gw:
        s = gw.open_session({"metadata": {"task": "demo"}, "task_id": "t-1"})
        sid, key = s["session_id"], s["api_key"]
        assert httpx.get(f"{gw.v1}/models", headers=gw.headers(key)).status_code == 200
        status = httpx.get(f"{gw.url}/rl/sessions/{sid}", headers=gw.headers(key)).json()
        assert status["status"] == "open" and status["completions"] == 0

        tok = gw.state.policy.tokenizer
        prompt1 = gw.state.policy.render([{"role": "user", "content": "hi"}])
        gen1 = generate(gw, prompt1)
        # Turn 2 replays turn 1 token for token, then adds a user message: one merged sample.
        context = tok.encode(
            "<|im_end|>\n<|im_start|>user\nmore<|im_end|>\n<|im_start|>assistant\n",
            add_special_tokens=False,
        )
        prompt2 = prompt1 + gen1.output_ids + context
        gen2 = generate(gw, prompt2)
        # Turn 3 starts over (the agent rewrote its history): a second sample.
        prompt3 = gw.state.policy.render([{"role": "user", "content": "something else"}])
        gen3 = generate(gw, prompt3)
        ids = [record(gw, sid, g) for g in (gen1, gen2, gen3)]
        assert len(set(ids)) == 3

        resp = post(
            gw, f"/rl/sessions/{sid}/reward", key, {"reward": 0.25, "completion_id": ids[1]}
        )
        assert resp.status_code == 200 and resp.json()["completion_id"] == ids[1]
        assert post(gw, f"/rl/sessions/{sid}/reward", gw.admin, {"reward": 2}).status_code == 200
        summary = post(gw, f"/rl/sessions/{sid}/end", key).json()
        assert summary == {
            "session_id": sid,
            "completions": 3,
            "samples": 2,
            "tokens": sum(len(g.output_ids) for g in (gen1, gen2, gen3)),
            "reward": 2.0,
            "sent": True,
        }

        traj = by_session(gw)[sid]
        assert traj.metadata == {"task": "demo", "task_id": "t-1"} and traj.reward == 2.0
        for turn, prompt, gen, cid in zip(traj.turns, (prompt1, prompt2, prompt3), (gen1, gen2, gen3), ids, strict=True):  # fmt: skip
            assert turn.completion_id == cid and turn.session_id == sid
            assert turn.prompt_ids == prompt and turn.output_ids == gen.output_ids
            assert turn.output_logprobs == gen.logprobs and turn.output_versions == gen.versions
        assert [t.turn for t in traj.turns] == [0, 1, 2]
        merged, alone = traj.samples
        assert merged.input_ids.tolist() == prompt2 + gen2.output_ids
        n1, n2 = len(gen1.output_ids), len(gen2.output_ids)
        assert (
            merged.loss_mask.tolist()
            == [0] * len(prompt1) + [1] * n1 + [0] * len(context) + [1] * n2
        )
        generated = merged.loss_mask == 1
        assert merged.logprobs[generated].tolist() == np.float32(gen1.logprobs + gen2.logprobs).tolist()  # fmt: skip
        assert merged.versions[generated].tolist() == gen1.versions + gen2.versions
        assert alone.input_ids.tolist() == prompt3 + gen3.output_ids
        assert alone.loss_mask.tolist() == [0] * len(prompt3) + [1] * len(gen3.output_ids)
        # Episode reward 2 on the last turn; per turn, G1 = 0.25 + 0.5 * 2 and G0 = 0.5 * G1:
        # each of the merged sample's turns keeps its own return.
        assert [t.ret for t in merged.turns] == [0.625, 1.25] and alone.turns[0].ret == 2.0
        assert [merged.reward, alone.reward] == [0.625, 2.0]  # each sample's first turn

        # The key is dead now; the admin still sees the summary; nothing more can change.
        assert httpx.get(f"{gw.v1}/models", headers=gw.headers(key)).status_code == 401
        error_of(httpx.get(f"{gw.url}/rl/sessions/{sid}", headers=gw.headers(key)), 401)
        ended = httpx.get(f"{gw.url}/rl/sessions/{sid}", headers=gw.headers(gw.admin)).json()
        assert ended["status"] == "ended" and ended["samples"] == 2 and ended["sent"] is True
        assert error_of(post(gw, f"/rl/sessions/{sid}/reward", gw.admin, {"reward": 1}), 409)
        error_of(post(gw, f"/rl/sessions/{sid}/end", gw.admin), 409)
        assert gw.run(gw.state.sessions.record(gw.state.sessions.get(sid), model=gw.model, generation=gen1)) is None  # fmt: skip
        assert key not in (gw.log_dir / "gateway.log").read_text()


def test_auth_and_bad_input(gateway: Any) -> None:
    a, b = gateway.open_session(), gateway.open_session(prefix="/gateway/rl")
    error_of(post(gateway, "/rl/sessions", None), 401)
    error_of(post(gateway, "/rl/sessions", "not-a-key-at-all"), 401)
    assert error_of(post(gateway, "/rl/sessions", gateway.key), 403)["code"] == "admin_required"
    error_of(post(gateway, "/rl/sessions", a["api_key"]), 403)  # session keys are not admin
    error_of(httpx.get(f"{gateway.url}/rl/sessions", headers=gateway.headers(a["api_key"])), 403)
    other = post(gateway, f"/rl/sessions/{b['session_id']}/reward", a["api_key"], {"reward": 1})
    assert error_of(other, 403)["code"] == "wrong_session"
    error_of(post(gateway, f"/rl/sessions/{a['session_id']}/end", gateway.key), 403)
    assert error_of(post(gateway, "/rl/sessions/s_nope/end", gateway.admin), 404)["code"] == (
        "session_not_found"
    )
    reward = f"/rl/sessions/{a['session_id']}/reward"
    for bad in ({"reward": "1"}, {"reward": True}, {}, {"reward": None}, {"reward": [1]}):
        assert error_of(post(gateway, reward, a["api_key"], bad), 400)["param"] == "reward"
    missing = post(gateway, reward, a["api_key"], {"reward": 1, "completion_id": "cmpl-x"})
    assert error_of(missing, 404)["code"] == "completion_not_found"
    raw = httpx.post(
        f"{gateway.url}{reward}", content=b"{nope", headers=gateway.headers(a["api_key"])
    )
    error_of(raw, 400)
    error_of(post(gateway, "/rl/sessions", gateway.admin, {"metadata": [1]}), 400)
    error_of(
        post(gateway, f"/rl/sessions/{a['session_id']}/end", a["api_key"], {"discard": 1}), 400
    )
    listing = httpx.get(
        f"{gateway.url}/gateway/rl/sessions", headers=gateway.headers(gateway.admin)
    )
    assert {a["session_id"], b["session_id"]} <= set(listing.json()["open"])
    for s in (a, b):  # empty episodes are closed but not sent
        end = post(gateway, f"/gateway/rl/sessions/{s['session_id']}/end", s["api_key"])
        assert end.json()["sent"] is False and end.json()["samples"] == 0
    assert a["session_id"] not in by_session(gateway)


def test_session_api_is_off_without_an_admin_token(start_gateway: Any) -> None:
    with start_gateway(admin_token=None) as gw:
        err = error_of(post(gw, "/rl/sessions", "anything"), 404)
        assert "AREAL_ADMIN_TOKEN" in err["message"] and err["code"] == "session_api_off"
        error_of(post(gw, "/rl/sessions/s_1/end", gw.key), 404)
        assert not (gw.log_dir / "trajectories.jsonl").exists()


def test_staleness_budget_answers_429_with_retry_after(start_gateway: Any) -> None:
    budget = StalenessBudget(trigger_batch_size=1, staleness_threshold=0, retry_after_s=2.5)
    with start_gateway(budget=budget) as gw:
        first = gw.open_session()
        full = post(gw, "/rl/sessions", gw.admin)
        assert error_of(full, 429)["code"] == "staleness_budget_full"
        assert full.headers["Retry-After"] == "3"
        post(gw, f"/rl/sessions/{first['session_id']}/end", first["api_key"])  # empty: rejected
        second = gw.open_session()  # the slot came back
        record(gw, second["session_id"], generate(gw, [1, 2, 3], max_tokens=2))
        post(gw, f"/rl/sessions/{second['session_id']}/end", gw.admin, {"reward": 1.0})
        # (threshold 0 + version 0 + 1) * 1 = 1 accepted: full until the trainer moves on.
        error_of(post(gw, "/rl/sessions", gw.admin), 429)
        budget.set_version(1)
        gw.open_session()
        listing = httpx.get(f"{gw.url}/rl/sessions", headers=gw.headers(gw.admin)).json()
        assert listing["budget"] == {
            "version": 1,
            "accepted": 1,
            "running": 1,
            "rejected": 1,
            "capacity": 0,
            "accepted_total": 1,
            "released": 0,
        }


def test_a_long_poll_opens_as_soon_as_a_slot_frees(start_gateway: Any) -> None:
    budget = StalenessBudget(max_concurrent=1, retry_after_s=5)
    with start_gateway(budget=budget) as gw:
        first = gw.open_session()
        poll, answers = long_poll(gw, wait_s=60)
        assert not answers  # held: no slot is free
        post(gw, f"/rl/sessions/{first['session_id']}/end", gw.admin)
        # Answered once the slot freed, long before its 60 s were up.
        second = eventually(lambda: answers, 30, "the long poll's answer once a slot freed")[0]
        assert second.status_code == 200, second.text
        poll.join()
        # Nothing frees: the answer is still a 429, after wait_s.
        started = time.monotonic()
        full = post(gw, "/rl/sessions", gw.admin, {"wait_s": 0.3})
        assert error_of(full, 429)["code"] == "staleness_budget_full"
        assert time.monotonic() - started >= 0.3
        for bad in (-1, 61, "5", True):
            assert error_of(post(gw, "/rl/sessions", gw.admin, {"wait_s": bad}), 400)["param"] == (
                "wait_s"
            )


def test_a_long_poll_whose_client_hung_up_opens_no_session(start_gateway: Any) -> None:
    """A rollout worker killed while its long poll waited for a slot: when the slot frees, the
    gateway does not open a session for the dead client (nobody would drive or end it, and the
    restarted worker's discard of its predecessor's sessions has already run, so such a session
    would hold its budget slot until the idle timeout). The next client gets the slot."""
    budget = StalenessBudget(max_concurrent=1, retry_after_s=5)
    with start_gateway(budget=budget) as gw:
        first = gw.open_session()
        outcomes: list[BaseException] = []

        def hang_up() -> None:  # a read timeout closes the connection, mid-poll
            try:
                httpx.post(
                    f"{gw.url}/rl/sessions",
                    json={"wait_s": 30, "metadata": {"worker": "0"}},
                    headers=gw.headers(gw.admin),
                    timeout=httpx.Timeout(30, read=0.5),
                )
            except httpx.ReadTimeout as err:
                outcomes.append(err)

        hung_up = threading.Thread(target=hang_up)
        hung_up.start()
        eventually(lambda: gw.state.sessions.waiting == 1, 30, "the long poll held for a slot")
        hung_up.join(timeout=30)
        assert len(outcomes) == 1  # it hung up
        # The gateway gives the dead client's poll up (499 in gateway.log) instead of holding it.
        eventually(
            lambda: any(
                line.endswith(" path=/rl/sessions") and " status=499 " in line
                for line in (gw.log_dir / "gateway.log").read_text().splitlines()
            ),
            30,
            "the dead client's long poll answered 499 in gateway.log",
        )
        post(gw, f"/rl/sessions/{first['session_id']}/end", gw.admin)  # a slot frees
        assert gw.state.sessions.waiting == 0, "the dead client's poll is still held"
        listing = httpx.get(f"{gw.url}/rl/sessions", headers=gw.headers(gw.admin)).json()
        assert listing["open"] == [] and listing["budget"]["running"] == 0, listing
        assert gw.open_session()["session_id"]  # the slot is free for the living


def test_a_stopping_gateway_answers_its_long_polls_at_once(start_gateway: Any) -> None:
    """Shutdown admits no new episode: a long poll held for a slot gets a 503 in the OpenAI
    error schema as the server starts stopping, rather than holding the shutdown for its wait
    (the server waits up to 5 s for requests in flight, then cuts them off: a cut-off poll
    would get no answer at all, so the 503 itself shows it was answered first)."""
    budget = StalenessBudget(max_concurrent=1, retry_after_s=5)
    with start_gateway(budget=budget) as gw:
        gw.open_session()  # the one slot
        poll, answers = long_poll(gw, wait_s=30)
        listing = httpx.get(f"{gw.url}/rl/sessions", headers=gw.headers(gw.admin))
        assert listing.json()["waiting"] == 1  # the listing says so too
        assert gw.http is not None
        gw.http.stop()
        poll.join(timeout=30)
    assert len(answers) == 1
    assert "shutting down" in error_of(answers[0], 503)["message"]


def test_aborted_unfinished_and_hinted(gateway: Any) -> None:
    s = gateway.open_session({"hint": "claude-code-1234"})
    sessions = gateway.state.sessions
    session = sessions.hint("claude-code-1234")
    assert session is sessions.get(s["session_id"])
    partial = Generation("x", [5, 6], [-1.0, -1.0], [0, 0], [1, 2], finish_reason="abort")
    running = Generation("x", [5], [-1.0], [0], [1, 2], finish_reason=None)
    for gen in (partial, running):
        assert gateway.run(sessions.record(session, model=gateway.model, generation=gen)) is None
    status = httpx.get(f"{gateway.url}/rl/sessions/{s['session_id']}", headers=gateway.headers(s["api_key"]))  # fmt: skip
    assert status.json()["aborted"] == 2 and status.json()["completions"] == 0
    discarded = post(
        gateway, f"/rl/sessions/{s['session_id']}/end", gateway.admin, {"discard": True}
    )
    assert discarded.json()["sent"] is False
    assert sessions.hint("claude-code-1234") is None


def test_many_sessions_at_once(start_gateway: Any) -> None:
    with start_gateway() as gw:

        async def episode(client: httpx.AsyncClient, i: int) -> str:
            resp = await client.post("/rl/sessions", json={"task_id": i})
            s = resp.json()
            session = gw.state.sessions.get(s["session_id"])
            policy = gw.state.policy

            async def turn() -> None:  # on the gateway's loop, where its engine client lives
                gen = await policy.generate([1, 2, 3 + i], policy.sampling(3, max_tokens=3))
                await gw.state.sessions.record(session, model=gw.model, generation=gen)

            await asyncio.wrap_future(asyncio.run_coroutine_threadsafe(turn(), gw.http.loop))
            await client.post(f"/rl/sessions/{s['session_id']}/end", json={"reward": float(i)})
            return str(s["session_id"])

        async def main() -> list[str]:
            async with httpx.AsyncClient(base_url=gw.url, headers=gw.headers(gw.admin)) as client:
                return await asyncio.gather(*(episode(client, i) for i in range(12)))

        ids = asyncio.run(main())
        got = by_session(gw)
        assert set(got) == set(ids)
        for sid, traj in got.items():
            i = traj.metadata["task_id"]
            assert traj.reward == float(i) and traj.turns[0].prompt_ids == [1, 2, 3 + i]
            assert traj.turns[0].session_id == sid


def test_two_chat_turns_through_the_openai_route(start_gateway: Any) -> None:
    with start_gateway() as gw:
        s = gw.open_session()
        key, sid = s["api_key"], s["session_id"]
        messages: list[dict[str, Any]] = [{"role": "user", "content": "hi"}]
        replies = []
        for follow_up in ("and then?", None):
            resp = httpx.post(
                f"{gw.v1}/chat/completions",
                json={"model": gw.model, "messages": messages, "max_tokens": 6},
                headers=gw.headers(key),
                timeout=60,
            )
            assert resp.status_code == 200, resp.text
            replies.append(resp.json())
            messages_sent = list(messages)
            content = resp.json()["choices"][0]["message"]["content"] or ""
            if follow_up:
                messages = [
                    *messages_sent,
                    {"role": "assistant", "content": content},
                    {"role": "user", "content": follow_up},
                ]
        post(gw, f"/rl/sessions/{sid}/reward", key, {"reward": 0.5, "completion_id": replies[0]["id"]})  # fmt: skip
        assert post(gw, f"/rl/sessions/{sid}/end", key, {"reward": 1.0}).json()["completions"] == 2
        traj = by_session(gw)[sid]
        render = gw.state.policy.render
        assert traj.turns[0].prompt_ids == render([{"role": "user", "content": "hi"}])
        # The second prompt reuses the first turn's tokens (its prompt and output) where the chat's
        # text starts with theirs, so a sampled output that does not survive decode -> re-encode
        # still extends the episode (``PolicyService.render``'s ``history``).
        first = traj.turns[0]
        history = [*first.prompt_ids, *first.output_ids]
        assert traj.turns[1].prompt_ids == render(messages, history=history)
        assert traj.turns[0].completion_id == replies[0]["id"] and traj.turns[0].reward == 0.5
        for turn, reply in zip(traj.turns, replies, strict=True):
            assert len(turn.output_ids) == reply["usage"]["completion_tokens"]
            assert len(turn.prompt_ids) == reply["usage"]["prompt_tokens"]
            assert len(turn.output_logprobs) == len(turn.output_versions) == len(turn.output_ids)
        expected = merge_completions(traj.turns)  # merged iff turn 2 replays turn 1 token for token
        assert [(x.input_ids.tolist(), x.loss_mask.tolist()) for x in traj.samples] == [
            (x.input_ids.tolist(), x.loss_mask.tolist()) for x in expected
        ]
        assert httpx.get(f"{gw.v1}/models", headers=gw.headers(key)).status_code == 401
