"""docs/extending.md's worked task example, run as written: its task module and config (the code
blocks of the page, executed as they are) train and evaluate through the loop on files made here."""
import json
import pathlib
import random
import re
import types

from conftest import REPO

DOC = REPO / "docs" / "extending.md"


def code_block(after: str) -> str:
    """The ```python block that follows the line naming `after` in docs/extending.md."""
    text = DOC.read_text(encoding="utf-8")
    match = re.search(re.escape(after) + r".*?```python\n(.*?)```", text, re.S)
    assert match, f"no python block after {after!r} in {DOC}"
    return match.group(1)


def write_pairs(path: pathlib.Path, n: int, seed: int) -> None:
    """Sentence pairs of the shipped fixture's words: a paraphrase keeps the subject and the act."""
    rng = random.Random(seed)
    names, acts = ["Budi", "Wati", "Agus", "Siti"], ["memasak nasi", "memotong kayu", "membaca buku", "menulis surat"]
    rows = []
    for _ in range(n):
        name, act = rng.choice(names), rng.choice(acts)
        if rng.random() < 0.5:
            rows.append(f"{name} {act} di rumah.\t{name} {act}.\tparaphrase")
        else:
            other = rng.choice([a for a in acts if a != act])
            rows.append(f"{name} {act} di rumah.\t{name} {other}.\tdifferent")
    path.write_text("\n".join(rows) + "\n", encoding="utf-8")


def test_the_documented_task_trains_and_evaluates_through_the_loop(tmp_path):
    from nli_jax.tasks import TASKS
    from nli_jax.train.loop import train_and_evaluate
    task_module = types.ModuleType("nli_jax.tasks.paraphrase")
    exec(compile(code_block("`nli_jax/tasks/paraphrase.py`"), "nli_jax/tasks/paraphrase.py", "exec"),
         task_module.__dict__)
    config_module = types.ModuleType("configs.paraphrase")
    exec(compile(code_block("`configs/paraphrase.py`"), "configs/paraphrase.py", "exec"), config_module.__dict__)
    try:
        data = tmp_path / "data"
        data.mkdir()
        write_pairs(data / "train.tsv", 160, seed=0)
        write_pairs(data / "dev.tsv", 40, seed=1)
        config = config_module.get_config("cpu_test")
        config.data.source = str(data)
        config.data.tfds_dir = str(tmp_path / "tfds")
        config.train.num_epochs = 3
        config.train.batch_size = 16
        config.optimizer.lr = 1e-3
        config.data.allow_overlap = True  # 4 names x 4 acts: every dev pair is in train (the overlap check)
        results = train_and_evaluate(config, str(tmp_path / "run"))
    finally:
        TASKS.pop("paraphrase", None)
    validation = results["splits"]["validation"]
    assert results["task"] == "paraphrase" and validation["count"] == 40
    assert {"accuracy", "f1"} <= set(validation)
    records = [json.loads(line) for line in (tmp_path / "run" / "predictions.jsonl").read_text().splitlines()]
    assert len(records) == 40 and {r["prediction"] for r in records} <= {"different", "paraphrase"}
    # Packed training batches come with the ClassificationTask family.
    assert "training batches packed" in (tmp_path / "run" / "train.log").read_text()


WORKED_EXAMPLES = {
    "nli_jax/tasks/tsv_classification.py": {"nli_jax/tasks/tsv_classification.py", "configs/tsv_classification.py",
                                            "tests/test_tsv_classification.py"},
    "nli_jax/tasks/span_bert.py": {"nli_jax/tasks/span_bert.py", "configs/pretrain/span_bert.py",
                                   "tests/test_span_bert.py"},
    "nli_jax/schedules/wsd.py": {"nli_jax/schedules/wsd.py", "configs/pretrain/crammed_wsd.py",
                                 "tests/test_wsd_schedule.py"},
    "nli_jax/hooks/layer_norms.py": {"nli_jax/hooks/layer_norms.py", "configs/pretrain/indobert_large_watched.py",
                                     "tests/test_layer_norms_hook.py"},
}


def test_each_worked_example_was_added_as_one_module_one_config_and_its_test():
    """The proof by diff docs/extending.md gives: the commit that added each worked example touched
    its module, its config and its test, nothing else of the repository."""
    import shutil
    import subprocess
    if shutil.which("git") is None or not (REPO / ".git").exists():
        import pytest
        pytest.skip("not a git checkout: the commits cannot be read")
    text = DOC.read_text(encoding="utf-8")
    for module, files in WORKED_EXAMPLES.items():
        added = subprocess.run(["git", "log", "--diff-filter=A", "--format=%H", "--", module], cwd=REPO,
                               capture_output=True, text=True, check=True).stdout.split()
        if not added:
            import pytest
            pytest.skip(f"{module}'s commit is not in this checkout's history (a shallow clone?)")
        touched = subprocess.run(["git", "show", "--name-only", "--format=", added[-1]], cwd=REPO,
                                 capture_output=True, text=True, check=True).stdout.split()
        assert set(touched) == files, (module, touched)
        assert all(f in text for f in files), f"docs/extending.md does not name {sorted(files)}"
