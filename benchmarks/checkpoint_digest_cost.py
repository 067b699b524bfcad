"""The cost of verified checkpoint reads (docs/errors.md §20) on an IndoBERT-base-sized state:
content_digest over the parameters (best/) and over parameters + Adam moments (a checkpoint),
beside orbax's own synchronous save and restore of the same state.

    python -m benchmarks.checkpoint_digest_cost
"""
import shutil
import tempfile
import time

import jax
import jax.numpy as jnp
import numpy as np
import orbax.checkpoint as ocp

from nli_jax.train.checkpointing import abstract_like, content_digest

# IndoBERT-base (indobenchmark/indobert-base-p1, vocabulary 50,000): 124.4M parameters.
SHAPES = ([(50000, 768), (512, 768), (2, 768)] + [(768, 768)] * 4 * 12 + [(768, 3072), (3072, 768)] * 12
          + [(768,)] * 120 + [(768, 768)])


def main() -> None:
    rng = np.random.default_rng(0)
    params = {f"p{i}": jnp.asarray(rng.standard_normal(s, dtype=np.float32)) for i, s in enumerate(SHAPES)}
    n = sum(x.size for x in params.values())
    state = {"params": params, "mu": jax.tree.map(jnp.copy, params), "nu": jax.tree.map(jnp.copy, params)}
    print(f"{n / 1e6:.1f}M parameters, state {3 * n * 4 / 1e9:.2f} GB")
    for what, tree in (("best/ (params)", params), ("checkpoint (params + Adam)", state)):
        times = []
        for _ in range(3):
            start = time.perf_counter()
            content_digest(tree)
            times.append(time.perf_counter() - start)
        print(f"{what}: digest {min(times):.2f} s (min of 3)")
    directory = tempfile.mkdtemp()
    manager = ocp.CheckpointManager(directory, options=ocp.CheckpointManagerOptions(enable_async_checkpointing=False),
                                    item_names=("state",))
    start = time.perf_counter()
    manager.save(1, args=ocp.args.Composite(state=ocp.args.StandardSave(state)))
    manager.wait_until_finished()
    print(f"orbax save of the checkpoint: {time.perf_counter() - start:.2f} s")
    start = time.perf_counter()
    manager.restore(1, args=ocp.args.Composite(state=ocp.args.StandardRestore(abstract_like(state))))
    print(f"orbax restore: {time.perf_counter() - start:.2f} s")
    manager.close()
    shutil.rmtree(directory)


if __name__ == "__main__":
    main()
