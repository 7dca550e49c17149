"""The embedded torch inference engine: SGLang native HTTP API on CPU."""
