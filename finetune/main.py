"""Fine-tune and evaluate: python -m finetune.main --config=configs/indonli_large.py --workdir=DIR

    --config=configs/indonli_large.py:cpu_test      tiny model on the shipped fixture, offline
    --config.optimizer.lr=3e-5 --config.seeds="(1,2,3)"   field overrides
    --config.data.source=/path/to/indonli           local files instead of downloading
    --config.model.init=/path/to/indobert-large-p2  local checkpoint directory

Rerunning the same command in the same workdir resumes from the latest checkpoint.
"""

from nli_jax import cli

cli.define_flags()

if __name__ == "__main__":
    cli.run(cli.main)
