"""The training group: tests of the offline pipeline (models/), which need torch and
the train and multilingual extras. Every module here is marked `training`.

Where torch is not installed (the service's venv, `make test-service`) these
modules are not collected at all: they import torch at the top. Where it is,
`pytest -m training` runs them; a venv that lacks the extras then fails on
import rather than passing with nothing run."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

from tests.helpers import TINY_PARITY_TEXTS

collect_ignore_glob = [] if importlib.util.find_spec("torch") else ["test_*.py"]


@pytest.fixture(scope="session")
def torch_artifacts(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """artifacts/ with a tiny random BERT exported to int8 through models.export, the real pipeline."""
    from core.bundle import TOKENIZER_FILE
    from models.encoder import DualEncoder, minilm_path, tiny_body
    from models.export import ExportConfig, export_bundle

    root = tmp_path_factory.mktemp("torch-artifacts")
    config = ExportConfig(
        name="tiny-int8",
        model_id="tiny-random-bert",
        kind="tiny",
        tokenizer_path=minilm_path() / TOKENIZER_FILE,
        # A random 32-wide model quantises worse than a trained one; the
        # mechanism, not MiniLM's figure, is what is under test here.
        min_parity_cosine=0.95,
    )
    export_bundle(DualEncoder(tiny_body(vocab_size=30522)), config, root / "bundles", TINY_PARITY_TEXTS)
    return root


@pytest.fixture(scope="session")
def e5_pack(tmp_path_factory: pytest.TempPathFactory):  # type: ignore[no-untyped-def]
    """A tiny e5 pack (tests/training/tiny_pack.py): what the teacher, the student and the poly head read."""
    from tests.training.tiny_pack import write_tiny_pack

    return write_tiny_pack(tmp_path_factory.mktemp("e5-pack"))
