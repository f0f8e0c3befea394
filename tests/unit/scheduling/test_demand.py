"""The hub that tells who holds requests back that an instance fell free."""

from __future__ import annotations

from infermux.scheduling.demand import Demand


def test_listeners_are_told_until_they_stop_listening() -> None:
    demand = Demand()
    told: list[str] = []
    demand.listen(lambda: told.append("a"))

    def b() -> None:
        told.append("b")

    demand.listen(b)
    demand.instance_free()
    demand.ignore(b)
    demand.ignore(b)  # not listening any more: nothing
    demand.instance_free()
    assert told == ["a", "b", "a"]
