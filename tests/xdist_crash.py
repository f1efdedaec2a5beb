"""`--dist loadfile` that survives a worker crash (a plugin of the test run, from `conftest.py`).

pytest-xdist (3.8.0, the latest release) hands a crashed worker's whole workload back to the
queue, the files it had finished included (`LoadScopeScheduling.remove_node`). A finished file
is then sent to a worker as an empty list of tests, the worker waits for tests that never come,
and the session hangs until something kills it (a CI run's whole time limit). A replacement worker given a file with one test left hangs
the same way. Upstream: pytest-dev/pytest-xdist issues 784, 1323 and 1327, fixed on their main
branch after 3.8.0.

`CrashSafeLoadFileScheduling` puts back only the files with tests still to run, and marks the
test the worker died in as done: xdist has already reported it as failed ("worker 'gw0'
crashed while running ..."), and running it again would take the next worker down with it.
The session then ends with that failure named, instead of hanging. A file handed to a worker
that has died but is not yet known to be down stays assigned to it and is put back the same
way, instead of an error from the closed channel. Everything else is xdist's
own `LoadFileScheduling` (`tests/test_xdist_crash.py` crashes a worker on purpose). It is
imported only where xdist is installed.
"""

from __future__ import annotations

from xdist.scheduler import LoadFileScheduling


class CrashSafeLoadFileScheduling(LoadFileScheduling):
    """xdist's `LoadFileScheduling` with a `remove_node` that requeues only unfinished files,
    without the test the worker crashed in, a replacement worker started with two tests (or
    told that no more will come), and no error for work sent to a worker that has just died."""

    def schedule(self):
        if self.collection is None:  # the first distribution: xdist's own
            return super().schedule()
        # A replacement worker has collected. A worker runs a test only once it knows the next
        # one (or that none will come), and xdist gives the newcomer a single file, which after
        # a crash may hold a single test: it would wait forever. Top it up to two tests, and
        # shut it down when the queue is empty.
        for node in self.nodes:
            if node.shutting_down or node not in self.registered_collections:
                continue
            while self.workqueue and self._pending_of(self.assigned_work[node]) < 2:
                self._assign_work_unit(node)
            if not self.workqueue:
                node.shutdown()

    def _assign_work_unit(self, node):
        # A worker that died just after a report is still a node until xdist reads its "down"
        # event, and that report may make xdist hand it a file first: the send to its closed
        # channel raises OSError, an INTERNALERROR that ends the session.
        # The file stays assigned to the dead worker, with no test done; `remove_node` puts it
        # back in the queue.
        try:
            super()._assign_work_unit(node)
        except OSError:
            pass

    def remove_node(self, node):
        workload = self.assigned_work.pop(node)
        pending = [
            (scope, nodeid)
            for scope, unit in workload.items()
            for nodeid, done in unit.items()
            if not done
        ]
        if not pending:  # a worker shutting down after its last test
            return None
        scope, crashed = pending[0]  # a worker runs its tests in order: the first unfinished
        workload[scope][crashed] = True
        for scope, unit in workload.items():
            if not all(unit.values()):
                self.workqueue[scope] = unit
        for other in self.assigned_work:
            self._reschedule(other)
        return crashed


def pytest_xdist_make_scheduler(config, log):
    """`CrashSafeLoadFileScheduling` for `--dist loadfile`; xdist's own for the others."""
    if config.getvalue("dist") != "loadfile":
        return None
    return CrashSafeLoadFileScheduling(config, log)
