"""The registry: each table's names map to the right objects (checked by value), lookups fail with
one clear error, each table has one public name (in `wb.registry`), and no study keeps a table of
its own."""

import ast
import inspect
import math
import pathlib
import typing

import diffrax
import jax.numpy as jnp
import numpy as np
import pytest

import workbench as wb
import workbench.analysis as wba
from workbench._table import Table
from workbench.analysis._plan import declared_order
from workbench.particles._integrators import AbstractProjectedRK
from workbench.registry import _TABLES

R = wb.registry
S = wb.schemes
P = wb.particles
ROOT = pathlib.Path(__file__).resolve().parents[3]
ODE = diffrax.ODETerm(lambda t, y, args: y)


# ----------------------------------------------------------------------------------------------
# Each table: names -> the right objects


def test_tables_are_indexed_by_their_kind():
    assert list(_TABLES) == [
        "splitting_scheme",
        "ode_solver",
        "method",
        "unsplit_method",
        "sphere_integrator",
        "quadrature_rule",
        "activation",
    ]
    for kind, table in _TABLES.items():
        assert isinstance(table, Table) and table.kind == kind
        for name in table:
            assert R.lookup(kind, name) is table[name]


def test_splitting_schemes():
    expected = {
        "lie": (S.LieTrotter, 1, S.Euler),
        "strang": (S.Strang, 2, S.Midpoint),
        "yoshida4": (S.Yoshida4, 4, S.RK4),
        "suzuki4": (S.Suzuki4, 4, S.RK4),
    }
    assert list(R.SPLITTING_SCHEMES) == list(expected)
    for name, (cls, order, inner) in expected.items():
        scheme = R.SPLITTING_SCHEMES[name]
        assert type(scheme) is cls and scheme.order() == order, name
        assert type(scheme.inner) is inner, name
        # Every operator's sub-steps add up to one full step.
        stages = scheme.stages(2)
        for k in range(2):
            assert math.isclose(sum(f for op, f in stages if op == k), 1.0, rel_tol=1e-14), name


def test_ode_solvers():
    expected = {
        "euler": (diffrax.Euler, 1),
        "heun": (diffrax.Heun, 2),
        "midpoint": (diffrax.Midpoint, 2),
        "ralston": (diffrax.Ralston, 2),
        "bosh3": (diffrax.Bosh3, 3),
        "rk4": (wb.solvers.ClassicalRK4, 4),
        "tsit5": (diffrax.Tsit5, 5),
        "dopri5": (diffrax.Dopri5, 5),
        "dopri8": (diffrax.Dopri8, 8),
    }
    assert list(R.ODE_SOLVERS) == list(expected)
    for name, (cls, order) in expected.items():
        solver = R.ODE_SOLVERS[name]
        assert type(solver) is cls and solver.order(ODE) == order, name


def test_unsplit_methods():
    expected = {
        "unsplit-euler": (S.Euler, 1, 1),
        "unsplit-heun": (S.Heun, 2, 2),
        "unsplit-midpoint": (S.Midpoint, 2, 2),
        "unsplit-rk4": (S.RK4, 4, 4),
    }
    assert list(R.UNSPLIT_METHODS) == list(expected)
    for name, (cls, order, stages) in expected.items():
        method = R.UNSPLIT_METHODS[name]
        assert type(method) is cls and method.order() == order, name
        assert method.tableau.num_stages == stages, name


def test_sphere_integrators():
    expected = {
        "euler": (P.ProjectedEuler, 1),
        "rk2": (P.ProjectedRK2, 2),
        "rk4": (P.ProjectedRK4, 4),
        "geodesic-euler": (P.GeodesicEuler, 1),
    }
    assert list(R.SPHERE_INTEGRATORS) == list(expected)
    for name, (cls, order) in expected.items():
        integrator = R.SPHERE_INTEGRATORS[name]
        assert type(integrator) is cls and integrator.order() == order, name


def test_quadrature_rules():
    expected = {
        "midpoint": (wba.MidpointRule, np.array([0.125, 0.375, 0.625, 0.875])),
        "trapezoid": (wba.TrapezoidRule, np.array([0.0, 1 / 3, 2 / 3, 1.0])),
        "gauss": (wba.GaussLegendreRule, 0.5 + 0.5 * np.polynomial.legendre.leggauss(4)[0]),
    }
    assert list(R.QUADRATURE_RULES) == list(expected)
    for name, (cls, nodes) in expected.items():
        rule = R.QUADRATURE_RULES[name]
        assert type(rule) is cls and rule.name == name
        t, w = rule.nodes_weights(4)
        np.testing.assert_allclose(t, nodes, rtol=0, atol=1e-15)
        np.testing.assert_allclose(w.sum(), 1.0, rtol=1e-15)


def _gelu(x):
    return 0.5 * x * (1.0 + math.erf(x / math.sqrt(2.0)))


def _gelu_tanh(x):
    return 0.5 * x * (1.0 + math.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * x**3)))


def test_activations_match_their_formulas():
    reference = {
        "gelu": _gelu,
        "gelu_new": _gelu_tanh,
        "gelu_pytorch_tanh": _gelu_tanh,
        "gelu_tanh": _gelu_tanh,
        "relu": lambda x: max(x, 0.0),
        "tanh": math.tanh,
    }
    assert list(R.ACTIVATIONS) == list(reference)
    x = np.linspace(-4.0, 4.0, 81)
    for name, formula in reference.items():
        got = np.asarray(R.ACTIVATIONS[name](jnp.asarray(x)))
        np.testing.assert_allclose(got, [formula(v) for v in x], rtol=1e-13, atol=1e-15)
    assert R.ACTIVATIONS["gelu_new"] is R.ACTIVATIONS["gelu_tanh"] is wb.terms.gelu_tanh
    # Every activation with a Hugging Face name maps back to one of its names.
    for fn in set(R.ACTIVATIONS.values()):
        assert R.ACTIVATIONS[wb.terms._activations.activation_name(fn)] is fn


def test_every_concrete_option_class_is_named():
    """A new scheme, RK tableau, sphere integrator or rule exported by its package gets a name."""
    bases = [
        (S, S.AbstractSplittingScheme, R.SPLITTING_SCHEMES),
        (S, S.AbstractExplicitRK, R.UNSPLIT_METHODS),
        (P, P.AbstractSphereIntegrator, R.SPHERE_INTEGRATORS),
        (wba, wba.AbstractQuadratureRule, R.QUADRATURE_RULES),
    ]
    for module, base, table in bases:
        named = {type(v) for v in table.values()}
        for obj in vars(module).values():
            # House style: abstract classes are named `Abstract…`. DiffraxProjected wraps any
            # diffrax solver; it has no name of its own.
            concrete = inspect.isclass(obj) and issubclass(obj, base)
            if (
                concrete
                and not obj.__name__.startswith("Abstract")
                and obj is not P.DiffraxProjected
            ):
                assert obj in named, f"{obj.__name__} has no name in {table.kind}"


# ----------------------------------------------------------------------------------------------
# Names: one meaning per table; option lists that mix two tables have disjoint names


def test_mixed_option_lists_have_disjoint_names():
    assert not set(R.ODE_SOLVERS) & set(R.SPLITTING_SCHEMES)  # R.METHODS
    assert not set(R.UNSPLIT_METHODS) & set(R.SPLITTING_SCHEMES)  # the splitting-error study
    assert not set(R.UNSPLIT_METHODS) & set(R.ODE_SOLVERS)
    # The same name in two kinds names two different objects, told apart by the kind.
    assert type(R.lookup("ode_solver", "rk4")) is wb.solvers.ClassicalRK4
    assert type(R.lookup("sphere_integrator", "rk4")) is P.ProjectedRK4
    assert type(R.lookup("unsplit_method", "unsplit-rk4")) is S.RK4


def test_command_line_names_of_the_studies_still_work():
    from studies._toolkit.fields import Integrator

    # `--integrator` is a Literal of exactly the registry's names.
    literal = typing.get_type_hints(Integrator)["integrator"]
    assert set(typing.get_args(literal)) == set(R.SPHERE_INTEGRATORS)
    for kind, names in [
        ("sphere_integrator", ("rk4", "rk2", "euler", "geodesic-euler")),
        ("splitting_scheme", ("lie", "strang", "yoshida4", "suzuki4")),
        ("quadrature_rule", ("midpoint", "trapezoid", "gauss")),
        ("activation", ("gelu", "relu", "tanh")),
    ]:
        for name in names:
            R.lookup(kind, name)
    for name in ("lie", "strang", "rk4", "tsit5", "dopri8"):
        assert name in R.METHODS


def test_memory_stage_counts_match_the_integrators():
    from studies._toolkit.memory import INTEGRATOR_STAGES

    assert set(INTEGRATOR_STAGES) == set(R.SPHERE_INTEGRATORS)
    for name, integrator in R.SPHERE_INTEGRATORS.items():
        if isinstance(integrator, AbstractProjectedRK):
            assert INTEGRATOR_STAGES[name] == integrator.method.tableau.num_stages, name


# ----------------------------------------------------------------------------------------------
# One public name per table; METHODS is the ODE solvers and splitting schemes together


def _public_namespaces():
    yield "workbench", wb
    for name, module in vars(wb).items():
        if not name.startswith("_") and inspect.ismodule(module):
            yield f"workbench.{name}", module


def test_each_table_has_one_public_name():
    names = {
        kind: [
            f"{ns}.{attr}"
            for ns, module in _public_namespaces()
            for attr, value in vars(module).items()
            if value is table and not attr.startswith("_")
        ]
        for kind, table in _TABLES.items()
    }
    assert names == {
        "splitting_scheme": ["workbench.registry.SPLITTING_SCHEMES"],
        "ode_solver": ["workbench.registry.ODE_SOLVERS"],
        "method": ["workbench.registry.METHODS"],
        "unsplit_method": ["workbench.registry.UNSPLIT_METHODS"],
        "sphere_integrator": ["workbench.registry.SPHERE_INTEGRATORS"],
        "quadrature_rule": ["workbench.registry.QUADRATURE_RULES"],
        "activation": ["workbench.registry.ACTIVATIONS"],
    }
    assert R.__all__ == sorted([*(names[k][0].rsplit(".", 1)[1] for k in names), "lookup"])


def test_methods_and_unsplit_methods():
    expected = {
        "euler": (diffrax.Euler, 1),
        "heun": (diffrax.Heun, 2),
        "midpoint": (diffrax.Midpoint, 2),
        "ralston": (diffrax.Ralston, 2),
        "bosh3": (diffrax.Bosh3, 3),
        "rk4": (wb.solvers.ClassicalRK4, 4),
        "tsit5": (diffrax.Tsit5, 5),
        "dopri5": (diffrax.Dopri5, 5),
        "dopri8": (diffrax.Dopri8, 8),
        "lie": (S.LieTrotter, 1),
        "strang": (S.Strang, 2),
        "yoshida4": (S.Yoshida4, 4),
        "suzuki4": (S.Suzuki4, 4),
    }
    assert {n: (type(m), declared_order(m)) for n, m in R.METHODS.items()} == expected
    assert list(R.METHODS) == [*R.ODE_SOLVERS, *R.SPLITTING_SCHEMES]
    for name, method in R.METHODS.items():
        table = R.ODE_SOLVERS if name in R.ODE_SOLVERS else R.SPLITTING_SCHEMES
        assert method is table[name]
    assert {n: (type(m), m.order()) for n, m in R.UNSPLIT_METHODS.items()} == {
        "unsplit-euler": (S.Euler, 1),
        "unsplit-heun": (S.Heun, 2),
        "unsplit-midpoint": (S.Midpoint, 2),
        "unsplit-rk4": (S.RK4, 4),
    }


def test_tables_are_read_only():
    with pytest.raises(TypeError):
        R.SPLITTING_SCHEMES["trotter"] = S.LieTrotter()  # type: ignore[index]
    with pytest.raises(KeyError):
        R.SPLITTING_SCHEMES["trotter"]


# ----------------------------------------------------------------------------------------------
# Errors: the kind, the bad name, the valid names, a suggestion when one is close


def test_unknown_kind():
    with pytest.raises(ValueError) as info:
        R.lookup("integrator", "rk4")
    assert str(info.value) == (
        "kind='integrator' is not a known kind of option; valid choices: splitting_scheme, "
        "ode_solver, method, unsplit_method, sphere_integrator, quadrature_rule, activation. "
        "Did you mean 'sphere_integrator'?"
    )


@pytest.mark.parametrize(
    "kind, name, field, message",
    [
        (
            "splitting_scheme",
            "strnag",
            None,
            "splitting_scheme='strnag' is not a known splitting scheme; valid choices: lie, "
            "strang, yoshida4, suzuki4. Did you mean 'strang'?",
        ),
        (
            "unsplit_method",
            "rk4",
            "method",
            "method='rk4' is not a known unsplit method; valid choices: unsplit-euler, "
            "unsplit-heun, unsplit-midpoint, unsplit-rk4. Did you mean 'unsplit-rk4'?",
        ),
        (
            "sphere_integrator",
            "rk5",
            "integrator",
            "integrator='rk5' is not a known sphere integrator; valid choices: euler, rk2, rk4, "
            "geodesic-euler. Did you mean 'rk4'?",
        ),
        (
            "quadrature_rule",
            "simpson",
            None,
            "quadrature_rule='simpson' is not a known quadrature rule; valid choices: midpoint, "
            "trapezoid, gauss.",
        ),
        (
            "activation",
            None,
            None,
            "activation=None is not a known activation; valid choices: gelu, gelu_new, "
            "gelu_pytorch_tanh, gelu_tanh, relu, tanh.",
        ),
        (
            "ode_solver",
            ["rk4"],
            "solver",
            "solver=['rk4'] is not a known ODE solver; valid choices: euler, heun, midpoint, "
            "ralston, bosh3, rk4, tsit5, dopri5, dopri8.",
        ),
    ],
)
def test_unknown_name(kind, name, field, message):
    with pytest.raises(ValueError) as info:
        R.lookup(kind, name, field=field)
    assert str(info.value) == message


def test_table_names_must_be_strings():
    with pytest.raises(
        ValueError, match=r"Table 'x': names must be non-empty strings; got \[1, ''\]"
    ):
        Table("x", "thing", {"a": 0, 1: 1, "": 2})


# ----------------------------------------------------------------------------------------------
# No study keeps a table of its own


def _module_level_assignments(path: pathlib.Path):
    for node in ast.parse(path.read_text()).body:
        if isinstance(node, (ast.Assign, ast.AnnAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            for target in targets:
                if isinstance(target, ast.Name) and node.value is not None:
                    yield target.id, node.value


def _string_literals(node) -> set[str] | None:
    """The strings of a literal tuple/list/set of string constants (else None)."""
    if isinstance(node, (ast.Tuple, ast.List, ast.Set)) and node.elts:
        if all(isinstance(e, ast.Constant) and isinstance(e.value, str) for e in node.elts):
            return {e.value for e in node.elts}
    return None


STUDIES = sorted((ROOT / "studies").rglob("*.py"))
TABLE_NAMES = {
    "SCHEMES",
    "ACTIVATIONS",
    "INTEGRATORS",
    "QUADRATURE_RULES",
    "UNSPLIT_METHODS",
    "SPLITTING_SCHEMES",
    "ODE_SOLVERS",
    "SPHERE_INTEGRATORS",
}


def _study_id(path) -> str:
    return path.relative_to(ROOT / "studies").as_posix()


def _module_name(path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


@pytest.mark.parametrize("path", STUDIES, ids=_study_id)
def test_no_study_defines_its_own_table(path):
    for name, value in _module_level_assignments(path):
        assert name not in TABLE_NAMES, f"{path.name} defines {name}; use wb.registry"
        if isinstance(value, ast.Dict):
            # A dict literal of name -> option object duplicates a table (by value below).
            continue
        names = _string_literals(value)
        for table in _TABLES.values():
            assert names != set(table), (
                f"{path.name}: {name} spells out every name of wb.registry's {table.kind} table; "
                "derive it from the table"
            )


@pytest.mark.parametrize("path", [p for p in STUDIES if p.name != "__main__.py"], ids=_study_id)
def test_no_study_maps_names_to_registry_objects(path):
    import importlib

    module = importlib.import_module(_module_name(path))
    for attr, value in vars(module).items():
        if not isinstance(value, dict):
            continue
        for table in _TABLES.values():
            same = [
                k for k, v in value.items() if k in table and (v is table[k] or v is type(table[k]))
            ]
            assert not same, f"{module.__name__}.{attr} repeats {table.kind} names {same}"
