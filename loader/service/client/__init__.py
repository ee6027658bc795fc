"""The trainer's side: the Client, its receiver thread, and batches as the training loop sees them."""

from loader.service.client.ask import query_status
from loader.service.client.client import Client

__all__ = ["Client", "query_status"]
