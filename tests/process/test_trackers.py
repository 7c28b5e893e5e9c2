"""--report-to: every logged scalar reaches every tracker; W&B offline; TensorBoard config/sample text and hparams."""
import json
import re
import struct

import pytest

from tests.support.training import SAMPLE, run

pytestmark = pytest.mark.usefixtures("fresh_accelerate_state")


def wandb_records(run_file):
    """The records of a W&B run file: LevelDB log format (7-byte header, 32 KiB blocks of crc/length/type chunks)."""
    from wandb.proto import wandb_internal_pb2 as pb

    data = run_file.read_bytes()
    assert data[:4] == b":W&B"
    pos, pending = 7, b""
    while pos + 7 <= len(data):
        if 32768 - pos % 32768 < 7:  # a block's tail too short for a chunk header is padding
            pos += 32768 - pos % 32768
            continue
        _, length, kind = struct.unpack("<IHB", data[pos:pos + 7])
        pending += data[pos + 7:pos + 7 + length]
        pos += 7 + length
        if kind in (1, 4):  # a full record, or the last chunk of one
            record = pb.Record()
            record.ParseFromString(pending)
            pending = b""
            yield record


def read_wandb_run(run_file):
    """(scalars by step, config, texts {key: (step, text)}) of a W&B run file."""
    scalars, config, texts = {}, {}, {}
    for record in wandb_records(run_file):
        kind = record.WhichOneof("record_type")
        if kind == "history":
            items = {i.key or "/".join(i.nested_key): json.loads(i.value_json) for i in record.history.item}
            step = items.pop("_step")
            texts.update({k: (step, items.pop(k)) for k in ("config", "sample") if k in items})
            scalars.setdefault(step, {}).update({k: v for k, v in items.items() if not k.startswith("_")})
        elif kind == "config":
            config.update({i.key: json.loads(i.value_json) for i in record.config.update})
    return {step: values for step, values in scalars.items() if values}, config, texts


def test_every_tracker_gets_every_scalar_the_config_and_the_sample(tmp_path, tiny_data, monkeypatch):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    from tensorboard.plugins.hparams import plugin_data_pb2

    monkeypatch.delenv("WANDB_DIR")  # the default: next to the run's other logs
    code, _, run_dir = run(tmp_path, tiny_data, "--max-steps", "4", "--eval-every", "2",
                           "--report-to", "tensorboard,wandb", *SAMPLE)
    assert code == 0
    logs = tmp_path / "logs" / "run"
    expected = {}
    for row in json.loads((logs / "history.json").read_text()):
        expected.setdefault(row.pop("step"), {}).update(row)
    assert {"train/loss", "train/lr", "train/grad_norm", "train/tokens_per_s", "val/loss"} <= set(expected[4])

    # W&B, offline: the run folder `wandb sync` uploads holds every scalar, the config and the texts
    import wandb

    wandb.teardown()  # as at process exit: W&B's service may still be writing the run's last records
    (run_file,) = logs.glob("wandb/offline-run-*/run-*.wandb")
    scalars, config, texts = read_wandb_run(run_file)
    assert sorted(scalars) == sorted(expected)
    for step, values in expected.items():
        assert scalars[step] == pytest.approx(values)
    assert config["model.hidden_size"] == 32 and config["train.max_steps"] == 4 and config["run.name"] == "run"
    assert texts["sample"][0] == 4 and "Once upon a time" in texts["sample"][1]
    assert "hidden_size: 32" in texts["config"][1]
    run_id = run_file.name[len("run-"):-len(".wandb")]
    assert json.loads((run_dir / "final" / "metrics.json").read_text())["tracker_run_ids"] == {"wandb": run_id}

    # TensorBoard: the same scalars, the config and sample text panels, and the hparams summary
    acc = EventAccumulator(str(logs))
    acc.Reload()
    for key in expected[4]:
        events = acc.Scalars(key)
        assert [e.step for e in events] == [step for step, values in sorted(expected.items()) if key in values]
        assert [e.value for e in events] == pytest.approx([expected[e.step][key] for e in events])
    text = {tag: acc.Tensors(tag)[-1].tensor_proto.string_val[0].decode() for tag in acc.Tags()["tensors"]}
    assert "learning_rate: 0.003" in text["config/text_summary"]
    assert text["sample/text_summary"].lstrip().startswith("Once upon a time")
    content = acc.SummaryMetadata("_hparams_/session_start_info").plugin_data.content
    hparams = plugin_data_pb2.HParamsPluginData.FromString(content).session_start_info.hparams
    assert hparams["model.hidden_size"].string_value == "32" and hparams["train.data"].string_value == str(tiny_data)


def test_tensorboard_compares_runs_by_val_loss_in_one_run_per_run(tmp_path, tiny_data):
    """Runs compared by val loss, read with TensorBoard's own multiplexer and hparams plugin data."""
    from tensorboard.backend.event_processing.plugin_event_multiplexer import EventMultiplexer
    from tensorboard.plugins.hparams import metadata
    from tensorboard.util import tensor_util

    code, _, _ = run(tmp_path, tiny_data, "--max-steps", "4", "--eval-every", "2", "--report-to", "tensorboard",
                     *SAMPLE)
    assert code == 0
    logs = tmp_path / "logs"
    assert not [p for p in (logs / "run").rglob("events.out.tfevents*") if p.parent != logs / "run"]  # no sub-run
    mux = EventMultiplexer().AddRunsFromDirectory(str(logs))
    mux.Reload()
    assert sorted(mux.Runs()) == ["run"]
    content = mux.PluginRunToTagToContent(metadata.PLUGIN_NAME)["run"]
    experiment = metadata.parse_experiment_plugin_data(content[metadata.EXPERIMENT_TAG])
    assert [m.name.tag for m in experiment.metric_infos] == ["val/loss", "val/best_loss"]
    shown = sorted((not h.differs, h.name) for h in experiment.hparam_infos)[:5]  # what the HParams tab ticks
    assert {name for _, name in shown} == {"model.hidden_size", "model.num_layers", "preset", "run.parameters",
                                          "train.learning_rate"}
    session = metadata.parse_session_start_info_plugin_data(content[metadata.SESSION_START_INFO_TAG])
    assert session.hparams["model.num_layers"].string_value == "1"  # shown as 1, not as the number 1.0000
    assert session.hparams["train.learning_rate"].number_value == 3e-3
    assert "train.data_tokenizer_sha256" not in {name for _, name in shown}
    scalars = set(mux.PluginRunToTagToContent("scalars")["run"])
    assert {"val/loss", "val/best_loss"} <= scalars and "train/tokens_per_s_per_device" not in scalars  # one process

    def values(tag):
        return [tensor_util.make_ndarray(e.tensor_proto).item() for e in mux.Tensors("run", tag)]

    best, val = values("val/best_loss"), values("val/loss")
    assert len(best) == 2 and best == [min(val[:i + 1]) for i in range(len(best))]
    sample = mux.Tensors("run", "sample/text_summary")[-1].tensor_proto.string_val[0].decode()
    assert max(len(line) for line in sample.splitlines()) <= 104  # wrapped: 100 characters plus the block's indent
    log = (logs / "run" / "training.log").read_text()
    block = re.split(r"\n\d{4}-\d\d-\d\d ", log.split("sample:\n", 1)[1])[0]  # up to the next log line
    assert block.startswith("Once upon a time") and max(len(line) for line in block.splitlines()) <= 100


@pytest.mark.parametrize("report_to,message", [
    ("nope", "--report-to 'nope': allowed aim, clearml, comet_ml"),
    ("tensorboard,comet_ml", "--report-to comet_ml: its package is not installed (pip install comet-ml)"),
    (",", "name at least one of"),
])
def test_bad_report_to_is_one_line(tmp_path, tiny_data, capsys, report_to, message):
    code, _, _ = run(tmp_path, tiny_data, "--max-steps", "1", "--report-to", report_to)
    err = capsys.readouterr().err.strip()
    assert code == 2 and err.startswith("error: ") and message in err and len(err.splitlines()) == 1


def test_wandb_without_login_is_one_line(tmp_path, tiny_data, capsys, monkeypatch):
    """Online mode without an API key stops before the first step; the W&B host points at a closed local port."""
    monkeypatch.setenv("WANDB_MODE", "online")
    monkeypatch.setenv("WANDB_BASE_URL", "http://127.0.0.1:9")
    monkeypatch.setenv("HOME", str(tmp_path))  # no ~/.netrc with a key
    monkeypatch.delenv("WANDB_API_KEY", raising=False)
    import wandb

    wandb.teardown()  # W&B reads the environment once per process: forget the offline setup of earlier tests
    try:
        code, losses, _ = run(tmp_path, tiny_data, "--max-steps", "1", "--report-to", "wandb")
    finally:
        wandb.teardown()  # and later tests must not inherit this online one
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and losses == []
    assert err[-1].startswith("error: --report-to wandb: No API key configured") and "WANDB_MODE=offline" in err[-1]


def test_wandb_without_login_is_caught_by_the_preflight(tmp_path, tiny_data, capsys, monkeypatch):
    """Before the launch (no model built), the same line the run itself would give."""
    import wandb

    import train
    from tests.support.training import TINY

    monkeypatch.setenv("WANDB_MODE", "online")
    monkeypatch.setenv("WANDB_BASE_URL", "http://127.0.0.1:9")
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.delenv("WANDB_API_KEY", raising=False)
    wandb.teardown()
    try:
        code = train.main([*TINY, "--data", str(tiny_data), "--preflight", "--report-to", "wandb"])
        monkeypatch.setenv("WANDB_MODE", "offline")
        offline = train.main([*TINY, "--data", str(tiny_data), "--preflight", "--report-to", "wandb"])
    finally:
        wandb.teardown()
    err = capsys.readouterr().err.strip()
    assert code == 2 and err.startswith("error: --report-to wandb: No API key configured; log in with `wandb login`")
    assert len(err.splitlines()) == 1 and offline == 0


def test_a_resumed_wandb_run_says_what_happens_to_the_steps_past_its_checkpoint(tmp_path, caplog):
    """W&B keeps only increasing steps; the log says which values a resume cannot replace."""
    import wandb

    from utils.report.metrics import MetricsWriter

    writer = MetricsWriter(tmp_path / "logs" / "r", True, ("wandb",))
    writer.load_state_dict({"history": [{"step": 10, "train/loss": 2.0}], "tracker_run_ids": {"wandb": "abc123"}})
    try:
        with caplog.at_level("INFO", logger="piconeox"):
            writer.start(10, {"preset": "test"})
    finally:
        writer.close()
        wandb.teardown()
    (line,) = [r.getMessage() for r in caplog.records if r.getMessage().startswith("W&B run abc123")]
    assert "logs again from step 11" in line and "keep that attempt's values" in line
