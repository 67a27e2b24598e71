"""Tool schemas shared by the tests (test data, not a test module).

``WEATHER`` is the tool the scripted ``chatml_tools`` model calls (``get_weather`` for Oslo).
"""

from __future__ import annotations

__all__ = ["WEATHER"]

WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Current weather of a city.",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string", "enum": ["Oslo", "Paris"]}},
            "required": ["city"],
        },
    },
}
