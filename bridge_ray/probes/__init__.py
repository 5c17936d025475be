"""The paper's objectives probed on one fixed batch of rollouts, drawn through the production sampler and scorer
(``batch``): the θ-gradient estimators against two-state (``gradients``, Fig. 4) and loss landscapes over θ and η
(``landscape``, Fig. 3). ``bench estimators`` and ``bench landscape`` are their command lines."""
