"""Shared by the test files: pytest finds this file by name."""

import pytest
import torch


@pytest.fixture(scope='module')
def one_thread():
    """Tiny models on two cores that other jobs may share: one thread is faster and steadier than two
    (OpenMP's second thread waits for the busy core). Test modules opt in with
    pytestmark = pytest.mark.usefixtures('one_thread')."""
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)
