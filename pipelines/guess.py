"""Guess the hidden number (1..16) in at most 5 turns, with higher/lower feedback. The default pipeline.

Run:  rose run pipelines/guess.py --steps 60 --json
A tiny Llama (0.5 M parameters) is built and warm-started on random valid play (cached), then GRPO
teaches it to search: sampled reward rises from about 0.5 toward binary search's 0.76.
"""
import rose
from rose.graph import Graph, rl_step

# ---- settings
ENV = "guess"  # environment (rose/envs/guess.py)
NUM_GROUPS = 16  # environment seeds per step (GRPO groups)
GROUP_SIZE = 8  # samples per seed
STEPS = 100  # RL steps by default
SEED = 0
MODEL = rose.ModelConfig()  # path=None: build and warm-start the tiny local model
# float32 engines for the tiny model: they sample from exactly the trainer's weights (seeded 100-step
# runs of `guess`: reward by 10-step blocks rose 0.48 -> 0.57 steadily in float32, and stayed near 0.50
# until step 90 in bf16). For real models keep the default, bf16: syncs then send small deltas.
ENGINE = rose.EngineConfig(dtype="float32", temperature=1.0, kv_cache_gib=0.5)
GRPO = rose.GRPOConfig(lr=3e-4, inner_epochs=4, clip=0.2)
CLUSTER = rose.ClusterConfig(num_dedicated=1)


def step_graph(step: int) -> Graph:
    return rl_step(ENV, ENV, NUM_GROUPS, GROUP_SIZE, grpo=GRPO)


PIPELINE = rose.Pipeline(name="guess", env=ENV, build=step_graph, steps=STEPS, seed=SEED, model=MODEL,
                         engine=ENGINE, cluster=CLUSTER)
