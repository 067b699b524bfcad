"""ELECTRA-small (Clark et al., 2020): replaced-token detection with a generator a quarter of
the discriminator's width; see configs/pretrain/common.py and nli_jax/tasks/electra.py.

    python -m pretrain.main --config=configs/pretrain/electra_small.py:phase=1 --workdir=runs/electra_p1 \
        --config.model.tokenizer=VOCAB_DIR --config.pretrain.corpus="('/data/corpus/*.txt',)"
    python -m pretrain.main --config=configs/pretrain/electra_small.py:phase=2 --workdir=runs/electra_p2 \
        --config.model.init=runs/electra_p1/export
    python -m pretrain.main --config=configs/pretrain/electra_small.py:cpu_test --workdir=/tmp/electra
    # cpu_learn's data and schedule at this shape (benchmarks/experiments/electra_vs_bert.py: the BERT comparison)
    python -m pretrain.main --config=configs/pretrain/electra_small.py:cpu_learn --workdir=/tmp/electra_learn \
        --config.model.tokenizer=/tmp/vocab2000 --config.pretrain.corpus="('/tmp/corpus/*.txt',)"

The export is the discriminator as transformers' ElectraForPreTraining (the generator in its
generator/ subdirectory): fine-tune it with --config.model.init=<workdir>/export.
"""
from configs.pretrain.common import pretrain_config


def get_config(arg=None):
    return pretrain_config("electra-small", arg)
