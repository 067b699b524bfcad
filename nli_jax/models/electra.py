"""ELECTRA pretraining (Clark et al., ICLR 2020): a small generator, trained with MLM, proposes
replacements for the masked tokens; the discriminator learns to tell every token of the result
as original or replaced. The two share their token, position and type embeddings (the paper's
choice; one Embeddings module held by both). After pretraining the discriminator is the model:
`save_pretrained` writes it as transformers' ElectraForPreTraining (and the generator, as
ElectraForMaskedLM, into a `generator/` subdirectory, so that pretraining can continue).
"""
from __future__ import annotations

import dataclasses
import os

import jax
from flax import nnx

from nli_jax.checkpoints import hf
from nli_jax.checkpoints.hf import CheckpointError
from nli_jax.models.config import EncoderConfig
from nli_jax.models.encoder import make_rngs
from nli_jax.models.models import ForMaskedLM, ForReplacedTokenDetection
from nli_jax.models.pretrained import PretrainedModel

GENERATOR_DIRECTORY = "generator"


def generator_config(discriminator: EncoderConfig, fraction: float) -> EncoderConfig:
    """The generator's shape: the discriminator's depth and embeddings, `fraction` of its width
    (hidden size, attention heads and feed-forward size; ELECTRA-small's generator is a quarter)."""
    heads = max(1, round(discriminator.num_attention_heads * fraction))
    hidden = max(heads, round(discriminator.hidden_size * fraction / heads) * heads)
    return dataclasses.replace(discriminator, hidden_size=hidden, num_attention_heads=heads,
                               intermediate_size=max(1, round(discriminator.intermediate_size * fraction)),
                               embedding_size=discriminator.embed_dim)


class ForElectraPretraining(PretrainedModel):
    """Generator and discriminator with shared embeddings. `sample_key()` draws from the model's
    "dropout" stream, which the train step reseeds every step: sampled replacements, like dropout
    masks, are a function of (seed, step) and a resumed run draws what an uninterrupted one does."""
    hf_suffix = "ForPreTraining"

    def __init__(self, config: EncoderConfig, *, generator_fraction: float, rngs: nnx.Rngs):
        self.config = config
        self.generator_fraction = generator_fraction
        self.discriminator = ForReplacedTokenDetection(config, rngs=rngs)
        self.generator = ForMaskedLM(generator_config(config, generator_fraction), sentence_head=False, rngs=rngs)
        self.generator.encoder.embeddings = self.discriminator.encoder.embeddings  # one module, two users
        self.rngs = rngs

    def head_arguments(self):
        return {"generator_fraction": self.generator_fraction}

    def sample_key(self):
        return self.rngs.dropout()

    @classmethod
    def from_pretrained(cls, path: str, *, generator_fraction: float, dtype=None, remat=None, scan_layers=None,
                        seed: int = 0, strict: bool = True, config_overrides=None, **_):
        """The discriminator from `path` (an ELECTRA directory), the generator from
        `path`/generator when there is one (its vocabulary must be the discriminator's), else new."""
        kwargs = dict(dtype=dtype, remat=remat, scan_layers=scan_layers, seed=seed, strict=strict,
                      config_overrides=config_overrides)
        discriminator = ForReplacedTokenDetection.from_pretrained(path, **kwargs)
        model = cls(discriminator.config, generator_fraction=generator_fraction, rngs=make_rngs(seed))
        nnx.update(model.discriminator, nnx.state(discriminator))
        directory = hf.resolve_directory(path)
        generator_dir = os.path.join(directory, GENERATOR_DIRECTORY)
        if os.path.isdir(generator_dir):
            generator_vocab = hf.read_config(generator_dir).get("vocab_size")
            if generator_vocab != discriminator.config.vocab_size:  # before any weights are read
                raise CheckpointError(f"{generator_dir}: the generator's vocabulary ({generator_vocab}) is not the "
                                      f"discriminator's ({discriminator.config.vocab_size}, {directory}): they share "
                                      "their embeddings")
            model.generator = ForMaskedLM.from_pretrained(generator_dir, **kwargs)
            model.generator.encoder.embeddings = model.discriminator.encoder.embeddings
        return model

    def save_pretrained(self, path: str, *, tokenizer=None, label_names=None, extra=None) -> None:
        """The discriminator (ElectraForPreTraining, what fine-tuning starts from) and, under
        generator/, the generator (ElectraForMaskedLM)."""
        self.discriminator.save_pretrained(path, tokenizer=tokenizer, extra=dict(extra or {}, generator_fraction=
                                                                                 self.generator_fraction))
        self.generator.save_pretrained(os.path.join(path, GENERATOR_DIRECTORY), tokenizer=tokenizer)

    def replaced_token_logits(self, input_ids, attention_mask, token_type_ids, *, deterministic: bool):
        return self.discriminator(input_ids, attention_mask, token_type_ids, deterministic=deterministic)

    def masked_lm_logits(self, input_ids, attention_mask, token_type_ids, masked_positions, *, deterministic: bool):
        return self.generator(input_ids, attention_mask, token_type_ids, masked_positions=masked_positions,
                              deterministic=deterministic)["mlm_logits"]


def sample(key, logits):
    """A token per masked position from the generator's distribution (no gradient flows back)."""
    return jax.random.categorical(key, jax.lax.stop_gradient(logits).astype("float32"), axis=-1)
