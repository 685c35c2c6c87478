"""The language models: building and loading Hugging Face models, packing, sampling (the fast
decode path), per-token log-probabilities, device placement and precision, GGUF conversion."""
