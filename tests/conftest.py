"""Shared fixtures: the bundled model is loaded once per test session (≈4 s from the cache)."""
import pytest
import torch

torch.set_num_threads(max(1, torch.get_num_threads()))


@pytest.fixture(scope="session")
def loaded():
    from engine import loader

    return loader.load("bundled")


@pytest.fixture(scope="session")
def hf_tokenizer(loaded):
    return loaded.tokenizer


@pytest.fixture(scope="session")
def base_engine():
    """One loaded model for the whole run; tests take fresh sessions (own KV pool) from it."""
    from engine import Engine

    return Engine.from_pretrained("bundled", device="cpu")


@pytest.fixture
def engine(base_engine):
    return base_engine.session()
