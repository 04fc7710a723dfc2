"""Guess the hidden number (1..16) in at most 5 turns, with higher/lower feedback. The default pipeline.

Run:  rose run pipelines/guess.py --json
A tiny Llama (0.5 M parameters) is built and warm-started on random valid play (cached), then GRPO
teaches it to search: sampled reward rises from about 0.47 toward binary search's 0.76, by +0.146 to
+0.206 from the first 10 steps to the last 10 (seeds 0-4 on the AVX2 host; `reward_first10`,
`reward_last10` in the summary; benchmarks/RESULTS.md), and levels off near 0.63: the 2-layer model
still guesses outside the interval the feedback leaves in about a third of its fifth turns
(`python benchmarks/support/guess_turns.py runs/guess`).
"""
import rose
from rose.graph import Graph, rl_step

# ---- settings
ENV = "guess"  # environment (rose/envs/guess.py)
NUM_GROUPS = 16  # environment seeds per step (GRPO groups)
GROUP_SIZE = 8  # samples per seed
STEPS = 200  # RL steps by default: 1.2-1.7 s each on the AVX2 host, 0.6 s on the Zen 5 host (2026-12-07)
SEED = 0
# path=None: build and warm-start the tiny local model (300 supervised steps). Longer warm starts (600,
# 1200 steps; AVX2 host, 2026-12-07) start nearer their teacher's play and end higher, but the format
# collapsed for a block or two in 4 of 6 runs; with GRPOConfig(kl_coef=0.04) the 1200-step start did not
# (2 runs) and rose less (RESULTS, the default pipeline).
MODEL = rose.ModelConfig()
# float32 engines for the tiny model: they sample from exactly the trainer's weights (seeded 100-step
# runs of `guess`: reward by 10-step blocks rose 0.48 -> 0.57 steadily in float32, and stayed near 0.50
# until step 90 in bf16). For real models keep the default, bf16: syncs then send small deltas.
ENGINE = rose.EngineConfig(dtype="float32", temperature=1.0, kv_cache_gib=0.5)
# Asynchronous steps: step k+1's rollouts run while step k trains, on the weights from before it (one
# version stale; the engines' log-probs are the behaviour policy's in the loss). On a 2-core host the
# trainer gets one core and the rollout worker the other; synchronously each phase gets both in turn.
# Seeded 200-step runs here (AVX2 host, 2026-12-07; benchmarks/RESULTS.md, the default pipeline), at a
# constant 3e-4: +0.144, +0.156, +0.162 (seeds 0-2) in 295-343 s of steps; synchronous at 5e-4 (the default
# before): +0.150 (seed 0) in 458 s. On the Zen 5 host (trainer passes in bf16, constant 3e-4): +0.175, +0.143, +0.126
# in 137-170 s; DAPO there +0.112, +0.174, +0.126. A seed gave the same rewards with one or two workers
# and at each host speed seen. At 5e-4 asynchronous steps collapsed in two runs (at step ~107 and ~140), at 4e-4 the
# reward fell to -0.35 at step 13 and came back by step 18; 1e-3 broke the warm-started policy within 5
# steps in either mode. `--staleness 0` runs synchronously (at 3e-4 it rose +0.09 over 100 steps,
# 2026-11-30; 5e-4 suits it better).
STALENESS = 1
# Two passes of at most 2,048 padded tokens each, not the whole batch in one: rows of similar length
# share a pass (less padding; rose/runtime/microbatch.py). The trainer, which bounds an asynchronous
# step here, took 0.85 of the one-pass time (median of 8 interleaved updates, one thread, 2026-12-07;
# seed 0's 200 steps: 377 s of steps in one pass at 12:41, 295 and 325 s in two at 13:07 and 13:17).
# The learning rate falls along a half cosine to a tenth of 3e-4 over the run's 200 updates: late updates,
# on a policy near its plateau, move it least. Seeded 200-step runs (AVX2 host, 2026-12-07; RESULTS, the
# default pipeline), seeds 0-4: +0.163, +0.195, +0.181, +0.206, +0.146 (mean +0.178) against +0.144,
# +0.156, +0.162, +0.185, +0.173 (mean +0.164) at a constant 3e-4; decaying from 4e-4, seed 0's reward
# fell to 0.25 over steps 10-19. `--steps N` keeps the decay over 200 steps (past them the rate stays at its
# floor): a longer run should set lr_decay_steps to its steps.
GRPO = rose.GRPOConfig(lr=3e-4, inner_epochs=4, clip=0.2, max_tokens_per_microbatch=2048, lr_decay_steps=STEPS)
# One dedicated rollout worker: it takes core 0 and the trainer core 1. A second worker (one per core)
# would share the trainer's core: it shortens a synchronous step's rollout phase (40 steps, mirrored, AVX2
# host: 0.56-0.60 s against 0.84) but slowed asynchronous steps (1.95 s against 1.78, back-to-back runs).
CLUSTER = rose.ClusterConfig(num_dedicated=1)


def step_graph(step: int) -> Graph:
    return rl_step(ENV, ENV, NUM_GROUPS, GROUP_SIZE, grpo=GRPO)


PIPELINE = rose.Pipeline(name="guess", env=ENV, build=step_graph, steps=STEPS, seed=SEED, model=MODEL,
                         engine=ENGINE, cluster=CLUSTER, staleness=STALENESS)
