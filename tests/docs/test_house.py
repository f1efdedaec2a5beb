"""The house rules a reader relies on, checked on the source tree: a short README that starts
with its two commands, no dated measurements in code, explicit imports, a formatter that owns
the layout, and a `studies/` whose top level shows its shape."""

import ast
import pathlib
import re

ROOT = pathlib.Path(__file__).resolve().parents[2]
DATE = re.compile(r"20[0-9]{2}-[0-9]{2}-[0-9]{2}")


def _python_files(*trees):
    for tree in trees:
        yield from sorted((ROOT / tree).rglob("*.py"))


def test_readme_is_short_and_starts_with_its_two_commands():
    lines = (ROOT / "README.md").read_text(encoding="utf-8").splitlines()
    assert len(lines) <= 150, f"README.md has {len(lines)} lines; at most 150"
    head = "\n".join(lines[:40])
    assert "workbench tour" in head, "the tour's command is not within the README's first 40 lines"
    assert "python -m pytest" in head, "the test command is not within the README's first 40 lines"


def test_no_dated_notes_in_library_or_study_code():
    """Docstrings and comments say what and why; a date in code is a measurement or a piece of
    history that belongs in `benchmarks/README.md` or `CHANGELOG.md`. (A citation's year alone
    does not match: the pattern is a full date.)"""
    found = [
        f"{path.relative_to(ROOT)}:{i}: {line.strip()}"
        for path in _python_files("workbench", "studies")
        for i, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1)
        if DATE.search(line)
    ]
    assert not found, "dated notes in code:\n" + "\n".join(found)


def test_no_star_imports():
    found = []
    for path in _python_files("workbench", "studies", "tests", "benchmarks", "notebooks", "docs"):
        tree = ast.parse(path.read_text(encoding="utf-8"))
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and any(a.name == "*" for a in node.names):
                found.append(f"{path.relative_to(ROOT)}:{node.lineno}")
    assert not found, "star imports: " + ", ".join(found)


def test_the_formatter_owns_the_layout():
    """`ruff format` lays out the code (CI runs `ruff format --check`); `# fmt: skip` is kept
    for tables aligned by hand."""
    count = sum(
        path.read_text(encoding="utf-8").count("# fmt: skip")
        for path in _python_files(
            "workbench", "studies", "tests", "benchmarks", "notebooks", "docs"
        )
    )
    assert count <= 40, f"{count} `# fmt: skip` markers; at most 40"


def test_studies_top_level_shows_its_shape():
    entries = sorted(
        p.name
        for p in (ROOT / "studies").iterdir()
        if p.name != "__pycache__" and not p.name.startswith(".")
    )
    assert len(entries) <= 10, f"studies/ has {len(entries)} entries at its top level: {entries}"


def test_the_public_surface_of_control_is_small():
    """`workbench.control`'s public names are its `from ._x import Name as Name` re-exports
    (equinox's convention): at most 46; internals (callbacks, run
    state, checkpoint managers) private."""
    import types

    import workbench.control as wbc

    public = [
        n
        for n in dir(wbc)
        if not n.startswith("_") and not isinstance(getattr(wbc, n), types.ModuleType)
    ]
    assert len(public) <= 46, f"workbench.control has {len(public)} public names: {public}"
    for internal in ("Run", "METRICS", "check_data", "batch_indices", "CheckpointManager"):
        assert internal not in public


def test_the_training_loop_is_one_idea():
    """`_trainer.py` holds the loop alone (the mesh, the fingerprint, the signals and the result
    types live in their own modules)."""
    lines = (ROOT / "workbench" / "control" / "_trainer.py").read_text(encoding="utf-8")
    assert len(lines.splitlines()) <= 300
