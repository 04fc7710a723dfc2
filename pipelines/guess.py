"""Guess the hidden number (1..16) in at most 5 turns, with higher/lower feedback. The default pipeline.

Run:  rose run pipelines/guess.py --json
A tiny Llama (0.5 M parameters) is built and warm-started on random valid play (cached), then GRPO
teaches it to search: sampled reward rises from about 0.45 toward binary search's 0.76, by +0.15 to
+0.27 from the first 10 steps to the last 10 (`reward_first10`, `reward_last10` in the summary; hosts
and seeds in benchmarks/RESULTS.md).
"""
import rose
from rose.graph import Graph, rl_step

# ---- settings
ENV = "guess"  # environment (rose/envs/guess.py)
NUM_GROUPS = 16  # environment seeds per step (GRPO groups)
GROUP_SIZE = 8  # samples per seed
STEPS = 200  # RL steps by default: 0.6-2.3 s each on the 2-core hosts measured (2 to 7.6 min of steps)
SEED = 0
MODEL = rose.ModelConfig()  # path=None: build and warm-start the tiny local model
# float32 engines for the tiny model: they sample from exactly the trainer's weights (seeded 100-step
# runs of `guess`: reward by 10-step blocks rose 0.48 -> 0.57 steadily in float32, and stayed near 0.50
# until step 90 in bf16). For real models keep the default, bf16: syncs then send small deltas.
ENGINE = rose.EngineConfig(dtype="float32", temperature=1.0, kv_cache_gib=0.5)
# lr 5e-4, not the default 3e-4 (+0.09 between the first and last 10-step blocks of 100 steps): 200
# synchronous steps rose +0.17, +0.16, +0.22 (seeds 0, 1, 2) with float32 trainer passes, and +0.17,
# +0.22, +0.27 with bf16 ones (GRPOConfig's "auto" on an AVX512-BF16 host). 1e-3 broke the warm-started
# policy within 5 steps (malformed guesses); asynchronous steps (--staleness 1) at 5e-4 collapsed in two
# runs (at step ~140, and at ~107 on the AVX2 host, 2026-12-07).
GRPO = rose.GRPOConfig(lr=5e-4, inner_epochs=4, clip=0.2)
# Two dedicated rollout workers, one per core of a 2-core host. The trainer takes every core in a
# synchronous step and both workers yield to it, so each phase has the whole host: 40 steps, mirrored
# (AVX2 host, 2026-12-07), rollout phase 0.56-0.60 s a step against 0.84 with one worker, the same
# rewards, tokens and losses to the digit (each trajectory samples from its own seed).
CLUSTER = rose.ClusterConfig(num_dedicated=2)


def step_graph(step: int) -> Graph:
    return rl_step(ENV, ENV, NUM_GROUPS, GROUP_SIZE, grpo=GRPO)


PIPELINE = rose.Pipeline(name="guess", env=ENV, build=step_graph, steps=STEPS, seed=SEED, model=MODEL,
                         engine=ENGINE, cluster=CLUSTER)
