"""Polling the channel at the lowest load, instead of sleeping until a doorbell.

On the H200 host an event loop woken from a millisecond's sleep runs ~0.3-0.5 ms late
(``docs/decisions.md``, *GPU completions at low load*), and at c=1 every hop of the channel paid
it twice: the front end slept until its answer's doorbell, the executor until the next request's.
At the lowest load each side polls its inbox ring (:meth:`Link.poll_inbox`: two loads per loop
iteration, no syscall) for at most ``--channel-poll-us``:

- the executor, once a request that ran alone ended (one at a time since it was last idle), polls
  every channel for the next request (:class:`ExecutorLoad`);
- a front end, right after sending its only request, polls for the answer, but only while the
  executor ran nothing else when it last answered this front end (:func:`poll_for_answer`): the
  executor publishes what else it runs in a word of the answer ring's header
  (:meth:`~infermux.ipc.ring.FrameRing.publish_load`), so front ends that each hold one of the
  executor's many requests (HTTP c=16 over 12 front ends) do not spin for them.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

from .link import Link


class ExecutorLoad:
    """The executor's requests running across its channels, and what it tells and does when
    that changes."""

    def __init__(self, poll_seconds: float, links: Callable[[], Iterable[Link]]) -> None:
        self._poll_seconds = poll_seconds
        self._links = links  # every attached channel's link
        self._running = 0  # requests started and not finished, across channels
        self._peak = 0  # the most running at once since nothing last ran

    def started(self, requests: int) -> None:
        self._running += requests
        self._peak = max(self._peak, self._running)

    def finished(self, link: Link, requests: int) -> None:
        """``requests`` on ``link``'s channel ended (their answer is sent)."""
        self._running -= requests
        if self._running:
            # What else runs, for that front end's choice to poll for its next answer.
            link.endpoint.outbox.publish_load(self._running)
            return
        # Idle: every front end may poll again. After one request at a time (c=1) the next
        # comes a client round trip after the last answer: look for it on every channel.
        alone, self._peak = self._peak == 1, 0
        for each in self._links():
            each.endpoint.outbox.publish_load(0)
            if alone:
                each.poll_inbox(self._poll_seconds)


def poll_for_answer(link: Link, in_flight: int, seconds: float) -> None:
    """A front end, just after a send: poll for the answer when it is the only request in
    flight here and the executor ran nothing else at its last answer here."""
    if seconds and in_flight == 1 and not link.endpoint.inbox.load():
        link.poll_inbox(seconds)
