"""Train the project's tokenizer and small base model from scratch (no downloads).

    python scripts/train_base.py tokenizer            # SentencePiece BPE on data/pretrain.jsonl
    python scripts/train_base.py train [--max-minutes 8] [--resume]   # until validation stops improving
    python scripts/train_base.py eval --split test     # greedy SQL exact match, code similarity
    python scripts/train_base.py eval --split valid --errors E.jsonl   # and every wrong SQL prediction
    python scripts/train_base.py export --from DIR     # re-save an HF checkpoint as one file

The tokenizer is SentencePiece BPE (vocab 4096, byte fallback, digits split, identity
normalization, no dummy prefix, whitespace-only pieces allowed, so code indentation survives and
a newline is always its own byte token <0x0A>); ids: <unk> 0, <s> 1, </s> 2. Files written next
to the model: tokenizer.model, tokenizer.json / tokenizer_config.json (transformers' conversion,
checked token-for-token against SentencePiece), special_tokens_map.json.

The model is a ``transformers`` ``LlamaForCausalLM`` (at most ``--max-params``, 40M: 80 MB in
fp16) trained on documents ``<s> text </s>``. Each batch row is, with probability ``--sql-frac``,
freshly generated text-to-SQL (``scripts/sqlgen.py``: procedural schemas and names, drawn on the
fly, so no SQL example is seen twice), with probability ``--fn-frac`` functions of the code train
split as the code task poses them (``--fn-rename-frac`` of them with their parameters renamed:
``scripts/coderename.py``), else a random window of the code stream: the code train split, the
train-split standard library modules and the stdlib's own tests (data/pretrain.jsonl.gz, no
third-party package). The batch of step s depends only on (``--seed``, s). LR: linear warm-up,
then cosine to ``--min-lr-frac`` at ``--steps``. Every ``--eval-every`` steps the completion loss
(answers given their prompts) of ``--eval-examples`` held-out valid examples per task is
measured; training stops when sql + ``--code-weight`` x code has not gone down by ``--min-delta``
for ``--patience`` evaluations (or at ``--steps``), and the weights with the lowest such score
are the ones saved. ``--init`` starts a new run from trained weights (continued pretraining).
On CUDA: bf16 autocast, batches made ahead by ``--workers`` processes.

Short runs: ``--max-minutes`` (or ``--run-steps``) ends a run with a checkpoint; ``--resume``
continues from ``--work``/ckpt.pt (weights, optimizer, best weights) or, when that is missing (a
run on another machine), from ``--out`` (the best weights so far in fp16 and train_log.json:
step, history, best loss), with fresh optimizer moments warmed up again over ``--warmup`` steps.
Every run, finished or not, ends by saving the best weights so far to ``--out``. A run cut into
short runs ends with the weights of the uninterrupted run (tested).

Outputs: ``--out`` (default models/specstream-tiny/hf): config.json, model.safetensors (fp16;
``--max-shard-size 15MB`` for pieces that fit the device tool's 16 MiB files), generation_config.json,
tokenizer files, train_log.json (losses, tokens, time, device, why it stopped, what ``--resume``
needs, valid exact match at the end); ``--work`` (default runs/base): ckpt.pt and log.jsonl.
"""

from __future__ import annotations

import argparse
import itertools
import json
import math
import os
import platform
import random
import re
import subprocess
import sys
import time
from collections.abc import Iterator, Sequence
from datetime import date
from pathlib import Path

import numpy as np

T0 = time.time()
ROOT = Path(__file__).resolve().parent.parent
DATA = ROOT / "data"
OUT = ROOT / "models" / "specstream-tiny" / "hf"
WORK = ROOT / "runs" / "base"
UNK, BOS, EOS = 0, 1, 2
SCORE = "completion loss"  # what the validation score measures (a resumed run scored otherwise starts afresh)

sys.path.insert(0, str(ROOT / "scripts"))
import coderename  # noqa: E402
import sqlgen  # noqa: E402
from make_data import read_jsonl  # noqa: E402


def pretrain_file(data: Path) -> Path:
    """``data/pretrain.jsonl.gz``, made first (scripts/make_data.py, about 20 s) where a fresh
    checkout does not have it yet, as ``specstream-mlx train`` makes a train split."""
    path = data / "pretrain.jsonl.gz"
    if not path.is_file():
        print(f"{path} is made, not shipped: making it now with scripts/make_data.py", flush=True)
        subprocess.run([sys.executable, str(Path(__file__).with_name("make_data.py")), "--out", str(data)],
                       check=True)
    return path


# --------------------------------------------------------------------------------------------
# tokenizer
# --------------------------------------------------------------------------------------------
def train_tokenizer(data: Path, out: Path, vocab: int = 4096, threads: int = 2) -> None:
    import sentencepiece as spm

    docs = read_jsonl(pretrain_file(data))
    lines = [ln for d in docs for ln in d["text"].split("\n") if ln.strip()]
    out.mkdir(parents=True, exist_ok=True)
    prefix = out / "tokenizer"
    spm.SentencePieceTrainer.train(
        sentence_iterator=iter(lines), model_prefix=str(prefix), model_type="bpe", vocab_size=vocab,
        character_coverage=0.9999, byte_fallback=True, split_digits=True,
        normalization_rule_name="identity", remove_extra_whitespaces=False, add_dummy_prefix=False,
        allow_whitespace_only_pieces=True, max_sentencepiece_length=16,
        unk_id=UNK, bos_id=BOS, eos_id=EOS, pad_id=-1, input_sentence_size=2_000_000,
        shuffle_input_sentence=True, seed_sentencepiece_size=1_000_000, num_threads=threads,
        minloglevel=2)
    (out / "tokenizer.vocab").unlink(missing_ok=True)
    # the model file records its output path; make it the same wherever it was built
    from sentencepiece import sentencepiece_model_pb2 as pb

    proto = pb.ModelProto()
    proto.ParseFromString((out / "tokenizer.model").read_bytes())
    proto.trainer_spec.model_prefix = "tokenizer"
    proto.trainer_spec.num_threads = 1
    (out / "tokenizer.model").write_bytes(proto.SerializeToString())
    write_hf_tokenizer(out)
    check_tokenizer(out, docs[:200])


def write_hf_tokenizer(out: Path) -> None:
    """tokenizer.json + tokenizer_config.json + special_tokens_map.json beside tokenizer.model."""
    from transformers import LlamaTokenizer

    for name in ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json"):
        (out / name).unlink(missing_ok=True)
    # transformers converts tokenizer.model (SentencePiece BPE, byte fallback) to a tokenizers BPE
    tok = LlamaTokenizer.from_pretrained(str(out), legacy=False, add_prefix_space=False,
                                         add_bos_token=True, add_eos_token=False)
    tok.save_pretrained(str(out))
    cfg_path = out / "tokenizer_config.json"
    cfg = json.loads(cfg_path.read_text())
    for k in ("is_local", "local_files_only", "extra_special_tokens"):
        cfg.pop(k, None)
    cfg.update(add_bos_token=True, add_eos_token=False, legacy=False, add_prefix_space=False,
               bos_token="<s>", eos_token="</s>", unk_token="<unk>", clean_up_tokenization_spaces=False,
               model_max_length=2048)
    cfg_path.write_text(json.dumps(cfg, indent=2, sort_keys=True) + "\n")
    (out / "special_tokens_map.json").write_text(json.dumps(
        {"bos_token": "<s>", "eos_token": "</s>", "unk_token": "<unk>"}, indent=2) + "\n")


def check_tokenizer(out: Path, docs: list[dict]) -> None:
    """The HF tokenizer must give SentencePiece's ids (plus BOS) and decode back to the text."""
    import sentencepiece as spm
    from transformers import AutoTokenizer

    sp = spm.SentencePieceProcessor(model_file=str(out / "tokenizer.model"))
    hf = AutoTokenizer.from_pretrained(str(out))
    bad = 0
    for d in docs:
        t = d["text"]
        ids = sp.encode(t)
        if hf.encode(t) != [BOS] + ids or hf.decode(ids) != t or sp.decode(ids) != t:
            bad += 1
    if bad:
        raise SystemExit(f"tokenizer check: {bad}/{len(docs)} documents differ between HF and SentencePiece")
    print(f"tokenizer: {sp.get_piece_size()} pieces; HF and SentencePiece agree on {len(docs)} documents")


# --------------------------------------------------------------------------------------------
# data streams
# --------------------------------------------------------------------------------------------
def encode_docs(sp, texts: list[str], threads: int) -> np.ndarray:
    ids = sp.encode(texts, num_threads=threads) if texts else []
    n = sum(len(x) + 2 for x in ids)
    arr = np.empty(n, dtype=np.uint16)
    i = 0
    for x in ids:
        arr[i] = BOS
        arr[i + 1:i + 1 + len(x)] = x
        arr[i + 1 + len(x)] = EOS
        i += len(x) + 2
    return arr


def build_code_stream(args, sp) -> tuple[np.ndarray, list[str]]:
    """The code stream: the stdlib documents of data/pretrain.jsonl.gz, as one array of ids; and
    the texts of its function examples (src "code": prompt + completion, as the code task poses
    them)."""
    t = time.time()
    docs = [d for d in read_jsonl(pretrain_file(args.data)) if d["src"] != "sql"]
    stream = encode_docs(sp, [d["text"] for d in docs], args.threads)
    functions = [d["text"] for d in docs if d["src"] == "code"]
    print(f"data: {stream.size} code tokens ({len(docs)} docs, {len(functions)} of them functions; "
          f"SQL generated on the fly) in {time.time() - t:.1f}s", flush=True)
    return stream, functions


def name_pieces(sp) -> tuple[list[str], list[str]]:
    """The tokenizer's lowercase pieces of two letters or more: those that start a word (``▁air``,
    ``▁case``, as ``air``, ``case``) and those inside one (``craft``)."""
    first, inner = [], []
    for i in range(sp.get_piece_size()):
        p = sp.id_to_piece(i)
        w = p.removeprefix("\u2581")
        if len(w) >= 2 and w.isascii() and w.isalpha() and w.islower():
            (first if p.startswith("\u2581") else inner).append(w)
    return first, inner


def piece_name(rng, first: list[str], inner: list[str]) -> str:
    """A table name of tokenizer pieces: one that starts a word, then maybe one inside a word and
    maybe ``_`` and another word (``aircraft``, ``caseborn_tick``)."""
    name = rng.choice(first) + (rng.choice(inner) if rng.random() < 0.5 else "")
    return name + ("_" + rng.choice(first) if rng.random() < 0.3 else "")


def rename_table(ex: dict, name: str) -> dict | None:
    """``ex`` with its context's only table called ``name`` in the context and the query (the
    question keeps its words, as a real schema's names need not be the user's); None when the
    context has several tables (the question is what tells them apart) or already uses ``name``."""
    ctx = sqlgen.context(ex["prompt"])
    tables = re.findall(r"CREATE TABLE (\w+) \(", ctx)
    if len(tables) != 1 or name in sqlgen.RESERVED or re.search(rf"\b{name}\b", ex["prompt"]):
        return None
    old = re.compile(rf"\b{tables[0]}\b")
    return ex | {"prompt": ex["prompt"].replace(ctx, old.sub(name, ctx), 1),
                 "completion": old.sub(name, ex["completion"])}


class Batcher:
    """The batch of a step, a function of (seed, step) alone, so that a resumed run goes on as if
    it had never stopped. Each row is, with probability ``sql_frac``, fresh SQL examples
    (``sqlgen.examples`` seeded by seed, step and row: never the same twice) packed as
    ``<s> prompt completion </s>`` up to ctx + 1 tokens; with probability ``fn_frac``, stdlib
    functions (``functions``: prompt + completion texts, as the code task poses them) packed the
    same way from a random one on, a share ``fn_rename_frac`` of them with their parameters renamed
    (``coderename.renamed``); else a random window of the code stream. A share
    ``rename_frac`` of the one-table examples get a table name made of tokenizer pieces
    (``piece_name``): generated names never start with some pieces (the words of held-out tables
    are left out of the generator's lists), and a model trained long on them stops copying those
    pieces (docs/default-model.md)."""

    def __init__(self, code: np.ndarray, tokenizer: Path, seed: int, ctx: int, bsz: int, sql_frac: float,
                 rename_frac: float = 0.0, functions: Sequence[str] = (), fn_frac: float = 0.0,
                 fn_rename_frac: float = 0.0):
        self.code, self.tokenizer, self.seed = code, tokenizer, seed
        self.ctx, self.bsz, self.sql_frac, self.rename_frac = ctx, bsz, sql_frac, rename_frac
        self.functions, self.fn_frac, self.fn_rename_frac = list(functions), fn_frac, fn_rename_frac
        self.sp = None

    def packed(self, docs: Iterator[str]) -> list[int]:
        """``<s> doc </s>`` documents from ``docs`` (an endless iterator of texts) up to ctx + 1 ids."""
        ids: list[int] = []
        for text in docs:
            ids += [BOS, *self.sp.encode(text), EOS]
            if len(ids) > self.ctx:
                return ids[:self.ctx + 1]
        raise AssertionError("unreachable: docs is endless")

    def sql_row(self, seed: str) -> list[int]:
        rng = random.Random(seed)

        def texts():
            for ex in sqlgen.examples(seed):
                if self.rename_frac and rng.random() < self.rename_frac:
                    ex = rename_table(ex, piece_name(rng, *self.pieces)) or ex
                yield ex["prompt"] + ex["completion"]
        return self.packed(texts())

    def function_row(self, seed: str) -> list[int]:
        rng = random.Random(seed)

        def texts():
            for i in itertools.count(rng.randrange(len(self.functions))):
                text = self.functions[i % len(self.functions)]
                yield coderename.renamed(text, rng) if rng.random() < self.fn_rename_frac else text
        return self.packed(texts())

    def __call__(self, step: int) -> np.ndarray:
        if self.sp is None:  # loaded here: a worker process gets the path, not the object
            import sentencepiece as spm

            self.sp = spm.SentencePieceProcessor(model_file=str(self.tokenizer / "tokenizer.model"))
            self.pieces = name_pieces(self.sp)
        rng = np.random.default_rng([self.seed, step])
        rows = []
        for r in range(self.bsz):
            u = rng.random()
            if u < self.sql_frac:
                rows.append(np.array(self.sql_row(f"{self.seed}-{step}-{r}")))
            elif u < self.sql_frac + self.fn_frac:
                rows.append(np.array(self.function_row(f"{self.seed}-{step}-{r}")))
            else:
                o = int(rng.integers(0, self.code.size - self.ctx - 1))
                rows.append(self.code[o:o + self.ctx + 1])
        return np.stack(rows).astype(np.int64)


_BATCHER: Batcher | None = None  # a worker process's copy


def _init_worker(batcher: Batcher) -> None:
    global _BATCHER
    _BATCHER = batcher


def _make_batch(step: int) -> np.ndarray:
    return _BATCHER(step)


def batches(batcher: Batcher, start: int, workers: int, depth: int = 16):
    """Yield (step, batch) from ``start`` on; with workers, made ``depth`` steps ahead in other
    processes (an SQL example costs about 0.4 ms of CPU: the ~320 of a 96 x 512 batch take 0.13 s,
    twice an H100 step of the 14M model)."""
    if workers == 0:
        step = start
        while True:
            yield step, batcher(step)
            step += 1
    import multiprocessing as mp
    from collections import deque

    with mp.get_context("spawn").Pool(workers, _init_worker, (batcher,)) as pool:
        ahead = deque((s, pool.apply_async(_make_batch, (s,))) for s in range(start, start + depth))
        while True:
            step, res = ahead.popleft()
            ahead.append((step + depth, pool.apply_async(_make_batch, (step + depth,))))
            yield step, res.get()


def fixed_windows(stream: np.ndarray, ctx: int, n: int) -> np.ndarray:
    """n evenly spaced, non-overlapping windows (deterministic), for evaluation."""
    n = max(1, min(n, (stream.size - 1) // (ctx + 1)))
    starts = np.linspace(0, stream.size - ctx - 2, n).astype(np.int64)
    return np.stack([stream[o:o + ctx + 1] for o in starts]).astype(np.int64)


# --------------------------------------------------------------------------------------------
# model
# --------------------------------------------------------------------------------------------
def llama_config(args, vocab: int):
    from transformers import LlamaConfig

    return LlamaConfig(
        vocab_size=vocab, hidden_size=args.hidden, intermediate_size=args.intermediate,
        num_hidden_layers=args.layers, num_attention_heads=args.heads, num_key_value_heads=args.kv_heads,
        max_position_embeddings=args.max_positions, rms_norm_eps=1e-5, rope_theta=10000.0,
        tie_word_embeddings=args.tie, bos_token_id=BOS, eos_token_id=EOS, pad_token_id=None,
        attention_bias=False, mlp_bias=False, hidden_act="silu", initializer_range=0.02)


def lr_at(step: int, total: int, args) -> float:
    if step < args.warmup:
        return args.lr * (step + 1) / args.warmup
    frac = min(1.0, (step - args.warmup) / max(1, total - args.warmup))
    return args.lr * (args.min_lr_frac + (1 - args.min_lr_frac) * 0.5 * (1 + math.cos(math.pi * frac)))


def completion_examples(data: Path, split: str, sp, n: int) -> list[tuple[list[int], int]]:
    """The first n examples of each held-out split as (``<s> prompt completion </s>`` ids, index
    of the first completion token)."""
    out = {}
    for task in ("sql", "code"):
        out[task] = []
        for r in read_jsonl(data / task / f"{split}.jsonl")[:n]:
            prompt = [BOS, *sp.encode(r["prompt"])]
            out[task].append((prompt + sp.encode(r["completion"]) + [EOS], len(prompt)))
    return out


def completion_loss(model, examples: list[tuple[list[int], int]], device, amp, bsz: int = 32) -> float:
    """Mean cross-entropy of the completion tokens (and EOS) given their prompts: what greedy
    decoding of the held-out prompts is judged on. The loss of whole windows also counts the
    table and column names of the context, which no model can predict and which a model that
    learns to copy them gets no better at, so it can rise while the answers get better."""
    import torch

    model.eval()
    tot, n = 0.0, 0
    with torch.no_grad():
        for i in range(0, len(examples), bsz):
            part = examples[i:i + bsz]
            width = max(len(ids) for ids, _ in part)
            x = torch.full((len(part), width), EOS, dtype=torch.long)
            y = torch.full((len(part), width), -100, dtype=torch.long)
            for r, (ids, start) in enumerate(part):
                x[r, :len(ids)] = torch.tensor(ids)
                y[r, start:len(ids)] = torch.tensor(ids[start:])
            x, y = x.to(device), y.to(device)
            with amp():
                logits = model(input_ids=x[:, :-1]).logits.float()
            loss = torch.nn.functional.cross_entropy(logits.reshape(-1, logits.size(-1)),
                                                     y[:, 1:].reshape(-1), ignore_index=-100, reduction="sum")
            tot += loss.item()
            n += int((y[:, 1:] != -100).sum())
    model.train()
    return tot / n


def evaluate_loss(model, windows: np.ndarray, device, amp, bsz: int = 32) -> float:
    import torch

    model.eval()
    tot, n = 0.0, 0
    with torch.no_grad():
        for i in range(0, len(windows), bsz):
            w = torch.from_numpy(windows[i:i + bsz]).to(device)
            with amp():
                logits = model(input_ids=w[:, :-1]).logits.float()
            loss = torch.nn.functional.cross_entropy(logits.reshape(-1, logits.size(-1)),
                                                     w[:, 1:].reshape(-1), reduction="sum")
            tot += loss.item()
            n += w[:, 1:].numel()
    model.train()
    return tot / n


def _load_shaped(model, weights: dict, differ: dict, where: Path, flag: str) -> None:
    """``weights`` into ``model``, or one line when the run saved in ``where`` has another model
    shape (``differ``: what the shapes disagree on; head counts and tied embeddings do not show in
    tensor sizes, which torch checks as a screen of mismatches)."""
    try:
        if differ:
            raise RuntimeError(differ)
        model.load_state_dict(weights)
    except RuntimeError:
        said = f" (its, these: {differ})" if differ else ""
        raise SystemExit(f"{where}: its run has another model shape{said}: give its flags, or another "
                         f"{flag}") from None


def load_resume_state(args, model, opt, device) -> dict | None:
    """The state of the run to continue: ``--work``/ckpt.pt (weights, optimizer, best weights), else
    the compact checkpoint in ``--out`` (fp16 best weights + train_log.json: what a short run on
    another machine brings back), whose optimizer moments start again from zero."""
    import torch

    ckpt_path = args.work / "ckpt.pt"
    if ckpt_path.exists():
        ck = torch.load(ckpt_path, map_location=device, weights_only=False)
        flags = ("hidden", "layers", "heads", "kv_heads", "intermediate", "max_positions", "tie")
        theirs = ck.get("args", {})  # the same command resumed: the same model flags
        differ = {k: (theirs[k], getattr(args, k)) for k in flags
                  if k in theirs and theirs[k] != getattr(args, k)}
        _load_shaped(model, ck["model"], differ, ckpt_path, "--work")
        opt.load_state_dict(ck["opt"])
        print(f"resumed from {ckpt_path} at step {ck['state']['step']}", flush=True)
        return ck["state"] | {"best_weights": ck["best_weights"]}
    log_path = args.out / "train_log.json"
    log = json.loads(log_path.read_text()) if log_path.exists() else {}
    if "resume" not in log:  # no run of this script's kind to continue there
        return None
    from transformers import LlamaForCausalLM

    state = log["resume"] | {"history": log["history"]}
    hf = LlamaForCausalLM.from_pretrained(str(args.out), dtype=torch.float32)
    # the model's shape as configured, head counts and tied embeddings too (sizes alone miss them)
    shape = ("hidden_size", "num_hidden_layers", "num_attention_heads", "num_key_value_heads",
             "intermediate_size", "max_position_embeddings", "tie_word_embeddings", "vocab_size")
    differ = {k: (getattr(hf.config, k, None), getattr(model.config, k, None)) for k in shape
              if getattr(hf.config, k, None) != getattr(model.config, k, None)}
    _load_shaped(model, hf.state_dict(), differ, args.out, "--out")
    state["best_weights"] = {k: v.detach().to("cpu", copy=True) for k, v in model.state_dict().items()}
    state["rewarm_from"] = state["step"]
    print(f"resumed from {args.out} (best weights of step {state['best_step']}, fresh optimizer moments) "
          f"at step {state['step']}", flush=True)
    return state


def cmd_train(args) -> None:
    """Train until held-out validation stops improving (``--patience`` evaluations) or ``--steps``;
    ``--max-minutes`` ends this run early with a checkpoint that ``--resume`` continues."""
    shares = {"--sql-frac": args.sql_frac, "--fn-frac": args.fn_frac, "--fn-rename-frac": args.fn_rename_frac,
              "--rename-frac": args.rename_frac, "--sql-frac + --fn-frac": args.sql_frac + args.fn_frac}
    for flag, share in shares.items():
        if not 0 <= share <= 1:
            raise SystemExit(f"train_base: {flag} must be in [0, 1], not {share}")
    import sentencepiece as spm
    import torch

    torch.manual_seed(args.seed)
    device = torch.device(args.device or ("cuda" if torch.cuda.is_available() else "cpu"))
    if device.type == "cpu":
        torch.set_num_threads(args.threads)
    else:
        torch.backends.cuda.matmul.allow_tf32 = True
        torch.backends.cudnn.allow_tf32 = True

    def amp():
        if device.type == "cuda":
            return torch.autocast("cuda", dtype=torch.bfloat16)
        return torch.autocast("cpu", enabled=False)

    sp = spm.SentencePieceProcessor(model_file=str(args.tokenizer / "tokenizer.model"))
    code, functions = build_code_stream(args, sp)
    if args.fn_frac and not functions:
        raise SystemExit(f"train_base: --fn-frac needs the code train split's functions (src \"code\") in "
                         f"{pretrain_file(args.data)}, which has none")
    valid = completion_examples(args.data, "valid", sp, args.eval_examples)
    train_code = fixed_windows(code, args.ctx, args.eval_windows)

    from transformers import LlamaForCausalLM

    if args.init is not None:  # a new run from trained weights (its architecture, not the flags')
        model = LlamaForCausalLM.from_pretrained(str(args.init), dtype=torch.float32).to(device)
        config = model.config
        if config.vocab_size != sp.get_piece_size():
            raise SystemExit(f"train_base: --init {args.init} has {config.vocab_size} token ids, the "
                             f"tokenizer {sp.get_piece_size()}")
    else:
        config = llama_config(args, sp.get_piece_size())
        model = LlamaForCausalLM(config).to(device)
    n_params = sum(p.numel() for p in model.parameters())
    if n_params > args.max_params:
        raise SystemExit(f"train_base: {n_params / 1e6:.1f}M parameters, more than --max-params "
                         f"{args.max_params}")
    print(f"model: {n_params / 1e6:.2f}M parameters ({2 * n_params / 1e6:.1f} MB in fp16) on {device}",
          flush=True)
    decay = [p for n, p in model.named_parameters() if p.ndim >= 2]
    no_decay = [p for n, p in model.named_parameters() if p.ndim < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": args.wd},
                             {"params": no_decay, "weight_decay": 0.0}],
                            lr=args.lr, betas=(0.9, 0.95), eps=1e-8, fused=device.type == "cuda")
    args.work.mkdir(parents=True, exist_ok=True)
    st = {"score": SCORE, "step": 0, "tokens": 0, "elapsed": 0.0, "history": [], "best_score": float("inf"),
          "best_step": None, "bad_evals": 0, "stopped": None, "rewarm_from": None}
    best_weights = None
    if args.resume:
        loaded = load_resume_state(args, model, opt, device)
        if loaded is None:
            print("nothing to resume: starting a new run", flush=True)
        else:
            best_weights = loaded.pop("best_weights")
            st.update(loaded)
            if st.get("score") != SCORE:  # a run scored another way: its best no longer compares
                st.update(best_score=float("inf"), best_step=None, bad_evals=0)
    fwd = torch.compile(model) if args.compile else model
    t_start = time.time()

    def elapsed() -> float:
        return st["elapsed"] + time.time() - t_start

    def save_ckpt() -> None:
        tmp = args.work / "ckpt.pt.tmp"
        torch.save({"model": model.state_dict(), "opt": opt.state_dict(), "best_weights": best_weights,
                    "state": st | {"elapsed": elapsed()}, "args": vars_json(args)}, tmp)
        os.replace(tmp, args.work / "ckpt.pt")

    def lr_now(step: int) -> float:
        lr = lr_at(step, args.steps, args)
        if st["rewarm_from"] is not None and step - st["rewarm_from"] < args.warmup:  # fresh moments
            lr *= (step - st["rewarm_from"] + 1) / args.warmup
        return lr

    batcher = Batcher(code, args.tokenizer, args.seed, args.ctx, args.batch, args.sql_frac, args.rename_frac,
                      functions, args.fn_frac, args.fn_rename_frac)
    workers = args.workers if args.workers is not None else (0 if device.type == "cpu" else
                                                              max(1, (os.cpu_count() or 2) - 2))
    model.train()
    ema = None
    logf = open(args.work / "log.jsonl", "a")
    first_step = st["step"]
    stream = batches(batcher, first_step, workers)
    while st["stopped"] is None:
        if st["step"] >= args.steps:
            st["stopped"] = f"reached --steps {args.steps}"
            break
        # the reserve for the final save, at most a quarter of a short run (--max-minutes 1 trains)
        reserve = min(args.reserve_s, args.max_minutes * 15) if args.max_minutes is not None else 0.0
        if args.max_minutes is not None and time.time() - T0 > args.max_minutes * 60 - reserve:
            break
        if args.run_steps is not None and st["step"] >= first_step + args.run_steps:
            break
        step, xb = next(stream)
        assert step == st["step"]
        xb = torch.from_numpy(xb).to(device, non_blocking=True)
        lr = lr_now(step)
        for g in opt.param_groups:
            g["lr"] = lr
        with amp():
            logits = fwd(input_ids=xb[:, :-1]).logits
        loss = torch.nn.functional.cross_entropy(logits.float().reshape(-1, logits.size(-1)),
                                                 xb[:, 1:].reshape(-1))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        st["step"] += 1
        st["tokens"] += xb[:, 1:].numel()
        step = st["step"]
        if step % 10 == 0 or ema is None:
            lv = loss.item()
            ema = lv if ema is None else 0.9 * ema + 0.1 * lv
        if step % args.log_every == 0:
            el = elapsed()
            print(f"step {step}/{args.steps} loss {ema:.4f} lr {lr:.2e} tokens {st['tokens'] / 1e6:.1f}M "
                  f"{st['tokens'] / max(el, 1e-9) / 1e3:.0f}k tok/s {el:.0f}s", flush=True)
        if step % args.eval_every == 0:
            rec = {"step": step, "tokens": st["tokens"], "loss_ema": ema, "lr": lr,
                   "elapsed_s": round(elapsed(), 1)}
            for k in ("sql", "code"):
                rec[f"valid_{k}"] = completion_loss(model, valid[k], device, amp)
            score = rec["valid_sql"] + args.code_weight * rec["valid_code"]
            if score < st["best_score"] - args.min_delta:
                st.update(best_score=score, best_step=step, bad_evals=0)
                best_weights = {k: v.detach().to("cpu", copy=True) for k, v in model.state_dict().items()}
            else:
                st["bad_evals"] += 1
                if st["bad_evals"] >= args.patience:
                    st["stopped"] = (f"valid loss (sql + {args.code_weight} x code) not below "
                                     f"{st['best_score']:.4f} for {args.patience} evaluations")
            print("eval " + json.dumps(rec), flush=True)
            st["history"].append(rec)
            logf.write(json.dumps(rec) + "\n")
            logf.flush()
            save_ckpt()
    logf.close()
    stream.close()
    save_ckpt()
    if best_weights is not None:
        model.load_state_dict(best_weights)
    final = {k: completion_loss(model, valid[k], device, amp) for k in ("sql", "code")}
    log = {
        "date": date.today().isoformat(), "device": device_name(device), "torch": torch.__version__,
        "python": platform.python_version(), "params": n_params, "config": config.to_dict(),
        "args": vars_json(args), "finished": st["stopped"] is not None, "stopped": st["stopped"],
        "steps": st["step"], "tokens_seen": st["tokens"], "train_seconds": round(elapsed(), 1),
        "saved_step": st["best_step"] or st["step"], "valid_loss": final,
        "train_code_loss": evaluate_loss(model, train_code, device, amp), "history": st["history"],
        "code_stream_tokens": int(code.size),
        "resume": {k: st[k] for k in ("score", "step", "tokens", "best_score", "best_step", "bad_evals",
                                      "stopped")} | {"elapsed": elapsed()},
        "command": "python scripts/train_base.py " + " ".join(sys.argv[1:]),
    }
    save_hf(model, args.out, args.max_shard_size)
    copy_tokenizer(args.tokenizer, args.out)
    if st["stopped"] and args.eval_n:
        log["eval"], _ = run_eval(model, sp, args.data, "valid", args.eval_n, device, args.eval_batch)
    write_text_atomic(args.out / "train_log.json", json.dumps(log, indent=1) + "\n")
    what = f"finished ({st['stopped']})" if st["stopped"] else "paused (continue with --resume)"
    print(f"{what}: step {st['step']}, {st['tokens'] / 1e6:.1f}M tokens, {elapsed():.0f}s; saved the "
          f"weights of step {log['saved_step']} to {args.out}; valid {final}; total {time.time() - T0:.0f}s",
          flush=True)


def write_text_atomic(path: Path, text: str) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(text)
    os.replace(tmp, path)


def device_name(device) -> str:
    import torch

    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    return f"cpu ({platform.processor() or platform.machine()}, {torch.get_num_threads()} threads)"


def vars_json(args) -> dict:
    """The arguments as JSON values; paths inside the repository relative to it (logs travel)."""

    def path(p: Path) -> str:
        return str(p.resolve().relative_to(ROOT)) if p.resolve().is_relative_to(ROOT) else str(p)

    return {k: (path(v) if isinstance(v, Path) else v) for k, v in vars(args).items() if k != "func"}


TOKENIZER_FILES = ("tokenizer.model", "tokenizer.json", "tokenizer_config.json", "special_tokens_map.json")


def copy_tokenizer(src: Path, dst: Path) -> None:
    import shutil

    if src.resolve() != dst.resolve():
        for name in TOKENIZER_FILES:
            shutil.copy2(src / name, dst / name)


def save_hf(model, out: Path, max_shard_size: str) -> None:
    import torch

    out.mkdir(parents=True, exist_ok=True)
    for old in out.glob("model*.safetensors*"):
        old.unlink()
    half = type(model)(model.config).to(torch.float16)
    half.load_state_dict({k: v.detach().to("cpu", torch.float16) for k, v in model.state_dict().items()})
    half.config.dtype = torch.float16
    half.generation_config.bos_token_id = BOS
    half.generation_config.eos_token_id = EOS
    half.save_pretrained(str(out), safe_serialization=True, max_shard_size=max_shard_size)
    for f in out.glob("model*.safetensors*"):
        f.chmod(0o644)
    # readers that predate transformers 5's rope_parameters (mlx-lm, transformers 4) look for these
    cfg_path = out / "config.json"
    cfg = json.loads(cfg_path.read_text())
    cfg.setdefault("rope_theta", cfg.get("rope_parameters", {}).get("rope_theta", 10000.0))
    cfg.setdefault("rope_scaling", None)
    cfg.setdefault("torch_dtype", "float16")
    cfg_path.write_text(json.dumps(cfg, indent=2, sort_keys=True) + "\n")


# --------------------------------------------------------------------------------------------
# evaluation: greedy decoding, batched with left padding
# --------------------------------------------------------------------------------------------
def norm_sql(s: str) -> str:
    """SQL as exact match compares it: the rule of ``mlx_specstream.bench.exact_match`` (this
    script runs without MLX; tests/test_train_base.py checks that the two agree)."""
    return " ".join(s.strip().rstrip(";").split())


def greedy(model, sp, prompts: list[str], max_new: int, device, bsz: int) -> tuple[list[str], list[bool]]:
    """Greedy continuations of ``prompts`` (up to ``max_new`` tokens), and whether each ended with
    EOS within that budget (a model caught in a repetition loop does not)."""
    import torch

    outs, ended = [], []
    model.eval()
    for i in range(0, len(prompts), bsz):
        enc = [[BOS] + sp.encode(p) for p in prompts[i:i + bsz]]
        width = max(map(len, enc))
        ids = torch.tensor([[EOS] * (width - len(e)) + e for e in enc], device=device)
        mask = torch.tensor([[0] * (width - len(e)) + [1] * len(e) for e in enc], device=device)
        with torch.no_grad():
            gen = model.generate(input_ids=ids, attention_mask=mask, max_new_tokens=max_new, do_sample=False,
                                 eos_token_id=EOS, pad_token_id=EOS)
        for row in gen[:, width:].tolist():
            ended.append(EOS in row)
            if EOS in row:
                row = row[:row.index(EOS)]
            outs.append(sp.decode(row))
    return outs, ended


def run_eval(model, sp, data: Path, split: str, n: int, device, bsz: int) -> tuple[dict, list[dict]]:
    """Greedy sql exact match and code edit similarity on ``split``; and the wrong sql predictions."""
    import difflib
    import sqlite3

    t = time.time()
    res = {"split": split}
    rows = read_jsonl(data / "sql" / f"{split}.jsonl")[:n]
    preds, ended = greedy(model, sp, [r["prompt"] for r in rows], 96, device, bsz)
    em = [norm_sql(p) == norm_sql(r["completion"]) for p, r in zip(preds, rows)]
    runs = 0
    for p, r in zip(preds, rows):
        ctx = sqlgen.context(r["prompt"])
        con = sqlite3.connect(":memory:")
        try:
            con.executescript(ctx)
            if p.strip():
                con.execute(p).fetchall()
                runs += 1
        except sqlite3.Error:
            pass
        finally:
            con.close()
    by_form = {}
    for ok, r in zip(em, rows):
        by_form.setdefault(r["meta"]["form"], []).append(ok)
    res["sql"] = {"n": len(rows), "exact_match": sum(em) / len(rows), "valid_sql": runs / len(rows),
                  "ends_with_eos": sum(ended) / len(rows),
                  "by_form": {k: round(sum(v) / len(v), 3) for k, v in sorted(by_form.items())},
                  "examples": [{"prompt": r["prompt"], "ref": r["completion"], "pred": p}
                               for p, r in list(zip(preds, rows))[:5]]}
    errors = [{"form": r["meta"]["form"], "prompt": r["prompt"], "ref": r["completion"], "pred": p}
              for ok, p, r in zip(em, preds, rows) if not ok]
    rows = read_jsonl(data / "code" / f"{split}.jsonl")[:n]
    preds, ended = greedy(model, sp, [r["prompt"] for r in rows], 192, device, bsz)
    em = [p.strip() == r["completion"].strip() for p, r in zip(preds, rows)]
    sim = [difflib.SequenceMatcher(None, p, r["completion"]).ratio() for p, r in zip(preds, rows)]

    def mean_sim(done: bool) -> float | None:  # outputs that end with EOS, or run on (a loop, mostly)
        picked = [x for x, e in zip(sim, ended) if e == done]
        return round(sum(picked) / len(picked), 4) if picked else None

    res["code"] = {"n": len(rows), "exact_match": sum(em) / len(rows),
                   "edit_similarity": sum(sim) / len(rows), "ends_with_eos": sum(ended) / len(rows),
                   "edit_similarity_ended": mean_sim(True), "edit_similarity_not_ended": mean_sim(False),
                   "examples": [{"prompt": r["prompt"], "ref": r["completion"], "pred": p}
                                for p, r in list(zip(preds, rows))[:3]]}
    res["seconds"] = round(time.time() - t, 1)
    print(f"eval {split}: sql exact match {res['sql']['exact_match']:.3f} "
          f"(valid sql {res['sql']['valid_sql']:.3f}, ends with EOS {res['sql']['ends_with_eos']:.3f}, "
          f"n={res['sql']['n']}); "
          f"code exact match {res['code']['exact_match']:.3f}, edit similarity "
          f"{res['code']['edit_similarity']:.3f} (ends with EOS {res['code']['ends_with_eos']:.3f}; "
          f"ended {res['code']['edit_similarity_ended']}, not {res['code']['edit_similarity_not_ended']}; "
          f"n={res['code']['n']}); {res['seconds']}s", flush=True)
    return res, errors


def cmd_eval(args) -> None:
    import sentencepiece as spm
    import torch
    from transformers import LlamaForCausalLM

    device = torch.device(args.device or ("cuda" if torch.cuda.is_available() else "cpu"))
    if device.type == "cpu":
        torch.set_num_threads(args.threads)
    model = LlamaForCausalLM.from_pretrained(str(args.model), dtype=torch.float32).to(device)
    sp = spm.SentencePieceProcessor(model_file=str(args.model / "tokenizer.model"))
    res, errors = run_eval(model, sp, args.data, args.split, args.n, device, args.eval_batch)
    if args.errors:
        args.errors.parent.mkdir(parents=True, exist_ok=True)
        write_text_atomic(args.errors, "".join(json.dumps(e) + "\n" for e in errors))
        print(f"{len(errors)} wrong sql predictions -> {args.errors}")
    res.update(date=date.today().isoformat(), device=device_name(device), model=str(args.model),
               command="python scripts/train_base.py " + " ".join(sys.argv[1:]))
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        write_text_atomic(args.json, json.dumps(res, indent=1) + "\n")


def cmd_export(args) -> None:
    """Re-save an HF checkpoint (e.g. shards that came back from another machine) as one fp16 file."""
    import shutil

    import torch
    from transformers import LlamaForCausalLM

    src = args.src
    model = LlamaForCausalLM.from_pretrained(str(src), dtype=torch.float32)
    if src.resolve() != args.out.resolve():
        args.out.mkdir(parents=True, exist_ok=True)
        for f in src.iterdir():
            if f.is_file() and not f.name.startswith("model") and f.name != "config.json":
                shutil.copy2(f, args.out / f.name)
    save_hf(model, args.out, "2GB")
    print(f"exported {src} -> {args.out}")


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--data", type=Path, default=DATA)
    common.add_argument("--threads", type=int, default=min(2, os.cpu_count() or 1),
                        help="CPU threads (torch on CPU, SentencePiece)")
    common.add_argument("--device", default=None)
    common.add_argument("--eval-batch", type=int, default=64)

    t = sub.add_parser("tokenizer", parents=[common])
    t.add_argument("--out", type=Path, default=OUT)
    t.add_argument("--vocab", type=int, default=4096)
    t.set_defaults(func=lambda a: train_tokenizer(a.data, a.out, a.vocab, a.threads))

    r = sub.add_parser("train", parents=[common])
    r.add_argument("--out", type=Path, default=OUT)
    r.add_argument("--work", type=Path, default=WORK)
    r.add_argument("--tokenizer", type=Path, default=OUT, help="folder with tokenizer.model (and HF files)")
    r.add_argument("--hidden", type=int, default=384)
    r.add_argument("--layers", type=int, default=8)
    r.add_argument("--heads", type=int, default=6)
    r.add_argument("--kv-heads", type=int, default=2)
    r.add_argument("--intermediate", type=int, default=1024)
    r.add_argument("--max-positions", type=int, default=2048)
    r.add_argument("--untie", dest="tie", action="store_false",
                   help="separate input and output embeddings (tied by default: with tied embeddings a "
                        "small model learns to copy names it rarely or never had to predict)")
    r.add_argument("--init", type=Path, default=None,
                   help="start a new run from this HF checkpoint's weights and architecture (continued "
                        "pretraining, e.g. on new data); the model flags are then ignored")
    r.add_argument("--ctx", type=int, default=512)
    r.add_argument("--batch", type=int, default=96)
    r.add_argument("--lr", type=float, default=2e-3)
    r.add_argument("--min-lr-frac", type=float, default=0.05)
    r.add_argument("--warmup", type=int, default=300)
    r.add_argument("--wd", type=float, default=0.1)
    r.add_argument("--steps", type=int, default=60000,
                   help="most steps (the cosine LR schedule ends there); validation usually stops sooner")
    r.add_argument("--patience", type=int, default=4,
                   help="stop after this many evaluations without a lower valid sql + code loss")
    r.add_argument("--min-delta", type=float, default=0.002, help="smallest loss decrease that counts")
    r.add_argument("--code-weight", type=float, default=1.0,
                   help="weight of the code loss in the validation score (sql + weight x code): the code "
                        "data is small and overfits long before the endless SQL does")
    r.add_argument("--max-minutes", type=float, default=None,
                   help="end this run within this many minutes (start-up included) with a checkpoint; "
                        "--resume continues it")
    r.add_argument("--reserve-s", type=float, default=60.0,
                   help="seconds kept for the final save (at most a quarter of --max-minutes)")
    r.add_argument("--run-steps", type=int, default=None,
                   help="end this run after this many steps with a checkpoint; --resume continues it")
    r.add_argument("--sql-frac", type=float, default=0.75, help="share of rows that are generated SQL")
    r.add_argument("--fn-frac", type=float, default=0.0,
                   help="share of rows that are stdlib functions of the code train split, packed as "
                        "documents as the code task poses them (the rest of the code rows: windows of the "
                        "code stream)")
    r.add_argument("--fn-rename-frac", type=float, default=0.0,
                   help="share of those functions whose parameters get new names (scripts/coderename.py): "
                        "the same code with other names, which the model must copy, not recall")
    r.add_argument("--rename-frac", type=float, default=0.0,
                   help="share of one-table SQL examples whose table gets a name of tokenizer pieces")
    r.add_argument("--workers", type=int, default=None,
                   help="processes generating batches (default: 0 on CPU, all cores but two on CUDA)")
    r.add_argument("--max-params", type=int, default=40_000_000)
    r.add_argument("--eval-every", type=int, default=500)
    r.add_argument("--eval-windows", type=int, default=64, help="windows of the train code stream whose loss "
                   "the log reports (overfitting)")
    r.add_argument("--eval-examples", type=int, default=200,
                   help="held-out valid examples per task whose completion loss decides when to stop")
    r.add_argument("--eval-n", type=int, default=200, help="greedy-decoded valid prompts per task at the end")
    r.add_argument("--log-every", type=int, default=100)
    r.add_argument("--seed", type=int, default=0)
    r.add_argument("--compile", action="store_true")
    r.add_argument("--resume", action="store_true")
    r.add_argument("--max-shard-size", default="2GB")
    r.set_defaults(func=cmd_train)

    e = sub.add_parser("eval", parents=[common])
    e.add_argument("--model", type=Path, default=OUT)
    e.add_argument("--split", default="test", choices=["valid", "test"])
    e.add_argument("--n", type=int, default=500)
    e.add_argument("--json", type=Path, default=None)
    e.add_argument("--errors", type=Path, default=None,
                   help="write each wrong sql prediction (form, prompt, reference, prediction) as JSON lines")
    e.set_defaults(func=cmd_eval)

    x = sub.add_parser("export")
    x.add_argument("--from", dest="src", type=Path, required=True)
    x.add_argument("--out", type=Path, default=OUT)
    x.set_defaults(func=cmd_export)

    args = ap.parse_args(argv)
    args.func(args)


if __name__ == "__main__":
    main()
