"""Transformers as discretizations: published models recovered exactly (`exact_recovery`), a
real pretrained model's dynamics (`real_model_dynamics`), splitting schemes as layers
(`scheme_architectures`), and the numerical analysis of trained networks
(`trained_model_analysis`)."""
