"""The method: what a transform is asked and its checks (spec), the transform in order (pipeline), what T is
(maps), the canonical form and the porting rules (roles, porting), the paper's rules (paper_rules), per-block maps
(per_block), refit and the learned map (refit), growth (grow), carrying optimizer state (carry), geometry,
quantization and distillation. One named function per rule, its docstring the equation."""
