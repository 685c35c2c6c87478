"""The math corpus (DeepSeekMath §2.1): document streams, fastText classification, the recall loop
with domain discovery, and n-gram decontamination."""
