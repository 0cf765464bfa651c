"""The console's query parameters read into what the inspect queries take, or a 400's reason.

Each parse names the parameter it refuses (``bad parameter older_than: ...``); the pages answer
400 with that line.
"""

from __future__ import annotations

from processor.ops._filters import OUTCOMES, duration, list_filters

__all__ = ["OUTCOMES", "REFRESH_CHOICES", "duration", "list_filters"]

# Seconds between reloads the auto-refresh offers; anything else in `?refresh=` is ignored.
REFRESH_CHOICES = ("5", "10", "30", "60")
