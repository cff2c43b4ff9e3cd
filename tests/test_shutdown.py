"""`shutdown.SignalStop`, the one stop of every command, as the trainer uses it: no watchdog
(`grace_s=None`: the step finishes and is checkpointed, however long), the signal's line in the
stopping work's words (`status`), the exit status 128 + the signal; a plain flag where signals
cannot be handled."""

import os
import signal
import threading
import time

from rlvr_jax.shutdown import SignalStop


def test_a_stop_without_grace_says_its_status_sets_its_flag_and_starts_no_watchdog(capfd):
    stop = SignalStop("prog", grace_s=None)
    stop.status = lambda signum: f"signal {signum} at step 7: finishing the current step"
    previous = signal.getsignal(signal.SIGTERM)
    stop.install()
    try:
        os.kill(os.getpid(), signal.SIGTERM)
        assert stop.event.wait(5)
        err, deadline = "", time.monotonic() + 5
        while "send it again" not in err and time.monotonic() < deadline:
            time.sleep(0.02)
            err += capfd.readouterr().err
    finally:
        stop.uninstall()
    assert signal.getsignal(signal.SIGTERM) is previous
    line = "prog: signal 15 at step 7: finishing the current step (send it again to exit at once)"
    assert line in err
    assert stop.signum == signal.SIGTERM and stop.exit_code == 143
    assert "exit-watchdog" not in [t.name for t in threading.enumerate()]


def test_outside_the_main_thread_it_is_a_plain_flag():
    stop, previous = SignalStop("prog", grace_s=None), signal.getsignal(signal.SIGINT)
    worker = threading.Thread(target=stop.install)
    worker.start()
    worker.join()
    assert signal.getsignal(signal.SIGINT) is previous  # nothing installed
    stop.event.set()  # what the trainer does when a push fails
    assert stop.event.is_set() and stop.signum is None and stop.exit_code == 0
    stop.uninstall()  # nothing to restore
