"""Sweeps of training settings × seeds: on top of :class:`~bridge_ray.train.run.Run`, a grid of (preset, seed) runs
from shared warm-ups, evaluated at every checkpoint on held-out sets, that a stopped sweep resumes, and the paired
comparison of its presets; rounds of a run timed phase by phase; retriever steps replayed on logged rollouts.
``bench learn``, ``bench round`` (and ``bench speed``) and ``bench replay`` are their command lines.

- ``grid``: what a sweep runs (:class:`~bridge_ray.sweep.grid.Sweep`) and the config of each of its runs;
- ``evaluations``: the evaluations it keeps, round 0 once per warm-up and each checkpoint's beside it;
- ``runs``: training each run to its end (staged presets stage by stage, a run shared by presets trained once),
  and the sweep end to end;
- ``paired``: each preset against the baseline, question by question;
- ``results``: the curve points, ``results.json``, ``results.md`` and the curves;
- ``timing``: rounds of a run timed phase by phase;
- ``replay``: retriever-step variants × seeds replayed on logged turns, judged on a probe's fixed searches.
"""
