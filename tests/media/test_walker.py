"""`externalize_media` / `restore_media`: the upstream marker format, exact round trips, message objects."""

from __future__ import annotations

import base64
import copy
import inspect
import json
import pickle
import re
import sys
from collections.abc import Mapping
from datetime import UTC, datetime
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pydantic_ai.messages import (
    BinaryContent,
    BinaryImage,
    FilePart,
    ModelMessage,
    ModelMessagesTypeAdapter,
    ModelRequest,
    ModelResponse,
    StructuredContent,
    SystemPromptPart,
    TextContent,
    TextPart,
    ToolReturnPart,
    UserPromptPart,
)

from pydantic_ai_steps.media import MediaContext, externalize_media, media_uri_for, restore_media
from pydantic_ai_steps.media._context import EMPTY_CONTEXT
from pydantic_ai_steps.media._markers import (
    ESCAPED_KEYS_KEY,
    EXTERNAL_KEY,
    FORMAT_KEY,
    LITERAL_KEY,
    TEXT_KEY,
    URI_KEY,
    URLSAFE_KEY,
    _holds_a_long_string,  # pyright: ignore[reportPrivateUsage]
    has_markers,
    might_need_externalizing,
)
from pydantic_ai_steps.media._walker import ExternalizedDict, ExternalizedList

pytestmark = pytest.mark.anyio
T0 = datetime(2026, 1, 2, 3, 4, 5, tzinfo=UTC)
KIB = 1024


class RecordingStore:
    """A dict-backed `MediaStore` that records the context of every call."""

    def __init__(self) -> None:
        self.blobs: dict[str, bytes] = {}
        self.puts: list[tuple[str, MediaContext]] = []
        self.gets: list[tuple[str, MediaContext]] = []

    async def put(self, data: bytes, *, context: MediaContext = EMPTY_CONTEXT) -> str:
        uri = media_uri_for(data)
        self.blobs[uri] = bytes(data)
        self.puts.append((uri, context))
        return uri

    async def get(self, uri: str, *, context: MediaContext = EMPTY_CONTEXT) -> bytes:
        self.gets.append((uri, context))
        try:
            return self.blobs[uri]
        except KeyError:
            raise FileNotFoundError(f'media not found: {uri}') from None

    async def exists(self, uri: str, *, context: MediaContext = EMPTY_CONTEXT) -> bool:
        return uri in self.blobs

    async def public_url(self, uri: str, *, context: MediaContext = EMPTY_CONTEXT) -> str | None:
        return None

    async def get_metadata(self, uri: str, *, context: MediaContext = EMPTY_CONTEXT) -> Mapping[str, str]:
        return {}


def compact(tree: object) -> str:
    return json.dumps(tree, separators=(',', ':'))


async def round_trip(tree: object, threshold: int, store: RecordingStore | None = None) -> object:
    store = store or RecordingStore()
    before = copy.deepcopy(tree)
    lean = await externalize_media(tree, media_store=store, threshold_bytes=threshold)
    assert tree == before, 'externalize_media mutated its input'
    full = await restore_media(lean, media_store=store)
    assert lean == await externalize_media(tree, media_store=store, threshold_bytes=threshold)
    return full


# -- the reference's worked examples, byte for byte ------------------------------------------------


async def test_worked_example_urlsafe_binary_with_its_own_uri() -> None:
    store = RecordingStore()
    node = {'kind': 'binary', 'data': '-__7__v_-__7__v_-__7_w==', 'media_type': 'image/png', 'uri': 'mine'}
    lean = await externalize_media(node, media_store=store, threshold_bytes=16)
    assert compact(lean) == (
        '{"kind":"binary","media_type":"image/png","uri":"mine","__harness_external_media__":true,'
        '"__harness_external_urlsafe__":"base64-urlsafe-v1","__harness_external_uri__":'
        '"media+sha256://ad49f039cfeee357096f67f767bfffdef429a3d93708003b0b35931c08b116ff"}'
    )
    assert store.puts[0][1] == MediaContext(media_type='image/png')
    assert await restore_media(lean, media_store=store) == node
    assert store.gets[0][1] == MediaContext(media_type='image/png')


async def test_escaped_caller_keys_from_other_writers_restore() -> None:
    """The reference's escaping example: a text part whose caller keys collide with the marker's."""
    store = RecordingStore()
    node = {
        'content': 'qqqqqqqqqqqqqqqq',
        'part_kind': 'text',
        '__harness_external_uri__': 'caller',
        '__harness_external_media__': 'c2',
    }
    uri = await store.put(b'q' * 16)
    written_elsewhere = json.loads(
        '{"part_kind":"text","__harness_external_marker_format__":"escaped-keys-v1",'
        '"__harness_external_escaped_keys__":{"__harness_external_media__":"c2","__harness_external_uri__":"caller"},'
        '"__harness_external_media__":true,"__harness_external_text__":true,'
        f'"__harness_external_uri__":"{uri}","uri":"{uri}"}}'
    )
    assert await restore_media(written_elsewhere, media_store=store) == node


async def test_nodes_with_reserved_keys_stay_inline_so_key_order_survives() -> None:
    store = RecordingStore()
    node = {
        'content': 'qqqqqqqqqqqqqqqq',
        'part_kind': 'text',
        '__harness_external_uri__': 'caller',
        '__harness_external_media__': 'c2',
    }
    lean = await externalize_media(node, media_store=store, threshold_bytes=16)
    assert store.puts == []
    assert lean == {'__harness_external_literal__': node, '__harness_external_marker_format__': 'literal-v1'}
    assert compact(await restore_media(lean, media_store=store)) == compact(node)


# -- what moves and what stays ---------------------------------------------------------------------


@pytest.mark.parametrize(('size', 'moves'), [(15, False), (16, True), (17, True)])
async def test_binary_threshold_is_inclusive_on_decoded_size(size: int, moves: bool) -> None:
    data = base64.b64encode(bytes(range(size))).decode()
    node = {'kind': 'binary', 'data': data, 'media_type': 'application/octet-stream'}
    lean = await externalize_media(node, media_store=RecordingStore(), threshold_bytes=16)
    assert (lean != node) is moves
    if moves:
        assert 'data' not in lean
        assert URLSAFE_KEY not in lean  # the standard alphabet needs no stamp
        assert lean['uri'] == lean[URI_KEY] == media_uri_for(bytes(range(size)))


@pytest.mark.parametrize(('text', 'moves'), [('é' * 7, False), ('é' * 8, True), ('a' * 15, False), ('a' * 16, True)])
async def test_text_threshold_counts_utf8_bytes(text: str, moves: bool) -> None:
    node = {'content': text, 'part_kind': 'user-prompt'}
    store = RecordingStore()
    lean = await externalize_media(node, media_store=store, threshold_bytes=16)
    assert (lean != node) is moves
    if moves:
        assert lean[TEXT_KEY] is True
        assert store.blobs[lean[URI_KEY]] == text.encode()
    assert await restore_media(lean, media_store=store) == node


async def test_unpaired_surrogates_round_trip() -> None:
    node = {'content': 'x\ud800y' * 10, 'part_kind': 'text'}
    assert await round_trip(node, 8) == node


@pytest.mark.parametrize(
    'data',
    [
        'QUJDREVGR0hJSktMTU5PUA=',  # missing padding
        'QUJDREVGR0hJSktMTU5PUB==',  # non-canonical padding bits
        'QUJDREVGR0hJSktMTU5PUA==\n',  # trailing newline
        'QUJD-EVGR0hJSktMTU5P+A==',  # mixed alphabets
        'not base64 at all, really!',
        'QUJDREVGR0hJSktMTU5PUA==QUI=',  # padding in the middle
        'ÄUJDREVGR0hJSktMTU5PUA==',  # non-ASCII
    ],
)
async def test_binary_shaped_dicts_that_are_not_canonical_base64_stay_inline(data: str) -> None:
    node = {'kind': 'binary', 'data': data, 'content': 'c' * 64, 'part_kind': 'text'}
    store = RecordingStore()
    assert await externalize_media(node, media_store=store, threshold_bytes=4) == node
    assert store.puts == []  # and a failed binary attempt is not retried as text


async def test_text_candidates() -> None:
    big = 'z' * 32
    tree = [
        {'content': big, 'part_kind': 'system-prompt'},
        {'content': big, 'kind': 'text-content'},
        {'content': big, 'kind': 'structured-content', 'value': {'k': big}},
        {'content': big},  # neither part_kind nor a text-content kind
        {'content': big, 'part_kind': None},
        {'content': ['bare', big], 'part_kind': 'user-prompt'},
    ]
    lean = await externalize_media(tree, media_store=RecordingStore(), threshold_bytes=32)
    assert [EXTERNAL_KEY in item for item in lean] == [True, True, True, False, False, False]
    assert lean[2]['value'] == {'k': big}  # structured content keeps its value inline
    assert lean[5]['content'] == ['bare', big]  # bare strings never move
    assert await round_trip(tree, 32) == tree


async def test_nested_payloads_inside_a_marker_are_externalized_too() -> None:
    inner = {'kind': 'binary', 'data': base64.b64encode(b'i' * 40).decode(), 'media_type': 'image/gif'}
    node = {'content': 'o' * 40, 'part_kind': 'tool-return', 'metadata': {'attachment': inner}}
    store = RecordingStore()
    lean = await externalize_media(node, media_store=store, threshold_bytes=32)
    assert lean['metadata']['attachment'][EXTERNAL_KEY] is True
    assert [context.media_type for _, context in store.puts] == ['text/plain', 'image/gif']  # own payload first
    assert await restore_media(lean, media_store=store) == node


async def test_caller_dicts_with_trigger_keys_are_wrapped_as_literals() -> None:
    tree = {
        'a': {EXTERNAL_KEY: True, 'uri': media_uri_for(b'x')},
        'b': {LITERAL_KEY: {'x': 1}, FORMAT_KEY: 'literal-v1'},
        'c': {FORMAT_KEY: 'escaped-keys-v1', ESCAPED_KEYS_KEY: {URI_KEY: 'u'}},
    }
    lean = await externalize_media(tree, media_store=RecordingStore(), threshold_bytes=1)
    assert lean['a'] == {LITERAL_KEY: tree['a'], FORMAT_KEY: 'literal-v1'}
    assert lean['b'] == {LITERAL_KEY: tree['b'], FORMAT_KEY: 'literal-v1'}
    assert lean['c'] == tree['c']  # no trigger key: not wrapped, and restore leaves it alone
    assert await restore_media(lean, media_store=RecordingStore()) == tree


async def test_double_externalize_needs_two_restores() -> None:
    store = RecordingStore()
    node = {'content': 'd' * 20, 'part_kind': 'text'}
    once = await externalize_media(node, media_store=store, threshold_bytes=8)
    twice = await externalize_media(once, media_store=store, threshold_bytes=8)
    assert twice == {LITERAL_KEY: once, FORMAT_KEY: 'literal-v1'}
    assert await restore_media(twice, media_store=store) == once
    assert await restore_media(await restore_media(twice, media_store=store), media_store=store) == node


async def test_a_tree_as_deep_as_pydantic_ai_reads_is_walked_in_three_frames_a_level() -> None:
    """A tool's return may nest 196 levels (pydantic-ai reads 200, the history's list and the part among
    them), each with a payload to move: both walks must fit the recursion limit below an agent run's
    own frames (some 250 deep, more in a delegate), not use it up."""
    store = RecordingStore()
    depth = 196
    tree: object = 'bottom'
    for level in range(depth):
        tree = {'part_kind': 'section', 'inner': tree, 'content': f'{level:04}' * 8}
    limit = sys.getrecursionlimit()
    sys.setrecursionlimit(len(inspect.stack(0)) + 3 * depth + 40)
    try:
        lean = await externalize_media(tree, media_store=store, threshold_bytes=16)
        restored = await restore_media(lean, media_store=store)
    finally:
        sys.setrecursionlimit(limit)
    assert len(store.puts) == depth and compact(restored) == compact(tree)


# -- restore rules -------------------------------------------------------------------------------


async def test_legacy_marker_with_only_uri_restores() -> None:
    store = RecordingStore()
    uri = await store.put(b'legacy bytes')
    marker = {'kind': 'binary', 'media_type': 'image/png', EXTERNAL_KEY: True, 'uri': uri}
    restored = await restore_media(marker, media_store=store)
    assert restored == {'kind': 'binary', 'media_type': 'image/png', 'data': base64.b64encode(b'legacy bytes').decode()}


async def test_own_uri_that_differs_is_kept_on_restore() -> None:
    store = RecordingStore()
    uri = await store.put(b'payload')
    marker = {'kind': 'binary', 'uri': 'https://example.com/a.png', EXTERNAL_KEY: True, URI_KEY: uri}
    restored = await restore_media(marker, media_store=store)
    assert restored['uri'] == 'https://example.com/a.png'


async def test_a_node_whose_own_uri_names_its_payload_stays_inline_and_keeps_it() -> None:
    """Moved out, its `uri` would read as the marker's mirror of the payload's URI and be dropped."""
    store = RecordingStore()
    image, text = b'\x89PNG' * 8, 'a quoted document. ' * 2
    tree = [
        {'kind': 'binary', 'data': base64.b64encode(image).decode(), 'uri': media_uri_for(image)},
        {'part_kind': 'text', 'content': text, 'uri': media_uri_for(text.encode())},
        {'kind': 'text-content', 'content': text, 'uri': media_uri_for(b'other bytes')},  # moves, keeps its uri
    ]
    lean = await externalize_media(tree, media_store=store, threshold_bytes=16)
    assert lean[:2] == tree[:2] and lean[2][EXTERNAL_KEY] is True
    assert await restore_media(lean, media_store=store) == tree


@pytest.mark.parametrize(
    ('node', 'message'),
    [
        ({LITERAL_KEY: {'a': 1}, FORMAT_KEY: 'literal-v2'}, 'literal wrapper has an unsupported format'),
        (
            {EXTERNAL_KEY: True, FORMAT_KEY: 'escaped-keys-v2', ESCAPED_KEYS_KEY: {URI_KEY: 'x'}, 'uri': 'u'},
            'unsupported escaped-keys format',
        ),
        ({EXTERNAL_KEY: True, URI_KEY: 7}, 'missing string uri: 7'),
        ({EXTERNAL_KEY: True}, 'missing string uri: None'),
    ],
)
async def test_restore_rejects_unknown_formats_and_missing_uris(node: dict[str, Any], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        await restore_media([node], media_store=RecordingStore())


async def test_look_alikes_that_are_not_markers_or_wrappers_are_plain_data() -> None:
    tree = [
        {EXTERNAL_KEY: 1, 'uri': 'x'},  # not exactly true
        {LITERAL_KEY: {'a': 1}, FORMAT_KEY: 'literal-v1', 'extra': 0},  # more keys than a wrapper
        {LITERAL_KEY: [1], FORMAT_KEY: 'literal-v1'},  # payload not a dict
        {LITERAL_KEY: {'a': 1}, FORMAT_KEY: 'other'},  # stamp of another family
    ]
    assert await restore_media(tree, media_store=RecordingStore()) == tree


async def test_missing_blob_propagates_file_not_found() -> None:
    marker = {EXTERNAL_KEY: True, URI_KEY: media_uri_for(b'gone')}
    with pytest.raises(FileNotFoundError):
        await restore_media(marker, media_store=RecordingStore())


@pytest.mark.parametrize('value', [b'bytes', (1, 2), datetime(2026, 1, 1), {1, 2}, object()])
async def test_externalize_rejects_non_json_values_naming_the_type(value: object) -> None:
    with pytest.raises(TypeError, match=type(value).__qualname__):
        await externalize_media({'nested': [value]}, media_store=RecordingStore(), threshold_bytes=1)
    assert await restore_media(value, media_store=RecordingStore()) is value  # upstream passes them through


# -- message objects ------------------------------------------------------------------------------


def image_bytes(size: int) -> bytes:
    return bytes((index * 7 + 3) % 256 for index in range(size))


def rich_history() -> list[ModelMessage]:
    return [
        ModelRequest(
            parts=[
                SystemPromptPart('be brief', timestamp=T0),
                UserPromptPart(
                    ['look at this', BinaryContent(data=image_bytes(70 * KIB), media_type='image/png')],
                    timestamp=T0,
                ),
            ],
            timestamp=T0,
        ),
        ModelResponse(
            parts=[
                TextPart('here you go'),
                FilePart(content=BinaryImage(data=image_bytes(80 * KIB), media_type='image/png')),
            ],
            timestamp=T0,
        ),
        ModelRequest(
            parts=[ToolReturnPart('fetch', 'r' * (70 * KIB), tool_call_id='call-1', timestamp=T0)], timestamp=T0
        ),
    ]


async def test_message_list_round_trips_into_real_messages() -> None:
    store = RecordingStore()
    history = rich_history()
    lean = await externalize_media(history, media_store=store, threshold_bytes=64 * KIB)
    assert isinstance(lean, ExternalizedList)
    assert len(store.blobs) == 3
    lean_text = json.dumps(lean)
    assert len(lean_text) < 8 * KIB
    assert has_markers(lean_text)

    full = await restore_media(lean, media_store=store)
    assert ModelMessagesTypeAdapter.dump_json(full) == ModelMessagesTypeAdapter.dump_json(history)
    request = full[0]
    assert isinstance(request, ModelRequest)
    prompt = request.parts[1]
    assert isinstance(prompt, UserPromptPart)
    assert isinstance(prompt.content[1], BinaryContent)
    assert prompt.content[1].data == image_bytes(70 * KIB)
    response = full[1]
    assert isinstance(response, ModelResponse)
    file_part = response.parts[1]
    assert isinstance(file_part, FilePart)
    assert isinstance(file_part.content, BinaryImage)


async def test_single_message_single_part_and_list_of_parts() -> None:
    store = RecordingStore()
    response = rich_history()[1]
    assert isinstance(response, ModelResponse)
    lean_message = await externalize_media(response, media_store=store, threshold_bytes=64 * KIB)
    assert isinstance(lean_message, ExternalizedDict)
    restored_message = await restore_media(lean_message, media_store=store)
    assert isinstance(restored_message, ModelResponse)
    assert ModelMessagesTypeAdapter.dump_json([restored_message]) == ModelMessagesTypeAdapter.dump_json([response])

    part = ToolReturnPart('fetch', 't' * (70 * KIB), tool_call_id='c', timestamp=T0)
    lean_part = await externalize_media(part, media_store=store, threshold_bytes=64 * KIB)
    assert lean_part[TEXT_KEY] is True
    assert 'content' not in lean_part
    restored_part = await restore_media(lean_part, media_store=store)
    assert isinstance(restored_part, ToolReturnPart)
    assert restored_part.content == part.content

    parts = [TextPart('x' * (65 * KIB)), part, UserPromptPart('small', timestamp=T0)]
    lean_parts = await externalize_media(parts, media_store=store, threshold_bytes=64 * KIB)
    restored_parts = await restore_media(lean_parts, media_store=store)
    assert [type(item) for item in restored_parts] == [TextPart, ToolReturnPart, UserPromptPart]
    wrap = ModelMessagesTypeAdapter.dump_json
    assert wrap([ModelResponse(parts=[restored_parts[0]], timestamp=T0)]) == wrap(
        [ModelResponse(parts=[parts[0]], timestamp=T0)]
    )
    assert wrap([ModelRequest(parts=restored_parts[1:], timestamp=T0)]) == wrap(
        [ModelRequest(parts=parts[1:], timestamp=T0)]
    )


async def test_text_and_structured_content_objects_round_trip() -> None:
    store = RecordingStore()
    prompt = UserPromptPart(
        [TextContent('w' * 100), StructuredContent({'rows': list(range(5))}, content='s' * 100)], timestamp=T0
    )
    request = ModelRequest(parts=[prompt], timestamp=T0)
    lean = await externalize_media(request, media_store=store, threshold_bytes=64)
    assert len(store.blobs) == 2
    restored = await restore_media(lean, media_store=store)
    assert ModelMessagesTypeAdapter.dump_json([restored]) == ModelMessagesTypeAdapter.dump_json([request])


async def test_externalized_values_survive_pickle_and_plain_json() -> None:
    store = RecordingStore()
    history = rich_history()
    lean = await externalize_media(history, media_store=store, threshold_bytes=64 * KIB)
    unpickled = pickle.loads(pickle.dumps(lean))
    assert isinstance(unpickled, ExternalizedList)
    restored = await restore_media(unpickled, media_store=store)
    assert ModelMessagesTypeAdapter.dump_json(restored) == ModelMessagesTypeAdapter.dump_json(history)

    plain = json.loads(json.dumps(lean))  # through storage: ordinary JSON again
    restored_json = await restore_media(plain, media_store=store)
    assert ModelMessagesTypeAdapter.validate_python(restored_json) == ModelMessagesTypeAdapter.validate_python(
        ModelMessagesTypeAdapter.dump_python(history, mode='json')
    )


async def test_message_objects_without_markers_restore_to_equal_objects() -> None:
    history = rich_history()
    restored = await restore_media(history, media_store=RecordingStore())
    assert ModelMessagesTypeAdapter.dump_json(restored) == ModelMessagesTypeAdapter.dump_json(history)


async def test_changed_externalized_list_is_refused() -> None:
    store = RecordingStore()
    lean = await externalize_media(rich_history(), media_store=store, threshold_bytes=64 * KIB)
    lean.append({'kind': 'request', 'parts': []})
    with pytest.raises(ValueError, match='holds 4 items but remembers 3'):
        await restore_media(lean, media_store=store)


async def test_json_form_of_messages_matches_object_form() -> None:
    history = rich_history()
    store = RecordingStore()
    from_objects = await externalize_media(history, media_store=store, threshold_bytes=64 * KIB)
    from_json = await externalize_media(
        json.loads(ModelMessagesTypeAdapter.dump_json(history)), media_store=store, threshold_bytes=64 * KIB
    )
    assert type(from_json) is list
    assert from_json == from_objects


# -- fast paths ----------------------------------------------------------------------------------


def test_might_need_externalizing_on_plain_text() -> None:
    assert not might_need_externalizing('{"content":"hi","part_kind":"text"}', 64)
    assert might_need_externalizing('{"content":"' + 'a' * 64 + '","part_kind":"text"}', 64)
    assert not might_need_externalizing('{"content":"' + 'a' * 60 + '","part_kind":"text"}', 64)  # no string that long
    assert not might_need_externalizing('{"args":"' + 'a' * 100 + '"}', 64)  # no payload key at all
    assert might_need_externalizing('{"__harness_external_media__":1}', 10_000)
    assert might_need_externalizing('{"\\u005f_harness_external_media__":1,"content":""}', 10_000)
    assert not might_need_externalizing('{"content":"caf\\u00e9"}', 10_000)  # an escape, but not of a key char
    # 20 three-byte characters: 34 characters of JSON text but 74 bytes of UTF-8.
    text = '{"content":"' + '€' * 20 + '"}'
    assert might_need_externalizing(text, 74)
    assert not might_need_externalizing(text, 75)
    assert might_need_externalizing('{"content":""}', 0)


@settings(max_examples=500, deadline=None)
@given(
    text=st.text(alphabet=st.sampled_from(['"', '\\', 'a', 'é', 'u']), max_size=300),
    threshold=st.integers(min_value=0, max_value=200),
)
def test_the_long_string_test_is_the_longest_run_between_unescaped_quotes(text: str, threshold: int) -> None:
    """The block shortcut answers as measuring every run would."""
    blanked = re.sub(r'\\.', '__', text, flags=re.DOTALL)
    longest = max(len(run) for run in blanked.split('"'))
    expected = longest * (1 if text.isascii() else 4) >= threshold
    assert _holds_a_long_string(text, threshold) == expected


def test_a_large_text_is_walked_only_if_one_of_its_strings_is_long_enough() -> None:
    """A tool result over the threshold made of many small values holds nothing to move."""
    rows = json.dumps({'content': [{'name': f'item {i}', 'score': i} for i in range(200)]}, separators=(',', ':'))
    assert len(rows) > 1000
    assert not might_need_externalizing(rows, 1000)
    assert might_need_externalizing(rows, 8)  # 'item 123' is eight bytes
    long_one = '{"content":"' + 'a' * 999 + '","part_kind":"text"}'
    assert not might_need_externalizing(long_one, 1000)
    assert might_need_externalizing(long_one, 999)
    # Escaped quotes do not cut a string short: one string of 981 characters, in pieces of 100.
    quoted = '{"content":"' + ('a' * 99 + '\\"') * 9 + 'a' * 81 + '","part_kind":"text"}'
    assert len(json.loads(quoted)['content']) == 981
    assert might_need_externalizing(quoted, 981)
    assert not might_need_externalizing(quoted, 1300)
    # An escaped backslash right before the closing quote ends the string there.
    assert not might_need_externalizing('{"content":"ab\\\\","x":"' + 'b' * 10 + '"}', 12)
    # Non-ASCII: up to four UTF-8 bytes a character.
    accented = '{"content":"' + 'é' * 300 + '","part_kind":"text"}'
    assert might_need_externalizing(accented, 600)  # 600 bytes as UTF-8
    assert not might_need_externalizing(accented, 1201)


def test_has_markers() -> None:
    assert not has_markers('{"content":"hi","uri":"media+sha256://x"}')
    assert has_markers('{"__harness_external_media__":true}')
    assert has_markers('{"__harness_external_literal__":{}}')
    assert has_markers('{"\\u005F_harness_external_literal__":{}}')


# -- properties ----------------------------------------------------------------------------------

RESERVED_AND_SHAPE_KEYS = [
    EXTERNAL_KEY,
    TEXT_KEY,
    URI_KEY,
    ESCAPED_KEYS_KEY,
    FORMAT_KEY,
    URLSAFE_KEY,
    LITERAL_KEY,
    'uri',
    'kind',
    'data',
    'content',
    'part_kind',
    'media_type',
    'value',
]
SPECIAL_STRINGS = [
    'binary',
    'text-content',
    'structured-content',
    'text',
    'literal-v1',
    'literal-v2',
    'escaped-keys-v1',
    'escaped-keys-v9',
    'base64-urlsafe-v1',
    'image/png',
    media_uri_for(b'a look-alike'),
    'QUJDREVGR0hJSktMTU5PUB==',
    '-_-_-_-_',
    '++//++//',
]

scalars = (
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**53), max_value=2**53)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(st.characters(blacklist_categories=()), max_size=40)
    | st.sampled_from(SPECIAL_STRINGS)
    | st.binary(max_size=40).map(lambda raw: base64.b64encode(raw).decode())
    | st.binary(max_size=40).map(lambda raw: base64.urlsafe_b64encode(raw).decode())
)
keys = st.sampled_from(RESERVED_AND_SHAPE_KEYS) | st.text(max_size=6)
base64_data = (
    st.binary(max_size=40).map(lambda raw: base64.b64encode(raw).decode())
    | st.binary(max_size=40).map(lambda raw: base64.urlsafe_b64encode(raw).decode())
    | st.sampled_from(SPECIAL_STRINGS)
)
texts = st.text(st.characters(blacklist_categories=()), max_size=40)


def shaped_dicts(children: st.SearchStrategy[Any]) -> st.SearchStrategy[dict[str, Any]]:
    """Dicts shaped like payload carriers, with any reserved or look-alike keys added."""
    extras = {key: children for key in RESERVED_AND_SHAPE_KEYS}
    text_parts = st.fixed_dictionaries(
        {'content': texts, 'part_kind': st.sampled_from(['text', 'tool-return', 'user-prompt'])},
        optional={key: value for key, value in extras.items() if key not in ('content', 'part_kind')},
    )
    text_items = st.fixed_dictionaries(
        {'content': texts, 'kind': st.sampled_from(['text-content', 'structured-content'])},
        optional={key: value for key, value in extras.items() if key not in ('content', 'kind')},
    )
    binaries = st.fixed_dictionaries(
        {'kind': st.just('binary'), 'data': base64_data},
        optional={
            'media_type': st.sampled_from(['image/png', 'audio/wav']) | children,
            **{key: value for key, value in extras.items() if key not in ('kind', 'data', 'media_type')},
        },
    )
    return text_parts | text_items | binaries


json_trees = st.recursive(
    scalars,
    lambda children: (
        st.lists(children, max_size=4) | st.dictionaries(keys, children, max_size=7) | shaped_dicts(children)
    ),
    max_leaves=40,
)


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(tree=json_trees, threshold=st.integers(min_value=0, max_value=24))
async def test_arbitrary_json_trees_round_trip_exactly(tree: object, threshold: int) -> None:
    store = RecordingStore()
    lean = await externalize_media(tree, media_store=store, threshold_bytes=threshold)
    # Equal as JSON values: a moved payload's key (`content`/`data`) comes back last, as the
    # marker format defines; nodes that carry reserved keys keep their exact order (own test).
    assert await restore_media(lean, media_store=store) == tree
    text = json.dumps(tree)
    for spelling in (text, json.dumps(tree, ensure_ascii=False, separators=(',', ':'))):
        if not might_need_externalizing(spelling, threshold):
            assert lean == tree
            assert store.puts == []
    if not has_markers(text):
        assert await restore_media(tree, media_store=store) == tree
    if lean != tree:
        assert has_markers(json.dumps(lean))


@settings(max_examples=100, deadline=None)
@given(tree=json_trees)
async def test_restore_is_identity_on_trees_without_markers(tree: object) -> None:
    text = json.dumps(tree, ensure_ascii=False)
    if not has_markers(text):
        assert await restore_media(tree, media_store=RecordingStore()) == tree
