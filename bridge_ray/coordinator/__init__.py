"""The coordinator role, the control plane: the round loop, the graph of roles it starts and calls, the round
pipeline and the checks, diagnostics and evaluations it runs between rounds."""
