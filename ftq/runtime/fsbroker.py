"""The embedded broker: kombu's filesystem transport, with message files that appear whole.

kombu's own `_put` creates `<ms>_<uuid>.<queue>.msg` and only then writes into it. A consumer that
lists the folder in between moves the still-empty file away, fails to decode it, and the Celery
worker stops with "Unrecoverable error: JSONDecodeError" (and the message is gone). The beat in the
worker puts a message every second, so on a loaded host that window is hit often.

Here a message is written under a name no consumer takes (a leading dot, a `.tmp` suffix) and renamed
into place, so a consumer sees all of it or nothing. A file that still does not decode (one that
kombu's own `_put` left half written) is dropped with a warning instead of stopping the worker:
every ftq task is safe to lose (reconcile redoes submits and cancels, the next tick redoes a sweep).
"""

from __future__ import annotations

import contextlib
import logging
import os
import uuid
from time import monotonic
from typing import Any

from kombu.exceptions import ChannelError
from kombu.transport import filesystem
from kombu.utils.encoding import str_to_bytes
from kombu.utils.json import dumps

log = logging.getLogger(__name__)


class Channel(filesystem.Channel):
    # kombu's filesystem and abstract channels name this argument differently; mypy sees both.
    def _put(self, queue: Any, message: Any, **kwargs: Any) -> None:  # type: ignore[override]
        # Consumers take files in name order: zero-padded, so that order stays first-in first-out when
        # the millisecond count gains a digit.
        name = f"{round(monotonic() * 1000):016d}_{uuid.uuid4()}.{queue}.msg"
        final = os.path.join(self.data_folder_out, name)
        tmp = os.path.join(self.data_folder_out, f".{name}.tmp")
        try:
            with open(tmp, "wb") as f:
                f.write(str_to_bytes(dumps(message)))
            os.replace(tmp, final)
        except OSError as exc:
            with contextlib.suppress(OSError):
                os.unlink(tmp)
            raise ChannelError(f"Cannot add file {final!r} to directory") from exc

    def _get(self, queue: Any, timeout: Any = None) -> Any:
        while True:
            try:
                return super()._get(queue)
            except ValueError as exc:  # json.JSONDecodeError; kombu has already removed the file
                log.warning("embedded broker: dropped an unreadable message from %s: %s", queue, exc)


class Transport(filesystem.Transport):
    Channel = Channel
