"""The seed article's agent settings, read by ``--agent-config agent_config.py``.

``max_turns`` becomes ``agent.max_turns`` of the run. The other three are the agent's own client
settings, which a training run replaces for every episode (the gateway's URL, the episode's key,
the policy's model id), so they are written here as the article has them: the gateway of
``scripts/launch_async.sh`` on port 9000 and the router's policy model id.
"""

AGENT_CONFIG = {
    "model_base_url": "http://localhost:9000/gateway/v1",
    "model_name": "your-policy-model-id",
    "api_key": "sk-...",
    "max_turns": 8,
}
