"""``optcheck run -- COMMAND``: real programs, unchanged, run as subprocesses under the watch
(``optcheck/autowatch/``): each clean one silent with its steps counted, each with a fault
planted in the script's own step named at its step (docs/guide/run.md).

Every script is written to ``tmp_path``: a tiny model, 20 steps, ``every=5``, one thread.
The Monitor of an optimizer opens at the forward after its first step, so a replaced
layer after step 10 is OC101 at step 11, as a Monitor built before the loop says it.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

LOOP = """
import sys, torch
torch.set_num_threads(1)
torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 1))
opt = torch.optim.SGD(model.parameters(), lr=0.01)
FAULT = "fault" in sys.argv
RAISE = "raise" in sys.argv
for step in range(1, 21):
    x = torch.randn(16, 8)
    loss = ((model(x) - x.sum(1, keepdim=True)) ** 2).mean()
    opt.zero_grad()
    loss.backward()
    opt.step()
    if FAULT and step == 10:
        model[2] = torch.nn.Linear(16, 1)  # the optimizer still holds the old layer
    if RAISE and step == 12:
        raise ValueError("the data ran out")
print("trained", round(loss.item(), 4))
"""


def _env(**extra) -> dict:
    return {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT), **extra}


def optcheck_run(tmp_path: Path, *command: str, out: str = "out", options=("--every", "5"), timeout: float = 180,
                 cwd: Path | None = None) -> tuple[int, str, str, Path]:
    """``python -m optcheck run --out OUT OPTIONS -- COMMAND`` in ``tmp_path``: (exit code, stdout, stderr, OUT)."""
    p = subprocess.run([sys.executable, "-m", "optcheck", "run", "--out", out, *options, "--", *command],
                       cwd=cwd or tmp_path, env=_env(), capture_output=True, text=True, timeout=timeout)
    return p.returncode, p.stdout, p.stderr, (cwd or tmp_path) / out


def script(tmp_path: Path, name: str, text: str) -> Path:
    p = tmp_path / name
    p.write_text(textwrap.dedent(text))
    return p


def summary(out: Path) -> dict:
    return json.loads((out / "summary.json").read_text())


def findings(out: Path) -> list[dict]:
    files = [out / "findings.jsonl"] if (out / "findings.jsonl").exists() else sorted(out.glob("rank-*/findings.jsonl"))
    return [json.loads(line) for f in files for line in f.read_text().splitlines() if line.strip()]


# -- a plain loop ----------------------------------------------------------------------
def test_plain_loop_clean_is_silent_with_its_steps_counted(tmp_path):
    script(tmp_path, "train.py", LOOP)
    rc, stdout, stderr, out = optcheck_run(tmp_path, sys.executable, "train.py")
    assert rc == 0, stderr
    assert "trained" in stdout  # the program's own output, unchanged
    assert "OptcheckWarning" not in stderr
    s = summary(out)
    assert (s["status"], s["last_step"], s["findings"]) == ("clean", 20, 0)
    assert s["snapshots"] >= 4 and (out / "snapshots.jsonl").is_file()  # one stream: a Monitor's run directory
    assert s["config"]["command"] == [sys.executable, "train.py"] and s["config"]["command_exit"] == 0
    # every reader takes it
    chk = subprocess.run([sys.executable, "-m", "optcheck", "check", str(out)], env=_env(), capture_output=True,
                         text=True, timeout=60)
    assert chk.returncode == 0 and "0 finding(s)" in chk.stdout


def test_plain_loop_replaced_layer_is_oc101_at_its_step(tmp_path):
    script(tmp_path, "train.py", LOOP)
    rc, stdout, stderr, out = optcheck_run(tmp_path, sys.executable, "train.py", "fault")
    assert rc == 1, stderr
    f = next(f for f in findings(out) if f["code"] == "OC101")
    assert f["step"] == 11 and "2.weight" in f["message"]
    assert "OC101" in stdout and "OC101" in stderr  # the table, and the warning at the user's line
    assert summary(out)["exit_code"] == 1


@pytest.mark.slow  # (two or more runs)
def test_fail_on_error_lets_warnings_pass_and_hazards_off(tmp_path):
    script(tmp_path, "train.py", LOOP)
    rc, _, stderr, out = optcheck_run(tmp_path, sys.executable, "train.py", "fault",
                                      options=("--every", "5", "--fail-on", "error", "--hazards", "off"))
    assert rc == 1, stderr  # OC101 is an error
    assert summary(out)["fail_on"] == "error"


def test_python_dash_m_a_module(tmp_path):
    pkg = tmp_path / "mypkg"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    script(pkg, "train.py", LOOP)
    rc, stdout, stderr, out = optcheck_run(tmp_path, sys.executable, "-m", "mypkg.train", "fault")
    assert rc == 1, stderr
    assert [f["step"] for f in findings(out) if f["code"] == "OC101"] == [11]


@pytest.mark.slow  # (two or more runs)
def test_a_shell_script_that_starts_python(tmp_path):
    script(tmp_path, "train.py", LOOP)
    sh = script(tmp_path, "train.sh", f"""\
        #!/bin/sh
        echo starting
        "{sys.executable}" train.py "$@"
        """)
    sh.chmod(0o755)
    rc, stdout, stderr, out = optcheck_run(tmp_path, "./train.sh")
    assert rc == 0, stderr
    assert "starting" in stdout and summary(out)["last_step"] == 20
    rc, _, stderr, out = optcheck_run(tmp_path, "./train.sh", "fault", out="out2")
    assert rc == 1 and [f["step"] for f in findings(out) if f["code"] == "OC101"] == [11]


def test_a_script_that_raises_keeps_its_exit_code_and_the_losses_before(tmp_path):
    script(tmp_path, "train.py", LOOP)
    rc, stdout, stderr, out = optcheck_run(tmp_path, sys.executable, "train.py", "raise")
    assert rc == 1 and "ValueError: the data ran out" in stderr  # Python's own exit code and traceback
    s = summary(out)
    assert s["status"] == "crashed" and s["crash"]["exc_type"] == "ValueError"
    steps = [json.loads(line)["step"] for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert steps and max(steps) == 12 and min(steps) <= 3


@pytest.mark.slow  # (two or more runs)
def test_script_exit_code_is_kept(tmp_path):
    script(tmp_path, "train.py", LOOP + "\nraise SystemExit(7)\n")
    rc, _, stderr, out = optcheck_run(tmp_path, sys.executable, "train.py")
    assert rc == 7, stderr
    assert summary(out)["last_step"] == 20


# -- several optimizers, workers ---------------------------------------------------------
GAN = """
import sys, torch
torch.set_num_threads(1); torch.manual_seed(0)
G = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Tanh(), torch.nn.Linear(8, 2))
D = torch.nn.Sequential(torch.nn.Linear(2, 8), torch.nn.Tanh(), torch.nn.Linear(8, 1))
oG = torch.optim.Adam(G.parameters(), lr=1e-3)
oD = torch.optim.Adam(D.parameters(), lr=1e-3)
bce = torch.nn.BCEWithLogitsLoss()
for step in range(1, 21):
    real = torch.randn(16, 2) + 3
    fake = G(torch.randn(16, 4))
    d_loss = bce(D(real), torch.ones(16, 1)) + bce(D(fake.detach()), torch.zeros(16, 1))
    oD.zero_grad(); d_loss.backward(); oD.step()
    g_loss = bce(D(fake), torch.ones(16, 1))
    oG.zero_grad(); g_loss.backward(); oG.step()
    if "fault" in sys.argv and step == 10:
        G[0] = torch.nn.Linear(4, 8)  # the generator's optimizer still holds the old layer
print("ok")
"""


@pytest.mark.slow  # (two or more runs)
def test_gan_two_optimizers_each_watched(tmp_path):
    script(tmp_path, "gan.py", GAN)
    rc, stdout, stderr, out = optcheck_run(tmp_path, sys.executable, "gan.py")
    assert rc == 0, stderr
    s = summary(out)
    assert s["world"] == 2 and [r["last_step"] for r in s["ranks"]] == [20, 20] and s["findings"] == 0
    assert any("optimizer 1" in n for n in s["notes"])
    rc, _, stderr, out = optcheck_run(tmp_path, sys.executable, "gan.py", "fault", out="out2")
    assert rc == 1, stderr
    f = [f for f in findings(out) if f["code"] == "OC101"]
    assert [x["step"] for x in f] == [11] and "0.weight" in f[0]["message"]
    # the generator's stream (the second optimizer to step) has it, the discriminator's none
    assert summary(out)["ranks"][1]["findings"] >= 1 and summary(out)["ranks"][0]["findings"] == 0


LOADER = """
import torch
from torch.utils.data import DataLoader, TensorDataset
torch.set_num_threads(1); torch.manual_seed(0)
data = TensorDataset(torch.randn(320, 8), torch.randn(320, 1))
model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 1))
opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
if __name__ == "__main__":
    for x, y in DataLoader(data, batch_size=16, num_workers=2):
        loss = torch.nn.functional.mse_loss(model(x), y)
        opt.zero_grad(); loss.backward(); opt.step()
    print("ok")
"""


def test_dataloader_workers_are_not_watched(tmp_path):
    script(tmp_path, "loader.py", LOADER)
    rc, stdout, stderr, out = optcheck_run(tmp_path, sys.executable, "loader.py")
    assert rc == 0, stderr
    s = summary(out)
    assert s["last_step"] == 20 and s["findings"] == 0 and s.get("world", 1) == 1  # one stream: the main process's
    assert not list(out.glob("proc-*")) and not list(out.glob("rank-*"))


def test_no_optimizer_stepped(tmp_path):
    script(tmp_path, "infer.py", """
        import sys, torch
        model = torch.nn.Linear(4, 2)
        print(model(torch.randn(3, 4)).shape)
        sys.exit(int(sys.argv[1]))
        """)
    rc, stdout, stderr, out = optcheck_run(tmp_path, sys.executable, "infer.py", "5")
    assert rc == 5 and "no optimizer stepped (the command exited 5)" in stdout, stderr
    s = summary(out)
    assert any("no optimizer stepped" in n for n in s["not_checked"]) and s["status"] == "crashed"
    assert s["last_step"] == 0 and s["config"]["command_exit"] == 5


# -- bad input: one line, exit 2, nothing started --------------------------------------------
@pytest.mark.parametrize("command, words", [
    ((), "no COMMAND"),
    (("no-such-program-xyz", "a"), "command not found"),
    (("./data.txt",), "not executable"),
    (("./missing.py",), "no such file"),
])
def test_bad_command(tmp_path, command, words):
    (tmp_path / "data.txt").write_text("x")
    rc, stdout, stderr, out = optcheck_run(tmp_path, *command)
    assert rc == 2 and words in stderr and len(stderr.strip().splitlines()) == 1, stderr
    assert not out.exists()


def test_out_holding_a_run_or_not_writable(tmp_path):
    script(tmp_path, "train.py", LOOP)
    (tmp_path / "old").mkdir()
    (tmp_path / "old" / "summary.json").write_text('{"status": "clean", "last_step": 3}')
    marker = tmp_path / "ran"
    script(tmp_path, "touch.py", f"open({str(marker)!r}, 'w').close()")
    rc, _, stderr, _ = optcheck_run(tmp_path, sys.executable, "touch.py", out="old")
    assert rc == 2 and "already holds a run" in stderr and len(stderr.strip().splitlines()) == 1
    if os.geteuid() != 0:
        (tmp_path / "ro").mkdir(mode=0o500)
        rc, _, stderr, _ = optcheck_run(tmp_path, sys.executable, "touch.py", out="ro/out")
        assert rc == 2 and "cannot write there" in stderr
    assert not marker.exists()  # nothing started


# -- signals ---------------------------------------------------------------------------------
@pytest.mark.parametrize("sig", [signal.SIGTERM, pytest.param(signal.SIGINT, marks=pytest.mark.slow)],
                         ids=["SIGTERM", "SIGINT"])
def test_a_signal_reaches_the_command_and_the_record_is_finished(tmp_path, sig):
    script(tmp_path, "long.py", """
        import pathlib, time, torch
        torch.set_num_threads(1)
        model = torch.nn.Linear(4, 1)
        opt = torch.optim.SGD(model.parameters(), lr=0.01)
        for step in range(1, 100000):
            loss = model(torch.randn(8, 4)).pow(2).mean()
            opt.zero_grad(); loss.backward(); opt.step()
            if step == 5:
                pathlib.Path("stepped").touch()
            time.sleep(0.01)
        """)
    p = subprocess.Popen([sys.executable, "-m", "optcheck", "run", "--out", "out", "--every", "5", "--",
                          sys.executable, "long.py"], cwd=tmp_path, env=_env(), stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, stdin=subprocess.DEVNULL, text=True)
    deadline = time.time() + 120
    while not (tmp_path / "stepped").exists() and time.time() < deadline and p.poll() is None:
        time.sleep(0.1)
    p.send_signal(sig)  # to optcheck alone (stdin is no terminal): passed on to the command
    stdout, stderr = p.communicate(timeout=120)
    assert p.returncode == 128 + sig, stderr  # the command died by it (Python re-raises SIGINT): its own exit
    s = summary(tmp_path / "out")
    assert s["status"] == "interrupted" and s["interrupted_by"] == sig.name and s["last_step"] >= 5
    assert s["finished"]


# -- frameworks and launchers (slow: each imports a framework; torchrun: test_run_torchrun.py) ------------------------------------
COMPILED = """
import sys, torch
torch.set_num_threads(1); torch.manual_seed(0)
net = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 1))
model = torch.compile(net, backend="aot_eager")
opt = torch.optim.SGD(net.parameters(), lr=0.01)
for step in range(1, 21):
    x = torch.randn(16, 8)
    loss = ((model(x) - x.sum(1, keepdim=True)) ** 2).mean()
    opt.zero_grad(); loss.backward(); opt.step()
    if "fault" in sys.argv and step == 10:
        net[2] = torch.nn.Linear(16, 1)
print("ok")
"""

HF_TRAINER = """
import sys, torch
from transformers import Trainer, TrainingArguments
torch.set_num_threads(1); torch.manual_seed(0)

class Net(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.body = torch.nn.Linear(8, 16); self.head = torch.nn.Linear(16, 1)
    def forward(self, x, labels=None):
        out = self.head(torch.relu(self.body(x)))
        return {"loss": torch.nn.functional.mse_loss(out, labels), "logits": out}

class Data(torch.utils.data.Dataset):
    def __len__(self): return 320
    def __getitem__(self, i):
        x = torch.randn(8, generator=torch.Generator().manual_seed(i))
        return {"x": x, "labels": x.sum(0, keepdim=True)}

class Planted(Trainer):
    def training_step(self, model, inputs, *a, **k):
        if "fault" in sys.argv and self.state.global_step == 10:
            model.head = torch.nn.Linear(16, 1)  # after 10 steps: the optimizer still holds the old head
        return super().training_step(model, inputs, *a, **k)

args = TrainingArguments(output_dir="hf-out", per_device_train_batch_size=16, max_steps=20, report_to=[],
                         save_strategy="no", logging_steps=100, use_cpu=True, disable_tqdm=True)
Planted(model=Net(), args=args, train_dataset=Data()).train()
"""

LIGHTNING = """
import sys, torch
import lightning as L
torch.set_num_threads(1); torch.manual_seed(0)

class Net(L.LightningModule):
    def __init__(self):
        super().__init__()
        self.body = torch.nn.Linear(8, 16); self.head = torch.nn.Linear(16, 1)
    def forward(self, x):
        return self.head(torch.relu(self.body(x)))
    def training_step(self, batch, i):
        if "fault" in sys.argv and self.global_step == 10:
            self.head = torch.nn.Linear(16, 1)  # inside step 11's closure, after its pre-step check
        x, y = batch
        return torch.nn.functional.mse_loss(self(x), y)
    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.01)

x = torch.randn(320, 8)
dl = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(x, x.sum(1, keepdim=True)), batch_size=16)
L.Trainer(max_steps=20, accelerator="cpu", logger=False, enable_checkpointing=False, enable_progress_bar=False,
          enable_model_summary=False).fit(Net(), dl)
"""

ACCELERATE = """
import sys, torch
from accelerate import Accelerator
torch.set_num_threads(1); torch.manual_seed(0)
acc = Accelerator(cpu=True)
net = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 1))
x = torch.randn(640, 8)
dl = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(x, x.sum(1, keepdim=True)), batch_size=16)
model, opt, dl = acc.prepare(net, torch.optim.AdamW(net.parameters(), lr=1e-3), dl)
for step, (xb, yb) in enumerate(dl, 1):
    loss = torch.nn.functional.mse_loss(model(xb), yb)
    opt.zero_grad(); acc.backward(loss); opt.step()
    if "fault" in sys.argv and step == 10:
        net[2] = torch.nn.Linear(16, 1)
    if step == 20:
        break
"""


def _launcher(name: str) -> tuple[str, tuple, str, int]:
    """(script text, the command before the script, the module it needs, the OC101 step)."""
    return {"compiled": (COMPILED, (sys.executable,), "torch", 11),
            "hf-trainer": (HF_TRAINER, (sys.executable,), "transformers", 11),
            "lightning": (LIGHTNING, (sys.executable,), "lightning", 12),
            "accelerate-launch": (ACCELERATE, ("accelerate", "launch", "--num_processes", "1", "--cpu"), "accelerate",
                                  11)}[name]


@pytest.mark.slow
@pytest.mark.parametrize("name", ["compiled", "hf-trainer", "lightning", "accelerate-launch"])
def test_frameworks_and_launchers_clean_and_replaced_layer(tmp_path, name):
    text, before, module, step = _launcher(name)
    pytest.importorskip(module)
    if before[0] == "accelerate" and not __import__("shutil").which("accelerate"):
        pytest.skip("no accelerate command on PATH")
    script(tmp_path, "train.py", text)
    rc, _, stderr, out = optcheck_run(tmp_path, *before, "train.py", timeout=300)
    assert rc == 0, stderr
    s = summary(out)
    assert (s["last_step"], s["findings"]) == (20, 0), stderr
    assert "OptcheckWarning" not in stderr and "global hooks" not in stderr  # torch.compile's warning filtered
    rc, _, stderr, out = optcheck_run(tmp_path, *before, "train.py", "fault", out="out2", timeout=300)
    assert rc == 1, stderr
    assert [f["step"] for f in findings(out) if f["code"] == "OC101"] == [step]


# -- the start-up hook itself ------------------------------------------------------------------
def _hooked_env(tmp_path: Path, *before: str) -> dict:
    from optcheck.autowatch.launch import BOOT

    return _env(PYTHONPATH=os.pathsep.join([str(BOOT), *before, str(ROOT)]),
                OPTCHECK_RUN=json.dumps({"out": str(tmp_path / "out"), "every": 5}))


def test_the_boot_hook_chains_to_the_sitecustomize_it_shadows_and_waits_for_torch(tmp_path):
    other = tmp_path / "theirs"
    other.mkdir()
    (other / "sitecustomize.py").write_text("import builtins; builtins.THEIRS = 'ran'\n")
    code = ("import builtins, sys; print(getattr(builtins, 'THEIRS', None), 'torch' in sys.modules, "
            "'optcheck.autowatch.attach' in sys.modules)")
    p = subprocess.run([sys.executable, "-c", code], env=_hooked_env(tmp_path, str(other)), capture_output=True,
                       text=True, timeout=60)
    assert p.stdout.split() == ["ran", "False", "False"], p.stderr  # theirs ran; nothing of torch nor the watch
    p = subprocess.run([sys.executable, "-c", "import torch, sys, sitecustomize as s; "
                        "print(type(s.watch).__name__, s.watch.installed, torch.__spec__.loader.__class__.__name__)"],
                       env=_hooked_env(tmp_path), capture_output=True, text=True, timeout=120)
    assert p.stdout.split() == ["AutoWatch", "True", "SourceFileLoader"], p.stderr  # torch's own loader put back


@pytest.mark.slow  # (two or more runs)
def test_baseline_judges_as_soak_does(tmp_path):
    script(tmp_path, "train.py", LOOP)
    rc, _, stderr, base = optcheck_run(tmp_path, sys.executable, "train.py", out="night-1")
    assert rc == 0, stderr
    rc, stdout, stderr, _ = optcheck_run(tmp_path, sys.executable, "train.py", out="night-2",
                                         options=("--every", "5", "--baseline", "night-1"))
    assert rc == 0 and "baseline" in stdout.lower(), stdout + stderr
    rc, stdout, stderr, _ = optcheck_run(tmp_path, sys.executable, "train.py", "fault", out="night-3",
                                         options=("--every", "5", "--baseline", "night-1"))
    assert rc == 1 and "OC101" in stdout, stdout + stderr
    rc, _, stderr, out = optcheck_run(tmp_path, sys.executable, "train.py", out="night-4",
                                      options=("--baseline", "no-such-night"))
    assert rc == 2 and len(stderr.strip().splitlines()) == 1 and not out.exists()
