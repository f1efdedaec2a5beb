"""Training a Transformer as the optimal control of its equation: on the digits and a sorting
task (`train_digits`, `train_sequence`), the gradient methods (`adjoint_accuracy`,
`msa_vs_gradient`), the costs on the controls (`regularization_cost`), and whether the trained
network converges to an ODE (`depth_refinement`, `continuous_depth`)."""
