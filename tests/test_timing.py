"""timing.in_turns: series timed in rounds, so that a machine's slow seconds fall on all."""
import time

import pytest

from vit_export import timing


def _series(name, order, cost=0.0):
    def call():
        order.append(name)
        if cost:
            time.sleep(cost)
    return timing.Series(call)


def test_each_series_gets_its_runs_and_seconds_in_rounds():
    order = []
    fast, slow = _series("fast", order), _series("slow", order, cost=0.02)
    timing.in_turns([fast, slow], min_runs=3, min_seconds=0.1, turns=5)
    assert len(slow.times) >= 5 and sum(slow.times) >= 0.1
    assert len(fast.times) >= 5 and all(t >= 0 for t in fast.times)
    # rounds: each is called all through the run, not only before or after the other (the
    # order shifts each round, so a round's last and the next one's first are the same)
    runs = [name for i, name in enumerate(order) if i == 0 or order[i - 1] != name]
    assert runs.count("slow") >= 3 and runs.count("fast") >= 3
    assert order[0] == "fast" and order[-1] == "slow"


def test_the_order_shifts_each_round():
    order = []
    a, b, c = (_series(n, order) for n in "abc")
    timing.in_turns([a, b, c], min_runs=3, turns=3)
    assert order == ["a", "b", "c", "b", "c", "a", "c", "a", "b"]


def test_more_runs_than_rounds_are_made_up_after_them():
    order = []
    a, b = _series("a", order), _series("b", order)
    timing.in_turns([a, b], min_runs=7, turns=2)
    assert len(a.times) == len(b.times) == 7


def test_a_failing_series_is_left_out_with_those_that_go_with_it():
    order, heard = [], []
    ok = _series("ok", order)
    partner = _series("partner", order)

    def broken():
        order.append("broken")
        if order.count("broken") == 2:
            raise RuntimeError("capture failed")
    bad = timing.Series(broken)

    def failed(series, exc):
        heard.append((series, str(exc)))
        return [partner]
    timing.in_turns([ok, bad, partner], min_runs=4, turns=4, failed=failed)
    assert heard == [(bad, "capture failed")]
    assert len(ok.times) == 4 and len(bad.times) == 1
    assert order.count("partner") == 1  # round one only: left out with the broken one

    with pytest.raises(RuntimeError, match="capture failed"):  # no `failed`: it propagates
        order.clear()
        timing.in_turns([timing.Series(broken)], min_runs=3)
