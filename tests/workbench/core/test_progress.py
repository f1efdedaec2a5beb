"""The progress bar in a Jupyter kernel: tqdm's widget with `ipywidgets`, and without it the
plain text bar, quietly (`workbench._progress`).

`tqdm.auto` prints `TqdmWarning: IProgress not found` into a notebook's output when it runs in a
Jupyter kernel without `ipywidgets`; the library picks the text bar itself in that case. The
tests stand in a Jupyter kernel as `tqdm.autonotebook` recognises one (`ipykernel.zmqshell`
imported, `IPython.get_ipython()` a `ZMQInteractiveShell`), with `ipywidgets` made
unimportable, and tqdm's automatic modules imported afresh.
"""

import sys
import types
import warnings

import pytest

from workbench._progress import progress_bar, tqdm_class

tqdm_std = pytest.importorskip("tqdm.std", reason="the progress bar needs tqdm")


class ZMQInteractiveShell:
    """What `IPython.get_ipython()` returns in a Jupyter kernel (tqdm reads the class name)."""


@pytest.fixture
def kernel_without_ipywidgets(monkeypatch):
    ipython = pytest.importorskip("IPython", reason="stands in a Jupyter kernel with IPython")
    monkeypatch.setitem(sys.modules, "ipywidgets", None)  # `import ipywidgets` fails
    monkeypatch.setitem(sys.modules, "ipykernel.zmqshell", types.ModuleType("ipykernel.zmqshell"))
    monkeypatch.setattr(ipython, "get_ipython", ZMQInteractiveShell)
    for name in ("tqdm.auto", "tqdm.autonotebook", "tqdm.notebook"):
        monkeypatch.delitem(sys.modules, name, raising=False)
    monkeypatch.delenv("QT_API", raising=False)  # tqdm takes that for a Qt console
    monkeypatch.delenv("WORKBENCH_PROGRESS", raising=False)


def test_the_stand_in_kernel_makes_tqdm_auto_warn(kernel_without_ipywidgets):
    """The situation the library avoids: `tqdm.auto` itself warns there."""
    with pytest.warns(tqdm_std.TqdmWarning, match="IProgress not found"):
        import tqdm.auto  # noqa: F401


def test_text_bar_without_ipywidgets_and_no_warning(kernel_without_ipywidgets):
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert tqdm_class() is tqdm_std.tqdm
        with progress_bar(3, desc="train", disable=False) as bar:
            assert type(bar) is tqdm_std.tqdm
            bar.update(2)
            assert bar.n == 2
    assert [str(w.message) for w in caught] == []


def test_widget_bar_class_with_ipywidgets():
    pytest.importorskip("ipywidgets", reason="needs ipywidgets (the notebooks and test extras)")
    import tqdm.auto

    assert tqdm_class() is tqdm.auto.tqdm


def test_hidden_bar_is_a_no_op(monkeypatch):
    monkeypatch.setenv("WORKBENCH_PROGRESS", "0")
    with progress_bar(3, desc="train", disable=False) as bar:
        assert not isinstance(bar, tqdm_std.tqdm)
        bar.update(1)
        bar.set_postfix(loss="0.1")
