"""Pretrain: python -m pretrain.main --config=configs/pretrain/indobert_base.py:phase=1 --workdir=DIR

    --config=configs/pretrain/indobert_lite_base.py:cpu_test   tiny model, shipped fixture corpus, offline
    --config.pretrain.corpus="('/data/corpus/*.txt',)"         prepared corpus (pretrain.prepare_corpus)
    --config.pretrain.examples_dir=/data/examples128           prebuilt examples (pretrain.create_examples)
    --config.model.init=RUN1/export                            phase 2 starts from phase 1's final parameters
    --config=configs/pretrain/indobert_base.py:continue --config.model.init=DIR
                                                               continued pretraining of a Hugging Face BERT/ALBERT
                                                               checkpoint, with its own tokenizer and shape

The same loop, checkpointing, exact resume and SIGTERM handling as finetune.main; the final
model and tokenizer are exported to <workdir>/export (Hugging Face format).
"""

from nli_jax import cli

cli.define_flags()

if __name__ == "__main__":
    cli.run(cli.main)
