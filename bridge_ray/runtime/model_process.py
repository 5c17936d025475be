"""What a process that loads models (a sampler, a learner rank, the warm-up) sets before its first model import."""

from __future__ import annotations


def skip_transformers_sklearn() -> None:
    """Keep transformers from importing scikit-learn in this process.

    transformers' generation module imports ``sklearn.metrics`` whenever scikit-learn is installed (the packaged
    retriever's sentence-transformers installs it), for assisted decoding's confidence threshold, which no role
    uses. Behind it come scipy and pandas: about 1 CPU-second of every sampler's and learner's start, and a share of
    every graph start. Only transformers' view changes; code in this process may still import scikit-learn. Call it
    before transformers' generation module loads (an actor's constructor, before its models): after, it changes
    nothing.
    """
    import transformers.utils  # here, not at import: the shard holders and the control plane load no transformers

    transformers.utils.is_sklearn_available = lambda: False
