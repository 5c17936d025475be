"""Suite-wide fixtures: the tiny policy the job tests share (see ``job_fixtures``)."""

import pytest
from job_fixtures import save_tiny_policy


@pytest.fixture(scope="session")
def tiny_policy(tmp_path_factory):
    return save_tiny_policy(tmp_path_factory.mktemp("tiny-policy"))
