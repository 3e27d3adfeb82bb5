"""Fixtures for the ingest tests (helpers live in ingest_helpers.py)."""

import pytest
import zmq

from tests.ingest.ingest_helpers import Receiver


@pytest.fixture
def zmq_ctx():
    ctx = zmq.Context()
    yield ctx
    ctx.destroy(linger=0)


@pytest.fixture
def receiver(zmq_ctx) -> Receiver:
    return Receiver(zmq_ctx)
