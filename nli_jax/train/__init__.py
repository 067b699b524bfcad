"""The training loop shared by pretraining and fine-tuning."""
from nli_jax.train.loop import train_and_evaluate

__all__ = ["train_and_evaluate"]
