"""indobert-large pretraining (IndoNLU paper, Table 4); see configs/pretrain/common.py.

    python -m pretrain.main --config=configs/pretrain/indobert_large.py:phase=1 --workdir=runs/large_p1
    python -m pretrain.main --config=configs/pretrain/indobert_large.py:phase=2 --workdir=runs/large_p2 \
        --config.model.init=runs/large_p1/export
"""
from configs.pretrain.common import pretrain_config


def get_config(arg=None):
    return pretrain_config("indobert-large", arg)
