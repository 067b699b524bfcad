"""ELECTRA's replaced-token detection (Clark et al., ICLR 2020) as a pretraining objective of the
shared loop: the pretraining task's data (segment pairs built from `pretrain.corpus`) and
masking (nli_jax.pretraining.masking), a generator and a discriminator sharing embeddings
(nli_jax.models.electra), and this loss:

    generator MLM loss (mean over the masked tokens)
    + task_options.discriminator_weight (50, the paper's) x the discriminator's binary cross-entropy
      (mean over every real token: was it replaced by the generator's sample?)

Replacements are sampled from the generator's distribution at the masked positions, without a
gradient into the generator; a sample equal to the original token counts as not replaced, as in
the paper. Held-out evaluation reports the generator's MLM accuracy and the discriminator's
accuracy, precision, recall and F1 on replaced tokens (the primary metric is F1).
"""
from __future__ import annotations

import dataclasses

import jax.numpy as jnp
import numpy as np
import optax

from nli_jax.losses import argmax_hits, weighted_accuracy, weighted_cross_entropy
from nli_jax.models import electra
from nli_jax.models.presets import PRESETS
from nli_jax.plan import option
from nli_jax.tasks.base import register
from nli_jax.tasks.pretraining import MaskedLMOptions, Pretraining


@dataclasses.dataclass(frozen=True)
class ElectraOptions(MaskedLMOptions):
    # The generator's width as a fraction of the discriminator's (the paper's: a quarter for small,
    # a third for base), and the weight of the discriminator's loss (the paper's 50).
    generator_fraction: float = option(0.25, low=0.0, high=1.0, low_open=True)
    discriminator_weight: float = option(50.0, low=0.0, low_open=True)


class ElectraPretraining(Pretraining):
    name = "electra"
    primary_metric = "replaced_f1"
    tracked_metrics = ("mlm_accuracy", "rtd_accuracy")  # the generator's MLM, the discriminator's accuracy
    # The generator's MLM and the discriminator's replaced-token detection (over every real token).
    training_scalars = (("mlm_accuracy", "mlm_correct", "mlm_weight"), ("mlm_loss", "mlm_loss_sum", "mlm_weight"),
                        ("rtd_accuracy", "rtd_correct", "rtd_weight"), ("rtd_loss", "rtd_loss_sum", "rtd_weight"))
    continuable_model_types = ("electra",)
    objective = "ELECTRA's replaced-token detection: its generator and discriminator"

    def plan_problems(self, plan):
        model, problems = plan.model, super().plan_problems(plan)
        if not model.init and PRESETS.get(model.preset, {}).get("model_type", "electra") != "electra":
            problems.append(f"--config.model.preset={model.preset!r}: a {PRESETS[model.preset]['model_type']} shape; "
                            f"ELECTRA pretraining builds ELECTRA models (presets "
                            f"{', '.join(sorted(p for p, v in PRESETS.items() if v['model_type'] == 'electra'))})")
        return problems

    def model_class_and_kwargs(self):
        return electra.ForElectraPretraining, {"generator_fraction": self.options.generator_fraction}

    def _originals(self, batch):
        """The unmasked token ids: the masked positions given back their original tokens."""
        rows = jnp.arange(batch["input_ids"].shape[0])[:, None]
        keep = batch["masked_weights"] > 0
        original = batch["input_ids"].at[rows, batch["masked_positions"]].set(
            jnp.where(keep, batch["masked_ids"], batch["input_ids"][rows, batch["masked_positions"]]))
        return original, rows, keep

    def _replaced(self, model, batch, generator_logits):
        """(discriminator input with the generator's samples at the masked positions, the
        originals, which tokens differ from the original)."""
        original, rows, keep = self._originals(batch)
        sampled = electra.sample(model.sample_key(), generator_logits)
        corrupted = original.at[rows, batch["masked_positions"]].set(
            jnp.where(keep, sampled, original[rows, batch["masked_positions"]]))
        replaced = (corrupted != original) & (batch["attention_mask"] > 0)
        return corrupted, replaced

    def loss_normalizers(self, batch):
        return {**super().loss_normalizers(batch),
                "tokens": jnp.sum(batch["attention_mask"] * batch["weight"][:, None])}

    def loss(self, model, batch, deterministic):
        weights = batch["masked_weights"] * batch["weight"][:, None]
        logits = model.masked_lm_logits(batch["input_ids"], batch["attention_mask"], batch["token_type_ids"],
                                        batch["masked_positions"], deterministic=deterministic)
        mlm_sum, mlm_w = weighted_cross_entropy(logits, batch["masked_ids"], weights)
        mlm_correct, _ = weighted_accuracy(logits, batch["masked_ids"], weights)
        corrupted, replaced = self._replaced(model, batch, logits)
        rtd = model.replaced_token_logits(corrupted, batch["attention_mask"], batch["token_type_ids"],
                                          deterministic=deterministic)
        token_weights = batch["attention_mask"].astype(jnp.float32) * batch["weight"][:, None]
        rtd_sum = jnp.sum(optax.sigmoid_binary_cross_entropy(rtd, replaced.astype(jnp.float32)) * token_weights)
        rtd_correct = jnp.sum(((rtd > 0) == replaced) * token_weights)
        examples = jnp.sum(batch["weight"])
        totals = batch.get("loss_normalizers") or {"examples": examples, "masked_tokens": mlm_w,
                                                   "tokens": jnp.sum(token_weights)}
        objective = (mlm_sum / jnp.maximum(totals["masked_tokens"], 1.0)
                     + self.options.discriminator_weight * rtd_sum / jnp.maximum(totals["tokens"], 1.0))
        global_examples = jnp.maximum(totals["examples"], 1.0)
        sums = {"mlm_loss_sum": mlm_sum, "mlm_weight": mlm_w, "mlm_correct": mlm_correct,
                "rtd_loss_sum": rtd_sum, "rtd_weight": jnp.sum(token_weights), "rtd_correct": rtd_correct,
                "replaced": jnp.sum(replaced * token_weights)}
        return objective * global_examples, examples, sums

    def predict(self, model, batch):
        logits = model.masked_lm_logits(batch["input_ids"], batch["attention_mask"], batch["token_type_ids"],
                                        batch["masked_positions"], deterministic=True)
        corrupted, replaced = self._replaced(model, batch, logits)
        said = model.replaced_token_logits(corrupted, batch["attention_mask"], batch["token_type_ids"],
                                           deterministic=True) > 0
        real = batch["attention_mask"] > 0
        hit = argmax_hits(logits, batch["masked_ids"]) * batch["masked_weights"]
        count = lambda x: jnp.sum(x & real, axis=-1).astype(jnp.float32)  # noqa: E731
        return {"mlm_correct": hit.sum(-1), "mlm_count": batch["masked_weights"].sum(-1),
                "rtd_correct": count(said == replaced), "rtd_count": count(jnp.ones_like(real)),
                "true_positives": count(said & replaced), "said_replaced": count(said), "replaced": count(replaced)}

    def report(self, split, examples, predictions):
        total = {k: float(np.sum(v)) for k, v in predictions.items() if k != "idx"}
        precision = total["true_positives"] / max(total["said_replaced"], 1.0)
        recall = total["true_positives"] / max(total["replaced"], 1.0)
        return {"replaced_f1": 2 * precision * recall / max(precision + recall, 1e-12),
                "replaced_precision": precision, "replaced_recall": recall,
                "rtd_accuracy": total["rtd_correct"] / max(total["rtd_count"], 1.0),
                "replaced_share": total["replaced"] / max(total["rtd_count"], 1.0),
                "mlm_accuracy": total["mlm_correct"] / max(total["mlm_count"], 1.0),
                "masked_tokens": int(total["mlm_count"]), "count": len(examples)}


register("electra", options=ElectraOptions)(
    lambda plan: ElectraPretraining(plan.data, plan.pretrain, plan.model, plan.task_options))
