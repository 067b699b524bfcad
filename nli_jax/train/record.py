"""The training loop's record: what it decided so far (best step and metric, early stopping, the
validation history), the tokens its steps computed on, the budget's fixed total, and at the end its
step counts. Typed and frozen: the loop replaces it (`after_validation`, `with_tokens`, ...), never
changes it; every checkpoint saves it as JSON beside the train state (`to_json`) and a resumed run
reads it back (`from_json`, which also reads the dict an older nli-jax saved: the same keys).
"""
from __future__ import annotations

import dataclasses
from typing import Any


@dataclasses.dataclass(frozen=True)
class BudgetRecord:
    """train.budget_minutes' total, fixed when the run started (nli_jax.train.budget)."""
    minutes: float
    seconds_per_step: float
    total_steps: int
    cap: int  # the plan's total (max_steps / num_epochs) the budget's total stays under


@dataclasses.dataclass(frozen=True)
class LoopRecord:
    best_metric: float | None = None
    best_step: int | None = None
    evals_without_improvement: int = 0
    stopped_early: bool = False
    history: tuple[dict[str, Any], ...] = ()  # each validation: step, epoch, the split's tracked metrics
    train_tokens: dict[str, int] | None = None  # {"computed", "real"}: this process's, over the whole run
    budget: BudgetRecord | None = None
    steps: int | None = None  # at the end: the steps run and the total (set by `finished`)
    total_steps: int | None = None
    milestones: tuple[tuple[str, int], ...] = ()  # at the end: (name, step) of the schedule's exported milestones

    def after_validation(self, step: int, entry: dict, metric: float, *, selects: bool, patience: int) -> "LoopRecord":
        """The record after a validation at `step` (`entry` its history row): a better metric (or,
        when the run does not select, any) is the best step; `patience` evaluations without one stop it."""
        history = (*self.history, entry)
        if self.best_metric is None or metric > self.best_metric or not selects:
            return dataclasses.replace(self, history=history, best_metric=metric, best_step=step,
                                       evals_without_improvement=0)
        waited = self.evals_without_improvement + 1
        return dataclasses.replace(self, history=history, evals_without_improvement=waited,
                                   stopped_early=bool(patience) and waited >= patience)

    def with_tokens(self, totals: dict[str, int]) -> "LoopRecord":
        return dataclasses.replace(self, train_tokens=dict(totals))

    def with_budget(self, budget: BudgetRecord) -> "LoopRecord":
        return dataclasses.replace(self, budget=budget)

    def finished(self, steps: int, total_steps: int, train_tokens: dict[str, int],
                 milestones: dict[str, int] | None = None) -> "LoopRecord":
        return dataclasses.replace(self, steps=steps, total_steps=total_steps, train_tokens=dict(train_tokens),
                                   milestones=tuple(sorted((milestones or {}).items(), key=lambda kv: kv[1])))

    def to_json(self) -> dict:
        out = dataclasses.asdict(self)
        out["history"] = list(out["history"])
        out["milestones"] = [list(m) for m in out["milestones"]]
        for key in ("budget", "train_tokens", "steps", "total_steps"):  # absent rather than null, as before
            if out[key] is None:
                out.pop(key)
        if not out["milestones"]:
            out.pop("milestones")
        return out

    @classmethod
    def from_json(cls, saved) -> "LoopRecord":
        """A checkpoint's record (today's, or the dict an older nli-jax saved); a ValueError when it is
        not one (its text's start named)."""
        required = ("best_metric", "best_step", "evals_without_improvement", "stopped_early", "history")
        if not isinstance(saved, dict) or any(k not in saved for k in required):
            raise ValueError(f"loop metadata is not the loop's bookkeeping: {str(saved)[:120]}")
        budget = saved.get("budget")
        return cls(best_metric=saved["best_metric"], best_step=saved["best_step"],
                   evals_without_improvement=int(saved["evals_without_improvement"]),
                   stopped_early=bool(saved["stopped_early"]), history=tuple(saved["history"]),
                   train_tokens=saved.get("train_tokens"), budget=BudgetRecord(**budget) if budget else None,
                   steps=saved.get("steps"), total_steps=saved.get("total_steps"),
                   milestones=tuple(tuple(m) for m in saved.get("milestones", ())))
