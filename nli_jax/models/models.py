"""Task models: the encoder of the config's family (nli_jax.models.families) plus a head. Each
maps to Hugging Face PyTorch classes for I/O.

    model = ForSequenceClassification.from_pretrained("path/to/indobert-large-p2", num_labels=3)
    logits = model(input_ids, attention_mask, token_type_ids, deterministic=True)
    model.save_pretrained("out/")   # loads in transformers' BertForSequenceClassification
"""
from __future__ import annotations

from flax import nnx

from nli_jax.checkpoints.hf import CheckpointError
from nli_jax.models import families
from nli_jax.models.config import EncoderConfig
from nli_jax.models.encoder import first_tokens
from nli_jax.models.heads import (MaskedLMHead, MultiAspectHead, ReplacedTokenHead, SentenceHead,
                                  SequenceClassificationHead, TokenClassificationHead)
from nli_jax.models.pretrained import PretrainedModel


def family_encoder(config: EncoderConfig, *, add_pooler: bool, rngs: nnx.Rngs) -> nnx.Module:
    """The encoder of config's family."""
    return families.get(config.model_type).encoder(config, add_pooler=add_pooler, rngs=rngs)


def family_head(role: str, default, config: EncoderConfig, *args, **kwargs) -> nnx.Module:
    """The head for `role` of config's family (its `heads`), else `default`."""
    return families.get(config.model_type).heads.get(role, default)(config, *args, **kwargs)


class EncoderModel(PretrainedModel):
    hf_base_model = True

    def __init__(self, config: EncoderConfig, *, add_pooler: bool | None = None, rngs: nnx.Rngs):
        """add_pooler: None = as the family's base model has one (ELECTRA's has none)."""
        self.config = config
        if add_pooler is None:
            add_pooler = families.get(config.model_type).base_pooler
        self.encoder = family_encoder(config, add_pooler=add_pooler, rngs=rngs)

    def head_arguments(self):
        return {"add_pooler": self.encoder.pooler is not None}

    def __call__(self, input_ids, attention_mask=None, token_type_ids=None, *, deterministic: bool = True):
        hidden, pooled = self.encoder(input_ids, attention_mask, token_type_ids, deterministic=deterministic)
        return {"hidden_states": hidden, "pooled": pooled}


class ForMaskedLM(PretrainedModel):
    """MLM head, plus the NSP (BERT) / SOP (ALBERT) head when `sentence_head` (pretraining).

    `masked_positions` [batch, predictions]: compute MLM logits only there.
    """

    def hf_architecture(self, suffix: str | None = None) -> str:
        if self.sentence is None:
            return super().hf_architecture("ForMaskedLM")
        if not families.get(self.config.model_type).sentence_head:
            raise CheckpointError("transformers has no RoBERTa/XLM-R class with a sentence head")
        return super().hf_architecture("ForPreTraining")

    def __init__(self, config: EncoderConfig, *, sentence_head: bool = False, rngs: nnx.Rngs):
        self.config = config
        self.encoder = family_encoder(config, add_pooler=sentence_head, rngs=rngs)
        self.mlm = family_head("masked_lm", MaskedLMHead, config, rngs=rngs)
        self.sentence = SentenceHead(config, rngs=rngs) if sentence_head else None

    def head_arguments(self):
        return {"sentence_head": self.sentence is not None}

    def __call__(self, input_ids, attention_mask=None, token_type_ids=None, *, masked_positions=None,
                 deterministic: bool = True):
        hidden, pooled = self.encoder(input_ids, attention_mask, token_type_ids, deterministic=deterministic)
        out = {"mlm_logits": self.mlm(hidden, self.encoder.embeddings.word.embedding[...], masked_positions)}
        if self.sentence is not None:
            out["sentence_logits"] = self.sentence(pooled)
        return out


class ForSequenceClassification(PretrainedModel):
    hf_suffix = "ForSequenceClassification"
    hf_id2label = True
    hf_roberta_classifier = True

    def __init__(self, config: EncoderConfig, *, num_labels: int, rngs: nnx.Rngs):
        self.config = config
        self.num_labels = num_labels
        # RoBERTa's and ELECTRA's classification heads have their own dense layer instead of the pooler.
        self.encoder = family_encoder(config, add_pooler=config.has_pooler, rngs=rngs)
        self.classifier = family_head("sequence", SequenceClassificationHead, config, num_labels, rngs=rngs)

    def head_arguments(self):
        return {"num_labels": self.num_labels}

    def __call__(self, input_ids, attention_mask=None, token_type_ids=None, *, deterministic: bool = True,
                 packing=None):
        """packing: several examples per row (nli_jax.data.pipeline.Batching.pack); logits per example."""
        hidden, pooled = self.encoder(input_ids, attention_mask, token_type_ids, deterministic=deterministic,
                                      packing=packing)
        return self.classifier(first_tokens(hidden, packing), pooled, deterministic=deterministic)


class ForTokenClassification(PretrainedModel):
    """Logits for every sub-word token; word-level alignment is the task's encoding's job."""
    hf_suffix = "ForTokenClassification"
    hf_id2label = True

    def __init__(self, config: EncoderConfig, *, num_labels: int, rngs: nnx.Rngs):
        self.config = config
        self.num_labels = num_labels
        self.encoder = family_encoder(config, add_pooler=False, rngs=rngs)
        self.classifier = family_head("token", TokenClassificationHead, config, num_labels, rngs=rngs)

    def head_arguments(self):
        return {"num_labels": self.num_labels}

    def __call__(self, input_ids, attention_mask=None, token_type_ids=None, *, deterministic: bool = True,
                 packing=None):
        """packing: several examples per row (nli_jax.data.pipeline.Batching.pack); logits stay
        per row and token (models.encoder.example_tokens reads an example's)."""
        hidden, _ = self.encoder(input_ids, attention_mask, token_type_ids, deterministic=deterministic,
                                 packing=packing)
        return self.classifier(hidden, deterministic=deterministic)


class ForMultiAspectClassification(PretrainedModel):
    """[batch, aspects, labels] logits: one softmax per aspect (CASA, HoASA).

    No transformers class has per-aspect heads: the encoder loads as the base model (BertModel)
    and the aspect classifier travels as extra weights nli-jax reads back."""
    hf_saved_head_arguments = ("num_aspects", "num_labels")

    def __init__(self, config: EncoderConfig, *, num_aspects: int, num_labels: int, rngs: nnx.Rngs):
        self.config = config
        self.num_aspects, self.num_labels = num_aspects, num_labels
        self.encoder = family_encoder(config, add_pooler=True, rngs=rngs)
        self.classifier = family_head("multi_aspect", MultiAspectHead, config, num_aspects, num_labels, rngs=rngs)

    def head_arguments(self):
        return {"num_aspects": self.num_aspects, "num_labels": self.num_labels}

    def __call__(self, input_ids, attention_mask=None, token_type_ids=None, *, deterministic: bool = True,
                 packing=None):
        _, pooled = self.encoder(input_ids, attention_mask, token_type_ids, deterministic=deterministic,
                                 packing=packing)
        return self.classifier(pooled, deterministic=deterministic)


class ForReplacedTokenDetection(PretrainedModel):
    """ELECTRA's discriminator: one logit per token, "was it replaced by the generator?"
    (transformers' ElectraForPreTraining, which is what an ELECTRA export is)."""
    hf_suffix = "ForPreTraining"

    def __init__(self, config: EncoderConfig, *, rngs: nnx.Rngs):
        self.config = config
        self.encoder = family_encoder(config, add_pooler=False, rngs=rngs)
        self.discriminator = ReplacedTokenHead(config, rngs=rngs)

    def __call__(self, input_ids, attention_mask=None, token_type_ids=None, *, deterministic: bool = True):
        hidden, _ = self.encoder(input_ids, attention_mask, token_type_ids, deterministic=deterministic)
        return self.discriminator(hidden)
