"""Move large payloads out of message trees (`externalize_media`) and back (`restore_media`).

The algorithm works on the JSON form of pydantic-ai messages (lists, dicts with string keys, and
scalars), because that is what step stores persist. Its marker layout, reserved key names and
escape rules are fixed for data compatibility with snapshots written by `pydantic-ai-harness`
0.62: a tree externalized by either package restores with the other. Change none of them without
a new format stamp.

Message objects (a `ModelMessage`, a single request or response part, or a list of them) are
accepted too. They are dumped to that JSON form, walked, and `restore_media` validates the result
back into the same classes. A message whose payload has moved out is no longer a valid
pydantic-ai message (`BinaryContent.data` and `TextPart.content` are required), so
`externalize_media` hands back the externalized JSON form in an `ExternalizedDict` or
`ExternalizedList`: plain `dict`/`list` subclasses, ready for `json.dumps`, that remember which
classes they came from so `restore_media` returns real message objects (with real
`BinaryContent`). Once such a value has been through `json.dumps`/`json.loads` it is ordinary
JSON again; validate the restored tree with `ModelMessagesTypeAdapter` to get messages back.

The marker format (reserved keys, stamps, and the text fast paths that let step stores skip the
walk) is `_markers`.
"""

from __future__ import annotations

import base64
import functools
import types
import typing
from collections.abc import Mapping, Sequence
from types import GenericAlias
from typing import Any, Generic, TypeVar, cast, overload

import pydantic
from pydantic_ai.messages import (
    ModelRequest,
    ModelRequestPart,
    ModelResponse,
    ModelResponsePart,
)

from ._context import MediaContext
from ._markers import (
    ESCAPED_KEYS_FAMILY,
    ESCAPED_KEYS_FORMAT,
    ESCAPED_KEYS_KEY,
    EXTERNAL_KEY,
    FORMAT_KEY,
    LEGACY_URI_KEY,
    LITERAL_FAMILY,
    LITERAL_FORMAT,
    LITERAL_KEY,
    LITERAL_TRIGGER_KEYS,
    MARKER_METADATA_KEYS,
    TEXT_CONTENT_KINDS,
    TEXT_KEY,
    URI_KEY,
    URLSAFE_FORMAT,
    URLSAFE_KEY,
)
from ._protocol import MediaStore
from ._uri import MEDIA_URI_PREFIX, media_uri_for, parse_media_uri

__all__ = ['ExternalizedDict', 'ExternalizedList', 'externalize_media', 'restore_media']

_JSON_SCALARS = (str, int, float, bool, type(None))

M = TypeVar('M')
_T = TypeVar('_T')


class ExternalizedDict(dict[str, Any], Generic[M]):
    """The externalized JSON form of one message or part, remembering its class.

    It is a plain `dict` for every other purpose (equality, `json.dumps`, storage);
    `restore_media` uses the remembered class to hand back a real message object.
    """

    pydantic_ai_type: type[M]

    def __init__(self, tree: dict[str, Any], pydantic_ai_type: type[M]) -> None:
        super().__init__(tree)
        self.pydantic_ai_type = pydantic_ai_type


class ExternalizedList(list[Any], Generic[M]):
    """The externalized JSON form of a list of messages or parts, remembering each element's class."""

    pydantic_ai_types: tuple[type[M], ...]

    def __init__(self, items: list[Any], pydantic_ai_types: tuple[type[M], ...]) -> None:
        super().__init__(items)
        self.pydantic_ai_types = pydantic_ai_types


# ----------------------------------------------------------------------------------------------
# Message objects <-> JSON form


def _union_members(tp: object) -> list[type]:
    origin = typing.get_origin(tp)
    if origin is typing.Annotated:
        return _union_members(typing.get_args(tp)[0])
    if origin is typing.Union or origin is types.UnionType:
        members: list[type] = []
        for arg in typing.get_args(tp):
            members.extend(_union_members(arg))
        return members
    return [tp] if isinstance(tp, type) else []


@functools.cache
def _message_classes() -> tuple[type, ...]:
    """Every class that is a message or a part in the installed pydantic-ai (the set varies by version)."""
    classes: list[type] = [ModelRequest, ModelResponse]
    for alias in (ModelRequestPart, ModelResponsePart):
        for member in _union_members(alias):
            if member not in classes:
                classes.append(member)
    return tuple(classes)


_BASE64_BYTES = pydantic.ConfigDict(ser_json_bytes='base64', val_json_bytes='base64', defer_build=True)


@functools.cache
def _adapter(cls: type) -> pydantic.TypeAdapter[list[Any]]:
    # A TypeAdapter takes no config for a bare dataclass, so wrap it in a list, as
    # `ModelMessagesTypeAdapter` does, to get the same bytes encoding as pydantic-ai's own dumps.
    return pydantic.TypeAdapter(cast(Any, GenericAlias(list, (cls,))), config=_BASE64_BYTES)


def _to_json(obj: object) -> dict[str, Any]:
    return _adapter(type(obj)).dump_python([obj], mode='json')[0]


def _from_json(cls: type[M], tree: object) -> M:
    return _adapter(cls).validate_python([tree])[0]


def _is_message_object(node: object) -> bool:
    return isinstance(node, _message_classes())


def _is_message_sequence(node: object) -> bool:
    if not isinstance(node, list | tuple) or not node:
        return False
    return all(_is_message_object(item) for item in cast(Sequence[object], node))


# ----------------------------------------------------------------------------------------------
# Walkers


def _unsupported(node: object) -> TypeError:
    kind = type(node)
    return TypeError(
        f'externalize_media cannot walk a {kind.__module__}.{kind.__qualname__}: pass a pydantic-ai message, '
        'a request/response part, a list of those, or their JSON form '
        "(ModelMessagesTypeAdapter.dump_python(messages, mode='json'))"
    )


class _Externalizer:
    def __init__(
        self, media_store: MediaStore, threshold_bytes: int, already_stored: Mapping[str, str] | None = None
    ) -> None:
        self._store = media_store
        self._threshold = threshold_bytes
        self._already_stored = already_stored or {}

    async def walk(self, node: object) -> Any:
        if isinstance(node, dict):
            return await self._dict(cast(dict[str, Any], node))
        if isinstance(node, list):
            return await self._list(cast(list[Any], node))
        if isinstance(node, _JSON_SCALARS):
            return node
        raise _unsupported(node)

    async def _list(self, node: list[Any]) -> list[Any]:
        out: list[Any] = []
        for item in node:
            out.append(item if isinstance(item, _JSON_SCALARS) else await self.walk(item))
        return out

    async def _fields(self, node: dict[str, Any], skip: str | None) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for key, value in node.items():
            if key != skip:
                out[key] = value if isinstance(value, _JSON_SCALARS) else await self.walk(value)
        return out

    async def _dict(self, node: dict[str, Any]) -> dict[str, Any]:
        kind = node.get('kind')
        data = node.get('data')
        stamps: dict[str, Any] | None = None
        payload = 'data'
        if any(key in node for key in MARKER_METADATA_KEYS):
            pass  # kept inline: see MARKER_METADATA_KEYS
        elif kind == 'binary' and isinstance(data, str):
            stamps = await self._binary(node, data)
        else:
            content = node.get('content')
            if isinstance(content, str) and (isinstance(node.get('part_kind'), str) or kind in TEXT_CONTENT_KINDS):
                stamps, payload = await self._text(node, content), 'content'
        if stamps is not None:
            # The other fields are walked here, not in `_binary`/`_text`: three frames a level of
            # nesting, so a tree as deep as pydantic-ai reads fits the recursion limit.
            marker = await self._fields(node, payload)
            marker.update(stamps)
            return marker
        walked = await self._fields(node, None)
        if any(key in node for key in LITERAL_TRIGGER_KEYS):
            return {LITERAL_KEY: walked, FORMAT_KEY: LITERAL_FORMAT}
        return walked

    async def _binary(self, node: dict[str, Any], data: str) -> dict[str, Any] | None:
        """The keys a binary's marker adds after its other fields, once its bytes are stored (`None`: inline)."""
        stored_uri = self._already_stored.get(data)
        if stored_uri is not None:
            return self._stored_binary(node, stored_uri)
        urlsafe = '-' in data or '_' in data
        if urlsafe and ('+' in data or '/' in data):
            return None
        # Strict base64 is padded to whole quads, so the decoded size is known without decoding:
        # small payloads (nearly all of them) cost no decode at all.
        if len(data) % 4:
            return None
        padding = 2 if data.endswith('==') else 1 if data.endswith('=') else 0
        if len(data) // 4 * 3 - padding < self._threshold:
            return None
        try:
            raw = base64.b64decode(data, altchars=b'-_' if urlsafe else None, validate=True)
        except ValueError:
            return None
        if len(raw) < self._threshold:
            return None
        canonical = base64.urlsafe_b64encode(raw) if urlsafe else base64.b64encode(raw)
        if canonical != data.encode('ascii') or _names_its_payload(node, raw):
            return None
        media_type = node.get('media_type')
        uri = await self._put(raw, MediaContext(media_type=media_type if isinstance(media_type, str) else None))
        stamps: dict[str, Any] = {EXTERNAL_KEY: True}
        if urlsafe:
            stamps[URLSAFE_KEY] = URLSAFE_FORMAT
        return self._finish(node, stamps, uri)

    def _stored_binary(self, node: dict[str, Any], uri: str) -> dict[str, Any]:
        """The marker keys for a payload the caller already put, standing in under a placeholder `data`.

        Stamped URL-safe: the bytes were serialized by pydantic, whose alphabet that is; restoring
        with it yields the same bytes whether or not the original text held `-` or `_`.
        """
        return self._finish(node, {EXTERNAL_KEY: True, URLSAFE_KEY: URLSAFE_FORMAT}, uri)

    async def _text(self, node: dict[str, Any], content: str) -> dict[str, Any] | None:
        """The keys a text's marker adds after its other fields, once its bytes are stored (`None`: inline)."""
        if len(content) * 4 < self._threshold:  # at most 4 UTF-8 bytes per code point
            return None
        raw = content.encode('utf-8', 'surrogatepass')
        if len(raw) < self._threshold or _names_its_payload(node, raw):
            return None
        uri = await self._put(raw, MediaContext(media_type='text/plain'))
        return self._finish(node, {EXTERNAL_KEY: True, TEXT_KEY: True}, uri)

    async def _put(self, raw: bytes, context: MediaContext) -> str:
        uri = await self._store.put(raw, context=context)
        parse_media_uri(uri)  # a store returning anything else would corrupt every marker it touches
        return uri

    @staticmethod
    def _finish(node: dict[str, Any], stamps: dict[str, Any], uri: str) -> dict[str, Any]:
        stamps[URI_KEY] = uri
        if LEGACY_URI_KEY not in node:
            # Mirrored for readers that only know the legacy `uri` key. A node with its own `uri`
            # keeps it, so such readers fail loudly rather than load the wrong bytes.
            stamps[LEGACY_URI_KEY] = uri
        return stamps


def _names_its_payload(node: dict[str, Any], raw: bytes) -> bool:
    """Whether the node's own `uri` is the URI its payload `raw` would be stored under.

    Such a node stays inline: a marker's `uri` equal to its payload's URI is taken on restore for
    the mirror written for legacy readers and dropped, so moved out, the node would lose its `uri`.
    """
    own = node.get(LEGACY_URI_KEY)
    return isinstance(own, str) and own.startswith(MEDIA_URI_PREFIX) and own == media_uri_for(raw)


class _Restorer:
    def __init__(self, media_store: MediaStore) -> None:
        self._store = media_store

    async def walk(self, node: object) -> Any:
        if isinstance(node, dict):
            return await self._dict(cast(dict[str, Any], node))
        if isinstance(node, list):
            out: list[Any] = []
            for item in cast(list[Any], node):
                out.append(item if isinstance(item, _JSON_SCALARS) else await self.walk(item))
            return out
        return node

    async def _values(self, node: dict[str, Any]) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for key, value in node.items():
            out[key] = value if isinstance(value, _JSON_SCALARS) else await self.walk(value)
        return out

    async def _dict(self, node: dict[str, Any]) -> dict[str, Any]:
        if len(node) == 2 and LITERAL_KEY in node and FORMAT_KEY in node:
            stamp = node[FORMAT_KEY]
            payload = node[LITERAL_KEY]
            if isinstance(stamp, str) and stamp.startswith(LITERAL_FAMILY) and isinstance(payload, dict):
                if stamp != LITERAL_FORMAT:
                    raise ValueError(
                        f'externalized media literal wrapper has an unsupported format: {stamp!r} '
                        f'(this version reads {LITERAL_FORMAT!r}); upgrade pydantic-ai-steps to read it'
                    )
                return await self._values(cast(dict[str, Any], payload))
        if node.get(EXTERNAL_KEY) is True:
            return await self._marker(node)
        return await self._values(node)

    async def _marker(self, node: dict[str, Any]) -> dict[str, Any]:
        drop = {EXTERNAL_KEY, TEXT_KEY}
        urlsafe = node.get(URLSAFE_KEY) == URLSAFE_FORMAT
        if urlsafe:
            drop.add(URLSAFE_KEY)

        stash: dict[str, Any] = {}
        candidate = node.get(ESCAPED_KEYS_KEY)
        stamp = node.get(FORMAT_KEY)
        if (
            isinstance(candidate, dict)
            and candidate
            and all(key in MARKER_METADATA_KEYS for key in cast(dict[str, Any], candidate))
            and isinstance(stamp, str)
            and stamp.startswith(ESCAPED_KEYS_FAMILY)
        ):
            if stamp != ESCAPED_KEYS_FORMAT:
                raise ValueError(
                    f'externalized media marker has an unsupported escaped-keys format: {stamp!r} '
                    f'(this version reads {ESCAPED_KEYS_FORMAT!r}); upgrade pydantic-ai-steps to read it'
                )
            stash = cast(dict[str, Any], candidate)
            drop.update((FORMAT_KEY, ESCAPED_KEYS_KEY))

        if URI_KEY in node:
            uri = node[URI_KEY]
            drop.add(URI_KEY)
            if LEGACY_URI_KEY in node and node[LEGACY_URI_KEY] == uri:
                drop.add(LEGACY_URI_KEY)
        else:  # a legacy marker: only the plain `uri` key
            uri = node.get(LEGACY_URI_KEY)
            drop.add(LEGACY_URI_KEY)
        if not isinstance(uri, str):
            raise ValueError(f'externalized media marker missing string uri: {uri!r}')

        is_text = node.get(TEXT_KEY) is True
        if is_text:
            context = MediaContext(media_type='text/plain')
        else:
            media_type = node.get('media_type')
            context = MediaContext(media_type=media_type if isinstance(media_type, str) else None)
        raw = await self._store.get(uri, context=context)

        out: dict[str, Any] = {}
        for key, value in node.items():
            if key not in drop:
                out[key] = value if isinstance(value, _JSON_SCALARS) else await self.walk(value)
        for key, value in stash.items():
            out[key] = value if isinstance(value, _JSON_SCALARS) else await self.walk(value)
        if is_text:
            out['content'] = bytes(raw).decode('utf-8', 'surrogatepass')
        else:
            encoded = base64.urlsafe_b64encode(raw) if urlsafe else base64.b64encode(raw)
            out['data'] = encoded.decode('ascii')
        return out


# ----------------------------------------------------------------------------------------------
# Public entry points


async def externalize_media(node: object, *, media_store: MediaStore, threshold_bytes: int) -> Any:
    """Write every payload of `threshold_bytes` or more to `media_store` and leave a marker in its place.

    Payloads are base64 `BinaryContent` data (size = decoded bytes) and the string `content` of
    parts and of `TextContent`/`StructuredContent` (size = UTF-8 bytes); bare strings in a user
    prompt's content list never move, nor does a payload whose node's own `uri` is the payload's
    media URI (`_names_its_payload`). The input is never mutated. A JSON tree comes back as a new
    JSON tree; message objects come back as their externalized JSON form in an `ExternalizedDict`
    or `ExternalizedList` (see the module docstring for why). Anything else raises `TypeError`.

    Typed `Any` rather than overloaded: its usual input is `json.loads` output (itself `Any`),
    for which overloads would resolve to Unknown under strict checking. Annotate the result
    (`lean: ExternalizedList[ModelMessage] = ...`) to keep `restore_media` precisely typed.
    """
    walker = _Externalizer(media_store, threshold_bytes)
    if _is_message_object(node):
        return ExternalizedDict(await walker.walk(_to_json(node)), type(node))
    if _is_message_sequence(node):
        items = cast(Sequence[object], node)
        walked = [await walker.walk(_to_json(item)) for item in items]
        return ExternalizedList(walked, tuple(type(item) for item in items))
    return await walker.walk(node)


async def externalize_tree(
    tree: object, *, media_store: MediaStore, threshold_bytes: int, already_stored: Mapping[str, str]
) -> Any:
    """`externalize_media` on a JSON tree whose binaries may already be in `media_store`.

    `already_stored` maps a placeholder `data` string to the URI of the payload it stands for.
    Step stores put large `BinaryContent` bytes straight from the message objects, so the bytes
    are hashed once and never base64-encoded, parsed and decoded again just to be moved out.
    """
    return await _Externalizer(media_store, threshold_bytes, already_stored).walk(tree)


@overload
async def restore_media(node: ExternalizedDict[M], *, media_store: MediaStore) -> M: ...
@overload
async def restore_media(node: ExternalizedList[M], *, media_store: MediaStore) -> list[M]: ...
@overload
async def restore_media(node: _T, *, media_store: MediaStore) -> _T: ...
async def restore_media(node: object, *, media_store: MediaStore) -> object:
    """Replace every marker written by `externalize_media` with the payload it points to.

    JSON trees come back as new JSON trees; values that are not JSON are returned unchanged, as
    upstream does. An `ExternalizedDict`/`ExternalizedList`, a message object or a list of them
    comes back as message objects of the same classes. Raises `ValueError` for a marker written
    in a format this version does not know, and whatever the store raises for a missing blob.
    """
    walker = _Restorer(media_store)
    if isinstance(node, ExternalizedDict):
        lean = cast(ExternalizedDict[Any], node)
        return _from_json(lean.pydantic_ai_type, await walker.walk(dict(lean)))
    if isinstance(node, ExternalizedList):
        lean_list = cast(ExternalizedList[Any], node)
        if len(lean_list) != len(lean_list.pydantic_ai_types):
            raise ValueError(
                f'ExternalizedList holds {len(lean_list)} items but remembers {len(lean_list.pydantic_ai_types)} '
                'message classes; it was changed after externalize_media, so restore a plain list instead'
            )
        restored: list[Any] = []
        for cls, item in zip(lean_list.pydantic_ai_types, lean_list, strict=True):
            restored.append(_from_json(cls, await walker.walk(item)))
        return restored
    if _is_message_object(node):
        return _from_json(type(node), await walker.walk(_to_json(node)))
    if _is_message_sequence(node):
        return [_from_json(type(item), await walker.walk(_to_json(item))) for item in cast(Sequence[object], node)]
    return await walker.walk(node)
