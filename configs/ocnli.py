"""OCNLI (Chinese): train on 50k / 30k / 10k / 3k (`train_size=`), evaluate on dev; accuracy by
genre and by level. Models: roberta-wwm-large (default) or bert-base (Chinese BERT).

    python -m finetune.main --config=configs/ocnli.py:train_size=10k,model=bert-base --workdir=runs/ocnli
"""
from configs import finetune_common

MODELS = {"roberta-wwm-large": ("hfl/chinese-roberta-wwm-ext-large", 2e-5), "bert-base": ("google-bert/bert-base-chinese", 2e-5)}


def get_config(arg=None):
    options = finetune_common.parse_arg(arg)
    model = options.pop("model", "roberta-wwm-large")
    c = finetune_common.base_config("ocnli", train_size=str(options.pop("train_size", "50k")),
                                    hypothesis_only=bool(options.pop("hypothesis_only", False)))
    cpu_test = options.pop("cpu_test", False)
    finetune_common.refuse_unknown_variants(options, ("model=", "train_size=", "hypothesis_only", "cpu_test"))
    c.model.init, c.optimizer.lr = MODELS[model]
    c.eval_splits = ("validation",)
    c.train.batch_size = 32
    c.train.num_epochs = 3
    c.optimizer.schedule = "linear"
    c.optimizer.warmup_ratio = 0.1
    if cpu_test:
        finetune_common.apply_nli_cpu_test(c)
        c.data.source = ""
        c.train.max_steps = 20
    return c
