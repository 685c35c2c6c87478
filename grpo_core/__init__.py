"""DeepSeekMath's training recipe as a library (see README.md and docs/architecture.md).

Importing any part of it first sets what the math libraries need for bit-for-bit reproducible
results (``grpo_core.env.NUMERICS``, a user's own setting wins): every entry point (the
``grpo-pipeline`` command, ``python -m grpo_core.stages`` under torchrun or accelerate, the tests,
the benches) imports ``grpo_core`` before torch does any arithmetic.
"""

from grpo_core.env import apply_numerics

apply_numerics()
