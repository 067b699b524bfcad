"""SpanBERT's span masking (Joshi et al., TACL 2020) as a pretraining objective: masked-LM on
spans of whole words whose lengths follow a geometric distribution, p = 0.2, clipped at 10 words
(mean 3.8 words), 15% of the tokens, each chosen token replaced by [MASK] / itself / a random token
80% / 10% / 10%, and no sentence task (the paper drops NSP). Everything else, the data, loss,
held-out report and export, is the masked-LM objective's (nli_jax.tasks.pretraining).

What it adds is one masking rule (nli_jax.pretraining.masking.MaskingRule): its span-length
distribution. SpanBERT's span-boundary objective (SBO) is not part of this objective.
"""
from __future__ import annotations

import dataclasses

import numpy as np

from nli_jax.plan import option
from nli_jax.pretraining.masking import MaskingRule
from nli_jax.tasks.base import register
from nli_jax.tasks.pretraining import MaskingOptions, Pretraining


@dataclasses.dataclass(frozen=True)
class SpanMaskingOptions(MaskingOptions):
    whole_word: bool = option(True)  # span lengths are counted in whole words, as the paper does
    span_p: float = option(0.2, low=0.0, high=1.0, low_open=True, high_open=True)  # the geometric's p
    max_span: int = option(10, low=1)  # longer draws are clipped (renormalised) to this many words

    def masking_rule(self) -> MaskingRule:
        n = np.arange(1, self.max_span + 1)
        p = self.span_p * (1 - self.span_p) ** (n - 1)
        return MaskingRule(unit="word" if self.whole_word else "token", span_lengths=tuple(float(x) for x in p / p.sum()),
                           mask_prob=self.mask_prob, max_predictions=self.max_predictions,
                           random_token_low=self.random_token_low)


class SpanMasking(Pretraining):
    name = "span_bert"
    objective = "SpanBERT's span masking (masked-LM on geometric spans of whole words)"


register("span_bert", options=SpanMaskingOptions)(
    lambda plan: SpanMasking(plan.data, plan.pretrain, plan.model, plan.task_options))
