"""The benchmarks behind ``bridge-ray bench <name>``: each module measures one claim (speed, memory, learning,
estimator quality) within one run, prints its figures and writes them as JSON with ``--out``.

A module defines ``add_arguments(parser)`` and ``run(args) -> int``; ``commands/bench.py`` maps names to modules.
"""
