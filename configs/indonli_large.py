"""IndoNLI with IndoBERT-large-p2, the IndoNLI paper's recipe: Adam, batch 16, lr from
{1e-5, 3e-5, 1e-6} (1e-5 default; sweep with --config.optimizer.lr), up to 10 epochs with early
stopping on validation accuracy, three random restarts with --config.seeds=1,2,3.

    python -m finetune.main --config=configs/indonli_large.py --workdir=gs://bucket/indonli_large
    python -m finetune.main --config=configs/indonli_large.py:cpu_test --workdir=/tmp/indonli_cpu_test
    python -m finetune.main --config=configs/indonli_large.py:hypothesis_only ...
"""
from configs import finetune_common


def get_config(arg=None):
    return indonli_config(arg, init="indobenchmark/indobert-large-p2")


def indonli_config(arg, init, task="indonli", known_variants=("cpu_test", "hypothesis_only"), **task_options):
    c = finetune_common.base_config(task, **task_options)
    c.eval_splits = ("validation", "test_lay", "test_expert", "diagnostic")
    c.model.init = init  # hub id, or a local directory with config.json, weights and vocab
    c.optimizer.name = "adam"
    c.optimizer.lr = 1e-5
    c.train.batch_size = 16
    c.train.num_epochs = 10
    c.train.early_stopping_patience = 3
    c.data.max_seq_length = 512  # IndoNLI premises reach 200+ words
    options = finetune_common.parse_arg(arg)
    if options.pop("hypothesis_only", False):
        c.task_options.hypothesis_only = True
    if options.pop("cpu_test", False):
        finetune_common.apply_nli_cpu_test(c)
    finetune_common.refuse_unknown_variants(options, known_variants)
    return c
