"""A service's stop on a signal must come through even when the signal lands while the main thread holds
the lock that stop() needs (threading.Event.set() inside a handler deadlocked the governor this way)."""

import os
import signal
import threading

from host_runtime.common.stop_signal import stop_on_signals


def test_stop_comes_through_while_the_main_thread_holds_the_lock_stop_needs():
    lock = threading.Lock()
    stopped = threading.Event()

    def stop():
        with lock:  # what Event.set() does with its condition's lock
            stopped.set()

    previous = signal.getsignal(signal.SIGUSR1)
    try:
        stop_on_signals(stop, signals=(signal.SIGUSR1,))
        with lock:
            os.kill(os.getpid(), signal.SIGUSR1)
            for _ in range(1000):  # bytecodes: the handler runs here, with the lock held
                pass
            assert not stopped.is_set()
        assert stopped.wait(5), "stop() never ran after the signal"
    finally:
        signal.signal(signal.SIGUSR1, previous)
