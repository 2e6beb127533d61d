"""What the model-based tests of the channel and the topic share: random messages, settings,
the rule that ends a loan."""
from __future__ import annotations

import os
from typing import Any, Tuple

import numpy as np
from hypothesis import HealthCheck, Phase, settings
from hypothesis import strategies as st
from hypothesis.stateful import precondition, rule

DTYPES = ["|u1", "<f4", ">i8", "<c16", "<u2"]


def message(data: Any, nbytes: int) -> np.ndarray:
    """A random array of about `nbytes` bytes: random dtype, 1-3 dimensions, random bytes."""
    dt = np.dtype(data.draw(st.sampled_from(DTYPES)))
    count = nbytes // dt.itemsize
    ndim = data.draw(st.integers(1, 3))
    shape: Tuple[int, ...] = (count,)
    if ndim > 1 and count > 0:
        first = data.draw(st.sampled_from([d for d in range(1, min(count, 64) + 1) if count % d == 0]))
        shape = (first, count // first) if ndim == 2 else (1, first, count // first)
    seed = data.draw(st.integers(0, 2**32 - 1))
    raw = np.random.default_rng(seed).bytes(count * dt.itemsize)
    return np.frombuffer(raw, dt).reshape(shape).copy()


def same(got: np.ndarray, expected: np.ndarray) -> bool:
    return (got.dtype == expected.dtype and got.shape == expected.shape
            and got.tobytes() == expected.tobytes())


# About 4-5 s a state machine here; under qemu (CI's arm runs, which set FASTCOPY_NO_SUBPROCESS)
# ten times that, so fewer examples there. Under the mutation check (tools/mutation_check.py
# sets FASTCOPY_MUTATION_CHECK) a failure only has to be seen, not made small: shrinking it
# took up to three minutes a planted bug.
EXAMPLES = 25 if os.environ.get("FASTCOPY_NO_SUBPROCESS") == "1" else 100
NO_SHRINKING = os.environ.get("FASTCOPY_MUTATION_CHECK") == "1"
MODEL_SETTINGS = settings(
    max_examples=EXAMPLES, stateful_step_count=50, deadline=None,
    # Both health checks judge how examples are generated, not what the model finds: long runs
    # of large messages are slow under qemu, and some draws overrun Hypothesis's size budget
    # (those are discarded and others drawn). Failing on them made the model tests flaky.
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
    phases=[p for p in Phase if not (NO_SHRINKING and p.name in ("shrink", "explain"))])


class LoanEnding:
    """The rule that ends the outstanding loan, for the channel's and the topic's models (mixed
    into their state machines): ``self.producer`` is the end that loaned (``self.loaned``, filled
    with ``self.loaned_data``); ``self.delivered(msg)`` records a message that was sent."""

    loaned: Any = None
    loaned_data: Any = None

    def delivered(self, msg: np.ndarray) -> None:
        raise NotImplementedError

    @precondition(lambda self: self.loaned is not None)
    @rule(how=st.sampled_from(["publish", "discard", "drop"]))
    def end_loan(self, how: str) -> None:
        arr, msg = self.loaned, self.loaned_data
        self.loaned = self.loaned_data = None
        if how == "publish":
            self.producer.publish(arr)
            self.delivered(msg)
            assert not arr.flags.writeable
        elif how == "discard":
            self.producer.discard(arr)
        del arr  # "drop": garbage collected, which abandons it
