"""testkit.permutations.MeetingCover, the fewer interleavings a matrix's later versions run:
every meeting (step j of session t run when session s had run exactly k steps) that some valid
interleaving has is in a valid run it chose, when validity follows waits as the server's do.
No server: the waits are simulated, each step waiting for some other session's step.
"""

from __future__ import annotations

from collections.abc import Mapping

from hypothesis import given, settings
from hypothesis import strategies as st

from testkit.permutations import Meeting, MeetingCover, Order, count, interleavings, meetings

# (t, j) -> (s, m): step j of session t, once issued, waits until session s has run m steps.
Waits = Mapping[tuple[str, int], tuple[str, int]]


def invalid_at(order: Order, waits: Waits) -> int | None:
    """As testkit.permutations runs it: a step of a session still waiting makes it invalid."""
    done: dict[str, int] = dict.fromkeys(order, 0)
    waiting: dict[str, tuple[str, int]] = {}
    for n, t in enumerate(order):
        if t in waiting:
            return n
        w = waits.get((t, done[t]))
        if w and done[w[0]] < w[1]:
            waiting[t] = w
        else:
            done[t] += 1
        freed = True
        while freed:
            freed = False
            for u, (s, m) in list(waiting.items()):
                if done[s] >= m:
                    del waiting[u]
                    done[u] += 1
                    freed = True
    return None


def chosen(lengths: Mapping[str, int], waits: Waits,
           cover: type[MeetingCover] = MeetingCover) -> tuple[set[Meeting], int]:
    chooser, runs = cover(lengths), 0
    judged: set[Meeting] = set()
    while (order := chooser.next()) is not None:
        runs += 1
        at = invalid_at(order, waits)
        chooser.ran(order, at)
        if at is None:
            judged |= meetings(order)
    return judged, runs


@st.composite
def scenarios(draw: st.DrawFn) -> tuple[dict[str, int], Waits]:
    names = "abc"[:draw(st.integers(2, 3))]
    lengths = {s: draw(st.integers(1, 4 if len(names) == 2 else 3)) for s in names}
    waits: dict[tuple[str, int], tuple[str, int]] = {}
    for t in names:
        for j in range(lengths[t]):
            if draw(st.booleans()):
                s = draw(st.sampled_from([s for s in names if s != t]))
                waits[(t, j)] = (s, draw(st.integers(1, lengths[s])))
    return lengths, waits


@settings(max_examples=300, deadline=None)
@given(scenarios())
def test_every_meeting_of_a_valid_interleaving_is_judged(
        case: tuple[dict[str, int], Waits]) -> None:
    lengths, waits = case
    possible = set().union(*(meetings(o) for o in interleavings(lengths)
                             if invalid_at(o, waits) is None))
    judged, runs = chosen(lengths, waits)
    assert judged == possible
    assert runs <= count(lengths)


def test_it_runs_far_fewer_than_all_of_the_suites_shapes() -> None:
    for lengths, most in [({"a": 3, "b": 3, "c": 1}, 10), ({"a": 3, "b": 6}, 12),
                          ({"w": 3, "op": 2, "s": 2}, 10), ({"a": 4, "b": 5}, 12)]:
        judged, runs = chosen(lengths, {})
        assert runs <= most < count(lengths) and judged


class CountsInvalidRuns(MeetingCover):
    """Broken on purpose: an invalid run's meetings count as judged."""

    def ran(self, order: Order, invalid_at: int | None) -> None:
        super().ran(order, None)


def test_negative_control_a_cover_that_counts_invalid_runs_misses_meetings() -> None:
    # b's first step waits for a's commit (its last step): b meets a before that only waiting.
    lengths, waits = {"a": 3, "b": 2}, {("b", 0): ("a", 3)}
    possible = set().union(*(meetings(o) for o in interleavings(lengths)
                             if invalid_at(o, waits) is None))
    assert chosen(lengths, waits)[0] == possible
    assert chosen(lengths, waits, CountsInvalidRuns)[0] != possible
