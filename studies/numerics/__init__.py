"""The Transformer equation as numerical analysis sees it: observed orders of the schemes
(`convergence_order`), the splitting error against the commutator (`splitting_error`), linear
stability (`stability`), refinement in the token and feature grids (`resolution`), the
Moreau–Yosida penalty form (`penalty`), and the cheapest discretization for a tolerance
(`plan`, which writes the plan training reads)."""
