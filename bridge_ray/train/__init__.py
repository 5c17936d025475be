"""The training job: the run it assembles, its stages and evaluations, the preflight checks and the run folder."""
