"""Fields every config has, fine-tuning and pretraining, with their defaults: the only place
defaults live (nli_jax.train.planner turns a config into a typed plan and refuses one that lacks
a field). Task configs override what their recipe says.

Variants shrink only what must shrink for a CPU:  --config=configs/indonli_large.py:cpu_test
"""
import ml_collections

# Logical axis names of parameters and activations -> mesh axes (nli_jax.train.mesh), MaxText-style.
MESH_RULES = (
    ("batch", ("data", "fsdp")),
    ("vocab", "tensor"),
    ("embed", "fsdp"),
    ("hidden", None),
    ("heads", "tensor"),
    ("kv", None),
    ("mlp", "tensor"),
    ("position", None),
    ("token_type", None),
    ("labels", None),
    ("layers", None),  # the leading axis of scanned layers' parameters (model.scan_layers): never sharded
)


def base_config() -> ml_collections.ConfigDict:
    c = ml_collections.ConfigDict()
    c.task = "indonli"
    c.eval_splits = ("validation",)
    c.seeds = ()  # e.g. (1, 2, 3): one run per seed in <workdir>/seed_N, mean ± std in results.json
    # The best parameters as a Hugging Face directory (<workdir>/export_best, label names in
    # id2label); also later with `python -m finetune.export`.
    c.export_best = False
    c.export_final = False  # the final parameters as a Hugging Face directory (<workdir>/export): pretraining

    c.data = ml_collections.ConfigDict()
    c.data.source = ""  # local directory with the official files; empty = download them
    c.data.tfds_dir = "~/tensorflow_datasets/nli_jax"  # where the array_record copies are written
    c.data.max_seq_length = 128
    c.data.buckets = (32, 64, 128, 256, 512)  # pad each batch to the smallest bucket that fits
    c.data.pad_to_max_length = False  # True on TPU: one compiled shape
    # Training batches of sequence-level tasks put several examples in one row, each attending
    # to itself only (no padding computed): same loss, a third fewer tokens on IndoNLI at 128.
    c.data.packing = True
    # Packed training steps take few shapes: a shape is compiled only when it saves more tokens
    # (rows x length, over the run) than this (pipeline.plan_packed_shapes). 8192: about what
    # one compilation of a 12-layer, 384-wide encoder's train step costs on a 2-core CPU, in
    # tokens of its training (7-10 s at 1.2 ms a token). 0: each batch its own shape.
    c.data.compile_cost_tokens = 8192
    c.data.hypothesis_only = False
    c.data.word_alignment = "average"  # word-level tasks: "average" of sub-tokens or "first" sub-token
    c.data.train_size = ""  # OCNLI: 50k / 30k / 10k / 3k
    c.data.holdout_topic = ""  # InferES: topic out-of-distribution
    c.data.validation_fraction = 0.1  # InferES: validation carved from train
    c.data.validation_seed = 0  # InferES: which examples the validation split takes
    c.data.translate_train_source = ""  # IndoNLI translate-train: extracted translate_train_small folder
    c.data.mix_indonli_train = False
    c.data.max_train_examples = 0  # > 0: train on the first N examples ("train" in eval_splits evaluates them)
    # A file naming training examples by id (one per line, or JSON lines with "id": the subsets
    # `python -m nli_jax.analysis cartography` writes): train on those only.
    c.data.train_subset = ""
    c.data.allow_one_label = False  # a training split whose examples all carry one label is refused unless True
    c.data.workers = 0  # grain worker processes

    c.model = ml_collections.ConfigDict()
    c.model.init = ""  # HF directory or hub id; empty = from scratch with `preset`
    c.model.preset = "indobert-base"
    c.model.tokenizer = ""  # default: the init directory
    c.model.dtype = "float32"
    # What each layer keeps for its backward pass: "none" (no rematerialisation), "full" (recompute
    # the layer), "dots_saveable", "dots_with_no_batch_dims_saveable" (nli_jax.plan.REMAT_POLICIES).
    # Any type: older configs' True / False (= "full" / "none") still assign and resume.
    c.model.remat = ml_collections.FieldReference("none", field_type=object)
    # One scanned layer over stacked parameters (compiles in seconds at 24 layers on TPU); ALBERT
    # keeps its loop. Parameters, checkpoints and optimizer state then have a leading layers axis:
    # a run resumes with the setting it started with (Hugging Face exports are the same either way).
    c.model.scan_layers = False
    # The attention kernel: "auto" (the Pallas splash kernel on a TPU without attention dropout,
    # XLA's plain attention otherwise), "plain" or "splash" (nli_jax.models.attention).
    c.model.attention = "auto"
    c.model.vocab_multiple = 1  # a from-scratch model's vocabulary rounded up to a multiple of this
    # "bfloat16": the train step computes with a bfloat16 copy of the parameters (float32 master weights)
    c.model.step_param_dtype = "float32"
    # EncoderConfig fields to override (None = the checkpoint's / preset's value).
    c.model.overrides = ml_collections.ConfigDict()
    c.model.overrides.hidden_dropout_prob = ml_collections.config_dict.placeholder(float)
    c.model.overrides.attention_probs_dropout_prob = ml_collections.config_dict.placeholder(float)
    c.model.overrides.classifier_dropout = ml_collections.config_dict.placeholder(float)

    c.optimizer = ml_collections.ConfigDict()
    c.optimizer.name = "adam"
    c.optimizer.lr = 1e-5
    c.optimizer.schedule = "constant"
    c.optimizer.warmup_steps = 0
    c.optimizer.warmup_ratio = 0.0
    c.optimizer.decay_rate = 0.9  # exponential_per_epoch: lr x decay_rate ** epoch
    c.optimizer.end_lr = 0.0  # polynomial: the rate it decays to
    c.optimizer.power = 1.0  # polynomial: the decay's power
    c.optimizer.b1 = 0.9
    c.optimizer.b2 = 0.999
    c.optimizer.eps = 1e-8
    c.optimizer.weight_decay = 0.0
    c.optimizer.grad_clip = 1.0

    c.train = ml_collections.ConfigDict()
    c.train.seed = 42
    c.train.batch_size = 16
    c.train.eval_batch_size = 64  # global, like batch_size: each process evaluates its share
    c.train.accumulation_steps = 1
    c.train.num_epochs = 10
    c.train.max_steps = 0  # > 0 caps the run
    c.train.log_every_steps = 50
    c.train.eval_every_steps = 0  # 0 = once per epoch
    c.train.checkpoint_every_steps = 0  # 0 = at every evaluation
    c.train.keep_checkpoints = 2
    c.train.async_checkpointing = True
    c.train.early_stopping_patience = 3  # evaluations without improvement; 0 = off
    c.train.peak_tflops_per_device = 0.0  # e.g. 123 for TPU v3 bf16: enables MFU in the log
    # Training dynamics (dataset cartography): every training example's gold-label probability and
    # correctness each epoch, from the training step itself, in <workdir>/dynamics/.
    c.train.record_dynamics = False
    c.train.dynamics_every_steps = 0  # > 0: instead, the whole training split every N steps (one-epoch runs)
    # Calibration: ECE, MCE, Brier and NLL per split, a temperature fitted on validation (NLL),
    # reliability diagrams; calibrated probabilities next to the raw ones.
    c.train.calibration = True

    c.mesh = ml_collections.ConfigDict()
    c.mesh.shape = {"data": -1, "fsdp": 1, "tensor": 1}
    c.mesh.rules = MESH_RULES
    return c


def parse_arg(arg: str | None) -> dict:
    """'cpu_test' or 'lr=3e-5,model=base' -> {'cpu_test': True} / {'lr': '3e-5', 'model': 'base'}."""
    out = {}
    for part in (arg or "").split(","):
        part = part.strip()
        if not part:
            continue
        key, _, value = part.partition("=")
        out[key] = value if value else True
    return out


def apply_cpu_test(c: ml_collections.ConfigDict, *, preset: str = "tiny-bert") -> None:
    """What every cpu_test variant shares (fine-tuning and pretraining): a tiny from-scratch
    model with the tokenizer shipped in the package, short sequences, float32, synchronous
    checkpoints, no early stopping. Each variant then sets its data and run length."""
    from nli_jax.data import fixture_path
    c.model.init = ""
    c.model.preset = preset
    c.model.tokenizer = fixture_path("tiny_wordpiece")
    c.model.dtype = "float32"
    c.data.tfds_dir = "/tmp/nli_jax_tfds"
    c.data.max_seq_length = 64
    c.train.early_stopping_patience = 0
    c.train.async_checkpointing = False


def apply_nli_cpu_test(c: ml_collections.ConfigDict) -> None:
    """The NLI configs' cpu_test: the tiny model on the NLI fixture shipped in the package; offline."""
    from nli_jax.data import fixture_path
    apply_cpu_test(c)
    c.data.source = fixture_path("nli_tiny")
    c.optimizer.lr = 1e-3
    c.optimizer.warmup_steps = 10
    c.train.batch_size = 16
    c.train.num_epochs = 6
    c.train.log_every_steps = 10
