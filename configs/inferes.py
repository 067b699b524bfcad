"""InferES (Spanish): official train/test, validation carved from train; accuracy by creation
strategy and topic. The paper's recipe: 5 epochs, polynomial decay, Adam, mean of 5 seeds.

    python -m finetune.main --config=configs/inferes.py:model=beto --config.seeds="(1,2,3,4,5)" --workdir=runs/inferes
    python -m finetune.main --config=configs/inferes.py:model=beto,holdout_topic=3 ...   # topic out-of-distribution
"""
from configs import finetune_common

MODELS = {"beto": ("dccuchile/bert-base-spanish-wwm-cased", 2e-5), "mbert": ("google-bert/bert-base-multilingual-cased", 2e-5)}


def get_config(arg=None):
    options = finetune_common.parse_arg(arg)
    model = options.pop("model", "beto")
    c = finetune_common.base_config("inferes", holdout_topic=str(options.pop("holdout_topic", "")),
                                    hypothesis_only=bool(options.pop("hypothesis_only", False)))
    cpu_test = options.pop("cpu_test", False)
    finetune_common.refuse_unknown_variants(options, ("model=", "holdout_topic=", "hypothesis_only", "cpu_test"))
    c.model.init, c.optimizer.lr = MODELS[model]
    c.eval_splits = ("validation", "test", "topic_ood")
    # The validation split is carved from inferes_train.csv at random, so its pairs reuse the training
    # premises and their rewritten hypotheses: 342 of 553 pairs overlap (nli_jax.hooks.overlap);
    # allowed, and each split is also scored without its overlapping pairs ("clean").
    c.data.allow_overlap = True
    c.train.batch_size = 16
    c.train.num_epochs = 5
    c.optimizer.schedule = "polynomial"
    c.train.early_stopping_patience = 0
    if cpu_test:
        finetune_common.apply_nli_cpu_test(c)
        c.data.source = ""
        c.train.max_steps = 20
    return c
