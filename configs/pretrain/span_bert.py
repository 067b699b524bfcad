"""SpanBERT-style span masking on the IndoBERT-base recipe (configs/pretrain/common.py): the same
corpus, phases, optimizer and schedule, with whole-word spans of geometric length (p 0.2, at most
10 words, mean 3.8) instead of BERT's single tokens, and no sentence task (nli_jax/tasks/span_bert.py).

    python -m pretrain.main --config=configs/pretrain/span_bert.py:phase=1 --workdir=runs/span_p1 \
        --config.model.tokenizer=VOCAB_DIR --config.pretrain.corpus="('/data/corpus/*.txt',)"
    python -m pretrain.main --config=configs/pretrain/span_bert.py:cpu_test --workdir=/tmp/span_bert
"""
from configs.pretrain.common import pretrain_config
from nli_jax.tasks import options_config


def get_config(arg=None):
    c = pretrain_config("indobert-base", arg)
    c.task = "span_bert"
    c.task_options = options_config("span_bert", max_predictions=c.task_options.max_predictions)
    c.pretrain.sentence_task = "none"  # the paper drops next-sentence prediction
    return c
