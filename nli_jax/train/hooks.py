"""Run hooks: what a run does besides training and evaluating, at fixed points of the loop, the
final evaluation and the offline tools, chosen by the plan. Training dynamics
(nli_jax.train.dynamics) and calibration (nli_jax.train.calibrate) are hooks; a new recorder or
analysis is a `RunHook` subclass registered with the plan setting that turns it on, not a branch
in the loop.

Points, in a run's order:
  start(step)                        before the first step of this invocation (resumed or 0)
  after_step(step, outcomes, params) after each train step; `outcomes`: the step's per-example
                                     outputs when the hook asked for them (`per_example_outcomes`)
  before_checkpoint(step)            before each checkpoint (and the one a SIGTERM forces)
  final_results(run, params, results, evaluations)
                                     after the final evaluation of every split (training and
                                     finetune.evaluate): may add to results and replace a split's
                                     prediction records
  predictions(records, outputs)      finetune.predict's records, with the step's outputs
  export_fields()                    what an export of the parameters records (config.json's nli_jax)
and `summarize_seeds(per_seed, summary)` (a classmethod) over a seeds run's results.
"""
from __future__ import annotations


class RunHook:
    """A hook's points, each doing nothing by default."""
    per_example_outcomes = False  # the train step returns each example's outcomes (Task.records_dynamics)

    def start(self, step: int) -> None:
        pass

    def after_step(self, step: int, outcomes: dict | None, params) -> None:
        pass

    def before_checkpoint(self, step: int) -> None:
        pass

    def final_results(self, run, params, results: dict, evaluations: dict) -> None:
        pass

    def predictions(self, records: list[dict], outputs: dict) -> list[dict]:
        return records

    def export_fields(self) -> dict:
        return {}

    @classmethod
    def summarize_seeds(cls, per_seed: dict[int, dict], summary: dict) -> None:
        pass

    # Construction (nli_jax.train.run_hooks): for a training run (its set-up and training split),
    # or for a tool reading a finished run or Hugging Face directory (`checkpoint`); None where the
    # plan does not ask for the hook or it has no part.
    @classmethod
    def for_training(cls, run, train_source) -> "RunHook | None":
        return None

    @classmethod
    def for_checkpoint(cls, plan, checkpoint: str) -> "RunHook | None":
        return None
