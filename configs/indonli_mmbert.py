"""IndoNLI with jhu-clsp/mmBERT-base (ModernBERT architecture, Gemma 2 vocabulary) and the fine-tuning
recipe ModernBERT's authors give for ModernBERT-base on GLUE (AnswerDotAI/ModernBERT,
examples/finetune_modernbert_on_glue.ipynb: "hyperparameters that have proven to work well for us"):
AdamW, lr 8e-5, betas (0.9, 0.98), eps 1e-6, weight decay 8e-6, batch 32, 2 epochs, linear decay
without warmup, the best epoch by validation. mmBERT's paper gives no single recipe of its own.
Sequences up to 512 tokens, as the other IndoNLI configs (the model reads 8,192).

    python -m finetune.main --config=configs/indonli_mmbert.py --workdir=gs://bucket/indonli_mmbert
    python -m finetune.main --config=configs/indonli_mmbert.py:cpu_test --workdir=/tmp/indonli_mmbert_cpu_test
"""
from configs import finetune_common, indonli_large


def get_config(arg=None):
    options = finetune_common.parse_arg(arg)
    cpu_test = options.pop("cpu_test", False)
    c = indonli_large.indonli_config(",".join(f"{k}={v}" if v is not True else k for k, v in options.items()),
                                     init="jhu-clsp/mmBERT-base")
    c.optimizer.name = "adamw"
    c.optimizer.lr = 8e-5
    c.optimizer.b1, c.optimizer.b2, c.optimizer.eps = 0.9, 0.98, 1e-6
    c.optimizer.weight_decay = 8e-6
    c.optimizer.schedule = "linear"
    c.optimizer.warmup_steps = 0
    c.train.batch_size = 32
    c.train.num_epochs = 2
    c.train.early_stopping_patience = 0  # two epochs; the best of them is kept (best/)
    if cpu_test:
        # The NLI cpu_test (fixture data, tiny model, offline) with a from-scratch ModernBERT.
        finetune_common.apply_nli_cpu_test(c)
        c.model.preset = "tiny-modernbert"
    return c
