"""Suite-wide fixtures: the tiny policy the job tests share (see ``job_fixtures``), and disposable run folders."""

import shutil

import pytest
from job_fixtures import save_tiny_policy


@pytest.fixture(scope="session")
def tiny_policy(tmp_path_factory):
    return save_tiny_policy(tmp_path_factory.mktemp("tiny-policy"))


@pytest.fixture(scope="module")
def module_dir(tmp_path_factory):
    """A folder for one module's shared job run, removed when that module's tests are done.

    A 270M policy's checkpoint is 5 GB (weights plus DeepSpeed's fp32 Adam state); kept until the session ends,
    the job tests' runs add up past what a CI disk has free.
    """
    path = tmp_path_factory.mktemp("module")
    yield path
    shutil.rmtree(path, ignore_errors=True)
