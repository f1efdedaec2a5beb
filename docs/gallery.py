"""Make the gallery: run the smoke studies, copy their figures to docs/gallery/, write gallery.md.

    python docs/gallery.py                 # all figures (a few minutes on a laptop CPU)
    python docs/gallery.py phase-diagram   # only the figures of the named studies

Each figure is `DIR/<figure>.png` of `workbench run <study> --smoke --out DIR` (run here as
`python -m studies run ...`, the same command), shrunk to at most `MAX_WIDTH` pixels wide and
saved as an optimized 256-colour PNG, so that the committed PNGs stay small (< 200 kB each). The page
`docs/gallery.md` is written from `FIGURES` below, with the exact command under each figure:
edit this file, not the page. Needs the `studies` and `docs` extras (and the `pretrained` extra
for the real-model figure).
"""

from __future__ import annotations

import subprocess
import sys
import tempfile
from pathlib import Path

DOCS = Path(__file__).resolve().parent
ROOT = DOCS.parent
OUT = DOCS / "gallery"
PAGE = DOCS / "gallery.md"
MAX_WIDTH = 1600  # pixels
MAX_BYTES = 200_000

# (study, figure, title, caption): the figure is `DIR/<figure>.png` of the study's smoke run.
FIGURES = [
    (
        "phase-diagram",
        "phase_diagram",
        "Clustering phase diagram (paper B, Fig. 3/5)",
        "Fraction of token pairs with $\\langle x_i, x_j\\rangle \\ge 1 - 10^{-3}$ over time $t$ "
        "and inverse temperature $\\beta$, for two dimensions $d$, against the theory curve "
        "$\\Gamma_\\infty$. See [Particles on the sphere](particles.md).",
    ),
    (
        "cluster-histograms",
        "histograms",
        "Tokens cluster (paper B, Fig. 1)",
        "Histograms of the pairwise inner products $\\langle x_i, x_j\\rangle$ of the SA dynamics "
        "at increasing times: in $d = 2$ the tokens collapse into a few clusters; in $d = 32$ "
        "they stay spread out far longer. See [Particles on the sphere](particles.md).",
    ),
    (
        "real-model-dynamics",
        "histograms",
        "The same statistic in a real model",
        "Pairwise inner products of the normalized token states of all-MiniLM-L6-v2 (loaded "
        "as an equation), layer by layer: with depth the mass shifts to larger inner products. "
        "Needs the `pretrained` extra.",
    ),
    (
        "convergence-order",
        "convergence_random_pre-norm",
        "Observed orders and work-precision",
        "Error at the final time against the step size, the number of vector-field evaluations "
        "and the wall time, for a splitting scheme (dashed) and diffrax solvers on the pre-norm "
        "equation; the legend gives the fitted orders. See "
        "[Numerical analysis](numerical-analysis.md).",
    ),
    (
        "splitting-error",
        "splitting_local_error",
        "Splitting error and the commutator",
        "Local error of the Lie, Strang and fourth-order splittings (exact sub-flows) against "
        "the step $\\tau$; Lie's error follows $\\frac{\\tau^2}{2}\\|[A, F](u)\\|$, the "
        "commutator of the attention and feed-forward fields (right: the relative deviation "
        "from that leading term). See [Numerical analysis](numerical-analysis.md).",
    ),
    (
        "stability",
        "stability_regions",
        "Stability regions and Jacobian spectra",
        "Stability regions $|R(z)| = 1$ of explicit Runge–Kutta methods (left) and of the "
        "splittings (right), with the scaled eigenvalues $\\tau\\lambda$ of the equation's "
        "Jacobian at $\\tau = 1$, one step per layer. See "
        "[Numerical analysis](numerical-analysis.md).",
    ),
]


def command(study: str) -> str:
    return f"workbench run {study} --smoke --out DIR"


def shrink(src: Path, dst: Path) -> None:
    """Copy `src` to `dst`, at most `MAX_WIDTH` pixels wide, as an optimized 256-colour PNG
    (line plots and heat maps lose nothing visible; the files shrink several times)."""
    from PIL import Image

    with Image.open(src) as im:
        im = im.convert("RGB")
        if im.width > MAX_WIDTH:
            height = round(im.height * MAX_WIDTH / im.width)
            im = im.resize((MAX_WIDTH, height), Image.Resampling.LANCZOS)
        im = im.quantize(colors=256, method=Image.Quantize.MEDIANCUT, dither=Image.Dither.NONE)
        im.save(dst, format="PNG", optimize=True)
    size = dst.stat().st_size
    if size > MAX_BYTES:
        print(f"warning: {dst.name} is {size / 1e3:.0f} kB (> {MAX_BYTES / 1e3:.0f} kB)")


def page() -> str:
    lines = [
        "# Gallery",
        "",
        "Figures from the studies' smoke runs (shrunken sizes, seconds to a few minutes on a",
        "CPU). Under each figure is the command that makes it: it writes `DIR/<figure>.png`",
        "together with `report.md` and `results.json`. Without `--smoke` the same study runs at",
        "full size. `workbench list` names every study and `workbench run <study> --help`",
        "describes one; [Extending](extending.md#adding-a-study) shows how to add one.",
        "",
        "<!-- Written by docs/gallery.py (python docs/gallery.py): edit FIGURES there. -->",
    ]
    for study, figure, title, caption in FIGURES:
        lines += [
            "",
            f"## {title}",
            "",
            f"![{title}](gallery/{study}-{figure}.png)",
            "",
            caption,
            "",
            "```bash",
            command(study),
            f"# DIR/{figure}.png",
            "```",
        ]
    return "\n".join(lines) + "\n"


def main(argv: list[str]) -> int:
    known = {study for study, *_ in FIGURES}
    unknown = sorted(set(argv) - known)
    if unknown:
        print(f"unknown studies {unknown}; the gallery's are {sorted(known)}", file=sys.stderr)
        return 2
    studies = [s for s in dict.fromkeys(study for study, *_ in FIGURES) if not argv or s in argv]
    OUT.mkdir(exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        for study in studies:
            out = Path(tmp) / study
            print(f"$ {command(study).replace('DIR', str(out))}", flush=True)
            cmd = [sys.executable, "-m", "studies", "run", study, "--smoke", "--out", str(out)]
            subprocess.run(cmd, cwd=ROOT, check=True, stdout=subprocess.DEVNULL)
            for s, figure, *_ in FIGURES:
                if s == study:
                    dst = OUT / f"{study}-{figure}.png"
                    shrink(out / f"{figure}.png", dst)
                    print(f"  {dst.relative_to(ROOT)} ({dst.stat().st_size / 1e3:.0f} kB)")
    PAGE.write_text(page(), encoding="utf-8")
    print(f"wrote {PAGE.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
