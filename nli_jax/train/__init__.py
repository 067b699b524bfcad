"""The training loop shared by pretraining and fine-tuning (nli_jax.train.loop.train_and_evaluate) and what it is made of."""
