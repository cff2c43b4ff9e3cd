"""`dispatch.DeviceTurns`: actors and learner take turns on shared devices (issue 21)."""

from __future__ import annotations

import threading
import time

from rlvr_jax.dispatch import DeviceTurns


def test_turns_exclude_each_other_and_the_learner_goes_first():
    turns, log = DeviceTurns(), []
    turns.acquire("actor")  # a decode chunk is running

    def learner():
        turns.acquire("learner")
        log.append("learner")
        time.sleep(0.05)
        log.append("learner done")
        turns.release()

    def actor():
        time.sleep(0.02)  # asks after the learner did
        with turns.actor():
            log.append("actor")

    threads = [threading.Thread(target=learner), threading.Thread(target=actor)]
    for t in threads:
        t.start()
    time.sleep(0.1)
    assert log == []  # nobody runs beside the chunk
    turns.release()  # the chunk ends: the waiting learner goes before the waiting actor
    for t in threads:
        t.join(5)
    assert log == ["learner", "learner done", "actor"]


def test_a_turn_may_end_on_another_thread():
    turns = DeviceTurns()
    turns.acquire("learner")  # dispatched on the loop's thread...
    ender = threading.Thread(target=turns.release)  # ...ended by the thread that waits for it
    ender.start()
    ender.join(5)
    done = threading.Event()
    threading.Thread(target=lambda: (turns.acquire("actor"), done.set())).start()
    assert done.wait(5)
