"""Agent adapters: hand an existing agent to areal in one line (``areal.wrap(agent)``).

An adapter turns the user's agent, written against a client library (the OpenAI SDK, the
Anthropic SDK, LangChain) or a CLI harness, into an :data:`areal.run.rollout.AgentFn`: per
episode it builds that library's client bound to the gateway and the episode's session key, runs
the agent on the task and returns what it returned (a reward, an answer to score, or None).
Adapters import only ``areal.core`` and load their client library when an episode needs it.
"""
