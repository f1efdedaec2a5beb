"""SIGINT and SIGTERM during training: a request to stop at the next step boundary."""

import contextlib
import signal

__all__ = ["StopRequest"]


class StopRequest:
    """SIGINT/SIGTERM set a flag; the loop checkpoints and stops at the next step boundary. A
    signal the process ignores stays ignored, as Python leaves an ignored SIGINT (a shell
    script's background job has SIGINT ignored, so that Ctrl-C of the script's foreground
    command does not stop it)."""

    def __init__(self):
        self.signal = None

    @contextlib.contextmanager
    def installed(self):
        import threading

        if threading.current_thread() is not threading.main_thread():
            yield self
            return
        previous = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)}
        previous = {s: h for s, h in previous.items() if h is not signal.SIG_IGN}

        def handler(signum, frame):
            del frame
            if self.signal is not None:  # a second signal: stop at once
                signal.default_int_handler(signum, None)
            self.signal = signum

        for s in previous:
            signal.signal(s, handler)
        try:
            yield self
        finally:
            for s, h in previous.items():
                signal.signal(s, h)
