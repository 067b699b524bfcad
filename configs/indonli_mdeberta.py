"""IndoNLI with microsoft/mdeberta-v3-base (DeBERTa-v3's multilingual model; nli_jax/models/deberta.py)
and the recipe its authors publish for XNLI on its model card ("Fine-tuning with HF transformers":
transformers' run_xnli.py on the English training set): global batch 32 (8 GPUs x 4), learning
rate 2e-5, 6 epochs, 3000 warmup steps then linear decay to 0, max_seq_length 256, and the
Trainer's defaults for what the command leaves out: AdamW (betas 0.9 / 0.999, eps 1e-8, weight
decay 0), gradient clipping at norm 1, dropout as config.json has it (0.1), no early stopping.

The warmup is kept as the share of the run it was: 3000 of the 73,632 steps of 6 epochs over
MNLI's 392,702 training pairs at 32 (4.1%); 3000 steps would be longer than 6 epochs of
IndoNLI's 10,330 training pairs (1,938 steps), which the planner refuses. IndoNLI's longer
premises are cut at 256 tokens as XNLI's were.

    python -m finetune.main --config=configs/indonli_mdeberta.py --workdir=gs://bucket/indonli_mdeberta
    python -m finetune.main --config=configs/indonli_mdeberta.py:cpu_test --workdir=/tmp/indonli_mdeberta_cpu_test
    python -m finetune.main --config=configs/indonli_mdeberta.py --workdir=runs/mdeberta \\
        --config.model.init=/models/mdeberta-v3-base     # a local copy (config.json, weights, spm.model)

:cpu_test: the NLI fixture with the tiny-deberta-v3 preset (DeBERTa-v3's attention at width 64)
from scratch and the recipe's optimizer at the cpu_test learning rate; offline.
"""
from configs import finetune_common

# The model card's 3000 warmup steps over 6 epochs of MNLI (392,702 pairs) at batch 32.
XNLI_WARMUP_RATIO = 3000 / (6 * -(-392_702 // 32))


def get_config(arg=None):
    c = finetune_common.base_config("indonli")
    c.eval_splits = ("validation", "test_lay", "test_expert", "diagnostic")
    c.model.init = "microsoft/mdeberta-v3-base"
    c.optimizer.name = "adamw"
    c.optimizer.lr = 2e-5
    c.optimizer.schedule = "linear"
    c.optimizer.warmup_ratio = XNLI_WARMUP_RATIO
    c.optimizer.b1, c.optimizer.b2, c.optimizer.eps = 0.9, 0.999, 1e-8
    c.optimizer.weight_decay = 0.0
    c.optimizer.grad_clip = 1.0
    c.train.batch_size = 32
    c.train.num_epochs = 6
    c.train.early_stopping_patience = 0
    c.data.max_seq_length = 256
    options = finetune_common.parse_arg(arg)
    if options.pop("cpu_test", False):
        finetune_common.apply_nli_cpu_test(c)
        c.model.preset = "tiny-deberta-v3"
        c.optimizer.warmup_steps = 0  # the recipe's warmup share, not the NLI cpu_test's 10 steps
    if options:
        raise ValueError(f"unknown config variant(s) {sorted(options)} for {__name__}; expected cpu_test")
    return c
