"""TensorBoard's HParams tab for a run: its settings against its val loss, written into the run's own events.

accelerate's tracker writes `add_hparams(config, metric_dict={})`: no metric to compare runs by, and into a
`<run>/<unix time>` sub-run that shows as a second run. Here the experiment, the session's values and its
metrics go into the run's own writer. The HParams table ticks the first five hparams marked `differs`, by name
(five is TensorBoard's fixed number), and leaves the rest to tick: TUNED marks the settings a user tunes, so runs
compare by preset, shape and learning rate at a glance (train.seq_len is the sixth, one tick away).
"""
from __future__ import annotations

import time

TUNED = ("preset", "train.learning_rate", "run.parameters", "model.num_layers", "model.hidden_size", "train.seq_len")
METRICS = {"val/loss": "validation loss at the last evaluation", "val/best_loss": "lowest validation loss of the run"}


def hparam_values(flat: dict) -> dict:
    """Values the HParams plugin accepts: bool, float, str. An int becomes its digits: the table prints every
    number with 5 significant digits (4 layers as "4.0000"), a string as it is."""
    return {k: v if isinstance(v, (bool, float, str)) else str(v) for k, v in flat.items()}


def hparams_summaries(flat: dict) -> list:
    """[experiment, session start] Summary protos for a run with the flattened settings `flat` (no TensorFlow)."""
    from tensorboard.compat.proto.summary_pb2 import Summary
    from tensorboard.plugins.hparams import api_pb2, metadata, plugin_data_pb2

    values = hparam_values(flat)
    kinds = {bool: api_pb2.DATA_TYPE_BOOL, str: api_pb2.DATA_TYPE_STRING}
    infos = [api_pb2.HParamInfo(name=name, type=kinds.get(type(value), api_pb2.DATA_TYPE_FLOAT64),
                                differs=name in TUNED) for name, value in values.items()]
    metrics = [api_pb2.MetricInfo(name=api_pb2.MetricName(tag=tag), description=text) for tag, text in METRICS.items()]
    start = plugin_data_pb2.SessionStartInfo(start_time_secs=time.time())
    for name, value in values.items():
        field = {bool: "bool_value", str: "string_value"}.get(type(value), "number_value")
        setattr(start.hparams[name], field, value)
    data = {metadata.EXPERIMENT_TAG: plugin_data_pb2.HParamsPluginData(experiment=api_pb2.Experiment(
                hparam_infos=infos, metric_infos=metrics, time_created_secs=time.time())),
            metadata.SESSION_START_INFO_TAG: plugin_data_pb2.HParamsPluginData(session_start_info=start)}
    return [Summary(value=[Summary.Value(tag=tag, metadata=metadata.create_summary_metadata(d))])
            for tag, d in data.items()]


def write_hparams(writer, flat: dict, step: int = 0) -> None:
    """Add the run's hparams to `writer` (a torch SummaryWriter on logs/<run>/) and flush."""
    for proto in hparams_summaries(flat):
        writer.file_writer.add_summary(proto, step)
    writer.flush()
