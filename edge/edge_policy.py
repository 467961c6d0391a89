"""The edge's policy read from the settings: the API keys, the CORS origins and the body caps.

Its own module, below `guard.py` which applies it, so that the app's state (`state.py`) can hold it
without importing the hooks that read that state.
"""

from __future__ import annotations

import attrs

from edge.keys import load_keys, load_origins
from pipeline.settings import Settings

# Room for a form's other fields and its part headers beside the audio file.
_FORM_ROOM = 2**20


@attrs.frozen(kw_only=True)
class EdgePolicy:
    keys: tuple[bytes, ...] = ()
    origins: frozenset[str] = frozenset()
    max_body_bytes: int = 8 * 2**20
    max_audio_body_bytes: int = 25 * 2**20 + _FORM_ROOM
    max_file_body_bytes: int = 200 * 2**20 + _FORM_ROOM

    @classmethod
    def from_settings(cls, settings: Settings) -> EdgePolicy:
        """Raises: SettingsError for an unreadable key file or a malformed origin."""
        return cls(
            keys=load_keys(settings.api_key),
            origins=load_origins(settings.cors_origins),
            max_body_bytes=settings.max_body_bytes,
            max_audio_body_bytes=settings.audio_max_bytes + _FORM_ROOM,
            max_file_body_bytes=settings.files_max_bytes + _FORM_ROOM,
        )
