"""The fixture files ship with the package and are the files their README names, byte for byte."""

from __future__ import annotations

import hashlib

import pytest

from engine.programs import FIXTURES_DIR

SHA256 = {
    "ggml-vocab-llama-spm.gguf": "16c3724582d59aa8bf84711894e833f916ee46a31d80e21312759c48bf8d0e69",
    "minilm-q8_0.gguf": "bf1d74689ea4b1d2db7bc1ee52ed8f4618984437d05ba47d7513d24a8c5f18ed",
    "minilm-reference.json": "0751e2e6216a2aa0adf2dbb890894e65d01d2cda869f8234f9fe1a5933cf2cb1",
}


@pytest.mark.parametrize("name", list(SHA256))
def test_a_fixture_is_inside_the_project_and_unchanged(name):
    path = FIXTURES_DIR / name
    assert FIXTURES_DIR.parent.name == "engine"  # never a folder beside the checkout
    assert hashlib.sha256(path.read_bytes()).hexdigest() == SHA256[name]
