"""Shared by the test files: pytest finds this file by name."""

import signal

import pytest
import torch

# Started in the background of a non-interactive shell (`cmd &`, nohup), pytest inherits SIGINT ignored, and
# so would every process the tests start: the Ctrl-C tests need Python's usual handler, here and in them.
if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)


@pytest.fixture(scope='module')
def one_thread():
    """Tiny models on two cores that other jobs may share: one thread is faster and steadier than two
    (OpenMP's second thread waits for the busy core). Test modules opt in with
    pytestmark = pytest.mark.usefixtures('one_thread')."""
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)
