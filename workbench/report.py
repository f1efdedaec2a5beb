"""Tools for studies and notebooks: tables, figures, progress, atomic files, running a study."""

from ._harness import run_study as run_study, run_tour as run_tour
from ._io import (
    atomic_write_json as atomic_write_json,
    atomic_write_text as atomic_write_text,
    environment as environment,
)
from ._progress import Progress as Progress, progress as progress
from ._report import (
    have_matplotlib as have_matplotlib,
    markdown_table as markdown_table,
    new_figure as new_figure,
    save_figure as save_figure,
)
