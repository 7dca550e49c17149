"""The trainer: sequence packing, packed causal attention, the decoupled-PPO training step."""
