"""A universal classifier (Laurer et al., 2023): binary entailment / not-entailment on IndoNLI
mapped to binary plus classification tasks recast as NLI pairs (nli_jax/tasks/universal.py),
then any label set classified zero-shot (python -m finetune.zero_shot; docs/zero_shot.md).

    python -m finetune.main --config=configs/universal_nli.py --workdir=runs/universal \\
        --config.data.source=../shared/data/indonli --config.task_options.recast_source=../shared/data/indonlu
    python -m finetune.universal_heldout --config=configs/universal_nli.py --tasks=smsa,emot,wrete,casa,hoasa \\
        --workdir=runs/heldout --config.data.source=... --config.task_options.recast_source=...
    :cpu_test  the tiny model on the NLI fixture (recast_tasks empty: set them and recast_source)
"""
from configs import finetune_common


def get_config(arg=None):
    c = finetune_common.base_config("universal_nli")
    c.model.init = "indobenchmark/indobert-base-p2"
    c.task_options.recast_tasks = "smsa,emot,wrete,casa,hoasa"
    c.task_options.max_per_class = 500
    c.optimizer.name = "adamw"
    c.optimizer.lr = 2e-5
    c.optimizer.warmup_ratio = 0.06
    c.optimizer.weight_decay = 0.01
    c.train.batch_size = 32
    c.train.num_epochs = 3
    c.data.max_seq_length = 128
    options = finetune_common.parse_arg(arg)
    if options.pop("cpu_test", False):
        finetune_common.apply_nli_cpu_test(c)
        c.task_options.recast_tasks = ""
        c.task_options.max_per_class = 40
        c.optimizer.warmup_ratio = 0.0  # cpu_test warms up for its own 10 steps
    finetune_common.refuse_unknown_variants(options, ("cpu_test",))
    return c
