"""Tiny random models for tests (no downloads), and a ``serve`` subprocess."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import urllib.error
import urllib.request
from pathlib import Path

import mlx.core as mx

from mlx_specstream.arch import build_model

CONFIGS = {
    "llama": dict(model_type="llama", hidden_size=64, num_attention_heads=4, num_key_value_heads=2,
                  intermediate_size=128, num_hidden_layers=4, vocab_size=64),
    "qwen2": dict(model_type="qwen2", hidden_size=64, num_attention_heads=4, num_key_value_heads=2,
                  intermediate_size=128, num_hidden_layers=4, vocab_size=64, tie_word_embeddings=True),
    "opt": dict(model_type="opt", hidden_size=64, num_attention_heads=4, ffn_dim=128,
                num_hidden_layers=4, vocab_size=64, max_position_embeddings=512),
    "phi": dict(model_type="phi", hidden_size=64, num_attention_heads=4, intermediate_size=128,
                num_hidden_layers=4, vocab_size=64, max_position_embeddings=512),
}


def tiny_model(arch: str = "llama", seed: int = 0, scale: float = 1.0, **overrides):
    """A random fp32 model; ``scale`` multiplies the weights to sharpen its distributions."""
    mx.random.seed(seed)
    model = build_model({**CONFIGS[arch], **overrides})
    if scale != 1.0:
        from mlx.utils import tree_flatten, tree_unflatten

        params = [(k, v * scale if v.ndim > 1 else v) for k, v in tree_flatten(model.parameters())]
        model.update(tree_unflatten(params))
    mx.eval(model.parameters())
    model.eval()
    return model


ROOT = Path(__file__).resolve().parent.parent
SERVE = [sys.executable, "-c", "from mlx_specstream.cli import main; main()", "serve"]


def deliverable_sigint() -> None:
    """For ``preexec_fn``: the child gets SIGINT even when this run ignores it (a background job)
    or blocks it (a CI runner): a blocked signal stays blocked across exec and would wait until
    the run ends."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})


class Server:
    """A ``serve`` subprocess on a free loopback port (Ctrl-C, SIGINT, reaches it)."""

    def __init__(self, *args: str):
        self.proc = subprocess.Popen([*SERVE, *args, "--port", "0"], cwd=ROOT, stderr=subprocess.PIPE,
                                     text=True, preexec_fn=deliverable_sigint)
        for line in self.proc.stderr:  # "serving ... on http://127.0.0.1:PORT/v1" once it listens
            if line.startswith("serving "):
                self.port = int(line.rsplit(":", 1)[1].split("/")[0])
                self.url = f"http://127.0.0.1:{self.port}"
                self.get("/health")
                return
        self.stop()
        raise RuntimeError(f"the server did not start (status {self.proc.returncode})")

    def get(self, path: str) -> dict:
        with urllib.request.urlopen(self.url + path, timeout=10) as r:
            return json.loads(r.read())

    def post_raw(self, path: str, data: bytes | None, method: str = "POST") -> tuple[int, dict]:
        """The status and JSON body of a request (``method``: another than POST, e.g. GET)."""
        req = urllib.request.Request(self.url + path, data=data, headers={"Content-Type": "application/json"},
                                     method=method)
        try:
            with urllib.request.urlopen(req, timeout=30) as r:
                return r.status, json.loads(r.read())
        except urllib.error.HTTPError as e:
            return e.code, json.loads(e.read())

    def client(self):
        import openai

        return openai.OpenAI(base_url=self.url + "/v1", api_key="none", max_retries=0, timeout=120)

    def stop(self, timeout: float = 20) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        if self.proc.returncode:  # what the server said, for the failure's report
            sys.stderr.write(self.proc.stderr.read()[-4000:])
        return self.proc.returncode


def drawn_texts(c, tok, n: int = 12, seed: int = 0, max_tokens: int = 300, check_masks: bool = True):
    """``n`` texts drawn at random under the token constraint ``c`` (each token the allowed one
    of highest random score, biased to tokens that close a string, an object or a list, and to
    EOS, so that most texts end), as (token ids without the EOS, whether the text ended); with
    ``check_masks``, the masks on the first text's way are checked against the constraint's
    token-by-token answer."""
    import numpy as np

    from mlx_specstream.constraint import DONE, TokenConstraint

    rng = np.random.default_rng(seed)
    ends = np.array([any(ch in text for ch in '"}],') for text in tok.token_texts]) * 3.0
    ends[tok.eos_token_id] = 6.0
    for trial in range(n):
        state, ids = c.start, []
        while state is not DONE and len(ids) < max_tokens:
            scores = rng.random(len(ends)) + ends
            scores[~c.mask(state)] = -np.inf
            if check_masks and trial == 0 and len(ids) % 5 == 0:
                assert np.array_equal(c.mask(state), TokenConstraint.allowed(c, state))
            ids.append(int(np.argmax(scores)))
            state = c.advance(state, ids[-1])
        yield (ids[:-1], True) if state is DONE else (ids, False)


def templated_model(d: Path, model: Path, template: str) -> Path:
    """``model``'s files (and adapters) linked into the new folder ``d``, with the chat template
    ``template`` added: a chat model without copying weights."""
    d.mkdir()
    for f in model.iterdir():
        (d / f.name).symlink_to(f.resolve())
    (d / "chat_template.jinja").write_text(template)
    return d
