"""SoakConfig's sections and its flat wire format (optcheck/config.py): the JSON a worker
reads and summary.json keeps is today's, and records written before the sections read back."""

import json
from pathlib import Path

import pytest

from optcheck.config import (ChecksConfig, DataConfig, Injection, ModelConfig, OptimizerConfig, RunConfig,
                             SoakConfig, TorchSharpConfig)
from optcheck.errors import InputError

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "parity"

#: ``optcheck soak``'s config.json with every option at its default, as written before the sections
#: (ba4317f; run_id and work_dir are set by the supervisor).
DEFAULT_WIRE = (
    '{"backend": "pytorch", "steps": 20000, "every": 100, "seed": 1337, "data": null, "vocab_size": null, '
    '"batch_size": 16, "block_size": 64, "n_layer": 2, "n_head": 2, "n_embd": 64, "dropout": 0.0, "lr": 0.001, '
    '"min_lr": 0.0001, "warmup_steps": 100, "weight_decay": 0.1, "beta1": 0.9, "beta2": 0.95, "eps": 1e-08, '
    '"grad_clip": 1.0, "threads": 1, "val_every": 1000, "val_batches": 4, "eval_every": 0, "checkpoint_every": 0, '
    '"resume_at": 0, "inject": [], "stop_on_finding": false, "hazards": true, "allow_inplace": false, '
    '"hazard_mode": "auto", "step_timeout_s": 0.0, "device": "cpu", "run_id": "", "work_dir": "", '
    '"extra": {"optimizer": "adamw", "dotnet_runtime": "coreclr"}}')


def test_the_default_config_writes_todays_wire_json_and_reads_it_back():
    cfg = SoakConfig()
    assert cfg.to_json() == DEFAULT_WIRE
    assert SoakConfig.from_json(DEFAULT_WIRE) == cfg


def test_every_section_round_trips_through_the_flat_wire():
    cfg = SoakConfig(model=ModelConfig(n_layer=3, n_head=4, n_embd=32, block_size=16, dropout=0.1, vocab_size=300),
                     optimizer=OptimizerConfig(name="sgd", lr=0.5, grad_clip=0.0, fused=False),
                     data=DataConfig(path="x.txt", batch_size=3, val_every=0, val_batches=2),
                     run=RunConfig(backend="torchsharp", steps=50, every=5, seed=7, autocast="bf16", python="/py",
                                   run_id="r", work_dir="w"),
                     checks=ChecksConfig(inject=[Injection("param-rebind", 9)], hazards="off", grad_check_every=2),
                     torchsharp=TorchSharpConfig(version="0.105.0", assembly="a.dll", trainer="T", runtime="mono",
                                                 dotnet_root="/d", same_init="init"),
                     trainer_options={"width": "128"})
    wire = cfg.to_wire()
    assert wire["hazards"] is False and wire["hazard_mode"] == "auto" and wire["data"] == "x.txt"
    assert wire["inject"] == [{"name": "param-rebind", "step": 9}]
    assert wire["extra"] == {"width": "128", "optimizer": "sgd", "dotnet_runtime": "mono", "python": "/py",
                             "torchsharp": "0.105.0", "dotnet_assembly": "a.dll", "dotnet_trainer": "T",
                             "dotnet_root": "/d", "same_init": "init", "fused": False, "autocast": "bf16",
                             "grad_check_every": 2}
    assert SoakConfig.from_json(cfg.to_json()) == cfg
    assert SoakConfig.from_wire({"hazards": True, "hazard_mode": "always"}).checks.hazards == "always"


@pytest.mark.parametrize("name", ["pytorch-2.13.0", "torchsharp-0.107.0"])
def test_a_record_written_before_the_sections_reads_back(name):
    old = json.loads((FIXTURES / name / "config.json").read_text())
    cfg = SoakConfig.from_wire(old)
    assert cfg.run.backend == old["backend"] and cfg.data.path == old["data"] and cfg.run.run_id == old["run_id"]
    assert cfg.checks.hazards == "auto" and cfg.optimizer.name == "adamw" and cfg.trainer_options == {}
    if name.startswith("torchsharp"):  # no device key then: the default; its extra holds the .NET worker
        assert cfg.run.device == "cpu" and cfg.torchsharp.same_init == "runs/init"
        assert cfg.torchsharp.trainer == "OptCheck.Worker.GptTrainer" and cfg.torchsharp.version == "0.107.0"
    wire = cfg.to_wire()
    for key, value in old.items():
        assert wire[key] == value if key != "extra" else {**value, "dotnet_runtime": "coreclr"} == wire[key]
    summary = json.loads((FIXTURES / name / "summary.json").read_text())
    assert SoakConfig.from_wire(summary["config"]).model == cfg.model


def test_unknown_extra_keys_are_trainer_options():
    cfg = SoakConfig.from_wire({"extra": {"tie": "1", "optimizer": "sgd", "same_init_dir": "x"}})
    assert cfg.trainer_options == {"tie": "1"} and cfg.optimizer.name == "sgd"


@pytest.mark.parametrize("cfg, text", [
    (SoakConfig(model=ModelConfig(n_embd=63, n_head=2)), "--n-embd 63: must be a multiple of --n-head (2)"),
    (SoakConfig(run=RunConfig(steps=0)), "--steps 0: must be a whole number >= 1"),
    (SoakConfig(data=DataConfig(val_every=-1)), "--val-every -1: must be a whole number >= 0"),
    (SoakConfig(optimizer=OptimizerConfig(lr=0.0)), "--lr 0.0: must be a finite number > 0"),
    (SoakConfig(optimizer=OptimizerConfig(name="lion")), "--optimizer 'lion': must be adamw or sgd"),
    (SoakConfig(checks=ChecksConfig(hazards="sometimes")), "--hazards 'sometimes': must be auto or always"),
    (SoakConfig(torchsharp=TorchSharpConfig(runtime="x")), "--dotnet-runtime 'x': must be coreclr or mono"),
    (SoakConfig(run=RunConfig(steps=5), checks=ChecksConfig(inject=[Injection("param-rebind", 6)])),
     "--inject param-rebind@6: step is past --steps 5"),
    (SoakConfig(trainer_options={"optimizer": "sgd"}), "--trainer-option optimizer: optimizer is set by optcheck"),
])
def test_validate_names_the_option(cfg, text):
    with pytest.raises(InputError, match=text.replace("(", r"\(").replace(")", r"\)").replace("+", r"\+")):
        cfg.validate()


def test_copy_is_deep():
    cfg = SoakConfig(trainer_options={"a": "1"})
    c = cfg.copy()
    c.run.steps, c.trainer_options["a"] = 1, "2"
    assert cfg.run.steps == 20_000 and cfg.trainer_options == {"a": "1"}


def test_the_cli_defaults_are_the_sections_defaults():
    """``optcheck soak`` with no option builds SoakConfig() (so its config.json is DEFAULT_WIRE)."""
    from types import SimpleNamespace

    from optcheck.cli import cli
    from optcheck.commands.soak_plan import soak_config

    ctx = cli.commands["soak"].make_context("soak", [])
    assert soak_config(SimpleNamespace(**ctx.params), "pytorch") == SoakConfig()


@pytest.mark.parametrize("where, name", [("cfg", "steps"), ("cfg", "extra"), ("run", "lr"), ("model", "n_layers")])
def test_a_name_no_section_has_cannot_be_assigned(where, name):
    """The sections are slotted: ``cfg.steps = 500`` (the flat name of before) raises instead of being ignored."""
    cfg = SoakConfig()
    target = cfg if where == "cfg" else getattr(cfg, where)
    with pytest.raises(AttributeError):
        setattr(target, name, 500)
    assert cfg == SoakConfig()
