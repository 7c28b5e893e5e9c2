"""TensorBoard's HParams tab for a run: its settings against its val loss, written into the run's own events.

accelerate's tracker writes `add_hparams(config, metric_dict={})`: no metric to compare runs by, and into a
`<run>/<unix time>` sub-run that shows as a second run. Here the experiment, the session's values and its
metrics go into the run's own writer. The HParams table shows the first five hparams marked `differs` (then
the rest, by name, unticked): those are the settings a user tunes (TUNED), so runs compare by shape and
learning rate at a glance; every other setting is a column to tick.
"""
from __future__ import annotations

TUNED = ("preset", "train.learning_rate", "run.parameters", "model.num_layers", "model.hidden_size", "train.seq_len")
METRICS = {"val/loss": "validation loss at the last evaluation", "val/best_loss": "lowest validation loss of the run"}


def hparam_values(flat: dict) -> dict:
    """Values the HParams plugin accepts: bool, number (an int stays an int), str."""
    return {k: v if isinstance(v, (bool, int, float, str)) else str(v) for k, v in flat.items()}


def hparams_summaries(flat: dict) -> list:
    """[experiment, session start] Summary protos for a run with the flattened settings `flat`."""
    from tensorboard.plugins.hparams import api_pb2, summary

    values = hparam_values(flat)
    kinds = {bool: api_pb2.DATA_TYPE_BOOL, str: api_pb2.DATA_TYPE_STRING}
    infos = [api_pb2.HParamInfo(name=name, type=kinds.get(type(value), api_pb2.DATA_TYPE_FLOAT64), differs=name in TUNED)
             for name, value in values.items()]
    metrics = [api_pb2.MetricInfo(name=api_pb2.MetricName(tag=tag), description=text) for tag, text in METRICS.items()]
    return [summary.experiment_pb(infos, metrics), summary.session_start_pb(values)]


def write_hparams(writer, flat: dict, step: int = 0) -> None:
    """Add the run's hparams to `writer` (a torch SummaryWriter on logs/<run>/) and flush."""
    for proto in hparams_summaries(flat):
        writer.file_writer.add_summary(proto, step)
    writer.flush()
