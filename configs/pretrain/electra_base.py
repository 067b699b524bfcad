"""ELECTRA-base shape for Indonesian (hidden 768, 12 layers, a generator a third of its width),
replaced-token detection; see configs/pretrain/electra_small.py for the commands.
"""
from configs.pretrain.common import pretrain_config


def get_config(arg=None):
    return pretrain_config("electra-base", arg)
