"""IndoNLI with indobenchmark/indobert-base-p2; the recipe of configs/indonli_large.py (see there)."""
from configs import indonli_large


def get_config(arg=None):
    return indonli_large.indonli_config(arg, init="indobenchmark/indobert-base-p2")
