"""What the GPU challenge benchmarks share about a case: the bias of its width."""

from __future__ import annotations

from dasknn.datasets import challenge_bias

#: The widths the challenge gives a bias for.
CHALLENGE_WIDTHS = (1024, 4096, 16384, 65536)
#: The bias of the other (smaller, test-sized) widths the benchmarks run.
OTHER_WIDTH_BIAS = -0.3


def case_bias(neurons: int) -> float:
    """The challenge's bias for ``neurons``, or :data:`OTHER_WIDTH_BIAS` for a width it has none
    for."""
    return challenge_bias(neurons) if neurons in CHALLENGE_WIDTHS else OTHER_WIDTH_BIAS
