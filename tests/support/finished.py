"""Every test that generates checks that each request finished as it should: a refused
request (a full queue, an error) ends with an empty output, which a test that only reads
outputs would count as an answer."""
from __future__ import annotations

from typing import Sequence

from radixgate.runtime.engine.api import FinishReason, Finished

# a request that ran to its end: a length limit, end of sequence or a stop string
COMPLETED = (FinishReason.LENGTH, FinishReason.EOS, FinishReason.STOP_SEQUENCE)


def assert_finished(finished: Sequence[Finished], *reasons: FinishReason) -> list[Finished]:
    """Asserts each of ``finished`` ended for one of ``reasons`` (default ``COMPLETED``);
    names how many did not and the first one's request id, reason and error. Returns the
    list, so that a call can wrap the generation."""
    allowed = reasons or COMPLETED
    wrong = [f for f in finished if f.reason not in allowed]
    if wrong:
        first = wrong[0]
        raise AssertionError(
            f"{len(wrong)} of {len(finished)} requests did not finish as "
            f"{'/'.join(r.value for r in allowed)}: the first, {first.request_id or '?'}, "
            f"ended {first.reason.value} ({first.error_kind and first.error_kind.value}: "
            f"{first.error_message or 'no message'})")
    return list(finished)
