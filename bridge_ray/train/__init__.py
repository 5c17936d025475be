"""The training job: the coordinator's round loop and the pieces it composes."""
