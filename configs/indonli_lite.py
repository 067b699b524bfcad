"""IndoNLI with indobenchmark/indobert-lite-large-p2; the recipe of configs/indonli_large.py (see there)."""
from configs import indonli_large


def get_config(arg=None):
    return indonli_large.indonli_config(arg, init="indobenchmark/indobert-lite-large-p2")
