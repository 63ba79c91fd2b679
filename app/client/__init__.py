"""A typed client for the chit-chat retrieval service, sync and async, on httpx.

It imports nothing from the server: only the standard library, httpx, pydantic and tqdm.

    from app.client import ChitchatClient

    with ChitchatClient("http://127.0.0.1:8000") as chitchat:
        print(chitchat.reply(["hi! how are you?"]).reply)
"""

from app.client import errors, models
from app.client._async import AsyncChitchatClient
from app.client._sync import ChitchatClient
from app.client.errors import *  # noqa: F403  (errors.__all__: the exceptions)
from app.client.models import *  # noqa: F403  (models.__all__: the response models)

__all__ = ["AsyncChitchatClient", "ChitchatClient"]
__all__ += errors.__all__
__all__ += models.__all__
