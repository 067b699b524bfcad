"""SpanBERT-style span masking on the IndoBERT-base recipe (configs/pretrain/common.py): the same
corpus, phases, optimizer and schedule, with whole-word spans of geometric length (p 0.2, at most
10 words, mean 3.8) instead of BERT's single tokens, and no sentence task (nli_jax/tasks/span_bert.py).

    python -m pretrain.main --config=configs/pretrain/span_bert.py:phase=1 --workdir=runs/span_p1 \
        --config.model.tokenizer=VOCAB_DIR --config.pretrain.corpus="('/data/corpus/*.txt',)"
    python -m pretrain.main --config=configs/pretrain/span_bert.py:cpu_test --workdir=/tmp/span_bert
"""
from configs import recipes
from configs.pretrain import indobert_base

# The objective changes (its options keep the parent's masking budget); the paper drops
# next-sentence prediction.
get_config = recipes.derive(indobert_base, {"task": "span_bert", "pretrain.sentence_task": "none"},
                            name="configs/pretrain/span_bert.py")
