"""The ``ClientApp``: one Fed-GRPO client on its partition, dgrpo's GRPO learner doing the local steps.

A SuperNode started with ``--node-config "partition-id=<i>"`` is ``client-<i>`` of the scenario (its prompts,
its label noise, its attack if it is one of the last ``attack.clients``): the same client dgrpo's simulation
builds (:func:`dgrpo.simulations.federated.client_for`). Each round it loads the global weights, takes its
``local_steps`` GRPO steps with the federation's reward statistics (calibration), and replies with its sparse
update (top-k with error feedback at its budget) and its reward statistics.

Flower starts a new ClientApp process for every message, so what a client carries from round to round, its
optimizer's state (momentum) and its error-feedback residual, lives in ``context.state``, which the
SuperNode keeps for the run.
"""

from __future__ import annotations

from typing import Any, cast

import torch
from flwr.app import Array, ArrayRecord, ConfigRecord, Context, Message, RecordDict
from flwr.clientapp import ClientApp

from dgrpo.errors import ConfigError
from dgrpo.federated.client import FedClient
from dgrpo.federated.sparse import ErrorFeedback
from dgrpo.flower.config import scenario_of
from dgrpo.flower.records import (
    blob,
    global_stats_of,
    number,
    stats_record,
    unblob,
    update_record,
    weights_of,
)
from dgrpo.simulations.federated import client_for
from dgrpo.tasks import get_task

app = ClientApp()
STATE_KEY = "dgrpo-client"


def _restore(client: FedClient, context: Context) -> None:
    if STATE_KEY not in context.state:
        return
    saved = cast(ArrayRecord, context.state[STATE_KEY])
    client.learner.optimizer.load_state_dict(cast(dict[str, Any], unblob(saved["optimizer"])))
    client.feedback = ErrorFeedback(client.size, torch.from_numpy(saved["residual"].numpy().copy()))


def _save(client: FedClient, context: Context) -> None:
    residual = Array(client.feedback.residual.detach().to(torch.float32).numpy().copy())
    context.state[STATE_KEY] = ArrayRecord(
        {"optimizer": blob(client.learner.optimizer.state_dict()), "residual": residual}
    )


@app.train()
def train(msg: Message, context: Context) -> Message:
    scenario = scenario_of(context.run_config)
    fed = scenario.federated
    assert fed is not None  # scenario_of checked
    index = context.node_config.get("partition-id", -1)
    if not isinstance(index, int):
        raise ConfigError(f"node-config partition-id {index!r} is not a number")
    if not 0 <= index < fed.clients:
        raise ConfigError(f"node-config partition-id {index} is not a client of {fed.clients}")
    if scenario.torch_threads:
        torch.set_num_threads(scenario.torch_threads)
    task = get_task(scenario.task.name, **scenario.task.options)
    client = client_for(scenario, task, index)
    _restore(client, context)
    config = cast(ConfigRecord, msg.content["config"])
    round_idx = int(number(config, "server-round"))
    global_stats = global_stats_of(config)
    client.load_global(weights_of(cast(ArrayRecord, msg.content["arrays"])))
    result = client.local_round(round_idx, global_stats)
    submission = client.submission(round_idx, result, global_stats)
    _save(client, context)
    content = RecordDict(
        {
            "arrays": update_record(submission.update),
            "metrics": stats_record(submission.stats, client.size),
            "client": ConfigRecord({"name": client.name}),
        }
    )
    return Message(content=content, reply_to=msg)
