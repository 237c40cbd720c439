"""The baseline Tidepool is measured against: a model served by Triton's plain Python backend
(plain_backend_model.py as its model.py), laid out from a planned model directory."""

from __future__ import annotations

import shutil
from pathlib import Path

from tidepool.configfile import read_config, set_instances, write_config

PLAIN_DELAY_US = 2000  # the queue delay a user of the plain backend would set by hand


def plain_model(target: Path, planned_dir: Path, instances: int, threads: int, delay_us: int) -> Path:
    """The model of `planned_dir` served by Triton's plain Python backend at `target` (named after
    it): `instances` x `threads` torch threads, a queue delay of `delay_us`, nothing of Tidepool's."""
    config = read_config(planned_dir / "config.pbtxt")
    factory = config.parameters["MODEL_FACTORY"].string_value
    (target / "1").mkdir(parents=True)
    shutil.copy(planned_dir / (factory.split(":")[0] + ".py"), target)
    shutil.copy(Path(__file__).with_name("plain_backend_model.py"), target / "1" / "model.py")
    config.name, config.backend = target.name, "python"
    for key in [key for key in config.parameters if not key.startswith("range.")]:
        del config.parameters[key]  # the declared value ranges stay: clients read them for valid inputs
    config.parameters["FACTORY"].string_value = factory
    config.parameters["TORCH_NUM_THREADS"].string_value = str(threads)
    set_instances(config, instances)
    config.dynamic_batching.Clear()
    config.dynamic_batching.max_queue_delay_microseconds = delay_us
    write_config(target / "config.pbtxt", config)
    return target
