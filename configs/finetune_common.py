"""The start of every recipe: `base_config(task)`, every key a run has with its default (the
defaults, types and ranges are declared in nli_jax.plan, a task's own options beside the task),
which the recipe files then set as their paper says.

Variants shrink only what must shrink for a CPU:  --config=configs/indonli_large.py:cpu_test
"""
import ml_collections

# Variants are read by one helper (configs/recipes.py), re-exported for the config files.
from configs.recipes import UnknownVariantError, parse_arg, refuse_unknown_variants  # noqa: F401
from nli_jax.plan import MESH_RULES, default_config  # noqa: F401  (MESH_RULES: the shipped rules)
from nli_jax.tasks import options_config


def base_config(task: str = "indonli", **options) -> ml_collections.ConfigDict:
    """Every key of a run of `task`, with its default; `options` set over the task's own."""
    return default_config(task, options_config(task, **options))


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
