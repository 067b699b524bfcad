"""NusaX-Senti (nli_jax/tasks/nusax.py) with the IndoNLU recipe of SmSA, the corpus NusaX was
translated from (configs/indonlu.py: Adam, learning rate x 0.9 per epoch, grad norm 10, up to
25 epochs, early stopping patience 12 on validation macro-F1, batch 16), at length 128.

    python -m finetune.main --config=configs/nusax.py:lang=javanese --workdir=runs/nusax_jv
    python -m finetune.main --config=configs/nusax.py:lang=indonesian,transfer --workdir=runs/id_to_all
    python -m finetune.main --config=configs/nusax.py:target=madurese --workdir=runs/multi_to_mad
    python -m finetune.main --config=configs/nusax.py:lang=javanese,cpu_test \\
        --config.data.source=../shared/data/nusax/sentiment --workdir=/tmp/nusax_jv

Variants: lang=L (train and evaluate on L; default indonesian), model=M (configs/indonlu.py's
MODELS, or any checkpoint directory or hub id), transfer (also score every language's
validation / test split: validation_<language>), target=T (multi-source: train on the other 11
languages, score T as validation_T / test_T), cpu_test (the tiny model; point data.source at a
copy).
"""
from configs import finetune_common
from configs import indonlu
from nli_jax.tasks.nusax import LANGUAGES


def transfer_splits(languages) -> tuple[str, ...]:
    return tuple(f"{split}_{lang}" for lang in languages for split in ("validation", "test"))


def get_config(arg=None):
    options = finetune_common.parse_arg(arg)
    lang = options.pop("lang", "indonesian")
    target = options.pop("target", None)
    model = options.pop("model", "base")
    transfer = options.pop("transfer", False)
    cpu_test = options.pop("cpu_test", False)
    finetune_common.refuse_unknown_variants(options, ("lang=", "target=", "model=", "transfer", "cpu_test"))
    for name in (lang, target) if target else (lang,):
        if name not in LANGUAGES:
            raise ValueError(f"unknown NusaX language {name!r}; expected one of {', '.join(LANGUAGES)}")
    c = finetune_common.base_config("nusax")
    if target:  # multi-source: every language but the target
        c.task_options.train_languages = ",".join(l for l in LANGUAGES if l != target)
        c.task_options.eval_languages = target
    else:
        c.task_options.train_languages = lang
        c.task_options.eval_languages = "all" if transfer else ""
    evaluated = LANGUAGES if transfer else (target,) if target else ()
    c.eval_splits = ("validation", "test") + transfer_splits(evaluated)
    c.data.max_seq_length = 128
    indonlu.apply_recipe(c, model)
    if cpu_test:  # a few steps of the tiny model; point data.source at a local copy
        finetune_common.apply_cpu_test(c)
        c.optimizer.lr = 1e-3
        c.train.num_epochs = 2
        c.train.log_every_steps = 10
    return c
