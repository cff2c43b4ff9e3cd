"""Busy-interval arithmetic, by hand."""

import threading
import time

import pytest

from rlvr_jax import timeline as tl


def test_merge_and_busy_by_hand():
    spans = [(5.0, 6.0), (0.0, 2.0), (1.0, 3.0), (3.0, 4.0), (7.0, 7.0)]
    # (0,2) ∪ (1,3) ∪ (3,4) touch: one interval; the empty (7,7) is dropped
    assert tl.merge(spans) == [(0.0, 4.0), (5.0, 6.0)]
    assert tl.busy(spans) == pytest.approx(5.0)
    assert tl.busy([]) == 0.0


def test_overlap_by_hand():
    a = [(0.0, 4.0), (6.0, 10.0)]  # busy 8 s
    b = [(3.0, 7.0), (9.0, 9.5)]  # busy 4.5 s
    # both busy: (3,4) + (6,7) + (9,9.5) = 2.5 s, of the shorter 4.5 s
    assert tl.overlap(a, b) == pytest.approx(2.5)
    assert tl.overlap(b, a) == pytest.approx(2.5)
    assert tl.overlap_fraction(a, b) == pytest.approx(2.5 / 4.5)
    assert tl.overlap_fraction(a, []) == 0.0
    # one inside the other: all of the shorter overlaps
    assert tl.overlap_fraction([(0.0, 10.0)], [(2.0, 3.0), (4.0, 5.0)]) == pytest.approx(1.0)
    # disjoint
    assert tl.overlap([(0.0, 1.0)], [(1.0, 2.0)]) == 0.0


def test_timeline_records_spans_and_marks_from_threads_and_clips_to_a_window():
    timeline = tl.Timeline()

    def work(name):
        for _ in range(5):
            with timeline.span(name):
                time.sleep(0.001)

    threads = [threading.Thread(target=work, args=(n,)) for n in ("a", "b")]
    start = timeline.mark("start")
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    end = timeline.mark("end")
    for name in ("a", "b"):
        spans = timeline.spans(name)
        assert len(spans) == 5
        assert all(start <= s < e <= end for s, e in spans)
        assert all(spans[i][1] <= spans[i + 1][0] for i in range(4))  # one thread: in order
    assert timeline.marks("start") == [start] and timeline.marks("nothing") == []
    first = timeline.spans("a")[0]
    mid = (first[0] + first[1]) / 2
    clipped = timeline.spans("a", window=(mid, end))
    assert len(clipped) == 5 and clipped[0] == (mid, first[1])
    # a span still records when its body raises
    with pytest.raises(RuntimeError), timeline.span("c"):
        raise RuntimeError
    assert len(timeline.spans("c")) == 1
