"""Text classification from TSV files with a label-mapping file (nli_jax/tasks/tsv_classification.py),
fine-tuning IndoBERT-base-p2 as the IndoNLU paper fine-tunes its sentence tasks (Adam 3e-5,
batch 16, early stopping on validation macro-F1).

    python -m finetune.main --config=configs/tsv_classification.py --workdir=runs/tsv \
        --config.data.source=DIR --config.task_options.label_map=DIR/labels.tsv
    python -m finetune.main --config=configs/tsv_classification.py:cpu_test --workdir=/tmp/tsv \
        --config.data.source=DIR --config.task_options.label_map=DIR/labels.tsv   # the tiny model, offline
"""
from configs import finetune_common


def get_config(arg=None):
    options = finetune_common.parse_arg(arg)
    c = finetune_common.base_config("tsv_classification")
    c.eval_splits = ("validation",)
    c.model.init = "indobenchmark/indobert-base-p2"
    c.optimizer.lr = 3e-5
    c.train.batch_size = 16
    c.train.num_epochs = 5
    if options.pop("cpu_test", False):
        finetune_common.apply_nli_cpu_test(c)  # the tiny model and shipped tokenizer, a few epochs
        c.data.source = ""
    finetune_common.refuse_unknown_variants(options, ("cpu_test",))
    return c
