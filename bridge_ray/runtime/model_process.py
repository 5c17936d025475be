"""What a process that loads models (a sampler, a learner rank, the warm-up) sets before its first model import."""

from __future__ import annotations

# The libraries transformers imports wherever they are installed (the packaged retriever's sentence-transformers
# installs both) for what no role runs: scikit-learn for assisted decoding's confidence threshold, scipy for the
# object-detection losses. With pandas behind scikit-learn: about 1.5 CPU-seconds of every sampler's and learner's
# start, and a share of every graph start.
UNUSED_BY_ROLES = ("sklearn", "scipy")


def skip_unused_transformers_imports() -> None:
    """Keep transformers from importing :data:`UNUSED_BY_ROLES` in this process.

    Only transformers' view changes (its ``is_<library>_available`` checks say no); code in this process may still
    import them. Call it before transformers' generation and loss modules load (an actor's constructor, before its
    models): after, it changes nothing.
    """
    import transformers.utils  # here, not at import: the shard holders and the control plane load no transformers

    for library in UNUSED_BY_ROLES:
        setattr(transformers.utils, f"is_{library}_available", lambda: False)
