"""Config fields that studies share are declared once (`studies._toolkit.fields`), with one docstring,
and each study keeps its own defaults."""

import ast
import collections
import dataclasses
import inspect
import textwrap

import pytest

import studies
from studies._run.overrides import describe_fields
from studies._toolkit import fields as _fields

TRAINING = (
    "train-digits",
    "train-sequence",
    "depth-refinement",
    "regularization-cost",
    "msa-vs-gradient",
)
PARTICLES = (
    "cluster-histograms",
    "metastability",
    "high-dimension",
    "repulsion",
    "phase-diagram",
    "step-convergence",
)


def _declared(cls) -> list[str]:
    """The field names declared in the source of `cls` itself (annotated assignments)."""
    tree = ast.parse(textwrap.dedent(inspect.getsource(cls)))
    return [n.target.id for n in tree.body[0].body if isinstance(n, ast.AnnAssign)]


@pytest.mark.parametrize("family", [TRAINING, PARTICLES], ids=["training", "particles"])
def test_no_shared_field_is_declared_twice(family):
    where = collections.defaultdict(list)
    for name in family:
        for field in _declared(studies.get_study(name).Config):
            where[field].append(name)
    twice = {field: names for field, names in where.items() if len(names) > 1}
    assert not twice, (
        f"declared in several study configs (move them to studies._toolkit.fields): {twice}"
    )
    # The shared groups of the family: each field declared in exactly one group.
    groups = {
        base
        for name in family
        for base in studies.get_study(name).Config.__mro__[1:]
        if dataclasses.is_dataclass(base)
    }
    assert groups and all(g.__module__ == "studies._toolkit.fields" for g in groups), groups
    counts = collections.Counter(f for g in groups for f in _declared(g))
    assert max(counts.values()) == 1, counts


@pytest.mark.parametrize("name", TRAINING + PARTICLES)
def test_shared_fields_keep_each_studys_defaults_and_show_their_docstring(name):
    module = studies.get_study(name)
    text = describe_fields(module.Config, module.smoke_config())
    fields = dataclasses.fields(module.Config)
    for field in fields:
        # Every field, inherited or not, is listed with its one-line docstring under it.
        block = text.split(f"--{field.name} ", 1)[1].splitlines()
        assert len(block) >= 2 and block[1].strip(), (name, field.name)
    inherited = {
        f.name
        for base in module.Config.__mro__[1:]
        if dataclasses.is_dataclass(base)
        for f in dataclasses.fields(base)
    }
    assert inherited, name


def test_defaults_override_inherited_fields_only():
    config = studies.get_study("depth-refinement").Config()
    assert (config.d, config.num_heads, config.hidden, config.smoothness) == (32, 2, 64, 1e-3)
    assert studies.get_study("train-digits").Config().d == 64  # the group's own default

    with pytest.raises(TypeError, match=r"defaults\(widht\): .*inherits no such field.*d"):

        @dataclasses.dataclass(frozen=True)
        @_fields.defaults(widht=3)
        class Config(_fields.TrainingFields):
            pass
