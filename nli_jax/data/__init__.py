"""Dataset readers, tfds builders and grain pipelines."""
import os

FIXTURES = os.path.join(os.path.dirname(os.path.abspath(__file__)), "fixtures")


def fixture_path(name: str) -> str:
    """Path of a fixture shipped in the package (nli_tiny, tiny_wordpiece)."""
    return os.path.join(FIXTURES, name)
