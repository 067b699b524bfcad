"""IndoNLI with FacebookAI/xlm-roberta-large; the recipe of configs/indonli_large.py (see there)."""
from configs import indonli_large


def get_config(arg=None):
    return indonli_large.indonli_config(arg, init="FacebookAI/xlm-roberta-large")
