"""The marker format of externalized media: reserved key names, stamps, and text fast paths.

The names and stamp values are byte-identical to pydantic-ai-harness 0.62 on purpose: a tree
externalized by either package restores with the other. Change none of them without a new
format stamp. `might_need_externalizing` and `has_markers` answer from the serialized text
whether walking a message can change it at all, so step stores skip the parse-and-walk for
almost every message.
"""

from __future__ import annotations

import re

# Reserved key names and stamp values. Byte-identical to pydantic-ai-harness 0.62 on purpose.
EXTERNAL_KEY = '__harness_external_media__'
TEXT_KEY = '__harness_external_text__'
URI_KEY = '__harness_external_uri__'
ESCAPED_KEYS_KEY = '__harness_external_escaped_keys__'
FORMAT_KEY = '__harness_external_marker_format__'
URLSAFE_KEY = '__harness_external_urlsafe__'
LITERAL_KEY = '__harness_external_literal__'
LEGACY_URI_KEY = 'uri'

ESCAPED_KEYS_FORMAT = 'escaped-keys-v1'
LITERAL_FORMAT = 'literal-v1'
URLSAFE_FORMAT = 'base64-urlsafe-v1'
ESCAPED_KEYS_FAMILY = 'escaped-keys-v'
LITERAL_FAMILY = 'literal-v'

MARKER_METADATA_KEYS = (EXTERNAL_KEY, TEXT_KEY, URI_KEY, ESCAPED_KEYS_KEY, FORMAT_KEY, URLSAFE_KEY)
"""Keys a marker writes itself.

A caller's node carrying any of them is never turned into a marker: the format's escape (a stash
restored after the other keys) would reorder the node's keys, so such a node stays inline, its
children walked, wrapped as a literal when it holds a trigger key. Markers written with the escape
by other writers still restore."""
LITERAL_TRIGGER_KEYS = (EXTERNAL_KEY, LITERAL_KEY)
TEXT_CONTENT_KINDS = ('text-content', 'structured-content')

RESERVED_KEY_PREFIX = '__harness_external_'
"""Every reserved key name starts with this, which is what the text fast paths look for."""

# A JSON string may spell a key with `\u00XX` escapes. Any escape of `_` or a lowercase letter
# could be hiding a reserved key, so the fast paths treat such text as "may matter".
ESCAPED_KEY_CHAR = re.compile(r'\\u00(?:5[fF]|[67][0-9a-fA-F])')


def mentions_reserved_key(json_text: str) -> bool:
    if RESERVED_KEY_PREFIX in json_text:
        return True
    return '\\u00' in json_text and ESCAPED_KEY_CHAR.search(json_text) is not None


def might_need_externalizing(json_text: str, threshold_bytes: int) -> bool:
    """Whether `externalize_media` could change the JSON tree that `json_text` encodes.

    `False` is a guarantee: walking the parsed text would return an equal tree and store nothing,
    so the caller may keep the text as it is. That holds when the text mentions no reserved key
    and either has no `"data"`/`"content"` key or is shorter than the threshold: a string inside
    JSON text never encodes to more UTF-8 bytes than the text itself, and base64 never decodes to
    more bytes than it has characters. A longer text is walked only if one of its strings is long
    enough (`_holds_a_long_string`). `True` only means "walk it to find out".
    """
    if mentions_reserved_key(json_text):
        return True
    length = len(json_text)
    if length * 4 < threshold_bytes:  # no key needs looking for: even 4-byte characters fall short
        return False
    if '"data"' not in json_text and '"content"' not in json_text:
        return False
    if length >= threshold_bytes:
        return _holds_a_long_string(json_text, threshold_bytes)
    if json_text.isascii():
        return False
    return len(json_text.encode('utf-8', 'surrogatepass')) >= threshold_bytes


def _holds_a_long_string(json_text: str, threshold_bytes: int) -> bool:
    """Whether a string in `json_text` may decode to `threshold_bytes` UTF-8 bytes or more.

    A large tool result made of many small values is over the threshold as a whole but holds no
    payload to move; parsing and walking it at every boundary cost more than serializing it. A
    string's decoded UTF-8 (and a base64 payload's bytes) is never longer than its spelling, whose
    escapes only shrink, and its spelling lies between two unescaped quotes: the longest run
    between unescaped quotes bounds every string, and runs between strings only make the bound
    larger. A run of `shortest` characters contains a whole block of `shortest // 2` starting at a
    multiple of that, so only the runs around blocks without a quote need measuring: a few searches
    that stop at the first quote of each block. An escaped quote only splits a run the unescaped
    ones would measure longer, so the quotes as written settle a long run at once, and the escapes
    are blanked out (same length) only when that leaves the answer open.
    """
    bytes_per_character = 1 if json_text.isascii() else 4
    shortest = -(-threshold_bytes // bytes_per_character)  # the shortest run that may hold a long string
    block = shortest // 2
    if not block:
        return _longest_run(_blank_escapes(json_text)) >= shortest
    if _long_run_around_a_bare_block(json_text, block, shortest):
        return True
    if '\\' not in json_text:
        return False  # every quote is unescaped, and no block without one sits in a long run
    return _long_run_around_a_bare_block(_blank_escapes(json_text), block, shortest)


def _long_run_around_a_bare_block(text: str, block: int, shortest: int) -> bool:
    """Whether a block of `text` without a quote lies in a run of `shortest` characters or more between quotes."""
    for start in range(0, len(text), block):
        if text.find('"', start, start + block) >= 0:
            continue
        after = text.find('"', start + block)
        if (after if after >= 0 else len(text)) - text.rfind('"', 0, start) - 1 >= shortest:
            return True
    return False


def _blank_escapes(json_text: str) -> str:
    """`json_text` with `\\\\` and `\\"` escapes blanked out, so every quote left is unescaped.

    Left to right, a run of backslashes pairs off as escaped backslashes, as a JSON reader reads
    it; one left over escapes what follows, which matters only when that is a quote.
    """
    return json_text.replace('\\\\', '__').replace('\\"', '__')


def _longest_run(text: str) -> int:
    return max(map(len, text.split('"')))


def has_markers(json_text: str) -> bool:
    """Whether `restore_media` could change the JSON tree that `json_text` encodes.

    Only markers (`__harness_external_media__`) and literal wrappers (`__harness_external_literal__`)
    are rewritten on restore; text that names neither comes back equal, so callers skip the walk.
    """
    if EXTERNAL_KEY in json_text or LITERAL_KEY in json_text:
        return True
    return '\\u00' in json_text and ESCAPED_KEY_CHAR.search(json_text) is not None
