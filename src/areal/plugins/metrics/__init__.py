"""Built-in metric sinks: train.log (the seed article's lines), metrics.jsonl, TensorBoard."""
