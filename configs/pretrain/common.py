"""Pretraining recipes of the IndoNLU paper (section 4.2, Table 4): two phases, sequence length
128 then 512; phase 2 starts from phase 1's final parameters (not its optimizer state).

BERT models (IndoBERT base/large): MLM + NSP, token masking, AdamW (decay 0.01, not on
LayerNorm and biases), linear warmup then linear decay. ALBERT models (IndoBERT-lite): MLM + SOP,
whole-word n-gram masking (n <= 3, p ∝ 1/n), LAMB. At most 20 predictions per sequence at 128,
scaled with the length at 512 (80).

`continue` (continued, language- or domain-adaptive pretraining, as DAPT/TAPT adapt a released
model): the same objective and optimizer on a new corpus, starting from --config.model.init=DIR,
any Hugging Face BERT or ALBERT checkpoint. The model keeps that checkpoint's tokenizer,
vocabulary and shape (its config.json, not the preset's); its MLM head is loaded when it has one
and initialised as BERT does (tied decoder) when not; the optimizer and its warmup start fresh.
Steps: a tenth of the phase's, warmup 6% of them (set train.max_steps for your corpus).
"""
import ml_collections

from configs import finetune_common, recipes
from nli_jax.plan import PretrainPlan, section_defaults

PHASES = {
    # model: {phase: (batch, lr, steps, hours on a TPUv3-8)}
    "indobert-lite-base": {1: (4096, 0.00176, 112_500, 38), 2: (1024, 0.00088, 50_000, 23)},
    "indobert-base": {1: (256, 0.00002, 1_000_000, 35), 2: (256, 0.00002, 68_000, 9)},
    "indobert-lite-large": {1: (1024, 0.00044, 500_000, 134), 2: (256, 0.00044, 129_000, 45)},
    "indobert-large": {1: (256, 0.0001, 1_000_000, 89), 2: (128, 0.00008, 120_000, 32)},
    # ELECTRA (Clark et al., 2020, Table 6): small 128 x 1M steps at lr 5e-4, base 256 x 766k at
    # 2e-4, both at length 128 in the paper; phase 2 here continues at 512 for a tenth of those
    # steps, as the BERT recipes do. Hours: not measured on TPU for these shapes.
    "electra-small": {1: (128, 0.0005, 1_000_000, None), 2: (128, 0.0005, 100_000, None)},
    "electra-base": {1: (256, 0.0002, 766_000, None), 2: (256, 0.0002, 76_600, None)},
}
# How each recipe fits the paper's TPU v3-8 (8 cores of 16 GiB, 15.48 usable) at its batch and
# length, as the TPU compiler judges it (python -m launch.compile --config=...:phase=N
# --topology=v3-8; docs/tpu_compile.md): micro-batches (accumulation, no recompute) where the
# activations of the paper's per-core batch exceed a core, the choice with the least recompute.
# Unlisted recipes fit as they are.
V3_8_ACCUMULATION = {
    ("indobert-large", 2): 2,  # 16 x 512 per core needs 17.7 GiB
    ("indobert-lite-base", 1): 2,  # 512 x 128 per core needs 20.7 GiB
    ("indobert-lite-base", 2): 4,  # 128 x 512 per core needs 34.1 GiB
    ("indobert-lite-large", 2): 2,  # 32 x 512 per core needs 22.9 GiB
}
# The task each model pretrains with: ELECTRA's replaced-token detection, else MLM (+ NSP / SOP).
TASKS = {"electra-small": "electra", "electra-base": "electra"}
MAX_SEQ_LENGTH = {1: 128, 2: 512}
MAX_PREDICTIONS = {1: 20, 2: 80}


# The recipe every pretraining config starts from (over base_config's defaults): the IndoNLU paper's
# BERT phase 1; each model's batch, rate and steps are its PHASES row.
BERT = {
    "eval_splits": ("heldout",), "export_final": True,
    "data.max_seq_length": MAX_SEQ_LENGTH[1], "data.pad_to_max_length": True,
    "model.init": "",  # phase 2: the phase-1 run's <workdir>/export
    "model.tokenizer": "",  # directory with vocab.txt (pretrain.build_vocab)
    "model.dtype": "bfloat16",  # on accelerators; the cpu_test variant computes in float32
    "pretrain.phase": 1, "pretrain.sentence_task": "nsp",
    "optimizer.name": "adamw", "optimizer.weight_decay": 0.01, "optimizer.eps": 1e-6, "optimizer.schedule": "linear",
    "optimizer.grad_clip": 1.0,
    "train.num_epochs": 100_000,  # bounded by max_steps
    "train.eval_every_steps": 10_000, "train.checkpoint_every_steps": 5_000, "train.log_every_steps": 100,
    "train.early_stopping_patience": 0, "train.eval_batch_size": 256,
}
# What each family's recipe changes: ALBERT whole-word n-gram masking, sentence order and LAMB;
# ELECTRA no sentence task (the papers').
FAMILIES = {
    "bert": {},
    "albert": {"task_options.whole_word": True, "task_options.max_ngram": 3, "pretrain.sentence_task": "sop",
               "optimizer.name": "lamb"},
    "electra": {"pretrain.sentence_task": "none"},
}
WARMUP_CAP = {"bert": 10_000, "albert": 3_125, "electra": 10_000}  # warmup: a tenth of the steps, at most this
PHASE_2 = {"pretrain.phase": 2, "data.max_seq_length": MAX_SEQ_LENGTH[2],
           "task_options.max_predictions": MAX_PREDICTIONS[2]}
# `continue`: a tenth of the phase's steps, warmup 6% of them.
CONTINUE = {"pretrain.continued": True, "train.max_steps": lambda c: max(1, c.train.max_steps // 10),
            "optimizer.warmup_steps": lambda c: max(1, c.train.max_steps * 6 // 100)}
# `cpu_test`: the fixture corpus, a tiny model (continued: the checkpoint's own), 300 steps.
CPU_TEST = {
    "pretrain.heldout_examples": 200, "pretrain.heldout_permille": 100, "pretrain.workers": 1,
    "data.max_seq_length": lambda c: 64 if c.pretrain.phase == 1 else 128,
    "task_options.max_predictions": lambda c: 10 if c.pretrain.phase == 1 else 20,
    "train.batch_size": 16, "train.accumulation_steps": 1, "train.max_steps": 300, "train.eval_every_steps": 100,
    "train.checkpoint_every_steps": 100, "train.log_every_steps": 50, "train.eval_batch_size": 64,
    "train.async_checkpointing": False, "optimizer.warmup_steps": 15,
}
CPU_TEST_FAMILY = {  # (tiny preset, learning rate (LAMB scales steps by the weight norm), with `continue`)
    "bert": ("tiny-bert", 2e-3, 1e-4), "albert": ("tiny-albert", 2e-2, 1e-3), "electra": ("tiny-electra", 2e-3, 1e-4)}
# `continue,cpu_test`: a real checkpoint (MiniLM-L6 in the tests), a few small steps.
CPU_TEST_CONTINUE = {"model.dtype": "float32", "train.batch_size": 8, "train.max_steps": 20,
                     "train.eval_every_steps": 10, "train.checkpoint_every_steps": 10, "train.log_every_steps": 5,
                     "optimizer.warmup_steps": 4}


def family(model: str) -> str:
    return "albert" if model.startswith("indobert-lite") else "electra" if TASKS.get(model) == "electra" else "bert"


def pretrain_config(model: str, arg) -> ml_collections.ConfigDict:
    """Model `model`'s recipe: BERT's, its family's changes, its PHASES row, then the variants."""
    options = recipes.parse_arg(arg)
    phase = int(options.pop("phase", 1))
    cpu_test, continued, cpu_learn = (bool(options.pop(v, False)) for v in ("cpu_test", "continue", "cpu_learn"))
    recipes.refuse_unknown_variants(options, ("phase=1|2", "cpu_test", "cpu_learn", "continue"))
    if phase not in (1, 2):
        raise ValueError(f"phase must be 1 or 2, got {phase}")
    kind = family(model)
    if cpu_learn and (phase != 1 or kind == "albert" or cpu_test or continued):
        raise ValueError("cpu_learn is a phase-1 recipe from scratch for BERT and ELECTRA (not with phase=2, "
                         "ALBERT, cpu_test or continue)")
    batch, lr, steps, _ = PHASES[model][phase]
    c = finetune_common.base_config(TASKS.get(model, "pretraining"))
    c.pretrain = ml_collections.ConfigDict(section_defaults(PretrainPlan))
    recipes.apply(c, {**BERT, **FAMILIES[kind], **(PHASE_2 if phase == 2 else {})}, model)
    recipes.apply(c, {"model.preset": model, "optimizer.lr": lr, "optimizer.warmup_steps": min(WARMUP_CAP[kind], steps // 10),
                      "train.batch_size": batch, "train.accumulation_steps": V3_8_ACCUMULATION.get((model, phase), 1),
                      "train.max_steps": steps}, model)
    if kind == "electra":  # the generator a quarter (small) or a third (base) of the discriminator's width
        c.task_options.generator_fraction = 1 / 3 if model == "electra-base" else 0.25
    if continued:
        recipes.apply(c, CONTINUE, f"{model}:continue")
    if cpu_learn:
        apply_cpu_learn(c, electra=kind == "electra")
    if cpu_test:
        from nli_jax.data import fixture_path
        preset, rate, continued_rate = CPU_TEST_FAMILY[kind]
        if not continued:
            finetune_common.apply_cpu_test(c, preset=preset)
            if kind == "electra":
                c.task_options.generator_fraction = 0.5
        recipes.apply(c, {**CPU_TEST, "pretrain.corpus": (fixture_path("corpus_tiny") + "/*.txt",),
                          "optimizer.lr": rate}, f"{model}:cpu_test")
        if continued:
            recipes.apply(c, {**CPU_TEST_CONTINUE, "optimizer.lr": continued_rate}, f"{model}:continue,cpu_test")
    return c


def apply_cpu_learn(c: ml_collections.ConfigDict, electra: bool = False) -> None:
    """A from-scratch MLM recipe that leaves BERT's unigram plateau on a 2-core CPU: 2 layers x 128
    (2 heads), 32-token segments, no sentence task, batch 64, AdamW 1e-3 after 1,000 warmup steps,
    beta2 0.98, constant. Found by benchmarks/experiments/pretrain_recipe_search.py on id_corpus_sample with a
    2,000-piece WordPiece vocabulary: accuracy at [MASK] inputs 1.25x the best constant at step
    3,000, 6.5x at 4,000, 14.3x at 10,000 (held-out MLM accuracy 13% -> 25% -> 42%;
    docs/pretraining_id_corpus_sample.md); rates of 2e-4 to 5e-4 with 100 warmup steps stay
    on the plateau for the 2,000 steps measured. Needs --config.model.tokenizer (pretrain.build_vocab
    --vocab_size=2000) and --config.pretrain.corpus or examples_dir. With `electra`
    (configs/pretrain/electra_small.py:cpu_learn): ELECTRA-small's shape on the same data and schedule."""
    c.model.dtype = "float32"
    c.model.overrides.update(hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0, max_position_embeddings=128)
    if electra:
        # ELECTRA-small's own shape (12 x 256, 128-wide embeddings, a generator a quarter as wide) on the
        # same data and schedule at the paper's small-model rate (5e-4): issue 27's comparison with the
        # BERT below at the same wall time (benchmarks/experiments/electra_vs_bert.py).
        c.model.preset = "electra-small"
    else:
        c.model.preset = "scratch-2layer-small"
        c.model.overrides.update(hidden_size=128, intermediate_size=512, num_attention_heads=2, num_hidden_layers=2)
    c.pretrain.sentence_task = "none"
    c.task_options.max_predictions = 5  # 15% of 32
    c.pretrain.heldout_examples = 1000
    c.data.max_seq_length = 32
    c.train.update(batch_size=64, accumulation_steps=1, max_steps=10_000, eval_every_steps=1000, checkpoint_every_steps=1000,
                   log_every_steps=100, eval_batch_size=256)
    c.optimizer.update(name="adamw", lr=5e-4 if electra else 1e-3, warmup_steps=1000, schedule="constant", b2=0.98,
                       eps=1e-6, weight_decay=0.01, grad_clip=1.0)
