"""The particle model of self-attention (paper B) on the sphere: clustering over time
(`cluster_histograms`), long-lived multi-cluster states (`metastability`), the phase diagram
(`phase_diagram`) and whether its step is converged (`step_convergence`), high dimension
(`high_dimension`) and the repulsive case (`repulsion`)."""
