"""`RewardHost`: what a reward worker holds (`--rose-role reward --rose-reward-model DIR`): a
sequence-classification model that scores texts in batches, loaded once as the worker starts, for
every run. Reward tasks that call `rose.RewardModel` are placed on such a worker."""
from __future__ import annotations

import asyncio
import threading

from rose.errors import ModelError
from rose.runtime.worker.host import Host


class RewardHost(Host):
    def __init__(self, address: str, weights, model_dir: str, cores: tuple[int, ...] | None = None,
                 batch_size: int = 16, max_length: int = 1024):
        super().__init__(address, weights, cores)
        self.model_dir = model_dir
        self.batch_size = batch_size  # texts scored per forward pass
        self.max_length = max_length  # tokens a text is truncated to (from the left: the answer is at the end)
        self.model = None  # transformers AutoModelForSequenceClassification, num_labels 1, once started
        self._lock = threading.Lock()  # reward tasks run in several threads; the model scores one batch at a time

    async def start(self) -> None:
        await asyncio.to_thread(self._load)

    def _load(self) -> None:
        import torch
        from transformers import AutoModelForSequenceClassification, AutoTokenizer

        try:
            tokenizer = AutoTokenizer.from_pretrained(self.model_dir)
            model = AutoModelForSequenceClassification.from_pretrained(self.model_dir, dtype=torch.float32)
        except Exception as e:
            raise ModelError(f"reward model {self.model_dir!r} does not load as a sequence-classification model: "
                             f"{type(e).__name__}: {e}") from None
        if model.config.num_labels != 1:
            raise ModelError(f"reward model {self.model_dir!r} has {model.config.num_labels} labels; a reward model "
                             f"scores with one (num_labels=1)")
        if tokenizer.pad_token_id is None:
            raise ModelError(f"reward model {self.model_dir!r}: its tokenizer has no pad token (batches need one)")
        if cores := self.cores:
            torch.set_num_threads(len(cores))
        tokenizer.truncation_side = "left"
        model.config.pad_token_id = tokenizer.pad_token_id
        self.tokenizer, self.model = tokenizer, model.eval()

    def prepare(self, spec) -> None:
        """Nothing per run: the reward model is the worker's, not the run's."""

    def score(self, texts: list[str]) -> list[float]:
        """One score per text: the model's single logit."""
        import torch

        out: list[float] = []
        with self._lock, torch.no_grad():
            for i in range(0, len(texts), self.batch_size):
                batch = self.tokenizer(texts[i:i + self.batch_size], padding=True, truncation=True,
                                       max_length=self.max_length, return_tensors="pt")
                out += self.model(**batch).logits[:, 0].float().tolist()
        return out

    def report(self) -> dict:
        return {"weight_version": self.weights.version, "model": self.model_dir}
