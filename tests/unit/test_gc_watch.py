"""The process-wide watch on Python's garbage collector: what it counts, and that it leaves with
its last user."""

import gc

from tidepool.runtime import gc_watch


def test_a_collection_is_counted_in_its_generation_with_its_pause():
    watch = gc_watch.start_watching()
    try:
        before = watch.totals()
        gc.collect(1)
        gc.collect()
        after = watch.totals()
        grown = [now - then for now, then in zip(after.collections, before.collections, strict=True)]
        assert grown[1] >= 1 and grown[2] >= 1
        assert after.pause_ns > before.pause_ns
    finally:
        gc_watch.stop_watching()


def test_users_share_one_watch_and_the_last_one_removes_it():
    callbacks = list(gc.callbacks)  # another test's instance may hold the watch already
    first = gc_watch.start_watching()
    second = gc_watch.start_watching()
    assert first is second and gc.callbacks.count(first.on_gc) == 1
    gc_watch.stop_watching()
    assert first.on_gc in gc.callbacks  # one user left
    gc_watch.stop_watching()
    assert gc.callbacks == callbacks
    if first.on_gc not in callbacks:  # these two were its only users: it is gone
        counted = first.totals()
        gc.collect()
        assert first.totals() == counted


def test_a_stop_without_its_start_is_not_counted():
    watch = gc_watch.GcWatch()
    watch.on_gc("stop", {"generation": 0, "collected": 0, "uncollectable": 0})
    assert watch.totals() == gc_watch.GcTotals((0, 0, 0), 0)
