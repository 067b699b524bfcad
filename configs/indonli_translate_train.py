"""IndoNLI translate-train (the IndoNLI paper's rows with XLM-R): train on MNLI machine-translated
to Indonesian, evaluate on IndoNLI; `mix` also adds IndoNLI train.

    python -m finetune.main --config=configs/indonli_translate_train.py \\
        --config.task_options.translate_train_source=/data/translate_train_small --workdir=runs/tt
"""
from configs import finetune_common, indonli_large


def get_config(arg=None):
    options = finetune_common.parse_arg(arg)
    mix = bool(options.pop("mix", False))
    return indonli_large.indonli_config(",".join(k if v is True else f"{k}={v}" for k, v in options.items()) or None,
                                        init="FacebookAI/xlm-roberta-large", task="indonli_translate_train",
                                        known_variants=("mix", "cpu_test", "hypothesis_only"), mix_indonli_train=mix)
